/* api.c — see api.h. */
#include "api.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../util/common.h"

static void p_reasoning(void *ud, const char *s, size_t n) { sb_put(&((api_parts *)ud)->reasoning, s, n); }
static void p_content(void *ud, const char *s, size_t n) { sb_put(&((api_parts *)ud)->content, s, n); }
static void p_open(void *ud, int index, const char *id, const char *name) {
    api_parts *c = ud;
    (void)index;
    c->calls = xrealloc(c->calls, sizeof(api_call) * (size_t)(c->n_calls + 1));
    api_call *t = &c->calls[c->n_calls++];
    memset(t, 0, sizeof *t);
    snprintf(t->id, sizeof t->id, "%s", id);
    t->name = xstrdup(name);
}
static void p_args(void *ud, int index, const char *s, size_t n) {
    api_parts *c = ud;
    if (index < c->n_calls) sb_put(&c->calls[index].args, s, n);
}
const op_sink api_parts_sink = {p_reasoning, p_content, p_open, p_args};

void api_parts_free(api_parts *c) {
    sb_free(&c->reasoning);
    sb_free(&c->content);
    for (int i = 0; i < c->n_calls; i++) {
        free(c->calls[i].name);
        sb_free(&c->calls[i].args);
    }
    free(c->calls);
    memset(c, 0, sizeof *c);
}

void api_put_json(sbuf *b, json_t *v) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (t) sb_puts(b, t);
    free(t);
    json_decref(v);
}

void api_sse(sbuf *b, const char *type, json_t *ev) {
    sb_printf(b, "event: %s\ndata: ", type);
    api_put_json(b, ev);
    sb_puts(b, "\n\n");
}

json_t *api_args_object(const char *s, size_t n) {
    json_t *o = s && n ? json_loadb(s, n, 0, NULL) : NULL;
    if (!json_is_object(o)) {
        json_decref(o);
        o = json_object();
    }
    return o;
}

void api_make_id(char *out, size_t n, const char *prefix) {
    static atomic_ullong counter;
    uint64_t x = atomic_fetch_add(&counter, 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(lilac_now() * 1e9) ^ (uint64_t)getpid() << 40;
    uint64_t y = x;
    for (int i = 0; i < 2; i++) {
        y ^= y >> 31;
        y *= 0xbf58476d1ce4e5b9ull;
        y ^= y >> 29;
    }
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    snprintf(out, n, "%s%016llx%08x", prefix, (unsigned long long)x, (unsigned)y);
}
