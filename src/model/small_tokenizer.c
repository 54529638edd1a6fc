/* small_tokenizer.c — see small_tokenizer.h. */
#include "small_tokenizer.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/sbuf.h"
#include "qwen_chat_template.h"

static const char *const ADDED[][2] = {
    {"<|endoftext|>", "1"}, {"<|im_start|>", "1"}, {"<|im_end|>", "1"}, {"<|object_ref_start|>", "1"},
    {"<|object_ref_end|>", "1"}, {"<|box_start|>", "1"}, {"<|box_end|>", "1"}, {"<|quad_start|>", "1"},
    {"<|quad_end|>", "1"}, {"<|vision_start|>", "1"}, {"<|vision_end|>", "1"}, {"<|vision_pad|>", "1"},
    {"<|image_pad|>", "1"}, {"<|video_pad|>", "1"}, {"<tool_call>", "0"}, {"</tool_call>", "0"},
    {"<|fim_prefix|>", "0"}, {"<|fim_middle|>", "0"}, {"<|fim_suffix|>", "0"}, {"<|fim_pad|>", "0"},
    {"<|repo_name|>", "0"}, {"<|file_sep|>", "0"}, {"<tool_response>", "0"}, {"</tool_response>", "0"},
    {"<think>", "0"}, {"</think>", "0"},
};
#define N_ADDED ((int)(sizeof ADDED / sizeof ADDED[0]))

static const char CORPUS[] =
    "The quick brown fox jumps over the lazy dog. Hello, world! How are you today? I am fine, thank you.\n"
    "This is a small demo model for lilac, an inference engine written in C for one model. It answers with "
    "random text, because its weights are random numbers, but every part of the interface works: the chat "
    "template, the tokenizer, streaming, tool calls, stop strings, logprobs and usage.\n"
    "The weather in Paris is sunny and warm. What is the weather like in London and in Berlin? It is raining.\n"
    "Please call the function get_weather with the city and the unit. The result will be returned as JSON.\n"
    "def main():\n    print(\"hello\")\n    return 0\n\nfor i in range(10):\n    x = i * 2 + 1\n"
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14 -1\n"
    "user assistant system tool thinking reasoning content message function parameter name value type "
    "string integer number boolean object array description properties required arguments response\n"
    "Let me think about this step by step. First, the question asks for the answer. Then we check it again. "
    "So the final answer is yes. Thanks for asking, and have a nice day!\n";

/* GPT-2 byte-level alphabet: byte -> code point. */
static unsigned byte_cp(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256 + n;
}

static void put_cp(sbuf *b, unsigned cp) {
    char u[4];
    if (cp < 0x80) u[0] = (char)cp, sb_put(b, u, 1);
    else {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        sb_put(b, u, 2);
    }
}

/* A token (raw bytes) in the byte-level alphabet, as a JSON string. */
static void put_tok(sbuf *out, const char *s, size_t n) {
    sbuf t = {0};
    for (size_t i = 0; i < n; i++) put_cp(&t, byte_cp((unsigned char)s[i]));
    sb_json_str(out, t.p, t.n);
    sb_free(&t);
}

typedef struct {
    char *s;
    size_t n;
} tokstr;

/* Byte-pair training over the corpus words; then lowercase bigrams fill the
 * vocabulary up to n_merges (any merge of two existing tokens is valid BPE). */
static int train(tokstr *tok, int (*merges)[2], int n_merges) {
    const int V = 256 + n_merges; /* stride of the pair counts */
    for (int i = 0; i < 256; i++) {
        tok[i].s = xmalloc(1);
        tok[i].s[0] = (char)i;
        tok[i].n = 1;
    }
    int ntok = 256, nm = 0;
    /* words: a space joins the following letters (as the Qwen regex does) */
    const size_t L = sizeof CORPUS - 1;
    int *sym = xmalloc(sizeof(int) * L), *wstart = xmalloc(sizeof(int) * (L + 1));
    int nsym = 0, nw = 0;
    for (size_t i = 0; i < L;) {
        wstart[nw++] = nsym;
        size_t j = i + 1;
        unsigned char c = (unsigned char)CORPUS[i];
        if (c == ' ' && i + 1 < L && (CORPUS[i + 1] == ' ' ? 0 : 1)) {
            unsigned char d = (unsigned char)CORPUS[i + 1];
            bool alpha = (d | 32) >= 'a' && (d | 32) <= 'z';
            while (j < L && (alpha ? (((unsigned char)CORPUS[j] | 32) >= 'a' && ((unsigned char)CORPUS[j] | 32) <= 'z')
                                   : ispunct((unsigned char)CORPUS[j])))
                j++;
        } else if (((c | 32) >= 'a' && (c | 32) <= 'z') || c == '_') {
            while (j < L && ((((unsigned char)CORPUS[j] | 32) >= 'a' && ((unsigned char)CORPUS[j] | 32) <= 'z') || CORPUS[j] == '_')) j++;
        } else if (c == ' ') {
            while (j < L && CORPUS[j] == ' ' && !(j + 1 < L && CORPUS[j + 1] != ' ')) j++;
        }
        for (size_t k = i; k < j; k++) sym[nsym++] = (unsigned char)CORPUS[k];
        i = j;
    }
    wstart[nw] = nsym;
    int *cnt = xcalloc((size_t)V * V, sizeof(int));
    while (nm < n_merges) {
        int best = 0, ba = -1, bb = -1;
        for (int w = 0; w < nw; w++)
            for (int k = wstart[w]; k + 1 < wstart[w + 1]; k++) {
                if (sym[k] < 0) continue;
                int k2 = k + 1;
                while (k2 < wstart[w + 1] && sym[k2] < 0) k2++;
                if (k2 >= wstart[w + 1]) break;
                int c2 = ++cnt[sym[k] * V + sym[k2]];
                if (c2 > best || (c2 == best && (sym[k] < ba || (sym[k] == ba && sym[k2] < bb))))
                    best = c2, ba = sym[k], bb = sym[k2];
            }
        memset(cnt, 0, sizeof(int) * (size_t)V * V);
        if (best < 2) break;
        tok[ntok].n = tok[ba].n + tok[bb].n;
        tok[ntok].s = xmalloc(tok[ntok].n);
        memcpy(tok[ntok].s, tok[ba].s, tok[ba].n);
        memcpy(tok[ntok].s + tok[ba].n, tok[bb].s, tok[bb].n);
        merges[nm][0] = ba, merges[nm][1] = bb, nm++;
        for (int w = 0; w < nw; w++) /* apply the merge */
            for (int k = wstart[w]; k < wstart[w + 1]; k++) {
                if (sym[k] != ba) continue;
                int k2 = k + 1;
                while (k2 < wstart[w + 1] && sym[k2] < 0) k2++;
                if (k2 < wstart[w + 1] && sym[k2] == bb) {
                    sym[k] = ntok;
                    sym[k2] = -1;
                }
            }
        ntok++;
    }
    free(cnt);
    free(sym);
    free(wstart);
    /* fill: lowercase bigrams that are not tokens yet */
    for (int a = 'a'; a <= 'z' && nm < n_merges; a++)
        for (int b = 'a'; b <= 'z' && nm < n_merges; b++) {
            bool have = false;
            for (int t = 256; t < ntok && !have; t++) have = tok[t].n == 2 && tok[t].s[0] == a && tok[t].s[1] == b;
            if (have) continue;
            tok[ntok].n = 2;
            tok[ntok].s = xmalloc(2);
            tok[ntok].s[0] = (char)a;
            tok[ntok].s[1] = (char)b;
            merges[nm][0] = a, merges[nm][1] = b, nm++;
            ntok++;
        }
    return ntok;
}

static int write_file(const char *dir, const char *name, const void *p, size_t n, lilac_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return lilac_fail(err, "cannot write %s: %s", path, strerror(errno));
    size_t w = fwrite(p, 1, n, f);
    if (fclose(f) != 0 || w != n) return lilac_fail(err, "writing %s failed", path);
    return 0;
}

int lilac_small_tokenizer_write(const char *dir, int64_t vocab, int *eos_out, lilac_err *err) {
    if (vocab < LILAC_SMALL_TOKENIZER_MIN_VOCAB)
        return lilac_fail(err, "a byte-level tokenizer needs a vocabulary of at least %d", LILAC_SMALL_TOKENIZER_MIN_VOCAB);
    const int n_merges = (int)(vocab < LILAC_SMALL_TOKENIZER_MAX_TRAINED ? vocab : LILAC_SMALL_TOKENIZER_MAX_TRAINED) - 256 - N_ADDED;
    tokstr *tok = xcalloc((size_t)(256 + n_merges), sizeof(tokstr));
    int(*merges)[2] = xcalloc((size_t)n_merges, sizeof *merges);
    const int ntok = train(tok, merges, n_merges);
    const int nm = ntok - 256;
    /* The special tokens follow the trained ones, or sit at the real model's ids where the vocabulary has room. */
    const int sp = vocab >= LILAC_QWEN_ENDOFTEXT + N_ADDED ? LILAC_QWEN_ENDOFTEXT : ntok;
    sbuf b = {0};
    sb_puts(&b, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [");
    for (int i = 0; i < N_ADDED; i++) {
        sb_printf(&b, "%s\n    {\"id\": %d, \"content\": ", i ? "," : "", sp + i);
        sb_json_str(&b, ADDED[i][0], strlen(ADDED[i][0]));
        sb_printf(&b, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
                      "\"special\": %s}", ADDED[i][1][0] == '1' ? "true" : "false");
    }
    sb_puts(&b, "\n  ],\n  \"normalizer\": {\"type\": \"NFC\"},\n"
                "  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
                "{\"Regex\": ");
    static const char RX[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                             "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    sb_json_str(&b, RX, strlen(RX));
    sb_puts(&b, "}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                "\"trim_offsets\": false, \"use_regex\": false}]},\n"
                "  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, "
                "\"use_regex\": false},\n"
                "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, "
                "\"use_regex\": false},\n"
                "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": "
                "\"\", \"end_of_word_suffix\": \"\", \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": "
                "false,\n    \"vocab\": {");
    for (int i = 0; i < ntok; i++) {
        sb_puts(&b, i ? ", " : "");
        put_tok(&b, tok[i].s, tok[i].n);
        sb_printf(&b, ": %d", i);
    }
    sb_puts(&b, "},\n    \"merges\": [");
    for (int i = 0; i < nm; i++) {
        sb_puts(&b, i ? ", [" : "[");
        put_tok(&b, tok[merges[i][0]].s, tok[merges[i][0]].n);
        sb_puts(&b, ", ");
        put_tok(&b, tok[merges[i][1]].s, tok[merges[i][1]].n);
        sb_puts(&b, "]");
    }
    sb_puts(&b, "]\n  }\n}\n");
    int rc = write_file(dir, "tokenizer.json", b.p, b.n, err);
    sb_clear(&b);
    sb_puts(&b, "{\n  \"add_bos_token\": false,\n  \"add_prefix_space\": false,\n  \"added_tokens_decoder\": {");
    for (int i = 0; i < N_ADDED; i++) {
        sb_printf(&b, "%s\n    \"%d\": {\"content\": ", i ? "," : "", sp + i);
        sb_json_str(&b, ADDED[i][0], strlen(ADDED[i][0]));
        sb_printf(&b, ", \"lstrip\": false, \"normalized\": false, \"rstrip\": false, \"single_word\": false, \"special\": %s}",
                  ADDED[i][1][0] == '1' ? "true" : "false");
    }
    sb_puts(&b, "\n  },\n  \"bos_token\": null,\n  \"clean_up_tokenization_spaces\": false,\n  \"eos_token\": \"<|im_end|>\",\n"
                "  \"errors\": \"replace\",\n  \"model_max_length\": 262144,\n  \"pad_token\": \"<|endoftext|>\",\n"
                "  \"split_special_tokens\": false,\n  \"tokenizer_class\": \"Qwen2Tokenizer\",\n  \"unk_token\": null\n}\n");
    if (!rc) rc = write_file(dir, "tokenizer_config.json", b.p, b.n, err);
    sb_clear(&b);
    int endoftext = sp, im_end = sp + 2;
    *eos_out = endoftext;
    sb_printf(&b, "{\n  \"bos_token_id\": %d,\n  \"do_sample\": true,\n  \"eos_token_id\": [%d, %d],\n  \"pad_token_id\": %d,\n"
                  "  \"temperature\": 1.0,\n  \"top_k\": 20,\n  \"top_p\": 0.95\n}\n", endoftext, im_end, endoftext, endoftext);
    if (!rc) rc = write_file(dir, "generation_config.json", b.p, b.n, err);
    sb_clear(&b);
    if (!rc) rc = write_file(dir, "chat_template.jinja", lilac_qwen_chat_template, LILAC_QWEN_CHAT_TEMPLATE_LEN, err);
    sb_free(&b);
    for (int i = 0; i < ntok; i++) free(tok[i].s);
    free(tok);
    free(merges);
    return rc;
}

