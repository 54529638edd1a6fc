/* bench.c — `lilac bench`: prefill and decode throughput, Lily's method
 * (spec/lily.md §5): synthetic prompt ids ((i*2654435761) mod 2^32) mod vocab,
 * an exact-shape warm-up, a fresh state per run, one prefill then N greedy
 * decode steps, the median over rounds, the round-to-round spread, an FNV-1a
 * digest of the generated ids, peak device memory, and each figure as a
 * fraction of the roofline (bytes and FLOPs per token from the model, over the
 * bandwidth measured in the same run). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend/backend.h"
#include "../util/diag.h"
#include "bench.h"

typedef struct {
    int n, cap;
    int32_t *ids;
    double t_last;
} collect;

static bool collect_tok(void *ud, int32_t tok) {
    collect *c = ud;
    if (c->n < c->cap) c->ids[c->n++] = tok;
    c->t_last = lilac_now();
    return true;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
static double spread(const double *v, int n) {
    double lo = v[0], hi = v[0], s = 0;
    for (int i = 0; i < n; i++) { lo = v[i] < lo ? v[i] : lo; hi = v[i] > hi ? v[i] : hi; s += v[i]; }
    return n ? (hi - lo) / (s / n) : 0;
}

static uint64_t fnv1a(const int32_t *ids, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) {
            h ^= (uint64_t)(((uint32_t)ids[i] >> (8 * b)) & 0xff);
            h *= 0x100000001b3ull;
        }
    return h;
}

/* Bytes one decode step must read at context `ctx`: every non-expert matrix,
 * top_k experts per layer, one embedding row, the KV cache (kvb bytes an element: the
 * backend's kv_bytes), the GDN state (read + write). FLOPs per prefill
 * token: 2 per active weight + attention. */
static void per_token_cost(const lilac_model *m, int64_t ctx, double kvb, double *bytes, double *flops) {
    const lilac_config *c = &m->cfg;
    double b = lilac_mat_bytes(&m->lm_head) + (double)lilac_mat_bytes(&m->embed) / (double)c->vocab, f = 2.0 * (double)c->vocab * c->hidden;
    for (int l = 0; l < c->n_layers; l++) {
        const lilac_layer *y = &m->layers[l];
        const lilac_matrix *mats[] = {&y->in_qkv, &y->in_z, &y->in_b, &y->in_a, &y->out_proj, &y->q_proj, &y->k_proj,
                                      &y->v_proj, &y->o_proj, &y->router, &y->sh_gate, &y->sh_up, &y->sh_down,
                                      &y->sh_expert_gate};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if (mats[i]->rows) {
                b += (double)lilac_mat_bytes(mats[i]);
                f += 2.0 * (double)mats[i]->rows * (double)mats[i]->cols;
            }
        const double ex = (double)(lilac_mat_bytes(&y->exp_gate) + lilac_mat_bytes(&y->exp_up) + lilac_mat_bytes(&y->exp_down)) / c->n_experts;
        b += ex * c->top_k;
        f += 2.0 * c->top_k * 3.0 * (double)c->moe_inter * (double)c->hidden;
        if (y->is_full) {
            b += 2.0 * kvb * (double)ctx * c->n_kv_heads * c->head_dim;
            f += 4.0 * (double)ctx / 2 * c->n_heads * c->head_dim; /* average causal length ctx/2 */
        } else {
            b += 2.0 * 4.0 * (double)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
        }
    }
    *bytes = b;
    *flops = f;
}

double lilac_cpu_read_bandwidth(void);
#ifdef LILAC_CUDA
double lilac_cuda_copy_bandwidth(void);
double lilac_cuda_mem_used(void);
#endif

int lilac_bench(const lilac_bench_opts *o) {
    const char *const model = o->model, *backend = o->backend, *lens_s = o->prompt_lens, *json = o->json;
    const long steps = o->decode_steps, rounds = o->rounds, threads = o->threads;
    if (steps < 1 || rounds < 1) lilac_die("--decode-steps and --rounds must be >= 1");
    if (threads > 0) omp_set_num_threads((int)threads);
    lilac_err err = {{0}};
    int32_t *lens;
    int n_lens = lilac_parse_ids(lens_s, &lens, &err);
    if (n_lens < 0) lilac_die("--prompt-lens: %s", err.msg);
    int64_t max_len = 0;
    for (int i = 0; i < n_lens; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    const lilac_backend *be = lilac_backend_get(backend, &err);
    if (!be) lilac_die("%s", err.msg);
    lilac_model m;
    if (lilac_model_load(&m, model, &err) < 0) lilac_die("%s", err.msg);
    const int64_t V = m.cfg.vocab;
    /* LILAC_BENCH_TWO (a diagnostic, util/diag.h): after each length's rounds, time forward() of one token
     * and of two (what checking two drafted tokens costs through forward()'s many-token path); 51 more positions */
    const bool two_tok = lilac_diag()->bench_two;
    lilac_session *s = be->session_new(&m, max_len + steps + 2 + (two_tok ? 64 : 0), (int)threads, &err);
    if (!s) lilac_die("%s", err.msg);

    /* bw: copy bandwidth (read + write); the CPU's read bandwidth counts twice, so bw / 2 is the read ceiling */
    double bw = !strcmp(be->name, "cpu") ? 2.0 * lilac_cpu_read_bandwidth() : 0;
#ifdef LILAC_CUDA
    if (!strcmp(be->name, "cuda")) bw = lilac_cuda_copy_bandwidth();
#endif
    FILE *js = NULL;
    if (json && !(js = fopen(json, "w"))) lilac_die("--json %s: cannot write", json);
    if (js) fprintf(js, "{\"schema_version\": 1, \"backend\": \"%s\", \"model\": \"%s\", \"decode_steps\": %ld, \"rounds\": %ld, "
                        "\"copy_bandwidth_gbs\": %.1f, \"results\": [", be->name, model, steps, rounds, bw / 1e9);
    printf("backend %s, %ld rounds, %ld decode steps%s\n", be->name, rounds, steps, bw > 0 ? "" : " (no bandwidth ceiling measured)");
    if (bw > 0 && !strcmp(be->name, "cpu")) printf("CPU read bandwidth measured (the session's threads): %.1f GB/s\n", bw / 2e9);
    else if (bw > 0) printf("device copy bandwidth (read+write) measured: %.0f GB/s\n", bw / 1e9);
    printf("%8s %11s %7s %9s %11s %7s %9s %9s %18s\n", "context", "prefill/s", "spread", "TTFT ms", "decode/s", "spread",
           "dec %bw", "pre TF/s", "digest");
    fflush(stdout);
    /* On a terminal, a progress line on stderr while a context length is measured (rows come only at its end). */
    const bool tty = isatty(STDERR_FILENO);

    float *logits = xmalloc(sizeof(float) * (size_t)V);
    collect col = {.cap = (int)steps, .ids = xmalloc(sizeof(int32_t) * (size_t)steps)};
    double *pre = xmalloc(sizeof(double) * (size_t)rounds), *dec = xmalloc(sizeof(double) * (size_t)rounds);
    for (int li = 0; li < n_lens; li++) {
        const int L = lens[li];
        int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)L);
        for (int i = 0; i < L; i++) ids[i] = (int32_t)(((uint64_t)((uint32_t)((uint64_t)i * 2654435761u))) % (uint64_t)V);
        uint64_t digest = 0;
        bool digest_stable = true;
        for (int r = -1; r < rounds; r++) { /* r = -1: the exact-shape warm-up */
            if (tty && r < 0) fprintf(stderr, "\rbench: context %d (%d of %d), warm-up\033[K", L, li + 1, n_lens);
            else if (tty) fprintf(stderr, "\rbench: context %d (%d of %d), round %d of %ld\033[K", L, li + 1, n_lens, r + 1, rounds);
            be->session_reset(s);
            double t0 = lilac_now();
            if (be->forward(s, ids, L, LOGITS_LAST, logits, &err) < 0) lilac_die("%s", err.msg);
            int32_t first = 0;
            for (int64_t i = 1; i < V; i++) if (logits[i] > logits[first]) first = (int32_t)i;
            double t1 = lilac_now();
            if (r < 0 && lilac_diag()->profile) { /* one un-graphed decode step, for the phase profile */
                if (be->forward(s, &first, 1, LOGITS_LAST, logits, &err) < 0) lilac_die("%s", err.msg);
                continue;
            }
            col.n = 0;
            int n = be->decode_greedy(s, first, r < 0 ? 2 : (int)steps, collect_tok, &col, &err);
            if (n < 0) lilac_die("%s", err.msg);
            if (r < 0) continue;
            pre[r] = L / (t1 - t0);
            dec[r] = (n > 1 ? n : 1) / (col.t_last - t1);
            uint64_t d = fnv1a(col.ids, col.n);
            if (r > 0 && d != digest) digest_stable = false;
            digest = d;
        }
        if (tty) fputs("\r\033[K", stderr);
        if (two_tok) {
            float *two = xmalloc(sizeof(float) * (size_t)V * 2);
            int32_t pair[2] = {1, 2};
            double tt[2];
            for (int k = 0; k < 2; k++) {
                if (be->forward(s, pair, k + 1, LOGITS_ALL, two, &err) < 0) lilac_die("%s", err.msg); /* warm-up */
                const double a = lilac_now();
                for (int i = 0; i < 16; i++)
                    if (be->forward(s, pair, k + 1, LOGITS_ALL, two, &err) < 0) lilac_die("%s", err.msg);
                tt[k] = (lilac_now() - a) / 16;
            }
            printf("%8d forward() of one token %.3f ms, of two %.3f ms (LOGITS_ALL)\n", L, 1e3 * tt[0], 1e3 * tt[1]);
            free(two);
        }
        double sp_pre = spread(pre, (int)rounds), sp_dec = spread(dec, (int)rounds);
        double mp = median(pre, (int)rounds), md = median(dec, (int)rounds);
        double bytes, flops;
        per_token_cost(&m, L, (double)be->kv_bytes, &bytes, &flops);
        double frac_bw = bw > 0 ? md * bytes / (bw / 2.0) : 0; /* copy counts read+write: one-way = bw/2 */
        /* time to first token: the prompt's forward, its last logits on the host and their argmax (what a
         * client waits for before the first token, less tokenizing and HTTP) */
        const double ttft_ms = 1e3 * L / mp;
        printf("%8d %11.1f %6.1f%% %9.2f %11.2f %6.1f%% %8.1f%% %9.1f %016llx%s\n", L, mp, 100 * sp_pre, ttft_ms, md,
               100 * sp_dec, 100 * frac_bw, mp * flops / 1e12, (unsigned long long)digest, digest_stable ? "" : " (UNSTABLE)");
        fflush(stdout);
        if (js)
            fprintf(js, "%s{\"prompt_len\": %d, \"prefill_tok_s\": %.2f, \"prefill_spread\": %.4f, \"ttft_ms\": %.3f, "
                        "\"decode_tok_s\": %.3f, "
                        "\"decode_spread\": %.4f, \"decode_bytes_per_token\": %.0f, \"decode_bw_fraction\": %.4f, "
                        "\"prefill_flops_per_token\": %.0f, \"prefill_tflops\": %.2f, \"token_digest\": \"%016llx\", "
                        "\"digest_stable\": %s}",
                    li ? ", " : "", L, mp, sp_pre, ttft_ms, md, sp_dec, bytes, frac_bw, flops, mp * flops / 1e12,
                    (unsigned long long)digest, digest_stable ? "true" : "false");
        free(ids);
    }
    double mem = 0;
#ifdef LILAC_CUDA
    if (!strcmp(be->name, "cuda")) mem = lilac_cuda_mem_used();
#endif
    if (mem > 0) printf("device memory in use at the end: %.2f GB\n", mem / 1e9);
    if (js) {
        fprintf(js, "], \"device_memory_bytes\": %.0f}\n", mem);
        fclose(js);
    }
    free(logits); free(col.ids); free(pre); free(dec); free(lens);
    be->session_free(s);
    lilac_model_free(&m);
    return 0;
}
