/* tokenizer.h — byte-level BPE read from a Hugging Face tokenizer.json, exact
 * against the `tokenizers` library (Qwen2/3/3.5/3.6 family), plus decoding.
 *
 * Pipeline (as HF does it):
 *   1. added tokens (normalized:false) are matched on the raw text, leftmost-longest;
 *   2. each span between them is NFC-normalized (utf8proc, with a fast path for
 *      text that is NFC already), then normalized added tokens are matched;
 *   3. the Split regex read from tokenizer.json cuts each span into pieces
 *      (PCRE2, UTF+UCP+JIT; the input is validated once, matches never re-check);
 *   4. every piece is byte-level BPE-merged (lowest merge rank first, leftmost on
 *      ties; O(n log n) for long pieces).
 *
 * Special tokens and safety. Whether added tokens ("<|im_start|>", "<think>", …)
 * are recognised in the text is always the caller's explicit choice:
 *   - LILAC_TOK_PLAIN: never; "<|im_end|>" typed by a user is ordinary text
 *     (tokenised like any other characters). The safe default for user text.
 *   - LILAC_TOK_SPECIAL: everywhere, exactly like HF `tokenizer.encode(text)`.
 *   - lilac_tok_encode_masked(): everywhere except inside given byte ranges; this
 *     is how a rendered chat prompt is tokenised: the template's own structure
 *     uses the real special tokens, message content (the ranges) never does.
 *     Where the content holds no added-token string, the ids are identical to HF's.
 *
 * A lilac_tokenizer is immutable after loading; encode/decode may be called from
 * several threads at once (each call uses its own scratch memory).
 * Input text must be valid UTF-8: invalid input is an error, never a crash. */
#ifndef LILAC_TOKENIZER_H
#define LILAC_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../util/common.h"

typedef struct lilac_tokenizer lilac_tokenizer;

/* A growable array of token ids. Zero-initialise, then pass to encode calls
 * (they append); release with lilac_ids_free. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} lilac_ids;
void lilac_ids_push(lilac_ids *v, int32_t id);
void lilac_ids_free(lilac_ids *v);

/* A byte range [off, off+len) of a text. */
typedef struct {
    size_t off, len;
} lilac_span;

/* Load DIR/tokenizer.json (when `path` is a directory) or the file `path`. */
lilac_tokenizer *lilac_tok_load(const char *path, lilac_err *err);
/* Load from a tokenizer.json held in memory (need not be NUL-terminated). */
lilac_tokenizer *lilac_tok_load_mem(const char *json, size_t len, lilac_err *err);
void lilac_tok_free(lilac_tokenizer *t);

/* Size of the id space: one more than the largest id (vocab or added token). */
int32_t lilac_tok_vocab_size(const lilac_tokenizer *t);
/* Number of added tokens, and the id of one by its exact content (-1 if none). */
int lilac_tok_n_added(const lilac_tokenizer *t);
int32_t lilac_tok_added_id(const lilac_tokenizer *t, const char *content);
/* Is `id` an added token / one marked "special": true in tokenizer.json? */
bool lilac_tok_is_added(const lilac_tokenizer *t, int32_t id);
bool lilac_tok_is_special(const lilac_tokenizer *t, int32_t id);

enum { LILAC_TOK_PLAIN = 0, LILAC_TOK_SPECIAL = 1 };

/* Encode `len` bytes of UTF-8 `text`, appending ids to `out`. `mode` is
 * LILAC_TOK_PLAIN or LILAC_TOK_SPECIAL (see above). Returns 0, or -1 with `err`
 * set (invalid UTF-8: the message gives the byte offset). */
int lilac_tok_encode(const lilac_tokenizer *t, const char *text, size_t len, int mode, lilac_ids *out,
                     lilac_err *err);

/* Encode with added tokens recognised everywhere except inside the `n_plain`
 * byte ranges `plain` (any order; may overlap): a match must lie wholly outside
 * them. The renderer (chat/chat.h) produces such ranges for message content. */
int lilac_tok_encode_masked(const lilac_tokenizer *t, const char *text, size_t len, const lilac_span *plain,
                            size_t n_plain, lilac_ids *out, lilac_err *err);

/* The bytes of one token (NULL, *len = 0 for an unknown id). Byte-level tokens
 * can hold part of a UTF-8 character. */
const uint8_t *lilac_tok_bytes(const lilac_tokenizer *t, int32_t id, size_t *len);

/* Decode ids to a malloc'd NUL-terminated string, as HF `tokenizer.decode`:
 * token bytes are concatenated and invalid UTF-8 is replaced by U+FFFD (one per
 * maximal invalid subpart, as Python's errors="replace"). Unknown ids are
 * skipped; with skip_special, so are tokens marked special. *out_len may be NULL. */
char *lilac_tok_decode(const lilac_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, size_t *out_len);

/* UTF-8 helpers. lilac_utf8_check returns the length of the longest valid prefix
 * (== len when all of it is valid; rejects overlongs, surrogates, > U+10FFFF). */
size_t lilac_utf8_check(const char *s, size_t len);
/* Append `len` bytes to a malloc'd buffer, replacing invalid UTF-8 by U+FFFD. */
char *lilac_utf8_sanitize(const char *s, size_t len, size_t *out_len);

/* ---- Streaming detokenisation ------------------------------------------------
 * Feed ids one at a time; get back only text that is final: never half a UTF-8
 * character, never text that could still turn out to be the start of a stop
 * string. A stop string that appears is cut off (it and all after it are never
 * emitted) and lilac_detok_push reports it. Invalid byte sequences that can no
 * longer become valid are emitted as U+FFFD. */
typedef struct lilac_detok lilac_detok;

/* `stops`: n_stops NUL-terminated stop strings (copied; may be NULL/0).
 * skip_special: tokens marked special produce no text (HF skip_special_tokens). */
lilac_detok *lilac_detok_new(const lilac_tokenizer *t, const char *const *stops, size_t n_stops, bool skip_special);
void lilac_detok_free(lilac_detok *d);
/* Push one id. *out / *out_len receive the newly final text (valid until the
 * next call on `d`; may be empty). Returns 1 when a stop string was completed
 * (the stream is then over: later pushes return 1 and emit nothing), else 0.
 * If stop_index is not NULL it receives the index of the stop string hit. */
int lilac_detok_push(lilac_detok *d, int32_t id, const char **out, size_t *out_len, int *stop_index);
/* End of stream: emit what was held back (an incomplete UTF-8 tail as U+FFFD,
 * a partial stop-string match as the text it is). */
void lilac_detok_finish(lilac_detok *d, const char **out, size_t *out_len);

#endif
