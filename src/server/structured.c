/* structured.c — see structured.h. */
#include "structured.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/common.h"

/* One token index and grammar cache per tokenizer, built on first use and
 * kept for the life of the process (matchers and cached grammars point into
 * the index). */
#define MAX_VOCABS 4
#define GCACHE_SIZE 64
static struct {
    const lilac_tokenizer *tok;
    lilac_cvocab *voc;
    lilac_gcache *cache;
} g_voc[MAX_VOCABS];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static int vocab_for(const lilac_tokenizer *tok, const lilac_model *m, const lilac_cvocab **voc, lilac_gcache **cache,
                     lilac_err *err) {
    pthread_mutex_lock(&g_mu);
    int i = 0;
    while (i < MAX_VOCABS && g_voc[i].tok && g_voc[i].tok != tok) i++;
    if (i == MAX_VOCABS) {
        pthread_mutex_unlock(&g_mu);
        return lilac_fail(err, "structured output: too many tokenizers in one process");
    }
    if (!g_voc[i].tok) {
        int32_t eos[3] = {(int32_t)m->cfg.eos_id, lilac_tok_added_id(tok, "<|im_end|>"), lilac_tok_added_id(tok, "<|endoftext|>")};
        int32_t ids[3];
        size_t n = 0;
        for (int k = 0; k < 3; k++)
            if (eos[k] >= 0) ids[n++] = eos[k];
        lilac_cvocab *v = lilac_cvocab_new(tok, ids, n, err);
        if (!v) {
            pthread_mutex_unlock(&g_mu);
            return -1;
        }
        g_voc[i].voc = v;
        g_voc[i].cache = lilac_gcache_new(GCACHE_SIZE);
        g_voc[i].tok = tok;
    }
    *voc = g_voc[i].voc;
    *cache = g_voc[i].cache;
    pthread_mutex_unlock(&g_mu);
    return 0;
}

int srv_constraint_build(const srv_request *r, const lilac_tokenizer *tok, const lilac_model *m, srv_constraint *c,
                         srv_error *e) {
    memset(c, 0, sizeof *c);
    const bool forced_tool = r->tools && (r->tool_choice == TOOLS_REQUIRED || r->tool_choice == TOOLS_NAMED);
    const int32_t V = (int32_t)m->cfg.vocab;
    for (int i = 0; i < r->n_bias; i++)
        if (r->bias_ids[i] >= V)
            return srv_bad(e, "logit_bias", "'logit_bias' token id %d is outside the vocabulary (%d)", r->bias_ids[i], V);
    if (!r->grammar && !forced_tool) return 0;
    lilac_err err = {{0}};
    lilac_gcache *cache = NULL;
    if (vocab_for(tok, m, &c->voc, &cache, &err) < 0)
        return srv_err(e, 500, "server_error", NULL, NULL, "structured output: %s", err.msg);
    if (r->grammar) {
        c->g = lilac_gcache_get(cache, r->grammar_kind, r->grammar, r->grammar_len, NULL, &err);
        if (!c->g)
            return srv_err(e, 400, "invalid_request_error", r->grammar_param, "invalid_grammar", "invalid '%s': %s",
                           r->grammar_param, err.msg);
        return 0;
    }
    json_t *spec = json_pack("{s:O}", "tools", (json_t *)r->tools);
    if (r->tool_choice == TOOLS_NAMED) json_object_set_new(spec, "name", json_string(r->tool_name));
    char *text = json_dumps(spec, JSON_COMPACT); /* key order kept: parameters follow the schema's order */
    json_decref(spec);
    if (!text) return srv_bad(e, "tools", "'tools' cannot be serialised");
    c->g = lilac_gcache_get(cache, LILAC_GRAMMAR_QWEN_TOOLS, text, strlen(text), NULL, &err);
    free(text);
    if (!c->g)
        return srv_err(e, 400, "invalid_request_error", "tools", "invalid_tool_schema",
                       "tool_choice forces a call, but a tool's parameters cannot be enforced: %s", err.msg);
    return 0;
}

int srv_constraint_job(const srv_constraint *c, const srv_request *r, const lilac_tokenizer *tok, const lilac_model *m,
                       eng_job *j, srv_error *e) {
    (void)m;
    if (r->n_bias) {
        j->bias_ids = xmalloc(sizeof(int32_t) * (size_t)r->n_bias);
        j->bias_vals = xmalloc(sizeof(float) * (size_t)r->n_bias);
        memcpy(j->bias_ids, r->bias_ids, sizeof(int32_t) * (size_t)r->n_bias);
        memcpy(j->bias_vals, r->bias_vals, sizeof(float) * (size_t)r->n_bias);
        j->n_bias = r->n_bias;
    }
    if (!c->g) return 0;
    lilac_err err = {{0}};
    if (!(j->matcher = lilac_matcher_new(c->g, c->voc, &err)))
        return srv_err(e, 500, "server_error", NULL, NULL, "structured output: %s", err.msg);
    /* reasoning left open at the end of the prompt (<think> after the last
     * </think>): it streams unconstrained, the constraint starts after </think> */
    const int32_t open = lilac_tok_added_id(tok, "<think>"), close = lilac_tok_added_id(tok, "</think>");
    int last_open = -1, last_close = -1;
    for (int i = 0; i < j->n_prompt; i++) {
        if (j->prompt[i] == open) last_open = i;
        if (j->prompt[i] == close) last_close = i;
    }
    j->constrain_after = open >= 0 && close >= 0 && last_open > last_close ? close : -1;
    return 0;
}

void srv_constraint_free(srv_constraint *c) {
    lilac_grammar_free(c->g);
    memset(c, 0, sizeof *c);
}
