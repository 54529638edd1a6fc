/* encode.c — encoding: added and special tokens found as HF's find_matches does
 * (leftmost-longest, single_word / lstrip / rstrip), the text between them
 * normalised and BPE'd, and the user-text mask of lilac_tok_encode_masked. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------------- */
/* ids                                                                       */

void lilac_ids_push(lilac_ids *v, int32_t id) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 256;
        v->ids = xrealloc(v->ids, v->cap * sizeof(int32_t));
    }
    v->ids[v->n++] = id;
}

void lilac_ids_free(lilac_ids *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

/* ------------------------------------------------------------------------- */
/* Added tokens and the encoder's entry points                               */

/* A span between raw added tokens: NFC, then normalized added tokens, then split. */
static int encode_span(enc_ctx *c, const uint8_t *s, size_t n, bool allow_norm_added);

/* Sorted, merged (disjoint, non-empty) "plain" ranges, with one cursor per
 * query. Each query's start never decreases between calls, so each cursor only
 * moves forward and all queries of one encode visit each range O(1) times. */
typedef struct {
    const lilac_span *sp;
    size_t n;
    size_t i;     /* plain_allows: the first range that may end after its start */
    size_t j;     /* plain_overlaps: likewise */
    size_t steps; /* cursor moves and tests, for tok_encode_masked_steps */
} plain_set;

/* The first range at or after *cur that ends after a (n if none). */
static size_t first_ending_after(plain_set *ps, size_t *cur, size_t a) {
    while (*cur < ps->n && ps->sp[*cur].off + ps->sp[*cur].len <= a) (*cur)++, ps->steps++;
    ps->steps++;
    return *cur;
}

/* May an added token occupy [a, b)? */
static bool plain_allows(plain_set *ps, size_t a, size_t b) {
    if (!ps) return true;
    const size_t k = first_ending_after(ps, &ps->i, a);
    return k == ps->n || ps->sp[k].off >= b;
}

/* Does [a, b) overlap a plain range? */
static bool plain_overlaps(plain_set *ps, size_t a, size_t b) {
    if (!ps) return false;
    const size_t k = first_ending_after(ps, &ps->j, a);
    return k < ps->n && ps->sp[k].off < b;
}

static bool is_ws_cp(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool is_word_cp(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return true;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ND) || k == UTF8PROC_CATEGORY_NL ||
           k == UTF8PROC_CATEGORY_PC;
}

/* Code point ending at s[0..i) (i > 0, valid UTF-8). */
static uint32_t cp_before(const uint8_t *s, size_t i, size_t *start) {
    size_t j = i - 1;
    while (j > 0 && (s[j] & 0xC0) == 0x80) j--;
    uint32_t cp = 0;
    tok_utf8_seq(s + j, i - j, &cp);
    if (start) *start = j;
    return cp;
}

/* Find added tokens of set `ms` in s[0..n), HF find_matches semantics
 * (leftmost-longest, then single_word / lstrip / rstrip), and encode the text
 * between them with `between`. `ps` restricts where matches may lie. */
static int split_added(enc_ctx *c, const tok_matchset *ms, const uint8_t *s, size_t n, plain_set *ps,
                       int (*between)(enc_ctx *, const uint8_t *, size_t, bool), bool norm) {
    const lilac_tokenizer *t = c->t;
    size_t start_offset = 0, i = 0;
    while (ms->n && i < n) {
        /* next candidate position */
        if (ms->single_first >= 0) {
            const uint8_t *q = memchr(s + i, ms->single_first, n - i);
            if (!q) break;
            i = (size_t)(q - s);
        } else {
            while (i < n && ms->start[s[i] + 1] == ms->start[s[i]]) i++;
            if (i >= n) break;
        }
        int hit = -1;
        size_t hl = 0;
        for (int k = ms->start[s[i]]; k < ms->start[s[i] + 1]; k++) {
            const tok_added *a = &t->added[ms->order[k]];
            const char *ct = norm ? a->norm : a->content;
            size_t cl = norm ? a->norm_len : a->len;
            if (cl <= n - i && !memcmp(s + i, ct, cl)) {
                hit = ms->order[k];
                hl = cl;
                break; /* sorted longest first */
            }
        }
        if (hit < 0 || !plain_allows(ps, i, i + hl)) {
            i++;
            continue;
        }
        const tok_added *a = &t->added[hit];
        size_t start = i, stop = i + hl;
        i = stop; /* the automaton continues after this match either way */
        if (a->single_word) {
            bool start_space = start == 0 || !is_word_cp(cp_before(s, start, NULL));
            uint32_t nc = 0;
            bool stop_space = stop == n || (tok_utf8_seq(s + stop, n - stop, &nc), !is_word_cp(nc));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t j;
                uint32_t cp = cp_before(s, ns, &j);
                if (!is_ws_cp(cp)) break;
                ns = j;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                uint32_t cp;
                int k = tok_utf8_seq(s + stop, n - stop, &cp);
                if (!k || !is_ws_cp(cp)) break;
                stop += (size_t)k;
            }
        }
        if (start > start_offset && between(c, s + start_offset, start - start_offset, !plain_overlaps(ps, start_offset, start)))
            return -1;
        lilac_ids_push(c->out, a->id);
        start_offset = stop;
        if (i < stop) i = stop;
    }
    if (start_offset < n &&
        between(c, s + start_offset, n - start_offset, !plain_overlaps(ps, start_offset, n)))
        return -1;
    return 0;
}

static int between_split(enc_ctx *c, const uint8_t *s, size_t n, bool unused) {
    (void)unused;
    return tok_split_and_bpe(c, s, n);
}

static int encode_span(enc_ctx *c, const uint8_t *s, size_t n, bool allow_norm_added) {
    const lilac_tokenizer *t = c->t;
    if (n == 0) return 0;
    const uint8_t *u = s;
    size_t un = n;
    tok_buf local = {0};
    if (t->nfc && !tok_nfc_quick(s, n)) {
        if (tok_nfc_windows(s, n, &local, c->err)) {
            free(local.p);
            return -1;
        }
        u = (const uint8_t *)local.p;
        un = local.n;
    }
    int rc;
    if (allow_norm_added && t->norm_set.n) rc = split_added(c, &t->norm_set, u, un, NULL, between_split, true);
    else rc = tok_split_and_bpe(c, u, un);
    free(local.p);
    return rc;
}

static int between_span(enc_ctx *c, const uint8_t *s, size_t n, bool allow) { return encode_span(c, s, n, allow); }

static int cmp_span(const void *a, const void *b) {
    const lilac_span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int encode_impl(const lilac_tokenizer *t, const char *text, size_t len, int mode, const lilac_span *plain,
                       size_t n_plain, lilac_ids *out, size_t *steps, lilac_err *err) {
    size_t v = lilac_utf8_check(text, len);
    if (v != len) return lilac_fail(err, "input is not valid UTF-8 (byte %zu)", v);
    enc_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t;
    c.out = out;
    c.err = err;
    if (t->re) {
        c.md = pcre2_match_data_create_from_pattern(t->re, NULL);
        if (!c.md) return lilac_fail(err, "out of memory (regex match data)");
    }
    size_t slots = 256;
    while (slots < len / 2 && slots < (1u << 17)) slots *= 2;
    c.cache = xcalloc(slots, sizeof *c.cache);
    c.cache_mask = slots - 1;

    plain_set ps = {0}, *psp = NULL;
    lilac_span *sorted = NULL;
    if (mode == 2) { /* masked */
        sorted = xmalloc(sizeof(lilac_span) * (n_plain + 1));
        size_t m = 0;
        for (size_t i = 0; i < n_plain; i++)
            if (plain[i].len) sorted[m++] = plain[i];
        qsort(sorted, m, sizeof *sorted, cmp_span);
        size_t k = 0; /* merge overlapping */
        for (size_t i = 0; i < m; i++) {
            if (k && sorted[i].off <= sorted[k - 1].off + sorted[k - 1].len) {
                size_t e = sorted[i].off + sorted[i].len;
                if (e > sorted[k - 1].off + sorted[k - 1].len) sorted[k - 1].len = e - sorted[k - 1].off;
            } else
                sorted[k++] = sorted[i];
        }
        ps.sp = sorted;
        ps.n = k;
        psp = &ps;
    }
    int rc;
    if (mode == LILAC_TOK_PLAIN) rc = encode_span(&c, (const uint8_t *)text, len, false);
    else rc = split_added(&c, &t->raw_set, (const uint8_t *)text, len, psp, between_span, false);

    if (steps) *steps = ps.steps;
    free(sorted);
    tok_enc_ctx_free(&c);
    return rc;
}

int lilac_tok_encode(const lilac_tokenizer *t, const char *text, size_t len, int mode, lilac_ids *out,
                     lilac_err *err) {
    return encode_impl(t, text, len, mode == LILAC_TOK_SPECIAL ? LILAC_TOK_SPECIAL : LILAC_TOK_PLAIN, NULL, 0, out,
                       NULL, err);
}

int lilac_tok_encode_masked(const lilac_tokenizer *t, const char *text, size_t len, const lilac_span *plain,
                            size_t n_plain, lilac_ids *out, lilac_err *err) {
    return encode_impl(t, text, len, 2, plain, n_plain, out, NULL, err);
}

int tok_encode_masked_steps(const lilac_tokenizer *t, const char *text, size_t len, const lilac_span *plain,
                            size_t n_plain, lilac_ids *out, size_t *steps, lilac_err *err) {
    return encode_impl(t, text, len, 2, plain, n_plain, out, steps, err);
}
