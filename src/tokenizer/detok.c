/* detok.c — streaming detokenisation with stop strings; see tokenizer.h. */
#include "tokenizer.h"
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

struct lilac_detok {
    const lilac_tokenizer *t;
    bool skip_special, stopped;
    char **stops;
    size_t *stop_len;
    size_t n_stops;
    tok_buf raw;  /* bytes of an incomplete UTF-8 character */
    tok_buf text; /* decoded text held back (a possible stop-string start) */
    tok_buf out;  /* what the last call returns */
};

lilac_detok *lilac_detok_new(const lilac_tokenizer *t, const char *const *stops, size_t n_stops, bool skip_special) {
    lilac_detok *d = xcalloc(1, sizeof *d);
    d->t = t;
    d->skip_special = skip_special;
    d->stops = xcalloc(n_stops + 1, sizeof(char *));
    d->stop_len = xcalloc(n_stops + 1, sizeof(size_t));
    for (size_t i = 0; i < n_stops; i++) {
        if (!stops[i] || !stops[i][0]) continue;
        d->stops[d->n_stops] = xstrdup(stops[i]);
        d->stop_len[d->n_stops] = strlen(stops[i]);
        d->n_stops++;
    }
    tok_buf_put(&d->out, "", 0);
    tok_buf_put(&d->text, "", 0);
    tok_buf_put(&d->raw, "", 0);
    return d;
}

void lilac_detok_free(lilac_detok *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n_stops; i++) free(d->stops[i]);
    free(d->stops);
    free(d->stop_len);
    free(d->raw.p);
    free(d->text.p);
    free(d->out.p);
    free(d);
}

/* Move complete characters (and U+FFFD for dead sequences) from raw to text;
 * keep an incomplete tail in raw unless `final`. */
static void drain_raw(lilac_detok *d, bool final) {
    const uint8_t *s = (const uint8_t *)d->raw.p;
    size_t n = d->raw.n, i = 0;
    while (i < n) {
        size_t v = lilac_utf8_check((const char *)s + i, n - i);
        tok_buf_put(&d->text, s + i, v);
        i += v;
        if (i >= n) break;
        if (!final && tok_utf8_incomplete(s + i, n - i)) break;
        tok_buf_put(&d->text, "\xEF\xBF\xBD", 3);
        i += tok_utf8_invalid_len(s + i, n - i);
    }
    memmove(d->raw.p, d->raw.p + i, n - i);
    d->raw.n = n - i;
}

/* Emit text up to the first stop string (-> 1), or all of it but the longest
 * tail that could begin a stop string (-> 0; everything when `final`). */
static int settle(lilac_detok *d, bool final, int *stop_index) {
    size_t best = SIZE_MAX;
    int which = -1;
    for (size_t k = 0; k < d->n_stops; k++) {
        const char *p = memmem(d->text.p, d->text.n, d->stops[k], d->stop_len[k]);
        if (p && (size_t)(p - d->text.p) < best) {
            best = (size_t)(p - d->text.p);
            which = (int)k;
        }
    }
    if (which >= 0) {
        tok_buf_put(&d->out, d->text.p, best);
        d->text.n = 0;
        d->stopped = true;
        if (stop_index) *stop_index = which;
        return 1;
    }
    size_t hold = 0;
    if (!final) {
        for (size_t k = 0; k < d->n_stops; k++) {
            size_t m = d->stop_len[k] - 1 < d->text.n ? d->stop_len[k] - 1 : d->text.n;
            for (size_t h = m; h > hold; h--)
                if (!memcmp(d->text.p + d->text.n - h, d->stops[k], h)) {
                    hold = h;
                    break;
                }
        }
    }
    size_t emit = d->text.n - hold;
    tok_buf_put(&d->out, d->text.p, emit);
    memmove(d->text.p, d->text.p + emit, hold);
    d->text.n = hold;
    d->text.p[hold] = 0;
    return 0;
}

int lilac_detok_push(lilac_detok *d, int32_t id, const char **out, size_t *out_len, int *stop_index) {
    d->out.n = 0;
    d->out.p[0] = 0;
    int rc = 1;
    if (!d->stopped) {
        size_t n;
        const uint8_t *b = lilac_tok_bytes(d->t, id, &n);
        if (b && !(d->skip_special && lilac_tok_is_special(d->t, id))) tok_buf_put(&d->raw, b, n);
        drain_raw(d, false);
        rc = settle(d, false, stop_index);
    }
    *out = d->out.p;
    *out_len = d->out.n;
    return rc;
}

void lilac_detok_finish(lilac_detok *d, const char **out, size_t *out_len) {
    d->out.n = 0;
    d->out.p[0] = 0;
    if (!d->stopped) {
        drain_raw(d, true);
        settle(d, true, NULL);
        d->stopped = true;
    }
    *out = d->out.p;
    *out_len = d->out.n;
}
