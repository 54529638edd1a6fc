/* sbuf.h — a growable byte buffer and the hand-written JSON emission used on
 * the token path (SSE frames, responses): strings are escaped as JSON requires
 * ('"', '\\', control characters as \u00XX; U+2028/U+2029 too, so a frame is
 * also valid JavaScript), everything else copied as UTF-8. */
#ifndef LILAC_SBUF_H
#define LILAC_SBUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *p;     /* NUL-terminated once anything was appended */
    size_t n, cap;
} sbuf;

void sb_put(sbuf *b, const void *s, size_t n);
void sb_puts(sbuf *b, const char *s);
void sb_putc(sbuf *b, char c);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A JSON string literal (with the quotes) of n bytes of s (UTF-8 expected;
 * invalid bytes are replaced by U+FFFD so the output is always valid JSON). */
void sb_json_str(sbuf *b, const char *s, size_t n);
/* A JSON number for a float (non-finite values become -9999.0, as OpenAI does
 * for -inf logprobs). */
void sb_json_num(sbuf *b, double x);
void sb_clear(sbuf *b);
void sb_free(sbuf *b);
/* Drop the first n bytes. */
void sb_consume(sbuf *b, size_t n);

#endif
