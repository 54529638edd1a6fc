/* bpe.c — byte-pair encoding of one pre-tokenized piece (a heap over the pair
 * ranks for long pieces, a scan for short ones, a per-call cache of pieces), the
 * regex split that produces the pieces, and the hash maps the loader fills. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------- */
/* Hash maps                                                                 */

static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
    /* FNV-1a on 8-byte words, then a final mix. */
    uint64_t h = 0xcbf29ce484222325ull ^ (n * 0x9E3779B97F4A7C15ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static inline uint64_t hash_u64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}


static sm_slot *sm_alloc(size_t sz) {
    sm_slot *s = xmalloc(sz * sizeof(sm_slot));
    memset(s, 0xFF, sz * sizeof(sm_slot));
    return s;
}

void tok_sm_init(strmap *m, size_t expect) {
    size_t sz = 1024;
    while (sz < expect * 2) sz *= 2;
    m->s = sm_alloc(sz);
    m->mask = sz - 1;
    m->n = 0;
    memset(&m->arena, 0, sizeof m->arena);
}

void tok_sm_free(strmap *m) {
    free(m->s);
    free(m->arena.p);
    m->s = NULL;
}

static void sm_grow(strmap *m) {
    size_t sz = (m->mask + 1) * 2;
    sm_slot *ns = sm_alloc(sz);
    for (size_t i = 0; i <= m->mask; i++) {
        const sm_slot *e = &m->s[i];
        if (e->len == UINT32_MAX) continue;
        uint64_t h = hash_bytes((const uint8_t *)m->arena.p + e->off, e->len);
        size_t j = h & (sz - 1);
        while (ns[j].len != UINT32_MAX) j = (j + 1) & (sz - 1);
        ns[j] = *e;
    }
    free(m->s);
    m->s = ns;
    m->mask = sz - 1;
}

const sm_slot *tok_sm_find(const strmap *m, const void *k, size_t n) {
    uint64_t h = hash_bytes(k, n);
    size_t j = h & m->mask;
    uint32_t tag = (uint32_t)(h >> 32);
    for (;; j = (j + 1) & m->mask) {
        const sm_slot *e = &m->s[j];
        if (e->len == UINT32_MAX) return NULL;
        if (e->tag == tag && e->len == n && !memcmp(m->arena.p + e->off, k, n)) return e;
    }
}

/* Insert or overwrite. */
void tok_sm_put(strmap *m, const void *k, size_t n, int32_t v) {
    sm_slot *f = (sm_slot *)tok_sm_find(m, k, n);
    if (f) {
        f->val = v;
        return;
    }
    if ((m->n + 1) * 2 > m->mask + 1) sm_grow(m);
    uint64_t h = hash_bytes(k, n);
    size_t j = h & m->mask;
    while (m->s[j].len != UINT32_MAX) j = (j + 1) & m->mask;
    m->s[j].tag = (uint32_t)(h >> 32);
    m->s[j].off = (uint32_t)m->arena.n;
    m->s[j].len = (uint32_t)n;
    m->s[j].val = v;
    tok_buf_put(&m->arena, k, n);
    m->n++;
}

/* merges: (left id, right id) -> (rank, merged id): merge_slot in tok_internal.h */

static inline const merge_slot *merge_find(const lilac_tokenizer *t, int32_t a, int32_t b) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t j = hash_u64(k) & t->merge_mask;
    for (;;) {
        const merge_slot *s = &t->merges[j];
        if (s->key == k) return s;
        if (s->key == UINT64_MAX) return NULL;
        j = (j + 1) & t->merge_mask;
    }
}

void tok_merge_put(lilac_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t j = hash_u64(k) & t->merge_mask;
    for (;;) {
        merge_slot *s = &t->merges[j];
        if (s->key == k || s->key == UINT64_MAX) {
            s->key = k;
            s->rank = rank;
            s->id = id;
            return;
        }
        j = (j + 1) & t->merge_mask;
    }
}

/* ------------------------------------------------------------------------- */
/* BPE                                                                       */


#define CACHE_MAX_KEY 48
#define SMALL_N 96

static void ensure_sym(enc_ctx *c, size_t n) {
    if (n <= c->cap_sym) return;
    size_t cap = c->cap_sym ? c->cap_sym : 256;
    while (cap < n) cap *= 2;
    c->sid = xrealloc(c->sid, cap * sizeof(int32_t));
    c->srank = xrealloc(c->srank, cap * sizeof(uint32_t));
    c->snew = xrealloc(c->snew, cap * sizeof(int32_t));
    c->prev = xrealloc(c->prev, cap * sizeof(int32_t));
    c->next = xrealloc(c->next, cap * sizeof(int32_t));
    c->cap_sym = cap;
}

static inline void pair_rank(const lilac_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *nid) {
    const merge_slot *m = merge_find(t, a, b);
    if (m) {
        *rank = m->rank;
        *nid = m->id;
    } else {
        *rank = UINT32_MAX;
        *nid = -1;
    }
}

/* Small pieces: an array of symbols; repeatedly merge the lowest-ranked pair
 * (leftmost on ties). Returns the number of symbols left in c->sid. */
static size_t bpe_small(enc_ctx *c, size_t n) {
    const lilac_tokenizer *t = c->t;
    int32_t *id = c->sid;
    uint32_t *rk = c->srank;
    int32_t *nw = c->snew;
    for (size_t i = 0; i + 1 < n; i++) pair_rank(t, id[i], id[i + 1], &rk[i], &nw[i]);
    while (n > 1) {
        uint32_t best = UINT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < n; i++)
            if (rk[i] < best) {
                best = rk[i];
                bi = i;
            }
        if (best == UINT32_MAX) break;
        id[bi] = nw[bi];
        memmove(id + bi + 1, id + bi + 2, (n - bi - 2) * sizeof(int32_t));
        memmove(rk + bi + 1, rk + bi + 2, (n - bi - 2) * sizeof(uint32_t));
        memmove(nw + bi + 1, nw + bi + 2, (n - bi - 2) * sizeof(int32_t));
        n--;
        if (bi > 0) pair_rank(t, id[bi - 1], id[bi], &rk[bi - 1], &nw[bi - 1]);
        if (bi + 1 < n) pair_rank(t, id[bi], id[bi + 1], &rk[bi], &nw[bi]);
        else rk[bi] = UINT32_MAX;
    }
    return n;
}

/* Binary min-heap of (rank << 32 | position). */
static void heap_push(enc_ctx *c, size_t *hn, uint64_t v) {
    if (*hn == c->cap_heap) {
        c->cap_heap = c->cap_heap ? c->cap_heap * 2 : 1024;
        c->heap = xrealloc(c->heap, c->cap_heap * sizeof(uint64_t));
    }
    uint64_t *h = c->heap;
    size_t i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(enc_ctx *c, size_t *hn) {
    uint64_t *h = c->heap;
    uint64_t top = h[0], v = h[--(*hn)];
    size_t n = *hn, i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n) break;
        size_t m = (l + 1 < n && h[l + 1] < h[l]) ? l + 1 : l;
        if (h[m] >= v) break;
        h[i] = h[m];
        i = m;
    }
    if (n) h[i] = v;
    return top;
}

/* Long pieces: linked symbols and a heap, O(n log n) (HF's algorithm). */
static size_t bpe_large(enc_ctx *c, size_t n) {
    const lilac_tokenizer *t = c->t;
    int32_t *id = c->sid, *prev = c->prev, *next = c->next;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const merge_slot *m = merge_find(t, id[i], id[i + 1]);
        if (m) heap_push(c, &hn, ((uint64_t)m->rank << 32) | i);
    }
    while (hn) {
        uint64_t top = heap_pop(c, &hn);
        uint32_t rank = (uint32_t)(top >> 32);
        size_t pos = (size_t)(top & 0xffffffffu);
        if (id[pos] < 0 || next[pos] < 0) continue; /* removed, or last */
        size_t nx = (size_t)next[pos];
        const merge_slot *m = merge_find(t, id[pos], id[nx]);
        if (!m || m->rank != rank) continue; /* stale */
        id[pos] = m->id;
        id[nx] = -1;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = (int32_t)pos;
        if (prev[pos] >= 0) {
            size_t p = (size_t)prev[pos];
            const merge_slot *q = merge_find(t, id[p], id[pos]);
            if (q) heap_push(c, &hn, ((uint64_t)q->rank << 32) | p);
        }
        if (next[pos] >= 0) {
            const merge_slot *q = merge_find(t, id[pos], id[next[pos]]);
            if (q) heap_push(c, &hn, ((uint64_t)q->rank << 32) | pos);
        }
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) id[k++] = id[i];
    return k;
}

/* Test hook: force one algorithm (0 auto, 1 small, 2 large). */
int lilac_tok_bpe_force_ = 0;

static int bpe_piece(enc_ctx *c, const uint8_t *s, size_t n) {
    const lilac_tokenizer *t = c->t;
    if (n == 1) {
        if (t->byte_id[s[0]] >= 0) lilac_ids_push(c->out, t->byte_id[s[0]]);
        return 0;
    }
    if (t->piece_map) {
        const sm_slot *f = tok_sm_find(t->piece_map, s, n);
        if (f) {
            lilac_ids_push(c->out, f->val);
            return 0;
        }
    }
    uint64_t h = 0;
    struct cache_slot *slot = NULL;
    if (n <= CACHE_MAX_KEY && c->cache) {
        h = hash_bytes(s, n);
        size_t j = h & c->cache_mask;
        for (;;) {
            struct cache_slot *e = &c->cache[j];
            if (!e->key_len) {
                slot = e;
                break;
            }
            if (e->h == h && e->key_len == n && !memcmp(c->cache_keys.p + e->key_off, s, n)) {
                for (uint16_t k = 0; k < e->n_ids; k++) lilac_ids_push(c->out, c->cache_ids[e->ids_off + k]);
                return 0;
            }
            j = (j + 1) & c->cache_mask;
        }
    }
    if (n > (size_t)INT32_MAX - 1) return lilac_fail(c->err, "piece too long");
    ensure_sym(c, n);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (t->byte_id[s[i]] >= 0) c->sid[m++] = t->byte_id[s[i]];
    size_t k = m;
    if (m > 1) {
        bool small = lilac_tok_bpe_force_ ? lilac_tok_bpe_force_ == 1 : m <= SMALL_N;
        k = small ? bpe_small(c, m) : bpe_large(c, m);
    }
    for (size_t i = 0; i < k; i++) lilac_ids_push(c->out, c->sid[i]);
    if (slot && (c->cache_used + 1) * 4 <= (c->cache_mask + 1) * 3) {
        if (c->n_cache_ids + k > c->cap_cache_ids) {
            c->cap_cache_ids = (c->cap_cache_ids + k) * 2;
            c->cache_ids = xrealloc(c->cache_ids, c->cap_cache_ids * sizeof(int32_t));
        }
        slot->h = h;
        slot->key_off = (uint32_t)c->cache_keys.n;
        slot->key_len = (uint16_t)n;
        slot->ids_off = (uint32_t)c->n_cache_ids;
        slot->n_ids = (uint16_t)k;
        tok_buf_put(&c->cache_keys, s, n);
        memcpy(c->cache_ids + c->n_cache_ids, c->sid, k * sizeof(int32_t));
        c->n_cache_ids += k;
        c->cache_used++;
    }
    return 0;
}

/* Split a normalized span with the regex and BPE every piece. */
int tok_split_and_bpe(enc_ctx *c, const uint8_t *s, size_t n) {
    const lilac_tokenizer *t = c->t;
    if (n == 0) return 0;
    if (!t->re) return bpe_piece(c, s, n);
    size_t gap = 0, off = 0; /* unmatched text starts at gap; search from off */
    while (off < n) {
        int rc = t->re_jit ? pcre2_jit_match(t->re, s, n, off, 0, c->md, NULL)
                           : pcre2_match(t->re, s, n, off, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
            rc == PCRE2_ERROR_NOMEMORY) {
            /* retry with the interpreter, whose limits are on the heap */
            rc = pcre2_match(t->re, s, n, off, PCRE2_NO_UTF_CHECK, c->md, NULL);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return lilac_fail(c->err, "pre-tokenizer regex failed at byte %zu: %s", off, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t a = ov[0], b = ov[1];
        if (b <= a) { /* an empty match yields no piece: step one character */
            size_t step = 1;
            while (a + step < n && (s[a + step] & 0xC0) == 0x80) step++;
            off = a + step;
            continue;
        }
        if (a > gap && bpe_piece(c, s + gap, a - gap)) return -1;
        if (bpe_piece(c, s + a, b - a)) return -1;
        gap = off = b;
    }
    if (gap < n && bpe_piece(c, s + gap, n - gap)) return -1;
    return 0;
}

void tok_enc_ctx_free(enc_ctx *c) {
    if (c->md) pcre2_match_data_free(c->md);
    free(c->norm.p);
    free(c->sid);
    free(c->srank);
    free(c->snew);
    free(c->prev);
    free(c->next);
    free(c->heap);
    free(c->cache);
    free(c->cache_keys.p);
    free(c->cache_ids);
}
