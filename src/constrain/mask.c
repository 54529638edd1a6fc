/* mask.c — the vocabulary index, the per-position token tables and the matcher.
 *
 * The vocabulary's byte strings are sorted into a trie laid out in pre-order
 * (each node knows where its subtree ends), so a walk can skip every token
 * under a prefix the grammar refuses. For each automaton node that can be the
 * top of a stack, the tokens are split once (lazily, the first time the node
 * is met) into three kinds, with the caller of the node's rule unknown:
 *   accepted   — the bytes match without leaving the rule (or end it exactly):
 *                allowed whatever lies below on the stack;
 *   rejected   — no caller could accept them: never allowed here;
 *   dependent  — they leave the rule into some caller and go on there: checked
 *                against the real stack at run time.
 * Leaving a rule continues in every place that calls it (a superset of the real
 * context), so "rejected" is exact and "dependent" stays small: after a JSON
 * number ends, only tokens such as "1," or "]}" are dependent, not every token
 * that starts with a space. A step's mask is the union of the accepted sets of
 * the state's stack tops plus the dependent tokens that pass, and is cached per
 * state (states repeat: inside a string, between elements of an array). */
#include <math.h>
#include <stdlib.h>

#include "cg_internal.h"
#include "../tokenizer/tokenizer.h"

struct lilac_cvocab {
    int32_t n;
    size_t words;
    uint8_t *bytes;
    uint32_t *off, *len;
    int32_t *eos;
    size_t n_eos;
    /* trie, pre-order */
    uint32_t n_tn;
    uint8_t *tn_byte;
    uint32_t *tn_depth, *tn_end;
    int32_t *tn_tok;  /* first token with exactly these bytes, or -1 */
    int32_t *tok_next; /* next token with the same bytes, or -1 */
    uint32_t max_len;
};

typedef struct {
    uint8_t built;
    uint64_t *bits;  /* accepted, as a bitset (NULL when a list) */
    int32_t *acc;    /* accepted, as a list */
    uint32_t n_acc;
    int32_t *dep;    /* dependent, in trie order */
    uint32_t n_dep;
} cg_pos;

enum { CACHE_SLOTS = 256 }; /* masks cached per grammar, direct-mapped by state hash */
typedef struct {
    uint64_t h;
    cg_state st;
    uint64_t *mask;
} cg_cache_ent;

struct cg_tables {
    const lilac_cvocab *v;
    cg_pos *pos;
    cg_cache_ent *cache;
    cg_scratch x;
    cg_state *ds;
    uint32_t n_ds;
};

/* ---- Vocabulary ------------------------------------------------------------------ */

static const lilac_cvocab *sort_v;
static int cmp_tok(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const lilac_cvocab *v = sort_v;
    uint32_t lx = v->len[x], ly = v->len[y], l = lx < ly ? lx : ly;
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], l);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;

lilac_cvocab *lilac_cvocab_new_raw(int32_t n, const uint8_t *const *bytes, const size_t *lens, const int32_t *eos,
                                   size_t n_eos, lilac_err *err) {
    if (n <= 0) {
        lilac_fail(err, "constrain: empty vocabulary");
        return NULL;
    }
    for (size_t i = 0; i < n_eos; i++)
        if (eos[i] < 0 || eos[i] >= n) {
            lilac_fail(err, "constrain: end token %d outside the vocabulary (0..%d)", eos[i], n - 1);
            return NULL;
        }
    lilac_cvocab *v = xcalloc(1, sizeof *v);
    v->n = n;
    v->words = ((size_t)n + 63) / 64;
    v->off = xmalloc((size_t)n * sizeof *v->off);
    v->len = xmalloc((size_t)n * sizeof *v->len);
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) total += lens[i];
    v->bytes = xmalloc(total + 1);
    total = 0;
    int32_t n_live = 0;
    for (int32_t i = 0; i < n; i++) {
        bool is_eos = false;
        for (size_t k = 0; k < n_eos; k++) is_eos |= eos[k] == i;
        size_t l = is_eos ? 0 : lens[i];
        if (l > 0xffff) l = 0; /* no real token is this long; never allowed */
        v->off[i] = (uint32_t)total;
        v->len[i] = (uint32_t)l;
        if (l) memcpy(v->bytes + total, bytes[i], l);
        total += l;
        if (l > v->max_len) v->max_len = (uint32_t)l;
        n_live += l > 0;
    }
    v->eos = xmalloc((n_eos + 1) * sizeof *v->eos);
    if (n_eos) memcpy(v->eos, eos, n_eos * sizeof *eos);
    v->n_eos = n_eos;
    int32_t *ids = xmalloc(((size_t)n_live + 1) * sizeof *ids), m = 0;
    for (int32_t i = 0; i < n; i++)
        if (v->len[i]) ids[m++] = i;
    pthread_mutex_lock(&sort_mu);
    sort_v = v;
    qsort(ids, (size_t)m, sizeof *ids, cmp_tok);
    pthread_mutex_unlock(&sort_mu);
    /* trie nodes: the bytes of each token past its common prefix with the previous */
    size_t cap = 1024;
    v->tn_byte = xmalloc(cap);
    v->tn_depth = xmalloc(cap * sizeof *v->tn_depth);
    v->tn_end = xmalloc(cap * sizeof *v->tn_end);
    v->tn_tok = xmalloc(cap * sizeof *v->tn_tok);
    v->tok_next = xmalloc((size_t)n * sizeof *v->tok_next);
    for (int32_t i = 0; i < n; i++) v->tok_next[i] = -1;
    uint32_t *open = xmalloc(((size_t)v->max_len + 2) * sizeof *open); /* node index per depth */
    uint32_t n_open = 0, nt = 0;
    int32_t prev = -1, prev_last = -1;
    for (int32_t k = 0; k < m; k++) {
        int32_t id = ids[k];
        const uint8_t *b = v->bytes + v->off[id];
        uint32_t l = v->len[id], lcp = 0;
        if (prev >= 0) {
            const uint8_t *pb = v->bytes + v->off[prev];
            uint32_t pl = v->len[prev];
            while (lcp < l && lcp < pl && pb[lcp] == b[lcp]) lcp++;
            if (lcp == l && l == pl) { /* same bytes as the previous token */
                v->tok_next[prev_last] = id;
                prev_last = id;
                continue;
            }
        }
        while (n_open > lcp) v->tn_end[open[--n_open]] = nt;
        for (uint32_t d = lcp; d < l; d++) {
            if (nt == cap) {
                cap *= 2;
                v->tn_byte = xrealloc(v->tn_byte, cap);
                v->tn_depth = xrealloc(v->tn_depth, cap * sizeof *v->tn_depth);
                v->tn_end = xrealloc(v->tn_end, cap * sizeof *v->tn_end);
                v->tn_tok = xrealloc(v->tn_tok, cap * sizeof *v->tn_tok);
            }
            v->tn_byte[nt] = b[d];
            v->tn_depth[nt] = d + 1;
            v->tn_tok[nt] = d + 1 == l ? id : -1;
            open[n_open++] = nt++;
        }
        prev = prev_last = id;
    }
    while (n_open) v->tn_end[open[--n_open]] = nt;
    v->n_tn = nt;
    free(open);
    free(ids);
    return v;
}

lilac_cvocab *lilac_cvocab_new(const lilac_tokenizer *t, const int32_t *eos, size_t n_eos, lilac_err *err) {
    int32_t n = lilac_tok_vocab_size(t);
    const uint8_t **bytes = xcalloc((size_t)n + 1, sizeof *bytes);
    size_t *lens = xcalloc((size_t)n + 1, sizeof *lens);
    for (int32_t i = 0; i < n; i++) {
        bytes[i] = lilac_tok_bytes(t, i, &lens[i]);
        if (lilac_tok_is_special(t, i)) lens[i] = 0;
    }
    lilac_cvocab *v = lilac_cvocab_new_raw(n, bytes, lens, eos, n_eos, err);
    free(bytes);
    free(lens);
    return v;
}

void lilac_cvocab_free(lilac_cvocab *v) {
    if (!v) return;
    free(v->bytes), free(v->off), free(v->len), free(v->eos);
    free(v->tn_byte), free(v->tn_depth), free(v->tn_end), free(v->tn_tok), free(v->tok_next);
    free(v);
}

int32_t lilac_cvocab_size(const lilac_cvocab *v) { return v->n; }
size_t lilac_cvocab_mask_words(const lilac_cvocab *v) { return v->words; }

/* ---- Token tables ------------------------------------------------------------------ */

static void tables_destroy(cg_tables *t, uint32_t n_nodes) {
    for (uint32_t i = 0; i < n_nodes; i++) free(t->pos[i].bits), free(t->pos[i].acc), free(t->pos[i].dep);
    free(t->pos);
    for (int i = 0; i < CACHE_SLOTS; i++) cg_state_free(&t->cache[i].st), free(t->cache[i].mask);
    free(t->cache);
    cg_scratch_free(&t->x);
    for (uint32_t i = 0; i < t->n_ds; i++) cg_state_free(&t->ds[i]);
    free(t->ds);
}

void cg_tables_free(cg_tables *t, uint32_t n_nodes) {
    tables_destroy(t, n_nodes);
    free(t);
}

static bool has_unflagged(const cg_state *s) {
    for (size_t o = 0; o < s->n; o += cg_stk_words(s->w + o))
        if (!(s->w[o] & CG_FLAG)) return true;
    return false;
}

typedef struct {
    int32_t *v;
    uint32_t n, cap;
} idvec;
static void idv_push(idvec *v, int32_t x) {
    if (v->n == v->cap) v->cap = v->cap ? 2 * v->cap : 64, v->v = xrealloc(v->v, v->cap * sizeof *v->v);
    v->v[v->n++] = x;
}

/* Classify every token for a stack whose top is `node`. Called under g->mu. */
static void pos_build(const lilac_grammar *g, cg_tables *t, uint32_t node) {
    const lilac_cvocab *v = t->v;
    cg_pos *p = &t->pos[node];
    if (t->n_ds < v->max_len + 1) {
        t->ds = xrealloc(t->ds, (v->max_len + 1) * sizeof *t->ds);
        for (uint32_t i = t->n_ds; i <= v->max_len; i++) memset(&t->ds[i], 0, sizeof t->ds[i]);
        t->n_ds = v->max_len + 1;
    }
    uint32_t stk[3] = {1, CG_CTX | g->nodes[node].rule, node};
    cg_state_one(&t->ds[0], stk);
    idvec acc = {0}, dep = {0};
    for (uint32_t i = 0; i < v->n_tn;) {
        uint32_t d = v->tn_depth[i];
        cg_state *cur = &t->ds[d];
        cg_advance(g, &t->x, &t->ds[d - 1], v->tn_byte[i], cur);
        if (cur->overflow) { /* too ambiguous to decide here: every token below is checked at run time */
            for (uint32_t j = i; j < v->tn_end[i]; j++)
                for (int32_t id = v->tn_tok[j]; id >= 0; id = v->tok_next[id]) idv_push(&dep, id);
            i = v->tn_end[i];
            continue;
        }
        int32_t tok = v->tn_tok[i];
        if (tok >= 0) {
            int kind = (cur->end || has_unflagged(cur)) ? 1 : (cur->n_stk || cur->end_flag) ? 2 : 0;
            for (int32_t id = tok; kind && id >= 0; id = v->tok_next[id]) idv_push(kind == 1 ? &acc : &dep, id);
        }
        i = cur->n_stk ? i + 1 : v->tn_end[i];
    }
    if (acc.n > 2 * v->words) {
        p->bits = xcalloc(v->words, sizeof *p->bits);
        for (uint32_t k = 0; k < acc.n; k++) p->bits[acc.v[k] >> 6] |= 1ull << (acc.v[k] & 63);
        free(acc.v);
    } else {
        p->acc = acc.v;
        p->n_acc = acc.n;
    }
    p->dep = dep.v;
    p->n_dep = dep.n;
    __atomic_store_n(&p->built, 1, __ATOMIC_RELEASE);
}

static cg_tables *tables_get(lilac_grammar *g, const lilac_cvocab *v, lilac_err *err) {
    pthread_mutex_lock(&g->mu);
    if (!g->tables) {
        cg_tables *t = xcalloc(1, sizeof *t);
        t->v = v;
        t->pos = xcalloc(g->n_nodes + 1, sizeof *t->pos);
        t->cache = xcalloc(CACHE_SLOTS, sizeof *t->cache);
        g->tables = t;
    }
    cg_tables *t = g->tables;
    pthread_mutex_unlock(&g->mu);
    if (t->v != v) {
        lilac_fail(err, "constrain: a grammar is used with two vocabularies; compile it once per tokenizer");
        return NULL;
    }
    return t;
}

/* ---- Matcher ----------------------------------------------------------------------- */

struct lilac_matcher {
    lilac_grammar *g;
    const lilac_cvocab *v;
    cg_tables *t;
    cg_scratch x;
    cg_state cur, a, b;
    bool done;
    cg_state hist[LILAC_MATCHER_MAX_ROLLBACK];
    bool hist_done[LILAC_MATCHER_MAX_ROLLBACK];
    int hist_n, hist_head;
    cg_state *ds; /* per byte depth, for dependent tokens */
    uint32_t n_ds;
};

lilac_matcher *lilac_matcher_new(lilac_grammar *g, const lilac_cvocab *v, lilac_err *err) {
    cg_tables *t = tables_get(g, v, err);
    if (!t) return NULL;
    lilac_matcher *m = xcalloc(1, sizeof *m);
    m->g = lilac_grammar_ref(g);
    m->v = v;
    m->t = t;
    lilac_matcher_reset(m);
    return m;
}

void lilac_matcher_reset(lilac_matcher *m) {
    cg_state_start(m->g, &m->x, CG_ROOT, m->g->root, &m->cur);
    m->done = false;
    m->hist_n = 0;
}

lilac_matcher *lilac_matcher_clone(const lilac_matcher *m) {
    lilac_matcher *c = xcalloc(1, sizeof *c);
    c->g = lilac_grammar_ref(m->g);
    c->v = m->v;
    c->t = m->t;
    cg_state_copy(&c->cur, &m->cur);
    c->done = m->done;
    for (int i = 0; i < LILAC_MATCHER_MAX_ROLLBACK; i++) {
        if (m->hist[i].w) cg_state_copy(&c->hist[i], &m->hist[i]);
        c->hist_done[i] = m->hist_done[i];
    }
    c->hist_n = m->hist_n;
    c->hist_head = m->hist_head;
    return c;
}

void lilac_matcher_free(lilac_matcher *m) {
    if (!m) return;
    cg_scratch_free(&m->x);
    cg_state_free(&m->cur), cg_state_free(&m->a), cg_state_free(&m->b);
    for (int i = 0; i < LILAC_MATCHER_MAX_ROLLBACK; i++) cg_state_free(&m->hist[i]);
    for (uint32_t i = 0; i < m->n_ds; i++) cg_state_free(&m->ds[i]);
    free(m->ds);
    lilac_grammar_free(m->g);
    free(m);
}

static void hist_push(lilac_matcher *m) {
    int i = m->hist_head;
    cg_state_copy(&m->hist[i], &m->cur);
    m->hist_done[i] = m->done;
    m->hist_head = (i + 1) % LILAC_MATCHER_MAX_ROLLBACK;
    if (m->hist_n < LILAC_MATCHER_MAX_ROLLBACK) m->hist_n++;
}

int lilac_matcher_rollback(lilac_matcher *m, int n) {
    if (n < 0 || n > m->hist_n) return -1;
    for (int k = 0; k < n; k++) {
        m->hist_head = (m->hist_head + LILAC_MATCHER_MAX_ROLLBACK - 1) % LILAC_MATCHER_MAX_ROLLBACK;
        m->hist_n--;
    }
    if (n) {
        cg_state_copy(&m->cur, &m->hist[m->hist_head]);
        m->done = m->hist_done[m->hist_head];
    }
    return 0;
}

/* Run bytes from `from`; the result is in *res (m->a or m->b). Returns 0,
 * -1 (refused) or -2 (a limit was hit: too ambiguous). */
static int run_bytes(lilac_matcher *m, const cg_state *from, const uint8_t *p, size_t n, cg_state **res) {
    const cg_state *in = from;
    cg_state *out = &m->a;
    for (size_t i = 0; i < n; i++) {
        if (in->n_stk == 0) return -1;
        cg_advance(m->g, &m->x, in, p[i], out);
        if (out->overflow) return -2;
        in = out;
        out = out == &m->a ? &m->b : &m->a;
    }
    *res = (cg_state *)in;
    return in->n_stk > 0 || in->end ? 0 : -1;
}

int lilac_matcher_accept_bytes(lilac_matcher *m, const uint8_t *p, size_t n) {
    if (m->done) return -1;
    if (n == 0) return 0;
    cg_state *res;
    int rc = run_bytes(m, &m->cur, p, n, &res);
    if (rc) return rc;
    hist_push(m);
    cg_state_copy(&m->cur, res);
    return 0;
}

int lilac_matcher_accept(lilac_matcher *m, int32_t tok) {
    const lilac_cvocab *v = m->v;
    if (m->done || tok < 0 || tok >= v->n) return -1;
    for (size_t i = 0; i < v->n_eos; i++)
        if (v->eos[i] == tok) {
            if (!m->cur.end) return -1;
            hist_push(m);
            m->done = true;
            return 0;
        }
    if (v->len[tok] == 0) return -1;
    return lilac_matcher_accept_bytes(m, v->bytes + v->off[tok], v->len[tok]);
}

bool lilac_matcher_can_end(const lilac_matcher *m) { return !m->done && m->cur.end; }
bool lilac_matcher_is_done(const lilac_matcher *m) { return m->done || (m->cur.n_stk == 0 && m->cur.end); }

static void mask_compute(lilac_matcher *m, uint64_t *mask) {
    const lilac_cvocab *v = m->v;
    const lilac_grammar *g = m->g;
    cg_tables *t = m->t;
    memset(mask, 0, v->words * sizeof *mask);
    if (m->n_ds < v->max_len + 1) {
        m->ds = xrealloc(m->ds, (v->max_len + 1) * sizeof *m->ds);
        for (uint32_t i = m->n_ds; i <= v->max_len; i++) memset(&m->ds[i], 0, sizeof m->ds[i]);
        m->n_ds = v->max_len + 1;
    }
    for (size_t o = 0; o < m->cur.n; o += cg_stk_words(m->cur.w + o)) {
        const uint32_t *s = m->cur.w + o;
        uint32_t top = cg_stk_top(s);
        cg_pos *p = &t->pos[top];
        if (!__atomic_load_n(&p->built, __ATOMIC_ACQUIRE)) {
            pthread_mutex_lock(&m->g->mu);
            if (!p->built) pos_build(g, t, top);
            pthread_mutex_unlock(&m->g->mu);
        }
        if (p->bits)
            for (size_t w = 0; w < v->words; w++) mask[w] |= p->bits[w];
        else
            for (uint32_t k = 0; k < p->n_acc; k++) mask[p->acc[k] >> 6] |= 1ull << (p->acc[k] & 63);
        if (!p->n_dep) continue;
        /* dependent tokens, in trie order: reuse the states of the common prefix */
        cg_state_one(&m->ds[0], s);
        const uint8_t *pb = NULL;
        uint32_t pl = 0, valid = 0; /* m->ds[1..valid] hold states for pb's prefix */
        for (uint32_t k = 0; k < p->n_dep; k++) {
            int32_t id = p->dep[k];
            if (mask[id >> 6] >> (id & 63) & 1) continue;
            const uint8_t *b = v->bytes + v->off[id];
            uint32_t l = v->len[id], c = 0;
            while (c < l && c < pl && c < valid && pb[c] == b[c]) c++;
            bool dead = false;
            for (uint32_t d = c; d < l; d++) {
                if (m->ds[d].n_stk == 0) {
                    dead = true;
                    valid = d;
                    break;
                }
                cg_advance(g, &m->x, &m->ds[d], b[d], &m->ds[d + 1]);
                valid = d + 1;
                if (m->ds[d + 1].overflow) { /* refused: accepting it would hit the limit too */
                    dead = true;
                    break;
                }
            }
            pb = b;
            pl = l;
            if (dead) continue;
            if (m->ds[l].n_stk || m->ds[l].end) mask[id >> 6] |= 1ull << (id & 63);
        }
    }
    if (m->cur.end)
        for (size_t i = 0; i < v->n_eos; i++) mask[v->eos[i] >> 6] |= 1ull << (v->eos[i] & 63);
}

void lilac_matcher_fill_mask(lilac_matcher *m, uint64_t *mask) {
    const lilac_cvocab *v = m->v;
    if (lilac_matcher_is_done(m) && !lilac_matcher_can_end(m)) {
        memset(mask, 0, v->words * sizeof *mask);
        return;
    }
    cg_tables *t = m->t;
    uint64_t h = cg_state_hash(&m->cur);
    cg_cache_ent *e = &t->cache[h % CACHE_SLOTS];
    pthread_mutex_lock(&m->g->mu);
    if (e->mask && e->h == h && cg_state_equal(&e->st, &m->cur)) {
        memcpy(mask, e->mask, v->words * sizeof *mask);
        pthread_mutex_unlock(&m->g->mu);
        return;
    }
    pthread_mutex_unlock(&m->g->mu);
    mask_compute(m, mask);
    pthread_mutex_lock(&m->g->mu);
    if (!e->mask) e->mask = xmalloc(v->words * sizeof *e->mask);
    memcpy(e->mask, mask, v->words * sizeof *mask);
    cg_state_copy(&e->st, &m->cur);
    e->h = h;
    pthread_mutex_unlock(&m->g->mu);
}

void cg_matcher_mask_uncached(lilac_matcher *m, uint64_t *mask) {
    if (lilac_matcher_is_done(m) && !lilac_matcher_can_end(m)) {
        memset(mask, 0, m->v->words * sizeof *mask);
        return;
    }
    mask_compute(m, mask);
}

void lilac_mask_apply(const uint64_t *mask, float *logits, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (!(mask[i >> 6] >> (i & 63) & 1)) logits[i] = -INFINITY;
}
