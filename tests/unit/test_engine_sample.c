/* test_engine_sample.c — the engine's path for backends that sample where the
 * logits are (sample_begin / forward_sample / forward_batch_sample, the CUDA
 * backend's), on the CPU: a backend that is the CPU one plus those entries
 * implemented with the host sampler. The same seeded requests must produce the
 * same tokens as through the plain CPU backend (where the engine samples), and
 * requests that need logits (logprobs) or force their tokens must stay on the
 * host path, also when they share a decode round with backend-sampled ones. */
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "engine/engine.h"
#include "server/demo_model.h"

static lilac_model M;
static lilac_tokenizer *TOK;

/* ---- the CPU backend plus a sampler "in the backend" ---- */

enum { MAXS = 8 };
static struct {
    lilac_session *s;
    lilac_sampler smp;
    lilac_sampling p;
} tab[MAXS];
static int n_begin, n_fsample, n_bsample, n_bsample_rows, n_batch_rows;
static float *scratch; /* [MAXS, vocab] */

static void tab_clear(void) { /* sessions die with their engine */
    for (int i = 0; i < MAXS; i++)
        if (tab[i].s) lilac_sampler_free(&tab[i].smp), tab[i].s = NULL;
}

static int entry(lilac_session *s) {
    for (int i = 0; i < MAXS; i++)
        if (tab[i].s == s) return i;
    for (int i = 0; i < MAXS; i++)
        if (!tab[i].s) {
            tab[i].s = s;
            lilac_sampler_init(&tab[i].smp, M.cfg.vocab);
            return i;
        }
    abort();
}

static int w_sample_begin(lilac_session *s, const lilac_sampling *p, const int32_t *prompt, int n, lilac_err *err) {
    (void)err;
    const int k = entry(s);
    tab[k].p = *p;
    lilac_sampler_begin(&tab[k].smp, p, prompt, n);
    n_begin++;
    return 0;
}

static int32_t pick(lilac_session *s, const float *logits) {
    const int k = entry(s);
    const int32_t t = lilac_sample(&tab[k].smp, &tab[k].p, logits);
    lilac_sampler_accept(&tab[k].smp, t);
    return t;
}

static int w_forward_sample(lilac_session *s, const int32_t *ids, int n, int32_t *tok, lilac_err *err) {
    n_fsample++;
    if (lilac_backend_cpu.forward(s, ids, n, LOGITS_LAST, scratch, err) < 0) return -1;
    *tok = pick(s, scratch);
    return 0;
}

static int w_forward_batch_sample(lilac_session **ss, const int32_t *ids, int n, int32_t *toks, lilac_err *err) {
    n_bsample++;
    n_bsample_rows += n;
    if (lilac_backend_cpu.forward_batch(ss, ids, n, scratch, err) < 0) return -1;
    for (int i = 0; i < n; i++) toks[i] = pick(ss[i], scratch + (int64_t)i * M.cfg.vocab);
    return 0;
}

static int w_forward_batch(lilac_session **ss, const int32_t *ids, int n, float *logits, lilac_err *err) {
    n_batch_rows += n;
    return lilac_backend_cpu.forward_batch(ss, ids, n, logits, err);
}

static lilac_backend WB;

/* ---- running jobs ---- */

typedef struct {
    float T, top_p, min_p, pres, freq, rep;
    int top_k;
    uint64_t seed;
    bool logprobs;
    bool forced;
} spec;

static eng_job *make_job(const spec *sp, int plen, int seed) {
    eng_job *j = eng_job_new();
    j->n_prompt = plen;
    j->prompt = malloc(sizeof(int32_t) * (size_t)plen);
    for (int i = 0; i < plen; i++) j->prompt[i] = (int32_t)(((uint32_t)(i + 11 * seed) * 2654435761u >> 9) % 900 + 10);
    j->max_tokens = 20;
    j->ignore_eos = true;
    j->samp.temperature = sp->T;
    j->samp.top_p = sp->top_p;
    j->samp.min_p = sp->min_p;
    j->samp.presence_penalty = sp->pres;
    j->samp.frequency_penalty = sp->freq;
    j->samp.repetition_penalty = sp->rep;
    j->samp.top_k = sp->top_k;
    j->samp.seed = sp->seed;
    j->samp.has_seed = true;
    j->logprobs = sp->logprobs;
    j->top_logprobs = sp->logprobs ? 3 : 0;
    if (sp->forced) {
        j->n_forced = 6;
        j->forced = malloc(sizeof(int32_t) * 6);
        for (int i = 0; i < 6; i++) j->forced[i] = 100 + 7 * i;
    }
    return j;
}

/* Run the jobs together on a fresh engine over `be`; their tokens into out[k][0..20). */
static void run(const lilac_backend *be, int n_slots, const spec *sp, int n, int32_t out[][20], int *n_out) {
    lilac_err err = {{0}};
    eng_config ec = {.be = be, .model = &M, .tok = TOK, .max_seq = 256, .threads = 1, .n_slots = n_slots,
                     .queue_max = 8, .prefill_chunk = 16, .snapshot_every = 0, .cache_bytes = 0, .turn_start = -1};
    lilac_engine *e = eng_new(&ec, &err);
    CHECKF(e != NULL, "%s", err.msg);
    if (!e) return;
    eng_job *jobs[8];
    for (int k = 0; k < n; k++) {
        jobs[k] = make_job(&sp[k], 20 + 9 * k, k);
        CHECK(eng_submit(e, jobs[k]) == 0);
    }
    for (int k = 0; k < n; k++) {
        eng_job *j = jobs[k];
        pthread_mutex_lock(&j->mu);
        while (j->state != JOB_DONE) eng_job_wait(j, 1.0);
        CHECKF(!strcmp(j->finish, "length") || (sp[k].forced && !strcmp(j->finish, "stop")), "job %d: %s %s", k,
               j->finish, j->error);
        n_out[k] = j->n_toks;
        for (int i = 0; i < j->n_toks && i < 20; i++) out[k][i] = j->toks[i].id;
        if (sp[k].logprobs)
            for (int i = 0; i < j->n_toks; i++) CHECK(j->toks[i].n_top == 3 && j->toks[i].lp < 0);
        pthread_mutex_unlock(&j->mu);
        eng_job_unref(j);
    }
    eng_free(e);
    tab_clear();
}

static const spec A = {0.8f, 0.9f, 0.02f, 0.4f, 0.2f, 1.1f, 40, 7, false, false};
static const spec B = {1.2f, 1.0f, 0.0f, 0.0f, 0.5f, 1.0f, 0, 99, false, false};
static const spec G = {0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 1.3f, 0, 1, false, false};

static void reset_counts(void) { n_begin = n_fsample = n_bsample = n_bsample_rows = n_batch_rows = 0; }

/* Backend-sampled jobs give the tokens the host sampler gives, batched or alone. */
static void test_same_tokens(void) {
    const spec sp[3] = {A, B, G};
    int32_t ref[3][20], got[3][20];
    int nr[3], ng[3];
    run(&lilac_backend_cpu, 3, sp, 3, ref, nr);
    reset_counts();
    run(&WB, 3, sp, 3, got, ng);
    for (int k = 0; k < 3; k++) {
        CHECK(nr[k] == 20 && ng[k] == 20);
        CHECKF(!memcmp(ref[k], got[k], sizeof ref[k]), "job %d differs", k);
    }
    CHECK(n_begin == 3 && n_fsample == 3);
    CHECK(n_bsample > 0 && n_bsample_rows == 3 * 19);
    CHECK(n_batch_rows == 0); /* no snapshots, so no tails: nothing sampled on the host */
}

/* logprobs and forced jobs stay on the host path next to a backend-sampled one. */
static void test_mixed_round(void) {
    spec lp = B, fo = A;
    lp.logprobs = true;
    fo.forced = true;
    const spec sp[3] = {A, lp, fo};
    int32_t ref[3][20], got[3][20];
    int nr[3], ng[3];
    run(&lilac_backend_cpu, 3, sp, 3, ref, nr);
    reset_counts();
    run(&WB, 3, sp, 3, got, ng);
    CHECK(n_begin == 1 && n_fsample == 1);  /* job A only */
    CHECK(n_bsample_rows == 19);             /* A's decode rows */
    CHECK(n_batch_rows == 19 + 5);           /* the logprobs job's rows, the forced job's */
    CHECK(ng[0] == 20 && ng[1] == 20 && ng[2] == 6);
    for (int i = 0; i < 6; i++) CHECK(got[2][i] == 100 + 7 * i);
    /* the CPU backend's rows do not depend on the batch they are in */
    for (int k = 0; k < 3; k++) CHECKF(nr[k] == ng[k] && !memcmp(ref[k], got[k], sizeof(int32_t) * (size_t)ng[k]), "job %d", k);
}

int main(void) {
    char dir[] = "/tmp/lilac-test-engsample-XXXXXX";
    if (!mkdtemp(dir)) return 2;
    lilac_err err = {{0}};
    if (lilac_demo_build(dir, &err) < 0 || lilac_model_load(&M, dir, &err) < 0 || !(TOK = lilac_tok_load(dir, &err))) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    WB = lilac_backend_cpu;
    WB.name = "cpu+sampler";
    WB.sample_begin = w_sample_begin;
    WB.forward_sample = w_forward_sample;
    WB.forward_batch_sample = w_forward_batch_sample;
    WB.forward_batch = w_forward_batch;
    scratch = malloc(sizeof(float) * MAXS * (size_t)M.cfg.vocab);
    TEST(test_same_tokens);
    TEST(test_mixed_round);
    free(scratch);
    lilac_tok_free(TOK);
    lilac_model_free(&M);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}
