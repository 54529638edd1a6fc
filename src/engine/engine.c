/* engine.c — the worker thread, its job queue and sequence slots; see engine.h. */
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const double eng_ttft_bounds[ENG_TTFT_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, INFINITY};

/* ---- jobs ---------------------------------------------------------------- */

eng_job *eng_job_new(void) {
    eng_job *j = xcalloc(1, sizeof *j);
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&j->refs, 1);
    atomic_init(&j->cancel, 0);
    lilac_sampling_default(&j->samp);
    j->cache_prompt = true;
    j->max_tokens = 16;
    sb_put(&j->text, "", 0);
    return j;
}

void eng_job_ref(eng_job *j) { atomic_fetch_add(&j->refs, 1); }

void eng_job_unref(eng_job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    free(j->prompt);
    for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
    free(j->stops);
    free(j->forced);
    sb_free(&j->text);
    free(j->toks);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void eng_job_cancel(eng_job *j) {
    if (j) atomic_store(&j->cancel, 1);
}

void eng_job_wait(eng_job *j, double timeout_s) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_s;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

/* ---- engine --------------------------------------------------------------- */

typedef struct {
    lilac_session *s;
    int32_t *hist; /* ids the session consumed */
    int n_hist;
    eng_job *job;
    int pos;       /* prompt ids consumed so far (prefill) */
    int32_t next;  /* sampled id still to be fed */
    lilac_sampler samp;
    lilac_detok *dt;
    double last_used;
} slot;

struct lilac_engine {
    eng_config cfg;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    eng_job **q; /* ring buffer of queue_max */
    int q_head, q_n;
    slot *slots;
    float *logits;
    bool stop, started;
    lilac_err init_err;
    int init_state; /* 0 pending, 1 ok, -1 failed */
    eng_stats st;
};

static void job_signal(eng_job *j) { pthread_cond_broadcast(&j->cv); }

static bool is_eos(const lilac_engine *e, int32_t t) {
    for (int i = 0; i < e->cfg.n_eos; i++)
        if (e->cfg.eos[i] == t) return true;
    return false;
}

static void finish(lilac_engine *e, slot *sl, const char *reason, const char *errmsg) {
    eng_job *j = sl->job;
    const char *tail = NULL;
    size_t tail_n = 0;
    if (sl->dt && strcmp(reason, "cancelled") && strcmp(reason, "error")) lilac_detok_finish(sl->dt, &tail, &tail_n);
    double now = lilac_now();
    pthread_mutex_lock(&j->mu);
    if (tail_n) sb_put(&j->text, tail, tail_n);
    snprintf(j->finish, sizeof j->finish, "%s", reason);
    if (errmsg) snprintf(j->error, sizeof j->error, "%s", errmsg);
    j->state = JOB_DONE;
    j->t_end = now;
    if (!j->t_first) j->t_first = now;
    job_signal(j);
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&e->mu);
    if (!strcmp(reason, "cancelled")) e->st.requests_cancelled++;
    else if (!strcmp(reason, "error")) e->st.requests_error++;
    else e->st.requests_done++;
    e->st.running--;
    pthread_mutex_unlock(&e->mu);
    lilac_detok_free(sl->dt);
    sl->dt = NULL;
    sl->job = NULL;
    sl->last_used = now;
    eng_job_unref(j);
}

static void hist_push(lilac_engine *e, slot *sl, const int32_t *ids, int n) {
    (void)e;
    memcpy(sl->hist + sl->n_hist, ids, sizeof(int32_t) * (size_t)n);
    sl->n_hist += n;
}

static void start_job(lilac_engine *e, slot *sl, eng_job *j) {
    int keep = 0;
    if (j->cache_prompt && sl->n_hist < j->n_prompt &&
        !memcmp(sl->hist, j->prompt, sizeof(int32_t) * (size_t)sl->n_hist))
        keep = sl->n_hist;
    if (keep != sl->n_hist || sl->n_hist == 0) {
        e->cfg.be->session_reset(sl->s);
        sl->n_hist = 0;
        keep = 0;
    }
    sl->job = j;
    sl->pos = keep;
    sl->next = -1;
    lilac_sampler_begin(&sl->samp, &j->samp, j->prompt, j->n_prompt);
    sl->dt = lilac_detok_new(e->cfg.tok, (const char *const *)j->stops, (size_t)j->n_stops, true);
    pthread_mutex_lock(&j->mu);
    j->n_cached = keep;
    j->state = JOB_PREFILL;
    j->t_start = lilac_now();
    job_signal(j);
    pthread_mutex_unlock(&j->mu);
}

/* The slot to take job j: the idle one whose history is the longest prefix of
 * the prompt, else the least recently used idle one. -1 if none is idle. */
static int pick_slot(lilac_engine *e, const eng_job *j) {
    int best = -1, best_len = -2;
    for (int i = 0; i < e->cfg.n_slots; i++) {
        slot *sl = &e->slots[i];
        if (sl->job) continue;
        int len = -1;
        if (j->cache_prompt && sl->n_hist > 0 && sl->n_hist < j->n_prompt &&
            !memcmp(sl->hist, j->prompt, sizeof(int32_t) * (size_t)sl->n_hist))
            len = sl->n_hist;
        if (len > best_len || (len == best_len && best >= 0 && sl->last_used < e->slots[best].last_used)) {
            best = i;
            best_len = len;
        }
    }
    return best;
}

/* A token was chosen from e->logits: record it and decide whether to go on. */
static void emit(lilac_engine *e, slot *sl, int32_t tok) {
    eng_job *j = sl->job;
    eng_tok ti = {.id = tok, .lp = 0, .n_top = 0};
    if (j->logprobs) {
        ti.n_top = j->top_logprobs > ENG_MAX_TOP ? ENG_MAX_TOP : j->top_logprobs;
        lilac_logprobs(e->logits, e->cfg.model->cfg.vocab, tok, ti.n_top, &ti.lp, ti.top_id, ti.top_lp);
    }
    lilac_sampler_accept(&sl->samp, tok);
    double now = lilac_now();
    pthread_mutex_lock(&e->mu);
    e->st.gen_tokens++;
    pthread_mutex_unlock(&e->mu);
    if (is_eos(e, tok) && !j->ignore_eos) {
        pthread_mutex_lock(&j->mu);
        j->n_gen++;
        if (!j->t_first) j->t_first = now;
        pthread_mutex_unlock(&j->mu);
        finish(e, sl, "stop", NULL);
        return;
    }
    const char *out = NULL;
    size_t out_n = 0;
    int stop = lilac_detok_push(sl->dt, tok, &out, &out_n, NULL);
    pthread_mutex_lock(&j->mu);
    j->n_gen++;
    if (!j->t_first) j->t_first = now;
    if (out_n) sb_put(&j->text, out, out_n);
    if (j->n_toks == j->cap_toks) j->toks = xrealloc(j->toks, sizeof(eng_tok) * (size_t)(j->cap_toks = j->cap_toks ? 2 * j->cap_toks : 64));
    j->toks[j->n_toks++] = ti;
    j->state = JOB_DECODE;
    job_signal(j);
    int n_gen = j->n_gen;
    pthread_mutex_unlock(&j->mu);
    if (stop) finish(e, sl, "stop", NULL);
    else if (j->forced && n_gen >= j->n_forced) finish(e, sl, "stop", NULL);
    else if (n_gen >= j->max_tokens || sl->n_hist + 1 >= e->cfg.max_seq) finish(e, sl, "length", NULL);
    else sl->next = tok;
}

static void fail_slot(lilac_engine *e, slot *sl, const char *msg) {
    e->cfg.be->session_reset(sl->s);
    sl->n_hist = 0;
    finish(e, sl, "error", msg);
}

/* One step of a slot: a prefill chunk or one decoded token. */
static void step(lilac_engine *e, slot *sl) {
    eng_job *j = sl->job;
    if (atomic_load(&j->cancel)) {
        finish(e, sl, "cancelled", NULL);
        return;
    }
    lilac_err err = {{0}};
    const lilac_backend *be = e->cfg.be;
    if (sl->next < 0) { /* prefill */
        int n = j->n_prompt - sl->pos;
        if (n > e->cfg.prefill_chunk) n = e->cfg.prefill_chunk;
        bool last = sl->pos + n == j->n_prompt;
        double t0 = lilac_now();
        if (be->forward(sl->s, j->prompt + sl->pos, n, last ? LOGITS_LAST : LOGITS_NONE, e->logits, &err) < 0) {
            fail_slot(e, sl, err.msg);
            return;
        }
        double dt = lilac_now() - t0;
        hist_push(e, sl, j->prompt + sl->pos, n);
        sl->pos += n;
        pthread_mutex_lock(&e->mu);
        e->st.prompt_tokens += (uint64_t)n;
        e->st.prompt_seconds += dt;
        pthread_mutex_unlock(&e->mu);
        if (!last) return;
        int32_t tok;
        if (j->forced) tok = j->n_forced > 0 ? j->forced[0] : -1;
        else tok = lilac_sample(&sl->samp, &j->samp, e->logits);
        if (tok < 0) {
            finish(e, sl, "stop", NULL);
            return;
        }
        pthread_mutex_lock(&e->mu);
        double ttft = lilac_now() - j->t_submit;
        for (int b = 0; b < ENG_TTFT_BUCKETS; b++)
            if (ttft <= eng_ttft_bounds[b]) e->st.ttft_count[b]++;
        e->st.ttft_sum += ttft;
        e->st.cached_tokens += (uint64_t)j->n_cached;
        pthread_mutex_unlock(&e->mu);
        emit(e, sl, tok);
        return;
    }
    double t0 = lilac_now();
    int32_t in = sl->next;
    if (be->forward(sl->s, &in, 1, LOGITS_LAST, e->logits, &err) < 0) {
        fail_slot(e, sl, err.msg);
        return;
    }
    hist_push(e, sl, &in, 1);
    pthread_mutex_lock(&e->mu);
    e->st.decode_seconds += lilac_now() - t0;
    e->st.decode_steps++;
    pthread_mutex_unlock(&e->mu);
    int32_t tok;
    int n_gen = j->n_gen; /* only the worker writes it */
    if (j->forced) tok = j->forced[n_gen];
    else tok = lilac_sample(&sl->samp, &j->samp, e->logits);
    emit(e, sl, tok);
}

static void *worker(void *arg) {
    lilac_engine *e = arg;
    const eng_config *c = &e->cfg;
    for (int i = 0; i < c->n_slots; i++) {
        slot *sl = &e->slots[i];
        sl->s = c->be->session_new(c->model, c->max_seq, c->threads, &e->init_err);
        if (!sl->s) {
            pthread_mutex_lock(&e->mu);
            e->init_state = -1;
            pthread_cond_broadcast(&e->cv);
            pthread_mutex_unlock(&e->mu);
            return NULL;
        }
        sl->hist = xmalloc(sizeof(int32_t) * (size_t)(c->max_seq + 1));
        lilac_sampler_init(&sl->samp, c->model->cfg.vocab);
    }
    pthread_mutex_lock(&e->mu);
    e->init_state = 1;
    pthread_cond_broadcast(&e->cv);
    for (;;) {
        bool active = false;
        for (int i = 0; i < c->n_slots; i++) active |= e->slots[i].job != NULL;
        if (e->stop) break;
        if (!active && !e->q_n) {
            pthread_cond_wait(&e->cv, &e->mu);
            continue;
        }
        while (e->q_n) {
            eng_job *j = e->q[e->q_head];
            int s = pick_slot(e, j);
            if (s < 0) break;
            e->q_head = (e->q_head + 1) % c->queue_max;
            e->q_n--;
            e->st.queued = e->q_n;
            e->st.running++;
            pthread_mutex_unlock(&e->mu);
            start_job(e, &e->slots[s], j);
            pthread_mutex_lock(&e->mu);
        }
        pthread_mutex_unlock(&e->mu);
        for (int i = 0; i < c->n_slots; i++)
            if (e->slots[i].job) step(e, &e->slots[i]);
        pthread_mutex_lock(&e->mu);
    }
    /* shutting down: cancel what is left */
    while (e->q_n) {
        eng_job *j = e->q[e->q_head];
        e->q_head = (e->q_head + 1) % c->queue_max;
        e->q_n--;
        pthread_mutex_lock(&j->mu);
        snprintf(j->finish, sizeof j->finish, "cancelled");
        snprintf(j->error, sizeof j->error, "the server is shutting down");
        j->state = JOB_DONE;
        job_signal(j);
        pthread_mutex_unlock(&j->mu);
        eng_job_unref(j);
    }
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < c->n_slots; i++)
        if (e->slots[i].job) {
            eng_job_cancel(e->slots[i].job);
            finish(e, &e->slots[i], "cancelled", "the server is shutting down");
        }
    return NULL;
}

lilac_engine *eng_new(const eng_config *cfg, lilac_err *err) {
    if (cfg->n_slots < 1 || cfg->queue_max < 1 || cfg->max_seq < 2 || cfg->prefill_chunk < 1) {
        lilac_fail(err, "engine: bad configuration (slots %d, queue %d, max_seq %lld)", cfg->n_slots, cfg->queue_max,
                   (long long)cfg->max_seq);
        return NULL;
    }
    lilac_engine *e = xcalloc(1, sizeof *e);
    e->cfg = *cfg;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->q = xcalloc((size_t)cfg->queue_max, sizeof(eng_job *));
    e->slots = xcalloc((size_t)cfg->n_slots, sizeof(slot));
    e->logits = xcalloc((size_t)cfg->model->cfg.vocab, sizeof(float));
    e->st.n_slots = cfg->n_slots;
    if (pthread_create(&e->th, NULL, worker, e)) {
        lilac_fail(err, "engine: cannot start the worker thread");
        free(e->q);
        free(e->slots);
        free(e->logits);
        free(e);
        return NULL;
    }
    e->started = true;
    pthread_mutex_lock(&e->mu);
    while (e->init_state == 0) pthread_cond_wait(&e->cv, &e->mu);
    int ok = e->init_state;
    pthread_mutex_unlock(&e->mu);
    if (ok < 0) {
        if (err) *err = e->init_err;
        pthread_join(e->th, NULL);
        e->started = false;
        eng_free(e);
        return NULL;
    }
    return e;
}

void eng_shutdown(lilac_engine *e) {
    if (!e || !e->started) return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    for (int i = 0; i < e->cfg.n_slots; i++)
        if (e->slots[i].job) eng_job_cancel(e->slots[i].job);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL);
    e->started = false;
}

void eng_free(lilac_engine *e) {
    if (!e) return;
    eng_shutdown(e);
    for (int i = 0; i < e->cfg.n_slots; i++) {
        slot *sl = &e->slots[i];
        if (sl->s) e->cfg.be->session_free(sl->s);
        free(sl->hist);
        if (sl->samp.vocab) lilac_sampler_free(&sl->samp);
        lilac_detok_free(sl->dt);
    }
    free(e->slots);
    free(e->q);
    free(e->logits);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

int eng_submit(lilac_engine *e, eng_job *j) {
    pthread_mutex_lock(&e->mu);
    if (e->stop || e->q_n >= e->cfg.queue_max) {
        pthread_mutex_unlock(&e->mu);
        return -1;
    }
    eng_job_ref(j);
    j->t_submit = lilac_now();
    j->state = JOB_QUEUED;
    e->q[(e->q_head + e->q_n) % e->cfg.queue_max] = j;
    e->q_n++;
    e->st.queued = e->q_n;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void eng_get_stats(lilac_engine *e, eng_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    pthread_mutex_unlock(&e->mu);
}
