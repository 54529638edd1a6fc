/* schema.c — JSON Schema to grammar: the subset OpenAI structured outputs and
 * agent frameworks use. type (one or a list), object (properties, required,
 * additionalProperties), array (items, prefixItems, minItems, maxItems),
 * string (enum, const, pattern, minLength, maxLength, format date/time/
 * date-time/uuid), number and integer (minimum, maximum, exclusive bounds),
 * boolean, null, anyOf, oneOf (as anyOf), allOf of one schema, $ref to any
 * JSON pointer inside the document ($defs, definitions, "#"), true/{} (any
 * value). `{"type":"object"}` alone is any JSON object. OpenAPI's `nullable` is
 * an annotation, as JSON Schema validators treat it.
 *
 * The grammar yields a subset of the valid documents: properties come in the
 * schema's order; extra properties only where additionalProperties says so;
 * numbers have at most 16 integer and 16 fraction digits. Keywords that would
 * need more than a context-free grammar (uniqueItems, multipleOf, not, if/
 * then/else, min/maxProperties, patternProperties …) are refused, naming the
 * keyword and its JSON path, and so are constraints beside $ref, anyOf, oneOf,
 * allOf, enum or const (not merged; `type` beside enum/const filters the
 * values). Whitespace between tokens is bounded. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>

#include "cg_internal.h"

typedef struct {
    int rule;
    char *ref;
} refmap;

typedef struct {
    cg_builder *b;
    json_t *doc;
    int max_ws;
    int r_ws, r_str, r_num, r_int, r_val, r_obj, r_arr, r_char;
    refmap *refs;
    int n_refs, cap_refs;
    char path[1024];
    size_t plen;
    int depth;
    char label[32]; /* which schema of several, for messages */
} sc;

static void *sfail(sc *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void *sfail(sc *s, const char *fmt, ...) {
    char m[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return cgb_fail(s->b, "schema%s %s: %s", s->label, s->path, m);
}

static size_t path_push(sc *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static size_t path_push(sc *s, const char *fmt, ...) {
    size_t old = s->plen;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(s->path + s->plen, sizeof s->path - s->plen, fmt, ap);
    va_end(ap);
    if (n > 0) s->plen += (size_t)n;
    if (s->plen >= sizeof s->path) s->plen = sizeof s->path - 1;
    return old;
}
static void path_pop(sc *s, size_t old) {
    s->plen = old;
    s->path[old] = 0;
}

/* ---- Shared rules --------------------------------------------------------------- */

static cg_ast *ws(sc *s) {
    if (s->r_ws < 0) {
        s->r_ws = cgb_rule(s->b, "ws");
        uint32_t r[] = {' ', ' ', '\t', '\n', '\r', '\r'};
        cgb_define(s->b, s->r_ws, ast_rep(s->b, ast_class(s->b, r, 3, false), 0, s->max_ws));
    }
    return ast_ref(s->b, s->r_ws);
}

static cg_ast *hex(cg_builder *b) {
    uint32_t r[] = {'0', '9', 'a', 'f', 'A', 'F'};
    return ast_class(b, r, 3, false);
}

/* One JSON string character: unescaped (no control characters) or an escape
 * (\uXXXX outside the surrogates, so each escape is one character). */
static cg_ast *str_char(sc *s) {
    if (s->r_char < 0) {
        cg_builder *b = s->b;
        s->r_char = cgb_rule(b, "char");
        uint32_t plain[] = {0, 0x1f, '"', '"', '\\', '\\'};
        uint32_t esc[] = {'"', '"', '\\', '\\', '/', '/', 'b', 'b', 'f', 'f', 'n', 'n', 'r', 'r', 't', 't'};
        uint32_t h1[] = {'0', '9', 'a', 'c', 'A', 'C', 'e', 'f', 'E', 'F'};
        uint32_t dd[] = {'d', 'd', 'D', 'D'};
        cg_ast *u = ast_seq2(b, ast_str(b, "u"),
                             ast_alt2(b, ast_seq2(b, ast_class(b, h1, 5, false), ast_rep(b, hex(b), 3, 3)),
                                      ast_seq3(b, ast_class(b, dd, 2, false), ast_range(b, '0', '7'),
                                               ast_rep(b, hex(b), 2, 2))));
        cg_ast *e = ast_seq2(b, ast_str(b, "\\"), ast_alt2(b, ast_class(b, esc, 8, false), u));
        cgb_define(b, s->r_char, ast_alt2(b, ast_class(b, plain, 3, true), e));
    }
    return ast_ref(s->b, s->r_char);
}

static cg_ast *str_any(sc *s) {
    if (s->r_str < 0) {
        s->r_str = cgb_rule(s->b, "string");
        cgb_define(s->b, s->r_str, ast_seq3(s->b, ast_str(s->b, "\""), ast_rep(s->b, str_char(s), 0, -1), ast_str(s->b, "\"")));
    }
    return ast_ref(s->b, s->r_str);
}

static cg_ast *digits(cg_builder *b, int lo, int hi) { return ast_rep(b, ast_range(b, '0', '9'), lo, hi); }

static cg_ast *int_any(sc *s) {
    if (s->r_int < 0) {
        cg_builder *b = s->b;
        s->r_int = cgb_rule(b, "integer");
        cg_ast *mag = ast_alt2(b, ast_str(b, "0"), ast_seq2(b, ast_range(b, '1', '9'), digits(b, 0, 15)));
        cgb_define(b, s->r_int, ast_seq2(b, ast_rep(b, ast_str(b, "-"), 0, 1), mag));
    }
    return ast_ref(s->b, s->r_int);
}

static cg_ast *num_any(sc *s) {
    if (s->r_num < 0) {
        cg_builder *b = s->b;
        s->r_num = cgb_rule(b, "number");
        uint32_t e[] = {'e', 'e', 'E', 'E'}, pm[] = {'+', '+', '-', '-'};
        cg_ast *frac = ast_rep(b, ast_seq2(b, ast_str(b, "."), digits(b, 1, 16)), 0, 1);
        cg_ast *exp = ast_rep(b, ast_seq3(b, ast_class(b, e, 2, false), ast_rep(b, ast_class(b, pm, 2, false), 0, 1), digits(b, 1, 3)), 0, 1);
        cgb_define(b, s->r_num, ast_seq3(b, int_any(s), frac, exp));
    }
    return ast_ref(s->b, s->r_num);
}

static cg_ast *value_any(sc *s);

static cg_ast *obj_any(sc *s) {
    if (s->r_obj < 0) {
        cg_builder *b = s->b;
        s->r_obj = cgb_rule(b, "object");
        cg_ast *kv = ast_seq(b, (cg_ast *[]){str_any(s), ws(s), ast_str(b, ":"), ws(s), value_any(s)}, 5);
        cg_ast *more = ast_rep(b, ast_seq(b, (cg_ast *[]){ws(s), ast_str(b, ","), ws(s), kv}, 4), 0, -1);
        cg_ast *body = ast_rep(b, ast_seq2(b, kv, more), 0, 1);
        cgb_define(b, s->r_obj, ast_seq(b, (cg_ast *[]){ast_str(b, "{"), ws(s), body, ws(s), ast_str(b, "}")}, 5));
    }
    return ast_ref(s->b, s->r_obj);
}

static cg_ast *arr_any(sc *s) {
    if (s->r_arr < 0) {
        cg_builder *b = s->b;
        s->r_arr = cgb_rule(b, "array");
        cg_ast *more = ast_rep(b, ast_seq(b, (cg_ast *[]){ws(s), ast_str(b, ","), ws(s), value_any(s)}, 4), 0, -1);
        cg_ast *body = ast_rep(b, ast_seq2(b, value_any(s), more), 0, 1);
        cgb_define(b, s->r_arr, ast_seq(b, (cg_ast *[]){ast_str(b, "["), ws(s), body, ws(s), ast_str(b, "]")}, 5));
    }
    return ast_ref(s->b, s->r_arr);
}

static cg_ast *value_any(sc *s) {
    if (s->r_val < 0) {
        cg_builder *b = s->b;
        s->r_val = cgb_rule(b, "value");
        cg_ast *alts[] = {obj_any(s), arr_any(s), str_any(s), num_any(s), ast_str(b, "true"), ast_str(b, "false"),
                          ast_str(b, "null")};
        cgb_define(b, s->r_val, ast_alt(b, alts, 7));
    }
    return ast_ref(s->b, s->r_val);
}

/* ---- Literals: enum, const, choices ----------------------------------------------- */

static int cmp_cg_bstr(const void *x, const void *y) {
    const cg_bstr *a = x, *b = y;
    size_t l = a->n < b->n ? a->n : b->n;
    int c = memcmp(a->p, b->p, l);
    return c ? c : (a->n > b->n) - (a->n < b->n);
}

/* Alternation of sorted strings as a trie: one live branch per prefix. */
static cg_ast *trie_rec(cg_builder *b, cg_bstr *v, size_t n, size_t d) {
    cg_astv alts = {0};
    size_t i = 0;
    if (i < n && v[i].n == d) { /* the string ending here */
        astv_push(&alts, ast_empty(b));
        while (i < n && v[i].n == d) i++;
    }
    while (i < n && !b->failed) {
        size_t j = i;
        while (j < n && v[j].p[d] == v[i].p[d]) j++;
        /* a shared run of bytes */
        size_t e = d + 1;
        for (;;) {
            bool same = v[i].n > e;
            for (size_t k = i; k < j && same; k++) same = v[k].n > e && v[k].p[e] == v[i].p[e];
            if (!same) break;
            e++;
        }
        astv_push(&alts, ast_seq2(b, ast_bytes(b, v[i].p + d, e - d), trie_rec(b, v + i, j - i, e)));
        i = j;
    }
    cg_ast *r = ast_alt(b, alts.v, alts.n);
    astv_free(&alts);
    return r;
}

cg_ast *cg_trie_ast(cg_builder *b, cg_bstr *v, size_t n) {
    if (n == 0) return cgb_fail(b, "empty list of choices");
    qsort(v, n, sizeof *v, cmp_cg_bstr);
    return trie_rec(b, v, n, 0);
}

enum { MAX_ENUM = 20000 };

static char *dump_json(json_t *v) {
    return json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
}

static cg_ast *enum_ast(sc *s, json_t *arr) {
    if (!json_is_array(arr)) return sfail(s, "'enum' must be an array");
    size_t n = json_array_size(arr);
    if (n == 0) return sfail(s, "'enum' is empty: nothing can match");
    if (n > MAX_ENUM) return sfail(s, "'enum' has %zu values (at most %d)", n, MAX_ENUM);
    cg_bstr *v = xmalloc(n * sizeof *v);
    char **owned = xmalloc(n * sizeof *owned);
    for (size_t i = 0; i < n; i++) {
        owned[i] = dump_json(json_array_get(arr, i));
        v[i].p = (const uint8_t *)(owned[i] ? owned[i] : "null");
        v[i].n = strlen((const char *)v[i].p);
    }
    cg_ast *a = cg_trie_ast(s->b, v, n);
    for (size_t i = 0; i < n; i++) free(owned[i]);
    free(owned);
    free(v);
    return a;
}

/* ---- Numbers in a range ------------------------------------------------------------- */

#define NUM_CAP 999999999999999LL /* 15 digits: bounds beyond it are clamped */

static long long p10(int k) {
    long long p = 1;
    while (k-- > 0) p *= 10;
    return p;
}
static int ndig(long long x) {
    int d = 1;
    while (x >= 10) x /= 10, d++;
    return d;
}

/* Fixed-width decimal strings (leading zeros allowed) of the values lo..hi. */
static cg_ast *range_w(cg_builder *b, long long lo, long long hi, int w) {
    if (w == 0) return ast_empty(b);
    long long p = p10(w - 1), a = lo / p, z = hi / p, lr = lo % p, hr = hi % p;
    if (a == z) return ast_seq2(b, ast_range(b, (uint32_t)('0' + a), (uint32_t)('0' + a)), range_w(b, lr, hr, w - 1));
    if (lr == 0 && hr == p - 1)
        return ast_seq2(b, ast_range(b, (uint32_t)('0' + a), (uint32_t)('0' + z)), digits(b, w - 1, w - 1));
    cg_astv v = {0};
    long long a2 = a, z2 = z;
    if (lr != 0) {
        astv_push(&v, ast_seq2(b, ast_range(b, (uint32_t)('0' + a), (uint32_t)('0' + a)), range_w(b, lr, p - 1, w - 1)));
        a2 = a + 1;
    }
    if (hr != p - 1) {
        astv_push(&v, ast_seq2(b, ast_range(b, (uint32_t)('0' + z), (uint32_t)('0' + z)), range_w(b, 0, hr, w - 1)));
        z2 = z - 1;
    }
    if (a2 <= z2) astv_push(&v, ast_seq2(b, ast_range(b, (uint32_t)('0' + a2), (uint32_t)('0' + z2)), digits(b, w - 1, w - 1)));
    cg_ast *r = ast_alt(b, v.v, v.n);
    astv_free(&v);
    return r;
}

/* Non-negative integers lo..hi without leading zeros. */
static cg_ast *range_nat(cg_builder *b, long long lo, long long hi) {
    cg_astv v = {0};
    for (int d = ndig(lo); d <= ndig(hi); d++) {
        long long l = d == 1 ? 0 : p10(d - 1), h = p10(d) - 1;
        if (l < lo) l = lo;
        if (h > hi) h = hi;
        if (l <= h) astv_push(&v, range_w(b, l, h, d));
    }
    cg_ast *r = v.n ? ast_alt(b, v.v, v.n) : NULL;
    astv_free(&v);
    return r;
}

/* Integers lo..hi (either may be past the cap: unbounded on that side). */
static cg_ast *range_int(cg_builder *b, long long lo, long long hi) {
    cg_astv v = {0};
    if (hi >= 0) astv_push(&v, range_nat(b, lo < 0 ? 0 : lo, hi));
    if (lo < 0) { /* -n for n in max(1, -hi)..-lo */
        long long nl = hi < 0 ? -hi : 1, nh = -lo;
        astv_push(&v, ast_seq2(b, ast_str(b, "-"), range_nat(b, nl, nh)));
    }
    cg_ast *r = v.n ? ast_alt(b, v.v, v.n) : NULL;
    astv_free(&v);
    return r;
}

static bool get_num(json_t *v, double *out) {
    if (!json_is_number(v)) return false;
    *out = json_number_value(v);
    return isfinite(*out);
}

/* Bounds of a number schema: [lo, hi] as doubles, with exclusivity. */
static int num_bounds(sc *s, json_t *schema, double *lo, bool *xlo, double *hi, bool *xhi) {
    *lo = -INFINITY, *hi = INFINITY, *xlo = *xhi = false;
    json_t *v;
    double d;
    if ((v = json_object_get(schema, "minimum"))) {
        if (!get_num(v, &d)) return sfail(s, "'minimum' must be a number"), -1;
        *lo = d;
    }
    if ((v = json_object_get(schema, "maximum"))) {
        if (!get_num(v, &d)) return sfail(s, "'maximum' must be a number"), -1;
        *hi = d;
    }
    if ((v = json_object_get(schema, "exclusiveMinimum"))) {
        if (json_is_boolean(v)) *xlo = json_is_true(v); /* draft 4 */
        else if (get_num(v, &d)) {
            if (d >= *lo) *lo = d, *xlo = true;
        } else return sfail(s, "'exclusiveMinimum' must be a number"), -1;
    }
    if ((v = json_object_get(schema, "exclusiveMaximum"))) {
        if (json_is_boolean(v)) *xhi = json_is_true(v);
        else if (get_num(v, &d)) {
            if (d <= *hi) *hi = d, *xhi = true;
        } else return sfail(s, "'exclusiveMaximum' must be a number"), -1;
    }
    return 0;
}

static long long clampll(double x) {
    if (x < -(double)NUM_CAP) return -NUM_CAP - 1;
    if (x > (double)NUM_CAP) return NUM_CAP + 1;
    return (long long)x;
}

/* Integer bounds: the smallest and largest integers allowed. */
static void int_bounds(double lo, bool xlo, double hi, bool xhi, long long *ilo, long long *ihi) {
    double l = isinf(lo) ? -1e300 : (xlo ? floor(lo) + 1 : ceil(lo));
    double h = isinf(hi) ? 1e300 : (xhi ? ceil(hi) - 1 : floor(hi));
    *ilo = clampll(l);
    *ihi = clampll(h);
}

static cg_ast *number_ast(sc *s, json_t *schema, bool integer) {
    cg_builder *b = s->b;
    if (json_object_get(schema, "multipleOf")) {
        size_t o = path_push(s, ".multipleOf");
        sfail(s, "'multipleOf' is not supported");
        path_pop(s, o);
        return NULL;
    }
    double lo, hi;
    bool xlo, xhi;
    if (num_bounds(s, schema, &lo, &xlo, &hi, &xhi)) return NULL;
    if (isinf(lo) && isinf(hi)) return integer ? int_any(s) : num_any(s);
    long long ilo, ihi;
    int_bounds(lo, xlo, hi, xhi, &ilo, &ihi);
    /* beyond the cap the side is open: numbers of up to 16 digits */
    long long rlo = ilo < -NUM_CAP ? -NUM_CAP * 10 - 9 : ilo, rhi = ihi > NUM_CAP ? NUM_CAP * 10 + 9 : ihi;
    cg_astv v = {0};
    if (rlo <= rhi) astv_push(&v, range_int(b, rlo, rhi));
    if (!integer) {
        /* x.f (x >= 0) lies in [x, x+1); -n.f lies in (-(n+1), -n] */
        const double big = (double)(NUM_CAP * 10 + 9);
        cg_ast *frac = ast_seq2(b, ast_str(b, "."), digits(b, 1, 16));
        double plo = isinf(lo) ? 0 : (xlo ? floor(lo) + 1 : ceil(lo)), phi = isinf(hi) ? big : floor(hi) - 1;
        if (plo < 0) plo = 0;
        if (phi > big) phi = big;
        if (plo <= phi) astv_push(&v, ast_seq2(b, range_nat(b, (long long)plo, (long long)phi), frac));
        if (!isinf(lo) && xlo && lo >= 0 && lo == floor(lo) && lo < (double)NUM_CAP && lo + 1 <= hi) {
            /* lo itself with a fraction that is not zero */
            cg_ast *nz = ast_seq3(b, ast_str(b, "."), digits(b, 0, 15), ast_range(b, '1', '9'));
            astv_push(&v, ast_seq2(b, range_nat(b, (long long)lo, (long long)lo), nz));
        }
        double nlo = isinf(hi) ? 0 : (xhi ? floor(-hi) + 1 : ceil(-hi)), nhi = isinf(lo) ? big : floor(-lo) - 1;
        if (nlo < 0) nlo = 0;
        if (nhi > big) nhi = big;
        if (nlo <= nhi) astv_push(&v, ast_seq3(b, ast_str(b, "-"), range_nat(b, (long long)nlo, (long long)nhi), frac));
    }
    if (!integer) { /* the bounds themselves, when included and written exactly */
        double e[2] = {lo, hi};
        bool x[2] = {xlo, xhi};
        for (int k = 0; k < 2; k++) {
            char buf[40];
            if (isinf(e[k]) || x[k] || e[k] == floor(e[k])) continue;
            snprintf(buf, sizeof buf, "%.15g", e[k]);
            if (atof(buf) == e[k] && !strchr(buf, 'e')) astv_push(&v, ast_str(b, buf));
        }
    }
    if (v.n == 0) {
        astv_free(&v);
        return sfail(s, "no %s lies within the bounds", integer ? "integer" : "number");
    }
    cg_ast *r = ast_alt(b, v.v, v.n);
    astv_free(&v);
    return r;
}

/* ---- Strings -------------------------------------------------------------------------- */

static cg_ast *string_ast(sc *s, json_t *schema) {
    cg_builder *b = s->b;
    json_t *pat = json_object_get(schema, "pattern"), *fmt = json_object_get(schema, "format");
    json_t *mnl = json_object_get(schema, "minLength"), *mxl = json_object_get(schema, "maxLength");
    if (pat) {
        size_t o = path_push(s, ".pattern");
        if (!json_is_string(pat)) return sfail(s, "'pattern' must be a string");
        if (mnl || mxl) return sfail(s, "'pattern' together with minLength/maxLength is not supported");
        char where[1100];
        snprintf(where, sizeof where, "schema %s: ", s->path);
        cg_ast *re = cg_regex_ast(b, json_string_value(pat), json_string_length(pat), where, true);
        path_pop(s, o);
        if (!re) return NULL;
        return ast_seq3(b, ast_str(b, "\""), re, ast_str(b, "\""));
    }
    if (fmt && json_is_string(fmt) && !mnl && !mxl) {
        const char *f = json_string_value(fmt), *re = NULL;
        if (!strcmp(f, "date")) re = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
        else if (!strcmp(f, "time")) re = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
        else if (!strcmp(f, "date-time"))
            re = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
        else if (!strcmp(f, "uuid")) re = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
        if (re) {
            cg_ast *a = cg_regex_ast(b, re, strlen(re), "", true);
            return ast_seq3(b, ast_str(b, "\""), a, ast_str(b, "\""));
        }
    }
    if (mnl || mxl) {
        long long lo = 0, hi = -1;
        if (mnl) {
            size_t o = path_push(s, ".minLength");
            if (!json_is_integer(mnl) || json_integer_value(mnl) < 0) return sfail(s, "must be a non-negative integer");
            lo = json_integer_value(mnl);
            path_pop(s, o);
        }
        if (mxl) {
            size_t o = path_push(s, ".maxLength");
            if (!json_is_integer(mxl) || json_integer_value(mxl) < 0) return sfail(s, "must be a non-negative integer");
            hi = json_integer_value(mxl);
            path_pop(s, o);
        }
        if (lo > CG_MAX_REPEAT || hi > CG_MAX_REPEAT) return sfail(s, "string length bound above %d", CG_MAX_REPEAT);
        if (hi >= 0 && hi < lo) return sfail(s, "maxLength below minLength");
        return ast_seq3(b, ast_str(b, "\""), ast_rep(b, str_char(s), (int)lo, (int)hi), ast_str(b, "\""));
    }
    return str_any(s);
}

/* ---- Objects --------------------------------------------------------------------------- */

/* A JSON string (with its quotes) that differs from every key in `keys`
 * (sorted, JSON-encoded with their quotes), as a byte trie over the keys: at
 * each node, go on along a key, or leave the trie with a character no key
 * continues with (then any rest), or close the string unless that makes a key.
 * NULL (without failing) when nothing can follow. After a backslash or inside
 * a multi-byte character only the trie's own bytes go on. */
static cg_ast *key_not_in(sc *s, cg_bstr *keys, size_t n, size_t d) {
    cg_builder *b = s->b;
    cg_astv alts = {0};
    size_t i = 0;
    while (i < n && keys[i].n == d) i++; /* a key ends here: this text is taken */
    int cont = 0;
    for (size_t k = 1; k < d; k++) { /* inside a multi-byte character? */
        uint8_t c = keys[0].p[k];
        if (cont) cont--;
        else cont = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
    }
    bool after_bs = d > 1 && keys[0].p[d - 1] == '\\';
    uint32_t *ex = xmalloc((n + 4) * 2 * sizeof *ex);
    int nex = 0;
    bool quote_child = false;
    while (i < n && !b->failed) {
        size_t j = i;
        uint8_t c = keys[i].p[d];
        while (j < n && keys[j].p[d] == c) j++;
        cg_ast *rest = key_not_in(s, keys + i, j - i, d + 1);
        if (rest) astv_push(&alts, ast_seq2(b, ast_bytes(b, &c, 1), rest));
        quote_child |= c == '"';
        if (c < 0x80) ex[2 * nex] = ex[2 * nex + 1] = c, nex++;
        else if (c >= 0xc0) { /* every character led by this byte */
            uint32_t lo = c < 0xe0 ? (uint32_t)(c & 0x1f) << 6 : c < 0xf0 ? (uint32_t)(c & 0x0f) << 12 : (uint32_t)(c & 0x07) << 18;
            uint32_t span = c < 0xe0 ? 0x3f : c < 0xf0 ? 0xfff : 0x3ffff;
            ex[2 * nex] = lo, ex[2 * nex + 1] = lo + span, nex++;
        }
        i = j;
    }
    if (d > 0 && !cont && !after_bs) {
        ex[2 * nex] = ex[2 * nex + 1] = '"', nex++;
        ex[2 * nex] = ex[2 * nex + 1] = '\\', nex++;
        ex[2 * nex] = 0, ex[2 * nex + 1] = 0x1f, nex++;
        astv_push(&alts, ast_seq3(b, ast_class(b, ex, nex, true), ast_rep(b, str_char(s), 0, -1), ast_str(b, "\"")));
        if (!quote_child) astv_push(&alts, ast_str(b, "\""));
    }
    free(ex);
    cg_ast *r = alts.n ? ast_alt(b, alts.v, alts.n) : NULL;
    astv_free(&alts);
    return r;
}

static cg_ast *schema_ast(sc *s, json_t *schema);

static cg_ast *object_ast(sc *s, json_t *schema) {
    cg_builder *b = s->b;
    json_t *props = json_object_get(schema, "properties"), *req = json_object_get(schema, "required");
    json_t *add = json_object_get(schema, "additionalProperties");
    static const char *const refused[] = {"patternProperties", "propertyNames", "minProperties", "maxProperties",
                                          "dependencies", "dependentRequired", "dependentSchemas",
                                          "unevaluatedProperties"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (json_object_get(schema, refused[i])) {
            size_t o = path_push(s, ".%s", refused[i]);
            sfail(s, "'%s' is not supported", refused[i]);
            path_pop(s, o);
            return NULL;
        }
    if (props && !json_is_object(props)) {
        size_t o = path_push(s, ".properties");
        sfail(s, "'properties' must be an object");
        path_pop(s, o);
        return NULL;
    }
    if (req && !json_is_array(req)) {
        size_t o = path_push(s, ".required");
        sfail(s, "'required' must be an array");
        path_pop(s, o);
        return NULL;
    }
    size_t np = props ? json_object_size(props) : 0;
    if (!props && (!add || json_is_true(add) || json_is_object(add)) && !req) {
        if (!add || json_is_true(add)) return obj_any(s);
    }
    /* required names must be properties (or extra properties allowed) */
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) {
            size_t o = path_push(s, ".required[%zu]", i);
            sfail(s, "must be a string");
            path_pop(s, o);
            return NULL;
        }
        if (!props || !json_object_get(props, json_string_value(r))) {
            size_t o = path_push(s, ".required[%zu]", i);
            sfail(s, "required property '%s' has no schema in 'properties'", json_string_value(r));
            path_pop(s, o);
            return NULL;
        }
    }
    /* key-value pieces in schema order */
    cg_ast **kv = xcalloc(np + 1, sizeof *kv);
    bool *isreq = xcalloc(np + 1, sizeof *isreq);
    cg_bstr *keys = xcalloc(np + 1, sizeof *keys);
    char **owned = xcalloc(np + 1, sizeof *owned);
    size_t k = 0;
    const char *name;
    json_t *ps;
    if (props) json_object_foreach(props, name, ps) {
        size_t o = path_push(s, ".properties.%s", name);
        json_t *js = json_string(name);
        owned[k] = dump_json(js);
        json_decref(js);
        keys[k].p = (const uint8_t *)owned[k];
        keys[k].n = strlen(owned[k]);
        cg_ast *v = schema_ast(s, ps);
        path_pop(s, o);
        kv[k] = ast_seq(b, (cg_ast *[]){ast_bytes(b, keys[k].p, keys[k].n), ws(s), ast_str(b, ":"), ws(s), v}, 5);
        for (size_t i = 0; req && i < json_array_size(req); i++)
            if (!strcmp(json_string_value(json_array_get(req, i)), name)) isreq[k] = true;
        k++;
    }
    cg_ast *extra = NULL; /* one extra key-value */
    if (add && !json_is_boolean(add) && !json_is_object(add)) {
        size_t o = path_push(s, ".additionalProperties");
        sfail(s, "must be a boolean or a schema");
        path_pop(s, o);
    } else if (add && !json_is_false(add) && !b->failed) {
        size_t o = path_push(s, ".additionalProperties");
        cg_ast *v = json_is_true(add) ? value_any(s) : schema_ast(s, add);
        path_pop(s, o);
        cg_ast *key;
        if (np) {
            qsort(keys, np, sizeof *keys, cmp_cg_bstr);
            key = key_not_in(s, keys, np, 0);
            if (!key && !b->failed) key = sfail(s, "no key is left for additional properties");
        } else key = str_any(s);
        int r = cgb_new_rule(b, "extra-kv");
        cgb_define(b, r, ast_seq(b, (cg_ast *[]){key, ws(s), ast_str(b, ":"), ws(s), v}, 5));
        extra = ast_ref(b, r);
    }
    cg_ast *res = NULL;
    if (!b->failed) {
        /* S[i]: the rest from property i when something came before (each
         * piece starts with a comma); F[i]: the same when nothing did. */
        cg_ast *sep = ast_seq3(b, ws(s), ast_str(b, ","), ws(s));
        int *S = xmalloc((np + 2) * sizeof *S), *F = xmalloc((np + 2) * sizeof *F);
        for (size_t i = 0; i <= np; i++) S[i] = cgb_new_rule(b, "obj-rest"), F[i] = cgb_new_rule(b, "obj-first");
        cg_ast *tail = extra ? ast_rep(b, ast_seq2(b, sep, extra), 0, -1) : ast_empty(b);
        cgb_define(b, S[np], tail);
        cgb_define(b, F[np], extra ? ast_rep(b, ast_seq2(b, extra, tail), 0, 1) : ast_empty(b));
        for (size_t i = np; i-- > 0;) {
            cg_ast *with = ast_seq3(b, sep, kv[i], ast_ref(b, S[i + 1]));
            cgb_define(b, S[i], isreq[i] ? with : ast_alt2(b, with, ast_ref(b, S[i + 1])));
            cg_ast *first = ast_seq2(b, kv[i], ast_ref(b, S[i + 1]));
            cgb_define(b, F[i], isreq[i] ? first : ast_alt2(b, first, ast_ref(b, F[i + 1])));
        }
        res = ast_seq(b, (cg_ast *[]){ast_str(b, "{"), ws(s), ast_ref(b, F[0]), ws(s), ast_str(b, "}")}, 5);
        free(S);
        free(F);
    }
    for (size_t i = 0; i < np; i++) free(owned[i]);
    free(owned), free(keys), free(kv), free(isreq);
    return res;
}

/* ---- Arrays -------------------------------------------------------------------------------- */

static cg_ast *array_ast(sc *s, json_t *schema) {
    cg_builder *b = s->b;
    static const char *const refused[] = {"uniqueItems", "contains", "minContains", "maxContains", "unevaluatedItems"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        json_t *v = json_object_get(schema, refused[i]);
        if (v && !(i == 0 && json_is_false(v))) {
            size_t o = path_push(s, ".%s", refused[i]);
            sfail(s, "'%s' is not supported", refused[i]);
            path_pop(s, o);
            return NULL;
        }
    }
    long long lo = 0, hi = -1;
    json_t *v;
    if ((v = json_object_get(schema, "minItems"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) return sfail(s, "'minItems' must be a non-negative integer");
        lo = json_integer_value(v);
    }
    if ((v = json_object_get(schema, "maxItems"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) return sfail(s, "'maxItems' must be a non-negative integer");
        hi = json_integer_value(v);
    }
    if (lo > CG_MAX_REPEAT || hi > CG_MAX_REPEAT) return sfail(s, "array length bound above %d", CG_MAX_REPEAT);
    if (hi >= 0 && hi < lo) return sfail(s, "maxItems below minItems");
    json_t *items = json_object_get(schema, "items"), *prefix = json_object_get(schema, "prefixItems");
    if (json_is_array(items)) prefix = items, items = json_object_get(schema, "additionalItems");
    cg_astv pre = {0};
    for (size_t i = 0; prefix && i < json_array_size(prefix); i++) {
        size_t o = path_push(s, ".prefixItems[%zu]", i);
        astv_push(&pre, schema_ast(s, json_array_get(prefix, i)));
        path_pop(s, o);
    }
    if (prefix && !json_is_array(prefix)) return astv_free(&pre), sfail(s, "'prefixItems' must be an array");
    cg_ast *item = NULL;
    if (!items || json_is_true(items)) item = value_any(s);
    else if (!json_is_false(items)) {
        size_t o = path_push(s, ".items");
        cg_ast *body = schema_ast(s, items);
        path_pop(s, o);
        int r = cgb_new_rule(b, "item");
        cgb_define(b, r, body);
        item = ast_ref(b, r);
    }
    if (b->failed) return astv_free(&pre), NULL;
    cg_ast *sep = ast_seq3(b, ws(s), ast_str(b, ","), ws(s));
    int np = pre.n;
    /* n items in all: the first np from prefixItems, the rest `item` */
    long long rest_lo = lo > np ? lo - np : 0, rest_hi = hi < 0 ? -1 : hi - np;
    if (!item) rest_hi = 0;
    if (rest_hi >= 0 && rest_hi < rest_lo) return astv_free(&pre), sfail(s, "no array length satisfies the bounds");
    /* a prefix may stop early when minItems allows: nested optional tail */
    cg_ast *rest = NULL; /* items after the prefix, each preceded by sep (if np>0) */
    if (rest_hi != 0) {
        cg_ast *more = ast_seq2(b, sep, item);
        if (np > 0) rest = ast_rep(b, more, (int)rest_lo, (int)rest_hi);
        else {
            long long mlo = rest_lo > 0 ? rest_lo - 1 : 0, mhi = rest_hi < 0 ? -1 : rest_hi - 1;
            rest = ast_seq2(b, item, ast_rep(b, more, (int)mlo, (int)mhi));
            if (rest_lo == 0) rest = ast_rep(b, rest, 0, 1);
        }
    } else rest = ast_empty(b);
    cg_ast *body = rest;
    for (int i = np; i-- > 0;) {
        cg_ast *piece = ast_seq2(b, i ? ast_seq2(b, sep, pre.v[i]) : pre.v[i], body);
        body = i >= lo ? ast_rep(b, piece, 0, 1) : piece;
    }
    astv_free(&pre);
    return ast_seq(b, (cg_ast *[]){ast_str(b, "["), ws(s), body, ws(s), ast_str(b, "]")}, 5);
}

/* ---- References ------------------------------------------------------------------------------ */

static json_t *resolve_pointer(json_t *doc, const char *ptr) {
    if (*ptr == 0) return doc;
    if (*ptr != '/') return NULL;
    json_t *cur = doc;
    char tok[512];
    while (*ptr == '/' && cur) {
        ptr++;
        size_t n = 0;
        while (*ptr && *ptr != '/' && n + 1 < sizeof tok) {
            if (ptr[0] == '~' && ptr[1] == '1') tok[n++] = '/', ptr += 2;
            else if (ptr[0] == '~' && ptr[1] == '0') tok[n++] = '~', ptr += 2;
            else if (ptr[0] == '%' && ptr[1] && ptr[2]) { /* percent-encoding of the URI fragment */
                char h[3] = {ptr[1], ptr[2], 0};
                tok[n++] = (char)strtol(h, NULL, 16), ptr += 3;
            } else tok[n++] = *ptr++;
        }
        tok[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) {
            char *e;
            long i = strtol(tok, &e, 10);
            cur = *e || i < 0 ? NULL : json_array_get(cur, (size_t)i);
        } else cur = NULL;
    }
    return cur;
}

static cg_ast *ref_ast(sc *s, json_t *ref) {
    size_t o = path_push(s, ".$ref");
    if (!json_is_string(ref)) return sfail(s, "must be a string");
    const char *r = json_string_value(ref);
    if (r[0] != '#') return sfail(s, "only references inside the schema ('#...') are supported, not '%s'", r);
    for (int i = 0; i < s->n_refs; i++)
        if (!strcmp(s->refs[i].ref, r)) return path_pop(s, o), ast_ref(s->b, s->refs[i].rule);
    json_t *target = resolve_pointer(s->doc, r + 1);
    if (!target) return sfail(s, "'%s' points to nothing in the schema", r);
    char base[96];
    const char *tail = strrchr(r, '/');
    snprintf(base, sizeof base, "ref-%.80s", tail ? tail + 1 : "root");
    int rule = cgb_new_rule(s->b, base);
    if (rule < 0) return NULL;
    if (s->n_refs == s->cap_refs) s->cap_refs = s->cap_refs ? 2 * s->cap_refs : 8, s->refs = xrealloc(s->refs, (size_t)s->cap_refs * sizeof *s->refs);
    s->refs[s->n_refs++] = (refmap){rule, xstrdup(r)};
    /* the body is compiled with the path of the target */
    char save[sizeof s->path];
    size_t save_len = s->plen;
    memcpy(save, s->path, sizeof save);
    s->plen = 0;
    s->path[0] = 0;
    path_push(s, "$%s", r + 1);
    for (char *p = s->path + 1; *p; p++)
        if (*p == '/') *p = '.';
    cg_ast *body = schema_ast(s, target);
    memcpy(s->path, save, sizeof save);
    s->plen = save_len;
    cgb_define(s->b, rule, body);
    path_pop(s, o);
    return body ? ast_ref(s->b, rule) : NULL;
}

/* ---- Dispatch ------------------------------------------------------------------------------------ */

static const char *const KNOWN[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "additionalItems", "minItems",
    "maxItems", "enum", "const", "pattern", "minLength", "maxLength", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "title",
    "description", "default", "examples", "$schema", "$id", "$comment", "strict", "name", "nullable", "deprecated",
    "readOnly", "writeOnly", "contentEncoding", "contentMediaType", "discriminator", "uniqueItems", "multipleOf",
    "patternProperties", "propertyNames", "minProperties", "maxProperties", "dependencies", "dependentRequired",
    "dependentSchemas", "unevaluatedProperties", "contains", "minContains", "maxContains", "unevaluatedItems", "$anchor",
    "$vocabulary", "$dynamicRef", "$dynamicAnchor", "$id",
};

static const char *const ANNOTATIONS[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "$defs", "definitions", "strict", "name", "nullable", "discriminator", "contentEncoding",
    "contentMediaType", "format", "$anchor",
};

/* A keyword beside `kw` that would constrain the value further (refused: the
 * combination is not merged), or NULL. `allow` is one more keyword let through. */
static const char *constraint_beside(json_t *schema, const char *kw, const char *allow) {
    const char *key;
    json_t *v;
    json_object_foreach(schema, key, v) {
        if (!strcmp(key, kw) || (allow && !strcmp(key, allow)) || !strncmp(key, "x-", 2)) continue;
        bool ann = false;
        for (size_t i = 0; i < sizeof ANNOTATIONS / sizeof *ANNOTATIONS && !ann; i++) ann = !strcmp(ANNOTATIONS[i], key);
        if (!ann) return key;
    }
    return NULL;
}

/* Does JSON value v have the type name t? */
static bool has_type(json_t *v, const char *t) {
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    return false;
}

static bool type_allows(json_t *type, json_t *v) {
    if (!type) return true;
    if (json_is_string(type)) return has_type(v, json_string_value(type));
    for (size_t i = 0; i < json_array_size(type); i++)
        if (json_is_string(json_array_get(type, i)) && has_type(v, json_string_value(json_array_get(type, i)))) return true;
    return false;
}

static cg_ast *typed_ast(sc *s, json_t *schema, const char *t) {
    if (!strcmp(t, "string")) return string_ast(s, schema);
    if (!strcmp(t, "integer")) return number_ast(s, schema, true);
    if (!strcmp(t, "number")) return number_ast(s, schema, false);
    if (!strcmp(t, "boolean")) return ast_alt2(s->b, ast_str(s->b, "true"), ast_str(s->b, "false"));
    if (!strcmp(t, "null")) return ast_str(s->b, "null");
    if (!strcmp(t, "object")) return object_ast(s, schema);
    if (!strcmp(t, "array")) return array_ast(s, schema);
    size_t o = path_push(s, ".type");
    sfail(s, "unknown type '%s'", t);
    path_pop(s, o);
    return NULL;
}

static cg_ast *schema_ast(sc *s, json_t *schema) {
    cg_builder *b = s->b;
    if (b->failed) return NULL;
    if (json_is_true(schema)) return value_any(s);
    if (json_is_false(schema)) return sfail(s, "schema 'false' matches nothing");
    if (!json_is_object(schema)) return sfail(s, "a schema must be an object or a boolean");
    if (++s->depth > 64) return sfail(s, "schema nested more than 64 levels deep");
    cg_ast *res = NULL;
    const char *key;
    json_t *v;
    json_object_foreach(schema, key, v) {
        bool known = false;
        for (size_t i = 0; i < sizeof KNOWN / sizeof *KNOWN && !known; i++) known = !strcmp(KNOWN[i], key);
        if (!known && strncmp(key, "x-", 2)) {
            size_t o = path_push(s, ".%s", key);
            sfail(s, "keyword '%s' is not supported", key);
            path_pop(s, o);
            s->depth--;
            return NULL;
        }
    }
    static const char *const refused[] = {"not", "if", "then", "else", "$dynamicRef"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (json_object_get(schema, refused[i])) {
            size_t o = path_push(s, ".%s", refused[i]);
            sfail(s, "'%s' is not supported", refused[i]);
            path_pop(s, o);
            s->depth--;
            return NULL;
        }
    json_t *ref = json_object_get(schema, "$ref"), *any = json_object_get(schema, "anyOf");
    json_t *one = json_object_get(schema, "oneOf"), *all = json_object_get(schema, "allOf");
    json_t *en = json_object_get(schema, "enum"), *cst = json_object_get(schema, "const");
    json_t *type = json_object_get(schema, "type");
    /* combinators and literals decide alone: constraints beside them are refused */
    const char *combo = ref ? "$ref" : cst ? "const" : en ? "enum" : any ? "anyOf" : one ? "oneOf" : all ? "allOf" : NULL;
    const char *beside = combo ? constraint_beside(schema, combo, (cst || en) ? "type" : NULL) : NULL;
    if (beside) {
        size_t o = path_push(s, ".%s", beside);
        sfail(s, "'%s' beside '%s' is not supported", beside, combo);
        path_pop(s, o);
        s->depth--;
        return NULL;
    }
    if ((cst || en) && type && !json_is_string(type) && !json_is_array(type)) {
        size_t o = path_push(s, ".type");
        sfail(s, "must be a string or an array of strings");
        path_pop(s, o);
        s->depth--;
        return NULL;
    }
    if (ref) res = ref_ast(s, ref);
    else if (cst) {
        if (!type_allows(type, cst)) {
            size_t o = path_push(s, ".const");
            sfail(s, "the value does not have the schema's type");
            path_pop(s, o);
            s->depth--;
            return NULL;
        }
        char *t = dump_json(cst);
        res = ast_str(b, t ? t : "null");
        free(t);
    } else if (en) {
        size_t o = path_push(s, ".enum");
        json_t *keep = json_array();
        for (size_t i = 0; json_is_array(en) && i < json_array_size(en); i++)
            if (type_allows(type, json_array_get(en, i))) json_array_append(keep, json_array_get(en, i));
        if (json_is_array(en) && json_array_size(en) && !json_array_size(keep))
            res = sfail(s, "no value has the schema's type");
        else res = enum_ast(s, json_is_array(en) ? keep : en);
        json_decref(keep);
        path_pop(s, o);
    } else if (any || one) {
        json_t *arr = any ? any : one;
        const char *kw = any ? "anyOf" : "oneOf";
        if (!json_is_array(arr) || json_array_size(arr) == 0) {
            size_t o = path_push(s, ".%s", kw);
            res = sfail(s, "must be a non-empty array");
            path_pop(s, o);
        } else {
            cg_astv alts = {0};
            for (size_t i = 0; i < json_array_size(arr) && !b->failed; i++) {
                size_t o = path_push(s, ".%s[%zu]", kw, i);
                json_t *sub = json_array_get(arr, i);
                /* sibling keywords (as in {"type":"object", "anyOf": [...]}) are not merged */
                astv_push(&alts, schema_ast(s, sub));
                path_pop(s, o);
            }
            res = b->failed ? NULL : ast_alt(b, alts.v, alts.n);
            astv_free(&alts);
        }
    } else if (all) {
        size_t o = path_push(s, ".allOf");
        if (!json_is_array(all) || json_array_size(all) != 1) res = sfail(s, "only an allOf of exactly one schema is supported");
        else {
            path_pop(s, o);
            o = path_push(s, ".allOf[0]");
            res = schema_ast(s, json_array_get(all, 0));
        }
        path_pop(s, o);
    } else if (type) {
        if (json_is_string(type)) res = typed_ast(s, schema, json_string_value(type));
        else if (json_is_array(type) && json_array_size(type) > 0) {
            cg_astv alts = {0};
            for (size_t i = 0; i < json_array_size(type) && !b->failed; i++) {
                json_t *t = json_array_get(type, i);
                if (!json_is_string(t)) {
                    size_t o = path_push(s, ".type[%zu]", i);
                    sfail(s, "must be a string");
                    path_pop(s, o);
                    break;
                }
                astv_push(&alts, typed_ast(s, schema, json_string_value(t)));
            }
            res = b->failed ? NULL : ast_alt(b, alts.v, alts.n);
            astv_free(&alts);
        } else {
            size_t o = path_push(s, ".type");
            res = sfail(s, "must be a string or a non-empty array of strings");
            path_pop(s, o);
        }
    } else if (json_object_get(schema, "properties")) res = object_ast(s, schema);
    else if (json_object_get(schema, "items")) res = array_ast(s, schema);
    else res = value_any(s);
    s->depth--;
    return res;
}

void lilac_schema_opts_default(lilac_schema_opts *o) { o->max_ws = 24; }

/* The grammar of one schema document, inside the builder of `s`. */
static cg_ast *schema_doc(sc *s, const char *json, size_t len) {
    json_error_t je;
    json_t *doc = json_loadb(json, len, JSON_DECODE_ANY, &je);
    if (!doc) return cgb_fail(s->b, "schema%s: invalid JSON at line %d column %d: %s", s->label, je.line, je.column, je.text);
    s->doc = doc;
    strcpy(s->path, "$");
    s->plen = 1;
    s->depth = 0;
    cg_ast *body = schema_ast(s, doc);
    for (int i = 0; i < s->n_refs; i++) free(s->refs[i].ref);
    s->n_refs = 0;
    json_decref(doc);
    s->doc = NULL;
    return body;
}

static void sc_init(sc *s, cg_builder *b, const lilac_schema_opts *opts) {
    memset(s, 0, sizeof *s);
    s->b = b;
    s->max_ws = opts->max_ws < 0 ? 0 : opts->max_ws > 1000 ? 1000 : opts->max_ws;
    s->r_ws = s->r_str = s->r_num = s->r_int = s->r_val = s->r_obj = s->r_arr = s->r_char = -1;
}

lilac_grammar *lilac_grammar_from_schema(const char *json, size_t len, const lilac_schema_opts *opts, lilac_err *err) {
    lilac_schema_opts def;
    if (!opts) lilac_schema_opts_default(&def), opts = &def;
    cg_builder b;
    cgb_init(&b, err);
    sc s;
    sc_init(&s, &b, opts);
    int root = cgb_rule(&b, "root");
    cg_ast *body = schema_doc(&s, json, len);
    if (body) cgb_define(&b, root, ast_seq2(&b, body, ws(&s)));
    lilac_grammar *g = b.failed ? NULL : cg_compile(&b, root);
    free(s.refs);
    cgb_free(&b);
    return g;
}

lilac_grammar *lilac_grammar_from_schema_alts(const lilac_schema_alt *alts, size_t n, const lilac_schema_opts *opts,
                                              lilac_err *err) {
    lilac_schema_opts def;
    if (!opts) lilac_schema_opts_default(&def), opts = &def;
    cg_builder b;
    cgb_init(&b, err);
    sc s;
    sc_init(&s, &b, opts);
    int root = cgb_rule(&b, "root");
    cg_astv v = {0};
    if (n == 0) cgb_fail(&b, "schema: no alternatives");
    for (size_t i = 0; i < n && !b.failed; i++) {
        snprintf(s.label, sizeof s.label, " %zu", i);
        cg_ast *body = schema_doc(&s, alts[i].schema, alts[i].schema_len);
        const char *pre = alts[i].prefix ? alts[i].prefix : "", *suf = alts[i].suffix ? alts[i].suffix : "";
        astv_push(&v, ast_seq3(&b, ast_str(&b, pre), body, ast_str(&b, suf)));
    }
    if (!b.failed) cgb_define(&b, root, ast_alt(&b, v.v, v.n));
    astv_free(&v);
    lilac_grammar *g = b.failed ? NULL : cg_compile(&b, root);
    free(s.refs);
    cgb_free(&b);
    return g;
}

/* ---- Forced tool calls in Qwen's XML syntax ------------------------------------------------ */

/* The raw text of a string parameter: the enum or const values, a pattern,
 * or any text without '<' (so it cannot close the parameter early), within
 * minLength/maxLength. outparse.c takes it verbatim as the JSON string. */
static cg_ast *raw_string_ast(sc *s, json_t *prop) {
    cg_builder *b = s->b;
    json_t *en = json_object_get(prop, "enum"), *cn = json_object_get(prop, "const");
    json_t *pat = json_object_get(prop, "pattern");
    if (en || cn) {
        json_t *one = json_array();
        if (cn) json_array_append(one, cn);
        json_t *arr = en ? en : one;
        if (!json_is_array(arr) || !json_array_size(arr)) {
            json_decref(one);
            return sfail(s, "'enum' must be a non-empty array");
        }
        size_t n = json_array_size(arr);
        cg_bstr *v = xcalloc(n, sizeof *v);
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            json_t *x = json_array_get(arr, i);
            if (json_is_string(x) && !memchr(json_string_value(x), '<', json_string_length(x)))
                v[k++] = (cg_bstr){(const uint8_t *)json_string_value(x), json_string_length(x)};
        }
        cg_ast *a = k ? cg_trie_ast(b, v, k) : sfail(s, "no string value without '<' in 'enum'/'const'");
        free(v);
        json_decref(one);
        return a;
    }
    if (pat) {
        size_t o = path_push(s, ".pattern");
        if (!json_is_string(pat)) return sfail(s, "'pattern' must be a string");
        char where[1100];
        snprintf(where, sizeof where, "schema %s: ", s->path);
        cg_ast *re = cg_regex_ast(b, json_string_value(pat), json_string_length(pat), where, false);
        path_pop(s, o);
        return re;
    }
    json_t *mnl = json_object_get(prop, "minLength"), *mxl = json_object_get(prop, "maxLength");
    long long lo = json_is_integer(mnl) ? json_integer_value(mnl) : 0, hi = json_is_integer(mxl) ? json_integer_value(mxl) : -1;
    if (lo < 0 || lo > CG_MAX_REPEAT || hi > CG_MAX_REPEAT || (hi >= 0 && hi < lo))
        return sfail(s, "string length bounds outside 0..%d", CG_MAX_REPEAT);
    uint32_t lt[] = {'<', '<'};
    return ast_rep(b, ast_class(b, lt, 1, true), (int)lo, (int)hi);
}

/* How outparse.c reads a parameter's text back (its param_type): by the
 * first non-null `type`, JSON for enum/anyOf ("any"), else a raw string. */
static const char *param_kind(json_t *prop) {
    json_t *t = json_object_get(prop, "type");
    if (json_is_string(t)) return json_string_value(t);
    if (json_is_array(t))
        for (size_t j = 0; j < json_array_size(t); j++) {
            const char *x = json_string_value(json_array_get(t, j));
            if (x && strcmp(x, "null")) return x;
        }
    if (json_object_get(prop, "enum") || json_object_get(prop, "anyOf")) return "any";
    return "";
}

static bool annotations_only(json_t *prop) {
    if (json_is_true(prop)) return true;
    const char *k;
    json_t *v;
    json_object_foreach(prop, k, v) {
        bool ann = false;
        for (size_t i = 0; i < sizeof ANNOTATIONS / sizeof *ANNOTATIONS && !ann; i++) ann = !strcmp(ANNOTATIONS[i], k);
        if (!ann) return false;
    }
    return true;
}

/* One parameter's value as outparse.c will read it back. */
static cg_ast *param_value(sc *s, json_t *prop) {
    if (!json_is_object(prop) && !json_is_true(prop)) return sfail(s, "a schema must be an object or a boolean");
    const char *kind = json_is_true(prop) ? "" : param_kind(prop);
    if (!strcmp(kind, "string") || (!kind[0] && annotations_only(prop))) return raw_string_ast(s, prop);
    if (!kind[0])
        return sfail(s, "a forced tool call needs a 'type' (or 'enum'/'anyOf') here: its text is read back by type");
    if (!strcmp(kind, "any") || json_is_string(json_object_get(prop, "type"))) return schema_ast(s, prop);
    json_t *one = json_deep_copy(prop); /* a list of types: the first non-null, as outparse.c reads it */
    json_object_set_new(one, "type", json_string(kind));
    cg_ast *a = schema_ast(s, one);
    json_decref(one);
    return a;
}

/* <function=NAME>\n, the parameters in the schema's order (the required ones
 * always, others optionally), </function>\n. */
static cg_ast *tool_call_params(sc *s, json_t *params, cg_astv *seq);

static cg_ast *tool_call_ast(sc *s, const char *name, json_t *params) {
    cg_builder *b = s->b;
    char head[600];
    snprintf(head, sizeof head, "<function=%s>\n", name);
    cg_astv seq = {0};
    astv_push(&seq, ast_str(b, head));
    cg_ast *a = NULL;
    if (tool_call_params(s, params, &seq)) { /* (NULL: failed; the list is freed on every path) */
        astv_push(&seq, ast_str(b, "</function>\n"));
        a = b->failed ? NULL : ast_seq(b, seq.v, seq.n);
    }
    astv_free(&seq);
    return a;
}

/* The <parameter=KEY> blocks into seq; NULL after an error (sfail), else a non-NULL marker. */
static cg_ast *tool_call_params(sc *s, json_t *params, cg_astv *seq) {
    cg_builder *b = s->b;
    static cg_ast done;
    if (!params || json_is_null(params)) return &done;
    if (!json_is_object(params)) return sfail(s, "the parameters must be a JSON Schema object");
    json_t *t = json_object_get(params, "type");
    if (t && !(json_is_string(t) && !strcmp(json_string_value(t), "object")))
        return sfail(s, "the parameters' type must be \"object\"");
    json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    if (props && !json_is_object(props)) return sfail(s, "'properties' must be an object");
    const char *key;
    json_t *prop;
    json_object_foreach(props, key, prop) {
        if (strchr(key, '>') || strchr(key, '\n')) return sfail(s, "parameter name '%.60s' holds '>' or a newline", key);
        size_t o = path_push(s, ".properties.%s", key);
        cg_ast *v = param_value(s, prop);
        path_pop(s, o);
        if (!v) return NULL;
        char open[600];
        snprintf(open, sizeof open, "<parameter=%s>\n", key);
        cg_ast *p = ast_seq3(b, ast_str(b, open), v, ast_str(b, "\n</parameter>\n"));
        bool required = false;
        for (size_t i = 0; json_is_array(req) && i < json_array_size(req) && !required; i++)
            required = json_is_string(json_array_get(req, i)) && !strcmp(json_string_value(json_array_get(req, i)), key);
        astv_push(seq, required ? p : ast_rep(b, p, 0, 1));
    }
    for (size_t i = 0; json_is_array(req) && i < json_array_size(req); i++) {
        const char *r = json_string_value(json_array_get(req, i));
        if (r && !json_object_get(props, r)) return sfail(s, "required parameter '%.60s' is not in 'properties'", r);
    }
    return &done;
}

lilac_grammar *lilac_grammar_from_qwen_tools(const char *json, size_t len, lilac_err *err) {
    lilac_schema_opts opts;
    lilac_schema_opts_default(&opts);
    cg_builder b;
    cgb_init(&b, err);
    sc s;
    sc_init(&s, &b, &opts);
    int root = cgb_rule(&b, "root");
    json_error_t je;
    json_t *doc = json_loadb(json, len, 0, &je);
    json_t *tools = json_object_get(doc, "tools");
    const char *only = json_string_value(json_object_get(doc, "name"));
    if (!json_is_array(tools)) cgb_fail(&b, "tools: expected {\"tools\": [...], \"name\": ...}");
    cg_astv calls = {0};
    for (size_t i = 0; !b.failed && i < json_array_size(tools); i++) {
        json_t *f = json_object_get(json_array_get(tools, i), "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        if (!name) {
            cgb_fail(&b, "tools[%zu]: no function name", i);
            break;
        }
        if (only && strcmp(only, name)) continue;
        if (strchr(name, '>') || strchr(name, '\n') || strlen(name) > 256) {
            cgb_fail(&b, "tools[%zu].function.name: '%.60s' holds '>' or a newline, or is too long", i, name);
            break;
        }
        json_t *params = json_object_get(f, "parameters");
        s.doc = params;
        snprintf(s.path, sizeof s.path, "tools[%zu].function.parameters", i);
        s.plen = strlen(s.path);
        s.depth = 0;
        cg_ast *c = tool_call_ast(&s, name, params);
        for (int k = 0; k < s.n_refs; k++) free(s.refs[k].ref);
        s.n_refs = 0;
        if (c) astv_push(&calls, c);
    }
    if (!b.failed && !calls.n) cgb_fail(&b, "tools: no function to call");
    if (!b.failed)
        cgb_define(&b, root, ast_seq3(&b, ast_str(&b, "<tool_call>\n"), ast_alt(&b, calls.v, calls.n), ast_str(&b, "</tool_call>")));
    astv_free(&calls);
    json_decref(doc);
    s.doc = NULL;
    lilac_grammar *g = b.failed ? NULL : cg_compile(&b, root);
    free(s.refs);
    cgb_free(&b);
    return g;
}
