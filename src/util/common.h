/* common.h — small helpers every lilac file may use: errors, allocation, bf16, timing. */
#ifndef LILAC_COMMON_H
#define LILAC_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* The release, printed by `lilac --version` and served at /version and /props. */
#define LILAC_VERSION "0.1.0"

/* Error reporting without exceptions: a function that can fail takes a
 * `lilac_err *` and fills it with one human-readable line; callers decide
 * whether to print and exit. The message always names the file/tensor/field. */
typedef struct {
    char msg[1024];
} lilac_err;

/* printf-style: set err->msg (no-op when err is NULL), one line: control
 * characters become spaces. Always returns -1 so
 * callers can write `return lilac_fail(err, ...)`. */
int lilac_fail(lilac_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
#define LILAC_NORETURN [[noreturn]]
#else
#define LILAC_NORETURN _Noreturn
#endif

/* Fatal: print "lilac: <msg>" to stderr and exit(1). For CLI-level errors only. */
LILAC_NORETURN void lilac_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Allocation that cannot return NULL (dies with a clear message instead). */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

/* bf16 <-> f32. bf16 is the top half of an IEEE f32. */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* Round to nearest even (NaN stays NaN). */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Monotonic wall clock in seconds. */
double lilac_now(void);

/* Parse "1,2,3" into a freshly allocated int32 array. Returns count, -1 on error. */
int lilac_parse_ids(const char *s, int32_t **out, lilac_err *err);

/* Read a whole file (or an open stream, e.g. stdin) into a NUL-terminated
 * buffer. NULL + err on failure. Files: regular files only (a FIFO or device
 * such as /dev/zero is refused, and never waited on: the open is
 * non-blocking), at most `max` bytes (LILAC_READ_MAX for lilac_read_file). */
#define LILAC_READ_MAX ((size_t)256 << 20)
char *lilac_read_file(const char *path, size_t *len, lilac_err *err);
char *lilac_read_file_max(const char *path, size_t max, size_t *len, lilac_err *err);
/* Open a regular file of at most `max` bytes for reading (non-blocking open,
 * as above); its size in *size. The descriptor, or -1 + err. */
int lilac_open_regular(const char *path, size_t max, size_t *size, lilac_err *err);
char *lilac_read_stream(FILE *f, const char *name, size_t *len, lilac_err *err);

#endif
