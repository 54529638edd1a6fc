/* fuzz_tokenizer.c — libFuzzer target for the tokenizer.json loader, the
 * encoder, the streaming detokeniser and the chat renderer.
 * The first byte picks the target; the rest is its input:
 *   0: a tokenizer.json image (loaded, then used on a short text);
 *   1: text, encoded in all three modes with the real Qwen3 tokenizer
 *      (tests/data; a small built-in one if absent): invalid UTF-8 must be an
 *      error, ASCII must round-trip exactly, streaming detokenisation must
 *      equal whole decoding;
 *   2: a messages JSON, rendered and tokenised the safe way.
 * The library sources are compiled in here (the Makefile's fuzz rule links
 * only src/model and src/util). Any crash, leak, UB or broken invariant aborts. */
#include "tokenizer/unicode.c"
#include "tokenizer/load.c"
#include "tokenizer/bpe.c"
#include "tokenizer/encode.c"
#include "tokenizer/detok.c"
#include "chat/chat.c"

#define REQUIRE(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s\n", #c); abort(); } } while (0)

static const char *TINY =
    "{\"added_tokens\":[{\"id\":9,\"content\":\"<e>\",\"special\":true,\"normalized\":false},"
    "{\"id\":10,\"content\":\"zz\",\"normalized\":true,\"single_word\":true,\"lstrip\":true,\"rstrip\":true}],"
    "\"normalizer\":{\"type\":\"NFC\"},\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\\u0120\":3,\"\\u0120a\":4,\"aa\":5},"
    "\"merges\":[\"a b\",[\"\\u0120\",\"a\"],\"a a\"]}}";

static lilac_tokenizer *real_tok(void) {
    static lilac_tokenizer *t;
    static int tried;
    if (!tried) {
        tried = 1;
        lilac_err e;
        t = lilac_tok_load("tests/data/tokenizers/qwen3/tokenizer.json", &e);
        if (!t) t = lilac_tok_load_mem(TINY, strlen(TINY), &e);
        REQUIRE(t != NULL);
    }
    return t;
}

static void check_text(const lilac_tokenizer *t, const char *s, size_t n) {
    lilac_err err;
    bool valid = lilac_utf8_check(s, n) == n;
    bool ascii = true;
    for (size_t i = 0; i < n; i++) ascii &= (unsigned char)s[i] < 0x80;
    lilac_span spans[2] = {{n / 3, n / 3}, {n / 2, n / 4}};
    for (int mode = 0; mode < 3; mode++) {
        lilac_ids v = {0};
        err.msg[0] = 0;
        int rc = mode < 2 ? lilac_tok_encode(t, s, n, mode, &v, &err)
                          : lilac_tok_encode_masked(t, s, n, spans, 2, &v, &err);
        REQUIRE((rc == 0) == valid);
        if (rc) {
            REQUIRE(err.msg[0] && v.n == 0);
            lilac_ids_free(&v);
            continue;
        }
        for (size_t i = 0; i < v.n; i++) REQUIRE(v.ids[i] >= 0 && v.ids[i] < lilac_tok_vocab_size(t));
        size_t dn;
        char *d = lilac_tok_decode(t, v.ids, v.n, false, &dn);
        REQUIRE(lilac_utf8_check(d, dn) == dn);
        if (ascii && mode == LILAC_TOK_PLAIN && lilac_tok_n_added(t) > 2) REQUIRE(dn == n && !memcmp(d, s, n));
        /* streaming == whole decoding */
        lilac_detok *dt = lilac_detok_new(t, NULL, 0, false);
        tok_buf acc = {0};
        tok_buf_put(&acc, "", 0);
        for (size_t i = 0; i < v.n; i++) {
            const char *o;
            size_t on;
            REQUIRE(lilac_detok_push(dt, v.ids[i], &o, &on, NULL) == 0);
            REQUIRE(lilac_utf8_check(o, on) == on);
            tok_buf_put(&acc, o, on);
        }
        const char *o;
        size_t on;
        lilac_detok_finish(dt, &o, &on);
        tok_buf_put(&acc, o, on);
        REQUIRE(acc.n == dn && !memcmp(acc.p, d, dn));
        lilac_detok_free(dt);
        /* with a stop string taken from the text: the output is a prefix */
        if (dn > 4) {
            char stop[4];
            memcpy(stop, d + dn / 2, 3);
            stop[3] = 0;
            if (lilac_utf8_check(stop, 3) == 3 && !memchr(stop, 0, 3)) {
                const char *stops[1] = {stop};
                dt = lilac_detok_new(t, stops, 1, true);
                acc.n = 0;
                int hit = 0;
                for (size_t i = 0; i < v.n && !hit; i++) {
                    hit = lilac_detok_push(dt, v.ids[i], &o, &on, NULL);
                    tok_buf_put(&acc, o, on);
                }
                lilac_detok_finish(dt, &o, &on);
                tok_buf_put(&acc, o, on);
                REQUIRE(acc.n <= dn);
                lilac_detok_free(dt);
            }
        }
        free(acc.p);
        free(d);
        lilac_ids_free(&v);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    lilac_err err;
    switch (data[0] % 3) {
    case 0: {
        err.msg[0] = 0;
        lilac_tokenizer *t = lilac_tok_load_mem(s, n, &err);
        if (!t) {
            REQUIRE(err.msg[0] != 0);
            return 0;
        }
        check_text(t, "ab a <e> zz b\xc3\xa9", 14);
        lilac_tok_free(t);
        break;
    }
    case 1: check_text(real_tok(), s, n); break;
    case 2: {
        lilac_prompt p;
        lilac_chat_opts o;
        lilac_chat_opts_default(&o);
        o.preserve_thinking = n & 1;
        o.add_vision_id = n & 2;
        err.msg[0] = 0;
        if (lilac_chat_render_json(s, n, NULL, 0, &o, &p, &err)) {
            REQUIRE(err.msg[0] != 0 && p.text == NULL);
            return 0;
        }
        REQUIRE(lilac_utf8_check(p.text, p.len) == p.len);
        for (size_t i = 0; i < p.n_data; i++) REQUIRE(p.data[i].off + p.data[i].len <= p.len && p.data[i].len);
        lilac_ids v = {0};
        REQUIRE(lilac_prompt_encode(real_tok(), &p, false, &v, &err) == 0);
        lilac_ids_free(&v);
        lilac_prompt_free(&p);
        break;
    }
    }
    return 0;
}
