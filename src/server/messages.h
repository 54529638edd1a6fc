/* messages.h — the Anthropic Messages API (POST /v1/messages and
 * /v1/messages/count_tokens) in front of the chat path: system, text /
 * tool_use / tool_result / thinking blocks and tools with input_schema become
 * a chat-completions body; the parsed output becomes thinking, text and
 * tool_use blocks, as one message or as Anthropic's SSE events. Errors on
 * these routes have Anthropic's shape ({"type":"error","error":{...}}). */
#ifndef LILAC_MESSAGES_H
#define LILAC_MESSAGES_H

#include <jansson.h>

#include "api.h"
#include "request.h"
#include "../util/sbuf.h"

/* The chat-completions body for a Messages request. count_only: for
 * count_tokens (max_tokens not required). 0 + *chat, or -1 + e. */
int msgs_to_chat(const json_t *body, bool count_only, json_t **chat, srv_error *e);

/* The message object of a finished generation. */
void msgs_write(sbuf *b, const api_result *r, const api_parts *p);

/* The error body in Anthropic's shape. */
void msgs_error_json(sbuf *b, const srv_error *e);

void *msgs_stream_new(sbuf *out, const api_result *r);
extern const api_stream_ops msgs_stream_ops;

#endif
