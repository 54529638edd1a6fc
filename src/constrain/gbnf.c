/* gbnf.c — llama.cpp's GBNF grammar format: `name ::= alternatives`, string
 * literals with escapes, character classes ([a-z], [^"\\], \x.. \u.. \U..),
 * `.`, grouping, `* + ? {m} {m,} {m,n}` and `#` comments; the start rule is
 * `root`. A rule may continue over several lines: it ends where the next
 * `name ::=` starts. Errors give line:column. */
#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>

#include "cg_internal.h"

typedef struct {
    cg_builder *b;
    const char *s, *p, *end;
    int depth;
} gp;

static void gp_pos(const gp *g, const char *at, int *line, int *col) {
    *line = 1, *col = 1;
    for (const char *q = g->s; q < at && q < g->end; q++) {
        if (*q == '\n') (*line)++, *col = 1;
        else (*col)++;
    }
}

static void *gfail(gp *g, const char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void *gfail(gp *g, const char *at, const char *fmt, ...) {
    int l, c;
    gp_pos(g, at, &l, &c);
    char m[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return cgb_fail(g->b, "grammar %d:%d: %s", l, c, m);
}

static bool is_name(char c) { return isalnum((unsigned char)c) || c == '_' || c == '-'; }

/* Skip spaces and comments; newlines too when `nl`. */
static void skip(gp *g, bool nl) {
    while (g->p < g->end) {
        char c = *g->p;
        if (c == '#') {
            while (g->p < g->end && *g->p != '\n') g->p++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n')) {
            g->p++;
        } else break;
    }
}

/* Does a rule definition (`name ::=`) start at q (after blanks)? */
static bool at_definition(const gp *g, const char *q) {
    while (q < g->end && (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n' || *q == '#')) {
        if (*q == '#')
            while (q < g->end && *q != '\n') q++;
        else q++;
    }
    if (q >= g->end) return true;
    if (!is_name(*q)) return false;
    while (q < g->end && is_name(*q)) q++;
    while (q < g->end && (*q == ' ' || *q == '\t')) q++;
    return g->end - q >= 3 && !memcmp(q, "::=", 3);
}

static int gb_hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class: escapes decoded, UTF-8 read whole. */
static int read_char(gp *g, uint32_t *cp) {
    const char *at = g->p;
    if (g->p >= g->end) {
        return gfail(g, at, "unexpected end inside a literal or class"), 0;
    }
    if (*g->p == '\\') {
        g->p++;
        if (g->p >= g->end) {
            return gfail(g, at, "unfinished escape"), 0;
        }
        char c = *g->p++;
        int nh = 0;
        switch (c) {
        case 'n': *cp = '\n'; return 1;
        case 't': *cp = '\t'; return 1;
        case 'r': *cp = '\r'; return 1;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': case '/': *cp = (uint8_t)c; return 1;
        case 'x': nh = 2; break;
        case 'u': nh = 4; break;
        case 'U': nh = 8; break;
        default: return gfail(g, at, "unknown escape '\\%c'", c), 0;
        }
        uint32_t v = 0;
        for (int i = 0; i < nh; i++) {
            int h = g->p < g->end ? gb_hexval(*g->p) : -1;
            if (h < 0) return gfail(g, at, "escape '\\%c' needs %d hex digits", c, nh), 0;
            v = v * 16 + (uint32_t)h;
            g->p++;
        }
        if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return gfail(g, at, "escape gives no character (U+%X)", v), 0;
        *cp = v;
        return 1;
    }
    int n = cg_utf8_get((const uint8_t *)g->p, (size_t)(g->end - g->p), cp);
    if (!n) return gfail(g, at, "invalid UTF-8"), 0;
    g->p += n;
    return 1;
}

static cg_ast *parse_alts(gp *g, bool nested);

static cg_ast *parse_atom(gp *g) {
    const char *at = g->p;
    char c = *g->p;
    cg_builder *b = g->b;
    if (c == '"') {
        g->p++;
        uint8_t *buf = xmalloc((size_t)(g->end - g->p) * 4 + 4);
        size_t n = 0;
        while (g->p < g->end && *g->p != '"') {
            uint32_t cp;
            if (!read_char(g, &cp)) return free(buf), NULL;
            n += (size_t)cg_utf8_put(buf + n, cp);
        }
        if (g->p >= g->end) {
            free(buf);
            return gfail(g, at, "unterminated string literal");
        }
        g->p++;
        cg_ast *a = ast_bytes(b, buf, n);
        free(buf);
        return a;
    }
    if (c == '[') {
        g->p++;
        bool neg = false;
        if (g->p < g->end && *g->p == '^') neg = true, g->p++;
        uint32_t *r = NULL;
        int n = 0, cap = 0;
        while (g->p < g->end && *g->p != ']') {
            uint32_t lo, hi;
            if (!read_char(g, &lo)) return free(r), NULL;
            hi = lo;
            if (g->end - g->p >= 2 && g->p[0] == '-' && g->p[1] != ']') {
                g->p++;
                if (!read_char(g, &hi)) return free(r), NULL;
                if (hi < lo) {
                    free(r);
                    return gfail(g, at, "class range out of order");
                }
            }
            if (n == cap) cap = cap ? 2 * cap : 8, r = xrealloc(r, (size_t)cap * 2 * sizeof *r);
            r[2 * n] = lo, r[2 * n + 1] = hi, n++;
        }
        if (g->p >= g->end) {
            free(r);
            return gfail(g, at, "unterminated character class");
        }
        g->p++;
        if (n == 0 && !neg) return gfail(g, at, "empty character class");
        cg_ast *a = ast_class(b, r ? r : (uint32_t[2]){0, 0}, n, neg);
        free(r);
        return a;
    }
    if (c == '.') {
        g->p++;
        return ast_range(b, 0, 0x10ffff);
    }
    if (c == '(') {
        g->p++;
        if (++g->depth > 200) return gfail(g, at, "groups nested too deeply");
        skip(g, true);
        cg_ast *a;
        if (g->p < g->end && *g->p == ')') a = ast_empty(b);
        else a = parse_alts(g, true);
        if (!a) return NULL;
        skip(g, true);
        if (g->p >= g->end || *g->p != ')') return gfail(g, at, "unclosed '('");
        g->p++;
        g->depth--;
        return a;
    }
    if (is_name(c)) {
        const char *q = g->p;
        while (g->p < g->end && is_name(*g->p)) g->p++;
        char name[128];
        if (g->p - q >= (long)sizeof name) return gfail(g, at, "rule name too long");
        memcpy(name, q, (size_t)(g->p - q));
        name[g->p - q] = 0;
        return ast_ref(b, cgb_rule(b, name));
    }
    return gfail(g, at, "unexpected '%c'", c);
}

static int read_int(gp *g, int *v) {
    if (g->p >= g->end || !isdigit((unsigned char)*g->p)) return 0;
    long x = 0;
    while (g->p < g->end && isdigit((unsigned char)*g->p)) {
        x = x * 10 + (*g->p++ - '0');
        if (x > CG_MAX_REPEAT) x = CG_MAX_REPEAT + 1;
    }
    *v = (int)x;
    return 1;
}

static cg_ast *parse_seq(gp *g, bool nested) {
    cg_astv v = {0};
    for (;;) {
        skip(g, nested);
        if (g->p >= g->end) break;
        char c = *g->p;
        if (c == '|' || c == ')') break;
        if (c == '\n') {
            if (at_definition(g, g->p)) break;
            skip(g, true);
            if (g->p >= g->end) break;
            c = *g->p;
            if (c == '|' || c == ')') break;
        }
        cg_ast *a = parse_atom(g);
        if (!a) return astv_free(&v), NULL;
        for (;;) {
            const char *at = g->p;
            if (g->p >= g->end) break;
            c = *g->p;
            if (c == '*') g->p++, a = ast_rep(g->b, a, 0, -1);
            else if (c == '+') g->p++, a = ast_rep(g->b, a, 1, -1);
            else if (c == '?') g->p++, a = ast_rep(g->b, a, 0, 1);
            else if (c == '{') {
                g->p++;
                int lo = 0, hi = -1;
                skip(g, false);
                if (!read_int(g, &lo)) return astv_free(&v), gfail(g, at, "'{' needs a count");
                skip(g, false);
                if (g->p < g->end && *g->p == ',') {
                    g->p++;
                    skip(g, false);
                    if (!read_int(g, &hi)) hi = -1;
                } else hi = lo;
                skip(g, false);
                if (g->p >= g->end || *g->p != '}') return astv_free(&v), gfail(g, at, "unclosed '{'");
                g->p++;
                if (lo > CG_MAX_REPEAT || hi > CG_MAX_REPEAT)
                    return astv_free(&v), gfail(g, at, "repetition bound above %d", CG_MAX_REPEAT);
                if (hi >= 0 && hi < lo) return astv_free(&v), gfail(g, at, "repetition {%d,%d} out of order", lo, hi);
                a = ast_rep(g->b, a, lo, hi);
            } else break;
            if (!a) return astv_free(&v), NULL;
        }
        astv_push(&v, a);
    }
    cg_ast *r = ast_seq(g->b, v.v, v.n);
    astv_free(&v);
    return r;
}

static cg_ast *parse_alts(gp *g, bool nested) {
    cg_astv v = {0};
    for (;;) {
        cg_ast *a = parse_seq(g, nested);
        if (!a) return astv_free(&v), NULL;
        astv_push(&v, a);
        skip(g, nested);
        if (g->p < g->end && *g->p == '|') {
            g->p++;
            skip(g, true);
            continue;
        }
        break;
    }
    cg_ast *r = ast_alt(g->b, v.v, v.n);
    astv_free(&v);
    return r;
}

lilac_grammar *lilac_grammar_from_gbnf(const char *text, size_t len, lilac_err *err) {
    cg_builder b;
    cgb_init(&b, err);
    gp g = {&b, text, text, text + len, 0};
    for (;;) {
        skip(&g, true);
        if (g.p >= g.end) break;
        const char *at = g.p;
        if (!is_name(*g.p)) {
            gfail(&g, at, "expected a rule name, found '%c'", *g.p);
            break;
        }
        const char *q = g.p;
        while (g.p < g.end && is_name(*g.p)) g.p++;
        char name[128];
        if (g.p - q >= (long)sizeof name) {
            gfail(&g, at, "rule name too long");
            break;
        }
        memcpy(name, q, (size_t)(g.p - q));
        name[g.p - q] = 0;
        skip(&g, false);
        if (g.end - g.p < 3 || memcmp(g.p, "::=", 3)) {
            gfail(&g, at, "expected '::=' after rule name '%s'", name);
            break;
        }
        g.p += 3;
        skip(&g, true);
        int r = cgb_rule(&b, name);
        if (r < 0) break;
        if (b.bodies[r]) {
            gfail(&g, at, "rule '%s' defined twice", name);
            break;
        }
        cg_ast *body = parse_alts(&g, false);
        if (!body) break;
        cgb_define(&b, r, body);
        skip(&g, false);
        if (g.p < g.end && *g.p != '\n') {
            gfail(&g, g.p, "unexpected '%c'", *g.p);
            break;
        }
    }
    lilac_grammar *res = NULL;
    if (!b.failed) {
        int root = -1;
        for (int i = 0; i < b.n_rules; i++)
            if (!strcmp(b.names[i], "root")) root = i;
        if (root < 0 || !b.bodies[root]) cgb_fail(&b, "grammar has no 'root' rule");
        else res = cg_compile(&b, root);
    }
    cgb_free(&b);
    return res;
}
