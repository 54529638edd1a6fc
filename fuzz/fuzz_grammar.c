/* fuzz_grammar.c — libFuzzer target for the constraint engine's front ends and
 * matcher. The first byte picks the front end (GBNF, regex, choice list), the
 * rest is its text; fuzz_schema.c reuses this file for JSON Schemas. A grammar
 * that compiles is walked with a small vocabulary (every byte, some longer
 * tokens, an end token): at each step the mask must equal the brute-force set
 * (every token tried on the matcher), a chosen token must be accepted, and a
 * JSON Schema's finished text must parse as JSON. An error must be one line.
 * The library sources are compiled in (the Makefile's fuzz rule links only
 * src/model and src/util). Any crash, leak, UB or broken invariant aborts. */
#include <jansson.h>

#include "constrain/compile.c"
#include "constrain/gbnf.c"
#include "constrain/grammar.c"
#include "constrain/mask.c"
#include "constrain/regex.c"
#include "constrain/schema.c"
#include "tokenizer/unicode.c"
#include "tokenizer/load.c"
#include "tokenizer/bpe.c"
#include "tokenizer/encode.c"

#define REQUIRE(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s\n", #c); abort(); } } while (0)

static const char *const EXTRA[] = {"{\"", "\":", "\",", "true", "false", "null", "  ", "\n", "12", ".5", "\"}", "}]",
                                    "\xc3\xa9", "\xe4\xbd", "\xa0", "ab", "abc", "::=", "\\\"", "\\u00", "[\"", "-1", "e+"};
enum { N_EXTRA = sizeof EXTRA / sizeof *EXTRA, N_VOC = 256 + N_EXTRA + 1, EOS_ID = N_VOC - 1 };

static lilac_cvocab *fuzz_vocab(void) {
    static lilac_cvocab *v;
    if (!v) {
        static uint8_t single[256];
        const uint8_t *bytes[N_VOC];
        size_t lens[N_VOC];
        for (int i = 0; i < 256; i++) single[i] = (uint8_t)i, bytes[i] = single + i, lens[i] = 1;
        for (int i = 0; i < N_EXTRA; i++) bytes[256 + i] = (const uint8_t *)EXTRA[i], lens[256 + i] = strlen(EXTRA[i]);
        bytes[EOS_ID] = NULL, lens[EOS_ID] = 0;
        int32_t eos = EOS_ID;
        lilac_err err;
        v = lilac_cvocab_new_raw(N_VOC, bytes, lens, &eos, 1, &err);
        REQUIRE(v != NULL);
    }
    return v;
}

static void walk(lilac_grammar *g, const uint8_t *rnd, size_t nrnd, bool json) {
    lilac_cvocab *v = fuzz_vocab();
    lilac_err err;
    lilac_matcher *m = lilac_matcher_new(g, v, &err);
    REQUIRE(m != NULL);
    uint64_t mask[(N_VOC + 63) / 64], ref[(N_VOC + 63) / 64];
    char out[4096];
    size_t on = 0;
    bool ended = false;
    for (int step = 0; step < 64; step++) {
        lilac_matcher_fill_mask(m, mask);
        memset(ref, 0, sizeof ref);
        int32_t allowed[N_VOC], na = 0;
        for (int32_t i = 0; i < N_VOC; i++)
            if (lilac_matcher_accept(m, i) == 0) {
                ref[i >> 6] |= 1ull << (i & 63);
                allowed[na++] = i;
                REQUIRE(lilac_matcher_rollback(m, 1) == 0);
            }
        REQUIRE(!memcmp(mask, ref, sizeof mask));
        if (na == 0) {
            REQUIRE(lilac_matcher_is_done(m));
            break;
        }
        int32_t t = allowed[(nrnd ? rnd[step % nrnd] : 0) % (uint32_t)na];
        REQUIRE(lilac_matcher_accept(m, t) == 0);
        if (t == EOS_ID) {
            ended = true;
            break;
        }
        size_t l;
        const uint8_t *b = v->bytes + v->off[t];
        l = v->len[t];
        if (on + l < sizeof out) memcpy(out + on, b, l), on += l;
    }
    if (ended && json && on < sizeof out - 1) {
        json_error_t je;
        json_t *d = json_loadb(out, on, JSON_DECODE_ANY, &je);
        if (!d) fprintf(stderr, "not JSON: %.*s\n", (int)on, out);
        REQUIRE(d != NULL);
        json_decref(d);
    }
    lilac_matcher *c = lilac_matcher_clone(m);
    lilac_matcher_free(c);
    lilac_matcher_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
#ifdef FUZZ_SCHEMA
    int kind = LILAC_GRAMMAR_SCHEMA;
    const char *s = (const char *)data;
    size_t n = size;
#else
    static const int kinds[] = {LILAC_GRAMMAR_GBNF, LILAC_GRAMMAR_REGEX, LILAC_GRAMMAR_CHOICE};
    int kind = kinds[data[0] % 3];
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
#endif
    lilac_err err;
    err.msg[0] = 0;
    lilac_grammar *g = lilac_grammar_compile(kind, s, n, NULL, &err);
    if (!g) {
        REQUIRE(err.msg[0] != 0 && strchr(err.msg, '\n') == NULL);
        return 0;
    }
    walk(g, data, size, kind == LILAC_GRAMMAR_SCHEMA);
    lilac_grammar_free(g);
    return 0;
}
