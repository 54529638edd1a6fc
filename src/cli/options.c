/* options.c — the small option parser every command shares (commands.h). */
#include <stdlib.h>
#include <string.h>

#include "../util/common.h"
#include "commands.h"

bool opt_str(int argc, char **argv, int *i, const char *name, const char **out) {
    const char *w = argv[*i];
    size_t n = strlen(name);
    if (strncmp(w, name, n) != 0) return false;
    if (w[n] == '=') {
        *out = w + n + 1;
        return true;
    }
    if (w[n] != 0) return false;
    if (*i + 1 >= argc) lilac_die("%s needs a value", name);
    *out = argv[++*i];
    return true;
}

bool opt_int(int argc, char **argv, int *i, const char *name, long *out) {
    const char *v;
    if (!opt_str(argc, argv, i, name, &v)) return false;
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end) lilac_die("%s: expected an integer, got \"%s\"", name, v);
    *out = x;
    return true;
}

bool opt_flag(int argc, char **argv, int *i, const char *name, bool *out) {
    (void)argc;
    if (strcmp(argv[*i], name) != 0) return false;
    *out = true;
    return true;
}

void opt_unknown(const char *cmd, const char *word) {
    lilac_die("%s: unknown option \"%s\" (see `lilac help`)", cmd, word);
}

int opt_attn_bf16(const char *cmd, const char *value, bool backend_can, lilac_err *err) {
    if (!value || !strcmp(value, "f32")) return 0;
    if (strcmp(value, "bf16")) return lilac_fail(err, "%s: --attn-precision expects f32 or bf16, not \"%s\"", cmd, value);
    if (!backend_can)
        return lilac_fail(err, "%s: --attn-precision bf16 needs the CUDA backend (the CPU backend computes attention in f32)", cmd);
    return 1;
}
