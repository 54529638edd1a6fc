/* cmd_tokenize.c — `lilac tokenize` and `lilac detokenize`. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/tokenizer.h"
#include "../util/common.h"
#include "commands.h"

/* Read all of a file (or stdin when path is NULL). */
static char *slurp(const char *path, size_t *len) {
    lilac_err err = {{0}};
    char *b = path ? lilac_read_file(path, len, &err) : lilac_read_stream(stdin, "stdin", len, &err);
    if (!b) lilac_die("%s", err.msg);
    return b;
}

static lilac_tokenizer *open_tok(const char *cmd, const char *tok, const char *model) {
    const char *path = tok ? tok : model;
    if (!path) path = getenv("LILAC_MODEL");
    if (!path) lilac_die("%s: pass --tokenizer PATH/tokenizer.json or --model DIR", cmd);
    lilac_err err = {{0}};
    lilac_tokenizer *t = lilac_tok_load(path, &err);
    if (!t) lilac_die("%s", err.msg);
    return t;
}

static void print_ids(const lilac_ids *v) {
    /* one line, space-separated, built in a buffer for speed */
    size_t cap = v->n * 8 + 2, n = 0;
    char *b = xmalloc(cap);
    for (size_t i = 0; i < v->n; i++) {
        if (n + 16 > cap) b = xrealloc(b, cap *= 2);
        if (i) b[n++] = ' ';
        char d[12];
        int k = 0;
        uint32_t x = (uint32_t)v->ids[i];
        do d[k++] = (char)('0' + x % 10); while ((x /= 10));
        while (k) b[n++] = d[--k];
    }
    b[n++] = '\n';
    fwrite(b, 1, n, stdout);
    free(b);
}

int cmd_tokenize(int argc, char **argv) {
    const char *tok = NULL, *model = NULL, *file = NULL;
    bool special = false, jsonl = false, timing = false;
    for (int i = 1; i < argc; i++)
        if (!opt_str(argc, argv, &i, "--tokenizer", &tok) && !opt_str(argc, argv, &i, "--model", &model) &&
            !opt_str(argc, argv, &i, "--file", &file) && !opt_flag(argc, argv, &i, "--special", &special) &&
            !opt_flag(argc, argv, &i, "--jsonl", &jsonl) && !opt_flag(argc, argv, &i, "--time", &timing))
            opt_unknown("tokenize", argv[i]);
    double t0 = lilac_now();
    lilac_tokenizer *t = open_tok("tokenize", tok, model);
    double t_load = lilac_now() - t0;
    size_t len;
    char *text = slurp(file, &len);
    int mode = special ? LILAC_TOK_SPECIAL : LILAC_TOK_PLAIN;
    lilac_err err = {{0}};
    double t_enc = 0;
    size_t n_bytes = 0, n_tok = 0;
    if (!jsonl) {
        lilac_ids v = {0};
        double a = lilac_now();
        if (lilac_tok_encode(t, text, len, mode, &v, &err)) lilac_die("tokenize: %s", err.msg);
        t_enc = lilac_now() - a;
        n_bytes = len;
        n_tok = v.n;
        print_ids(&v);
        lilac_ids_free(&v);
    } else {
        /* each line a JSON string; one line of ids per line */
        char *p = text, *end = text + len;
        size_t line_no = 0;
        while (p < end) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t ln = nl ? (size_t)(nl - p) : (size_t)(end - p);
            line_no++;
            if (ln > 0) {
                json_error_t je;
                json_t *s = json_loadb(p, ln, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
                if (!s || !json_is_string(s))
                    lilac_die("tokenize --jsonl: line %zu is not a JSON string (%s)", line_no, s ? "" : je.text);
                lilac_ids v = {0};
                double a = lilac_now();
                if (lilac_tok_encode(t, json_string_value(s), json_string_length(s), mode, &v, &err))
                    lilac_die("tokenize: line %zu: %s", line_no, err.msg);
                t_enc += lilac_now() - a;
                n_bytes += json_string_length(s);
                n_tok += v.n;
                print_ids(&v);
                lilac_ids_free(&v);
                json_decref(s);
            }
            p += ln + 1;
        }
    }
    if (timing)
        fprintf(stderr, "tokenize: load %.3f s; encoded %zu bytes into %zu tokens in %.3f s: %.2f MB/s\n", t_load,
                n_bytes, n_tok, t_enc, t_enc > 0 ? (double)n_bytes / 1e6 / t_enc : 0.0);
    free(text);
    lilac_tok_free(t);
    return 0;
}

/* Parse ids separated by spaces, commas or newlines. */
static void parse_ids_text(const char *s, size_t n, lilac_ids *v) {
    size_t i = 0;
    while (i < n) {
        while (i < n && (s[i] == ' ' || s[i] == ',' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
        if (i >= n) break;
        long x = 0;
        size_t st = i;
        while (i < n && s[i] >= '0' && s[i] <= '9' && x <= INT32_MAX) x = x * 10 + (s[i++] - '0');
        if (i == st || x > INT32_MAX || (i < n && !strchr(" ,\n\r\t", s[i])))
            lilac_die("detokenize: expected non-negative integer ids, got \"%.20s\"", s + st);
        lilac_ids_push(v, (int32_t)x);
    }
}

int cmd_detokenize(int argc, char **argv) {
    const char *tok = NULL, *model = NULL, *file = NULL, *ids = NULL;
    bool skip = false, jsonl = false;
    for (int i = 1; i < argc; i++)
        if (!opt_str(argc, argv, &i, "--tokenizer", &tok) && !opt_str(argc, argv, &i, "--model", &model) &&
            !opt_str(argc, argv, &i, "--file", &file) && !opt_str(argc, argv, &i, "--ids", &ids) &&
            !opt_flag(argc, argv, &i, "--skip-special", &skip) && !opt_flag(argc, argv, &i, "--jsonl", &jsonl))
            opt_unknown("detokenize", argv[i]);
    lilac_tokenizer *t = open_tok("detokenize", tok, model);
    size_t len;
    char *text = ids ? xstrdup(ids) : slurp(file, &len);
    if (ids) len = strlen(text);
    if (!jsonl) {
        lilac_ids v = {0};
        parse_ids_text(text, len, &v);
        size_t n;
        char *s = lilac_tok_decode(t, v.ids, v.n, skip, &n);
        fwrite(s, 1, n, stdout);
        free(s);
        lilac_ids_free(&v);
    } else {
        /* each line a list of ids; one JSON string per line (ASCII-escaped) */
        char *p = text, *end = text + len;
        while (p < end) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t ln = nl ? (size_t)(nl - p) : (size_t)(end - p);
            lilac_ids v = {0};
            parse_ids_text(p, ln, &v);
            size_t n;
            char *s = lilac_tok_decode(t, v.ids, v.n, skip, &n);
            json_t *js = json_stringn(s, n);
            char *d = json_dumps(js, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
            puts(d);
            free(d);
            json_decref(js);
            free(s);
            lilac_ids_free(&v);
            p += ln + 1;
        }
    }
    free(text);
    lilac_tok_free(t);
    return 0;
}
