/* common.c — see common.h. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
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

int lilac_open_regular(const char *path, size_t max, size_t *size, lilac_err *err) {
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; on a regular file it changes nothing */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return lilac_fail(err, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return lilac_fail(err, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return lilac_fail(err, "%s: not a regular file (a FIFO, device or directory is refused)", path);
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > (uint64_t)max) {
        close(fd);
        return lilac_fail(err, "%s: %lld bytes, more than the %zu this file may have", path, (long long)sb.st_size, max);
    }
    if (size) *size = (size_t)sb.st_size;
    return fd;
}

char *lilac_read_file_max(const char *path, size_t max, size_t *len, lilac_err *err) {
    size_t size = 0;
    int fd = lilac_open_regular(path, max, &size, err);
    if (fd < 0) return NULL;
    char *buf = xmalloc(size + 1);
    size_t n = 0;
    while (n < size) { /* a file that shrinks meanwhile ends early; one that grows is read up to its size */
        ssize_t r = read(fd, buf + n, size - n);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            free(buf);
            lilac_fail(err, "%s: read error: %s", path, strerror(e));
            return NULL;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

char *lilac_read_file(const char *path, size_t *len, lilac_err *err) {
    return lilac_read_file_max(path, LILAC_READ_MAX, len, err);
}
