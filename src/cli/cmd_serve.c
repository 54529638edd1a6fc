/* cmd_serve.c — `lilac serve` (the OpenAI-compatible server), `lilac demo`
 * (build the small random demo model once, then serve it) and `lilac chat`
 * (an interactive terminal chat on the same engine). */
#include <ctype.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <editline/readline.h>

#include "../chat/chat.h"
#include "../engine/engine.h"
#include "../server/demo_model.h"
#include "../server/outparse.h"
#include "../server/request.h"
#include "../server/server.h"
#include "../util/log.h"
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
    const lilac_backend *be;
    int32_t *eos;
    int n_eos;
    lilac_sampling defaults;
    unsigned defaults_set;
    int64_t max_seq;
    int n_slots;
    double load_s;      /* open + read the weights + start the engine */
    char where[256];    /* backend and device */
    char context[640];  /* the context decision, with its memory arithmetic */
} loaded;

static bool engine_opt(int argc, char **argv, int *i, engine_opts *o) {
    return opt_str(argc, argv, i, "--model", &o->model) || opt_str(argc, argv, i, "--backend", &o->backend) ||
           opt_range(argc, argv, i, "--threads", 1, OPT_MAX_THREADS, &o->threads) ||
           opt_range(argc, argv, i, "--max-seq", 1, 1L << 30, &o->max_seq) ||
           opt_range(argc, argv, i, "--parallel", 1, 64, &o->parallel) ||
           opt_range(argc, argv, i, "--queue", 1, 1L << 20, &o->queue) ||
           opt_range(argc, argv, i, "--prefill-chunk", 1, 1L << 20, &o->prefill_chunk) ||
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

/* ---- loading ------------------------------------------------------------------- */

#ifdef LILAC_CUDA
/* Two of the CUDA runtime's C entry points (cudart is linked with the CUDA backend). */
int cudaMemGetInfo(size_t *free_b, size_t *total_b);
int cudaDeviceGetPCIBusId(char *bus, int len, int device);
/* Device 0's name (the driver's /proc entry for its PCI address) and memory. */
static bool gpu_info(char *name, size_t cap, double *free_b, double *total_b) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != 0) return false;
    *free_b = (double)fr;
    *total_b = (double)tot;
    char bus[64] = "", path[160], line[256];
    snprintf(name, cap, "GPU 0");
    if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, 0) != 0) return true;
    for (char *p = bus; *p; p++) *p = (char)tolower((unsigned char)*p);
    snprintf(name, cap, "GPU 0 (%s)", bus);
    snprintf(path, sizeof path, "/proc/driver/nvidia/gpus/%s/information", bus);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Model:", 6)) {
            char *m = line + 6;
            while (*m == ' ' || *m == '\t') m++;
            m[strcspn(m, "\n")] = 0;
            snprintf(name, cap, "%s", m);
        }
    fclose(f);
    return true;
}
#endif

#define GIB (1024.0 * 1024.0 * 1024.0)

static double file_bytes(const lilac_model *m) {
    double n = 0;
    for (int i = 0; i < m->st.n_shards; i++) n += (double)m->st.shards[i].size;
    return n;
}

/* Read every page of the weights now, with progress (a bar on a terminal, a line
 * per tenth otherwise for large checkpoints): the mapping is lazy, and the first
 * request should not pay for the disk. */
static void read_weights(const char *cmd, const lilac_model *m) {
    const double total = file_bytes(m);
    const bool tty = isatty(2);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), step = (size_t)64 << 20;
    double done = 0, t0 = lilac_now(), shown = -1;
    unsigned sink = 0;
    for (int i = 0; i < m->st.n_shards; i++) {
        const st_shard *sh = &m->st.shards[i];
        for (size_t off = 0; off < sh->size; off += step) {
            size_t n = sh->size - off < step ? sh->size - off : step;
            const volatile unsigned char *p = (const unsigned char *)sh->map + off;
            madvise((void *)(uintptr_t)p, n, MADV_WILLNEED);
            for (size_t k = 0; k < n; k += page) sink += p[k];
            done += (double)n;
            double frac = total > 0 ? done / total : 1;
            if (tty && lilac_now() - t0 > 0.2 && frac - shown >= 0.005) {
                int w = (int)(frac * 30);
                fprintf(stderr, "\rlilac %s: reading weights [%.*s%*s] %3.0f%% %.1f of %.1f GB", cmd, w,
                        "##############################", 30 - w, "", 100 * frac, done / 1e9, total / 1e9);
                shown = frac;
            } else if (!tty && total > 1e9 && (int)(frac * 10) > (int)(shown * 10)) {
                fprintf(stderr, "lilac %s: reading weights: %.0f%% (%.1f of %.1f GB)\n", cmd, 100 * frac, done / 1e9, total / 1e9);
                shown = frac;
            }
        }
    }
    if (tty && shown >= 0) fputs("\n", stderr);
    (void)sink;
}

/* Host memory a new allocation may take: the least of MemAvailable (less the
 * weights, whose pages it counts as reclaimable), the cgroup's limit and the
 * address-space limit (ulimit -v). < 0: unknown. */
static double host_free(double weights) {
    double best = -1;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) best = (double)kb * 1024.0 - weights;
        fclose(f);
    }
    if (best < 0 && best != -1) best = 0;
    double lim = -1, cur = 0;
    f = fopen("/sys/fs/cgroup/memory.max", "r");
    if (f) {
        unsigned long long v;
        if (fscanf(f, "%llu", &v) == 1) lim = (double)v;
        fclose(f);
    }
    f = fopen("/sys/fs/cgroup/memory.current", "r");
    if (f) {
        unsigned long long v;
        if (fscanf(f, "%llu", &v) == 1) cur = (double)v;
        fclose(f);
    }
    if (lim >= 0 && (best < 0 || lim - cur < best)) best = lim - cur > 0 ? lim - cur : 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        double vm = 0;
        f = fopen("/proc/self/status", "r");
        if (f) {
            char line[256];
            unsigned long long kb;
            while (fgets(line, sizeof line, f))
                if (sscanf(line, "VmSize: %llu kB", &kb) == 1) vm = (double)kb * 1024.0;
            fclose(f);
        }
        double room = (double)rl.rlim_cur - vm;
        if (best < 0 || room < best) best = room > 0 ? room : 0;
    }
    return best;
}

/* The context per slot: --max-seq (at most the model's max_position_embeddings),
 * else the model's own unless the KV cache and recurrent state of every slot at
 * that length do not fit the free memory (device memory for the GPU backend):
 * then the most that fits, in steps of 1024. The arithmetic goes to L->context. */
static int choose_context(const char *cmd, engine_opts *o, loaded *L, lilac_err *err) {
    const lilac_config *c = &L->m.cfg;
    const int64_t max_pos = c->max_pos;
    if (o->max_seq > max_pos)
        return lilac_fail(err, "%s: --max-seq %ld exceeds the model's context: max_position_embeddings is %lld", cmd,
                          o->max_seq, (long long)max_pos);
    int n_full = 0;
    for (int l = 0; l < c->n_layers; l++) n_full += c->is_full[l];
    const double per_tok = (double)n_full * 2.0 * c->n_kv_heads * c->head_dim * L->be->kv_bytes;
    const double state = (double)(c->n_layers - n_full) *
                         ((double)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim + (double)(c->conv_kernel - 1) * cfg_conv_dim(c)) * 4.0;
    const int slots = L->n_slots;
    double avail = -1;
    const char *mem = "host memory";
    const double weights = file_bytes(&L->m);
#ifdef LILAC_CUDA
    char gpu[256];
    double gfree, gtot;
    if (!strcmp(L->be->name, "cuda") && gpu_info(gpu, sizeof gpu, &gfree, &gtot)) {
        avail = gfree - weights - GIB; /* weights go up at the engine's start; 1 GiB for its work buffers */
        if (avail < 0) avail = 0;
        mem = "GPU memory";
    } else
#endif
        avail = host_free(weights);
    const double budget = 0.9 * avail;
    int64_t ctx = o->max_seq ? o->max_seq : max_pos;
    double need = slots * (state + (double)ctx * per_tok);
    if (!o->max_seq && avail >= 0 && need > budget) {
        double fit = (budget / slots - state) / per_tok;
        int64_t fitted = fit > 0 ? ((int64_t)fit / 1024) * 1024 : 0;
        if (fitted < 1024)
            return lilac_fail(err, "%s: not enough memory for even 1024 tokens of context per slot: %.2f GiB of %s free "
                                   "for %d slot(s) of %.2f GiB state + %.1f KiB per token; lower --parallel",
                              cmd, avail / GIB, mem, slots, state / GIB, per_tok / 1024);
        snprintf(L->context, sizeof L->context,
                 "context %lld tokens per slot, not the model's %lld: its KV cache and state would take %.2f GiB per slot x "
                 "%d slot(s) = %.2f GiB, more than the %.2f GiB of %s free (90%% of it is used); --max-seq sets it",
                 (long long)fitted, (long long)max_pos, (state + max_pos * per_tok) / GIB, slots, need / GIB, avail / GIB, mem);
        ctx = fitted;
        need = slots * (state + (double)ctx * per_tok);
    } else {
        char freebuf[96] = "";
        if (avail >= 0) snprintf(freebuf, sizeof freebuf, ", of %.2f GiB %s free", avail / GIB, mem);
        snprintf(L->context, sizeof L->context, "context %lld tokens per slot%s, %d slot(s): KV cache and state %.2f GiB per slot, %.2f GiB in all%s",
                 (long long)ctx, o->max_seq ? " (--max-seq)" : ctx == max_pos ? " (the model's maximum)" : "", slots,
                 (state + ctx * per_tok) / GIB, need / GIB, freebuf);
        if (o->max_seq && avail >= 0 && need > budget)
            lilac_log(LOG_WARN, cmd, "--max-seq %lld: the KV cache of %d slot(s) at full length (%.2f GiB) exceeds the free %s (%.2f GiB)",
                      (long long)ctx, slots, need / GIB, mem, avail / GIB);
    }
    L->max_seq = ctx;
    return 0;
}

/* Load model, tokenizer and generation defaults; start the engine. */
static int load_all(const char *cmd, engine_opts *o, loaded *L, lilac_err *err) {
    memset(L, 0, sizeof *L);
    double t0 = lilac_now();
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
    L->be = be;
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
    L->n_slots = o->parallel ? (int)o->parallel : 1;
    if (choose_context(cmd, o, L, err) < 0) return -1;
    read_weights(cmd, &L->m);
    eng_config ec = {.be = be,
                     .model = &L->m,
                     .tok = L->tok,
                     .max_seq = L->max_seq,
                     .threads = (int)o->threads,
                     .attn_bf16 = attn_bf16 == 1,
                     .n_slots = L->n_slots,
                     .queue_max = o->queue > 0 ? (int)o->queue : 64,
                     .prefill_chunk = o->prefill_chunk > 0 ? (int)o->prefill_chunk : 128,
                     .snapshot_every = (int)every,
                     .cache_bytes = (int64_t)(cache_mb * 1048576.0),
                     .turn_start = lilac_tok_added_id(L->tok, "<|im_start|>"),
                     .eos = L->eos,
                     .n_eos = L->n_eos};
    L->eng = eng_new(&ec, err);
    if (!L->eng) return -1;
    L->load_s = lilac_now() - t0;
    int th = o->threads > 0 ? (int)o->threads : omp_get_max_threads();
    snprintf(L->where, sizeof L->where, "backend cpu, %d thread%s", th, th == 1 ? "" : "s");
#ifdef LILAC_CUDA
    char gpu[256];
    double gfree, gtot;
    if (!strcmp(be->name, "cuda") && gpu_info(gpu, sizeof gpu, &gfree, &gtot))
        snprintf(L->where, sizeof L->where, "backend cuda on %.160s: %.1f of %.1f GiB used", gpu, (gtot - gfree) / GIB, gtot / GIB);
#endif
    return 0;
}

/* What was loaded, where, and with what context: the start-up lines. */
static void print_loaded(const char *cmd, const engine_opts *o, const loaded *L) {
    const lilac_config *c = &L->m.cfg;
    int n_full = 0;
    for (int l = 0; l < c->n_layers; l++) n_full += c->is_full[l];
    char fmt[64];
    if (L->m.layout == LAYOUT_MLX) snprintf(fmt, sizeof fmt, "MLX %d-bit, group %d", c->q_bits, c->q_group);
    else snprintf(fmt, sizeof fmt, "HF bf16");
    const double bytes = file_bytes(&L->m);
    fprintf(stderr, "lilac %s: loaded %s (%s, %d layers of which %d attention, %d experts, %.*f %s) in %.2f s\n", cmd, o->model,
            fmt, c->n_layers, n_full, c->n_experts, bytes < 1e9 ? 1 : 2, bytes < 1e9 ? bytes / 1e6 : bytes / 1e9, bytes < 1e9 ? "MB" : "GB", L->load_s);
    fprintf(stderr, "lilac %s: %s\n", cmd, L->where);
    fprintf(stderr, "lilac %s: %s\n", cmd, L->context);
}

static void unload(loaded *L) {
    eng_free(L->eng);
    lilac_tok_free(L->tok);
    if (L->m.layers) lilac_model_free(&L->m);
    free(L->eos);
}

/* ---- serve ---------------------------------------------------------------------- */

/* The API keys: comma-separated, each trimmed of surrounding blanks; an empty key
 * (an empty --api-key or $LILAC_API_KEY, e.g. an unset shell variable, or an
 * empty list entry) or one with a blank or control byte inside dies: a key that
 * silently disables auth or can never match must not start a server. */
static char *normalize_keys(const char *cmd, const char *from, const char *keys) {
    sbuf b = {0};
    const char *k = keys;
    for (;;) {
        const char *end = strchr(k, ',');
        size_t n = end ? (size_t)(end - k) : strlen(k);
        while (n && (*k == ' ' || *k == '\t')) k++, n--;
        while (n && (k[n - 1] == ' ' || k[n - 1] == '\t')) n--;
        if (!n) lilac_die("%s: %s holds an empty API key; give non-empty keys (comma-separated) or leave it unset", cmd, from);
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)k[i] <= 0x20 || (unsigned char)k[i] == 0x7f)
                lilac_die("%s: %s: an API key must not contain blanks or control characters", cmd, from);
        if (b.n) sb_putc(&b, ',');
        sb_put(&b, k, n);
        if (!end) break;
        k = end + 1;
    }
    return b.p;
}

/* Connections need descriptors: raise the soft limit to the hard one, and keep
 * --max-conns below it. */
static void fit_fd_limit(const char *cmd, srv_options *so) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && (rlim_t)so->max_conns + 64 > rl.rlim_cur) {
        long fit = rl.rlim_cur > 128 ? (long)rl.rlim_cur - 64 : 64;
        fprintf(stderr, "lilac %s: warning: the descriptor limit is %llu: --max-conns lowered from %d to %ld\n", cmd,
                (unsigned long long)rl.rlim_cur, so->max_conns, fit);
        so->max_conns = (int)fit;
    }
}

static int serve_main(const char *cmd, int argc, char **argv, const char *model_dir) {
    engine_opts eo = {0};
    srv_options so;
    srv_options_default(&so);
    long port = so.port, max_body = (long)so.max_body, timeout = so.timeout_s, max_conns = so.max_conns,
         per_client = so.max_conns_per_client, header_to = so.header_timeout_s, body_to = so.body_timeout_s,
         json_values = (long)so.max_json_values, max_tokenize = 0;
    double ping = so.ping_s;
    const char *reasoning = NULL, *log_level = NULL;
    bool test_hooks = false, no_dc = false, quiet = false, strict = false, log_prompts = false;
    for (int i = 1; i < argc; i++) {
        if (engine_opt(argc, argv, &i, &eo) || opt_str(argc, argv, &i, "--host", &so.host) ||
            opt_range(argc, argv, &i, "--port", 0, 65535, &port) || opt_str(argc, argv, &i, "--api-key", &so.api_key) ||
            opt_str(argc, argv, &i, "--cors-origin", &so.cors_origin) || opt_str(argc, argv, &i, "--alias", &so.alias) ||
            opt_range(argc, argv, &i, "--max-body", 1024, 1L << 30, &max_body) ||
            opt_real(argc, argv, &i, "--ping", 0, 3600, &ping) ||
            opt_range(argc, argv, &i, "--timeout", 1, 86400, &timeout) ||
            opt_range(argc, argv, &i, "--max-conns", 1, 1L << 20, &max_conns) ||
            opt_range(argc, argv, &i, "--max-conns-per-client", 1, 1L << 20, &per_client) ||
            opt_range(argc, argv, &i, "--header-timeout", 1, 3600, &header_to) ||
            opt_range(argc, argv, &i, "--body-timeout", 1, 86400, &body_to) ||
            opt_range(argc, argv, &i, "--max-json-values", 1024, 1L << 30, &json_values) ||
            opt_range(argc, argv, &i, "--max-tokenize", 1, 1L << 30, &max_tokenize) ||
            opt_str(argc, argv, &i, "--allowed-hosts", &so.allowed_hosts) ||
            opt_flag(argc, argv, &i, "--metrics-public", &so.metrics_public) ||
            opt_str(argc, argv, &i, "--reasoning-field", &reasoning) || opt_flag(argc, argv, &i, "--test-hooks", &test_hooks) ||
            opt_flag(argc, argv, &i, "--no-disconnect-check", &no_dc) || opt_flag(argc, argv, &i, "--quiet", &quiet) ||
            opt_flag(argc, argv, &i, "--strict-model", &strict) || opt_str(argc, argv, &i, "--log-level", &log_level) ||
            opt_flag(argc, argv, &i, "--log-prompts", &log_prompts))
            continue;
        if (model_dir && (!strcmp(argv[i], "--rebuild") || !strcmp(argv[i], "--out") || !strncmp(argv[i], "--out=", 6))) {
            if (!strcmp(argv[i], "--out")) i++;
            continue; /* demo's own options */
        }
        opt_unknown(cmd, argv[i]);
    }
    if (log_level && lilac_log_parse(log_level, &lilac_log_threshold) < 0)
        lilac_die("%s: --log-level must be error, warn, info or debug (got \"%s\")", cmd, log_level);
    if (quiet) lilac_log_threshold = LOG_ERROR;
    if (model_dir) eo.model = model_dir;
    if (!eo.model) eo.model = getenv("LILAC_MODEL");
    if (!eo.model) lilac_die("%s: %s", cmd, NO_MODEL);
    char *keys = NULL;
    if (so.api_key) keys = normalize_keys(cmd, "--api-key", so.api_key);
    else if (getenv("LILAC_API_KEY")) keys = normalize_keys(cmd, "LILAC_API_KEY", getenv("LILAC_API_KEY"));
    so.api_key = keys;
    if (so.allowed_hosts && !so.allowed_hosts[0]) lilac_die("%s: --allowed-hosts needs names (or *)", cmd);
    so.ping_s = ping;
    so.max_conns = (int)max_conns;
    so.max_conns_per_client = (int)per_client;
    so.header_timeout_s = (int)header_to;
    so.body_timeout_s = (int)body_to;
    so.max_json_values = (size_t)json_values;
    so.max_tokenize = max_tokenize;
    fit_fd_limit(cmd, &so);
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
    so.log_prompts = log_prompts;

    /* SIGINT/SIGTERM are taken by sigwait below; every thread inherits the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    /* The port first (a busy one fails at once, before a long load), then the
     * model; "listening" is said only once both are good. /health answers 503
     * while the model loads. */
    lilac_err err = {{0}};
    srv *S = srv_start(&so, NULL, &err);
    if (!S) lilac_die("%s", err.msg);
    fprintf(stderr, "lilac %s: loading %s\n", cmd, eo.model);
    loaded L;
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
    print_loaded(cmd, &eo, &L);
    fprintf(stderr, "lilac %s: listening on %s (model \"%s\", queue %ld%s, log level %s)\n", cmd, srv_url(S), so.alias,
            eo.queue > 0 ? eo.queue : 64, so.api_key ? (so.metrics_public ? ", API key required except /metrics" : ", API key required") : "",
            lilac_log_name(lilac_log_threshold));
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "lilac %s: %s received, shutting down\n", cmd, sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv_stop(S);
    unload(&L);
    free(keys);
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

/* One line of input, without its newline: through libedit (line editing, and
 * history with the arrow keys) when stdin is a terminal, else plain reads. */
static ssize_t read_line(bool edit, const char *prompt, char **line, size_t *cap) {
    if (!edit) {
        fputs(prompt, stdout);
        fflush(stdout);
        return getline(line, cap, stdin);
    }
    char *r = readline(prompt);
    if (!r) return -1;
    free(*line);
    *line = r;
    *cap = strlen(r) + 1;
    return (ssize_t)strlen(r);
}

static const char CHAT_HELP[] =
    "commands:\n"
    "  /help      this list\n"
    "  /reset     forget the conversation (the system message stays)\n"
    "  /think     thinking on (the model reasons before it answers)\n"
    "  /nothink   thinking off\n"
    "  /quit      leave (also /exit, or Ctrl-D)\n"
    "input: end a line with \\ to go on on the next, or put a message between two lines of \"\"\";\n"
    "a line starting with / is a command: //text sends \"/text\". Arrow keys edit and recall earlier lines.\n";

/* Read one user message: lines until one not ending in '\', or a """ block. NULL at EOF. */
static char *read_message(bool edit) {
    sbuf b = {0};
    char *line = NULL;
    size_t cap = 0;
    bool block = false;
    for (;;) {
        ssize_t n = read_line(edit, b.n || block ? "... " : "> ", &line, &cap);
        if (n < 0) {
            free(line);
            if (b.n) return b.p;
            sb_free(&b);
            return NULL;
        }
        if (edit && n > 0) add_history(line);
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
    double temp = -1;
    const char *system = NULL;
    bool no_think = false;
    for (int i = 1; i < argc; i++)
        if (!engine_opt(argc, argv, &i, &eo) && !opt_range(argc, argv, &i, "--max-tokens", 1, 1L << 30, &max_tokens) &&
            !opt_real(argc, argv, &i, "--temperature", 0, 100, &temp) && !opt_str(argc, argv, &i, "--system", &system) &&
            !opt_flag(argc, argv, &i, "--no-think", &no_think))
            opt_unknown("chat", argv[i]);
    if (!eo.model) eo.model = getenv("LILAC_MODEL");
    if (!eo.model) lilac_die("chat: %s", NO_MODEL);
    if (max_tokens < 1) lilac_die("chat: --max-tokens must be >= 1");
    eo.parallel = 1;
    loaded L;
    lilac_err err = {{0}};
    if (load_all("chat", &eo, &L, &err) < 0) lilac_die("%s", err.msg);
    print_loaded("chat", &eo, &L);
    lilac_sampling samp = L.defaults;
    if (temp >= 0) samp.temperature = (float)temp;
    bool tty = isatty(1);
    bool think = !no_think;
    json_t *msgs = json_array();
    if (system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
    signal(SIGINT, on_sigint);
    printf("lilac chat: %s (context %lld). /help for the commands; Ctrl-C stops a reply, Ctrl-D ends.\n", eo.model,
           (long long)L.max_seq);
    const bool edit = isatty(0);
    if (edit) {
        rl_readline_name = "lilac";
        using_history();
        stifle_history(1000);
    }
    for (;;) {
        char *msg = read_message(edit);
        if (!msg) break;
        if (msg[0] == '/' && msg[1] == '/') memmove(msg, msg + 1, strlen(msg)); /* "//x": the message "/x" */
        else if (msg[0] == '/' && !strcmp(msg, "/help")) {
            fputs(CHAT_HELP, stdout);
            free(msg);
            continue;
        } else if (msg[0] == '/' && strcmp(msg, "/quit") && strcmp(msg, "/exit") && strcmp(msg, "/reset") &&
                   strcmp(msg, "/think") && strcmp(msg, "/nothink")) {
            size_t w = strcspn(msg, " \t\n");
            printf("unknown command %.*s (not sent to the model); /help lists the commands, //text sends \"/text\"\n",
                   (int)(w > 60 ? 60 : w), msg);
            free(msg);
            continue;
        }
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
