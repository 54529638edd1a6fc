/* responses.h — the OpenAI Responses API (POST /v1/responses) in front of the
 * chat path: the request becomes a chat-completions body (instructions ->
 * system message, input items -> messages, function tools -> tools), and the
 * parsed output becomes output items (reasoning, message, function_call), as
 * one response object or as the Responses API's semantic SSE events.
 *
 * Nothing is stored: previous_response_id, item references and background
 * runs get a 400 that says so. */
#ifndef LILAC_RESPONSES_H
#define LILAC_RESPONSES_H

#include <jansson.h>

#include "api.h"
#include "request.h"
#include "../util/sbuf.h"

/* The chat-completions body for a Responses request. 0 + *chat (new
 * reference), or -1 + e. */
int resp_to_chat(const json_t *body, json_t **chat, srv_error *e);

/* The response object of a finished generation. */
void resp_write(sbuf *b, const api_result *r, const api_parts *p);

/* Streaming: a state that writes events to `out`; r holds what is known
 * before the generation (id, model, created, req, n_prompt). */
void *resp_stream_new(sbuf *out, const api_result *r);
extern const api_stream_ops resp_stream_ops;

#endif
