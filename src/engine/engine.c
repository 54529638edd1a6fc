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
    lilac_snapshot *snap;
    int64_t pos;
    size_t bytes;
    double used; /* taken or last restored */
} snapent;

typedef struct {
    lilac_session *s;
    int32_t *hist; /* ids the session consumed */
    int n_hist;
    snapent *snaps; /* ascending pos, all <= n_hist and taken along hist */
    int n_snaps, cap_snaps;
    eng_job *job;
    int pos;       /* prompt ids consumed so far (prefill) */
    int mark[2];   /* prompt positions to snapshot at: before the last turn start; the end of the
                    * previous turn when its last token was still pending (0: none) */
    int32_t next;  /* sampled id still to be fed */
    int32_t tail;  /* idle: the last id handed out, to be consumed (then a turn-end snapshot), or -1 */
    bool dev;      /* the job's tokens are sampled in the backend (its sampler state is in the session) */
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
    float *logits;  /* [n_slots, vocab] */
    lilac_session **bss; /* batch scratch: rows sampled here (bss, bids), rows sampled in the backend */
    int32_t *bids;
    lilac_session **dss;
    int32_t *dids, *dtok;
    int *bslot, *brow;   /* per row: its slot, its index among bss or dss */
    size_t snap_size; /* bytes of one snapshot (0 until the first) */
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

/* ---- snapshots -------------------------------------------------------------- */

static void snap_drop(lilac_engine *e, slot *sl, int k) {
    snapent *x = &sl->snaps[k];
    e->cfg.be->snapshot_free(x->snap);
    pthread_mutex_lock(&e->mu);
    e->st.cache_bytes -= (int64_t)x->bytes;
    e->st.cache_entries--;
    pthread_mutex_unlock(&e->mu);
    memmove(x, x + 1, sizeof(snapent) * (size_t)(sl->n_snaps - k - 1));
    sl->n_snaps--;
}

/* Free the slot's snapshots above `pos` (all of them for pos < 0). */
static void snaps_truncate(lilac_engine *e, slot *sl, int64_t pos) {
    while (sl->n_snaps && sl->snaps[sl->n_snaps - 1].pos > pos) snap_drop(e, sl, sl->n_snaps - 1);
}

/* Evict the least recently used snapshot of any slot; false if there is none. */
static bool evict_lru(lilac_engine *e) {
    slot *bs = NULL;
    int bk = -1;
    for (int i = 0; i < e->cfg.n_slots; i++) {
        slot *sl = &e->slots[i];
        for (int k = 0; k < sl->n_snaps; k++)
            if (!bs || sl->snaps[k].used < bs->snaps[bk].used) bs = sl, bk = k;
    }
    if (!bs) return false;
    snap_drop(e, bs, bk);
    pthread_mutex_lock(&e->mu);
    e->st.cache_evictions++;
    pthread_mutex_unlock(&e->mu);
    return true;
}

/* Snapshot the slot's session at its current position (n_hist), within the
 * memory bound: older snapshots are evicted first so the total never exceeds it. */
static void take_snapshot(lilac_engine *e, slot *sl) {
    const int64_t cap = e->cfg.cache_bytes;
    if (cap <= 0 || sl->n_hist == 0) return;
    if (sl->n_snaps && sl->snaps[sl->n_snaps - 1].pos == sl->n_hist) {
        sl->snaps[sl->n_snaps - 1].used = lilac_now();
        return;
    }
    if (e->snap_size) {
        if ((int64_t)e->snap_size > cap) return;
        while (e->st.cache_bytes + (int64_t)e->snap_size > cap && evict_lru(e)) {
        }
    }
    lilac_err err = {{0}};
    lilac_snapshot *snap = e->cfg.be->snapshot(sl->s, &err);
    if (!snap) return; /* out of memory: go on without */
    size_t bytes = e->cfg.be->snapshot_bytes(snap);
    e->snap_size = bytes;
    while (e->st.cache_bytes + (int64_t)bytes > cap && evict_lru(e)) {
    }
    if (e->st.cache_bytes + (int64_t)bytes > cap) { /* the first one, larger than the bound */
        e->cfg.be->snapshot_free(snap);
        return;
    }
    if (sl->n_snaps == sl->cap_snaps)
        sl->snaps = xrealloc(sl->snaps, sizeof(snapent) * (size_t)(sl->cap_snaps = sl->cap_snaps ? 2 * sl->cap_snaps : 8));
    sl->snaps[sl->n_snaps++] = (snapent){.snap = snap, .pos = e->cfg.be->snapshot_pos(snap), .bytes = bytes, .used = lilac_now()};
    pthread_mutex_lock(&e->mu);
    e->st.cache_bytes += (int64_t)bytes;
    if (e->st.cache_bytes > e->st.cache_peak_bytes) e->st.cache_peak_bytes = e->st.cache_bytes;
    e->st.cache_entries++;
    e->st.cache_snapshots_taken++;
    pthread_mutex_unlock(&e->mu);
}

static void slot_reset(lilac_engine *e, slot *sl) {
    e->cfg.be->session_reset(sl->s);
    snaps_truncate(e, sl, -1);
    sl->n_hist = 0;
    sl->tail = -1;
}

/* ---- jobs in slots ------------------------------------------------------------- */

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
    sl->next = -1;
    sl->last_used = now;
    eng_job_unref(j);
}

/* A turn ended normally after handing out `tok`: the session still has to
 * consume it (next round, in the batch) before the turn-end snapshot. */
static void finish_turn(lilac_engine *e, slot *sl, int32_t tok, const char *reason) {
    finish(e, sl, reason, NULL);
    if (tok >= 0 && e->cfg.cache_bytes > 0 && sl->n_hist + 1 <= e->cfg.max_seq) sl->tail = tok;
}

static void hist_push(slot *sl, const int32_t *ids, int n) {
    memcpy(sl->hist + sl->n_hist, ids, sizeof(int32_t) * (size_t)n);
    sl->n_hist += n;
}

/* How many prompt tokens slot `sl` can skip for job j; *snap_k: the snapshot
 * to restore (-1: keep the live state, or start from 0 when 0 is returned). */
static int reusable(const lilac_engine *e, const slot *sl, const eng_job *j, int *snap_k) {
    (void)e;
    *snap_k = -1;
    if (!j->cache_prompt || sl->n_hist == 0) return 0;
    int n = sl->n_hist < j->n_prompt ? sl->n_hist : j->n_prompt, L = 0;
    while (L < n && sl->hist[L] == j->prompt[L]) L++;
    if (L > j->n_prompt - 1) L = j->n_prompt - 1; /* the last prompt token is fed for its logits */
    if (L == sl->n_hist) return L;                /* the prompt extends the history: live state */
    for (int k = sl->n_snaps - 1; k >= 0; k--)
        if (sl->snaps[k].pos <= L) {
            *snap_k = k;
            return (int)sl->snaps[k].pos;
        }
    return 0;
}

static void start_job(lilac_engine *e, slot *sl, eng_job *j) {
    int k;
    int keep = reusable(e, sl, j, &k);
    /* A pending tail: if the prompt goes on through it, prefill feeds it, and
     * the turn-end snapshot is taken there. */
    sl->mark[1] = k < 0 && keep == sl->n_hist && sl->tail >= 0 && keep < j->n_prompt - 1 && j->prompt[keep] == sl->tail
                      ? keep + 1
                      : 0;
    sl->tail = -1;
    if (keep > 0 && k >= 0) {
        lilac_err err = {{0}};
        snapent *x = &sl->snaps[k];
        if (e->cfg.be->restore(sl->s, x->snap, &err) == 0) {
            x->used = lilac_now();
            sl->n_hist = keep;
            snaps_truncate(e, sl, keep);
            pthread_mutex_lock(&e->mu);
            e->st.cache_restores++;
            pthread_mutex_unlock(&e->mu);
        } else keep = 0;
    }
    if (keep == 0) slot_reset(e, sl);
    sl->job = j;
    sl->pos = keep;
    sl->next = -1;
    sl->mark[0] = 0;
    if (e->cfg.turn_start >= 0 && e->cfg.cache_bytes > 0)
        for (int i = j->n_prompt - 1; i > keep; i--)
            if (j->prompt[i] == e->cfg.turn_start) {
                sl->mark[0] = i;
                break;
            }
    /* Sampling in the backend (only token ids come back) unless the job needs the
     * logits here (logprobs), forces its tokens, or the backend has no sampler. */
    const lilac_backend *be = e->cfg.be;
    sl->dev = false;
    if (be->sample_begin && be->forward_sample && be->forward_batch_sample && !j->logprobs && !j->forced) {
        lilac_err serr = {{0}};
        sl->dev = be->sample_begin(sl->s, &j->samp, j->prompt, j->n_prompt, &serr) == 0; /* else the host sampler */
    }
    if (!sl->dev) lilac_sampler_begin(&sl->samp, &j->samp, j->prompt, j->n_prompt);
    sl->dt = lilac_detok_new(e->cfg.tok, (const char *const *)j->stops, (size_t)j->n_stops, true);
    pthread_mutex_lock(&j->mu);
    j->n_cached = keep;
    j->state = JOB_PREFILL;
    j->t_start = lilac_now();
    job_signal(j);
    pthread_mutex_unlock(&j->mu);
}

/* The slot to take job j: the idle one with the longest reusable prefix, else
 * (ties too) the least recently used idle one. -1 if none is idle. */
static int pick_slot(lilac_engine *e, const eng_job *j) {
    int best = -1, best_len = -1;
    for (int i = 0; i < e->cfg.n_slots; i++) {
        slot *sl = &e->slots[i];
        if (sl->job) continue;
        int k, len = reusable(e, sl, j, &k);
        if (len > best_len || (len == best_len && sl->last_used < e->slots[best].last_used)) {
            best = i;
            best_len = len;
        }
    }
    return best;
}

/* A token was chosen (from `logits`, or in the backend: NULL): record it and
 * decide whether to go on. */
static void emit(lilac_engine *e, slot *sl, int32_t tok, const float *logits) {
    eng_job *j = sl->job;
    eng_tok ti = {.id = tok, .lp = 0, .n_top = 0};
    if (j->logprobs) {
        ti.n_top = j->top_logprobs > ENG_MAX_TOP ? ENG_MAX_TOP : j->top_logprobs;
        lilac_logprobs(logits, e->cfg.model->cfg.vocab, tok, ti.n_top, &ti.lp, ti.top_id, ti.top_lp);
    }
    if (!sl->dev) lilac_sampler_accept(&sl->samp, tok); /* else the backend has recorded it */
    double now = lilac_now();
    pthread_mutex_lock(&e->mu);
    e->st.gen_tokens++;
    pthread_mutex_unlock(&e->mu);
    if (is_eos(e, tok) && !j->ignore_eos) {
        pthread_mutex_lock(&j->mu);
        j->n_gen++;
        if (!j->t_first) j->t_first = now;
        pthread_mutex_unlock(&j->mu);
        finish_turn(e, sl, tok, "stop");
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
    if (stop) finish_turn(e, sl, tok, "stop");
    else if (j->forced && n_gen >= j->n_forced) finish_turn(e, sl, tok, "stop");
    else if (n_gen >= j->max_tokens || sl->n_hist + 1 >= e->cfg.max_seq) finish_turn(e, sl, tok, "length");
    else sl->next = tok;
}

static void fail_slot(lilac_engine *e, slot *sl, const char *msg) {
    slot_reset(e, sl);
    if (sl->job) finish(e, sl, "error", msg);
}

/* One prefill chunk of a slot; the last one samples the first token. Chunks
 * end on snapshot boundaries (multiples of snapshot_every). */
static void prefill_step(lilac_engine *e, slot *sl) {
    eng_job *j = sl->job;
    lilac_err err = {{0}};
    const lilac_backend *be = e->cfg.be;
    int n = j->n_prompt - sl->pos;
    if (n > e->cfg.prefill_chunk) n = e->cfg.prefill_chunk;
    const int every = e->cfg.snapshot_every;
    bool boundary = false;
    if (every > 0) {
        int nb = (sl->pos / every + 1) * every;
        if (sl->pos + n >= nb) n = nb - sl->pos, boundary = true;
    }
    for (int m = 0; m < 2; m++)
        if (sl->mark[m] > sl->pos && sl->pos + n >= sl->mark[m]) n = sl->mark[m] - sl->pos, boundary = true;
    bool last = sl->pos + n == j->n_prompt;
    const bool dev = last && sl->dev; /* the first token is sampled in the backend */
    int32_t tok = -1;
    double t0 = lilac_now();
    if ((dev ? be->forward_sample(sl->s, j->prompt + sl->pos, n, &tok, &err)
             : be->forward(sl->s, j->prompt + sl->pos, n, last ? LOGITS_LAST : LOGITS_NONE, e->logits, &err)) < 0) {
        fail_slot(e, sl, err.msg);
        return;
    }
    double dt = lilac_now() - t0;
    hist_push(sl, j->prompt + sl->pos, n);
    sl->pos += n;
    pthread_mutex_lock(&e->mu);
    e->st.prompt_tokens += (uint64_t)n;
    e->st.prompt_seconds += dt;
    pthread_mutex_unlock(&e->mu);
    if (boundary || last) take_snapshot(e, sl);
    if (!last) return;
    if (j->forced) tok = j->n_forced > 0 ? j->forced[0] : -1;
    else if (!dev) tok = lilac_sample(&sl->samp, &j->samp, e->logits);
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
    emit(e, sl, tok, dev ? NULL : e->logits);
}

/* One batched decode step: every decoding slot feeds its next token, every idle
 * slot with a pending tail feeds that (then takes its turn-end snapshot). Rows
 * sampled in the backend go to forward_batch_sample (only ids come back), the
 * others (host sampling, forced tokens, tails) to forward_batch. */
static void decode_step(lilac_engine *e) {
    const int64_t V = e->cfg.model->cfg.vocab;
    const lilac_backend *be = e->cfg.be;
    int n = 0, nh = 0, nd = 0;
    for (int i = 0; i < e->cfg.n_slots; i++) {
        slot *sl = &e->slots[i];
        int32_t id = sl->job ? sl->next : sl->tail;
        if (id < 0) continue;
        if (sl->job && sl->dev) {
            e->dss[nd] = sl->s;
            e->dids[nd] = id;
            e->brow[n] = nd++;
        } else {
            e->bss[nh] = sl->s;
            e->bids[nh] = id;
            e->brow[n] = nh++;
        }
        e->bslot[n++] = i;
    }
    if (!n) return;
    lilac_err herr = {{0}}, derr = {{0}};
    double t0 = lilac_now();
    const bool hfail = nh && be->forward_batch(e->bss, e->bids, nh, e->logits, &herr) < 0;
    const bool dfail = nd && be->forward_batch_sample(e->dss, e->dids, nd, e->dtok, &derr) < 0;
    int rows = 0;
    for (int r = 0; r < n; r++) {
        slot *sl = &e->slots[e->bslot[r]];
        const bool dev = sl->job && sl->dev;
        if (dev ? dfail : hfail) continue;
        hist_push(sl, dev ? &e->dids[e->brow[r]] : &e->bids[e->brow[r]], 1);
        rows += sl->job != NULL;
    }
    pthread_mutex_lock(&e->mu);
    e->st.decode_seconds += lilac_now() - t0;
    e->st.decode_steps += (uint64_t)rows;
    e->st.batch_steps++;
    pthread_mutex_unlock(&e->mu);
    for (int r = 0; r < n; r++) {
        slot *sl = &e->slots[e->bslot[r]];
        eng_job *j = sl->job;
        const bool dev = j && sl->dev;
        if (dev ? dfail : hfail) {
            fail_slot(e, sl, dev ? derr.msg : herr.msg);
            continue;
        }
        if (!j) { /* a consumed tail: the turn is complete */
            sl->tail = -1;
            take_snapshot(e, sl);
            continue;
        }
        if (dev) {
            emit(e, sl, e->dtok[e->brow[r]], NULL);
            continue;
        }
        const float *lg = e->logits + (int64_t)e->brow[r] * V;
        int32_t tok;
        if (j->forced) tok = j->forced[j->n_gen]; /* only the worker writes n_gen */
        else tok = lilac_sample(&sl->samp, &j->samp, lg);
        emit(e, sl, tok, lg);
    }
}

/* One round: cancellations, a prefill chunk per prefilling slot, one batched
 * decode step for all decoding slots. */
static void round_step(lilac_engine *e) {
    for (int i = 0; i < e->cfg.n_slots; i++) {
        slot *sl = &e->slots[i];
        if (sl->job && atomic_load(&sl->job->cancel)) finish(e, sl, "cancelled", NULL);
    }
    for (int i = 0; i < e->cfg.n_slots; i++) {
        slot *sl = &e->slots[i];
        if (sl->job && sl->next < 0) prefill_step(e, sl);
    }
    decode_step(e);
}

static bool busy(const lilac_engine *e) {
    for (int i = 0; i < e->cfg.n_slots; i++)
        if (e->slots[i].job || e->slots[i].tail >= 0) return true;
    return false;
}

static void *worker(void *arg) {
    lilac_engine *e = arg;
    const eng_config *c = &e->cfg;
    for (int i = 0; i < c->n_slots; i++) {
        slot *sl = &e->slots[i];
        sl->tail = sl->next = -1;
        sl->s = c->be->session_new(c->model, c->max_seq, c->threads, &e->init_err);
        if (sl->s && c->attn_bf16) c->be->set_attn_bf16(sl->s, true);
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
        if (e->stop) break;
        if (!busy(e) && !e->q_n) {
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
        round_step(e);
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
    if (cfg->n_slots < 1 || cfg->queue_max < 1 || cfg->max_seq < 2 || cfg->prefill_chunk < 1 || cfg->snapshot_every < 0) {
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
    e->logits = xcalloc((size_t)cfg->n_slots * (size_t)cfg->model->cfg.vocab, sizeof(float));
    e->bss = xcalloc((size_t)cfg->n_slots, sizeof(lilac_session *));
    e->bids = xcalloc((size_t)cfg->n_slots, sizeof(int32_t));
    e->dss = xcalloc((size_t)cfg->n_slots, sizeof(lilac_session *));
    e->dids = xcalloc((size_t)cfg->n_slots, sizeof(int32_t));
    e->dtok = xcalloc((size_t)cfg->n_slots, sizeof(int32_t));
    e->bslot = xcalloc((size_t)cfg->n_slots, sizeof(int));
    e->brow = xcalloc((size_t)cfg->n_slots, sizeof(int));
    e->st.n_slots = cfg->n_slots;
    e->st.cache_limit_bytes = cfg->cache_bytes > 0 ? cfg->cache_bytes : 0;
    if (pthread_create(&e->th, NULL, worker, e)) {
        lilac_fail(err, "engine: cannot start the worker thread");
        free(e->q);
        free(e->slots);
        free(e->logits);
        free(e->bss);
        free(e->bids);
        free(e->dss);
        free(e->dids);
        free(e->dtok);
        free(e->bslot);
        free(e->brow);
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
        for (int k = 0; k < sl->n_snaps; k++) e->cfg.be->snapshot_free(sl->snaps[k].snap);
        free(sl->snaps);
        if (sl->s) e->cfg.be->session_free(sl->s);
        free(sl->hist);
        if (sl->samp.vocab) lilac_sampler_free(&sl->samp);
        lilac_detok_free(sl->dt);
    }
    free(e->slots);
    free(e->q);
    free(e->logits);
    free(e->bss);
    free(e->bids);
    free(e->dss);
    free(e->dids);
    free(e->dtok);
    free(e->bslot);
    free(e->brow);
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
