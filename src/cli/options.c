/* options.c — the small option parser every command shares (commands.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/common.h"
#include "commands.h"

/* The spellings llama.cpp's and vLLM's servers use, accepted beside lilac's own. */
static const struct {
    const char *name, *alias;
} ALIASES[] = {
    {"--model", "-m"},           {"--max-seq", "-c"},         {"--max-seq", "--ctx-size"},
    {"--max-seq", "--max-model-len"}, {"--parallel", "-np"},  {"--parallel", "--max-num-seqs"},
    {"--threads", "-t"},         {"--alias", "--served-model-name"},
    {"--no-thinking", "--no-think"}, {"--no-think", "--no-thinking"},
};

const char *opt_alias(const char *name, int k) {
    for (size_t a = 0; a < sizeof ALIASES / sizeof ALIASES[0]; a++)
        if (!strcmp(ALIASES[a].name, name) && k-- == 0) return ALIASES[a].alias;
    return NULL;
}

/* The spelling (name or an alias) that w starts with, followed by '=' or its end. */
static const char *spelled(const char *w, const char *name) {
    for (int k = -1;; k++) {
        const char *s = k < 0 ? name : opt_alias(name, k);
        if (!s) return NULL;
        size_t n = strlen(s);
        if (!strncmp(w, s, n) && (w[n] == '=' || w[n] == 0)) return s;
    }
}

/* The word typed for `name`, for messages: "-c (--max-seq)" for an alias. */
static const char *typed;
static char typed_buf[96];
static const char *shown(const char *name) {
    if (!typed || !strcmp(typed, name)) return name;
    snprintf(typed_buf, sizeof typed_buf, "%s (%s)", typed, name);
    return typed_buf;
}

bool opt_str(int argc, char **argv, int *i, const char *name, const char **out) {
    const char *w = argv[*i];
    const char *s = spelled(w, name);
    if (!s) return false;
    typed = s;
    size_t n = strlen(s);
    if (w[n] == '=') {
        *out = w + n + 1;
        return true;
    }
    if (*i + 1 >= argc) lilac_die("%s needs a value", shown(name));
    *out = argv[++*i];
    return true;
}

bool opt_int(int argc, char **argv, int *i, const char *name, long *out) {
    return opt_range(argc, argv, i, name, LONG_MIN, LONG_MAX, out);
}

bool opt_range(int argc, char **argv, int *i, const char *name, long lo, long hi, long *out) {
    const char *v;
    if (!opt_str(argc, argv, i, name, &v)) return false;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno == ERANGE || x < lo || x > hi) {
        if (lo == LONG_MIN && hi == LONG_MAX) lilac_die("%s: expected an integer, got \"%s\"", shown(name), v);
        lilac_die("%s: expected an integer in %ld..%ld, got \"%s\"", shown(name), lo, hi, v);
    }
    *out = x;
    return true;
}

bool opt_real(int argc, char **argv, int *i, const char *name, double lo, double hi, double *out) {
    const char *v;
    if (!opt_str(argc, argv, i, name, &v)) return false;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno == ERANGE || !(x >= lo && x <= hi)) /* NaN fails too */
        lilac_die("%s: expected a number in %g..%g, got \"%s\"", shown(name), lo, hi, v);
    *out = x;
    return true;
}

bool opt_flag(int argc, char **argv, int *i, const char *name, bool *out) {
    (void)argc;
    const char *s = spelled(argv[*i], name);
    if (!s || argv[*i][strlen(s)] == '=') return false;
    *out = true;
    return true;
}

void opt_unknown(const char *cmd, const char *word) {
    lilac_die("%s: unknown option \"%s\" (see `lilac %s --help`)", cmd, word, cmd);
}

int opt_attn_bf16(const char *cmd, const char *value, bool backend_can, lilac_err *err) {
    if (!value || !strcmp(value, "f32")) return 0;
    if (strcmp(value, "bf16")) return lilac_fail(err, "%s: --attn-precision expects f32 or bf16, not \"%s\"", cmd, value);
    if (!backend_can)
        return lilac_fail(err, "%s: --attn-precision bf16 needs the CUDA backend (the CPU backend computes attention in f32)", cmd);
    return 1;
}
