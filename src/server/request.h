/* request.h — parsing and validation of the OpenAI-style request bodies
 * (/v1/chat/completions, /v1/completions). Pure: jansson only, no model, no
 * socket, so the parser is fuzzed on its own (fuzz/fuzz_request.c).
 *
 * Every rejection fills an srv_error with the HTTP status and an OpenAI-shaped
 * error (type, param, code, message); nothing here can crash on any input. */
#ifndef LILAC_REQUEST_H
#define LILAC_REQUEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "../model/sampler.h"

typedef struct {
    int status;        /* HTTP status */
    char type[40];     /* invalid_request_error, authentication_error, ... */
    char code[48];     /* "" -> null */
    char param[64];    /* "" -> null */
    char message[600];
    long n_prompt, n_ctx; /* context errors: > 0 adds n_prompt_tokens / n_ctx */
    int shape;            /* SRV_SHAPE_*: how the body is written */
} srv_error;

enum { SRV_SHAPE_OPENAI, SRV_SHAPE_ANTHROPIC };

/* Fill e; returns -1 for `return srv_err(...)`. */
int srv_err(srv_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
#define srv_bad(e, param, ...) srv_err(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

typedef enum { REQ_CHAT, REQ_COMPLETION } req_kind;

enum { SET_TEMP = 1, SET_TOP_P = 2, SET_TOP_K = 4, SET_MIN_P = 8, SET_REP = 16, SET_PRES = 32, SET_FREQ = 64 };

enum { TOOLS_NONE, TOOLS_AUTO, TOOLS_REQUIRED, TOOLS_NAMED };

#define SRV_MAX_CHOICES 16 /* n and best_of */
#define SRV_MAX_PROMPTS 64 /* prompts in one /v1/completions request */
#define SRV_MAX_JOBS 64    /* prompts x best_of */

typedef struct {
    const char *text; /* borrowed from root; NULL when given as ids */
    size_t len;
    int32_t *ids;     /* owned */
    int n_ids;
} srv_prompt;

typedef struct {
    req_kind kind;
    json_t *root;            /* the parsed body (owned) */
    json_t *messages;        /* chat: a normalised copy (owned; developer -> system) */
    const json_t *tools;     /* chat: borrowed from root; NULL if absent or tool_choice "none" */
    int tool_choice;
    srv_prompt *prompts;     /* completion: one or more prompts, text or token ids (owned) */
    int n_prompts;
    int n, best_of;          /* choices per prompt; candidates they are chosen from (>= n) */
    bool echo;               /* completion: the prompt precedes the text */
    const char *model;       /* "" when absent */
    bool stream, include_usage;
    long max_tokens;         /* -1: not given */
    lilac_sampling samp;
    unsigned set;            /* SET_*: the sampling fields the request gave */
    char **stops;            /* owned */
    int n_stops;
    bool logprobs;
    int top_logprobs;
    bool enable_thinking, preserve_thinking;
    bool ignore_eos, cache_prompt;
    const char *forced;      /* "lilac_forced_output" (honoured only with --test-hooks) */
    size_t forced_len;
} srv_request;

/* Parse and validate `len` bytes of body. 0, or -1 with e filled (r is then
 * freed already). */
int srv_parse_request(const char *body, size_t len, req_kind kind, srv_request *r, srv_error *e);
/* The same, from a parsed body (taken over: freed with r or on error). */
int srv_parse_request_json(json_t *root, req_kind kind, srv_request *r, srv_error *e);
void srv_request_free(srv_request *r);

/* Parse a JSON object body for the small endpoints (/tokenize, ...). NULL + e.
 * Bodies with more than srv_json_max_values values get a 413 before jansson
 * builds them (it spends tens of bytes per value). */
json_t *srv_parse_object(const char *body, size_t len, srv_error *e);

#define SRV_JSON_MAX_VALUES ((size_t)1 << 20)
extern size_t srv_json_max_values; /* --max-json-values; SRV_JSON_MAX_VALUES by default */

/* An upper bound on the JSON values in p[0..n) (strings, numbers, literals,
 * arrays, objects; object keys count too), in one linear pass; counting stops
 * past `stop`. Any bytes are accepted. */
size_t srv_json_count_values(const char *p, size_t n, size_t stop);

/* Header checks made before any body byte is read (pure, fuzzed). */
/* Is `host` (a Host header: name or [v6], optional :port) in the comma-separated
 * list `allowed`? "*" in the list allows any. */
bool srv_host_allowed(const char *host, const char *allowed);
/* Is `ctype` application/json (any case, optional parameters)? */
bool srv_ctype_json(const char *ctype);

#endif
