/* metrics.c — see metrics.h. Bucket bounds are vLLM's, so its dashboards'
 * quantile panels read the same. */
#include "metrics.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../util/common.h"

static const double E2E[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                             120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
static const double TTFT[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                              1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double ITL[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                             0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double TOKENS[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
                                100000, 200000, 500000};

#define NB(a) ((int)(sizeof a / sizeof a[0]))

typedef struct {
    const double *le;
    int n;
    uint64_t *count; /* per bucket, not cumulative; [n] is the +Inf overflow */
    uint64_t total;
    double sum;
} hist;

enum { H_E2E, H_TTFT, H_ITL, H_TPOT, H_PROMPT, H_GEN, N_HIST };
static const char *const FINISH[] = {"stop", "length", "abort"};

struct srv_metrics {
    pthread_mutex_t mu;
    hist h[N_HIST];
    uint64_t success[3];
};

static const struct {
    const char *name, *help;
} HNAME[N_HIST] = {
    {"vllm:e2e_request_latency_seconds", "End-to-end request latency: queued to last token."},
    {"vllm:time_to_first_token_seconds", "Time from queueing to the first generated token."},
    {"vllm:inter_token_latency_seconds", "Time between generated tokens (a request's mean gap, per token)."},
    {"vllm:time_per_output_token_seconds", "Time per output token after the first (the older name)."},
    {"vllm:request_prompt_tokens", "Prompt tokens per finished request."},
    {"vllm:request_generation_tokens", "Generated tokens per finished request."},
};

static void hist_init(hist *h, const double *le, int n) {
    h->le = le;
    h->n = n;
    h->count = xcalloc((size_t)n + 1, sizeof(uint64_t));
}

static void hist_add(hist *h, double x, uint64_t times) {
    if (!times) return;
    int b = 0;
    while (b < h->n && !(x <= h->le[b])) b++;
    h->count[b] += times;
    h->total += times;
    h->sum += x * (double)times;
}

srv_metrics *srv_metrics_new(void) {
    srv_metrics *m = xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->h[H_E2E], E2E, NB(E2E));
    hist_init(&m->h[H_TTFT], TTFT, NB(TTFT));
    hist_init(&m->h[H_ITL], ITL, NB(ITL));
    hist_init(&m->h[H_TPOT], ITL, NB(ITL));
    hist_init(&m->h[H_PROMPT], TOKENS, NB(TOKENS));
    hist_init(&m->h[H_GEN], TOKENS, NB(TOKENS));
    return m;
}

void srv_metrics_free(srv_metrics *m) {
    if (!m) return;
    for (int i = 0; i < N_HIST; i++) free(m->h[i].count);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void srv_metrics_observe(srv_metrics *m, const char *finish, double e2e, double ttft, double itl, int n_itl,
                         int prompt_tokens, int gen_tokens) {
    int f = 2;
    for (int i = 0; i < 3; i++)
        if (!strcmp(finish, FINISH[i])) f = i;
    pthread_mutex_lock(&m->mu);
    m->success[f]++;
    hist_add(&m->h[H_E2E], e2e, 1);
    if (ttft >= 0) hist_add(&m->h[H_TTFT], ttft, 1);
    if (n_itl > 0) {
        hist_add(&m->h[H_ITL], itl, (uint64_t)n_itl);
        hist_add(&m->h[H_TPOT], itl, (uint64_t)n_itl);
    }
    hist_add(&m->h[H_PROMPT], prompt_tokens, 1);
    hist_add(&m->h[H_GEN], gen_tokens, 1);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_label(sbuf *b, const char *v) {
    for (; *v; v++) {
        if (*v == '\\') sb_puts(b, "\\\\");
        else if (*v == '"') sb_puts(b, "\\\"");
        else if (*v == '\n') sb_puts(b, "\\n");
        else sb_putc(b, *v);
    }
}

void srv_metrics_write(srv_metrics *m, sbuf *b, const char *model_name) {
    sbuf lab = {0};
    sb_puts(&lab, "model_name=\"");
    srv_metrics_label(&lab, model_name);
    sb_puts(&lab, "\"");
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < N_HIST; i++) {
        const hist *h = &m->h[i];
        const char *name = HNAME[i].name;
        sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, HNAME[i].help, name);
        uint64_t cum = 0;
        for (int k = 0; k <= h->n; k++) {
            cum += h->count[k];
            if (k < h->n) sb_printf(b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, lab.p, h->le[k], (unsigned long long)cum);
            else sb_printf(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, lab.p, (unsigned long long)cum);
        }
        sb_printf(b, "%s_sum{%s} %.6f\n%s_count{%s} %llu\n", name, lab.p, h->sum, name, lab.p,
                  (unsigned long long)h->total);
    }
    sb_puts(b, "# HELP vllm:request_success_total Finished requests by finish reason (abort: cancelled).\n"
               "# TYPE vllm:request_success_total counter\n");
    for (int f = 0; f < 3; f++)
        sb_printf(b, "vllm:request_success_total{%s,finished_reason=\"%s\"} %llu\n", lab.p, FINISH[f],
                  (unsigned long long)m->success[f]);
    pthread_mutex_unlock(&m->mu);
    sb_free(&lab);
}
