/* engine.h — the single engine worker that owns every model session.
 *
 * Connection threads build an eng_job (prompt ids, limits, sampling), submit it
 * to a bounded FIFO queue and then read its output as it grows. One worker
 * thread takes jobs into `n_slots` sequence slots (each a backend session with
 * its token history) and advances every active slot by one step per round:
 * one prefill chunk or one decoded token (all decoding slots together, see
 * below), so sequences interleave fairly and a cancelled job stops within one
 * step. The worker never touches a socket: it
 * only appends to the job (text, per-token info) under the job's mutex and
 * broadcasts its condition variable.
 *
 * Batching: each round every slot that is decoding contributes its next token
 * to ONE backend forward_batch call (the CPU backend reads each weight once for
 * all rows); slots still in prefill advance by one prefill chunk each, as
 * before. Sampling stays per slot (its own penalties and seeded generator): in
 * the backend when it has a sampler (sample_begin / forward_sample /
 * forward_batch_sample: only token ids leave the device), else, and for jobs
 * that need the logits themselves (logprobs) or force their tokens, on the host
 * with lilac_sample; one round may then make one call of each kind.
 *
 * Prefix reuse: a slot keeps the ids its session has consumed (its
 * conversation state) and snapshots of the recurrent state (GDN state + conv
 * window + position, backend snapshot()) taken every `snapshot_every` prompt
 * tokens (prefill chunks are cut so that boundaries fall on them), before the
 * prompt's last `turn_start` token, at the end of the prompt, and at the end of
 * each turn (after the last token handed out has been consumed). A new job takes the idle slot with the longest reusable
 * prefix: the common prefix of the prompt and the slot's history, kept whole
 * when the prompt extends the history, else rounded down to the nearest
 * snapshot at or below it (restore() rewinds the session; KV entries above are
 * truncated implicitly). Only the rest is prefilled; `n_cached` says how many
 * prompt tokens were actually skipped. A snapshot only fits the session it was
 * taken from and only while the history below it is unchanged, so rewinding
 * frees the slot's snapshots above the resume point. All snapshots together
 * stay within `cache_bytes`; beyond it the least recently used (taken or
 * restored) are evicted. */
#ifndef LILAC_ENGINE_H
#define LILAC_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "../model/sampler.h"
#include "../tokenizer/tokenizer.h"
#include "../util/sbuf.h"

#define ENG_MAX_TOP 20

typedef struct {
    int32_t id;
    float lp;
    int n_top;
    int32_t top_id[ENG_MAX_TOP];
    float top_lp[ENG_MAX_TOP];
} eng_tok;

typedef enum { JOB_QUEUED, JOB_PREFILL, JOB_DECODE, JOB_DONE } eng_state;

typedef struct eng_job {
    /* ---- input: set before eng_submit, read-only afterwards ---- */
    int32_t *prompt;
    int n_prompt;
    int max_tokens;         /* > 0 */
    lilac_sampling samp;
    char **stops;           /* stop strings (cut from the text, never emitted) */
    int n_stops;
    bool logprobs;          /* record eng_tok.lp */
    int top_logprobs;       /* 0..20 */
    bool ignore_eos;
    bool cache_prompt;      /* allow prefix reuse (default true) */
    int32_t *forced;        /* test hook: emit these ids instead of sampling */
    int n_forced;
    /* ---- output: under mu ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* broadcast on every change (CLOCK_MONOTONIC) */
    sbuf text;              /* final text so far (UTF-8 complete, stops cut) */
    eng_tok *toks;          /* generated tokens (EOS not included) */
    int n_toks, cap_toks;
    int n_gen;              /* completion tokens, EOS included */
    eng_state state;
    char finish[16];        /* "stop" | "length" | "cancelled" | "error" */
    char error[256];
    int n_cached;           /* prompt tokens reused from the slot's history */
    double t_submit, t_start, t_first, t_end;
    atomic_int cancel;
    atomic_int refs;
} eng_job;

/* A job with one reference (the caller's); fill the input fields. */
eng_job *eng_job_new(void);
void eng_job_ref(eng_job *j);
void eng_job_unref(eng_job *j); /* frees the inputs too (prompt, stops, forced: malloc'd) */
void eng_job_cancel(eng_job *j);
/* Wait until the job changed or `timeout_s` passed; call with j->mu held. */
void eng_job_wait(eng_job *j, double timeout_s);

typedef struct {
    const lilac_backend *be;
    const lilac_model *model;
    const lilac_tokenizer *tok;
    int64_t max_seq;     /* per slot */
    int threads;
    bool attn_bf16;      /* --attn-precision bf16: every slot's session (backend's set_attn_bf16) */
    int n_slots;         /* --parallel */
    int queue_max;       /* waiting jobs beyond which eng_submit refuses */
    int prefill_chunk;   /* tokens per prefill step (cancellation granularity) */
    int snapshot_every;  /* snapshot boundary in prompt tokens (0: only prompt end and turn end) */
    int64_t cache_bytes; /* bound on all snapshots together (0: no snapshots) */
    int32_t turn_start;  /* <|im_start|> (-1: none): also snapshot just before its last occurrence in a
                          * prompt, where the generation prompt begins; a re-rendered history that
                          * drops the previous turn's reasoning diverges right after it */
    const int32_t *eos;  /* end-of-sequence ids */
    int n_eos;
} eng_config;

typedef struct lilac_engine lilac_engine;

/* Starts the worker (which creates the sessions). NULL + err on failure. */
lilac_engine *eng_new(const eng_config *cfg, lilac_err *err);
/* Cancels queued and running jobs and joins the worker; afterwards
 * eng_submit refuses and the struct stays valid until eng_free. */
void eng_shutdown(lilac_engine *e);
/* eng_shutdown, then frees the sessions. */
void eng_free(lilac_engine *e);
/* Queue a job (takes a reference). -1 when the queue is full or the engine is
 * shutting down. */
int eng_submit(lilac_engine *e, eng_job *j);

#define ENG_TTFT_BUCKETS 10
extern const double eng_ttft_bounds[ENG_TTFT_BUCKETS]; /* the last is +Inf */

typedef struct {
    uint64_t requests_done, requests_cancelled, requests_error;
    uint64_t prompt_tokens, cached_tokens, gen_tokens;
    uint64_t decode_steps;   /* tokens decoded (rows of batched steps) */
    uint64_t batch_steps;    /* forward_batch calls */
    uint64_t cache_snapshots_taken, cache_evictions, cache_restores;
    int64_t cache_bytes, cache_peak_bytes, cache_limit_bytes; /* snapshot memory now / highest / bound */
    int cache_entries;       /* snapshots held */
    double prompt_seconds, decode_seconds;
    int queued, running, n_slots;
    uint64_t ttft_count[ENG_TTFT_BUCKETS];
    double ttft_sum;
} eng_stats;

void eng_get_stats(lilac_engine *e, eng_stats *out);

#endif
