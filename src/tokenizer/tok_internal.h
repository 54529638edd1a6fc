/* tok_internal.h — the tokenizer's private structures and functions, shared by
 * its files (unicode.c, load.c, bpe.c, encode.c, detok.c). Not part of the API. */
#ifndef LILAC_TOK_INTERNAL_H
#define LILAC_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

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

/* unicode.c */
/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 if invalid or
 * incomplete. Rejects overlongs, surrogates and code points > U+10FFFF. */
static inline int tok_utf8_seq(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xC2) return 0;
    if (c < 0xE0) {
        if (n < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && s[1] < 0xA0) return 0;
        if (c == 0xED && s[1] >= 0xA0) return 0;
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && s[1] < 0x90) return 0;
        if (c == 0xF4 && s[1] >= 0x90) return 0;
        *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
              (s[3] & 0x3F);
        return 4;
    }
    return 0;
}
extern uint32_t tok_byte_to_cp[256]; /* the GPT-2 byte-level alphabet: byte -> code point */
/* HF's ByteLevel decoder on one token string (see unicode.c). */
void tok_bytelevel_decode(const char *s, size_t n, tok_buf *out);
/* NFC of s[0..n) appended to out; 0, or -1 + err. */
int tok_nfc(const uint8_t *s, size_t n, tok_buf *out, lilac_err *err);
/* Whether s[0..n) is NFC already by the fast test (false: maybe not). */
bool tok_nfc_quick(const uint8_t *s, size_t n);
/* NFC of long text in windows cut at stable boundaries; 0, or -1 + err. */
int tok_nfc_windows(const uint8_t *s, size_t n, tok_buf *out, lilac_err *err);

/* bpe.c: the hash maps */
/* string -> int32 map over an arena; everything a lookup needs is in the slot
 * (one cache miss for the slot, one for the key bytes). */
typedef struct {
    uint32_t tag, off, len; /* len == UINT32_MAX: empty */
    int32_t val;
} sm_slot;

typedef struct strmap_ {
    sm_slot *s;
    size_t mask, n;
    tok_buf arena;
} strmap;
void tok_sm_init(strmap *m, size_t expect);
void tok_sm_free(strmap *m);
const sm_slot *tok_sm_find(const strmap *m, const void *k, size_t n);
void tok_sm_put(strmap *m, const void *k, size_t n, int32_t v);
void tok_merge_put(lilac_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id);

/* bpe.c: encoding */
/* Per-call scratch. */
typedef struct {
    const lilac_tokenizer *t;
    lilac_ids *out;
    lilac_err *err;
    pcre2_match_data *md;
    tok_buf norm; /* NFC output */
    /* BPE work arrays */
    int32_t *sid;
    uint32_t *srank;
    int32_t *snew;
    int32_t *prev, *next;
    uint64_t *heap;
    size_t cap_sym, cap_heap;
    /* piece cache */
    struct cache_slot {
        uint64_t h;
        uint32_t key_off, ids_off;
        uint16_t key_len, n_ids; /* key_len 0 = empty */
    } *cache;
    size_t cache_mask, cache_used;
    tok_buf cache_keys;
    int32_t *cache_ids;
    size_t n_cache_ids, cap_cache_ids;
} enc_ctx;
/* Split s[0..n) with the pre-tokenizer's regex and BPE each piece into c->out. 0, or -1 + err. */
int tok_split_and_bpe(enc_ctx *c, const uint8_t *s, size_t n);
/* Frees what an encode left in c (its match data and scratch), not c itself. */
void tok_enc_ctx_free(enc_ctx *c);

/* encode.c: lilac_tok_encode_masked, also counting in *steps the plain spans its
 * overlap queries visit (the work that must stay linear in the number of spans). */
int tok_encode_masked_steps(const lilac_tokenizer *t, const char *text, size_t len, const lilac_span *plain,
                            size_t n_plain, lilac_ids *out, size_t *steps, lilac_err *err);

#endif
