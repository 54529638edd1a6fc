/* test_tokenizer.c — unit tests of src/tokenizer: UTF-8 helpers, a small
 * hand-made tokenizer.json (merge order, added tokens, masks), the BPE
 * algorithms against each other, streaming detokenisation, and the real Qwen3
 * tokenizer (tests/data) on a few known strings and a long single-letter run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

extern int lilac_tok_bpe_force_;

static const char *QWEN3 = "tests/data/tokenizers/qwen3/tokenizer.json";

/* A tiny byte-level BPE: letters a, b, c, space (Ġ), merges a+b, ab+c, a+a, aa+aa. */
static const char *TINY =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":20,\"content\":\"<|end|>\",\"special\":true,\"normalized\":false},"
    "{\"id\":21,\"content\":\"<x>\",\"special\":false,\"normalized\":false},"
    "{\"id\":22,\"content\":\"<|end|>more\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":{\"type\":\"NFC\"},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
    "\"\\\\s+|[a-z]+|[^a-z\\\\s]+\"},\"behavior\":\"Isolated\",\"invert\":false},"
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"vocab\":{"
    "\"a\":0,\"b\":1,\"c\":2,\"\\u0120\":3,\"ab\":4,\"abc\":5,\"aa\":6,\"aaaa\":7,\"<\":8,\">\":9,\"|\":10,"
    "\"e\":11,\"n\":12,\"d\":13,\"x\":14,\"\\u00c3\":15,\"\\u00a9\":16,\"\\u00c3\\u00a9\":17},"
    "\"merges\":[[\"a\",\"b\"],\"ab c\",[\"a\",\"a\"],[\"aa\",\"aa\"],[\"\\u00c3\",\"\\u00a9\"]]}}";

static lilac_tokenizer *tiny(void) {
    lilac_err err = {{0}};
    lilac_tokenizer *t = lilac_tok_load_mem(TINY, strlen(TINY), &err);
    CHECKF(t != NULL, "%s", err.msg);
    return t;
}

static bool ids_eq(const lilac_ids *v, const int32_t *want, size_t n) {
    if (v->n != n) return false;
    for (size_t i = 0; i < n; i++)
        if (v->ids[i] != want[i]) return false;
    return true;
}

static void print_ids(const char *what, const lilac_ids *v) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < v->n; i++) fprintf(stderr, " %d", v->ids[i]);
    fprintf(stderr, "\n");
}

static void test_utf8_check(void) {
    CHECK(lilac_utf8_check("abc", 3) == 3);
    CHECK(lilac_utf8_check("h\xc3\xa9llo", 6) == 6);
    CHECK(lilac_utf8_check("ab\xff", 3) == 2);
    CHECK(lilac_utf8_check("\xc0\xaf", 2) == 0);         /* overlong */
    CHECK(lilac_utf8_check("\xed\xa0\x80", 3) == 0);     /* surrogate */
    CHECK(lilac_utf8_check("\xf4\x90\x80\x80", 4) == 0); /* > U+10FFFF */
    CHECK(lilac_utf8_check("\xf0\x9f\x98\x80", 4) == 4);
    CHECK(lilac_utf8_check("0123456789abcdef\xe4\xbd", 18) == 16); /* truncated after the fast path */
    size_t n;
    char *s = lilac_utf8_sanitize("a\xffz\xe4\xbd", 5, &n);
    CHECK(n == 8 && !memcmp(s, "a\xef\xbf\xbdz\xef\xbf\xbd", 8));
    free(s);
    s = lilac_utf8_sanitize("\xf0\x9f\x98", 3, &n); /* one maximal subpart -> one U+FFFD */
    CHECK(n == 3 && !memcmp(s, "\xef\xbf\xbd", 3));
    free(s);
}

static void test_tiny_merges(void) {
    lilac_tokenizer *t = tiny();
    if (!t) return;
    lilac_err err = {{0}};
    lilac_ids v = {0};
    /* "abc" -> ab (rank 0) then abc (rank 1) */
    CHECK(lilac_tok_encode(t, "abc", 3, LILAC_TOK_PLAIN, &v, &err) == 0);
    CHECK(ids_eq(&v, (int32_t[]){5}, 1));
    v.n = 0;
    /* "aaaaa": a+a leftmost first -> aa aa a -> aaaa a */
    lilac_tok_encode(t, "aaaaa", 5, LILAC_TOK_PLAIN, &v, &err);
    CHECK(ids_eq(&v, (int32_t[]){7, 0}, 2));
    v.n = 0;
    /* "ab c": regex splits space; space is Ġ */
    lilac_tok_encode(t, "ab c", 4, LILAC_TOK_PLAIN, &v, &err);
    CHECK(ids_eq(&v, (int32_t[]){4, 3, 2}, 3));
    v.n = 0;
    /* NFC: e + U+0301 is not in this vocab, but é (C3 A9) is, and merges to 17 */
    lilac_tok_encode(t, "\xc3\xa9", 2, LILAC_TOK_PLAIN, &v, &err);
    CHECK(ids_eq(&v, (int32_t[]){17}, 1));
    CHECK(lilac_tok_vocab_size(t) == 23);
    CHECK(lilac_tok_added_id(t, "<x>") == 21 && lilac_tok_added_id(t, "<y>") == -1);
    CHECK(lilac_tok_is_special(t, 20) && !lilac_tok_is_special(t, 21) && lilac_tok_is_added(t, 21));
    lilac_ids_free(&v);
    lilac_tok_free(t);
}

static void test_tiny_added(void) {
    lilac_tokenizer *t = tiny();
    if (!t) return;
    lilac_err err = {{0}};
    lilac_ids v = {0};
    const char *s = "ab<|end|>more<x>c";
    CHECK(lilac_tok_encode(t, s, strlen(s), LILAC_TOK_SPECIAL, &v, &err) == 0);
    CHECK(ids_eq(&v, (int32_t[]){4, 22, 21, 2}, 4)); /* longest match wins */
    v.n = 0;
    lilac_tok_encode(t, s, strlen(s), LILAC_TOK_PLAIN, &v, &err);
    CHECK(v.n > 4);
    for (size_t i = 0; i < v.n; i++) CHECK(v.ids[i] < 20);
    /* masked: the first added token lies in a plain range, the second does not */
    v.n = 0;
    lilac_span plain = {2, 11}; /* covers "<|end|>more" */
    lilac_tok_encode_masked(t, s, strlen(s), &plain, 1, &v, &err);
    CHECK(v.n >= 3 && v.ids[v.n - 2] == 21 && v.ids[v.n - 1] == 2);
    for (size_t i = 0; i + 2 < v.n; i++) CHECK(v.ids[i] != 22 && v.ids[i] != 20);
    /* a match that only partly overlaps a plain range is not taken either */
    v.n = 0;
    lilac_span part = {5, 1};
    lilac_tok_encode_masked(t, s, strlen(s), &part, 1, &v, &err);
    for (size_t i = 0; i < v.n; i++) CHECK(v.ids[i] != 22 && v.ids[i] != 20);
    lilac_ids_free(&v);
    lilac_tok_free(t);
}

static void test_tiny_decode(void) {
    lilac_tokenizer *t = tiny();
    if (!t) return;
    size_t n;
    char *s = lilac_tok_decode(t, (int32_t[]){5, 3, 20, 21, 17, 999}, 6, false, &n);
    CHECK(!strcmp(s, "abc <|end|><x>\xc3\xa9"));
    free(s);
    s = lilac_tok_decode(t, (int32_t[]){5, 3, 20, 21, 15}, 5, true, &n);
    CHECK(!strcmp(s, "abc <x>\xef\xbf\xbd")); /* special skipped; lone C3 -> U+FFFD */
    free(s);
    lilac_tok_free(t);
}

static void test_bad_json(void) {
    const char *bad[] = {"", "{", "[]", "{\"model\":{}}", "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}",
                         "{\"model\":{\"vocab\":{\"a\":0}},\"pre_tokenizer\":{\"type\":\"Whitespace\"}}",
                         "{\"model\":{\"vocab\":{\"a\":\"x\"}}}", "{\"model\":{\"vocab\":{\"\\ud800\":0}}}",
                         "{\"model\":{\"vocab\":{\"a\":0}}} trailing", "\xff"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lilac_err err = {{0}};
        lilac_tokenizer *t = lilac_tok_load_mem(bad[i], strlen(bad[i]), &err);
        CHECKF(t == NULL && strstr(err.msg, "tokenizer.json"), "case %zu: %s", i, err.msg);
        lilac_tok_free(t);
    }
}

static lilac_tokenizer *qwen3(void) {
    lilac_err err = {{0}};
    lilac_tokenizer *t = lilac_tok_load(QWEN3, &err);
    CHECKF(t != NULL, "%s", err.msg);
    return t;
}

static void test_qwen3_known(void) {
    lilac_tokenizer *t = qwen3();
    if (!t) return;
    lilac_err err = {{0}};
    lilac_ids v = {0};
    /* ids from HF tokenizers 0.23.3 */
    const char *s = "Hello world! I'M héllo  naïve 12345 你好世界  \n\n  foo's  <|im_start|>user\nhi<|im_end|>";
    int32_t want[] = {9707,  1879, 0,   358, 27603, 305,   18503, 385,  220,    94880, 586,    220, 16, 17, 18,
                      19,    20,   220, 108386, 99489, 18611, 220, 15229, 594,    256,    151644, 872, 198, 6023, 151645};
    CHECK(lilac_tok_encode(t, s, strlen(s), LILAC_TOK_SPECIAL, &v, &err) == 0);
    if (!ids_eq(&v, want, sizeof want / sizeof want[0])) {
        CHECK(0);
        print_ids("got", &v);
    }
    CHECK(lilac_tok_vocab_size(t) == 151669 && lilac_tok_n_added(t) == 26);
    CHECK(lilac_tok_added_id(t, "<|im_end|>") == 151645);
    lilac_ids_free(&v);
    lilac_tok_free(t);
}

/* 100k copies of one letter, and other long runs (the heap BPE keeps these
 * O(n log n)); the small-piece algorithm agrees on a prefix; decode restores them. */
static void test_long_runs(void) {
    lilac_tokenizer *t = qwen3();
    if (!t) return;
    lilac_err err = {{0}};
    const char *unit[] = {"a", " ", "!", "ab", "1", "\xe6\x88\x91", "\xf0\x9f\x98\x80"};
    for (size_t u = 0; u < sizeof unit / sizeof unit[0]; u++) {
        size_t ul = strlen(unit[u]), reps = 100000 / ul, n = ul * reps;
        char *s = malloc(n + 1);
        for (size_t i = 0; i < reps; i++) memcpy(s + i * ul, unit[u], ul);
        s[n] = 0;
        lilac_ids a = {0}, b = {0};
        CHECK(lilac_tok_encode(t, s, n, LILAC_TOK_PLAIN, &a, &err) == 0);
        if (n <= 100000 && u < 3) { /* the small-piece algorithm on the same input (quadratic: shorter) */
            size_t m = 6000;
            lilac_ids c = {0};
            lilac_tok_bpe_force_ = 1;
            lilac_tok_encode(t, s, m, LILAC_TOK_PLAIN, &b, &err);
            lilac_tok_bpe_force_ = 2;
            lilac_tok_encode(t, s, m, LILAC_TOK_PLAIN, &c, &err);
            lilac_tok_bpe_force_ = 0;
            CHECKF(b.n == c.n && !memcmp(b.ids, c.ids, b.n * sizeof(int32_t)), "unit %zu small/large differ", u);
            lilac_ids_free(&c);
        }
        char *back = lilac_tok_decode(t, a.ids, a.n, false, NULL);
        CHECK(!strcmp(back, s));
        free(back);
        free(s);
        lilac_ids_free(&a);
        lilac_ids_free(&b);
    }
    lilac_tok_free(t);
}

/* Both BPE algorithms on pseudo-random mixed text. */
static void test_bpe_algorithms_agree(void) {
    lilac_tokenizer *t = qwen3();
    if (!t) return;
    lilac_err err = {{0}};
    const char *alpha[] = {"a", "b", "e", "th", "in", "er", " ", "\xc3\xa9", "\xe4\xbd\xa0", "1", "'", "s", "ing", "."};
    uint64_t x = 12345;
    for (int round = 0; round < 200; round++) {
        char buf[4096];
        size_t n = 0;
        int len = 1 + (int)(x % 300);
        for (int i = 0; i < len; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            const char *p = alpha[(x >> 33) % (sizeof alpha / sizeof alpha[0])];
            size_t pl = strlen(p);
            if (n + pl >= sizeof buf) break;
            memcpy(buf + n, p, pl);
            n += pl;
        }
        lilac_ids a = {0}, b = {0};
        lilac_tok_bpe_force_ = 1;
        lilac_tok_encode(t, buf, n, LILAC_TOK_PLAIN, &a, &err);
        lilac_tok_bpe_force_ = 2;
        lilac_tok_encode(t, buf, n, LILAC_TOK_PLAIN, &b, &err);
        lilac_tok_bpe_force_ = 0;
        CHECKF(a.n == b.n && !memcmp(a.ids, b.ids, a.n * sizeof(int32_t)), "round %d", round);
        lilac_ids_free(&a);
        lilac_ids_free(&b);
    }
    lilac_tok_free(t);
}

static void test_encode_errors(void) {
    lilac_tokenizer *t = qwen3();
    if (!t) return;
    lilac_err err = {{0}};
    lilac_ids v = {0};
    CHECK(lilac_tok_encode(t, "ok\xff", 3, LILAC_TOK_SPECIAL, &v, &err) == -1);
    CHECK(strstr(err.msg, "UTF-8") != NULL);
    CHECK(lilac_tok_encode(t, "", 0, LILAC_TOK_SPECIAL, &v, &err) == 0 && v.n == 0);
    CHECK(lilac_tok_encode(t, "a\0b", 3, LILAC_TOK_SPECIAL, &v, &err) == 0 && v.n == 3);
    lilac_ids_free(&v);
    lilac_tok_free(t);
}

/* ---- streaming detokenisation ------------------------------------------ */

typedef struct {
    char buf[4096];
    size_t n;
} sink;

static int feed(lilac_detok *d, sink *k, int32_t id, int *stop) {
    const char *o;
    size_t n;
    int r = lilac_detok_push(d, id, &o, &n, stop);
    /* every emitted chunk is complete UTF-8 */
    CHECK(lilac_utf8_check(o, n) == n);
    memcpy(k->buf + k->n, o, n);
    k->n += n;
    k->buf[k->n] = 0;
    return r;
}

static void finish(lilac_detok *d, sink *k) {
    const char *o;
    size_t n;
    lilac_detok_finish(d, &o, &n);
    memcpy(k->buf + k->n, o, n);
    k->n += n;
    k->buf[k->n] = 0;
}

static void test_detok_utf8(void) {
    lilac_tokenizer *t = qwen3();
    if (!t) return;
    lilac_err err = {{0}};
    lilac_ids v = {0};
    const char *s = "Emoji \xf0\x9f\x98\x80\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9 and \xe4\xbd\xa0\xe5\xa5\xbd, caf\xc3\xa9.";
    lilac_tok_encode(t, s, strlen(s), LILAC_TOK_PLAIN, &v, &err);
    /* byte by byte: feed single-byte tokens so characters arrive in pieces */
    lilac_detok *d = lilac_detok_new(t, NULL, 0, false);
    sink k = {{0}, 0};
    for (size_t i = 0; i < v.n; i++) CHECK(feed(d, &k, v.ids[i], NULL) == 0);
    finish(d, &k);
    CHECK(!strcmp(k.buf, s));
    lilac_detok_free(d);
    /* raw bytes as tokens: the 4 bytes of an emoji one at a time */
    v.n = 0;
    lilac_tok_encode(t, "\xf0\x9f\x98\x80", 4, LILAC_TOK_PLAIN, &v, &err);
    d = lilac_detok_new(t, NULL, 0, false);
    k.n = 0;
    for (size_t i = 0; i < v.n; i++) {
        const char *o;
        size_t n;
        lilac_detok_push(d, v.ids[i], &o, &n, NULL);
        if (i + 1 < v.n) CHECK(n == 0); /* nothing until the character is complete */
    }
    lilac_detok_free(d);
    /* a dead sequence becomes U+FFFD, at the end too */
    d = lilac_detok_new(t, NULL, 0, false);
    k.n = 0;
    int32_t lead = -1, cont = -1;
    for (int32_t id = 0; id < 1000 && (lead < 0 || cont < 0); id++) {
        size_t n;
        const uint8_t *b = lilac_tok_bytes(t, id, &n);
        if (n == 1 && b[0] == 0xE4) lead = id;
        if (n == 1 && b[0] == 0xBD) cont = id;
    }
    CHECK(lead >= 0 && cont >= 0);
    feed(d, &k, lead, NULL);
    CHECK(k.n == 0);
    feed(d, &k, 32, NULL); /* "A" (id 32) kills the sequence */
    CHECK(k.n == 4 && !memcmp(k.buf, "\xef\xbf\xbd" "A", 4));
    feed(d, &k, lead, NULL);
    feed(d, &k, cont, NULL);
    finish(d, &k);
    CHECK(k.n == 7 && !memcmp(k.buf + 4, "\xef\xbf\xbd", 3));
    lilac_detok_free(d);
    lilac_ids_free(&v);
    lilac_tok_free(t);
}

static void test_detok_stop(void) {
    lilac_tokenizer *t = qwen3();
    if (!t) return;
    lilac_err err = {{0}};
    lilac_ids v = {0};
    const char *s = "The answer is 42.\nUser: more text after";
    lilac_tok_encode(t, s, strlen(s), LILAC_TOK_PLAIN, &v, &err);
    const char *stops[] = {"\nUser:", "zzz"};
    lilac_detok *d = lilac_detok_new(t, stops, 2, false);
    sink k = {{0}, 0};
    int hit = -1, which = -1;
    for (size_t i = 0; i < v.n; i++) {
        if (feed(d, &k, v.ids[i], &which)) {
            hit = (int)i;
            break;
        }
        /* text that could start "\nUser:" is never emitted early */
        CHECK(!strstr(k.buf, "\n"));
    }
    CHECK(hit >= 0 && which == 0);
    CHECK(!strcmp(k.buf, "The answer is 42."));
    const char *o;
    size_t n;
    CHECK(lilac_detok_push(d, v.ids[0], &o, &n, NULL) == 1 && n == 0); /* over */
    lilac_detok_free(d);
    /* a partial match that does not complete is released */
    d = lilac_detok_new(t, (const char *[]){"4242"}, 1, false);
    k.n = 0;
    for (size_t i = 0; i < v.n; i++) CHECK(feed(d, &k, v.ids[i], NULL) == 0);
    finish(d, &k);
    CHECK(!strcmp(k.buf, s));
    lilac_detok_free(d);
    /* held back at the end of the stream: emitted by finish */
    v.n = 0;
    lilac_tok_encode(t, "ends with 42", 12, LILAC_TOK_PLAIN, &v, &err);
    d = lilac_detok_new(t, (const char *[]){"4242"}, 1, false);
    k.n = 0;
    for (size_t i = 0; i < v.n; i++) feed(d, &k, v.ids[i], NULL);
    CHECK(!strcmp(k.buf, "ends with "));
    finish(d, &k);
    CHECK(!strcmp(k.buf, "ends with 42"));
    lilac_detok_free(d);
    /* special tokens: skipped or shown */
    int32_t ids[] = {151644, 872, 151645};
    d = lilac_detok_new(t, NULL, 0, true);
    k.n = 0;
    for (int i = 0; i < 3; i++) feed(d, &k, ids[i], NULL);
    finish(d, &k);
    CHECK(!strcmp(k.buf, "user"));
    lilac_detok_free(d);
    d = lilac_detok_new(t, (const char *[]){"<|im_end|>"}, 1, false);
    k.n = 0;
    int r = 0;
    for (int i = 0; i < 3 && !r; i++) r = feed(d, &k, ids[i], NULL);
    CHECK(r == 1 && !strcmp(k.buf, "<|im_start|>user"));
    lilac_detok_free(d);
    lilac_ids_free(&v);
    lilac_tok_free(t);
}

/* A chat of n one-character user messages, each message's content a plain span:
 * the masked encoder's span queries (cursor moves and tests, counted) visit each
 * span a bounded number of times, so doubling n at most doubles the count. The
 * ids equal those of the unmasked encoder, as no span holds an added token. */
static void test_masked_linear(void) {
    lilac_tokenizer *t = qwen3();
    if (!t) return;
    static const char MSG[] = "<|im_start|>user\nx<|im_end|>\n";
    const size_t ml = sizeof MSG - 1, x_at = strlen("<|im_start|>user\n");
    size_t steps[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        const size_t n = k ? 4000 : 2000;
        char *text = xmalloc(n * ml + 1);
        lilac_span *sp = xmalloc(n * sizeof *sp);
        for (size_t i = 0; i < n; i++) {
            memcpy(text + i * ml, MSG, ml);
            sp[i] = (lilac_span){.off = i * ml + x_at, .len = 1};
        }
        lilac_ids a = {0}, b = {0};
        lilac_err err = {{0}};
        CHECKF(tok_encode_masked_steps(t, text, n * ml, sp, n, &a, &steps[k], &err) == 0, "%s", err.msg);
        CHECKF(lilac_tok_encode(t, text, n * ml, LILAC_TOK_SPECIAL, &b, &err) == 0, "%s", err.msg);
        CHECK(a.n == b.n && a.n > 0 && !memcmp(a.ids, b.ids, a.n * sizeof(int32_t)));
        CHECKF(steps[k] <= 8 * n, "%zu messages: %zu span visits", n, steps[k]); /* a few per message */
        lilac_ids_free(&a);
        lilac_ids_free(&b);
        free(sp);
        free(text);
    }
    CHECKF(steps[1] <= 2 * steps[0] + 16, "span visits %zu at 2000 messages, %zu at 4000", steps[0], steps[1]);
    lilac_tok_free(t);
}

int main(void) {
    TEST(test_utf8_check);
    TEST(test_tiny_merges);
    TEST(test_tiny_added);
    TEST(test_tiny_decode);
    TEST(test_bad_json);
    TEST(test_qwen3_known);
    TEST(test_long_runs);
    TEST(test_bpe_algorithms_agree);
    TEST(test_encode_errors);
    TEST(test_masked_linear);
    TEST(test_detok_utf8);
    TEST(test_detok_stop);
    return check_summary();
}
