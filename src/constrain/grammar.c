/* grammar.c — the grammar AST, its compilation into byte automata (one per
 * rule, with rule-reference edges), the checks that keep matching finite (no
 * left recursion, only rules that derive a finite text), and the stack-set
 * states the matcher and the token index advance byte by byte. */
#include <stdarg.h>
#include <stdlib.h>

#include "cg_internal.h"

/* ---- Builder and AST -------------------------------------------------------- */

struct cg_block {
    cg_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void cgb_init(cg_builder *b, lilac_err *err) {
    memset(b, 0, sizeof *b);
    b->err = err;
}

void cgb_free(cg_builder *b) {
    for (cg_block *k = b->blocks, *nx; k; k = nx) {
        nx = k->next;
        free(k);
    }
    for (int i = 0; i < b->n_rules; i++) free(b->names[i]);
    free(b->names);
    free(b->bodies);
    free(b->defined_at);
    memset(b, 0, sizeof *b);
}

void *cgb_alloc(cg_builder *b, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!b->blocks || b->blocks->used + n > b->blocks->cap) {
        size_t cap = n > 65536 ? n : 65536;
        cg_block *k = xmalloc(sizeof *k + cap);
        k->next = b->blocks;
        k->used = 0;
        k->cap = cap;
        b->blocks = k;
    }
    void *p = b->blocks->data + b->blocks->used;
    b->blocks->used += n;
    memset(p, 0, n);
    return p;
}

void *cgb_fail(cg_builder *b, const char *fmt, ...) {
    if (!b->failed && b->err) {
        va_list ap;
        char buf[sizeof b->err->msg];
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        lilac_fail(b->err, "%s", buf);
    }
    b->failed = true;
    return NULL;
}

int cgb_rule(cg_builder *b, const char *name) {
    for (int i = 0; i < b->n_rules; i++)
        if (!strcmp(b->names[i], name)) return i;
    if (b->n_rules >= CG_MAX_RULES) {
        cgb_fail(b, "too many rules (more than %d)", CG_MAX_RULES);
        return -1;
    }
    if (b->n_rules == b->cap_rules) {
        b->cap_rules = b->cap_rules ? 2 * b->cap_rules : 16;
        b->names = xrealloc(b->names, b->cap_rules * sizeof *b->names);
        b->bodies = xrealloc(b->bodies, b->cap_rules * sizeof *b->bodies);
        b->defined_at = xrealloc(b->defined_at, b->cap_rules * sizeof *b->defined_at);
    }
    b->names[b->n_rules] = xstrdup(name);
    b->bodies[b->n_rules] = NULL;
    b->defined_at[b->n_rules] = -1;
    return b->n_rules++;
}

int cgb_new_rule(cg_builder *b, const char *base) {
    char name[160];
    snprintf(name, sizeof name, "%s", base);
    for (int k = 1;; k++) {
        bool used = false;
        for (int i = 0; i < b->n_rules && !used; i++) used = !strcmp(b->names[i], name);
        if (!used) break;
        snprintf(name, sizeof name, "%.120s-%d", base, k);
    }
    return cgb_rule(b, name);
}

void cgb_define(cg_builder *b, int rule, cg_ast *body) {
    if (rule >= 0 && rule < b->n_rules) b->bodies[rule] = body;
}

static cg_ast *ast_new(cg_builder *b, int kind) {
    if (++b->n_ast > CG_MAX_AST) return cgb_fail(b, "grammar too large (more than %d elements)", CG_MAX_AST);
    cg_ast *a = cgb_alloc(b, sizeof *a);
    a->kind = kind;
    return a;
}

cg_ast *ast_empty(cg_builder *b) { return ast_new(b, A_EMPTY); }

cg_ast *ast_bytes(cg_builder *b, const void *p, size_t n) {
    if (n == 0) return ast_empty(b);
    cg_ast *a = ast_new(b, A_BYTES);
    if (!a) return NULL;
    if (n > (size_t)CG_MAX_TNODES) return cgb_fail(b, "literal too long (%zu bytes)", n);
    a->bytes = cgb_alloc(b, n);
    memcpy(a->bytes, p, n);
    a->n = (int)n;
    return a;
}

cg_ast *ast_str(cg_builder *b, const char *s) { return ast_bytes(b, s, strlen(s)); }

int cg_ranges_normalize(uint32_t *r, int n) {
    /* insertion sort by lo: classes are small */
    for (int i = 1; i < n; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        int j = i - 1;
        while (j >= 0 && r[2 * j] > lo) {
            r[2 * j + 2] = r[2 * j];
            r[2 * j + 3] = r[2 * j + 1];
            j--;
        }
        r[2 * j + 2] = lo;
        r[2 * j + 3] = hi;
    }
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (r[2 * i] > r[2 * i + 1]) continue;
        if (m && r[2 * i] <= r[2 * m - 1] + 1) {
            if (r[2 * i + 1] > r[2 * m - 1]) r[2 * m - 1] = r[2 * i + 1];
        } else {
            r[2 * m] = r[2 * i];
            r[2 * m + 1] = r[2 * i + 1];
            m++;
        }
    }
    return m;
}

cg_ast *ast_class(cg_builder *b, const uint32_t *ranges, int n, bool negate) {
    uint32_t *r = xmalloc((size_t)(2 * n + 6) * sizeof *r);
    memcpy(r, ranges, (size_t)2 * n * sizeof *r);
    for (int i = 0; i < 2 * n; i++)
        if (r[i] > 0x10ffff) r[i] = 0x10ffff;
    n = cg_ranges_normalize(r, n);
    if (negate) {
        uint32_t *c = xmalloc((size_t)(2 * n + 6) * sizeof *c);
        int m = 0;
        uint32_t next = 0;
        for (int i = 0; i < n; i++) {
            if (r[2 * i] > next) {
                c[2 * m] = next;
                c[2 * m + 1] = r[2 * i] - 1;
                m++;
            }
            next = r[2 * i + 1] + 1;
        }
        if (next <= 0x10ffff) {
            c[2 * m] = next;
            c[2 * m + 1] = 0x10ffff;
            m++;
        }
        free(r);
        r = c;
        n = m;
    }
    /* no surrogates: they are not characters in UTF-8 */
    uint32_t *c = xmalloc((size_t)(2 * n + 6) * sizeof *c);
    int m = 0;
    for (int i = 0; i < n; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        if (hi < 0xd800 || lo > 0xdfff) {
            c[2 * m] = lo, c[2 * m + 1] = hi, m++;
            continue;
        }
        if (lo < 0xd800) c[2 * m] = lo, c[2 * m + 1] = 0xd7ff, m++;
        if (hi > 0xdfff) c[2 * m] = 0xe000, c[2 * m + 1] = hi, m++;
    }
    free(r);
    cg_ast *a = ast_new(b, A_CLASS);
    if (a) {
        a->ranges = cgb_alloc(b, (size_t)(2 * m + 1) * sizeof *a->ranges);
        memcpy(a->ranges, c, (size_t)2 * m * sizeof *c);
        a->n = m;
    }
    free(c);
    return a;
}

cg_ast *ast_range(cg_builder *b, uint32_t lo, uint32_t hi) {
    uint32_t r[2] = {lo, hi};
    return ast_class(b, r, 1, false);
}

static cg_ast *ast_list(cg_builder *b, int kind, cg_ast **kids, int n) {
    for (int i = 0; i < n; i++)
        if (!kids[i]) return NULL;
    if (n == 1) return kids[0];
    if (n == 0) return kind == A_SEQ ? ast_empty(b) : cgb_fail(b, "empty alternation");
    cg_ast *a = ast_new(b, kind);
    if (!a) return NULL;
    a->kids = cgb_alloc(b, (size_t)n * sizeof *a->kids);
    memcpy(a->kids, kids, (size_t)n * sizeof *kids);
    a->n = n;
    return a;
}

cg_ast *ast_seq(cg_builder *b, cg_ast **kids, int n) { return ast_list(b, A_SEQ, kids, n); }
cg_ast *ast_alt(cg_builder *b, cg_ast **kids, int n) { return ast_list(b, A_ALT, kids, n); }
cg_ast *ast_seq2(cg_builder *b, cg_ast *x, cg_ast *y) {
    cg_ast *k[2] = {x, y};
    return ast_seq(b, k, 2);
}
cg_ast *ast_seq3(cg_builder *b, cg_ast *x, cg_ast *y, cg_ast *z) {
    cg_ast *k[3] = {x, y, z};
    return ast_seq(b, k, 3);
}
cg_ast *ast_alt2(cg_builder *b, cg_ast *x, cg_ast *y) {
    cg_ast *k[2] = {x, y};
    return ast_alt(b, k, 2);
}

cg_ast *ast_rep(cg_builder *b, cg_ast *x, int min, int max) {
    if (!x) return NULL;
    if (min < 0 || (max >= 0 && max < min)) return cgb_fail(b, "bad repetition bounds {%d,%d}", min, max);
    if (min > CG_MAX_REPEAT || max > CG_MAX_REPEAT)
        return cgb_fail(b, "repetition bound above %d", CG_MAX_REPEAT);
    if (min == 1 && max == 1) return x;
    cg_ast *a = ast_new(b, A_REP);
    if (!a) return NULL;
    a->kids = cgb_alloc(b, sizeof *a->kids);
    a->kids[0] = x;
    a->n = 1;
    a->min = min;
    a->max = max;
    return a;
}

cg_ast *ast_ref(cg_builder *b, int rule) {
    if (rule < 0) return NULL;
    cg_ast *a = ast_new(b, A_REF);
    if (a) a->rule = rule;
    return a;
}

void astv_push(cg_astv *v, cg_ast *a) {
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 8;
        v->v = xrealloc(v->v, (size_t)v->cap * sizeof *v->v);
    }
    v->v[v->n++] = a;
}
void astv_free(cg_astv *v) {
    free(v->v);
    memset(v, 0, sizeof *v);
}

int cg_utf8_put(uint8_t *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xc0 | cp >> 6);
        o[1] = (uint8_t)(0x80 | (cp & 63));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xe0 | cp >> 12);
        o[1] = (uint8_t)(0x80 | (cp >> 6 & 63));
        o[2] = (uint8_t)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xf0 | cp >> 18);
    o[1] = (uint8_t)(0x80 | (cp >> 12 & 63));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 63));
    o[3] = (uint8_t)(0x80 | (cp & 63));
    return 4;
}

int cg_utf8_get(const uint8_t *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    uint8_t c = s[0];
    int len;
    uint32_t v, min;
    if (c < 0x80) return *cp = c, 1;
    if ((c & 0xe0) == 0xc0) len = 2, v = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0) len = 3, v = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0) len = 4, v = c & 0x07, min = 0x10000;
    else return 0;
    if (n < (size_t)len) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return len;
}

/* ---- Thompson automaton of one rule ------------------------------------------ */

enum { E_EPS, E_BYTE, E_REF };
typedef struct {
    uint32_t from, to, rule;
    uint8_t kind, lo, hi;
} tedge;

typedef struct {
    cg_builder *b;
    tedge *e;
    size_t ne, cape;
    uint32_t nn;     /* nodes of this rule */
    size_t total;    /* nodes of every rule so far */
} tnfa;

static uint32_t tn_node(tnfa *t) {
    if (t->total + t->nn >= CG_MAX_TNODES) {
        cgb_fail(t->b, "grammar too large (more than %d automaton states; repetition bounds too high?)",
                 CG_MAX_TNODES);
        return 0;
    }
    return t->nn++;
}

static void tn_edge(tnfa *t, uint32_t from, uint32_t to, uint8_t kind, uint8_t lo, uint8_t hi, uint32_t rule) {
    if (t->ne == t->cape) {
        t->cape = t->cape ? 2 * t->cape : 256;
        t->e = xrealloc(t->e, t->cape * sizeof *t->e);
    }
    t->e[t->ne++] = (tedge){from, to, rule, kind, lo, hi};
}

/* UTF-8 byte-range sequences for a codepoint range (no surrogates inside). */
static void utf8_split(tnfa *t, uint32_t s, uint32_t e, uint32_t lo, uint32_t hi) {
    if (lo > hi || t->b->failed) return;
    static const uint32_t lims[3] = {0x7f, 0x7ff, 0xffff};
    for (int i = 0; i < 3; i++)
        if (lo <= lims[i] && lims[i] < hi) {
            utf8_split(t, s, e, lo, lims[i]);
            utf8_split(t, s, e, lims[i] + 1, hi);
            return;
        }
    if (hi < 0x80) {
        tn_edge(t, s, e, E_BYTE, (uint8_t)lo, (uint8_t)hi, 0);
        return;
    }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_split(t, s, e, lo, lo | m);
                utf8_split(t, s, e, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_split(t, s, e, lo, (hi & ~m) - 1);
                utf8_split(t, s, e, hi & ~m, hi);
                return;
            }
        }
    }
    uint8_t a[4], z[4];
    int n = cg_utf8_put(a, lo);
    cg_utf8_put(z, hi);
    uint32_t cur = s;
    for (int i = 0; i < n; i++) {
        uint32_t nx = i == n - 1 ? e : tn_node(t);
        tn_edge(t, cur, nx, E_BYTE, a[i], z[i], 0);
        cur = nx;
    }
}

static uint32_t tn_build(tnfa *t, const cg_ast *a, uint32_t s) {
    if (t->b->failed) return s;
    switch (a->kind) {
    case A_EMPTY: return s;
    case A_BYTES: {
        uint32_t cur = s;
        for (int i = 0; i < a->n; i++) {
            uint32_t nx = tn_node(t);
            tn_edge(t, cur, nx, E_BYTE, a->bytes[i], a->bytes[i], 0);
            cur = nx;
        }
        return cur;
    }
    case A_CLASS: {
        uint32_t e = tn_node(t);
        for (int i = 0; i < a->n; i++) utf8_split(t, s, e, a->ranges[2 * i], a->ranges[2 * i + 1]);
        return e;
    }
    case A_SEQ: {
        uint32_t cur = s;
        for (int i = 0; i < a->n; i++) cur = tn_build(t, a->kids[i], cur);
        return cur;
    }
    case A_ALT: {
        uint32_t e = tn_node(t);
        for (int i = 0; i < a->n; i++) tn_edge(t, tn_build(t, a->kids[i], s), e, E_EPS, 0, 0, 0);
        return e;
    }
    case A_REF: {
        uint32_t e = tn_node(t);
        tn_edge(t, s, e, E_REF, 0, 0, (uint32_t)a->rule);
        return e;
    }
    case A_REP: {
        uint32_t cur = s;
        for (int i = 0; i < a->min; i++) cur = tn_build(t, a->kids[0], cur);
        if (a->max < 0) {
            uint32_t l = tn_node(t);
            tn_edge(t, cur, l, E_EPS, 0, 0, 0);
            tn_edge(t, tn_build(t, a->kids[0], l), l, E_EPS, 0, 0, 0);
            return l;
        }
        if (a->max == a->min) return cur;
        uint32_t e = tn_node(t);
        for (int i = a->min; i < a->max; i++) {
            tn_edge(t, cur, e, E_EPS, 0, 0, 0);
            uint32_t st = tn_node(t);
            tn_edge(t, cur, st, E_EPS, 0, 0, 0);
            cur = tn_build(t, a->kids[0], st);
            if (t->b->failed) return e;
        }
        tn_edge(t, cur, e, E_EPS, 0, 0, 0);
        return e;
    }
    }
    return s;
}

/* ---- Compilation ---------------------------------------------------------------- */

typedef struct {
    cg_node *nodes;
    size_t n, cap;
    cg_bedge *be;
    size_t nbe, capbe;
    cg_redge *re;
    size_t nre, capre;
} gbuild;

static int cmp_bedge(const void *x, const void *y) {
    const cg_bedge *a = x, *b = y;
    if (a->lo != b->lo) return a->lo - b->lo;
    if (a->hi != b->hi) return a->hi - b->hi;
    return a->to < b->to ? -1 : a->to > b->to;
}
static int cmp_redge(const void *x, const void *y) {
    const cg_redge *a = x, *b = y;
    if (a->rule != b->rule) return a->rule < b->rule ? -1 : 1;
    return a->to < b->to ? -1 : a->to > b->to;
}

/* Epsilon removal for one rule: global nodes are the rule's start and the
 * targets of consuming edges; each takes the edges of its epsilon closure. */
static int rule_finish(cg_builder *b, tnfa *t, uint32_t start, uint32_t end, uint32_t rule, gbuild *g,
                       size_t *work) {
    uint32_t nn = t->nn;
    uint32_t *off = xcalloc(nn + 1, sizeof *off);
    for (size_t i = 0; i < t->ne; i++) off[t->e[i].from + 1]++;
    for (uint32_t i = 0; i < nn; i++) off[i + 1] += off[i];
    tedge *adj = xmalloc((t->ne + 1) * sizeof *adj);
    uint32_t *fill = xmalloc((nn + 1) * sizeof *fill);
    memcpy(fill, off, nn * sizeof *fill);
    for (size_t i = 0; i < t->ne; i++) adj[fill[t->e[i].from]++] = t->e[i];
    int32_t *gid = xmalloc(nn * sizeof *gid);
    for (uint32_t i = 0; i < nn; i++) gid[i] = -1;
    uint32_t *order = xmalloc((nn + 1) * sizeof *order), n_order = 0;
    uint32_t *seen = xcalloc(nn, sizeof *seen), mark = 0;
    uint32_t *dfs = xmalloc((nn + 1) * sizeof *dfs);
    size_t base = g->n;
    gid[start] = (int32_t)(g->n - base);
    order[n_order++] = start;
    for (size_t i = 0; i < t->ne; i++)
        if (t->e[i].kind != E_EPS && gid[t->e[i].to] < 0) {
            gid[t->e[i].to] = (int32_t)n_order;
            order[n_order++] = t->e[i].to;
        }
    int rc = 0;
    for (uint32_t k = 0; k < n_order && rc == 0; k++) {
        if (g->n == g->cap) {
            g->cap = g->cap ? 2 * g->cap : 1024;
            g->nodes = xrealloc(g->nodes, g->cap * sizeof *g->nodes);
        }
        cg_node *nd = &g->nodes[g->n++];
        memset(nd, 0, sizeof *nd);
        nd->rule = rule;
        nd->be = (uint32_t)g->nbe;
        nd->re = (uint32_t)g->nre;
        mark++;
        uint32_t sp = 0;
        dfs[sp++] = order[k];
        seen[order[k]] = mark;
        while (sp) {
            uint32_t u = dfs[--sp];
            if (++*work > 50000000) {
                cgb_fail(b, "grammar too large to compile (too many alternatives inside repetitions)");
                rc = -1;
                break;
            }
            if (u == end) nd->accept = 1;
            for (uint32_t j = off[u]; j < off[u + 1]; j++) {
                tedge *e = &adj[j];
                if (e->kind == E_EPS) {
                    if (seen[e->to] != mark) seen[e->to] = mark, dfs[sp++] = e->to;
                } else if (e->kind == E_BYTE) {
                    if (g->nbe == g->capbe) {
                        g->capbe = g->capbe ? 2 * g->capbe : 1024;
                        g->be = xrealloc(g->be, g->capbe * sizeof *g->be);
                    }
                    g->be[g->nbe++] = (cg_bedge){e->lo, e->hi, (uint32_t)(base + (size_t)gid[e->to])};
                } else {
                    if (g->nre == g->capre) {
                        g->capre = g->capre ? 2 * g->capre : 256;
                        g->re = xrealloc(g->re, g->capre * sizeof *g->re);
                    }
                    g->re[g->nre++] = (cg_redge){e->rule, (uint32_t)(base + (size_t)gid[e->to])};
                }
            }
        }
        nd->nbe = (uint32_t)(g->nbe - nd->be);
        nd->nre = (uint32_t)(g->nre - nd->re);
        /* sort and dedupe the node's edges */
        if (nd->nbe > 1) qsort(g->be + nd->be, nd->nbe, sizeof *g->be, cmp_bedge);
        uint32_t m = 0;
        for (uint32_t j = 0; j < nd->nbe; j++) {
            cg_bedge *x = &g->be[nd->be + j];
            if (m && !cmp_bedge(x, &g->be[nd->be + m - 1])) continue;
            g->be[nd->be + m++] = *x;
        }
        nd->nbe = m;
        g->nbe = nd->be + m;
        if (nd->nre > 1) qsort(g->re + nd->re, nd->nre, sizeof *g->re, cmp_redge);
        m = 0;
        for (uint32_t j = 0; j < nd->nre; j++) {
            cg_redge *x = &g->re[nd->re + j];
            if (m && !cmp_redge(x, &g->re[nd->re + m - 1])) continue;
            g->re[nd->re + m++] = *x;
        }
        nd->nre = m;
        g->nre = nd->re + m;
    }
    free(off);
    free(adj);
    free(fill);
    free(gid);
    free(order);
    free(seen);
    free(dfs);
    return rc;
}

static void grammar_destroy(lilac_grammar *g) {
    if (!g) return;
    if (g->tables) cg_tables_free(g->tables, g->n_nodes);
    for (uint32_t i = 0; i < g->n_rules; i++) free(g->rule_names[i]);
    free(g->rule_names);
    free(g->rule_start);
    free(g->nodes);
    free(g->bedges);
    free(g->redges);
    free(g->ret_off);
    free(g->ret_node);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* Estimated automaton size of an AST, capped at `cap`; *refs counts references. */
static long ast_est(const cg_ast *a, long cap, int *refs) {
    switch (a->kind) {
    case A_EMPTY: return 0;
    case A_CLASS: return a->n + 1;
    case A_BYTES: return a->n;
    case A_REF: ++*refs; return 1;
    case A_REP: {
        long k = ast_est(a->kids[0], cap, refs), m = a->max < 0 ? (a->min > 0 ? a->min : 1) : a->max;
        return k * m + 1 > cap ? cap + 1 : k * m + 1;
    }
    default: {
        long t = 1;
        for (int i = 0; i < a->n && t <= cap; i++) t += ast_est(a->kids[i], cap, refs);
        return t;
    }
    }
}

/* Replace references to small rules by their bodies, in place. */
static void ast_inline(cg_ast *a, const uint8_t *leaf, cg_ast *const *bodies, int mark) {
    if (a->mark == mark) return;
    a->mark = mark;
    if (a->kind == A_REF) {
        if (leaf[a->rule]) {
            int m = a->mark;
            *a = *bodies[a->rule];
            a->mark = m;
        }
        return;
    }
    if (a->kind == A_SEQ || a->kind == A_ALT || a->kind == A_REP)
        for (int i = 0; i < a->n; i++) ast_inline(a->kids[i], leaf, bodies, mark);
}

static void ast_reach(const cg_ast *a, uint8_t *reach, uint32_t *stack, int *sp, int mark) {
    if (a->mark == mark) return;
    ((cg_ast *)a)->mark = mark;
    if (a->kind == A_REF) {
        if (!reach[a->rule]) reach[a->rule] = 1, stack[(*sp)++] = (uint32_t)a->rule;
        return;
    }
    if (a->kind == A_SEQ || a->kind == A_ALT || a->kind == A_REP)
        for (int i = 0; i < a->n; i++) ast_reach(a->kids[i], reach, stack, sp, mark);
}

/* Small rules without references (a JSON string, a number, whitespace) are
 * inlined where they are used, repeatedly: a token that runs past the end of
 * such a rule then stays inside its caller, so the token index can decide it
 * once instead of at every step. Rules no longer reachable are emptied. */
static void inline_small_rules(cg_builder *b, int root) {
    int R = b->n_rules, mark = 1 << 20;
    uint8_t *leaf = xcalloc((size_t)R + 1, 1);
    for (int pass = 0; pass < 8; pass++) {
        bool any = false;
        for (int r = 0; r < R; r++) {
            int refs = 0;
            leaf[r] = 0;
            if (r != root && ast_est(b->bodies[r], 256, &refs) <= 256 && refs == 0) leaf[r] = 1, any = true;
        }
        if (!any) break;
        mark++;
        bool changed = false;
        for (int r = 0; r < R; r++) {
            if (leaf[r]) continue;
            int before = 0, after = 0;
            ast_est(b->bodies[r], 1L << 30, &before);
            ast_inline(b->bodies[r], leaf, b->bodies, mark);
            ast_est(b->bodies[r], 1L << 30, &after);
            changed |= after != before;
        }
        if (!changed) break;
    }
    uint8_t *reach = xcalloc((size_t)R + 1, 1);
    uint32_t *stack = xmalloc(((size_t)R + 1) * sizeof *stack);
    int sp = 0;
    reach[root] = 1;
    stack[sp++] = (uint32_t)root;
    mark++;
    while (sp) ast_reach(b->bodies[stack[--sp]], reach, stack, &sp, mark);
    for (int r = 0; r < R; r++)
        if (!reach[r]) b->bodies[r] = ast_empty(b);
    free(reach);
    free(stack);
    free(leaf);
}

lilac_grammar *cg_compile(cg_builder *b, int root) {
    if (b->failed) return NULL;
    if (root < 0 || root >= b->n_rules) return cgb_fail(b, "no start rule");
    for (int r = 0; r < b->n_rules; r++)
        if (!b->bodies[r]) return cgb_fail(b, "rule '%s' is used but never defined", b->names[r]);
    inline_small_rules(b, root);
    if (b->failed) return NULL;
    gbuild gb = {0};
    uint32_t *rule_start = xmalloc((size_t)b->n_rules * sizeof *rule_start);
    tnfa t = {.b = b};
    size_t work = 0;
    for (int r = 0; r < b->n_rules && !b->failed; r++) {
        t.ne = 0;
        t.nn = 0;
        uint32_t s = tn_node(&t);
        uint32_t e = tn_build(&t, b->bodies[r], s);
        if (b->failed) break;
        t.total += t.nn;
        rule_start[r] = (uint32_t)gb.n;
        if (rule_finish(b, &t, s, e, (uint32_t)r, &gb, &work)) break;
    }
    free(t.e);
    if (b->failed) {
        free(rule_start), free(gb.nodes), free(gb.be), free(gb.re);
        return NULL;
    }
    lilac_grammar *g = xcalloc(1, sizeof *g);
    g->refs = 1;
    pthread_mutex_init(&g->mu, NULL);
    g->n_rules = (uint32_t)b->n_rules;
    g->n_nodes = (uint32_t)gb.n;
    g->root = (uint32_t)root;
    g->rule_start = rule_start;
    g->rule_names = xmalloc((size_t)b->n_rules * sizeof *g->rule_names);
    for (int r = 0; r < b->n_rules; r++) g->rule_names[r] = xstrdup(b->names[r]);
    g->nodes = gb.nodes;
    g->bedges = gb.be;
    g->redges = gb.re;
    uint32_t N = g->n_nodes, R = g->n_rules;

    /* live nodes (can reach the end of their rule) and productive rules */
    uint8_t *live = xcalloc(N + 1, 1), *prod = xcalloc(R + 1, 1);
    for (bool ch = true; ch;) {
        ch = false;
        for (uint32_t i = N; i-- > 0;) {
            if (live[i]) continue;
            cg_node *nd = &g->nodes[i];
            bool l = nd->accept;
            for (uint32_t j = 0; j < nd->nbe && !l; j++) l = live[g->bedges[nd->be + j].to];
            for (uint32_t j = 0; j < nd->nre && !l; j++) l = prod[g->redges[nd->re + j].rule] && live[g->redges[nd->re + j].to];
            if (l) {
                live[i] = 1, ch = true;
                if (g->rule_start[nd->rule] == i) prod[nd->rule] = 1;
            }
        }
    }
    if (!prod[root]) {
        free(live), free(prod);
        grammar_destroy(g);
        return cgb_fail(b, "rule '%s' derives no finite text (recursion without an exit)", b->names[root]);
    }
    /* trim: drop edges into dead nodes or unproductive rules */
    for (uint32_t i = 0; i < N; i++) {
        cg_node *nd = &g->nodes[i];
        uint32_t m = 0;
        for (uint32_t j = 0; j < nd->nbe; j++)
            if (live[g->bedges[nd->be + j].to]) g->bedges[nd->be + m++] = g->bedges[nd->be + j];
        nd->nbe = live[i] ? m : 0;
        m = 0;
        for (uint32_t j = 0; j < nd->nre; j++) {
            cg_redge e = g->redges[nd->re + j];
            if (prod[e.rule] && live[e.to]) g->redges[nd->re + m++] = e;
        }
        nd->nre = live[i] ? m : 0;
        memset(nd->first, 0, sizeof nd->first);
        for (uint32_t j = 0; j < nd->nbe; j++)
            for (unsigned c = g->bedges[nd->be + j].lo; c <= g->bedges[nd->be + j].hi; c++)
                nd->first[c >> 6] |= 1ull << (c & 63);
    }
    /* nullable rules, then left recursion (a rule reaching itself before any byte) */
    uint8_t *nl = xcalloc(N + 1, 1), *nullr = xcalloc(R + 1, 1);
    for (bool ch = true; ch;) {
        ch = false;
        for (uint32_t i = N; i-- > 0;) {
            if (nl[i]) continue;
            cg_node *nd = &g->nodes[i];
            bool l = nd->accept;
            for (uint32_t j = 0; j < nd->nre && !l; j++) l = nullr[g->redges[nd->re + j].rule] && nl[g->redges[nd->re + j].to];
            if (l) {
                nl[i] = 1, ch = true;
                if (g->rule_start[nd->rule] == i) nullr[nd->rule] = 1;
            }
        }
    }
    /* rule graph: r -> s when r may call s before consuming a byte */
    uint32_t *eoff = xcalloc(R + 1, sizeof *eoff), *edst = NULL;
    size_t ne = 0, cape = 0;
    uint32_t *vis = xcalloc(N + 1, sizeof *vis), *st = xmalloc((N + 1) * sizeof *st);
    for (uint32_t r = 0; r < R; r++) {
        eoff[r] = (uint32_t)ne;
        uint32_t sp = 0;
        st[sp++] = g->rule_start[r];
        vis[g->rule_start[r]] = r + 1;
        while (sp) {
            cg_node *nd = &g->nodes[st[--sp]];
            for (uint32_t j = 0; j < nd->nre; j++) {
                cg_redge e = g->redges[nd->re + j];
                if (ne == cape) cape = cape ? 2 * cape : 256, edst = xrealloc(edst, cape * sizeof *edst);
                edst[ne++] = e.rule;
                if (nullr[e.rule] && vis[e.to] != r + 1) vis[e.to] = r + 1, st[sp++] = e.to;
            }
        }
    }
    eoff[R] = (uint32_t)ne;
    /* cycle search: iterative DFS with colours */
    uint8_t *col = xcalloc(R + 1, 1);
    uint32_t *it = xcalloc(R + 1, sizeof *it);
    int bad = -1;
    for (uint32_t r0 = 0; r0 < R && bad < 0; r0++) {
        if (col[r0]) continue;
        uint32_t sp = 0;
        st[sp++] = r0;
        col[r0] = 1;
        it[r0] = eoff[r0];
        while (sp && bad < 0) {
            uint32_t r = st[sp - 1];
            if (it[r] < eoff[r + 1]) {
                uint32_t s = edst[it[r]++];
                if (col[s] == 1) bad = (int)s;
                else if (!col[s]) col[s] = 1, it[s] = eoff[s], st[sp++] = s;
            } else {
                col[r] = 2;
                sp--;
            }
        }
    }
    free(eoff), free(edst), free(vis), free(st), free(col), free(it), free(nl), free(nullr), free(live), free(prod);
    if (bad >= 0) {
        grammar_destroy(g);
        return cgb_fail(b, "left recursion through rule '%s' (a rule may not reach itself before matching a byte)",
                        b->names[bad]);
    }
    /* call sites of every rule */
    g->ret_off = xcalloc(R + 1, sizeof *g->ret_off);
    for (uint32_t i = 0; i < N; i++)
        for (uint32_t j = 0; j < g->nodes[i].nre; j++) g->ret_off[g->redges[g->nodes[i].re + j].rule + 1]++;
    for (uint32_t r = 0; r < R; r++) g->ret_off[r + 1] += g->ret_off[r];
    g->ret_node = xmalloc((g->ret_off[R] + 1) * sizeof *g->ret_node);
    uint32_t *fill = xmalloc((R + 1) * sizeof *fill);
    memcpy(fill, g->ret_off, R * sizeof *fill);
    for (uint32_t i = 0; i < N; i++)
        for (uint32_t j = 0; j < g->nodes[i].nre; j++) {
            cg_redge e = g->redges[g->nodes[i].re + j];
            g->ret_node[fill[e.rule]++] = e.to;
        }
    free(fill);
    return g;
}

lilac_grammar *lilac_grammar_ref(lilac_grammar *g) {
    pthread_mutex_lock(&g->mu);
    g->refs++;
    pthread_mutex_unlock(&g->mu);
    return g;
}

void lilac_grammar_free(lilac_grammar *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left == 0) grammar_destroy(g);
}

size_t lilac_grammar_n_rules(const lilac_grammar *g) { return g->n_rules; }
size_t lilac_grammar_n_nodes(const lilac_grammar *g) { return g->n_nodes; }

/* ---- Stack sets ----------------------------------------------------------------- */

void cg_state_clear(cg_state *s) {
    s->n = 0;
    s->n_stk = 0;
    s->end = s->end_flag = s->overflow = 0;
}
void cg_state_free(cg_state *s) {
    free(s->w);
    memset(s, 0, sizeof *s);
}
static void st_reserve(cg_state *s, size_t extra) {
    if (s->n + extra > s->cap) {
        s->cap = (s->n + extra) * 2 + 64;
        s->w = xrealloc(s->w, s->cap * sizeof *s->w);
    }
}
void cg_state_copy(cg_state *d, const cg_state *s) {
    cg_state_clear(d);
    st_reserve(d, s->n);
    if (s->n) memcpy(d->w, s->w, s->n * sizeof *s->w);
    d->n = s->n;
    d->n_stk = s->n_stk;
    d->end = s->end;
    d->end_flag = s->end_flag;
    d->overflow = s->overflow;
}
void cg_state_one(cg_state *s, const uint32_t *stk) {
    cg_state_clear(s);
    uint32_t w = cg_stk_words(stk);
    st_reserve(s, w);
    memcpy(s->w, stk, w * sizeof *stk);
    s->n = w;
    s->n_stk = 1;
}
void cg_scratch_free(cg_scratch *x) {
    free(x->hkey), free(x->hval), free(x->hgen), free(x->store), free(x->work);
    memset(x, 0, sizeof *x);
}

uint64_t lilac_constrain_hash(const void *p, size_t n, uint64_t h) {
    const uint8_t *s = p;
    h ^= 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static inline uint64_t stk_hash(const uint32_t *s, uint32_t w) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (uint32_t i = 0; i < w; i++) h = (h ^ s[i]) * 0xff51afd7ed558ccdull, h ^= h >> 32;
    return h | 1;
}

/* Insert into the visited set; false when already there. */
static bool visit(cg_scratch *x, const uint32_t *s, uint32_t w) {
    if (x->hcap == 0 || (x->store_n + w) * 2 > x->hcap * 8u) {
        /* grow: rebuild from the store */
        uint32_t cap = x->hcap ? x->hcap * 2 : 1024;
        while ((x->store_n + w) * 2 > cap * 8u) cap *= 2;
        free(x->hkey), free(x->hval), free(x->hgen);
        x->hkey = xmalloc(cap * sizeof *x->hkey);
        x->hval = xmalloc(cap * sizeof *x->hval);
        x->hgen = xcalloc(cap, sizeof *x->hgen);
        x->hcap = cap;
        x->gen = 1;
        for (size_t o = 0; o < x->store_n;) {
            uint32_t ww = cg_stk_words(x->store + o);
            uint64_t h = stk_hash(x->store + o, ww);
            uint32_t i = (uint32_t)h & (cap - 1);
            while (x->hgen[i] == x->gen) i = (i + 1) & (cap - 1);
            x->hgen[i] = x->gen, x->hkey[i] = h, x->hval[i] = (uint32_t)o;
            o += ww;
        }
    }
    uint64_t h = stk_hash(s, w);
    uint32_t i = (uint32_t)h & (x->hcap - 1);
    while (x->hgen[i] == x->gen) {
        if (x->hkey[i] == h && !memcmp(x->store + x->hval[i], s, w * sizeof *s)) return false;
        i = (i + 1) & (x->hcap - 1);
    }
    if (x->store_n + w > x->store_cap) {
        x->store_cap = (x->store_n + w) * 2 + 256;
        x->store = xrealloc(x->store, x->store_cap * sizeof *x->store);
    }
    memcpy(x->store + x->store_n, s, w * sizeof *s);
    x->hgen[i] = x->gen, x->hkey[i] = h, x->hval[i] = (uint32_t)x->store_n;
    x->store_n += w;
    return true;
}

static void vis_reset(cg_scratch *x) {
    x->store_n = 0;
    x->visits = 0;
    if (++x->gen == 0) {
        if (x->hgen) memset(x->hgen, 0, x->hcap * sizeof *x->hgen);
        x->gen = 1;
    }
}

static uint32_t *work_push(cg_scratch *x, uint32_t w) {
    if (x->work_n + w > x->work_cap) {
        x->work_cap = (x->work_n + w) * 2 + 256;
        x->work = xrealloc(x->work, x->work_cap * sizeof *x->work);
    }
    uint32_t *p = x->work + x->work_n;
    x->work_n += w;
    return p;
}

/* Close every stack on the work list into `out`. Work items are stored as
 * the stack followed by its word count, so the list pops from the end. */
static void drain(const lilac_grammar *g, cg_scratch *x, cg_state *out) {
    uint32_t tmp_cap = 0, *tmp = NULL;
    while (x->work_n) {
        uint32_t w = x->work[x->work_n - 1];
        x->work_n -= w + 1;
        if (w > tmp_cap) tmp_cap = w * 2 + 16, tmp = xrealloc(tmp, tmp_cap * sizeof *tmp);
        memcpy(tmp, x->work + x->work_n, w * sizeof *tmp);
        const uint32_t *s = tmp;
        uint32_t k = cg_stk_len(s), flag = s[0] & CG_FLAG;
        if (k > CG_MAX_DEPTH || x->visits >= CG_MAX_VISITS) {
            out->overflow = 1;
            continue;
        }
        if (!visit(x, s, w)) continue;
        x->visits++;
        uint32_t top = s[k + 1];
        const cg_node *nd = &g->nodes[top];
        if (nd->nbe && (out->n_stk >= CG_MAX_STACKS || out->n + w > CG_MAX_WORDS)) out->overflow = 1;
        else if (nd->nbe) {
            st_reserve(out, w);
            memcpy(out->w + out->n, s, w * sizeof *s);
            out->n += w;
            out->n_stk++;
        }
        for (uint32_t j = 0; j < nd->nre; j++) {
            cg_redge e = g->redges[nd->re + j];
            uint32_t *p = work_push(x, w + 2);
            s = tmp; /* work_push may not move tmp, but keep it explicit */
            memcpy(p, s, w * sizeof *s);
            p[0] = (k + 1) | flag;
            p[w - 1] = e.to;
            p[w] = g->rule_start[e.rule];
            p[w + 1] = w + 1;
        }
        if (nd->accept) {
            if (k >= 2) {
                uint32_t *p = work_push(x, w);
                memcpy(p, s, (w - 1) * sizeof *s);
                p[0] = (k - 1) | flag;
                p[w - 1] = w - 1;
            } else {
                uint32_t bot = s[1];
                if (bot == CG_ROOT) {
                    if (flag) out->end_flag = 1;
                    else out->end = 1;
                } else {
                    uint32_t r = bot & ~CG_CTX;
                    if (!flag) out->end = 1;
                    if (r == g->root) out->end_flag = 1;
                    for (uint32_t j = g->ret_off[r]; j < g->ret_off[r + 1]; j++) {
                        uint32_t to = g->ret_node[j];
                        uint32_t *p = work_push(x, 4);
                        p[0] = 1 | CG_FLAG;
                        p[1] = CG_CTX | g->nodes[to].rule;
                        p[2] = to;
                        p[3] = 3;
                    }
                }
            }
        }
    }
    free(tmp);
}

void cg_state_start(const lilac_grammar *g, cg_scratch *x, uint32_t bottom, uint32_t rule, cg_state *out) {
    cg_state_clear(out);
    vis_reset(x);
    uint32_t *p = work_push(x, 4);
    p[0] = 1;
    p[1] = bottom;
    p[2] = g->rule_start[rule];
    p[3] = 3;
    drain(g, x, out);
}

void cg_advance(const lilac_grammar *g, cg_scratch *x, const cg_state *in, uint8_t c, cg_state *out) {
    cg_state_clear(out);
    out->overflow = in->overflow;
    if (in->n_stk == 1) {
        /* fast path: one stack, one edge, into a node that only consumes (inside
         * a string, a number, a literal): the top moves, nothing to close */
        const uint32_t *s = in->w;
        uint32_t w = cg_stk_words(s);
        const cg_node *nd = &g->nodes[s[w - 1]];
        if (!(nd->first[c >> 6] >> (c & 63) & 1)) return;
        const cg_bedge *hit = NULL;
        int nhit = 0;
        for (uint32_t j = 0; j < nd->nbe; j++) {
            const cg_bedge *e = &g->bedges[nd->be + j];
            if (c < e->lo) break;
            if (c <= e->hi) hit = e, nhit++;
        }
        const cg_node *to = hit ? &g->nodes[hit->to] : NULL;
        if (nhit == 1 && to->nre == 0 && !to->accept && to->nbe) {
            st_reserve(out, w);
            memcpy(out->w, s, w * sizeof *s);
            out->w[w - 1] = hit->to;
            out->n = w;
            out->n_stk = 1;
            return;
        }
    }
    vis_reset(x);
    for (size_t o = 0; o < in->n;) {
        const uint32_t *s = in->w + o;
        uint32_t w = cg_stk_words(s);
        o += w;
        const cg_node *nd = &g->nodes[s[w - 1]];
        if (!(nd->first[c >> 6] >> (c & 63) & 1)) continue;
        for (uint32_t j = 0; j < nd->nbe; j++) {
            const cg_bedge *e = &g->bedges[nd->be + j];
            if (c < e->lo) break;
            if (c > e->hi) continue;
            uint32_t *p = work_push(x, w + 1);
            memcpy(p, s, w * sizeof *s);
            p[w - 1] = e->to;
            p[w] = w;
        }
        drain(g, x, out);
    }
}

uint64_t cg_state_hash(const cg_state *s) {
    uint64_t h = lilac_constrain_hash(s->n ? (const void *)s->w : "", s->n * sizeof *s->w, s->end);
    return h;
}

bool cg_state_equal(const cg_state *a, const cg_state *b) {
    return a->n == b->n && a->end == b->end && (a->n == 0 || !memcmp(a->w, b->w, a->n * sizeof *a->w));
}
