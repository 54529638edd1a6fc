/* structured.h — a request's output constraint (structured output): its
 * grammar compiled for the server's tokenizer (cached across requests), one
 * matcher per job, and its logit_bias checked against the vocabulary. */
#ifndef LILAC_STRUCTURED_H
#define LILAC_STRUCTURED_H

#include "../engine/engine.h"
#include "request.h"

typedef struct {
    lilac_grammar *g; /* NULL: unconstrained */
    const lilac_cvocab *voc;
} srv_constraint;

/* The grammar of r's constraint: response_format / guided_* / grammar /
 * json_schema, or a forced tool call (tool_choice "required" or named) in
 * Qwen's XML syntax. 0 (c->g NULL when there is none), or -1 + e: a 400
 * naming the construct and its path. */
int srv_constraint_build(const srv_request *r, const lilac_tokenizer *tok, const lilac_model *m, srv_constraint *c,
                         srv_error *e);
/* Give job j its matcher (after the prompt's open reasoning when there is
 * one: the constraint starts after </think>) and r's logit_bias. 0 or -1 + e. */
int srv_constraint_job(const srv_constraint *c, const srv_request *r, const lilac_tokenizer *tok, const lilac_model *m,
                       eng_job *j, srv_error *e);
void srv_constraint_free(srv_constraint *c);

#endif
