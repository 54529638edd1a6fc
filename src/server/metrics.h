/* metrics.h — the per-request observations behind /metrics that the engine's
 * counters do not hold: end-to-end latency, time to first token, inter-token
 * latency, prompt and completion lengths (histograms) and finished requests by
 * reason, written under vLLM's names (vllm:…) in the Prometheus text format. */
#ifndef LILAC_SERVER_METRICS_H
#define LILAC_SERVER_METRICS_H

#include <stdint.h>

#include "../util/sbuf.h"

typedef struct srv_metrics srv_metrics;

srv_metrics *srv_metrics_new(void);
void srv_metrics_free(srv_metrics *m);

/* One finished generation request. finish: "stop" | "length" | "abort" (a
 * cancelled request); ttft < 0 when no token came; the inter-token gap `itl`
 * is observed n_itl times (a request's mean gap, once per token after the first). */
void srv_metrics_observe(srv_metrics *m, const char *finish, double e2e, double ttft, double itl, int n_itl,
                         int prompt_tokens, int gen_tokens);

/* Append the histograms and vllm:request_success_total, each sample labelled
 * model_name="<name>" (escaped as the format requires). */
void srv_metrics_write(srv_metrics *m, sbuf *b, const char *model_name);

/* A label value escaped for the text format (\\, \", \n). */
void srv_metrics_label(sbuf *b, const char *v);

#endif
