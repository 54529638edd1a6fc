/* cmd_serve.c — `lilac serve` (the OpenAI-compatible server), `lilac demo`
 * (build the small random demo model once, then serve it) and `lilac chat`
 * (an interactive terminal chat on the same engine). */
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../chat/chat.h"
#include "../engine/engine.h"
#include "../server/demo_model.h"
#include "../server/outparse.h"
#include "../server/request.h"
#include "../server/server.h"
#include "commands.h"

static const char NO_MODEL[] =
    "no model: pass --model DIR or set LILAC_MODEL.\n"
    "  The real checkpoint (19 GB): huggingface-cli download mlx-community/Qwen3.6-35B-A3B-4bit --local-dir DIR\n"
    "  (or the official bf16 release Qwen/Qwen3.6-35B-A3B).\n"
    "  To try the API without it: `lilac demo` serves a small random-weight model (gibberish text).";

typedef struct {
    const char *model, *backend, *attn_precision;
    long threads, max_seq, parallel, queue, prefill_chunk;
    const char *cache_mb, *snapshot_every; /* NULL: defaults */
} engine_opts;

typedef struct {
    lilac_model m;
    lilac_tokenizer *tok;
    lilac_engine *eng;
    int32_t *eos;
    int n_eos;
    lilac_sampling defaults;
    unsigned defaults_set;
    int64_t max_seq;
} loaded;

static bool engine_opt(int argc, char **argv, int *i, engine_opts *o) {
    return opt_str(argc, argv, i, "--model", &o->model) || opt_str(argc, argv, i, "--backend", &o->backend) ||
           opt_int(argc, argv, i, "--threads", &o->threads) || opt_int(argc, argv, i, "--max-seq", &o->max_seq) ||
           opt_int(argc, argv, i, "--parallel", &o->parallel) || opt_int(argc, argv, i, "--queue", &o->queue) ||
           opt_int(argc, argv, i, "--prefill-chunk", &o->prefill_chunk) ||
           opt_str(argc, argv, i, "--cache-mb", &o->cache_mb) || opt_str(argc, argv, i, "--snapshot-every", &o->snapshot_every) ||
           opt_str(argc, argv, i, "--attn-precision", &o->attn_precision);
}

static void add_eos(loaded *L, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < L->n_eos; i++)
        if (L->eos[i] == id) return;
    L->eos = xrealloc(L->eos, sizeof(int32_t) * (size_t)(L->n_eos + 1));
    L->eos[L->n_eos++] = id;
}

/* Load model, tokenizer and generation defaults; start the engine. */
static int load_all(const char *cmd, engine_opts *o, loaded *L, lilac_err *err) {
    memset(L, 0, sizeof *L);
    if (o->threads < 0) return lilac_fail(err, "%s: --threads must be positive", cmd);
    if (o->parallel < 0 || o->parallel > 64) return lilac_fail(err, "%s: --parallel must be in 1..64", cmd);
    if (o->max_seq < 0) return lilac_fail(err, "%s: --max-seq must be positive", cmd);
    double cache_mb = 2048;
    long every = 256;
    if (o->cache_mb) {
        char *end;
        cache_mb = strtod(o->cache_mb, &end);
        if (end == o->cache_mb || *end || !(cache_mb >= 0) || cache_mb > 1e9)
            return lilac_fail(err, "%s: --cache-mb expects a size in MiB (0 disables snapshots)", cmd);
    }
    if (o->snapshot_every) {
        char *end;
        every = strtol(o->snapshot_every, &end, 10);
        if (end == o->snapshot_every || *end || every < 0 || every > 1000000000L)
            return lilac_fail(err, "%s: --snapshot-every expects a token count (0: only at prompt and turn ends)", cmd);
    }
    const lilac_backend *be = lilac_backend_get(o->backend, err);
    if (!be) return -1;
    const int attn_bf16 = opt_attn_bf16(cmd, o->attn_precision, be->set_attn_bf16 != NULL, err);
    if (attn_bf16 < 0) return -1;
    if (o->threads > 0) omp_set_num_threads((int)o->threads);
    if (lilac_model_load(&L->m, o->model, err) < 0) {
        memset(&L->m, 0, sizeof L->m);
        return -1;
    }
    L->tok = lilac_tok_load(o->model, err);
    if (!L->tok) return -1;
    if (lilac_tok_vocab_size(L->tok) > L->m.cfg.vocab)
        return lilac_fail(err, "%s: the tokenizer has %d ids but the model only %lld", cmd, lilac_tok_vocab_size(L->tok),
                          (long long)L->m.cfg.vocab);
    lilac_err warn = {{0}};
    if (lilac_chat_check_template(o->model, &warn) != 0) fprintf(stderr, "lilac %s: warning: %s\n", cmd, warn.msg);
    lilac_sampling_default(&L->defaults);
    srv_load_generation_config(o->model, &L->defaults, &L->defaults_set, &L->eos, &L->n_eos);
    add_eos(L, L->m.cfg.eos_id);
    add_eos(L, lilac_tok_added_id(L->tok, "<|im_end|>"));
    add_eos(L, lilac_tok_added_id(L->tok, "<|endoftext|>"));
    int64_t ms = o->max_seq ? o->max_seq : 32768;
    if (ms > L->m.cfg.max_pos) ms = L->m.cfg.max_pos;
    L->max_seq = ms;
    eng_config ec = {.be = be,
                     .model = &L->m,
                     .tok = L->tok,
                     .max_seq = ms,
                     .threads = (int)o->threads,
                     .attn_bf16 = attn_bf16 == 1,
                     .n_slots = o->parallel ? (int)o->parallel : 1,
                     .queue_max = o->queue > 0 ? (int)o->queue : 64,
                     .prefill_chunk = o->prefill_chunk > 0 ? (int)o->prefill_chunk : 128,
                     .snapshot_every = (int)every,
                     .cache_bytes = (int64_t)(cache_mb * 1048576.0),
                     .turn_start = lilac_tok_added_id(L->tok, "<|im_start|>"),
                     .eos = L->eos,
                     .n_eos = L->n_eos};
    L->eng = eng_new(&ec, err);
    return L->eng ? 0 : -1;
}

static void unload(loaded *L) {
    eng_free(L->eng);
    lilac_tok_free(L->tok);
    if (L->m.layers) lilac_model_free(&L->m);
    free(L->eos);
}

/* ---- serve ---------------------------------------------------------------------- */

static int serve_main(const char *cmd, int argc, char **argv, const char *model_dir) {
    engine_opts eo = {0};
    srv_options so;
    srv_options_default(&so);
    long port = so.port, max_body = (long)so.max_body, timeout = so.timeout_s, ping_ms = -1;
    const char *reasoning = NULL, *ping = NULL;
    bool test_hooks = false, no_dc = false, quiet = false, strict = false;
    for (int i = 1; i < argc; i++) {
        if (engine_opt(argc, argv, &i, &eo) || opt_str(argc, argv, &i, "--host", &so.host) ||
            opt_int(argc, argv, &i, "--port", &port) || opt_str(argc, argv, &i, "--api-key", &so.api_key) ||
            opt_str(argc, argv, &i, "--cors-origin", &so.cors_origin) || opt_str(argc, argv, &i, "--alias", &so.alias) ||
            opt_int(argc, argv, &i, "--max-body", &max_body) || opt_str(argc, argv, &i, "--ping", &ping) ||
            opt_int(argc, argv, &i, "--timeout", &timeout) || opt_str(argc, argv, &i, "--reasoning-field", &reasoning) ||
            opt_flag(argc, argv, &i, "--test-hooks", &test_hooks) ||
            opt_flag(argc, argv, &i, "--no-disconnect-check", &no_dc) || opt_flag(argc, argv, &i, "--quiet", &quiet) ||
            opt_flag(argc, argv, &i, "--strict-model", &strict))
            continue;
        if (model_dir && (!strcmp(argv[i], "--rebuild") || !strncmp(argv[i], "--out", 5))) {
            if (!strcmp(argv[i], "--out")) i++;
            continue; /* demo's own options */
        }
        opt_unknown(cmd, argv[i]);
    }
    if (model_dir) eo.model = model_dir;
    if (!eo.model) eo.model = getenv("LILAC_MODEL");
    if (!eo.model) lilac_die("%s: %s", cmd, NO_MODEL);
    if (!so.api_key) so.api_key = getenv("LILAC_API_KEY");
    if (port < 0 || port > 65535) lilac_die("%s: --port must be in 0..65535", cmd);
    if (max_body < 1024) lilac_die("%s: --max-body must be at least 1024 bytes", cmd);
    if (timeout < 1) lilac_die("%s: --timeout must be >= 1 second", cmd);
    if (ping) {
        char *end;
        double p = strtod(ping, &end);
        if (*end || p < 0) lilac_die("%s: --ping expects seconds (0 disables)", cmd);
        so.ping_s = p;
    }
    (void)ping_ms;
    if (reasoning) {
        if (!strcmp(reasoning, "reasoning_content")) so.reasoning = REASONING_CONTENT;
        else if (!strcmp(reasoning, "reasoning")) so.reasoning = REASONING_FIELD;
        else if (!strcmp(reasoning, "both")) so.reasoning = REASONING_CONTENT | REASONING_FIELD;
        else lilac_die("%s: --reasoning-field must be reasoning_content, reasoning or both", cmd);
    }
    so.port = (int)port;
    so.max_body = (size_t)max_body;
    so.timeout_s = (int)timeout;
    so.test_hooks = test_hooks;
    so.disconnect_check = !no_dc;
    so.quiet = quiet;
    so.strict_model = strict;

    /* SIGINT/SIGTERM are taken by sigwait below; every thread inherits the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    lilac_err err = {{0}};
    int bound = 0;
    srv *S = srv_start(&so, &bound, &err);
    if (!S) lilac_die("%s", err.msg);
    fprintf(stderr, "lilac %s: listening on http://%s:%d (loading %s)\n", cmd, so.host, bound, eo.model);
    loaded L;
    double t0 = lilac_now();
    if (load_all(cmd, &eo, &L, &err) < 0) {
        srv_stop(S);
        unload(&L);
        lilac_die("%s", err.msg);
    }
    srv_backend b = {.engine = L.eng,
                     .tok = L.tok,
                     .model = &L.m,
                     .model_dir = eo.model,
                     .max_seq = L.max_seq,
                     .defaults = L.defaults,
                     .defaults_set = L.defaults_set};
    srv_set_ready(S, &b);
    fprintf(stderr, "lilac %s: ready in %.1f s: model %s, context %lld, %ld slot(s), backend %s%s\n", cmd,
            lilac_now() - t0, so.alias, (long long)L.max_seq, eo.parallel ? eo.parallel : 1,
            eo.backend ? eo.backend : "auto", so.api_key ? ", API key required" : "");
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "lilac %s: %s received, shutting down\n", cmd, sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv_stop(S);
    unload(&L);
    return 0;
}

int cmd_serve(int argc, char **argv) { return serve_main("serve", argc, argv, NULL); }

int cmd_demo(int argc, char **argv) {
    const char *out = NULL;
    bool rebuild = false, build_only = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rebuild")) rebuild = true;
        else if (!strcmp(argv[i], "--build-only")) build_only = true;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strncmp(argv[i], "--out=", 6)) out = argv[i] + 6;
    }
    char dir[4096];
    lilac_err err = {{0}};
    if (out) snprintf(dir, sizeof dir, "%s", out);
    else if (lilac_demo_dir(dir, sizeof dir, &err) < 0) lilac_die("%s", err.msg);
    double t0 = lilac_now();
    if (rebuild || out) {
        if (lilac_demo_build(dir, &err) < 0) lilac_die("%s", err.msg);
    } else if (lilac_demo_ensure(dir, &err) < 0) lilac_die("%s", err.msg);
    fprintf(stderr, "lilac demo: model in %s (%.2f s). Random weights: its text is gibberish.\n", dir, lilac_now() - t0);
    if (build_only) {
        printf("%s\n", dir);
        return 0;
    }
    /* serve it, with the remaining options (build-only flags removed) */
    char **av = xcalloc((size_t)argc + 1, sizeof(char *));
    int ac = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && !strcmp(argv[i], "--build-only")) continue;
        av[ac++] = argv[i];
    }
    int rc = serve_main("demo", ac, av, dir);
    free(av);
    return rc;
}

/* ---- chat -------------------------------------------------------------------------- */

typedef struct {
    bool tty, in_reasoning, any_content;
    sbuf reasoning, content;
} chat_out;

static void co_reasoning(void *ud, const char *s, size_t n) {
    chat_out *c = ud;
    if (!c->in_reasoning) {
        fputs(c->tty ? "\033[2m[thinking] " : "[thinking] ", stdout);
        c->in_reasoning = true;
    }
    fwrite(s, 1, n, stdout);
    fflush(stdout);
    sb_put(&c->reasoning, s, n);
}
static void co_end_reasoning(chat_out *c) {
    if (c->in_reasoning) {
        fputs(c->tty ? "\033[0m\n" : "\n[/thinking]\n", stdout);
        c->in_reasoning = false;
    }
}
static void co_content(void *ud, const char *s, size_t n) {
    chat_out *c = ud;
    co_end_reasoning(c);
    fwrite(s, 1, n, stdout);
    fflush(stdout);
    sb_put(&c->content, s, n);
}
static void co_open(void *ud, int index, const char *id, const char *name) {
    chat_out *c = ud;
    (void)id;
    co_end_reasoning(c);
    printf("\n[tool call %d: %s ", index, name);
}
static void co_args(void *ud, int index, const char *s, size_t n) {
    (void)ud;
    (void)index;
    fwrite(s, 1, n, stdout);
}

static volatile sig_atomic_t chat_interrupted;
static void on_sigint(int s) {
    (void)s;
    chat_interrupted = 1;
}

/* Read one user message: lines until one not ending in '\', or a """ block. NULL at EOF. */
static char *read_message(void) {
    sbuf b = {0};
    char *line = NULL;
    size_t cap = 0;
    bool block = false;
    for (;;) {
        fputs(b.n || block ? "... " : "> ", stdout);
        fflush(stdout);
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) {
            free(line);
            if (b.n) return b.p;
            sb_free(&b);
            return NULL;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!strcmp(line, "\"\"\"")) {
            if (block) break;
            block = true;
            continue;
        }
        if (block) {
            sb_put(&b, line, (size_t)n);
            sb_putc(&b, '\n');
            continue;
        }
        if (n > 0 && line[n - 1] == '\\') {
            sb_put(&b, line, (size_t)n - 1);
            sb_putc(&b, '\n');
            continue;
        }
        sb_put(&b, line, (size_t)n);
        break;
    }
    free(line);
    if (!b.p) sb_put(&b, "", 0);
    while (b.n && b.p[b.n - 1] == '\n') b.p[--b.n] = 0;
    return b.p;
}

int cmd_chat(int argc, char **argv) {
    engine_opts eo = {0};
    long max_tokens = 4096;
    const char *temp = NULL, *system = NULL;
    bool no_think = false;
    for (int i = 1; i < argc; i++)
        if (!engine_opt(argc, argv, &i, &eo) && !opt_int(argc, argv, &i, "--max-tokens", &max_tokens) &&
            !opt_str(argc, argv, &i, "--temperature", &temp) && !opt_str(argc, argv, &i, "--system", &system) &&
            !opt_flag(argc, argv, &i, "--no-think", &no_think))
            opt_unknown("chat", argv[i]);
    if (!eo.model) eo.model = getenv("LILAC_MODEL");
    if (!eo.model) lilac_die("chat: %s", NO_MODEL);
    if (max_tokens < 1) lilac_die("chat: --max-tokens must be >= 1");
    eo.parallel = 1;
    loaded L;
    lilac_err err = {{0}};
    if (load_all("chat", &eo, &L, &err) < 0) lilac_die("%s", err.msg);
    lilac_sampling samp = L.defaults;
    if (temp) samp.temperature = (float)atof(temp);
    bool tty = isatty(1);
    bool think = !no_think;
    json_t *msgs = json_array();
    if (system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
    signal(SIGINT, on_sigint);
    printf("lilac chat: %s (context %lld). Commands: /reset, /nothink, /think, /quit. End a line with \\ or use \"\"\" "
           "for multi-line input; Ctrl-C stops a reply.\n",
           eo.model, (long long)L.max_seq);
    for (;;) {
        char *msg = read_message();
        if (!msg) break;
        if (!strcmp(msg, "/quit") || !strcmp(msg, "/exit")) {
            free(msg);
            break;
        }
        if (!strcmp(msg, "/reset")) {
            json_array_clear(msgs);
            if (system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
            printf("(conversation cleared)\n");
            free(msg);
            continue;
        }
        if (!strcmp(msg, "/nothink") || !strcmp(msg, "/think")) {
            think = !strcmp(msg, "/think");
            printf("(thinking %s)\n", think ? "on" : "off");
            free(msg);
            continue;
        }
        if (!msg[0]) {
            free(msg);
            continue;
        }
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", msg));
        free(msg);
        lilac_chat_opts co;
        lilac_chat_opts_default(&co);
        co.enable_thinking = think;
        lilac_prompt pr = {0};
        lilac_ids ids = {0};
        if (lilac_chat_render(msgs, NULL, &co, &pr, &err) < 0 || lilac_prompt_encode(L.tok, &pr, false, &ids, &err) < 0) {
            fprintf(stderr, "chat: %s\n", err.msg);
            lilac_prompt_free(&pr);
            lilac_ids_free(&ids);
            json_array_remove(msgs, json_array_size(msgs) - 1);
            continue;
        }
        lilac_prompt_free(&pr);
        if ((int64_t)ids.n >= L.max_seq) {
            fprintf(stderr, "chat: the conversation (%zu tokens) fills the context (%lld); /reset\n", ids.n,
                    (long long)L.max_seq);
            lilac_ids_free(&ids);
            json_array_remove(msgs, json_array_size(msgs) - 1);
            continue;
        }
        eng_job *j = eng_job_new();
        j->prompt = ids.ids;
        j->n_prompt = (int)ids.n;
        j->max_tokens = (int)(max_tokens < L.max_seq - (int64_t)ids.n ? max_tokens : L.max_seq - (int64_t)ids.n);
        j->samp = samp;
        chat_out out = {.tty = tty};
        op_parser *op = op_new(think, NULL);
        const op_sink sink = {co_reasoning, co_content, co_open, co_args};
        chat_interrupted = 0;
        if (eng_submit(L.eng, j) < 0) lilac_die("chat: the engine refused the job");
        size_t off = 0;
        pthread_mutex_lock(&j->mu);
        for (;;) {
            if (j->text.n > off) {
                sbuf piece = {0};
                sb_put(&piece, j->text.p + off, j->text.n - off);
                off = j->text.n;
                pthread_mutex_unlock(&j->mu);
                op_feed(op, piece.p, piece.n, &sink, &out);
                sb_free(&piece);
                pthread_mutex_lock(&j->mu);
                continue;
            }
            if (j->state == JOB_DONE) break;
            if (chat_interrupted) eng_job_cancel(j);
            eng_job_wait(j, 0.05);
        }
        pthread_mutex_unlock(&j->mu);
        op_finish(op, &sink, &out);
        co_end_reasoning(&out);
        op_free(op);
        double dt = j->t_end - j->t_first;
        printf("\n%s[%d tokens, %.1f tok/s, prefill %d tokens (%d cached) in %.2f s%s]%s\n", tty ? "\033[2m" : "", j->n_gen,
               dt > 0 && j->n_gen > 1 ? (j->n_gen - 1) / dt : 0.0, j->n_prompt - j->n_cached, j->n_cached,
               j->t_first - j->t_start, !strcmp(j->finish, "cancelled") ? ", stopped" : "", tty ? "\033[0m" : "");
        json_t *am = json_pack("{s:s,s:s%}", "role", "assistant", "content", out.content.p ? out.content.p : "", out.content.n);
        if (out.reasoning.n) json_object_set_new(am, "reasoning_content", json_stringn(out.reasoning.p, out.reasoning.n));
        json_array_append_new(msgs, am);
        sb_free(&out.reasoning);
        sb_free(&out.content);
        eng_job_unref(j);
    }
    json_decref(msgs);
    unload(&L);
    return 0;
}
