/* test_constrain.c — the constraint engine (src/constrain) on the real Qwen3
 * vocabulary (tests/data/tokenizers/qwen3).
 *
 *   test_constrain                      unit tests; the allowed-token set of
 *                                       random states against a brute-force
 *                                       reference (every token's bytes tried)
 *   test_constrain sample KIND FILE N SEED MAXTOK
 *                                       N random completions under the mask, one
 *                                       JSON line each (tests/constrain uses it)
 *   test_constrain batch FILE N SEED MAXTOK
 *                                       the same for every line {"kind","text"} of FILE
 *   test_constrain masks KIND FILE SEED STATES MAXWS
 *                                       masks at random states of a random walk
 *   test_constrain compile KIND FILE    {"ok":true} or {"error":"…"}
 *   test_constrain bench [REPS]         mask cost per step (medians; no checks)
 * KIND: gbnf, schema, regex or choice. */
#include <jansson.h>
#include <stdlib.h>

#include "check.h"
#include "constrain/cg_internal.h"
#include "constrain/constrain.h"
#include "tokenizer/tokenizer.h"
#include "util/common.h"

static const char *TOK_PATH = "tests/data/tokenizers/qwen3/tokenizer.json";
static lilac_tokenizer *g_tok;
static lilac_cvocab *g_voc;
static int32_t g_eos[2];

static void setup(void) {
    lilac_err err;
    g_tok = lilac_tok_load(TOK_PATH, &err);
    if (!g_tok) {
        fprintf(stderr, "cannot load %s: %s\n", TOK_PATH, err.msg);
        exit(2);
    }
    g_eos[0] = lilac_tok_added_id(g_tok, "<|im_end|>");
    g_eos[1] = lilac_tok_added_id(g_tok, "<|endoftext|>");
    g_voc = lilac_cvocab_new(g_tok, g_eos, 2, &err);
    if (!g_voc) {
        fprintf(stderr, "cvocab: %s\n", err.msg);
        exit(2);
    }
}

static uint64_t rng_s = 88172645463325252ull;
static uint64_t rnd(void) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return rng_s;
}
static double rndu(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }

static bool is_eos(int32_t id) { return id == g_eos[0] || id == g_eos[1]; }

/* A random allowed token: the end token half the time it is allowed, else
 * uniform, or (half the time) among tokens that start by closing something. */
static int32_t pick(const uint64_t *mask, int32_t n, int32_t *buf, double p_close) {
    int32_t na = 0, nc = 0;
    bool eos = false;
    for (int32_t i = 0; i < n; i++)
        if (mask[i >> 6] >> (i & 63) & 1) {
            if (is_eos(i)) {
                eos = true;
                continue;
            }
            buf[na++] = i;
        }
    if (eos && (na == 0 || rndu() < 0.5)) return g_eos[0];
    if (na == 0) return -1;
    if (rndu() < p_close) {
        int32_t *cl = buf + na;
        for (int32_t k = 0; k < na; k++) {
            size_t l;
            const uint8_t *b = lilac_tok_bytes(g_tok, buf[k], &l);
            if (l && (b[0] == '"' || b[0] == '}' || b[0] == ']' || b[0] == ',')) cl[nc++] = buf[k];
        }
        if (nc) return cl[rnd() % (uint64_t)nc];
    }
    return buf[rnd() % (uint64_t)na];
}

static int g_max_ws = -1; /* schema whitespace bound; < 0: the default */

static lilac_grammar *compile_kind(const char *kind, const char *text, size_t len, lilac_err *err) {
    int k = !strcmp(kind, "gbnf") ? LILAC_GRAMMAR_GBNF : !strcmp(kind, "schema") ? LILAC_GRAMMAR_SCHEMA
          : !strcmp(kind, "regex") ? LILAC_GRAMMAR_REGEX : !strcmp(kind, "choice") ? LILAC_GRAMMAR_CHOICE : -1;
    lilac_schema_opts o;
    lilac_schema_opts_default(&o);
    if (g_max_ws >= 0) o.max_ws = g_max_ws;
    return lilac_grammar_compile(k, text, len, &o, err);
}

/* ---- Brute-force reference ------------------------------------------------------ */

/* Every token tried on the matcher itself (accept, then roll back). */
static void brute_mask(lilac_matcher *m, uint64_t *mask) {
    int32_t n = lilac_cvocab_size(g_voc);
    memset(mask, 0, lilac_cvocab_mask_words(g_voc) * sizeof *mask);
    for (int32_t i = 0; i < n; i++) {
        if (lilac_matcher_accept(m, i) == 0) {
            mask[i >> 6] |= 1ull << (i & 63);
            lilac_matcher_rollback(m, 1);
        }
    }
}

static int mask_diff(const uint64_t *a, const uint64_t *b, int32_t *first) {
    int n = 0;
    *first = -1;
    for (int32_t i = 0; i < lilac_cvocab_size(g_voc); i++)
        if ((a[i >> 6] ^ b[i >> 6]) >> (i & 63) & 1) {
            if (*first < 0) *first = i;
            n++;
        }
    return n;
}

static const char *BF_GRAMMARS[][2] = {
    {"schema", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
               "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
               "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"ab c\"]},\"maxItems\":3},"
               "\"score\":{\"type\":\"number\"},\"ok\":{\"type\":\"boolean\"}},"
               "\"required\":[\"name\",\"age\"]}"},
    {"schema", "{\"type\":\"object\"}"},
    {"schema", "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":[\"integer\",\"null\"]},"
               "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},"
               "\"$ref\":\"#/$defs/node\"}"},
    {"schema", "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]{3,5}$\"}},"
               "\"required\":[\"id\"],\"additionalProperties\":{\"type\":\"string\"}}"},
    {"gbnf", "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" expr \")\" | \"é\" [^\\x00-\\x7f]\n"},
    {"regex", "([a-z0-9._%+-]+)@[a-z0-9-]+\\.(com|org|net)"},
    {"choice", "[\"yes\", \"no\", \"maybe\", \"no way\"]"},
};

static void t_mask_bruteforce(void) {
    size_t words = lilac_cvocab_mask_words(g_voc);
    int32_t n = lilac_cvocab_size(g_voc);
    uint64_t *m1 = xmalloc(words * 8), *m2 = xmalloc(words * 8), *m3 = xmalloc(words * 8);
    int32_t *buf = xmalloc((size_t)n * 2 * sizeof *buf);
    int states = getenv("CONSTRAIN_STATES") ? atoi(getenv("CONSTRAIN_STATES")) : 5;
    int checked = 0;
    for (size_t gi = 0; gi < sizeof BF_GRAMMARS / sizeof *BF_GRAMMARS; gi++) {
        lilac_err err;
        lilac_grammar *g = compile_kind(BF_GRAMMARS[gi][0], BF_GRAMMARS[gi][1], strlen(BF_GRAMMARS[gi][1]), &err);
        CHECKF(g != NULL, "%s: %s", BF_GRAMMARS[gi][1], err.msg);
        if (!g) continue;
        rng_s = 1234567 + gi;
        for (int walk = 0; walk < 2; walk++) {
            lilac_matcher *m = lilac_matcher_new(g, g_voc, &err);
            int at = 0;
            for (int step = 0; step < 40 && !lilac_matcher_is_done(m); step++) {
                bool check = step < 2 || (rnd() % 6 == 0 && at < states);
                lilac_matcher_fill_mask(m, m1);
                if (check) {
                    at++;
                    checked++;
                    cg_matcher_mask_uncached(m, m2);
                    brute_mask(m, m3);
                    int32_t f;
                    int d = mask_diff(m1, m3, &f);
                    size_t l = 0;
                    const uint8_t *b = f >= 0 ? lilac_tok_bytes(g_tok, f, &l) : NULL;
                    CHECKF(d == 0, "grammar %zu step %d: %d tokens differ from brute force, first %d '%.*s' (mask %d)",
                           gi, step, d, f, (int)l, b ? (const char *)b : "", f >= 0 ? (int)(m1[f >> 6] >> (f & 63) & 1) : -1);
                    CHECKF(mask_diff(m2, m3, &f) == 0, "grammar %zu step %d: uncached mask differs", gi, step);
                }
                int32_t t = pick(m1, n, buf, 0.3);
                CHECKF(t >= 0, "grammar %zu step %d: nothing allowed", gi, step);
                if (t < 0) break;
                CHECKF(lilac_matcher_accept(m, t) == 0, "grammar %zu: allowed token %d refused", gi, t);
            }
            lilac_matcher_free(m);
        }
        lilac_grammar_free(g);
    }
    CHECK(checked >= 20);
    printf("     %d states checked against brute force\n", checked);
    free(m1), free(m2), free(m3), free(buf);
}

/* ---- Matcher basics ------------------------------------------------------------------ */

static int acc_str(lilac_matcher *m, const char *s) { return lilac_matcher_accept_bytes(m, (const uint8_t *)s, strlen(s)); }

static bool full_match(lilac_grammar *g, const char *s) {
    lilac_err err;
    lilac_matcher *m = lilac_matcher_new(g, g_voc, &err);
    bool ok = acc_str(m, s) == 0 && lilac_matcher_can_end(m);
    lilac_matcher_free(m);
    return ok;
}

static void t_gbnf_basic(void) {
    lilac_err err;
    const char *src = "# a comment\nroot ::= \"a\" [b-d]+ (\"x\" | \"yz\")? tail\n"
                      "tail ::= \"\" | \"!\" [^\\n]{2,3}\n  | \"\\u00e9\"\n";
    lilac_grammar *g = lilac_grammar_from_gbnf(src, strlen(src), &err);
    CHECKF(g != NULL, "%s", err.msg);
    if (!g) return;
    CHECK(full_match(g, "ab"));
    CHECK(full_match(g, "abcdx"));
    CHECK(full_match(g, "abyz!ab"));
    CHECK(full_match(g, "ab!\xc3\xa9z"));
    CHECK(full_match(g, "abd\xc3\xa9"));
    CHECK(!full_match(g, "a"));
    CHECK(!full_match(g, "abx!a"));
    CHECK(!full_match(g, "abx!abcd"));
    CHECK(!full_match(g, "abe"));
    CHECK(!full_match(g, "ab!\na"));
    lilac_matcher *m = lilac_matcher_new(g, g_voc, &err);
    CHECK(acc_str(m, "ab!\xc3") == 0); /* half a character is a valid prefix */
    CHECK(!lilac_matcher_can_end(m));
    CHECK(acc_str(m, "\x28") != 0); /* not a continuation byte */
    lilac_matcher_free(m);
    lilac_grammar_free(g);
}

static void t_gbnf_errors(void) {
    lilac_err err;
    struct {
        const char *src, *frag1, *frag2;
    } cases[] = {
        {"root ::= foo\n", "never defined", "foo"},
        {"root ::= root \"a\" | \"b\"\n", "left recursion", "root"},
        {"root ::= x | \"c\"\nx ::= y? root \"a\"\ny ::= \"b\"\n", "left recursion", ""},
        {"root ::= \"abc\n", "unterminated", "1:10"},
        {"root ::= \"a\"\n\nx ::= [a-\n", "3:", "class"},
        {"a ::= \"x\"\n", "no 'root' rule", ""},
        {"root ::= \"a\"{3,2}\n", "out of order", "1:"},
        {"root ::= \"a\"{99999}\n", "repetition bound", ""},
        {"root ::= \"a\" root\n", "derives no finite text", "root"},
        {"root ::= (\"a\"\n", "unclosed", "1:10"},
        {"root ::= \"\\q\"\n", "unknown escape", "1:11"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", "defined twice", "2:1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        err.msg[0] = 0;
        lilac_grammar *g = lilac_grammar_from_gbnf(cases[i].src, strlen(cases[i].src), &err);
        CHECK_FAIL_MSG(g == NULL, err, cases[i].frag1, cases[i].frag2);
        lilac_grammar_free(g);
    }
}

static void t_regex(void) {
    lilac_err err;
    struct {
        const char *re, *yes[4], *no[4];
    } cases[] = {
        {"^\\d{3}-\\d{4}$", {"555-1234", NULL}, {"5551234", "555-123", "555-12345", NULL}},
        {"(?:ab|cd)+e?", {"ab", "cdabe", "abcdab", NULL}, {"", "abc", "e", NULL}},
        {"[^a-c\\s]x*", {"dxx", "\xc3\xa9", "Z", NULL}, {"a", " ", "bx", NULL}},
        {"\\w+\\.\\w{2,}", {"a.bc", "foo_1.com", NULL}, {"a.b", ".com", "a b.cc", NULL}},
        {"a.c", {"abc", "a\xe2\x82\xac" "c", NULL}, {"a\nc", "ac", NULL}},
        {"(?<year>[0-9]{4})-[01]\\d", {"2024-12", NULL}, {"2024-2", NULL}},
        {"\\u00e9|\\x41|[\\u{1F600}-\\u{1F64F}]", {"\xc3\xa9", "A", "\xf0\x9f\x98\x80", NULL}, {"a", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        lilac_grammar *g = lilac_grammar_from_regex(cases[i].re, strlen(cases[i].re), &err);
        CHECKF(g != NULL, "%s: %s", cases[i].re, err.msg);
        if (!g) continue;
        for (int k = 0; cases[i].yes[k]; k++) CHECKF(full_match(g, cases[i].yes[k]), "/%s/ '%s'", cases[i].re, cases[i].yes[k]);
        for (int k = 0; cases[i].no[k]; k++) CHECKF(!full_match(g, cases[i].no[k]), "/%s/ !'%s'", cases[i].re, cases[i].no[k]);
        lilac_grammar_free(g);
    }
    struct {
        const char *re, *frag;
    } bad[] = {{"a(?=b)", "lookaround"}, {"(a)\\1", "backreference"}, {"a\\b", "word boundaries"},
               {"[z-a]", "out of order"}, {"(ab", "unclosed"}, {"ab)", "unmatched"}, {"*a", "nothing to repeat"},
               {"a{2,1}", "out of order"}, {"a^b", "anchor"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        lilac_grammar *g = lilac_grammar_from_regex(bad[i].re, strlen(bad[i].re), &err);
        CHECK_FAIL_MSG(g == NULL, err, bad[i].frag, "offset");
        lilac_grammar_free(g);
    }
}

static void t_schema_errors(void) {
    lilac_err err;
    struct {
        const char *s, *frag1, *frag2;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"array\",\"uniqueItems\":true}}}", "$.properties.x.uniqueItems", "not supported"},
        {"{\"type\":\"strin\"}", "$.type", "unknown type 'strin'"},
        {"{\"$ref\":\"#/$defs/missing\"}", "$.$ref", "points to nothing"},
        {"{\"type\":\"object\"", "invalid JSON", "line 1"},
        {"{\"properties\":{\"n\":{\"type\":\"number\",\"multipleOf\":3}}}", "$.properties.n.multipleOf", "multipleOf"},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"not\":{}}]}", "$.anyOf[1].not", "not supported"},
        {"{\"type\":\"object\",\"required\":[\"a\"]}", "$.required[0]", "'a'"},
        {"{\"$defs\":{\"a\":{\"type\":\"integer\",\"minimum\":5,\"maximum\":2}},\"$ref\":\"#/$defs/a\"}", "$.$defs.a", "no integer"},
        {"{\"type\":\"string\",\"pattern\":\"(?!x)\"}", "$.pattern", "lookaround"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "$.$ref", "only references inside"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":1}", "$", "maxItems below minItems"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"frobnicate\":1}}}", "$.properties.a.frobnicate", "not supported"},
        {"false", "$", "matches nothing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        err.msg[0] = 0;
        lilac_grammar *g = lilac_grammar_from_schema(cases[i].s, strlen(cases[i].s), NULL, &err);
        CHECK_FAIL_MSG(g == NULL, err, cases[i].frag1, cases[i].frag2);
        lilac_grammar_free(g);
    }
}

/* Pathological inputs are refused or compile within the limits. */
static void t_pathological(void) {
    lilac_err err;
    /* deep nesting */
    size_t cap = 64 * 1024;
    char *s = xmalloc(cap);
    size_t n = 0;
    for (int i = 0; i < 200; i++) n += (size_t)snprintf(s + n, cap - n, "{\"type\":\"array\",\"items\":");
    n += (size_t)snprintf(s + n, cap - n, "{\"type\":\"integer\"}");
    for (int i = 0; i < 200; i++) s[n++] = '}';
    s[n] = 0;
    lilac_grammar *g = lilac_grammar_from_schema(s, n, NULL, &err);
    CHECK_FAIL_MSG(g == NULL, err, "64 levels");
    lilac_grammar_free(g);
    /* a huge enum */
    free(s);
    cap = 40000 * 12;
    s = xmalloc(cap);
    n = (size_t)snprintf(s, cap, "{\"enum\":[");
    for (int i = 0; i < 30000; i++) n += (size_t)snprintf(s + n, cap - n, "%s\"v%d\"", i ? "," : "", i);
    n += (size_t)snprintf(s + n, cap - n, "]}");
    g = lilac_grammar_from_schema(s, n, NULL, &err);
    CHECK_FAIL_MSG(g == NULL, err, "$.enum", "30000 values");
    lilac_grammar_free(g);
    /* a large enum that is allowed compiles as a trie: one live stack */
    n = (size_t)snprintf(s, cap, "{\"enum\":[");
    for (int i = 0; i < 5000; i++) n += (size_t)snprintf(s + n, cap - n, "%s\"v%d\"", i ? "," : "", i);
    n += (size_t)snprintf(s + n, cap - n, "]}");
    g = lilac_grammar_from_schema(s, n, NULL, &err);
    CHECKF(g != NULL, "%s", err.msg);
    if (g) {
        CHECK(full_match(g, "\"v4999\""));
        CHECK(!full_match(g, "\"v5000\""));
        lilac_grammar_free(g);
    }
    free(s);
    /* exponential-looking regexes: nested bounded repeats refused by size, ambiguity handled */
    const char *re1 = "((a{100}){100}){100}";
    g = lilac_grammar_from_regex(re1, strlen(re1), &err);
    CHECK_FAIL_MSG(g == NULL, err, "too large");
    lilac_grammar_free(g);
    const char *re2 = "(a|a|aa)*(a*)*b";
    g = lilac_grammar_from_regex(re2, strlen(re2), &err);
    CHECKF(g != NULL, "%s", err.msg);
    if (g) {
        char buf[300];
        memset(buf, 'a', 200);
        buf[200] = 'b';
        buf[201] = 0;
        CHECK(full_match(g, buf));
        buf[200] = 0;
        CHECK(!full_match(g, buf) );
        lilac_grammar_free(g);
    }
    const char *gb = "root ::= x{5000}\nx ::= \"a\"{5000}\n";
    g = lilac_grammar_from_gbnf(gb, strlen(gb), &err);
    CHECKF(g != NULL, "%s", err.msg); /* a rule reference repeated: 5000 + 5000 states */
    lilac_grammar_free(g);
    /* exponentially ambiguous: refused with -2 once the parses outgrow the limit, quickly */
    const char *amb = "root ::= \"a\" root | \"a\" root root | \"b\"\n";
    g = lilac_grammar_from_gbnf(amb, strlen(amb), &err);
    CHECKF(g != NULL, "%s", err.msg);
    if (g) {
        lilac_matcher *m = lilac_matcher_new(g, g_voc, &err);
        int rc = 0, k = 0;
        for (; k < 200 && rc == 0; k++) rc = acc_str(m, "a");
        CHECKF(rc == -2, "rc %d after %d bytes", rc, k);
        uint64_t *mask = xmalloc(lilac_cvocab_mask_words(g_voc) * 8);
        lilac_matcher_fill_mask(m, mask);
        for (int32_t i = 0; i < lilac_cvocab_size(g_voc); i++)
            if (mask[i >> 6] >> (i & 63) & 1) {
                int r = lilac_matcher_accept(m, i);
                CHECKF(r != -1, "token %d in the mask is refused", i);
                if (r == 0) lilac_matcher_rollback(m, 1);
            }
        free(mask);
        lilac_matcher_free(m);
        lilac_grammar_free(g);
    }
    const char *gb2 = "root ::= (\"a\"{5000}){5000}\n";
    g = lilac_grammar_from_gbnf(gb2, strlen(gb2), &err);
    CHECK_FAIL_MSG(g == NULL, err, "too large");
    lilac_grammar_free(g);
}

static void t_int_ranges(void) {
    struct {
        double lo, hi;
        int xlo, xhi;
        const char *schema;
    } cases[] = {
        {-37, 121, 0, 0, "{\"type\":\"integer\",\"minimum\":-37,\"maximum\":121}"},
        {0, 1e300, 0, 0, "{\"type\":\"integer\",\"minimum\":0}"},
        {-1e300, -5, 0, 1, "{\"type\":\"integer\",\"exclusiveMaximum\":-5}"},
        {10, 99.5, 1, 0, "{\"type\":\"integer\",\"exclusiveMinimum\":10,\"maximum\":99.5}"},
        {-2.5, 3.25, 0, 0, "{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":3.25}"},
        {0, 1, 1, 1, "{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}"},
    };
    lilac_err err;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        lilac_grammar *g = lilac_grammar_from_schema(cases[i].schema, strlen(cases[i].schema), NULL, &err);
        CHECKF(g != NULL, "%s", err.msg);
        if (!g) continue;
        int bad = 0, good = 0;
        for (int k = -300; k <= 300; k++) {
            for (int f = 0; f < 4; f++) {
                char buf[64];
                static const char *fr[] = {"", ".5", ".0", ".99"};
                snprintf(buf, sizeof buf, "%s%d%s", k < 0 ? "-" : "", abs(k), fr[f]);
                double x = atof(buf);
                bool in = (cases[i].xlo ? x > cases[i].lo : x >= cases[i].lo) && (cases[i].xhi ? x < cases[i].hi : x <= cases[i].hi);
                bool m = full_match(g, buf);
                if (m && !in) bad++;
                good += m;
                if (m && !in) fprintf(stderr, "  %s accepts %s\n", cases[i].schema, buf);
            }
        }
        CHECKF(bad == 0, "%s: %d values outside the bounds accepted", cases[i].schema, bad);
        CHECKF(good > 0, "%s: nothing accepted", cases[i].schema);
        lilac_grammar_free(g);
    }
}

static void t_eos_rollback_clone(void) {
    lilac_err err;
    const char *sch = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}";
    lilac_grammar *g = lilac_grammar_from_schema(sch, strlen(sch), NULL, &err);
    CHECKF(g != NULL, "%s", err.msg);
    if (!g) return;
    size_t words = lilac_cvocab_mask_words(g_voc);
    uint64_t *m1 = xmalloc(words * 8), *m2 = xmalloc(words * 8);
    lilac_matcher *m = lilac_matcher_new(g, g_voc, &err);
    lilac_ids ids = {0};
    CHECK(lilac_tok_encode(g_tok, "{\"a\": 12}", 9, LILAC_TOK_PLAIN, &ids, &err) == 0);
    lilac_matcher_fill_mask(m, m1);
    CHECK(!(m1[g_eos[0] >> 6] >> (g_eos[0] & 63) & 1));
    CHECK(lilac_matcher_accept(m, g_eos[0]) != 0);
    for (size_t i = 0; i + 1 < ids.n; i++) CHECK(lilac_matcher_accept(m, ids.ids[i]) == 0);
    lilac_matcher *c = lilac_matcher_clone(m);
    lilac_matcher_fill_mask(m, m1);
    lilac_matcher_fill_mask(c, m2);
    CHECK(!memcmp(m1, m2, words * 8));
    CHECK(!lilac_matcher_can_end(m));
    CHECK(lilac_matcher_accept(m, ids.ids[ids.n - 1]) == 0);
    CHECK(lilac_matcher_can_end(m));
    lilac_matcher_fill_mask(m, m1);
    CHECK(m1[g_eos[1] >> 6] >> (g_eos[1] & 63) & 1);
    CHECK(lilac_matcher_rollback(m, 1) == 0);
    lilac_matcher_fill_mask(m, m1);
    CHECK(!memcmp(m1, m2, words * 8));
    CHECK(lilac_matcher_accept(m, ids.ids[ids.n - 1]) == 0);
    CHECK(lilac_matcher_accept(m, g_eos[1]) == 0);
    CHECK(lilac_matcher_is_done(m));
    lilac_matcher_fill_mask(m, m1);
    size_t pop = 0;
    for (size_t w = 0; w < words; w++) pop += (size_t)__builtin_popcountll(m1[w]);
    CHECK(pop == 0);
    CHECK(lilac_matcher_rollback(m, (int)ids.n + 1) == 0);
    CHECK(lilac_matcher_rollback(m, 1) != 0);
    lilac_matcher_fill_mask(m, m2);
    lilac_matcher_reset(c);
    lilac_matcher_fill_mask(c, m1);
    CHECK(!memcmp(m1, m2, words * 8));
    lilac_matcher_free(c);
    lilac_matcher_free(m);
    lilac_ids_free(&ids);
    free(m1), free(m2);
    /* the cache gives the same compiled grammar for the same text */
    lilac_gcache *gc = lilac_gcache_new(4);
    lilac_grammar *a = lilac_gcache_get(gc, LILAC_GRAMMAR_SCHEMA, sch, strlen(sch), NULL, &err);
    lilac_grammar *b = lilac_gcache_get(gc, LILAC_GRAMMAR_SCHEMA, sch, strlen(sch), NULL, &err);
    lilac_grammar *d = lilac_gcache_get(gc, LILAC_GRAMMAR_REGEX, sch, 5, NULL, &err);
    CHECK(a && a == b && d && d != a);
    lilac_grammar_free(a), lilac_grammar_free(b), lilac_grammar_free(d);
    lilac_gcache_free(gc);
    lilac_grammar_free(g);
}

static void t_schema_alts(void) {
    lilac_err err;
    const char *w = "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}";
    const char *t = "{\"type\":\"object\",\"properties\":{\"tz\":{\"enum\":[\"UTC\",\"CET\"]}},\"required\":[\"tz\"]}";
    lilac_schema_alt alts[2] = {
        {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ", w, strlen(w), "}\n</tool_call>"},
        {"<tool_call>\n{\"name\": \"get_time\", \"arguments\": ", t, strlen(t), "}\n</tool_call>"},
    };
    lilac_grammar *g = lilac_grammar_from_schema_alts(alts, 2, NULL, &err);
    CHECKF(g != NULL, "%s", err.msg);
    if (g) {
        CHECK(full_match(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"));
        CHECK(full_match(g, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\":\"CET\"}}\n</tool_call>"));
        CHECK(!full_match(g, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"));
        CHECK(!full_match(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"));
        /* the tool-call tag is one added token of the vocabulary, allowed as such */
        lilac_matcher *m = lilac_matcher_new(g, g_voc, &err);
        CHECK(lilac_matcher_accept(m, lilac_tok_added_id(g_tok, "<tool_call>")) == 0);
        lilac_matcher_free(m);
        lilac_grammar_free(g);
    }
    alts[1].schema = "{\"type\":\"object\",\"properties\":{\"tz\":{\"type\":\"strng\"}}}";
    alts[1].schema_len = strlen(alts[1].schema);
    g = lilac_grammar_from_schema_alts(alts, 2, NULL, &err);
    CHECK_FAIL_MSG(g == NULL, err, "schema 1 $.properties.tz.type", "strng");
    lilac_grammar_free(g);
}

/* ---- Modes for tests/constrain ----------------------------------------------------------- */

static char *slurp(const char *path, size_t *len) {
    lilac_err err;
    char *t = lilac_read_file(path, len, &err);
    if (!t) {
        fprintf(stderr, "%s\n", err.msg);
        exit(2);
    }
    return t;
}

static int mode_compile(const char *kind, const char *path) {
    size_t len;
    char *text = slurp(path, &len);
    lilac_err err;
    lilac_grammar *g = compile_kind(kind, text, len, &err);
    json_t *o = json_object();
    if (g) json_object_set_new(o, "ok", json_true());
    else json_object_set_new(o, "error", json_string(err.msg));
    char *d = json_dumps(o, JSON_COMPACT);
    printf("%s\n", d);
    free(d);
    json_decref(o);
    lilac_grammar_free(g);
    free(text);
    return 0;
}

/* n random completions of g as a JSON array of {hex, ended, steps[, problem]}. */
static json_t *sample_grammar(lilac_grammar *g, int n, int max_tok) {
    lilac_err err;
    int32_t nv = lilac_cvocab_size(g_voc);
    uint64_t *mask = xmalloc(lilac_cvocab_mask_words(g_voc) * 8);
    int32_t *buf = xmalloc((size_t)nv * 2 * sizeof *buf);
    json_t *arr = json_array();
    for (int k = 0; k < n; k++) {
        lilac_matcher *m = lilac_matcher_new(g, g_voc, &err);
        uint8_t *out = xmalloc((size_t)max_tok * 300 + 1);
        size_t on = 0;
        bool ended = false;
        const char *problem = NULL;
        int steps = 0;
        for (; steps < max_tok; steps++) {
            lilac_matcher_fill_mask(m, mask);
            /* late in the budget, lean harder on closing */
            int32_t t = pick(mask, nv, buf, steps > max_tok / 3 ? 0.9 : 0.4);
            if (t < 0) {
                problem = "no token allowed before the end";
                break;
            }
            if (lilac_matcher_accept(m, t) != 0) {
                problem = "an allowed token was refused";
                break;
            }
            if (is_eos(t)) {
                ended = true;
                break;
            }
            size_t l;
            const uint8_t *b = lilac_tok_bytes(g_tok, t, &l);
            memcpy(out + on, b, l);
            on += l;
        }
        json_t *o = json_object();
        char *hex = xmalloc(on * 2 + 1);
        for (size_t i = 0; i < on; i++) snprintf(hex + 2 * i, 3, "%02x", out[i]);
        hex[2 * on] = 0;
        json_object_set_new(o, "hex", json_string(hex));
        json_object_set_new(o, "ended", json_boolean(ended));
        json_object_set_new(o, "steps", json_integer(steps));
        if (problem) json_object_set_new(o, "problem", json_string(problem));
        json_array_append_new(arr, o);
        free(hex), free(out);
        lilac_matcher_free(m);
    }
    free(mask), free(buf);
    return arr;
}

static void print_json(json_t *o) {
    char *d = json_dumps(o, JSON_COMPACT);
    printf("%s\n", d);
    fflush(stdout);
    free(d);
    json_decref(o);
}

static int mode_sample(const char *kind, const char *path, int n, uint64_t seed, int max_tok) {
    size_t len;
    char *text = slurp(path, &len);
    lilac_err err;
    lilac_grammar *g = compile_kind(kind, text, len, &err);
    free(text);
    json_t *o = json_object();
    if (!g) json_object_set_new(o, "error", json_string(err.msg));
    else {
        rng_s = seed * 0x9e3779b97f4a7c15ull + 1;
        json_object_set_new(o, "samples", sample_grammar(g, n, max_tok));
    }
    print_json(o);
    lilac_grammar_free(g);
    return 0;
}

/* One case per input line {"kind", "text"}: one output line {"error"} or {"samples"}. */
static int mode_batch(const char *path, int n, uint64_t seed, int max_tok) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int idx = 0;
    while ((got = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *c = json_loadb(line, (size_t)got, 0, &je);
        json_t *o = json_object();
        if (!c || !json_is_string(json_object_get(c, "kind")) || !json_is_string(json_object_get(c, "text"))) {
            json_object_set_new(o, "error", json_string("bad input line"));
        } else {
            lilac_err err;
            json_t *t = json_object_get(c, "text");
            lilac_grammar *g = compile_kind(json_string_value(json_object_get(c, "kind")), json_string_value(t),
                                            json_string_length(t), &err);
            if (!g) json_object_set_new(o, "error", json_string(err.msg));
            else {
                rng_s = (seed + (uint64_t)idx) * 0x9e3779b97f4a7c15ull + 1;
                json_object_set_new(o, "samples", sample_grammar(g, n, max_tok));
                json_object_set_new(o, "nodes", json_integer((json_int_t)lilac_grammar_n_nodes(g)));
            }
            lilac_grammar_free(g);
        }
        json_decref(c);
        print_json(o);
        idx++;
    }
    free(line);
    fclose(f);
    return 0;
}

/* A random walk that prints, at `states` random steps, the text so far and
 * the mask: {"prefix": hex, "mask": hex of the bitset's bytes (token i is bit
 * i%8 of byte i/8)}. tests/constrain checks them with acceptors of its own. */
static int mode_masks(const char *kind, const char *path, uint64_t seed, int states) {
    size_t len;
    char *text = slurp(path, &len);
    lilac_err err;
    lilac_grammar *g = compile_kind(kind, text, len, &err);
    free(text);
    if (!g) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int32_t nv = lilac_cvocab_size(g_voc);
    size_t words = lilac_cvocab_mask_words(g_voc);
    uint64_t *mask = xmalloc(words * 8);
    int32_t *buf = xmalloc((size_t)nv * 2 * sizeof *buf);
    uint8_t *out = xmalloc(1 << 16);
    char *hex = xmalloc(words * 16 + (1 << 17) + 1);
    size_t on = 0;
    rng_s = seed * 0x9e3779b97f4a7c15ull + 1;
    lilac_matcher *m = lilac_matcher_new(g, g_voc, &err);
    for (int step = 0, shown = 0; shown < states && step < 400; step++) {
        lilac_matcher_fill_mask(m, mask);
        if (step < 2 || rnd() % 3 == 0) {
            shown++;
            json_t *o = json_object();
            for (size_t i = 0; i < on; i++) snprintf(hex + 2 * i, 3, "%02x", out[i]);
            hex[2 * on] = 0;
            json_object_set_new(o, "prefix", json_string(hex));
            for (size_t i = 0; i < words * 8; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned)(mask[i / 8] >> (8 * (i % 8)) & 255));
            hex[words * 16] = 0;
            json_object_set_new(o, "mask", json_string(hex));
            print_json(o);
        }
        int32_t t = pick(mask, nv, buf, 0.3);
        if (t < 0 || is_eos(t) || lilac_matcher_accept(m, t)) {
            lilac_matcher_reset(m);
            on = 0;
            continue;
        }
        size_t l;
        const uint8_t *b = lilac_tok_bytes(g_tok, t, &l);
        if (on + l >= (1 << 16)) {
            lilac_matcher_reset(m);
            on = 0;
            continue;
        }
        memcpy(out + on, b, l);
        on += l;
    }
    lilac_matcher_free(m);
    lilac_grammar_free(g);
    free(mask), free(buf), free(out), free(hex);
    return 0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *v, int n, double q) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[(int)(q * (n - 1))];
}

/* Mask cost per step (medians; figures, no checks). Each schema is walked
 * along a realistic document (tokenized by the Qwen tokenizer) and along
 * random completions: "first visit" is the first pass over a new grammar,
 * when the token tables of each position are built; "tables" is a step
 * computed from the tables with the per-state cache bypassed (the cost of a
 * state never seen before); "cached" is a repeated state. */
static int mode_bench(int reps) {
    static const char *cases[][2] = {
        {("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
          "\"email\":{\"type\":\"string\",\"pattern\":\"[a-z0-9.]+@[a-z]+\\\\.com\"},\"tags\":{\"type\":\"array\","
          "\"items\":{\"type\":\"string\"},\"maxItems\":5},\"address\":{\"type\":\"object\",\"properties\":{"
          "\"street\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\",\"pattern\":\"[0-9]{5}\"}},\"required\":[\"street\"]}},"
          "\"required\":[\"name\",\"age\"]}"),
         ("{\"name\": \"Alice Smith\", \"age\": 31, \"email\": \"alice.smith@example.com\", \"tags\": [\"admin\", \"dev\"], "
          "\"address\": {\"street\": \"12 Main St\", \"zip\": \"94110\"}}")},
        {"{\"type\":\"object\"}",
         ("{\n  \"title\": \"Quarterly report\",\n  \"items\": [1, 2.5, true, null, {\"k\": \"v\"}],\n  \"note\": "
          "\"All figures are in euros; see the appendix.\"\n}")},
        {("{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},"
          "\"score\":{\"type\":\"number\"},\"label\":{\"enum\":[\"cat\",\"dog\",\"bird\"]}},\"required\":[\"id\",\"score\",\"label\"]}}"),
         ("[\n  {\n    \"id\": 1,\n    \"score\": 0.93,\n    \"label\": \"cat\"\n  },\n  {\n    \"id\": 2,\n    \"score\": 0.41,\n"
          "    \"label\": \"dog\"\n  }\n]")},
    };
    int32_t nv = lilac_cvocab_size(g_voc);
    uint64_t *mask = xmalloc(lilac_cvocab_mask_words(g_voc) * 8);
    int32_t *buf = xmalloc((size_t)nv * 2 * sizeof *buf);
    for (size_t si = 0; si < sizeof cases / sizeof *cases; si++) {
        lilac_err err;
        double t0 = lilac_now();
        lilac_grammar *g = lilac_grammar_from_schema(cases[si][0], strlen(cases[si][0]), NULL, &err);
        double t_comp = lilac_now() - t0;
        if (!g) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        lilac_ids ids = {0};
        if (lilac_tok_encode(g_tok, cases[si][1], strlen(cases[si][1]), LILAC_TOK_PLAIN, &ids, &err)) return 1;
        int n = (int)ids.n;
        double *tab = xmalloc((size_t)n * reps * sizeof *tab), *cach = xmalloc((size_t)n * reps * sizeof *cach);
        lilac_matcher *m = lilac_matcher_new(g, g_voc, &err);
        /* first pass: tables built on first visit */
        double cold = lilac_now();
        for (int i = 0; i < n; i++) {
            lilac_matcher_fill_mask(m, mask);
            if (!(mask[ids.ids[i] >> 6] >> (ids.ids[i] & 63) & 1) || lilac_matcher_accept(m, ids.ids[i])) {
                fprintf(stderr, "bench: document %zu refused at token %d\n", si, i);
                return 1;
            }
        }
        cold = lilac_now() - cold;
        int k = 0;
        lilac_matcher_reset(m);
        for (int i = 0; i < n; i++) { /* tables of states the cache answered in the first pass */
            cg_matcher_mask_uncached(m, mask);
            lilac_matcher_accept(m, ids.ids[i]);
        }
        for (int r = 0; r < reps; r++) {
            lilac_matcher_reset(m);
            for (int i = 0; i < n; i++, k++) {
                double a = lilac_now();
                cg_matcher_mask_uncached(m, mask);
                double b = lilac_now();
                lilac_matcher_fill_mask(m, mask);
                double c = lilac_now();
                tab[k] = b - a, cach[k] = c - b;
                lilac_matcher_accept(m, ids.ids[i]);
            }
        }
        double mt = median_of(tab, k, 0.5), p90 = median_of(tab, k, 0.9), mx = median_of(tab, k, 1.0);
        double mc = median_of(cach, k, 0.5);
        printf("schema %zu (%zu nodes, compile %.2f ms), document of %d tokens: first visit %.1f ms in all; "
               "from tables median %.1f us, p90 %.1f, max %.1f; cached median %.2f us\n",
               si, lilac_grammar_n_nodes(g), t_comp * 1e3, n, cold * 1e3, mt * 1e6, p90 * 1e6, mx * 1e6, mc * 1e6);
        /* random completions */
        int steps = 300;
        double *rt = xmalloc((size_t)steps * sizeof *rt);
        rng_s = 42 + si;
        lilac_matcher_reset(m);
        for (int i = 0; i < steps; i++) {
            if (lilac_matcher_is_done(m)) lilac_matcher_reset(m);
            cg_matcher_mask_uncached(m, mask); /* builds the tables on a first visit */
            double a = lilac_now();
            cg_matcher_mask_uncached(m, mask);
            rt[i] = lilac_now() - a;
            int32_t t = pick(mask, nv, buf, 0.5);
            if (t < 0 || lilac_matcher_accept(m, t)) lilac_matcher_reset(m);
        }
        printf("    random completions, %d steps: from tables median %.1f us, p90 %.1f, max %.1f\n", steps,
               median_of(rt, steps, 0.5) * 1e6, median_of(rt, steps, 0.9) * 1e6, median_of(rt, steps, 1.0) * 1e6);
        free(rt), free(tab), free(cach);
        lilac_ids_free(&ids);
        lilac_matcher_free(m);
        lilac_grammar_free(g);
    }
    free(mask), free(buf);
    return 0;
}

int main(int argc, char **argv) {
    setup();
    int rc;
    if (argc >= 4 && !strcmp(argv[1], "compile")) rc = mode_compile(argv[2], argv[3]);
    else if (argc >= 7 && !strcmp(argv[1], "sample"))
        rc = mode_sample(argv[2], argv[3], atoi(argv[4]), (uint64_t)strtoull(argv[5], NULL, 10), atoi(argv[6]));
    else if (argc >= 6 && !strcmp(argv[1], "batch"))
        rc = mode_batch(argv[2], atoi(argv[3]), (uint64_t)strtoull(argv[4], NULL, 10), atoi(argv[5]));
    else if (argc >= 7 && !strcmp(argv[1], "masks")) {
        g_max_ws = atoi(argv[6]);
        rc = mode_masks(argv[2], argv[3], (uint64_t)strtoull(argv[4], NULL, 10), atoi(argv[5]));
    } else if (argc >= 2 && !strcmp(argv[1], "bench")) rc = mode_bench(argc >= 3 ? atoi(argv[2]) : 5);
    else {
        TEST(t_gbnf_basic);
        TEST(t_gbnf_errors);
        TEST(t_regex);
        TEST(t_schema_errors);
        TEST(t_pathological);
        TEST(t_int_ranges);
        TEST(t_eos_rollback_clone);
        TEST(t_schema_alts);
        TEST(t_mask_bruteforce);
        rc = check_summary();
    }
    lilac_cvocab_free(g_voc);
    lilac_tok_free(g_tok);
    return rc;
}
