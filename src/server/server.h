/* server.h — `lilac serve`: the OpenAI-compatible HTTP server (libmicrohttpd,
 * one thread per connection) in front of the engine worker (engine/engine.h).
 *
 * A connection thread reads the body (capped: 413), parses and validates it
 * (request.h), renders the chat template, tokenises, checks the context, and
 * only then answers: a 4xx before any header is sent, or queues an engine job
 * and streams (SSE) or waits for it. Host, route, method, API key, Content-Type
 * and Content-Length are decided from the headers, before any body byte is
 * buffered. A watchdog thread closes connections past their absolute header or
 * body deadline. Client disconnects (a reset socket, a failed write, MHD's
 * completion callback) cancel the job; a half-close does not. */
#ifndef LILAC_SERVER_H
#define LILAC_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "../engine/engine.h"
#include "../model/weights.h"
#include "../tokenizer/tokenizer.h"

enum { REASONING_CONTENT = 1, REASONING_FIELD = 2 }; /* bit mask: which field(s) carry thinking */

typedef struct {
    const char *host;          /* default 127.0.0.1 */
    int port;                  /* default 8000; 0: any free port (printed) */
    const char *api_key;       /* NULL: no key; comma-separated list allowed */
    const char *cors_origin;   /* NULL: no CORS headers; "*" or an origin */
    const char *alias;         /* model id in /v1/models and responses */
    size_t max_body;           /* bytes; 413 past it */
    double ping_s;             /* SSE keepalive interval while waiting; 0: off */
    int timeout_s;             /* idle connection timeout */
    int max_conns;             /* connections in all */
    int max_conns_per_client;  /* connections from one IP address */
    int header_timeout_s;      /* absolute: accept (or the previous answer) to the end of the headers */
    int body_timeout_s;        /* absolute: end of the headers to the end of the body */
    const char *allowed_hosts; /* comma-separated Host names (port ignored); NULL: loopback names when bound
                                  to loopback, else any; "*": any */
    bool metrics_public;       /* /metrics without the API key */
    size_t max_json_values;    /* JSON values (scalars, arrays, objects) in one body */
    long max_tokenize;         /* tokens /tokenize answers with; 0: the context length */
    int reasoning;             /* REASONING_* mask */
    bool test_hooks;           /* honour "lilac_forced_output" (tests only) */
    bool disconnect_check;     /* probe the client socket for a reset while waiting */
    bool strict_model;         /* 404 for a model name other than the alias */
    bool quiet;
    bool log_prompts;          /* the request log holds each body (default: never prompt text) */
} srv_options;

void srv_options_default(srv_options *o);

/* What the engine side provides once the model is loaded. */
typedef struct {
    lilac_engine *engine;
    const lilac_tokenizer *tok;
    const lilac_model *model;
    const char *model_dir;
    int64_t max_seq;
    lilac_sampling defaults;   /* from generation_config.json */
    unsigned defaults_set;     /* SET_* fields generation_config gave */
} srv_backend;

typedef struct srv srv;

/* Start listening (/health answers 503 until srv_set_ready). The host is an
 * IPv4 or IPv6 address ("::1" or "[::1]") or a name; the port must be free (a
 * busy port is an error naming it). The chosen port is in *port_out when
 * port_out is not NULL. NULL + err on failure. */
srv *srv_start(const srv_options *o, int *port_out, lilac_err *err);
/* "http://host:port" (IPv6 in brackets), the address it listens on. */
const char *srv_url(const srv *s);
void srv_set_ready(srv *s, const srv_backend *b);
/* Stop accepting, cancel in-flight work (streams end with an error event),
 * join every connection thread. The engine is left to the caller to free. */
void srv_stop(srv *s);

/* Read DIR/generation_config.json into sampling defaults and EOS ids (appended
 * to *eos, a malloc'd array of *n_eos). Missing file: nothing set. */
void srv_load_generation_config(const char *dir, lilac_sampling *d, unsigned *set, int32_t **eos, int *n_eos);

#endif
