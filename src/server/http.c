/* http.c — the HTTP side of `lilac serve`; see server.h.
 *
 * libmicrohttpd in thread-per-connection mode: every handler and stream reader
 * runs on its connection's own thread and may block (on the job's condition
 * variable, with a timeout so keepalive pings and disconnect probes happen). */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <strings.h>
#include <sys/socket.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../chat/chat.h"
#include "../model/config.h"
#include "../model/safetensors.h"
#include "../util/log.h"
#include "api.h"
#include "info.h"
#include "messages.h"
#include "metrics.h"
#include "outparse.h"
#include "request.h"
#include "../util/sbuf.h"
#include "responses.h"
#include "server.h"

struct srv {
    srv_options o;
    struct MHD_Daemon *d;
    srv_backend b;
    atomic_int ready;    /* 0 loading, 1 ready, 2 stopping */
    atomic_ullong http_requests, http_errors;
    atomic_ullong next_id;
    atomic_int active; /* requests between their first byte and completion */
    atomic_int damage_logged;
    char *allowed_hosts; /* effective Host allowlist (owned) */
    int listen_fd;       /* the listening socket (MHD_OPTION_LISTEN_SOCKET), closed after the daemon stops */
    char url[160];       /* http://host:port, as announced */
    srv_metrics *metrics;
    /* requests between their headers and their completion, for the KV-usage gauges */
    pthread_mutex_t live_mu;
    struct conn_ctx *live;
    /* deadlines: every open connection, checked by the watchdog thread */
    pthread_mutex_t track_mu;
    pthread_cond_t track_cv;
    struct track *tracks;
    pthread_t watchdog;
    bool watchdog_started, watchdog_stop;
};

void srv_options_default(srv_options *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->alias = "qwen3.6-35b-a3b";
    o->max_body = 32u << 20;
    o->ping_s = 5;
    o->timeout_s = 60;
    o->max_conns = 1024;
    o->max_conns_per_client = 128;
    o->header_timeout_s = 10;
    o->body_timeout_s = 60;
    o->max_json_values = SRV_JSON_MAX_VALUES;
    o->reasoning = REASONING_CONTENT;
    o->disconnect_check = true;
}

/* ---- per-connection state --------------------------------------------------- */

typedef struct conn_ctx {
    srv *S;
    sbuf body;
    int route;
    bool responded;
    eng_job *job; /* a reference, so the completion callback can cancel it; set under S->live_mu */
    /* for the request log line */
    struct conn_ctx *prev, *next; /* in S->live */
    double t0;
    char method[12];
    char path[128];
} conn_ctx;

/* One open connection (MHD's socket context), in S->tracks under track_mu.
 * MHD has only an inactivity timeout, which each trickled byte resets; the
 * watchdog closes a connection whose headers or body are not complete by an
 * absolute deadline. MHD calls the CLOSED notification before it closes the
 * socket, so under track_mu the fd is never one that was reused. */
typedef struct track {
    struct track *prev, *next;
    int fd;
    double deadline; /* lilac_now() seconds; 0: none (a request is being answered) */
    bool body_phase; /* the deadline is the body's */
} track;

/* ---- request log and per-request metrics ----------------------------------------- */

/* A new request: remembered for its log line, and listed for the KV-usage gauges. */
static void conn_begin(srv *S, conn_ctx *cc, const char *method, const char *url) {
    cc->t0 = lilac_now();
    snprintf(cc->method, sizeof cc->method, "%s", method);
    /* the path only, printable bytes only: a log line is one line */
    size_t n = 0;
    for (const char *p = url; *p && *p != '?' && n + 1 < sizeof cc->path; p++)
        cc->path[n++] = (unsigned char)*p > 0x20 && (unsigned char)*p < 0x7f ? *p : '?';
    cc->path[n] = 0;
    pthread_mutex_lock(&S->live_mu);
    cc->next = S->live;
    if (S->live) S->live->prev = cc;
    S->live = cc;
    pthread_mutex_unlock(&S->live_mu);
}

static void conn_unlist(srv *S, conn_ctx *cc) {
    pthread_mutex_lock(&S->live_mu);
    if (cc->prev) cc->prev->next = cc->next;
    else if (S->live == cc) S->live = cc->next;
    if (cc->next) cc->next->prev = cc->prev;
    cc->prev = cc->next = NULL;
    pthread_mutex_unlock(&S->live_mu);
}

/* The request is over (answered, or the client went away): its log line, and its
 * generation's latencies for /metrics. */
static void conn_end(srv *S, struct MHD_Connection *c, conn_ctx *cc, bool completed) {
    conn_unlist(S, cc);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS);
    unsigned status = ci ? ci->http_status : 0;
    double now = lilac_now();
    eng_job *j = cc->job;
    int n_prompt = 0, n_gen = 0;
    double ttft = -1;
    char finish[16] = "";
    if (j) {
        pthread_mutex_lock(&j->mu);
        bool done = j->state == JOB_DONE;
        n_prompt = j->n_prompt;
        n_gen = j->n_gen;
        if (j->t_first > 0) ttft = j->t_first - j->t_submit;
        snprintf(finish, sizeof finish, "%s", done ? j->finish : "cancelled");
        double e2e = (done ? j->t_end : now) - j->t_submit, itl = 0;
        if (done && n_gen > 1 && j->t_first > 0) itl = (j->t_end - j->t_first) / (n_gen - 1);
        pthread_mutex_unlock(&j->mu);
        const char *reason = !strcmp(finish, "stop") ? "stop" : !strcmp(finish, "length") ? "length"
                           : !strcmp(finish, "cancelled") ? "abort" : NULL;
        if (reason) srv_metrics_observe(S->metrics, reason, e2e, ttft, itl, itl > 0 ? n_gen - 1 : 0, n_prompt, n_gen);
    }
    if (!lilac_log_on(LOG_INFO)) return;
    char client[INET6_ADDRSTRLEN + 2] = "-";
    const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ai && ai->client_addr) {
        const struct sockaddr *sa = ai->client_addr;
        if (sa->sa_family == AF_INET) inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, client, sizeof client);
        else if (sa->sa_family == AF_INET6)
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, client, sizeof client);
    }
    char st[16] = "-", tt[32] = "-";
    if (status) snprintf(st, sizeof st, "%u", status);
    if (ttft >= 0) snprintf(tt, sizeof tt, "%.3f", ttft);
    if (j)
        lilac_log(LOG_INFO, "serve", "%s %s %s client=%s prompt_tokens=%d completion_tokens=%d ttft_s=%s duration_s=%.3f finish=%s%s",
                  cc->method, cc->path, st, client, n_prompt, n_gen, tt, now - cc->t0, finish[0] ? finish : "-",
                  completed ? "" : " (connection closed early)");
    else
        lilac_log(LOG_INFO, "serve", "%s %s %s client=%s duration_s=%.3f%s", cc->method, cc->path, st, client,
                  now - cc->t0, completed ? "" : " (connection closed early)");
    if (S->o.log_prompts && cc->body.n) {
        size_t n = cc->body.n < 65536 ? cc->body.n : 65536;
        sbuf b = {0};
        sb_json_str(&b, cc->body.p, n);
        lilac_log(LOG_INFO, "serve", "%s %s body=%s%s", cc->method, cc->path, b.p, n < cc->body.n ? " (cut)" : "");
        sb_free(&b);
    }
}

/* ---- small helpers ------------------------------------------------------------- */

static void add_cors(srv *S, struct MHD_Connection *c, struct MHD_Response *r) {
    if (!S->o.cors_origin) return;
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!strcmp(S->o.cors_origin, "*")) MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    else if (origin && !strcmp(origin, S->o.cors_origin)) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(r, "Vary", "Origin");
    }
}

static enum MHD_Result send_buf(srv *S, struct MHD_Connection *c, unsigned status, const char *ctype, const char *p,
                                size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)p, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    add_cors(S, c, r);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(srv *S, struct MHD_Connection *c, unsigned status, const sbuf *b) {
    return send_buf(S, c, status, "application/json", b->p ? b->p : "", b->n);
}

/* OpenAI's error shape ("code" a string or null), or Anthropic's on its routes. */
static void error_json(sbuf *b, const srv_error *e) {
    if (e->shape == SRV_SHAPE_ANTHROPIC) {
        msgs_error_json(b, e);
        return;
    }
    sb_puts(b, "{\"error\":{\"message\":");
    sb_json_str(b, e->message, strlen(e->message));
    sb_puts(b, ",\"type\":");
    sb_json_str(b, e->type, strlen(e->type));
    sb_puts(b, ",\"param\":");
    if (e->param[0]) sb_json_str(b, e->param, strlen(e->param));
    else sb_puts(b, "null");
    sb_puts(b, ",\"code\":");
    if (e->code[0]) sb_json_str(b, e->code, strlen(e->code));
    else sb_puts(b, "null");
    if (e->n_prompt > 0) sb_printf(b, ",\"n_prompt_tokens\":%ld,\"n_ctx\":%ld", e->n_prompt, e->n_ctx);
    sb_puts(b, "}}");
}

static enum MHD_Result send_error(srv *S, struct MHD_Connection *c, const srv_error *e) {
    atomic_fetch_add(&S->http_errors, 1);
    sbuf b = {0};
    error_json(&b, e);
    struct MHD_Response *r = MHD_create_response_from_buffer(b.n, b.p, MHD_RESPMEM_MUST_COPY);
    sb_free(&b);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (e->status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (e->status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    add_cors(S, c, r);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)e->status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result fail(srv *S, struct MHD_Connection *c, int status, const char *type, const char *param,
                            const char *code, const char *msg) {
    srv_error e;
    srv_err(&e, status, type, param, code, "%s", msg);
    return send_error(S, c, &e);
}

/* Has the connection been reset (or failed)? A half-close is not a disconnect:
 * a client that shuts down its sending side (`nc -N`, some HTTP/1.0 clients)
 * still reads its answer. A peer that closed without a reset is found by the
 * next write: its reset makes that write, or the probe after it, fail. */
static bool peer_reset(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = 0};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

/* Constant-time comparison of a presented key against each configured key. */
static bool key_ok(const char *keys, const char *given) {
    if (!given) return false;
    while (*given == ' ' || *given == '\t') given++; /* keys are trimmed at start-up; so is the presented one */
    size_t gl = strlen(given);
    while (gl && (given[gl - 1] == ' ' || given[gl - 1] == '\t')) gl--;
    bool ok = false;
    const char *k = keys;
    while (*k) {
        const char *end = strchr(k, ',');
        size_t kl = end ? (size_t)(end - k) : strlen(k);
        unsigned diff = (unsigned)(kl ^ gl);
        for (size_t i = 0; i < kl; i++) diff |= (unsigned char)k[i] ^ (unsigned char)(i < gl ? given[i] : 0);
        ok |= kl > 0 && diff == 0;
        if (!end) break;
        k = end + 1;
    }
    return ok;
}

static bool authorized(srv *S, struct MHD_Connection *c) {
    if (!S->o.api_key || !S->o.api_key[0]) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (h && !strncasecmp(h, "Bearer ", 7)) {
        if (key_ok(S->o.api_key, h + 7)) return true;
    }
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    return key_ok(S->o.api_key, x);
}

static void make_id(srv *S, char *out, size_t n, const char *prefix) {
    uint64_t x = atomic_fetch_add(&S->next_id, 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(lilac_now() * 1e9);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    snprintf(out, n, "%s%016llx%08x", prefix, (unsigned long long)x, (unsigned)(x >> 17) ^ (unsigned)getpid());
}

/* ---- prompts ---------------------------------------------------------------- */

/* Render + tokenise a chat request. 0, or -1 + e. */
static int chat_prompt(srv *S, const srv_request *r, bool add_gen, lilac_prompt *pr, lilac_ids *ids, srv_error *e) {
    lilac_chat_opts co;
    lilac_chat_opts_default(&co);
    co.enable_thinking = r->enable_thinking;
    co.preserve_thinking = r->preserve_thinking;
    co.add_generation_prompt = add_gen;
    co.text_only = true; /* the validator refused media parts; the renderer refuses them too */
    lilac_err err = {{0}};
    memset(pr, 0, sizeof *pr);
    if (lilac_chat_render(r->messages, r->tools, &co, pr, &err) < 0)
        return srv_bad(e, "messages", "cannot render the chat template: %s", err.msg);
    if (ids && lilac_prompt_encode(S->b.tok, pr, false, ids, &err) < 0)
        return srv_bad(e, "messages", "cannot tokenise the prompt: %s", err.msg);
    return 0;
}

/* ---- generation results --------------------------------------------------------- */

static void json_token_bytes(sbuf *b, const lilac_tokenizer *t, int32_t id, bool with_bytes) {
    size_t n = 0;
    const uint8_t *p = lilac_tok_bytes(t, id, &n);
    sb_puts(b, "\"token\":");
    sb_json_str(b, p ? (const char *)p : "", n);
    if (!with_bytes) return;
    sb_puts(b, ",\"bytes\":[");
    for (size_t i = 0; i < n; i++) sb_printf(b, i ? ",%u" : "%u", p[i]);
    sb_puts(b, "]");
}

/* Chat logprobs object for toks[0..n): {"content":[...]} */
static void chat_logprobs(sbuf *b, const lilac_tokenizer *t, const eng_tok *toks, int n) {
    sb_puts(b, "{\"content\":[");
    for (int i = 0; i < n; i++) {
        const eng_tok *x = &toks[i];
        sb_puts(b, i ? ",{" : "{");
        json_token_bytes(b, t, x->id, true);
        sb_puts(b, ",\"logprob\":");
        sb_json_num(b, x->lp);
        sb_puts(b, ",\"top_logprobs\":[");
        for (int k = 0; k < x->n_top; k++) {
            sb_puts(b, k ? ",{" : "{");
            json_token_bytes(b, t, x->top_id[k], true);
            sb_puts(b, ",\"logprob\":");
            sb_json_num(b, x->top_lp[k]);
            sb_puts(b, "}");
        }
        sb_puts(b, "]}");
    }
    sb_puts(b, "]}");
}

/* A completion token as a JSON string, as OpenAI writes it: its text when its
 * bytes are valid UTF-8, else "bytes:\xNN..." (a piece of a character), so two
 * tokens never collapse into one "\ufffd" key of top_logprobs. */
static void cmpl_token(sbuf *b, const lilac_tokenizer *t, int32_t id) {
    size_t n = 0;
    const uint8_t *p = lilac_tok_bytes(t, id, &n);
    const char *s = p ? (const char *)p : "";
    if (!p) n = 0;
    if (lilac_utf8_check(s, n) == n) {
        sb_json_str(b, s, n);
        return;
    }
    sbuf k = {0};
    sb_puts(&k, "bytes:");
    for (size_t i = 0; i < n; i++) sb_printf(&k, "\\x%02x", p[i]);
    sb_json_str(b, k.p, k.n);
    sb_free(&k);
}

/* Completions logprobs: {"tokens","token_logprobs","top_logprobs","text_offset"} */
static void cmpl_logprobs(sbuf *b, const lilac_tokenizer *t, const eng_tok *toks, int n, size_t text_off) {
    sb_puts(b, "{\"tokens\":[");
    for (int i = 0; i < n; i++) {
        if (i) sb_putc(b, ',');
        cmpl_token(b, t, toks[i].id);
    }
    sb_puts(b, "],\"token_logprobs\":[");
    for (int i = 0; i < n; i++) {
        if (i) sb_putc(b, ',');
        sb_json_num(b, toks[i].lp);
    }
    sb_puts(b, "],\"top_logprobs\":[");
    for (int i = 0; i < n; i++) {
        sb_puts(b, i ? ",{" : "{");
        sbuf keys[ENG_MAX_TOP];
        memset(keys, 0, sizeof keys);
        for (int k = 0; k < toks[i].n_top; k++) {
            cmpl_token(&keys[k], t, toks[i].top_id[k]);
            for (int m = 0; m < k; m++) /* the same bytes under two ids: keep both */
                if (keys[m].n == keys[k].n && !memcmp(keys[m].p, keys[k].p, keys[k].n)) {
                    sb_clear(&keys[k]);
                    sb_printf(&keys[k], "\"token_id:%d\"", toks[i].top_id[k]);
                    break;
                }
            if (k) sb_putc(b, ',');
            sb_put(b, keys[k].p, keys[k].n);
            sb_putc(b, ':');
            sb_json_num(b, toks[i].top_lp[k]);
        }
        for (int k = 0; k < toks[i].n_top; k++) sb_free(&keys[k]);
        sb_puts(b, "}");
    }
    sb_puts(b, "],\"text_offset\":[");
    size_t off = text_off;
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        lilac_tok_bytes(t, toks[i].id, &len);
        sb_printf(b, i ? ",%zu" : "%zu", off);
        off += len;
    }
    sb_puts(b, "]}");
}

static const char *finish_reason(const eng_job *j, int n_calls) {
    if (!strcmp(j->finish, "length")) return "length";
    return n_calls > 0 ? "tool_calls" : "stop";
}

/* ---- job set-up ------------------------------------------------------------------ */

enum { API_CHAT, API_CMPL, API_RESPONSES, API_MESSAGES };

typedef struct {
    int api;           /* API_* */
    srv_request r;
    json_t *orig;      /* Responses / Messages: the body as sent (owned) */
    eng_job **jobs;    /* prompt p, candidate k: jobs[p * r.best_of + k] */
    int n_jobs, n_prompts;
    char **echo;       /* completions with echo: each prompt's text (owned) */
    size_t *echo_len;
} gen_req;

static void gen_req_free(gen_req *g) {
    srv_request_free(&g->r);
    json_decref(g->orig);
    for (int i = 0; i < g->n_jobs; i++) eng_job_unref(g->jobs[i]);
    free(g->jobs);
    for (int i = 0; g->echo && i < g->n_prompts; i++) free(g->echo[i]);
    free(g->echo);
    free(g->echo_len);
    memset(g, 0, sizeof *g);
}

static int context_error(srv_error *e, bool chat, long n, long max_tokens, long ctx) {
    const char *what = chat ? "messages" : "prompt";
    if (n < ctx)
        srv_err(e, 400, "exceed_context_size_error", what, "context_length_exceeded",
                "This model's maximum context length is %ld tokens. However, you requested %ld tokens (%ld in the %s, "
                "%ld in the completion). Please reduce the length of the %s or completion.",
                ctx, n + max_tokens, n, what, max_tokens, what);
    else
        srv_err(e, 400, "exceed_context_size_error", what, "context_length_exceeded",
                "This model's maximum context length is %ld tokens. However, your %s resulted in %ld tokens, which "
                "leaves no room for a completion. Please reduce the length of the %s.",
                ctx, what, n, what);
    e->n_prompt = n;
    e->n_ctx = ctx;
    return -1;
}

/* A job for prompt ids[0..n) as choice candidate k. */
static eng_job *make_job(srv *S, const srv_request *r, const lilac_ids *ids, int k, long ctx) {
    eng_job *j = eng_job_new();
    int n = (int)ids->n;
    j->n_prompt = n;
    j->prompt = xmalloc(sizeof(int32_t) * (size_t)n);
    memcpy(j->prompt, ids->ids, sizeof(int32_t) * (size_t)n);
    j->max_tokens = r->max_tokens > 0 ? (int)r->max_tokens : (int)(ctx - n);
    /* sampling: request fields, else generation_config, else neutral */
    lilac_sampling s = r->samp;
    const lilac_sampling *d = &S->b.defaults;
    unsigned ds = S->b.defaults_set;
    if (!(r->set & SET_TEMP) && (ds & SET_TEMP)) s.temperature = d->temperature;
    if (!(r->set & SET_TOP_P) && (ds & SET_TOP_P)) s.top_p = d->top_p;
    if (!(r->set & SET_TOP_K) && (ds & SET_TOP_K)) s.top_k = d->top_k;
    if (!(r->set & SET_MIN_P) && (ds & SET_MIN_P)) s.min_p = d->min_p;
    if (!(r->set & SET_REP) && (ds & SET_REP)) s.repetition_penalty = d->repetition_penalty;
    if (!(r->set & SET_PRES) && (ds & SET_PRES)) s.presence_penalty = d->presence_penalty;
    if (s.has_seed) s.seed += (uint64_t)k; /* each choice its own reproducible draw */
    j->samp = s;
    j->n_stops = r->n_stops;
    if (r->n_stops) {
        j->stops = xcalloc((size_t)r->n_stops, sizeof(char *));
        for (int i = 0; i < r->n_stops; i++) j->stops[i] = xstrdup(r->stops[i]);
    }
    j->logprobs = r->logprobs || r->best_of > r->n; /* best_of ranks the candidates by their logprobs */
    j->top_logprobs = r->top_logprobs;
    j->ignore_eos = r->ignore_eos;
    j->cache_prompt = r->cache_prompt;
    return j;
}

/* Parse (translating Responses / Messages bodies), render, tokenise, check the
 * context and build the jobs. 0 or -1 + e. */
static int prepare(srv *S, const char *body, size_t len, int api, gen_req *g, srv_error *e) {
    memset(g, 0, sizeof *g);
    g->api = api;
    req_kind kind = api == API_CMPL ? REQ_COMPLETION : REQ_CHAT;
    if (api == API_RESPONSES || api == API_MESSAGES) {
        if (!(g->orig = srv_parse_object(body, len, e))) return -1;
        json_t *chat;
        if ((api == API_RESPONSES ? resp_to_chat(g->orig, &chat, e) : msgs_to_chat(g->orig, false, &chat, e)) < 0) return -1;
        if (srv_parse_request_json(chat, REQ_CHAT, &g->r, e) < 0) return -1;
        g->r.n = g->r.best_of = 1;
    } else if (srv_parse_request(body, len, kind, &g->r, e) < 0) return -1;
    srv_request *r = &g->r;
    if (S->o.strict_model && r->model[0] && strcmp(r->model, S->o.alias))
        return srv_err(e, 404, "not_found_error", "model", "model_not_found", "The model '%.100s' does not exist.",
                       r->model);
    lilac_err err = {{0}};
    long ctx = (long)S->b.max_seq;
    g->n_prompts = kind == REQ_CHAT ? 1 : r->n_prompts;
    g->jobs = xcalloc((size_t)(g->n_prompts * r->best_of), sizeof(eng_job *));
    if (r->echo) {
        g->echo = xcalloc((size_t)g->n_prompts, sizeof(char *));
        g->echo_len = xcalloc((size_t)g->n_prompts, sizeof(size_t));
    }
    for (int p = 0; p < g->n_prompts; p++) {
        lilac_ids ids = {0};
        int rc = 0;
        const srv_prompt *sp = kind == REQ_COMPLETION ? &r->prompts[p] : NULL;
        if (kind == REQ_CHAT) {
            lilac_prompt pr;
            rc = chat_prompt(S, r, true, &pr, &ids, e);
            lilac_prompt_free(&pr);
        } else if (sp->ids) {
            int32_t V = (int32_t)S->b.model->cfg.vocab;
            for (int i = 0; i < sp->n_ids && !rc; i++) {
                if (sp->ids[i] >= V) rc = srv_bad(e, "prompt", "token id %d is outside the vocabulary (%d)", sp->ids[i], V);
                else lilac_ids_push(&ids, sp->ids[i]);
            }
        } else if (lilac_tok_encode(S->b.tok, sp->text, sp->len, LILAC_TOK_SPECIAL, &ids, &err) < 0)
            rc = srv_bad(e, "prompt", "cannot tokenise the prompt: %s", err.msg);
        long n = (long)ids.n;
        if (!rc && n == 0) rc = srv_bad(e, kind == REQ_CHAT ? "messages" : "prompt", "the prompt is empty");
        if (!rc && (n >= ctx || (r->max_tokens > 0 && n + r->max_tokens > ctx)))
            rc = context_error(e, kind == REQ_CHAT, n, r->max_tokens > 0 ? r->max_tokens : 0, ctx);
        if (!rc && g->echo) {
            if (sp->text) g->echo[p] = xstrdup(sp->text), g->echo_len[p] = sp->len;
            else {
                g->echo[p] = lilac_tok_decode(S->b.tok, ids.ids, ids.n, false, &g->echo_len[p]);
                if (!g->echo[p]) g->echo[p] = xstrdup(""), g->echo_len[p] = 0;
            }
        }
        for (int k = 0; !rc && k < r->best_of; k++) {
            eng_job *j = g->jobs[g->n_jobs++] = make_job(S, r, &ids, k, ctx);
            if (S->o.test_hooks && r->forced) {
                lilac_ids f = {0};
                if (lilac_tok_encode(S->b.tok, r->forced, r->forced_len, LILAC_TOK_SPECIAL, &f, &err) < 0) {
                    lilac_ids_free(&f);
                    rc = srv_bad(e, "lilac_forced_output", "%s", err.msg);
                    break;
                }
                j->forced = f.ids ? f.ids : xmalloc(sizeof(int32_t));
                j->n_forced = (int)f.n;
            }
        }
        lilac_ids_free(&ids);
        if (rc) return -1;
    }
    return 0;
}

static int submit(srv *S, conn_ctx *cc, gen_req *g, srv_error *e) {
    if (atomic_load(&S->ready) != 1)
        return srv_err(e, 503, "unavailable_error", NULL, NULL, "the server is shutting down");
    for (int i = 0; i < g->n_jobs; i++)
        if (eng_submit(S->b.engine, g->jobs[i]) < 0) {
            for (int m = 0; m < i; m++) eng_job_cancel(g->jobs[m]);
            return srv_err(e, 503, "unavailable_error", NULL, NULL,
                           "the server is busy: the request queue is full, retry later");
        }
    eng_job_ref(g->jobs[0]);
    pthread_mutex_lock(&S->live_mu);
    cc->job = g->jobs[0];
    pthread_mutex_unlock(&S->live_mu);
    return 0;
}

/* Usage of a request's jobs: each prompt counted once, every candidate's tokens. */
static void usage_json(sbuf *b, const gen_req *g) {
    int np = 0, ng = 0, nc = 0;
    for (int i = 0; i < g->n_jobs; i++) {
        if (i % g->r.best_of == 0) np += g->jobs[i]->n_prompt, nc += g->jobs[i]->n_cached;
        ng += g->jobs[i]->n_gen;
    }
    sb_printf(b,
              "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
              "\"prompt_tokens_details\":{\"cached_tokens\":%d}}",
              np, ng, np + ng, nc);
}

/* llama.cpp's timings, summed over the jobs (cache_n and prompt_n then show
 * how much of each choice's prompt was reused). */
static void timings_json(sbuf *b, const gen_req *g) {
    int cache_n = 0, prompt_n = 0, n_gen = 0, pred = 0;
    double pms = 0, dms = 0;
    for (int i = 0; i < g->n_jobs; i++) {
        const eng_job *j = g->jobs[i];
        double p = (j->t_first - j->t_start) * 1e3, d = (j->t_end - j->t_first) * 1e3;
        pms += p > 0 ? p : 0;
        dms += d > 0 ? d : 0;
        cache_n += j->n_cached;
        prompt_n += j->n_prompt - j->n_cached;
        n_gen += j->n_gen;
        pred += j->n_gen > 1 ? j->n_gen - 1 : 0; /* tokens decoded after the first */
    }
    sb_printf(b, "{\"cache_n\":%d,\"prompt_n\":%d,\"prompt_ms\":%.3f,\"prompt_per_token_ms\":%.3f,"
                 "\"prompt_per_second\":%.3f,\"predicted_n\":%d,\"predicted_ms\":%.3f,"
                 "\"predicted_per_token_ms\":%.3f,\"predicted_per_second\":%.3f}",
              cache_n, prompt_n, pms, prompt_n ? pms / prompt_n : 0.0, pms > 0 ? prompt_n / pms * 1e3 : 0.0, n_gen, dms,
              pred ? dms / pred : 0.0, dms > 0 ? pred / dms * 1e3 : 0.0);
}

/* Generated tokens that were reasoning: up to and including "</think>" (all
 * of them when thinking is on and it never came). */
static int reasoning_tokens(srv *S, const eng_job *j, bool thinking) {
    if (!thinking) return 0;
    int32_t end = lilac_tok_added_id(S->b.tok, "</think>");
    for (int i = 0; i < j->n_toks; i++)
        if (j->toks[i].id == end) return i + 1;
    return j->n_toks;
}

/* The stop string that ended a finished job, else NULL (EOS, token limit). */
static const char *stop_hit(srv *S, const eng_job *j) {
    if (strcmp(j->finish, "stop") || !j->n_stops || j->n_gen > j->n_toks) return NULL; /* EOS counts in n_gen only */
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(j->n_toks + 1));
    for (int i = 0; i < j->n_toks; i++) ids[i] = j->toks[i].id;
    size_t n = 0;
    char *full = lilac_tok_decode(S->b.tok, ids, (size_t)j->n_toks, false, &n);
    free(ids);
    const char *hit = NULL;
    for (int i = 0; full && i < j->n_stops && !hit; i++) {
        size_t sl = strlen(j->stops[i]);
        if (n >= j->text.n + sl && !memcmp(full + j->text.n, j->stops[i], sl)) hit = j->stops[i];
    }
    free(full);
    return hit;
}

static void api_result_of(srv *S, const gen_req *g, const eng_job *j, api_result *r) {
    r->n_prompt = j->n_prompt;
    r->n_cached = j->n_cached;
    r->n_gen = j->n_gen;
    r->n_reasoning = reasoning_tokens(S, j, g->r.enable_thinking);
    r->length = !strcmp(j->finish, "length");
    r->stop_seq = stop_hit(S, j);
}

/* ---- non-streaming ------------------------------------------------------------------ */

/* Wait for the job; false if the client went away (job cancelled). */
static bool wait_done(srv *S, eng_job *j, int fd) {
    pthread_mutex_lock(&j->mu);
    while (j->state != JOB_DONE) {
        eng_job_wait(j, 0.05);
        if (j->state != JOB_DONE && S->o.disconnect_check && peer_reset(fd)) {
            pthread_mutex_unlock(&j->mu);
            eng_job_cancel(j);
            return false;
        }
    }
    pthread_mutex_unlock(&j->mu);
    return true;
}

/* The weights' mapping faulted (a shard truncated under the server): what was
 * computed since is not the model's. */
static bool weights_damaged(srv *S, char *msg, size_t cap) {
    char path[512];
    if (!st_damaged(path, sizeof path)) return false;
    snprintf(msg, cap, "the checkpoint file %s was truncated or rewritten while the server ran; restart lilac", path);
    if (!S->o.quiet && !atomic_exchange(&S->damage_logged, 1)) fprintf(stderr, "lilac serve: error: %s\n", msg);
    return true;
}

static enum MHD_Result fail_api(srv *S, struct MHD_Connection *c, int api, int status, const char *type, const char *msg) {
    srv_error e;
    srv_err(&e, status, type, NULL, NULL, "%s", msg);
    if (api == API_MESSAGES) e.shape = SRV_SHAPE_ANTHROPIC;
    return send_error(S, c, &e);
}

static enum MHD_Result generation_error(srv *S, struct MHD_Connection *c, int api, const eng_job *j) {
    if (!strcmp(j->finish, "cancelled"))
        return fail_api(S, c, api, 503, "unavailable_error", "the request was cancelled: the server is shutting down");
    if (!S->o.quiet) fprintf(stderr, "lilac serve: generation failed: %s\n", j->error);
    return fail_api(S, c, api, 500, "server_error", "generation failed (see the server log)");
}

/* One chat choice: {"index", "message", "logprobs", "finish_reason"} */
static void chat_choice(srv *S, sbuf *b, const gen_req *g, const eng_job *j, int index) {
    api_parts col = {0};
    op_parser *op = op_new(g->r.enable_thinking, g->r.tools);
    op_feed(op, j->text.p, j->text.n, &api_parts_sink, &col);
    op_finish(op, &api_parts_sink, &col);
    op_free(op);
    sb_printf(b, "%s{\"index\":%d,\"message\":{\"role\":\"assistant\",\"content\":", index ? "," : "", index);
    if (col.content.n || !col.n_calls) sb_json_str(b, col.content.p ? col.content.p : "", col.content.n);
    else sb_puts(b, "null");
    if (col.reasoning.n) {
        if (S->o.reasoning & REASONING_CONTENT) {
            sb_puts(b, ",\"reasoning_content\":");
            sb_json_str(b, col.reasoning.p, col.reasoning.n);
        }
        if (S->o.reasoning & REASONING_FIELD) {
            sb_puts(b, ",\"reasoning\":");
            sb_json_str(b, col.reasoning.p, col.reasoning.n);
        }
    }
    if (col.n_calls) {
        sb_puts(b, ",\"tool_calls\":[");
        for (int i = 0; i < col.n_calls; i++) {
            sb_printf(b, "%s{\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":", i ? "," : "", col.calls[i].id);
            sb_json_str(b, col.calls[i].name, strlen(col.calls[i].name));
            sb_puts(b, ",\"arguments\":");
            sb_json_str(b, col.calls[i].args.p ? col.calls[i].args.p : "{}", col.calls[i].args.p ? col.calls[i].args.n : 2);
            sb_puts(b, "}}");
        }
        sb_puts(b, "]");
    }
    sb_puts(b, "},\"logprobs\":");
    if (g->r.logprobs) chat_logprobs(b, S->b.tok, j->toks, j->n_toks);
    else sb_puts(b, "null");
    sb_printf(b, ",\"finish_reason\":\"%s\"}", finish_reason(j, col.n_calls));
    api_parts_free(&col);
}

static void cmpl_choice(srv *S, sbuf *b, const gen_req *g, const eng_job *j, int index, int p) {
    const char *echo = g->echo ? g->echo[p] : "";
    size_t echo_len = g->echo ? g->echo_len[p] : 0;
    sb_printf(b, "%s{\"index\":%d,\"text\":", index ? "," : "", index);
    sbuf t = {0};
    sb_put(&t, echo, echo_len);
    sb_put(&t, j->text.p ? j->text.p : "", j->text.n);
    sb_json_str(b, t.p ? t.p : "", t.n);
    sb_free(&t);
    sb_puts(b, ",\"logprobs\":");
    if (g->r.logprobs) cmpl_logprobs(b, S->b.tok, j->toks, j->n_toks, echo_len);
    else sb_puts(b, "null");
    sb_printf(b, ",\"finish_reason\":\"%s\"}", finish_reason(j, 0));
}

static double mean_logprob(const eng_job *j) {
    if (j->n_toks == 0) return -1e30;
    double s = 0;
    for (int i = 0; i < j->n_toks; i++) s += j->toks[i].lp;
    return s / j->n_toks;
}

/* Responses / Messages: one choice, in that API's shape. */
static enum MHD_Result respond_api(srv *S, struct MHD_Connection *c, const gen_req *g) {
    const eng_job *j = g->jobs[0];
    api_parts parts = {0};
    op_parser *op = op_new(g->r.enable_thinking, g->r.tools);
    op_feed(op, j->text.p, j->text.n, &api_parts_sink, &parts);
    op_finish(op, &api_parts_sink, &parts);
    op_free(op);
    char id[48];
    make_id(S, id, sizeof id, g->api == API_RESPONSES ? "resp_" : "msg_");
    api_result res = {.id = id, .model = g->r.model[0] ? g->r.model : S->o.alias, .created = (long)time(NULL),
                      .req = g->orig};
    api_result_of(S, g, j, &res);
    sbuf b = {0};
    if (g->api == API_RESPONSES) resp_write(&b, &res, &parts);
    else msgs_write(&b, &res, &parts);
    api_parts_free(&parts);
    enum MHD_Result ok = send_json(S, c, 200, &b);
    sb_free(&b);
    return ok;
}

static enum MHD_Result respond_once(srv *S, struct MHD_Connection *c, gen_req *g) {
    int fd = conn_fd(c);
    for (int i = 0; i < g->n_jobs; i++)
        if (!wait_done(S, g->jobs[i], fd)) {
            for (int m = 0; m < g->n_jobs; m++) eng_job_cancel(g->jobs[m]);
            return MHD_NO;
        }
    char dmg[700];
    if (weights_damaged(S, dmg, sizeof dmg)) return fail_api(S, c, g->api, 500, "server_error", dmg);
    for (int i = 0; i < g->n_jobs; i++)
        if (!strcmp(g->jobs[i]->finish, "cancelled") || !strcmp(g->jobs[i]->finish, "error"))
            return generation_error(S, c, g->api, g->jobs[i]);
    if (g->api == API_RESPONSES || g->api == API_MESSAGES) return respond_api(S, c, g);
    char id[48];
    sbuf b = {0};
    const srv_request *r = &g->r;
    const char *model = r->model[0] ? r->model : S->o.alias;
    bool chat = g->api == API_CHAT;
    make_id(S, id, sizeof id, chat ? "chatcmpl-" : "cmpl-");
    sb_printf(&b, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":", id,
              chat ? "chat.completion" : "text_completion", (long)time(NULL));
    sb_json_str(&b, model, strlen(model));
    sb_puts(&b, ",\"system_fingerprint\":\"lilac\",\"choices\":[");
    int B = r->best_of;
    for (int p = 0; p < g->n_prompts; p++) {
        eng_job **cand = g->jobs + p * B;
        int order[SRV_MAX_CHOICES];
        double score[SRV_MAX_CHOICES];
        for (int k = 0; k < B; k++) order[k] = k, score[k] = B > r->n ? mean_logprob(cand[k]) : 0;
        for (int k = 1; k < B; k++) /* best first: the highest mean logprob per token (stable) */
            for (int m = k; m > 0 && score[order[m]] > score[order[m - 1]]; m--) {
                int t = order[m];
                order[m] = order[m - 1];
                order[m - 1] = t;
            }
        for (int i = 0; i < r->n; i++) {
            if (chat) chat_choice(S, &b, g, cand[order[i]], p * r->n + i);
            else cmpl_choice(S, &b, g, cand[order[i]], p * r->n + i, p);
        }
    }
    sb_puts(&b, "],\"usage\":");
    usage_json(&b, g);
    sb_puts(&b, ",\"timings\":");
    timings_json(&b, g);
    sb_puts(&b, "}");
    enum MHD_Result ok = send_json(S, c, 200, &b);
    sb_free(&b);
    return ok;
}

/* ---- streaming -------------------------------------------------------------------------- */

typedef struct stream stream;

typedef struct { /* one choice of a stream */
    stream *st;
    eng_job *job;
    int index, prompt;
    op_parser *op;
    size_t text_off;   /* bytes of job->text consumed */
    int tok_off;       /* tokens whose logprobs were sent */
    int tok_seen;      /* tokens already looked at (wait for more than these) */
    eng_tok *new_toks; /* tokens of this round (copied) */
    int n_new;
    bool lp_attached, started, finished;
} choice;

struct stream {
    srv *S;
    int api;
    choice *ch;
    int n_ch;
    gen_req *g;        /* for usage: jobs and best_of (owned) */
    int fd;
    bool chat, include_usage, logprobs, ended;
    char id[48];
    long created;
    char *model;
    const api_stream_ops *ops; /* Responses / Messages */
    void *api_st;
    sbuf out;          /* SSE bytes not yet handed to MHD */
    double last_write;
};

static void chunk_open(choice *ch, sbuf *b) {
    stream *st = ch->st;
    sb_printf(b, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":", st->id,
              st->chat ? "chat.completion.chunk" : "text_completion", st->created);
    sb_json_str(b, st->model, strlen(st->model));
    sb_printf(b, ",\"system_fingerprint\":\"lilac\",\"choices\":[{\"index\":%d,", ch->index);
}

static void chunk_close(choice *ch, sbuf *b, const char *finish) {
    stream *st = ch->st;
    size_t echo_len = st->g->echo ? st->g->echo_len[ch->prompt] : 0;
    sb_puts(b, ",\"logprobs\":");
    if (st->logprobs && !ch->lp_attached && ch->n_new) {
        if (st->chat) chat_logprobs(b, st->S->b.tok, ch->new_toks, ch->n_new);
        else cmpl_logprobs(b, st->S->b.tok, ch->new_toks, ch->n_new, echo_len + ch->text_off);
        ch->lp_attached = true;
    } else if (st->logprobs && finish) sb_puts(b, st->chat ? "{\"content\":[]}" : "null");
    else sb_puts(b, "null");
    sb_puts(b, ",\"finish_reason\":");
    if (finish) sb_printf(b, "\"%s\"", finish);
    else sb_puts(b, "null");
    sb_puts(b, "}]");
    if (st->include_usage) sb_puts(b, ",\"usage\":null");
    sb_puts(b, "}\n\n");
}

static void delta_text(choice *ch, const char *field, const char *s, size_t n) {
    if (!n) return;
    sbuf *b = &ch->st->out;
    chunk_open(ch, b);
    if (ch->st->chat) {
        sb_printf(b, "\"delta\":{\"%s\":", field);
        sb_json_str(b, s, n);
        sb_puts(b, "}");
    } else {
        sb_puts(b, "\"text\":");
        sb_json_str(b, s, n);
    }
    chunk_close(ch, b, NULL);
}

static void st_reasoning(void *ud, const char *s, size_t n) {
    choice *ch = ud;
    if (ch->st->S->o.reasoning & REASONING_CONTENT) delta_text(ch, "reasoning_content", s, n);
    if (ch->st->S->o.reasoning & REASONING_FIELD) delta_text(ch, "reasoning", s, n);
}
static void st_content(void *ud, const char *s, size_t n) { delta_text(ud, "content", s, n); }
static void st_open(void *ud, int index, const char *id, const char *name) {
    choice *ch = ud;
    sbuf *b = &ch->st->out;
    chunk_open(ch, b);
    sb_printf(b, "\"delta\":{\"tool_calls\":[{\"index\":%d,\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":", index, id);
    sb_json_str(b, name, strlen(name));
    sb_puts(b, ",\"arguments\":\"\"}}]}");
    chunk_close(ch, b, NULL);
}
static void st_args(void *ud, int index, const char *s, size_t n) {
    choice *ch = ud;
    sbuf *b = &ch->st->out;
    chunk_open(ch, b);
    sb_printf(b, "\"delta\":{\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", index);
    sb_json_str(b, s, n);
    sb_puts(b, "}}]}");
    chunk_close(ch, b, NULL);
}
static const op_sink st_sink = {st_reasoning, st_content, st_open, st_args};

/* Does the choice's job have something not looked at yet? Call with its mu held. */
static bool has_news(const choice *ch) {
    const eng_job *j = ch->job;
    return j->text.n != ch->text_off || j->n_toks != ch->tok_seen || j->state == JOB_DONE;
}

/* Turn a choice's news into SSE bytes. Returns the job when it ended in
 * failure (cancelled, error), else NULL. */
static eng_job *advance(choice *ch) {
    stream *st = ch->st;
    eng_job *j = ch->job;
    sbuf text = {0};
    pthread_mutex_lock(&j->mu);
    sb_put(&text, j->text.p + ch->text_off, j->text.n - ch->text_off);
    int n_toks = j->n_toks;
    ch->tok_seen = n_toks;
    ch->n_new = n_toks - ch->tok_off;
    if (ch->n_new > 0) {
        ch->new_toks = xrealloc(ch->new_toks, sizeof(eng_tok) * (size_t)ch->n_new);
        memcpy(ch->new_toks, j->toks + ch->tok_off, sizeof(eng_tok) * (size_t)ch->n_new);
    }
    bool done = j->state == JOB_DONE;
    pthread_mutex_unlock(&j->mu);
    ch->lp_attached = ch->n_new <= 0;
    if (st->ops) {
        if (text.n) op_feed(ch->op, text.p, text.n, st->ops->sink, st->api_st);
    } else {
        if (!ch->started && (st->chat || (st->g->echo && st->g->echo_len[ch->prompt]))) {
            chunk_open(ch, &st->out);
            if (st->chat) sb_puts(&st->out, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}");
            else { /* echo: the prompt's text comes first */
                sb_puts(&st->out, "\"text\":");
                sb_json_str(&st->out, st->g->echo[ch->prompt], st->g->echo_len[ch->prompt]);
            }
            bool save = ch->lp_attached;
            ch->lp_attached = true;
            chunk_close(ch, &st->out, NULL);
            ch->lp_attached = save;
        }
        ch->started = true;
        if (text.n) {
            if (st->chat) op_feed(ch->op, text.p, text.n, &st_sink, ch);
            else delta_text(ch, "text", text.p, text.n);
        }
    }
    if (ch->lp_attached) ch->tok_off = n_toks; /* else logprobs whose text is held back wait for the next chunk */
    ch->text_off += text.n;
    sb_free(&text);
    if (!done) return NULL;
    if (!strcmp(j->finish, "cancelled") || !strcmp(j->finish, "error")) return j;
    ch->finished = true;
    if (st->ops) {
        op_finish(ch->op, st->ops->sink, st->api_st);
        api_result r = {0};
        api_result_of(st->S, st->g, j, &r);
        st->ops->end(st->api_st, &r);
    } else {
        if (st->chat) op_finish(ch->op, &st_sink, ch);
        int n_calls = st->chat ? op_n_tools(ch->op) : 0;
        chunk_open(ch, &st->out);
        sb_puts(&st->out, st->chat ? "\"delta\":{}" : "\"text\":\"\"");
        chunk_close(ch, &st->out, finish_reason(j, n_calls));
    }
    return NULL;
}

static void stream_error(stream *st, int status, const char *type, const char *msg) {
    if (st->ops) {
        st->ops->error(st->api_st, status, msg);
        return;
    }
    srv_error e;
    srv_err(&e, status, type, NULL, NULL, "%s", msg);
    sb_puts(&st->out, "data: ");
    error_json(&st->out, &e);
    sb_puts(&st->out, "\n\n");
}

/* Wait for news from the jobs and turn it into SSE bytes in st->out. */
static void produce(stream *st) {
    srv *S = st->S;
    size_t before = st->out.n;
    if (st->ops && !st->ch[0].started) {
        st->ops->begin(st->api_st);
        st->ch[0].started = true;
    }
    /* Wait (on the first unfinished choice) unless some choice has news: tokens
     * whose text the parser holds back stay unsent (tok_off) but must not make
     * this loop spin. */
    choice *w = NULL;
    bool news = false;
    int active = 0;
    for (int i = 0; i < st->n_ch; i++) {
        choice *ch = &st->ch[i];
        if (ch->finished) continue;
        active++;
        if (!w) {
            w = ch;
            continue;
        }
        pthread_mutex_lock(&ch->job->mu);
        news |= has_news(ch);
        pthread_mutex_unlock(&ch->job->mu);
    }
    if (w) {
        pthread_mutex_lock(&w->job->mu);
        if (!news && !has_news(w)) eng_job_wait(w->job, active > 1 ? 0.01 : 0.05);
        pthread_mutex_unlock(&w->job->mu);
    }
    eng_job *failed = NULL;
    bool all_done = true;
    for (int i = 0; i < st->n_ch; i++) {
        choice *ch = &st->ch[i];
        if (!ch->finished && !failed) failed = advance(ch);
        all_done &= ch->finished;
    }
    char dmg[700];
    if ((all_done || failed) && weights_damaged(S, dmg, sizeof dmg)) {
        stream_error(st, 500, "server_error", dmg);
        failed = st->ch[0].job;
    } else if (failed) {
        if (!S->o.quiet && !strcmp(failed->finish, "error")) fprintf(stderr, "lilac serve: generation failed: %s\n", failed->error);
        if (!strcmp(failed->finish, "error")) stream_error(st, 500, "server_error", "generation failed (see the server log)");
        else stream_error(st, 503, "unavailable_error", "the request was cancelled: the server is shutting down");
    }
    if (failed) {
        for (int i = 0; i < st->n_ch; i++) eng_job_cancel(st->ch[i].job);
        if (!st->ops) sb_puts(&st->out, "data: [DONE]\n\n");
        st->ended = true;
    } else if (all_done) {
        if (!st->ops && st->include_usage) {
            sb_printf(&st->out, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":", st->id,
                      st->chat ? "chat.completion.chunk" : "text_completion", st->created);
            sb_json_str(&st->out, st->model, strlen(st->model));
            sb_puts(&st->out, ",\"system_fingerprint\":\"lilac\",\"choices\":[],\"usage\":");
            usage_json(&st->out, st->g);
            sb_puts(&st->out, ",\"timings\":");
            timings_json(&st->out, st->g);
            sb_puts(&st->out, "}\n\n");
        }
        if (!st->ops) sb_puts(&st->out, "data: [DONE]\n\n");
        st->ended = true;
    }
    double now = lilac_now();
    if (st->out.n > before) st->last_write = now;
    else if (S->o.ping_s > 0 && now - st->last_write >= S->o.ping_s) {
        sb_puts(&st->out, ": ping\n\n");
        st->last_write = now;
    }
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    stream *st = cls;
    (void)pos;
    for (;;) {
        if (st->out.n) {
            size_t n = st->out.n < max ? st->out.n : max;
            memcpy(buf, st->out.p, n);
            sb_consume(&st->out, n);
            return (ssize_t)n;
        }
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (st->S->o.disconnect_check && peer_reset(st->fd)) {
            for (int i = 0; i < st->n_ch; i++) eng_job_cancel(st->ch[i].job);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        produce(st);
    }
}

static void stream_free(void *cls) {
    stream *st = cls;
    for (int i = 0; i < st->n_ch; i++) {
        eng_job_cancel(st->ch[i].job); /* no-op when it finished */
        op_free(st->ch[i].op);
        free(st->ch[i].new_toks);
    }
    free(st->ch);
    if (st->ops) st->ops->free(st->api_st);
    gen_req_free(st->g); /* unrefs the jobs */
    free(st->g);
    free(st->model);
    sb_free(&st->out);
    free(st);
}

/* The stream takes over g. */
static enum MHD_Result respond_stream(srv *S, struct MHD_Connection *c, gen_req *g) {
    stream *st = xcalloc(1, sizeof *st);
    st->S = S;
    st->api = g->api;
    st->g = xmalloc(sizeof *g);
    *st->g = *g;
    memset(g, 0, sizeof *g);
    g = st->g;
    st->chat = g->api == API_CHAT;
    st->include_usage = g->r.include_usage;
    st->logprobs = g->r.logprobs;
    st->fd = conn_fd(c);
    st->created = (long)time(NULL);
    st->model = xstrdup(g->r.model[0] ? g->r.model : S->o.alias);
    make_id(S, st->id, sizeof st->id,
            g->api == API_CHAT ? "chatcmpl-" : g->api == API_CMPL ? "cmpl-" : g->api == API_RESPONSES ? "resp_" : "msg_");
    st->n_ch = g->n_jobs; /* best_of == n when streaming */
    st->ch = xcalloc((size_t)st->n_ch, sizeof(choice));
    for (int i = 0; i < st->n_ch; i++) {
        choice *ch = &st->ch[i];
        ch->st = st;
        ch->job = g->jobs[i];
        ch->index = i;
        ch->prompt = i / g->r.best_of;
        if (g->api != API_CMPL) ch->op = op_new(g->r.enable_thinking, g->r.tools);
    }
    if (g->api == API_RESPONSES || g->api == API_MESSAGES) {
        api_result r = {.id = st->id, .model = st->model, .created = st->created, .req = g->orig,
                        .n_prompt = g->jobs[0]->n_prompt};
        st->ops = g->api == API_RESPONSES ? &resp_stream_ops : &msgs_stream_ops;
        st->api_st = g->api == API_RESPONSES ? resp_stream_new(&st->out, &r) : msgs_stream_new(&st->out, &r);
    }
    st->last_write = lilac_now();
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, st, stream_free);
    if (!r) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    add_cors(S, c, r);
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result handle_generate(srv *S, struct MHD_Connection *c, conn_ctx *cc, int api) {
    gen_req g;
    srv_error e;
    if (prepare(S, cc->body.p, cc->body.n, api, &g, &e) < 0 || submit(S, cc, &g, &e) < 0) {
        gen_req_free(&g);
        if (api == API_MESSAGES) e.shape = SRV_SHAPE_ANTHROPIC;
        return send_error(S, c, &e);
    }
    enum MHD_Result ok = g.r.stream ? respond_stream(S, c, &g) : respond_once(S, c, &g);
    gen_req_free(&g);
    return ok;
}

/* ---- small endpoints ------------------------------------------------------------------- */

static void model_object(srv *S, sbuf *b) {
    sb_puts(b, "{\"id\":");
    sb_json_str(b, S->o.alias, strlen(S->o.alias));
    sb_printf(b, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"lilac\"", (long)time(NULL));
    if (atomic_load(&S->ready) == 1) {
        sb_printf(b, ",\"max_model_len\":%lld,\"context_length\":%lld,\"meta\":{\"n_ctx\":%lld,\"n_ctx_train\":%lld,\"n_vocab\":%lld}",
                  (long long)S->b.max_seq, (long long)S->b.max_seq, (long long)S->b.max_seq,
                  (long long)S->b.model->cfg.max_pos, (long long)S->b.model->cfg.vocab);
    }
    sb_puts(b, "}");
}

static enum MHD_Result handle_models(srv *S, struct MHD_Connection *c) {
    sbuf b = {0};
    sb_puts(&b, "{\"object\":\"list\",\"data\":[");
    model_object(S, &b);
    sb_puts(&b, "]}");
    enum MHD_Result ok = send_json(S, c, 200, &b);
    sb_free(&b);
    return ok;
}

/* GET /v1/models/{id}: the model under its alias, else OpenAI's 404. */
static enum MHD_Result handle_model(srv *S, struct MHD_Connection *c, const char *url) {
    const char *id = strstr(url, "/models/") + 8;
    size_t n = strlen(id);
    while (n && id[n - 1] == '/') n--;
    if (n != strlen(S->o.alias) || strncmp(id, S->o.alias, n)) {
        srv_error e;
        srv_err(&e, 404, "invalid_request_error", "model", "model_not_found", "The model '%.*s' does not exist",
                (int)(n < 200 ? n : 200), id);
        return send_error(S, c, &e);
    }
    sbuf b = {0};
    model_object(S, &b);
    enum MHD_Result ok = send_json(S, c, 200, &b);
    sb_free(&b);
    return ok;
}

static enum MHD_Result handle_version(srv *S, struct MHD_Connection *c) {
    sbuf b = {0};
    info_version(&b);
    enum MHD_Result ok = send_json(S, c, 200, &b);
    sb_free(&b);
    return ok;
}

static enum MHD_Result handle_props(srv *S, struct MHD_Connection *c) {
    eng_stats st = {0};
    eng_get_stats(S->b.engine, &st);
    sbuf b = {0};
    info_props(&b, &S->o, &S->b, st.n_slots);
    enum MHD_Result ok = send_json(S, c, 200, &b);
    sb_free(&b);
    return ok;
}

/* POST /v1/messages/count_tokens: the prompt a Messages request renders to. */
static enum MHD_Result handle_count_tokens(srv *S, struct MHD_Connection *c, conn_ctx *cc) {
    srv_error e;
    srv_request r;
    memset(&r, 0, sizeof r);
    json_t *o = srv_parse_object(cc->body.p, cc->body.n, &e), *chat = NULL;
    lilac_ids ids = {0};
    int rc = o ? msgs_to_chat(o, true, &chat, &e) : -1;
    json_decref(o);
    if (!rc) rc = srv_parse_request_json(chat, REQ_CHAT, &r, &e);
    if (!rc) {
        lilac_prompt pr;
        rc = chat_prompt(S, &r, true, &pr, &ids, &e);
        lilac_prompt_free(&pr);
    }
    srv_request_free(&r);
    if (rc < 0) {
        lilac_ids_free(&ids);
        e.shape = SRV_SHAPE_ANTHROPIC;
        return send_error(S, c, &e);
    }
    sbuf b = {0};
    sb_printf(&b, "{\"input_tokens\":%zu}", ids.n);
    lilac_ids_free(&ids);
    enum MHD_Result ok = send_json(S, c, 200, &b);
    sb_free(&b);
    return ok;
}

/* Tokens the sequences being processed hold (prompt + generated so far): the
 * KV-cache usage the vLLM and llama.cpp gauges report, over slots x context. */
static long long kv_tokens_in_use(srv *S) {
    long long n = 0;
    pthread_mutex_lock(&S->live_mu);
    for (conn_ctx *cc = S->live; cc; cc = cc->next) {
        eng_job *j = cc->job;
        if (!j) continue;
        pthread_mutex_lock(&j->mu);
        if (j->state == JOB_PREFILL || j->state == JOB_DECODE) n += j->n_prompt + j->n_gen;
        pthread_mutex_unlock(&j->mu);
    }
    pthread_mutex_unlock(&S->live_mu);
    return n;
}

static enum MHD_Result handle_metrics(srv *S, struct MHD_Connection *c) {
    eng_stats st = {0};
    if (S->b.engine) eng_get_stats(S->b.engine, &st);
    sbuf b = {0};
#define M(name, type, help, fmt, val) \
    sb_printf(&b, "# HELP " name " " help "\n# TYPE " name " " type "\n" name " " fmt "\n", val)
    long long kv_used = kv_tokens_in_use(S), kv_cap = (long long)st.n_slots * (long long)S->b.max_seq;
    double kv_ratio = kv_cap > 0 ? (double)(kv_used < kv_cap ? kv_used : kv_cap) / (double)kv_cap : 0.0;
    M("llamacpp:kv_cache_usage_ratio", "gauge", "KV-cache usage: tokens of the sequences being processed / (slots x context).",
      "%.6f", kv_ratio);
    M("llamacpp:kv_cache_tokens", "gauge", "Tokens of the sequences being processed.", "%lld", kv_used);
    M("llamacpp:prompt_tokens_total", "counter", "Prompt tokens processed (prefill).", "%llu", (unsigned long long)st.prompt_tokens);
    M("llamacpp:prompt_seconds_total", "counter", "Prefill time in seconds.", "%.6f", st.prompt_seconds);
    M("llamacpp:tokens_predicted_total", "counter", "Tokens generated.", "%llu", (unsigned long long)st.gen_tokens);
    M("llamacpp:tokens_predicted_seconds_total", "counter", "Decode time in seconds.", "%.6f", st.decode_seconds);
    M("llamacpp:n_decode_total", "counter", "Decode steps.", "%llu", (unsigned long long)st.decode_steps);
    M("llamacpp:prompt_tokens_seconds", "gauge", "Average prefill throughput (tokens/s).", "%.3f",
      st.prompt_seconds > 0 ? st.prompt_tokens / st.prompt_seconds : 0.0);
    M("llamacpp:predicted_tokens_seconds", "gauge", "Average decode throughput (tokens/s).", "%.3f",
      st.decode_seconds > 0 ? st.decode_steps / st.decode_seconds : 0.0);
    M("llamacpp:requests_processing", "gauge", "Requests being generated.", "%d", st.running);
    M("llamacpp:requests_deferred", "gauge", "Requests waiting in the queue.", "%d", st.queued);
    M("lilac:queue_depth", "gauge", "Requests waiting in the queue.", "%d", st.queued);
    M("lilac:slots", "gauge", "Sequence slots (--parallel).", "%d", st.n_slots);
    M("lilac:http_requests_total", "counter", "HTTP requests received.", "%llu", (unsigned long long)atomic_load(&S->http_requests));
    M("lilac:http_errors_total", "counter", "HTTP error responses sent.", "%llu", (unsigned long long)atomic_load(&S->http_errors));
    M("lilac:requests_finished_total", "counter", "Generation requests finished.", "%llu", (unsigned long long)st.requests_done);
    M("lilac:requests_cancelled_total", "counter", "Generation requests cancelled (client gone).", "%llu",
      (unsigned long long)st.requests_cancelled);
    M("lilac:requests_failed_total", "counter", "Generation requests failed.", "%llu", (unsigned long long)st.requests_error);
    M("lilac:prompt_cached_tokens_total", "counter", "Prompt tokens reused from a cached prefix.", "%llu",
      (unsigned long long)st.cached_tokens);
    M("lilac:batch_steps_total", "counter", "Batched decode steps (one forward for all decoding slots).", "%llu",
      (unsigned long long)st.batch_steps);
    M("lilac:prefix_cache_bytes", "gauge", "Memory held by prefix-cache snapshots (GDN + conv state).", "%lld",
      (long long)st.cache_bytes);
    M("lilac:prefix_cache_peak_bytes", "gauge", "Highest prefix-cache memory so far.", "%lld", (long long)st.cache_peak_bytes);
    M("lilac:prefix_cache_limit_bytes", "gauge", "Prefix-cache memory bound (--cache-mb).", "%lld",
      (long long)st.cache_limit_bytes);
    M("lilac:prefix_cache_snapshots", "gauge", "Snapshots held.", "%d", st.cache_entries);
    M("lilac:prefix_cache_snapshots_taken_total", "counter", "Snapshots taken.", "%llu",
      (unsigned long long)st.cache_snapshots_taken);
    M("lilac:prefix_cache_evictions_total", "counter", "Snapshots evicted (least recently used).", "%llu",
      (unsigned long long)st.cache_evictions);
    M("lilac:prefix_cache_restores_total", "counter", "Snapshots restored.", "%llu", (unsigned long long)st.cache_restores);
#undef M
    /* vLLM's names, labelled with the model name as vLLM labels them */
    sbuf lab = {0};
    sb_puts(&lab, "{model_name=\"");
    srv_metrics_label(&lab, S->o.alias);
    sb_puts(&lab, "\"}");
#define V(name, type, help, fmt, val) \
    sb_printf(&b, "# HELP " name " " help "\n# TYPE " name " " type "\n" name "%s " fmt "\n", lab.p, val)
    V("vllm:num_requests_running", "gauge", "Requests being generated (in a slot).", "%d", st.running);
    V("vllm:num_requests_waiting", "gauge", "Requests waiting in the queue.", "%d", st.queued);
    V("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage, 0..1 (1: full).", "%.6f", kv_ratio);
    V("vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage, 0..1 (the older name).", "%.6f", kv_ratio);
    V("vllm:prompt_tokens_total", "counter", "Prompt tokens of generation requests (prefilled + reused from the prefix cache).",
      "%llu", (unsigned long long)(st.prompt_tokens + st.cached_tokens));
    V("vllm:generation_tokens_total", "counter", "Tokens generated.", "%llu", (unsigned long long)st.gen_tokens);
#undef V
    srv_metrics_write(S->metrics, &b, S->o.alias);
    sb_free(&lab);
    sb_puts(&b, "# HELP lilac:time_to_first_token_seconds Time from queueing to the first generated token.\n"
                "# TYPE lilac:time_to_first_token_seconds histogram\n");
    uint64_t total = 0;
    for (int i = 0; i < ENG_TTFT_BUCKETS; i++) {
        if (i == ENG_TTFT_BUCKETS - 1) sb_printf(&b, "lilac:time_to_first_token_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)st.ttft_count[i]);
        else sb_printf(&b, "lilac:time_to_first_token_seconds_bucket{le=\"%g\"} %llu\n", eng_ttft_bounds[i], (unsigned long long)st.ttft_count[i]);
        total = st.ttft_count[i];
    }
    sb_printf(&b, "lilac:time_to_first_token_seconds_sum %.6f\nlilac:time_to_first_token_seconds_count %llu\n", st.ttft_sum,
              (unsigned long long)total);
    enum MHD_Result ok = send_buf(S, c, 200, "text/plain; version=0.0.4", b.p, b.n);
    sb_free(&b);
    return ok;
}

static enum MHD_Result handle_tokenize(srv *S, struct MHD_Connection *c, conn_ctx *cc) {
    srv_error e;
    json_t *o = srv_parse_object(cc->body.p, cc->body.n, &e);
    if (!o) return send_error(S, c, &e);
    lilac_ids ids = {0};
    lilac_err err = {{0}};
    bool pieces = json_is_true(json_object_get(o, "with_pieces"));
    const json_t *ps = json_object_get(o, "parse_special");
    bool special = !ps || json_is_null(ps) || json_is_true(ps);
    const json_t *text = json_object_get(o, "content");
    if (!text) text = json_object_get(o, "prompt");
    enum MHD_Result ok;
    if (json_object_get(o, "messages")) {
        char *dump = json_dumps(o, JSON_COMPACT);
        srv_request r;
        lilac_prompt pr = {0};
        int rc = dump ? srv_parse_request(dump, strlen(dump), REQ_CHAT, &r, &e) : srv_bad(&e, NULL, "bad body");
        free(dump);
        if (rc == 0) {
            const json_t *agp = json_object_get(o, "add_generation_prompt");
            rc = chat_prompt(S, &r, !agp || json_is_true(agp), &pr, &ids, &e);
            lilac_prompt_free(&pr);
            srv_request_free(&r);
        }
        if (rc < 0) goto fail;
    } else if (json_is_string(text)) {
        if (lilac_tok_encode(S->b.tok, json_string_value(text), json_string_length(text),
                             special ? LILAC_TOK_SPECIAL : LILAC_TOK_PLAIN, &ids, &err) < 0) {
            srv_bad(&e, "content", "%s", err.msg);
            goto fail;
        }
    } else {
        srv_bad(&e, "content", "'content' (or 'prompt', or 'messages') is required and must be a string");
        goto fail;
    }
    /* the answer is bounded: at most a context's worth of tokens (or --max-tokenize) */
    long cap = S->o.max_tokenize > 0 ? S->o.max_tokenize : (long)S->b.max_seq;
    if ((long)ids.n > cap) {
        srv_err(&e, 400, "exceed_context_size_error", "content", "context_length_exceeded",
                "the text is %zu tokens; /tokenize answers at most %ld (the context length, or --max-tokenize)", ids.n, cap);
        goto fail;
    }
    sbuf b = {0};
    sb_puts(&b, "{\"tokens\":[");
    for (size_t i = 0; i < ids.n; i++) {
        if (i) sb_putc(&b, ',');
        if (pieces) {
            size_t n = 0;
            const uint8_t *p = lilac_tok_bytes(S->b.tok, ids.ids[i], &n);
            sb_printf(&b, "{\"id\":%d,\"piece\":", ids.ids[i]);
            sb_json_str(&b, p ? (const char *)p : "", n);
            sb_putc(&b, '}');
        } else sb_printf(&b, "%d", ids.ids[i]);
    }
    sb_printf(&b, "],\"count\":%zu,\"max_model_len\":%lld}", ids.n, (long long)S->b.max_seq);
    ok = send_json(S, c, 200, &b);
    sb_free(&b);
    lilac_ids_free(&ids);
    json_decref(o);
    return ok;
fail:
    lilac_ids_free(&ids);
    json_decref(o);
    return send_error(S, c, &e);
}

static enum MHD_Result handle_detokenize(srv *S, struct MHD_Connection *c, conn_ctx *cc) {
    srv_error e;
    json_t *o = srv_parse_object(cc->body.p, cc->body.n, &e);
    if (!o) return send_error(S, c, &e);
    const json_t *t = json_object_get(o, "tokens");
    if (!json_is_array(t)) {
        json_decref(o);
        return fail(S, c, 400, "invalid_request_error", "tokens", NULL, "'tokens' must be an array of token ids");
    }
    size_t n = json_array_size(t);
    int32_t *ids = xmalloc(sizeof(int32_t) * (n + 1));
    int32_t V = lilac_tok_vocab_size(S->b.tok);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= V) {
            free(ids);
            json_decref(o);
            srv_bad(&e, "tokens", "'tokens[%zu]' is not a token id in [0, %d)", i, V);
            return send_error(S, c, &e);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    size_t len = 0;
    char *s = lilac_tok_decode(S->b.tok, ids, n, false, &len);
    sbuf b = {0};
    sb_puts(&b, "{\"content\":");
    sb_json_str(&b, s ? s : "", s ? len : 0);
    sb_puts(&b, ",\"prompt\":");
    sb_json_str(&b, s ? s : "", s ? len : 0);
    sb_puts(&b, "}");
    enum MHD_Result ok = send_json(S, c, 200, &b);
    sb_free(&b);
    free(s);
    free(ids);
    json_decref(o);
    return ok;
}

static enum MHD_Result handle_apply_template(srv *S, struct MHD_Connection *c, conn_ctx *cc) {
    srv_request r;
    srv_error e;
    if (srv_parse_request(cc->body.p, cc->body.n, REQ_CHAT, &r, &e) < 0) return send_error(S, c, &e);
    const json_t *agp = json_object_get(r.root, "add_generation_prompt");
    lilac_prompt pr = {0};
    if (chat_prompt(S, &r, !agp || json_is_true(agp), &pr, NULL, &e) < 0) {
        lilac_prompt_free(&pr);
        srv_request_free(&r);
        return send_error(S, c, &e);
    }
    sbuf b = {0};
    sb_puts(&b, "{\"prompt\":");
    sb_json_str(&b, pr.text, pr.len);
    sb_puts(&b, "}");
    enum MHD_Result ok = send_json(S, c, 200, &b);
    sb_free(&b);
    lilac_prompt_free(&pr);
    srv_request_free(&r);
    return ok;
}

/* ---- dispatch ------------------------------------------------------------------------------ */

enum {
    R_NONE, R_HEALTH, R_METRICS, R_MODELS, R_CHAT, R_CMPL, R_TOKENIZE, R_DETOKENIZE, R_TEMPLATE, R_MODEL, R_VERSION,
    R_PROPS, R_RESPONSES, R_MESSAGES, R_COUNT_TOKENS
};

static int route(const char *url, bool *post) {
    static const struct {
        const char *path;
        int r;
        bool post;
    } T[] = {{"/health", R_HEALTH, false},        {"/v1/health", R_HEALTH, false},
             {"/metrics", R_METRICS, false},      {"/v1/models", R_MODELS, false},
             {"/models", R_MODELS, false},        {"/v1/chat/completions", R_CHAT, true},
             {"/chat/completions", R_CHAT, true}, {"/v1/completions", R_CMPL, true},
             {"/completions", R_CMPL, true},      {"/tokenize", R_TOKENIZE, true},
             {"/detokenize", R_DETOKENIZE, true}, {"/apply-template", R_TEMPLATE, true},
             {"/v1/tokenize", R_TOKENIZE, true},  {"/v1/detokenize", R_DETOKENIZE, true},
             {"/version", R_VERSION, false},      {"/props", R_PROPS, false},
             {"/v1/responses", R_RESPONSES, true}, {"/responses", R_RESPONSES, true},
             {"/v1/messages", R_MESSAGES, true},  {"/v1/messages/count_tokens", R_COUNT_TOKENS, true}};
    size_t n = strlen(url);
    while (n > 1 && url[n - 1] == '/') n--; /* tolerate a trailing slash */
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (strlen(T[i].path) == n && !strncmp(T[i].path, url, n)) {
            *post = T[i].post;
            return T[i].r;
        }
    for (const char *const *m = (const char *const[]){"/v1/models/", "/models/", NULL}; *m; m++)
        if (!strncmp(url, *m, strlen(*m)) && n > strlen(*m)) {
            *post = false;
            return R_MODEL;
        }
    return R_NONE;
}

/* Errors on the Anthropic routes take Anthropic's shape, from the first check on. */
static bool anthropic_url(const char *url) { return !strncmp(url, "/v1/messages", 12); }

/* ---- deadlines -------------------------------------------------------------------------- */

static track *conn_track(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* deadline_s > 0: a deadline that many seconds from now; 0: none. */
static void track_set(srv *S, struct MHD_Connection *c, double deadline_s, bool body_phase) {
    track *t = conn_track(c);
    if (!t) return;
    pthread_mutex_lock(&S->track_mu);
    t->deadline = deadline_s > 0 ? lilac_now() + deadline_s : 0;
    t->body_phase = body_phase;
    pthread_mutex_unlock(&S->track_mu);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    srv *S = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        track *t = xcalloc(1, sizeof *t);
        t->fd = conn_fd(c);
        t->deadline = lilac_now() + S->o.header_timeout_s;
        pthread_mutex_lock(&S->track_mu);
        t->next = S->tracks;
        if (S->tracks) S->tracks->prev = t;
        S->tracks = t;
        pthread_mutex_unlock(&S->track_mu);
        *socket_context = t;
    } else if (*socket_context) {
        track *t = *socket_context;
        pthread_mutex_lock(&S->track_mu);
        if (t->prev) t->prev->next = t->next;
        else S->tracks = t->next;
        if (t->next) t->next->prev = t->prev;
        pthread_mutex_unlock(&S->track_mu);
        free(t);
        *socket_context = NULL;
    }
}

/* Close connections past their deadline: a 408 (the connection is only reading,
 * so nothing else writes to it), then shutdown(), which MHD's thread sees as the
 * end of the connection. */
static void *watchdog_main(void *arg) {
    srv *S = arg;
    static const char B408[] = "{\"error\":{\"message\":\"the request did not arrive in time\",\"type\":"
                               "\"invalid_request_error\",\"param\":null,\"code\":\"request_timeout\"}}";
    char R408[320];
    int n408 = snprintf(R408, sizeof R408,
                        "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: application/json\r\n"
                        "Content-Length: %zu\r\n\r\n%s", sizeof B408 - 1, B408);
    pthread_mutex_lock(&S->track_mu);
    while (!S->watchdog_stop) {
        double now = lilac_now();
        for (track *t = S->tracks; t; t = t->next)
            if (t->deadline > 0 && now > t->deadline) {
                t->deadline = 0;
                if (send(t->fd, R408, (size_t)n408, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) { /* nothing to do */
                }
                shutdown(t->fd, SHUT_RDWR);
            }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&S->track_cv, &S->track_mu, &ts);
    }
    pthread_mutex_unlock(&S->track_mu);
    return NULL;
}

/* ---- dispatch ------------------------------------------------------------------------------ */

static enum MHD_Result preflight(srv *S, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    if (S->o.cors_origin) {
        add_cors(S, c, r);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    enum MHD_Result ok = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    return ok;
}

/* Everything decided from the request line and headers, before any body byte is
 * read: protocol, Host, route, method, API key, Content-Type, Content-Length.
 * Returns 0 to go on (cc->route set), or fills e (or *pre for a CORS preflight). */
static int gate(srv *S, struct MHD_Connection *c, conn_ctx *cc, const char *url, const char *method, const char *version,
                bool *pre, srv_error *e) {
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!host && !strcmp(version, MHD_HTTP_VERSION_1_1))
        return srv_bad(e, NULL, "an HTTP/1.1 request needs a Host header");
    /* (an HTTP/1.0 request may omit Host; browsers, the rebinding threat, always send it) */
    if (S->allowed_hosts && host && !srv_host_allowed(host, S->allowed_hosts))
        return srv_err(e, 403, "permission_error", NULL, "host_not_allowed",
                       "the Host header '%.100s' is not allowed (see --allowed-hosts)", host);
    if (!strcmp(method, "OPTIONS")) {
        *pre = true;
        return 0;
    }
    bool post = false;
    int rt = route(url, &post);
    if (rt == R_NONE) return srv_err(e, 404, "not_found_error", NULL, NULL, "no such endpoint");
    bool is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if ((post && strcmp(method, "POST")) || (!post && !is_get))
        return srv_err(e, 405, "invalid_request_error", NULL, NULL, "method %.20s is not allowed here; use %s", method,
                       post ? "POST" : "GET");
    bool public = rt == R_HEALTH || rt == R_MODELS || rt == R_MODEL || rt == R_VERSION ||
                  (rt == R_METRICS && S->o.metrics_public);
    if (!public && !authorized(S, c))
        return srv_err(e, 401, "authentication_error", NULL, "invalid_api_key", "Invalid API Key");
    if (post && !srv_ctype_json(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type")))
        return srv_err(e, 415, "invalid_request_error", NULL, "unsupported_media_type",
                       "the request body must be JSON sent with 'Content-Type: application/json'");
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno || *end || n > S->o.max_body)
            return srv_err(e, 413, "invalid_request_error", NULL, "request_too_large", "the request body exceeds %zu bytes",
                           S->o.max_body);
    }
    cc->route = rt;
    return 0;
}

static enum MHD_Result dispatch(srv *S, struct MHD_Connection *c, conn_ctx *cc, const char *url) {
    int rt = cc->route, ready = atomic_load(&S->ready);
    if (rt == R_HEALTH) {
        char dmg[700];
        if (ready == 1 && weights_damaged(S, dmg, sizeof dmg)) return fail(S, c, 503, "unavailable_error", NULL, NULL, dmg);
        if (ready == 1) return send_buf(S, c, 200, "application/json", "{\"status\":\"ok\"}", 15);
        return fail(S, c, 503, "unavailable_error", NULL, NULL, ready == 0 ? "Loading model" : "Shutting down");
    }
    if (rt == R_METRICS) return handle_metrics(S, c);
    if (rt == R_MODELS) return handle_models(S, c);
    if (rt == R_MODEL) return handle_model(S, c, url);
    if (rt == R_VERSION) return handle_version(S, c);
    if (ready != 1)
        return fail_api(S, c, rt == R_MESSAGES || rt == R_COUNT_TOKENS ? API_MESSAGES : API_CHAT, 503, "unavailable_error",
                        ready == 0 ? "Loading model" : "Shutting down");
    switch (rt) {
    case R_CHAT: return handle_generate(S, c, cc, API_CHAT);
    case R_CMPL: return handle_generate(S, c, cc, API_CMPL);
    case R_RESPONSES: return handle_generate(S, c, cc, API_RESPONSES);
    case R_MESSAGES: return handle_generate(S, c, cc, API_MESSAGES);
    case R_COUNT_TOKENS: return handle_count_tokens(S, c, cc);
    case R_PROPS: return handle_props(S, c);
    case R_TOKENIZE: return handle_tokenize(S, c, cc);
    case R_DETOKENIZE: return handle_detokenize(S, c, cc);
    case R_TEMPLATE: return handle_apply_template(S, c, cc);
    }
    return fail(S, c, 404, "not_found_error", NULL, NULL, "no such endpoint");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv *S = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) { /* the headers are complete; no body byte has been read */
        cc = xcalloc(1, sizeof *cc);
        cc->S = S;
        *con_cls = cc;
        conn_begin(S, cc, method, url);
        atomic_fetch_add(&S->active, 1);
        atomic_fetch_add(&S->http_requests, 1);
        srv_error e;
        bool pre = false;
        if (gate(S, c, cc, url, method, version, &pre, &e) < 0) { /* answer at once; MHD then closes the connection */
            if (anthropic_url(url)) e.shape = SRV_SHAPE_ANTHROPIC;
            cc->responded = true;
            track_set(S, c, 0, false);
            return send_error(S, c, &e);
        }
        if (pre) {
            cc->responded = true;
            track_set(S, c, 0, false);
            return preflight(S, c);
        }
        track_set(S, c, S->o.body_timeout_s, true);
        return MHD_YES;
    }
    if (cc->responded) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        if (cc->body.n + *upload_size > S->o.max_body) { /* a chunked body: refused as soon as it is too long */
            cc->responded = true;
            sb_free(&cc->body);
            *upload_size = 0;
            srv_error e;
            srv_err(&e, 413, "invalid_request_error", NULL, "request_too_large", "the request body exceeds %zu bytes",
                    S->o.max_body);
            /* MHD queues no response mid-body: write the 413 on the socket (only this
             * thread uses it while the body is read), then have MHD close the connection */
            atomic_fetch_add(&S->http_errors, 1);
            sbuf b = {0}, j = {0};
            error_json(&j, &e);
            sb_printf(&b, "HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\nContent-Type: application/json\r\n"
                          "Content-Length: %zu\r\n\r\n", j.n);
            sb_put(&b, j.p, j.n);
            int fd = conn_fd(c);
            if (fd >= 0 && send(fd, b.p, b.n, MSG_DONTWAIT | MSG_NOSIGNAL) > 0) shutdown(fd, SHUT_WR);
            sb_free(&b);
            sb_free(&j);
            return MHD_NO;
        }
        sb_put(&cc->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    cc->responded = true;
    track_set(S, c, 0, false);
    return dispatch(S, c, cc, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv *S = cls;
    conn_ctx *cc = *con_cls;
    /* a kept-alive connection must bring its next request's headers within the idle
     * timeout plus the header deadline (each trickled byte resets only the former) */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) track_set(S, c, S->o.timeout_s + S->o.header_timeout_s, false);
    if (!cc) return;
    atomic_fetch_sub(&S->active, 1);
    conn_end(S, c, cc, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
    if (cc->job) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) eng_job_cancel(cc->job);
        eng_job_unref(cc->job);
    }
    sb_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    srv *S = cls;
    if (S->o.quiet || !lilac_log_on(LOG_WARN)) return;
    char m[1024];
    vsnprintf(m, sizeof m, fmt, ap);
    lilac_log(LOG_WARN, "serve", "%s", m);
}

static void srv_free(srv *S) {
    if (S->watchdog_started) {
        pthread_mutex_lock(&S->track_mu);
        S->watchdog_stop = true;
        pthread_cond_signal(&S->track_cv);
        pthread_mutex_unlock(&S->track_mu);
        pthread_join(S->watchdog, NULL);
    }
    pthread_mutex_destroy(&S->track_mu);
    pthread_cond_destroy(&S->track_cv);
    pthread_mutex_destroy(&S->live_mu);
    if (S->listen_fd >= 0) close(S->listen_fd);
    srv_metrics_free(S->metrics);
    free(S->allowed_hosts);
    free(S);
}

/* --host as an address: IPv4, IPv6 (brackets allowed: "[::1]"), or a name
 * (localhost), resolved; a name with both families takes its IPv4 address, the
 * one every client tries. 0, or -1 + err. */
static int resolve_host(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len, lilac_err *err) {
    char h[256];
    size_t n = strlen(host);
    if (n >= sizeof h) return lilac_fail(err, "serve: --host \"%.40s…\" is too long", host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
        memcpy(h, host + 1, n - 2);
        h[n - 2] = 0;
    } else snprintf(h, sizeof h, "%s", host);
    if (!h[0]) return lilac_fail(err, "serve: --host is empty");
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(h, NULL, &hints, &res);
    if (rc != 0) return lilac_fail(err, "serve: --host \"%s\": not an address, and the name does not resolve (%s)", host, gai_strerror(rc));
    const struct addrinfo *pick = NULL;
    for (const struct addrinfo *a = res; a; a = a->ai_next)
        if (a->ai_family == AF_INET && !pick) pick = a;
    for (const struct addrinfo *a = res; a && !pick; a = a->ai_next)
        if (a->ai_family == AF_INET6) pick = a;
    if (!pick) {
        freeaddrinfo(res);
        return lilac_fail(err, "serve: --host \"%s\" has no IPv4 or IPv6 address", host);
    }
    memset(ss, 0, sizeof *ss);
    memcpy(ss, pick->ai_addr, pick->ai_addrlen);
    *len = pick->ai_addrlen;
    if (ss->ss_family == AF_INET) ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    else ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return 0;
}

/* The listening socket, made here so that a busy port is an error of its own
 * (no SO_REUSEPORT: a second server on the port must fail, not share it). */
static int open_listener(srv *S, const struct sockaddr_storage *ss, socklen_t len, lilac_err *err) {
    char addr[INET6_ADDRSTRLEN] = "?";
    const bool v6 = ss->ss_family == AF_INET6;
    if (v6) inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ss)->sin6_addr, addr, sizeof addr);
    else inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, addr, sizeof addr);
    int port = ntohs(v6 ? ((const struct sockaddr_in6 *)ss)->sin6_port : ((const struct sockaddr_in *)ss)->sin_port);
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return lilac_fail(err, "serve: cannot make a socket: %s", strerror(errno));
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* a restart while old connections linger in TIME_WAIT */
    if (v6 && IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)ss)->sin6_addr))
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero); /* "::" takes IPv4 too */
    if (bind(fd, (const struct sockaddr *)ss, len) != 0 || listen(fd, 128) != 0) {
        int e = errno;
        close(fd);
        const char *fmt_host = v6 ? "[%s]" : "%s";
        char h[INET6_ADDRSTRLEN + 2];
        snprintf(h, sizeof h, fmt_host, addr);
        if (e == EADDRINUSE)
            return lilac_fail(err, "serve: cannot listen on %s:%d: port %d is already in use (another server?); choose "
                                   "another --port", h, port, port);
        if (e == EADDRNOTAVAIL)
            return lilac_fail(err, "serve: cannot listen on %s:%d: no interface of this machine has that address (--host)", h, port);
        if (e == EACCES)
            return lilac_fail(err, "serve: cannot listen on %s:%d: permission denied (ports below 1024 need privileges)", h, port);
        return lilac_fail(err, "serve: cannot listen on %s:%d: %s", h, port, strerror(e));
    }
    struct sockaddr_storage got;
    socklen_t gl = sizeof got;
    if (getsockname(fd, (struct sockaddr *)&got, &gl) == 0)
        port = ntohs(v6 ? ((struct sockaddr_in6 *)&got)->sin6_port : ((struct sockaddr_in *)&got)->sin_port);
    snprintf(S->url, sizeof S->url, v6 ? "http://[%s]:%d" : "http://%s:%d", addr, port);
    S->listen_fd = fd;
    return port;
}

srv *srv_start(const srv_options *o, int *port_out, lilac_err *err) {
    signal(SIGPIPE, SIG_IGN);
    srv *S = xcalloc(1, sizeof *S);
    S->o = *o;
    S->listen_fd = -1;
    pthread_mutex_init(&S->track_mu, NULL);
    pthread_cond_init(&S->track_cv, NULL);
    pthread_mutex_init(&S->live_mu, NULL);
    S->metrics = srv_metrics_new();
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    int port;
    if (resolve_host(o->host, o->port, &ss, &sl, err) < 0 || (port = open_listener(S, &ss, sl, err)) < 0) {
        srv_free(S);
        return NULL;
    }
    const bool v6 = ss.ss_family == AF_INET6;
    /* Host allowlist (DNS rebinding): bound to loopback, only loopback names unless told */
    bool loopback = v6 ? IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)&ss)->sin6_addr)
                       : (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
    if (o->allowed_hosts && strcmp(o->allowed_hosts, "*")) S->allowed_hosts = xstrdup(o->allowed_hosts);
    else if (!o->allowed_hosts && loopback) {
        char b[400];
        const char *h = S->url + 7; /* the bound address, bracketed for IPv6 */
        const char *colon = strrchr(h, ':');
        snprintf(b, sizeof b, "localhost,127.0.0.1,[::1],%.*s,%s", (int)(colon - h), h, o->host);
        S->allowed_hosts = xstrdup(b);
    }
    srv_json_max_values = o->max_json_values ? o->max_json_values : SRV_JSON_MAX_VALUES;
    if (pthread_create(&S->watchdog, NULL, watchdog_main, S) != 0) {
        lilac_fail(err, "serve: cannot start a thread");
        srv_free(S);
        return NULL;
    }
    S->watchdog_started = true;
    S->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG |
                                (v6 ? MHD_USE_IPv6 : 0),
                            (uint16_t)port, NULL, NULL, on_request, S, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, S,
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)S->listen_fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, S,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, S, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)o->timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_conns,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)o->max_conns_per_client,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_END);
    if (!S->d) {
        lilac_fail(err, "serve: cannot start the HTTP server on %s (%s)", S->url, strerror(errno));
        S->listen_fd = -1; /* MHD may have closed it */
        srv_free(S);
        return NULL;
    }
    if (port_out) *port_out = port;
    return S;
}

const char *srv_url(const srv *S) { return S->url; }

void srv_set_ready(srv *S, const srv_backend *b) {
    S->b = *b;
    atomic_store(&S->ready, 1);
}

void srv_stop(srv *S) {
    if (!S) return;
    atomic_store(&S->ready, 2);
    MHD_socket ls = MHD_quiesce_daemon(S->d);
    if (S->b.engine) eng_shutdown(S->b.engine); /* in-flight jobs end "cancelled" */
    /* let the connection threads send what they have (error events, [DONE], 503s) */
    double t0 = lilac_now();
    while (atomic_load(&S->active) > 0 && lilac_now() - t0 < 5) usleep(10000);
    MHD_stop_daemon(S->d);
    if (ls != MHD_INVALID_SOCKET && ls != S->listen_fd) close(ls);
    srv_free(S);
}

void srv_load_generation_config(const char *dir, lilac_sampling *d, unsigned *set, int32_t **eos, int *n_eos) {
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    size_t len = 0;
    char *text = lilac_read_file_max(path, LILAC_CONFIG_MAX_BYTES, &len, NULL); /* regular files only */
    json_t *g = text ? json_loadb(text, len, 0, NULL) : NULL;
    free(text);
    if (!json_is_object(g)) {
        json_decref(g);
        return;
    }
    const json_t *v;
    if (json_is_number(v = json_object_get(g, "temperature"))) d->temperature = (float)json_number_value(v), *set |= SET_TEMP;
    if (json_is_number(v = json_object_get(g, "top_p"))) d->top_p = (float)json_number_value(v), *set |= SET_TOP_P;
    if (json_is_integer(v = json_object_get(g, "top_k"))) d->top_k = (int)json_integer_value(v), *set |= SET_TOP_K;
    if (json_is_number(v = json_object_get(g, "min_p"))) d->min_p = (float)json_number_value(v), *set |= SET_MIN_P;
    if (json_is_number(v = json_object_get(g, "repetition_penalty")))
        d->repetition_penalty = (float)json_number_value(v), *set |= SET_REP;
    if (json_is_number(v = json_object_get(g, "presence_penalty")))
        d->presence_penalty = (float)json_number_value(v), *set |= SET_PRES;
    if (json_is_false(json_object_get(g, "do_sample"))) d->temperature = 0, *set |= SET_TEMP;
    v = json_object_get(g, "eos_token_id");
    for (size_t i = 0; i < (json_is_array(v) ? json_array_size(v) : json_is_integer(v) ? 1 : 0); i++) {
        const json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(x)) continue;
        *eos = xrealloc(*eos, sizeof(int32_t) * (size_t)(*n_eos + 1));
        (*eos)[(*n_eos)++] = (int32_t)json_integer_value(x);
    }
    json_decref(g);
}
