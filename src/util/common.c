/* common.c — see common.h. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int lilac_fail(lilac_err *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        /* Error messages are one line: control characters from quoted input
         * (a JSON parser's excerpt, a tensor name) become spaces. */
        for (char *c = err->msg; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
    }
    return -1;
}

void lilac_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("lilac: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) lilac_die("out of memory (%zu bytes)", n);
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) lilac_die("out of memory (%zu x %zu bytes)", n, size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) lilac_die("out of memory (%zu bytes)", n);
    return q;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = xmalloc(n);
    memcpy(d, s, n);
    return d;
}

double lilac_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int lilac_parse_ids(const char *s, int32_t **out, lilac_err *err) {
    int cap = 16, n = 0;
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)cap);
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            free(ids);
            return lilac_fail(err, "--ids: expected comma-separated non-negative integers, got \"%.40s\"", p);
        }
        if (n == cap) ids = xrealloc(ids, sizeof(int32_t) * (size_t)(cap *= 2));
        ids[n++] = (int32_t)v;
        p = end;
        if (*p && *p != ',' && *p != ' ') {
            free(ids);
            return lilac_fail(err, "--ids: unexpected character '%c'", *p);
        }
    }
    if (n == 0) {
        free(ids);
        return lilac_fail(err, "--ids: no token ids given");
    }
    *out = ids;
    return n;
}

char *lilac_read_stream(FILE *f, const char *name, size_t *len, lilac_err *err) {
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) buf = xrealloc(buf, cap *= 2);
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        lilac_fail(err, "%s: read error", name);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

char *lilac_read_file(const char *path, size_t *len, lilac_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        lilac_fail(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = lilac_read_stream(f, path, len, err);
    fclose(f);
    return buf;
}
