/* api.h — what the API front ends share: /v1/chat/completions and
 * /v1/completions (http.c), /v1/responses (responses.c) and /v1/messages
 * (messages.c). A finished generation split into reasoning, content and tool
 * calls; how it ended; and the hooks a front end gives http.c's SSE loop, which
 * owns the engine job, the socket and the keepalives. */
#ifndef LILAC_API_H
#define LILAC_API_H

#include <jansson.h>
#include <stdbool.h>

#include "outparse.h"
#include "../util/sbuf.h"

typedef struct {
    char id[40]; /* call_... */
    char *name;
    sbuf args;   /* a JSON object text */
} api_call;

typedef struct { /* the output parser's result for a whole generation */
    sbuf reasoning, content;
    api_call *calls;
    int n_calls;
} api_parts;

extern const op_sink api_parts_sink; /* ud: an api_parts */
void api_parts_free(api_parts *p);

typedef struct {
    const char *id, *model;
    long created;
    const json_t *req;    /* the body as the client sent it */
    int n_prompt, n_cached, n_gen, n_reasoning;
    bool length;          /* ended at the token limit */
    const char *stop_seq; /* the stop string that ended it, else NULL */
} api_result;

/* A streaming front end: its state (first argument) writes SSE bytes to the
 * sbuf it was made with. */
typedef struct {
    const op_sink *sink; /* ud: the state */
    void (*begin)(void *st);
    void (*end)(void *st, const api_result *r);
    void (*error)(void *st, int status, const char *message);
    void (*free)(void *st);
} api_stream_ops;

/* Append the SSE event "event: TYPE\ndata: JSON\n\n" (ev is taken over). */
void api_sse(sbuf *b, const char *type, json_t *ev);
/* Append a JSON value's text (v is taken over). */
void api_put_json(sbuf *b, json_t *v);

/* A JSON object text (the parser's arguments) as a JSON value: the object, or
 * {} when it does not parse. */
json_t *api_args_object(const char *s, size_t n);

/* A random id: prefix + 24 hex digits. */
void api_make_id(char *out, size_t n, const char *prefix);

#endif
