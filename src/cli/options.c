/* options.c — the small option parser every command shares (commands.h). */
#include <errno.h>
#include <limits.h>
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
    return opt_range(argc, argv, i, name, LONG_MIN, LONG_MAX, out);
}

bool opt_range(int argc, char **argv, int *i, const char *name, long lo, long hi, long *out) {
    const char *v;
    if (!opt_str(argc, argv, i, name, &v)) return false;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno == ERANGE || x < lo || x > hi) {
        if (lo == LONG_MIN && hi == LONG_MAX) lilac_die("%s: expected an integer, got \"%s\"", name, v);
        lilac_die("%s: expected an integer in %ld..%ld, got \"%s\"", name, lo, hi, v);
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
        lilac_die("%s: expected a number in %g..%g, got \"%s\"", name, lo, hi, v);
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

