/* regex.c — the ECMAScript regex subset of JSON Schema `pattern` and vLLM's
 * guided_regex, as a grammar the whole text must match: alternation, groups
 * ((…), (?:…), (?<name>…)), * + ? {n} {n,} {n,m} (lazy forms too: laziness does
 * not change the language), classes with ranges and negation, . \d \w \s and
 * their negations, escapes (\n \t \xHH \uHHHH \u{H…}). ^ at the start and $ at
 * the end are accepted (the match is whole anyway). Lookaround, backreferences
 * and word boundaries are refused with the offset where they stand. */
#include <stdarg.h>
#include <stdlib.h>

#include "cg_internal.h"

typedef struct {
    cg_builder *b;
    const char *s, *p, *end;
    const char *where;
    int depth;
    bool json; /* inside a JSON string: the text is the string's JSON encoding */
} rp;

static void *rfail(rp *r, const char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void *rfail(rp *r, const char *at, const char *fmt, ...) {
    char m[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return cgb_fail(r->b, "%sregex offset %ld: %s", r->where, (long)(at - r->s), m);
}

typedef struct {
    uint32_t *r;
    int n, cap;
} rset;
static void rs_add(rset *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) s->cap = s->cap ? 2 * s->cap : 16, s->r = xrealloc(s->r, (size_t)s->cap * 2 * sizeof *s->r);
    s->r[2 * s->n] = lo, s->r[2 * s->n + 1] = hi, s->n++;
}
/* Add the complement of ranges (pairs). */
static void rs_add_not(rset *s, const uint32_t *r, int n) {
    uint32_t next = 0;
    for (int i = 0; i < n; i++) {
        if (r[2 * i] > next) rs_add(s, next, r[2 * i] - 1);
        next = r[2 * i + 1] + 1;
    }
    if (next <= 0x10ffff) rs_add(s, next, 0x10ffff);
}

/* \d \w \s and their negations as sets both ECMAScript and Python's re
 * agree on (a text made from them matches under either): \s is the common
 * whitespace, \S leaves out whitespace of either, \W and \D stay where
 * Unicode has no word characters or digits beyond ASCII's. */
static const uint32_t R_DIGIT[] = {'0', '9'};
static const uint32_t R_NOT_DIGIT[] = {0, '0' - 1, '9' + 1, 0x65f};
static const uint32_t R_WORD[] = {'0', '9', 'A', 'Z', '_', '_', 'a', 'z'};
static const uint32_t R_NOT_WORD[] = {0, '0' - 1, '9' + 1, 'A' - 1, 'Z' + 1, '_' - 1, '`', '`', '{', 0x7f};
static const uint32_t R_SPACE[] = {'\t', '\r', ' ', ' ', 0xa0, 0xa0, 0x1680, 0x1680, 0x2000, 0x200a,
                                   0x2028, 0x2029, 0x202f, 0x202f, 0x205f, 0x205f, 0x3000, 0x3000};
static const uint32_t R_ANY_SPACE[] = {'\t', '\r', 0x1c, ' ', 0x85, 0x85, 0xa0, 0xa0, 0x1680, 0x1680, 0x2000, 0x200a,
                                       0x2028, 0x2029, 0x202f, 0x202f, 0x205f, 0x205f, 0x3000, 0x3000, 0xfeff, 0xfeff};

static int hexv(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* An escape after '\\': a class (\d …) into `set` (returns 2), or one
 * character into *cp (returns 1); 0 on error. */
static int read_escape(rp *r, const char *at, uint32_t *cp, rset *set) {
    if (r->p >= r->end) return rfail(r, at, "unfinished escape"), 0;
    char c = *r->p++;
    switch (c) {
    case 'd': rs_add(set, R_DIGIT[0], R_DIGIT[1]); return 2;
    case 'D': for (int i = 0; i < 2; i++) rs_add(set, R_NOT_DIGIT[2 * i], R_NOT_DIGIT[2 * i + 1]); return 2;
    case 'w': for (int i = 0; i < 4; i++) rs_add(set, R_WORD[2 * i], R_WORD[2 * i + 1]); return 2;
    case 'W': for (int i = 0; i < 5; i++) rs_add(set, R_NOT_WORD[2 * i], R_NOT_WORD[2 * i + 1]); return 2;
    case 's': for (int i = 0; i < 9; i++) rs_add(set, R_SPACE[2 * i], R_SPACE[2 * i + 1]); return 2;
    case 'S': rs_add_not(set, R_ANY_SPACE, 11); return 2;
    case 'n': *cp = '\n'; return 1;
    case 'r': *cp = '\r'; return 1;
    case 't': *cp = '\t'; return 1;
    case 'f': *cp = '\f'; return 1;
    case 'v': *cp = '\v'; return 1;
    case '0': *cp = 0; return 1;
    case 'b': case 'B': return rfail(r, at, "word boundaries (\\%c) are not supported", c), 0;
    case 'x': case 'u': {
        uint32_t v = 0;
        int nh = c == 'x' ? 2 : 4;
        if (c == 'u' && r->p < r->end && *r->p == '{') {
            r->p++;
            int k = 0;
            while (r->p < r->end && *r->p != '}' && k < 7) {
                int h = hexv(*r->p);
                if (h < 0) break;
                v = v * 16 + (uint32_t)h, r->p++, k++;
            }
            if (r->p >= r->end || *r->p != '}' || k == 0) return rfail(r, at, "bad \\u{...} escape"), 0;
            r->p++;
        } else {
            for (int i = 0; i < nh; i++) {
                int h = r->p < r->end ? hexv(*r->p) : -1;
                if (h < 0) return rfail(r, at, "escape \\%c needs %d hex digits", c, nh), 0;
                v = v * 16 + (uint32_t)h, r->p++;
            }
        }
        if (v > 0x10ffff) return rfail(r, at, "escape beyond U+10FFFF"), 0;
        *cp = v;
        return 1;
    }
    default:
        if (c >= '1' && c <= '9') return rfail(r, at, "backreferences are not supported"), 0;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return rfail(r, at, "unknown escape \\%c", c), 0;
        *cp = (uint8_t)c;
        if ((uint8_t)c >= 0x80) {
            r->p--;
            int n = cg_utf8_get((const uint8_t *)r->p, (size_t)(r->end - r->p), cp);
            if (!n) return rfail(r, at, "invalid UTF-8"), 0;
            r->p += n;
        }
        return 1;
    }
}

/* One character as a literal: in a JSON string, '"', '\\' and control
 * characters take their escaped form. */
static cg_ast *lit_ast(rp *r, uint32_t cp) {
    uint8_t buf[8];
    if (r->json && (cp == '"' || cp == '\\' || cp < 0x20)) {
        static const char hx[] = "0123456789abcdef";
        const char *e = cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : cp == '\n' ? "\\n" : cp == '\t' ? "\\t" : cp == '\r' ? "\\r" : NULL;
        if (e) return ast_str(r->b, e);
        char u[7] = {'\\', 'u', '0', '0', hx[cp >> 4], hx[cp & 15], 0};
        return ast_str(r->b, u);
    }
    return ast_bytes(r->b, buf, (size_t)cg_utf8_put(buf, cp));
}

/* A class of characters (pairs); in a JSON string without the characters
 * that would need escapes there. */
static cg_ast *class_ast(rp *r, const uint32_t *ranges, int n, bool neg) {
    if (!r->json) return ast_class(r->b, ranges, n, neg);
    uint32_t *c = xmalloc(((size_t)n + 2) * 2 * sizeof *c);
    memcpy(c, ranges, (size_t)n * 2 * sizeof *c);
    n = cg_ranges_normalize(c, n);
    rset pos = {0};
    if (neg) rs_add_not(&pos, c, n);
    else
        for (int i = 0; i < n; i++) rs_add(&pos, c[2 * i], c[2 * i + 1]);
    free(c);
    static const uint32_t bad[] = {0, 0x1f, '"', '"', '\\', '\\'};
    rset out = {0};
    for (int i = 0; i < pos.n; i++) {
        uint32_t lo = pos.r[2 * i], hi = pos.r[2 * i + 1];
        for (int k = 0; k < 3 && lo <= hi; k++) { /* bad is sorted: cut each piece away */
            if (bad[2 * k + 1] < lo || bad[2 * k] > hi) continue;
            if (bad[2 * k] > lo) rs_add(&out, lo, bad[2 * k] - 1);
            lo = bad[2 * k + 1] + 1;
        }
        if (lo <= hi) rs_add(&out, lo, hi);
    }
    free(pos.r);
    if (out.n == 0) {
        free(out.r);
        return rfail(r, r->p, "a class that holds only characters a JSON string must escape is not supported");
    }
    cg_ast *a = ast_class(r->b, out.r, out.n, false);
    free(out.r);
    return a;
}

static int read_lit(rp *r, uint32_t *cp) {
    int n = cg_utf8_get((const uint8_t *)r->p, (size_t)(r->end - r->p), cp);
    if (!n) return rfail(r, r->p, "invalid UTF-8"), 0;
    r->p += n;
    return 1;
}

static cg_ast *re_alts(rp *r);

static cg_ast *re_class(rp *r) {
    const char *at = r->p++;
    bool neg = false;
    if (r->p < r->end && *r->p == '^') neg = true, r->p++;
    rset s = {0};
    while (r->p < r->end && *r->p != ']') {
        uint32_t lo;
        const char *iat = r->p;
        int k;
        if (*r->p == '\\') {
            r->p++;
            k = read_escape(r, iat, &lo, &s);
            if (!k) return free(s.r), NULL;
            if (k == 2) continue;
        } else if (!read_lit(r, &lo)) return free(s.r), NULL;
        uint32_t hi = lo;
        if (r->end - r->p >= 2 && r->p[0] == '-' && r->p[1] != ']') {
            r->p++;
            const char *hat = r->p;
            if (*r->p == '\\') {
                r->p++;
                rset tmp = {0};
                k = read_escape(r, hat, &hi, &tmp);
                free(tmp.r);
                if (!k) return free(s.r), NULL;
                if (k == 2) return free(s.r), rfail(r, hat, "a class escape cannot end a range");
            } else if (!read_lit(r, &hi)) return free(s.r), NULL;
            if (hi < lo) return free(s.r), rfail(r, iat, "class range out of order");
        }
        rs_add(&s, lo, hi);
    }
    if (r->p >= r->end) return free(s.r), rfail(r, at, "unterminated character class");
    r->p++;
    if (s.n == 0 && !neg) return free(s.r), rfail(r, at, "empty class [] matches nothing");
    cg_ast *a = class_ast(r, s.r ? s.r : (uint32_t[2]){0, 0}, s.n, neg);
    free(s.r);
    return a;
}

static cg_ast *re_atom(rp *r) {
    const char *at = r->p;
    char c = *r->p;
    cg_builder *b = r->b;
    if (c == '(') {
        r->p++;
        if (++r->depth > 200) return rfail(r, at, "groups nested too deeply");
        if (r->p < r->end && *r->p == '?') {
            if (r->end - r->p >= 2 && r->p[1] == ':') r->p += 2;
            else if (r->end - r->p >= 3 && r->p[1] == '<' && r->p[2] != '=' && r->p[2] != '!') {
                r->p += 2;
                while (r->p < r->end && *r->p != '>') r->p++;
                if (r->p >= r->end) return rfail(r, at, "unterminated group name");
                r->p++;
            } else return rfail(r, at, "lookaround and other (?...) groups are not supported");
        }
        cg_ast *a = re_alts(r);
        if (!a) return NULL;
        if (r->p >= r->end || *r->p != ')') return rfail(r, at, "unclosed '('");
        r->p++;
        r->depth--;
        return a;
    }
    if (c == '[') return re_class(r);
    if (c == '.') {
        r->p++;
        uint32_t nl[] = {'\n', '\n', '\r', '\r', 0x2028, 0x2029};
        return class_ast(r, nl, 3, true);
    }
    if (c == '\\') {
        r->p++;
        rset s = {0};
        uint32_t cp;
        int k = read_escape(r, at, &cp, &s);
        cg_ast *a = NULL;
        if (k == 2) a = class_ast(r, s.r, s.n, false);
        else if (k == 1) a = lit_ast(r, cp);
        free(s.r);
        return a;
    }
    if (c == '{') { /* a literal '{' unless it reads as a quantifier (ECMAScript annex B) */
        const char *q = r->p + 1;
        while (q < r->end && ((*q >= '0' && *q <= '9') || *q == ',')) q++;
        if (q > r->p + 1 && q < r->end && *q == '}') return rfail(r, at, "quantifier with nothing to repeat");
        r->p++;
        return ast_str(b, "{");
    }
    if (c == '*' || c == '+' || c == '?') return rfail(r, at, "quantifier '%c' with nothing to repeat", c);
    if (c == '^' || c == '$') return rfail(r, at, "anchor '%c' inside the pattern is not supported", c);
    uint32_t cp;
    if (!read_lit(r, &cp)) return NULL;
    return lit_ast(r, cp);
}

static int rd_int(rp *r, int *v) {
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return 0;
    long x = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        x = x * 10 + (*r->p++ - '0');
        if (x > CG_MAX_REPEAT) x = CG_MAX_REPEAT + 1;
    }
    *v = (int)x;
    return 1;
}

static cg_ast *re_seq(rp *r) {
    cg_astv v = {0};
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        if (*r->p == '$' && r->p + 1 == r->end && r->depth == 0) {
            r->p++;
            break;
        }
        cg_ast *a = re_atom(r);
        if (!a) return astv_free(&v), NULL;
        for (;;) {
            const char *at = r->p;
            if (r->p >= r->end) break;
            char c = *r->p;
            int lo, hi;
            if (c == '*') r->p++, lo = 0, hi = -1;
            else if (c == '+') r->p++, lo = 1, hi = -1;
            else if (c == '?') r->p++, lo = 0, hi = 1;
            else if (c == '{') {
                const char *save = r->p++;
                if (!rd_int(r, &lo)) { /* a literal '{' in ECMAScript's annex B */
                    r->p = save;
                    break;
                }
                hi = lo;
                if (r->p < r->end && *r->p == ',') {
                    r->p++;
                    if (!rd_int(r, &hi)) hi = -1;
                }
                if (r->p >= r->end || *r->p != '}') return astv_free(&v), rfail(r, at, "unclosed '{'");
                r->p++;
                if (lo > CG_MAX_REPEAT || hi > CG_MAX_REPEAT)
                    return astv_free(&v), rfail(r, at, "repetition bound above %d", CG_MAX_REPEAT);
                if (hi >= 0 && hi < lo) return astv_free(&v), rfail(r, at, "repetition {%d,%d} out of order", lo, hi);
            } else break;
            if (r->p < r->end && *r->p == '?') r->p++; /* lazy */
            a = ast_rep(r->b, a, lo, hi);
            if (!a) return astv_free(&v), NULL;
        }
        astv_push(&v, a);
    }
    cg_ast *res = ast_seq(r->b, v.v, v.n);
    astv_free(&v);
    return res;
}

static cg_ast *re_alts(rp *r) {
    cg_astv v = {0};
    for (;;) {
        cg_ast *a = re_seq(r);
        if (!a) return astv_free(&v), NULL;
        astv_push(&v, a);
        if (r->p < r->end && *r->p == '|') {
            r->p++;
            continue;
        }
        break;
    }
    cg_ast *res = ast_alt(r->b, v.v, v.n);
    astv_free(&v);
    return res;
}

cg_ast *cg_regex_ast(cg_builder *b, const char *re, size_t len, const char *where, bool json) {
    rp r = {b, re, re, re + len, where ? where : "", 0, json};
    if (r.p < r.end && *r.p == '^') r.p++;
    cg_ast *a = re_alts(&r);
    if (!a) return NULL;
    if (r.p < r.end) return rfail(&r, r.p, "unmatched ')'");
    return a;
}

lilac_grammar *lilac_grammar_from_regex(const char *re, size_t len, lilac_err *err) {
    cg_builder b;
    cgb_init(&b, err);
    int root = cgb_rule(&b, "root");
    cgb_define(&b, root, cg_regex_ast(&b, re, len, "", false));
    lilac_grammar *g = b.failed ? NULL : cg_compile(&b, root);
    cgb_free(&b);
    return g;
}
