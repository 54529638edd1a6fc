/* load.c — reading tokenizer.json (a small scanner for the big vocab and merges
 * members, jansson for the rest; the normalizer, the pre-tokenizer's regex as HF
 * reads it, the added tokens), freeing, and the id -> bytes lookups; see tokenizer.h. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"
#include "tok_internal.h"
#include "hf_unicode.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ------------------------------------------------------------------------- */
/* The pre-tokenizer's regex                                                 */

/* Make PCRE2 read the pattern as HF's Oniguruma does:
 *  - Onig reads \s as Unicode White_Space; PCRE2 with UCP also counts U+180E:
 *    \s and \S are spelled out;
 *  - Onig's Unicode tables are newer (16 vs 14): \p{L}, \p{N}, \p{M} get the
 *    code points assigned since (HF_EXTRA_* in hf_unicode.h). */
#define WS_CLASS                                                                                                      \
    "\\t\\n\\x0B\\f\\r\\x20\\x85\\xA0\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static char *rewrite_ws(const char *pat) {
    static const char ws_pos[] = "[" WS_CLASS "]", ws_neg[] = "[^" WS_CLASS "]";
    tok_buf b = {0};
    tok_buf_put(&b, "", 0);
    bool in_class = false;
    size_t class_start = 0;
    for (size_t i = 0; pat[i]; i++) {
        char c = pat[i];
        if (c == '\\' && pat[i + 1]) {
            char e = pat[i + 1];
            if (e == 's' && !in_class) tok_buf_put(&b, ws_pos, strlen(ws_pos));
            else if (e == 'S' && !in_class) tok_buf_put(&b, ws_neg, strlen(ws_neg));
            else if (e == 's' && in_class) tok_buf_put(&b, WS_CLASS, strlen(WS_CLASS));
            else if (e == 'p' && pat[i + 2] == '{' && strchr("LNM", pat[i + 3]) && pat[i + 3] && pat[i + 4] == '}') {
                const char *extra = pat[i + 3] == 'L' ? HF_EXTRA_L : pat[i + 3] == 'N' ? HF_EXTRA_N : HF_EXTRA_M;
                if (!in_class) tok_buf_put(&b, "[", 1);
                tok_buf_put(&b, pat + i, 5);
                tok_buf_put(&b, extra, strlen(extra));
                if (!in_class) tok_buf_put(&b, "]", 1);
                i += 4;
                continue;
            }
            else if (e == 'Q') { /* \Q...\E: copy verbatim */
                const char *q = strstr(pat + i + 2, "\\E");
                size_t len = q ? (size_t)(q + 2 - (pat + i)) : strlen(pat + i);
                tok_buf_put(&b, pat + i, len);
                i += len - 1;
                continue;
            } else
                tok_buf_put(&b, pat + i, 2);
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            tok_buf_put(&b, &c, 1);
            if (pat[i + 1] == '^') {
                tok_buf_put(&b, "^", 1);
                i++;
            }
            if (pat[i + 1] == ']') { /* a leading ] is literal */
                tok_buf_put(&b, "]", 1);
                i++;
            }
            class_start = i + 1;
            continue;
        }
        if (in_class && c == '[' && pat[i + 1] == ':') { /* [:name:] */
            const char *q = strstr(pat + i + 2, ":]");
            size_t len = q ? (size_t)(q + 2 - (pat + i)) : 1;
            tok_buf_put(&b, pat + i, len);
            i += len - 1;
            continue;
        }
        if (in_class && c == ']' && i >= class_start) in_class = false;
        tok_buf_put(&b, &c, 1);
    }
    return b.p;
}

/* ------------------------------------------------------------------------- */
/* A small JSON scanner for tokenizer.json: the two big members (model.vocab  */
/* and model.merges) are read directly, everything else is handed to jansson. */

typedef struct {
    const char *p, *end, *base;
    lilac_err *err;
    tok_buf str; /* the last decoded string */
} jscan;

static int js_fail(jscan *j, const char *what) {
    return lilac_fail(j->err, "tokenizer.json: %s at byte %zu", what, (size_t)(j->p - j->base));
}

static void js_ws(jscan *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int js_hex4(jscan *j, uint32_t *v) {
    if (j->end - j->p < 4) return js_fail(j, "truncated \\u escape");
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval((unsigned char)j->p[i]);
        if (h < 0) return js_fail(j, "bad \\u escape");
        x = x * 16 + (uint32_t)h;
    }
    j->p += 4;
    *v = x;
    return 0;
}

static void put_utf8(tok_buf *b, uint32_t cp) {
    uint8_t o[4];
    size_t n;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        n = 1;
    } else if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        o[0] = (uint8_t)(0xF0 | (cp >> 18));
        o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[3] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 4;
    }
    tok_buf_put(b, o, n);
}

/* Parse a JSON string at j->p into j->str. */
static int js_string(jscan *j) {
    js_ws(j);
    if (j->p >= j->end || *j->p != '"') return js_fail(j, "expected a string");
    j->p++;
    j->str.n = 0;
    tok_buf_put(&j->str, "", 0);
    for (;;) {
        const char *s = j->p;
        while (j->p < j->end && *j->p != '"' && *j->p != '\\' && (unsigned char)*j->p >= 0x20) j->p++;
        tok_buf_put(&j->str, s, (size_t)(j->p - s));
        if (j->p >= j->end) return js_fail(j, "unterminated string");
        char c = *j->p++;
        if (c == '"') return 0;
        if (c != '\\') return js_fail(j, "control character in string");
        if (j->p >= j->end) return js_fail(j, "unterminated string");
        char e = *j->p++;
        switch (e) {
        case '"': tok_buf_put(&j->str, "\"", 1); break;
        case '\\': tok_buf_put(&j->str, "\\", 1); break;
        case '/': tok_buf_put(&j->str, "/", 1); break;
        case 'b': tok_buf_put(&j->str, "\b", 1); break;
        case 'f': tok_buf_put(&j->str, "\f", 1); break;
        case 'n': tok_buf_put(&j->str, "\n", 1); break;
        case 'r': tok_buf_put(&j->str, "\r", 1); break;
        case 't': tok_buf_put(&j->str, "\t", 1); break;
        case 'u': {
            uint32_t u;
            if (js_hex4(j, &u)) return -1;
            if (u >= 0xD800 && u < 0xDC00) {
                uint32_t lo;
                if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u') return js_fail(j, "lone surrogate");
                j->p += 2;
                if (js_hex4(j, &lo)) return -1;
                if (lo < 0xDC00 || lo >= 0xE000) return js_fail(j, "lone surrogate");
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            } else if (u >= 0xDC00 && u < 0xE000)
                return js_fail(j, "lone surrogate");
            put_utf8(&j->str, u);
            break;
        }
        default: return js_fail(j, "bad escape");
        }
    }
}

/* Skip one JSON value (syntax checked loosely; jansson checks what it reads). */
static int js_skip(jscan *j) {
    js_ws(j);
    int depth = 0;
    do {
        if (j->p >= j->end) return js_fail(j, "truncated value");
        char c = *j->p;
        if (c == '"') {
            j->p++;
            while (j->p < j->end && *j->p != '"') j->p += (*j->p == '\\') ? 2 : 1;
            if (j->p >= j->end) return js_fail(j, "unterminated string");
            j->p++;
        } else if (c == '{' || c == '[') {
            depth++;
            j->p++;
        } else if (c == '}' || c == ']') {
            if (--depth < 0) return js_fail(j, "unbalanced bracket");
            j->p++;
        } else if (c == ',' || c == ':' || c == ' ' || c == '\n' || c == '\r' || c == '\t') {
            if (depth == 0) return js_fail(j, "unexpected character");
            j->p++;
        } else {
            const char *s = j->p;
            while (j->p < j->end && strchr(",:}] \n\r\t", *j->p) == NULL) j->p++;
            if (j->p == s) return js_fail(j, "unexpected character");
        }
    } while (depth > 0);
    return 0;
}

/* Parse the value at j->p with jansson. */
static json_t *js_value(jscan *j) {
    js_ws(j);
    const char *s = j->p;
    if (js_skip(j)) return NULL;
    json_error_t e;
    json_t *v = json_loadb(s, (size_t)(j->p - s), JSON_DECODE_ANY, &e);
    if (!v) {
        j->p = s;
        js_fail(j, e.text);
    }
    return v;
}

static int js_expect(jscan *j, char c) {
    js_ws(j);
    if (j->p >= j->end || *j->p != c) {
        char m[32];
        snprintf(m, sizeof m, "expected '%c'", c);
        return js_fail(j, m);
    }
    j->p++;
    return 0;
}

/* After a member or element: returns 1 to continue, 0 at the closing bracket. */
static int js_next(jscan *j, char close) {
    js_ws(j);
    if (j->p < j->end && *j->p == ',') {
        j->p++;
        return 1;
    }
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return 0;
    }
    return js_fail(j, "expected ',' or a closing bracket");
}

static int js_peek(jscan *j, char c) {
    js_ws(j);
    return j->p < j->end && *j->p == c;
}

/* ------------------------------------------------------------------------- */
/* Loading                                                                   */

struct load_state {
    strmap vocab;    /* token string -> id */
    long max_id;
    json_t *added, *normalizer, *pretok, *decoder;
    json_t *model_opts; /* object of the small model members */
    bool have_model, have_vocab, have_merges;
    /* merges as pairs of strings, kept until the vocab is known */
    tok_buf merge_arena;
    struct pending_merge {
        size_t a_off, b_off;
        uint32_t a_len, b_len;
    } *pm;
    size_t n_pm, cap_pm;
};

static int parse_vocab(jscan *j, struct load_state *L) {
    if (js_expect(j, '{')) return -1;
    tok_sm_init(&L->vocab, 1 << 17);
    if (js_peek(j, '}')) {
        j->p++;
        return 0;
    }
    for (;;) {
        if (js_string(j)) return -1;
        if (js_expect(j, ':')) return -1;
        js_ws(j);
        long v = 0;
        const char *s = j->p;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9' && v <= INT32_MAX) v = v * 10 + (*j->p++ - '0');
        if (j->p == s || v > INT32_MAX - 1) return js_fail(j, "model.vocab: expected a token id");
        tok_sm_put(&L->vocab, j->str.p, j->str.n, (int32_t)v);
        if (v > L->max_id) L->max_id = v;
        int r = js_next(j, '}');
        if (r < 0) return -1;
        if (!r) break;
    }
    return 0;
}

static void pm_add(struct load_state *L, const char *a, size_t an, const char *b, size_t bn) {
    if (L->n_pm == L->cap_pm) {
        L->cap_pm = L->cap_pm ? L->cap_pm * 2 : 1 << 16;
        L->pm = xrealloc(L->pm, L->cap_pm * sizeof *L->pm);
    }
    struct pending_merge *m = &L->pm[L->n_pm++];
    m->a_off = L->merge_arena.n;
    m->a_len = (uint32_t)an;
    tok_buf_put(&L->merge_arena, a, an);
    m->b_off = L->merge_arena.n;
    m->b_len = (uint32_t)bn;
    tok_buf_put(&L->merge_arena, b, bn);
}

static int parse_merges(jscan *j, struct load_state *L) {
    if (js_expect(j, '[')) return -1;
    if (js_peek(j, ']')) {
        j->p++;
        return 0;
    }
    tok_buf tmp = {0};
    for (;;) {
        js_ws(j);
        if (js_peek(j, '[')) { /* ["a", "b"] */
            j->p++;
            if (js_string(j)) goto fail;
            tmp.n = 0;
            tok_buf_put(&tmp, j->str.p, j->str.n);
            if (js_expect(j, ',') || js_string(j) || js_expect(j, ']')) goto fail;
            pm_add(L, tmp.p, tmp.n, j->str.p, j->str.n);
        } else { /* "a b" */
            if (js_string(j)) goto fail;
            char *sp = memchr(j->str.p, ' ', j->str.n);
            if (!sp || memchr(sp + 1, ' ', j->str.n - (size_t)(sp + 1 - j->str.p))) {
                js_fail(j, "model.merges: a merge string must be two tokens separated by one space");
                goto fail;
            }
            pm_add(L, j->str.p, (size_t)(sp - j->str.p), sp + 1, j->str.n - (size_t)(sp + 1 - j->str.p));
        }
        int r = js_next(j, ']');
        if (r < 0) goto fail;
        if (!r) break;
    }
    free(tmp.p);
    return 0;
fail:
    free(tmp.p);
    return -1;
}

static int parse_model(jscan *j, struct load_state *L) {
    if (js_expect(j, '{')) return -1;
    L->model_opts = json_object();
    if (js_peek(j, '}')) {
        j->p++;
        return 0;
    }
    tok_buf key = {0};
    int rc = -1;
    for (;;) {
        if (js_string(j)) goto out;
        key.n = 0;
        tok_buf_put(&key, j->str.p, j->str.n);
        if (js_expect(j, ':')) goto out;
        if (!strcmp(key.p, "vocab") && strlen(key.p) == key.n) {
            if (L->have_vocab) {
                js_fail(j, "model.vocab given twice");
                goto out;
            }
            if (parse_vocab(j, L)) goto out;
            L->have_vocab = true;
        } else if (!strcmp(key.p, "merges") && strlen(key.p) == key.n) {
            if (parse_merges(j, L)) goto out;
            L->have_merges = true;
        } else {
            json_t *v = js_value(j);
            if (!v) goto out;
            if (strlen(key.p) == key.n) json_object_set_new(L->model_opts, key.p, v);
            else json_decref(v);
        }
        int r = js_next(j, '}');
        if (r < 0) goto out;
        if (!r) break;
    }
    rc = 0;
out:
    free(key.p);
    return rc;
}

static int parse_top(jscan *j, struct load_state *L) {
    if (js_expect(j, '{')) return -1;
    if (js_peek(j, '}')) return js_fail(j, "empty object");
    tok_buf key = {0};
    int rc = -1;
    for (;;) {
        if (js_string(j)) goto out;
        key.n = 0;
        tok_buf_put(&key, j->str.p, j->str.n);
        if (js_expect(j, ':')) goto out;
        json_t **slot = NULL;
        if (!strcmp(key.p, "model")) {
            if (L->have_model) {
                js_fail(j, "\"model\" given twice");
                goto out;
            }
            if (parse_model(j, L)) goto out;
            L->have_model = true;
        } else {
            if (!strcmp(key.p, "added_tokens")) slot = &L->added;
            else if (!strcmp(key.p, "normalizer")) slot = &L->normalizer;
            else if (!strcmp(key.p, "pre_tokenizer")) slot = &L->pretok;
            else if (!strcmp(key.p, "decoder")) slot = &L->decoder;
            if (slot) {
                json_t *v = js_value(j);
                if (!v) goto out;
                json_decref(*slot);
                *slot = v;
            } else if (js_skip(j))
                goto out;
        }
        int r = js_next(j, '}');
        if (r < 0) goto out;
        if (!r) break;
    }
    js_ws(j);
    if (j->p != j->end) {
        js_fail(j, "trailing characters");
        goto out;
    }
    rc = 0;
out:
    free(key.p);
    return rc;
}

/* The normalizer: null, NFC, or a Sequence of those. */
static int load_normalizer(lilac_tokenizer *t, json_t *n, lilac_err *err) {
    if (!n || json_is_null(n)) return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return lilac_fail(err, "tokenizer.json: normalizer without a type");
    if (!strcmp(type, "NFC")) {
        t->nfc = true;
        return 0;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *a = json_object_get(n, "normalizers");
        size_t i;
        json_t *x;
        if (!json_is_array(a)) return lilac_fail(err, "tokenizer.json: normalizer Sequence without a list");
        json_array_foreach(a, i, x) {
            if (load_normalizer(t, x, err)) return -1;
        }
        return 0;
    }
    return lilac_fail(err, "tokenizer.json: unsupported normalizer \"%s\" (lilac supports NFC)", type);
}

static const char *GPT2_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_pretok(lilac_tokenizer *t, json_t *p, lilac_err *err, const char **pattern, bool *literal) {
    if (!p || json_is_null(p)) return lilac_fail(err, "tokenizer.json: no pre_tokenizer (lilac needs ByteLevel)");
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return lilac_fail(err, "tokenizer.json: pre_tokenizer without a type");
    if (!strcmp(type, "Sequence")) {
        json_t *a = json_object_get(p, "pretokenizers");
        size_t i;
        json_t *x;
        if (!json_is_array(a)) return lilac_fail(err, "tokenizer.json: pre_tokenizer Sequence without a list");
        json_array_foreach(a, i, x) {
            if (load_pretok(t, x, err, pattern, literal)) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "Split")) {
        if (*pattern) return lilac_fail(err, "tokenizer.json: more than one Split pre-tokenizer is not supported");
        json_t *pat = json_object_get(p, "pattern");
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        json_t *inv = json_object_get(p, "invert");
        if (!beh || strcmp(beh, "Isolated"))
            return lilac_fail(err, "tokenizer.json: Split behavior \"%s\" not supported (only Isolated)",
                              beh ? beh : "?");
        if (inv && json_is_true(inv)) return lilac_fail(err, "tokenizer.json: Split with invert not supported");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        if (re) *pattern = re;
        else if (lit) {
            *pattern = lit;
            *literal = true;
        } else
            return lilac_fail(err, "tokenizer.json: Split without a pattern");
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        if (json_is_true(json_object_get(p, "add_prefix_space")))
            return lilac_fail(err, "tokenizer.json: ByteLevel add_prefix_space=true is not supported");
        json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur)) {
            if (*pattern) return lilac_fail(err, "tokenizer.json: Split and ByteLevel(use_regex) together");
            *pattern = GPT2_PATTERN;
        }
        t->bytelevel = true;
        return 0;
    }
    return lilac_fail(err, "tokenizer.json: unsupported pre_tokenizer \"%s\"", type);
}

static int cmp_added_first(const void *a, const void *b, void *ctx) {
    const lilac_tokenizer *t = ctx;
    const tok_added *x = &t->added[*(const int *)a], *y = &t->added[*(const int *)b];
    const char *xs = x->norm ? x->norm : x->content, *ys = y->norm ? y->norm : y->content;
    size_t xn = x->norm ? x->norm_len : x->len, yn = y->norm ? y->norm_len : y->len;
    if ((uint8_t)xs[0] != (uint8_t)ys[0]) return (uint8_t)xs[0] - (uint8_t)ys[0];
    if (xn != yn) return xn > yn ? -1 : 1;
    return 0;
}

/* Build the first-byte index of one matching set (normalized or not). */
static void build_match_set(lilac_tokenizer *t, tok_matchset *ms, bool normalized) {
    int n = 0;
    ms->order = xmalloc(sizeof(int) * (size_t)(t->n_added + 1));
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].len > 0) ms->order[n++] = i;
    qsort_r(ms->order, (size_t)n, sizeof(int), cmp_added_first, t);
    ms->n = n;
    for (int b = 0; b <= 256; b++) ms->start[b] = 0;
    for (int k = 0; k < n; k++) {
        const tok_added *a = &t->added[ms->order[k]];
        uint8_t b = (uint8_t)(a->norm ? a->norm[0] : a->content[0]);
        ms->start[b + 1]++;
    }
    for (int b = 0; b < 256; b++) ms->start[b + 1] += ms->start[b];
    int distinct = 0, last = -1;
    for (int b = 0; b < 256; b++)
        if (ms->start[b + 1] > ms->start[b]) {
            distinct++;
            last = b;
        }
    ms->single_first = distinct == 1 ? last : -1;
}

static int load_added(lilac_tokenizer *t, json_t *arr, const strmap *vocab, lilac_err *err) {
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) return lilac_fail(err, "tokenizer.json: added_tokens is not a list");
    size_t n = json_array_size(arr);
    t->added = xcalloc(n + 1, sizeof(tok_added));
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x) {
        json_t *id = json_object_get(x, "id");
        json_t *c = json_object_get(x, "content");
        if (!json_is_integer(id) || !json_is_string(c) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX)
            return lilac_fail(err, "tokenizer.json: added_tokens[%zu] needs an integer id and a string content", i);
        if (json_string_length(c) == 0) continue; /* HF ignores empty tokens */
        tok_added *a = &t->added[t->n_added++];
        a->id = (int32_t)json_integer_value(id);
        /* HF: a token already in the model's vocab keeps its vocab id */
        const sm_slot *in_vocab = vocab && vocab->s ? tok_sm_find(vocab, json_string_value(c), json_string_length(c)) : NULL;
        if (in_vocab) a->id = in_vocab->val;
        a->len = json_string_length(c);
        a->content = xmalloc(a->len + 1);
        memcpy(a->content, json_string_value(c), a->len + 1);
        a->single_word = json_is_true(json_object_get(x, "single_word"));
        a->lstrip = json_is_true(json_object_get(x, "lstrip"));
        a->rstrip = json_is_true(json_object_get(x, "rstrip"));
        json_t *nz = json_object_get(x, "normalized");
        a->normalized = nz ? json_is_true(nz) : !json_is_true(json_object_get(x, "special"));
        a->special = json_is_true(json_object_get(x, "special"));
        if (a->normalized && t->nfc) {
            tok_buf b = {0};
            if (tok_nfc((const uint8_t *)a->content, a->len, &b, err)) {
                free(b.p);
                return -1;
            }
            if (b.n == 0) {
                free(b.p);
                t->n_added--;
                free(a->content);
                continue;
            }
            a->norm = b.p;
            a->norm_len = b.n;
        }
        if (a->id > t->max_id) t->max_id = a->id;
    }
    return 0;
}

static lilac_tokenizer *load_fail(lilac_tokenizer *t, struct load_state *L) {
    if (L->vocab.s) tok_sm_free(&L->vocab);
    json_decref(L->added);
    json_decref(L->normalizer);
    json_decref(L->pretok);
    json_decref(L->decoder);
    json_decref(L->model_opts);
    free(L->merge_arena.p);
    free(L->pm);
    lilac_tok_free(t);
    return NULL;
}

lilac_tokenizer *lilac_tok_load_mem(const char *json, size_t len, lilac_err *err) {
    tok_global_init();
    lilac_tokenizer *t = xcalloc(1, sizeof *t);
    struct load_state L;
    memset(&L, 0, sizeof L);
    L.max_id = -1;
    t->max_id = -1;

    size_t v = lilac_utf8_check(json, len);
    if (v != len) {
        lilac_fail(err, "tokenizer.json: invalid UTF-8 at byte %zu", v);
        return load_fail(t, &L);
    }
    jscan j = {.p = json, .end = json + len, .base = json, .err = err};
    int rc = parse_top(&j, &L);
    free(j.str.p);
    if (rc) return load_fail(t, &L);
    if (!L.have_model || !L.have_vocab) {
        lilac_fail(err, "tokenizer.json: no model.vocab");
        return load_fail(t, &L);
    }
    const char *mtype = json_string_value(json_object_get(L.model_opts, "type"));
    if (mtype && strcmp(mtype, "BPE")) {
        lilac_fail(err, "tokenizer.json: model type \"%s\" is not supported (lilac reads BPE)", mtype);
        return load_fail(t, &L);
    }
    {
        const char *cs = json_string_value(json_object_get(L.model_opts, "continuing_subword_prefix"));
        const char *ew = json_string_value(json_object_get(L.model_opts, "end_of_word_suffix"));
        json_t *dr = json_object_get(L.model_opts, "dropout");
        if ((cs && *cs) || (ew && *ew)) {
            lilac_fail(err, "tokenizer.json: BPE subword prefix/suffix not supported");
            return load_fail(t, &L);
        }
        if (dr && !json_is_null(dr) && !(json_is_number(dr) && json_number_value(dr) == 0.0)) {
            lilac_fail(err, "tokenizer.json: BPE dropout not supported");
            return load_fail(t, &L);
        }
        if (json_is_true(json_object_get(L.model_opts, "byte_fallback"))) {
            lilac_fail(err, "tokenizer.json: BPE byte_fallback not supported");
            return load_fail(t, &L);
        }
        t->ignore_merges = json_is_true(json_object_get(L.model_opts, "ignore_merges"));
    }
    if (load_normalizer(t, L.normalizer, err)) return load_fail(t, &L);
    const char *pattern = NULL;
    bool literal = false;
    if (load_pretok(t, L.pretok, err, &pattern, &literal)) return load_fail(t, &L);
    if (!t->bytelevel) {
        lilac_fail(err, "tokenizer.json: pre_tokenizer has no ByteLevel step (lilac reads byte-level BPE)");
        return load_fail(t, &L);
    }
    if (L.decoder && !json_is_null(L.decoder)) {
        const char *dt = json_string_value(json_object_get(L.decoder, "type"));
        if (!dt || strcmp(dt, "ByteLevel")) {
            lilac_fail(err, "tokenizer.json: decoder \"%s\" not supported (lilac decodes ByteLevel)", dt ? dt : "?");
            return load_fail(t, &L);
        }
    }

    /* vocab: id -> bytes */
    t->max_id = L.max_id;
    if (load_added(t, L.added, &L.vocab, err)) return load_fail(t, &L);
    t->n_ids = (int32_t)(t->max_id + 1);
    t->tok_off = xcalloc((size_t)t->n_ids + 1, sizeof(uint32_t));
    t->tok_len = xcalloc((size_t)t->n_ids + 1, sizeof(uint32_t));
    t->tok_kind = xcalloc((size_t)t->n_ids + 1, 1);
    tok_buf arena = {0};
    tok_buf_put(&arena, "", 0);
    for (size_t i = 0; i <= L.vocab.mask; i++) {
        const sm_slot *e = &L.vocab.s[i];
        if (e->len == UINT32_MAX) continue;
        int32_t id = e->val;
        t->tok_off[id] = (uint32_t)arena.n;
        tok_bytelevel_decode(L.vocab.arena.p + e->off, e->len, &arena);
        t->tok_len[id] = (uint32_t)(arena.n - t->tok_off[id]);
        t->tok_kind[id] = TOK_KIND_VOCAB;
    }
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        t->tok_off[a->id] = (uint32_t)arena.n;
        tok_bytelevel_decode(a->content, a->len, &arena);
        t->tok_len[a->id] = (uint32_t)(arena.n - t->tok_off[a->id]);
        t->tok_kind[a->id] = a->special ? TOK_KIND_SPECIAL : TOK_KIND_ADDED;
    }
    if (arena.n > UINT32_MAX) {
        free(arena.p);
        lilac_fail(err, "tokenizer.json: vocabulary too large");
        return load_fail(t, &L);
    }
    t->tok_bytes = (uint8_t *)arena.p;

    /* initial symbols: each byte's alphabet character */
    for (int b = 0; b < 256; b++) {
        tok_buf s = {0};
        put_utf8(&s, tok_byte_to_cp[b]);
        const sm_slot *f = tok_sm_find(&L.vocab, s.p, s.n);
        t->byte_id[b] = f ? f->val : -1;
        free(s.p);
    }

    /* merges */
    size_t sz = 1024;
    while (sz < L.n_pm * 2 + 2) sz *= 2;
    t->merges = xmalloc(sz * sizeof(merge_slot));
    for (size_t i = 0; i < sz; i++) t->merges[i].key = UINT64_MAX;
    t->merge_mask = sz - 1;
    tok_buf cat = {0};
    for (size_t i = 0; i < L.n_pm; i++) {
        const struct pending_merge *m = &L.pm[i];
        const char *a = L.merge_arena.p + m->a_off, *b = L.merge_arena.p + m->b_off;
        const sm_slot *ia = tok_sm_find(&L.vocab, a, m->a_len), *ib = tok_sm_find(&L.vocab, b, m->b_len);
        cat.n = 0;
        tok_buf_put(&cat, a, m->a_len);
        tok_buf_put(&cat, b, m->b_len);
        const sm_slot *ic = tok_sm_find(&L.vocab, cat.p, cat.n);
        if (!ia || !ib || !ic) {
            lilac_fail(err, "tokenizer.json: merges[%zu] (\"%.*s\" \"%.*s\"): %s not in the vocab", i,
                       (int)(m->a_len > 40 ? 40 : m->a_len), a, (int)(m->b_len > 40 ? 40 : m->b_len), b,
                       !ia ? "left token" : !ib ? "right token" : "merged token");
            free(cat.p);
            return load_fail(t, &L);
        }
        tok_merge_put(t, ia->val, ib->val, (uint32_t)i, ic->val);
    }
    free(cat.p);
    t->n_merges = L.n_pm;

    if (t->ignore_merges) { /* whole-piece lookup table: bytes -> id */
        t->piece_map = xcalloc(1, sizeof(strmap));
        tok_sm_init(t->piece_map, L.vocab.n);
        for (size_t i = 0; i <= L.vocab.mask; i++) {
            if (L.vocab.s[i].len == UINT32_MAX) continue;
            int32_t id = L.vocab.s[i].val;
            tok_sm_put(t->piece_map, t->tok_bytes + t->tok_off[id], t->tok_len[id], id);
        }
    }

    build_match_set(t, &t->raw_set, false);
    build_match_set(t, &t->norm_set, true);

    /* the split regex */
    if (pattern) {
        int ec;
        PCRE2_SIZE eo;
        uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
        char *rw = literal ? xstrdup(pattern) : rewrite_ws(pattern);
        t->re = pcre2_compile((PCRE2_SPTR)rw, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
        free(rw);
        if (!t->re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            lilac_fail(err, "tokenizer.json: pre_tokenizer regex does not compile at offset %zu: %s", (size_t)eo,
                       (char *)msg);
            return load_fail(t, &L);
        }
        t->re_jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    }

    tok_sm_free(&L.vocab);

    json_decref(L.added);
    json_decref(L.normalizer);
    json_decref(L.pretok);
    json_decref(L.decoder);
    json_decref(L.model_opts);
    free(L.merge_arena.p);
    free(L.pm);
    return t;
}

lilac_tokenizer *lilac_tok_load(const char *path, lilac_err *err) {
    struct stat st;
    char *p = NULL;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        size_t n = strlen(path) + 32;
        p = xmalloc(n);
        snprintf(p, n, "%s/tokenizer.json", path);
    }
    size_t len;
    char *buf = lilac_read_file(p ? p : path, &len, err);
    if (!buf) {
        free(p);
        return NULL;
    }
    lilac_tokenizer *t = lilac_tok_load_mem(buf, len, err);
    if (!t) {
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err ? err->msg : "");
        lilac_fail(err, "%s: %s", p ? p : path, m);
    }
    free(buf);
    free(p);
    return t;
}

void lilac_tok_free(lilac_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].norm);
    }
    free(t->added);
    free(t->raw_set.order);
    free(t->norm_set.order);
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_kind);
    free(t->tok_bytes);
    free(t->merges);
    if (t->piece_map) {
        tok_sm_free(t->piece_map);
        free(t->piece_map);
    }
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

int32_t lilac_tok_vocab_size(const lilac_tokenizer *t) { return t->n_ids; }
int lilac_tok_n_added(const lilac_tokenizer *t) { return t->n_added; }

int32_t lilac_tok_added_id(const lilac_tokenizer *t, const char *content) {
    size_t n = strlen(content);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, content, n)) return t->added[i].id;
    return -1;
}

bool lilac_tok_is_added(const lilac_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->tok_kind[id] >= TOK_KIND_ADDED;
}
bool lilac_tok_is_special(const lilac_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->tok_kind[id] == TOK_KIND_SPECIAL;
}

const uint8_t *lilac_tok_bytes(const lilac_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || !t->tok_kind[id]) {
        *len = 0;
        return NULL;
    }
    *len = t->tok_len[id];
    return t->tok_bytes + t->tok_off[id];
}

char *lilac_tok_decode(const lilac_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, size_t *out_len) {
    tok_buf raw = {0}, out = {0};
    tok_buf_put(&raw, "", 0);
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->tok_kind[id]) continue;
        if (skip_special && t->tok_kind[id] == TOK_KIND_SPECIAL) continue;
        tok_buf_put(&raw, t->tok_bytes + t->tok_off[id], t->tok_len[id]);
    }
    tok_buf_put(&out, "", 0);
    tok_utf8_lossy(&out, (const uint8_t *)raw.p, raw.n);
    free(raw.p);
    if (out_len) *out_len = out.n;
    return out.p;
}
