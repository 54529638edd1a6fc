/* tok_internal.h — the tokenizer's private structures, shared by tokenizer.c
 * and detok.c (and the unit tests). Not part of the API. */
#ifndef LILAC_TOK_INTERNAL_H
#define LILAC_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

/* A growable byte buffer, always NUL-terminated once written to. */
typedef struct {
    char *p;
    size_t n, cap;
} tok_buf;
void tok_buf_put(tok_buf *b, const void *p, size_t n);
void tok_utf8_lossy(tok_buf *b, const uint8_t *s, size_t n);
size_t tok_utf8_invalid_len(const uint8_t *s, size_t n);
bool tok_utf8_incomplete(const uint8_t *s, size_t n);
void tok_global_init(void);

typedef struct {
    char *content; /* raw content */
    size_t len;
    char *norm; /* NFC content for normalized tokens (NULL otherwise) */
    size_t norm_len;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
} tok_added;

/* Added tokens of one kind, grouped by first byte, longest first. */
typedef struct {
    int *order;     /* indices into added[] */
    int n;
    int start[257]; /* order[start[b] .. start[b+1]) begin with byte b */
    int single_first; /* the only first byte in use, or -1 */
} tok_matchset;

enum { TOK_KIND_NONE = 0, TOK_KIND_VOCAB = 1, TOK_KIND_ADDED = 2, TOK_KIND_SPECIAL = 3 };

typedef struct merge_slot_ {
    uint64_t key; /* (uint64)left << 32 | right; UINT64_MAX = empty */
    uint32_t rank;
    int32_t id;
} merge_slot;
struct strmap_;
struct lilac_tokenizer {
    /* id -> bytes */
    int32_t n_ids;
    long max_id;
    uint32_t *tok_off, *tok_len;
    uint8_t *tok_kind;
    uint8_t *tok_bytes;
    /* BPE */
    int32_t byte_id[256];
    merge_slot *merges;
    size_t merge_mask, n_merges;
    bool ignore_merges;
    struct strmap_ *piece_map; /* only with ignore_merges */
    /* added tokens */
    tok_added *added;
    int n_added;
    tok_matchset raw_set, norm_set;
    /* normalizer / pre-tokenizer */
    bool nfc, bytelevel;
    pcre2_code *re;
    bool re_jit;
};

#endif
