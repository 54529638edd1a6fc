/* compile.c — choice lists, compilation by kind, and the cache of compiled
 * grammars keyed by a hash of their text. */
#include <jansson.h>
#include <stdlib.h>

#include "cg_internal.h"


lilac_grammar *lilac_grammar_from_choices(const char *const *choices, const size_t *lens, size_t n, lilac_err *err) {
    cg_builder b;
    cgb_init(&b, err);
    if (n == 0) cgb_fail(&b, "choice: the list is empty");
    if (n > 100000) cgb_fail(&b, "choice: %zu choices (at most 100000)", n);
    cg_bstr *v = xcalloc(n + 1, sizeof *v);
    for (size_t i = 0; i < n && !b.failed; i++) {
        v[i].p = (const uint8_t *)choices[i];
        v[i].n = lens ? lens[i] : strlen(choices[i]);
    }
    int root = cgb_rule(&b, "root");
    if (!b.failed) cgb_define(&b, root, cg_trie_ast(&b, v, n));
    lilac_grammar *g = b.failed ? NULL : cg_compile(&b, root);
    free(v);
    cgb_free(&b);
    return g;
}

static lilac_grammar *choices_json(const char *text, size_t len, lilac_err *err) {
    json_error_t je;
    json_t *doc = json_loadb(text, len, 0, &je);
    if (!doc || !json_is_array(doc)) {
        if (doc) json_decref(doc);
        lilac_fail(err, "choice: expected a JSON array of strings");
        return NULL;
    }
    size_t n = json_array_size(doc);
    const char **c = xcalloc(n + 1, sizeof *c);
    size_t *l = xcalloc(n + 1, sizeof *l);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(doc, i);
        if (!json_is_string(s)) {
            lilac_fail(err, "choice: $[%zu] is not a string", i);
            free(c), free(l), json_decref(doc);
            return NULL;
        }
        c[i] = json_string_value(s);
        l[i] = json_string_length(s);
    }
    lilac_grammar *g = lilac_grammar_from_choices(c, l, n, err);
    free(c), free(l), json_decref(doc);
    return g;
}

lilac_grammar *lilac_grammar_compile(int kind, const char *text, size_t len, const lilac_schema_opts *o,
                                     lilac_err *err) {
    switch (kind) {
    case LILAC_GRAMMAR_GBNF: return lilac_grammar_from_gbnf(text, len, err);
    case LILAC_GRAMMAR_SCHEMA: return lilac_grammar_from_schema(text, len, o, err);
    case LILAC_GRAMMAR_REGEX: return lilac_grammar_from_regex(text, len, err);
    case LILAC_GRAMMAR_CHOICE: return choices_json(text, len, err);
    }
    lilac_fail(err, "constrain: unknown grammar kind %d", kind);
    return NULL;
}

/* ---- Cache ------------------------------------------------------------------------ */

typedef struct {
    uint64_t h;
    int kind, max_ws;
    char *text;
    size_t len;
    lilac_grammar *g;
    uint64_t used;
} gc_ent;

struct lilac_gcache {
    pthread_mutex_t mu;
    gc_ent *e;
    size_t cap;
    uint64_t clock;
};

lilac_gcache *lilac_gcache_new(size_t cap) {
    lilac_gcache *c = xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->cap = cap ? cap : 1;
    c->e = xcalloc(c->cap, sizeof *c->e);
    return c;
}

void lilac_gcache_free(lilac_gcache *c) {
    if (!c) return;
    for (size_t i = 0; i < c->cap; i++) free(c->e[i].text), lilac_grammar_free(c->e[i].g);
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

lilac_grammar *lilac_gcache_get(lilac_gcache *c, int kind, const char *text, size_t len, const lilac_schema_opts *o,
                                lilac_err *err) {
    lilac_schema_opts def;
    if (!o) lilac_schema_opts_default(&def), o = &def;
    int ws = kind == LILAC_GRAMMAR_SCHEMA ? o->max_ws : 0;
    uint64_t h = lilac_constrain_hash(text, len, (uint64_t)kind * 1000003u + (uint64_t)ws);
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->cap; i++) {
        gc_ent *e = &c->e[i];
        if (e->g && e->h == h && e->kind == kind && e->max_ws == ws && e->len == len && !memcmp(e->text, text, len)) {
            e->used = ++c->clock;
            lilac_grammar *g = lilac_grammar_ref(e->g);
            pthread_mutex_unlock(&c->mu);
            return g;
        }
    }
    pthread_mutex_unlock(&c->mu);
    /* compile outside the lock: two threads may compile the same text; one wins */
    lilac_grammar *g = lilac_grammar_compile(kind, text, len, o, err);
    if (!g) return NULL;
    pthread_mutex_lock(&c->mu);
    gc_ent *v = &c->e[0];
    for (size_t i = 0; i < c->cap; i++)
        if (!c->e[i].g || c->e[i].used < v->used) v = &c->e[i];
    free(v->text);
    lilac_grammar_free(v->g);
    v->h = h, v->kind = kind, v->max_ws = ws, v->len = len;
    v->text = xmalloc(len + 1);
    memcpy(v->text, text, len);
    v->g = lilac_grammar_ref(g);
    v->used = ++c->clock;
    pthread_mutex_unlock(&c->mu);
    return g;
}
