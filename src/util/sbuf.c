/* sbuf.c — see sbuf.h. */
#include "sbuf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static void grow(sbuf *b, size_t need) {
    if (b->n + need + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + need + 1) cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

void sb_put(sbuf *b, const void *s, size_t n) {
    grow(b, n);
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

void sb_putc(sbuf *b, char c) { sb_put(b, &c, 1); }

void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < sizeof tmp) {
        sb_put(b, tmp, (size_t)k);
        return;
    }
    grow(b, (size_t)k);
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

/* Length of a valid UTF-8 sequence at s (0 if invalid). */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t k;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) k = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) k = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) k = 4, cp = c & 0x07;
    else return 0;
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return k;
}

void sb_json_str(sbuf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    grow(b, n + 2);
    sb_putc(b, '"');
    size_t run = 0; /* start of a run of bytes copied verbatim */
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        const char *esc = NULL;
        char ub[7];
        size_t adv = 1;
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20 || c == 0x7f) {
            ub[0] = '\\', ub[1] = 'u', ub[2] = '0', ub[3] = '0', ub[4] = hex[c >> 4], ub[5] = hex[c & 15], ub[6] = 0;
            esc = ub;
        } else if (c >= 0x80) {
            size_t k = utf8_len(u + i, n - i);
            if (!k) esc = "\xEF\xBF\xBD";
            else if (k == 3 && c == 0xE2 && u[i + 1] == 0x80 && (u[i + 2] == 0xA8 || u[i + 2] == 0xA9)) {
                esc = u[i + 2] == 0xA8 ? "\\u2028" : "\\u2029";
                adv = 3;
            } else adv = k;
        }
        if (esc) {
            sb_put(b, u + run, i - run);
            sb_puts(b, esc);
            i += adv;
            run = i;
        } else i += adv;
    }
    sb_put(b, u + run, n - run);
    sb_putc(b, '"');
}

void sb_json_num(sbuf *b, double x) {
    if (!isfinite(x)) x = -9999.0;
    sb_printf(b, "%.9g", x);
}

void sb_clear(sbuf *b) {
    b->n = 0;
    if (b->p) b->p[0] = 0;
}

void sb_free(sbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

void sb_consume(sbuf *b, size_t n) {
    if (n >= b->n) {
        sb_clear(b);
        return;
    }
    memmove(b->p, b->p + n, b->n - n);
    b->n -= n;
    b->p[b->n] = 0;
}
