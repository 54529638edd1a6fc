/* cpu_mtp.c — the MTP head's forward on the CPU (the reference), f32.
 *
 * One row: e = E[x] (the main embedding), u = fc · concat(rmsnorm(e)·g_emb,
 * rmsnorm(h)·g_hid) with the embedding first, u = the decoder layer (the main
 * model's full gated-attention layer and MoE, cpu_mtp_layer, over the head's own
 * KV cache), y = rmsnorm(u)·g_norm, logits = lm_head · y. Every gain is 1+w
 * (weights.c converts at load), eps the model's. h is the target's hidden
 * state after its final norm for a committed row (prefill), the previous step's
 * y for a chained draft. fc and lm_head run on the f32 reference products. */
#include <math.h>
#include <stdlib.h>

#include "cpu_mm.h"
#include "cpu_mtp.h"
#include "cpu_ops.h"

struct cpu_mtp {
    int64_t pos;       /* committed rows */
    bool have_last;    /* y_last/logits_last hold the last committed row's output */
    float *y_last;     /* [hidden] */
    float *logits_last; /* [vocab] */
    float *cat, *u, *y; /* [CPU_MTP_ROWS][2 hidden], [..][hidden], [..][hidden] */
};

void cpu_mtp_reset(cpu_mtp *st) {
    st->pos = 0;
    st->have_last = false;
}

void cpu_mtp_truncate(cpu_mtp *st, int64_t pos) {
    if (st->pos > pos) {
        st->pos = pos;
        st->have_last = false;
    }
}

void cpu_mtp_free(cpu_mtp *st) {
    if (!st) return;
    free(st->y_last); free(st->logits_last); free(st->cat); free(st->u); free(st->y);
    free(st);
}

static cpu_mtp *state(lilac_session *s, lilac_err *err) {
    const lilac_model *m = cpu_session_model(s);
    if (!m->mtp) {
        lilac_fail(err, "mtp: %s has no MTP head (mtp.* tensors)", m->dir);
        return NULL;
    }
    cpu_mtp **p = cpu_session_mtp(s);
    if (!*p) {
        const int64_t H = m->cfg.hidden;
        cpu_mtp *st = *p = xcalloc(1, sizeof *st);
        st->y_last = xcalloc((size_t)H, sizeof(float));
        st->logits_last = xcalloc((size_t)m->cfg.vocab, sizeof(float));
        st->cat = xcalloc((size_t)(CPU_MTP_ROWS * 2 * H), sizeof(float));
        st->u = xcalloc((size_t)(CPU_MTP_ROWS * H), sizeof(float));
        st->y = xcalloc((size_t)(CPU_MTP_ROWS * H), sizeof(float));
    }
    return *p;
}

static void product(const lilac_matrix *W, const float *x, int T, float *y) {
    const cpu_mm it = {.W = *W, .x = x, .a = NULL, .T = T, .y = y, .ystride = W->rows};
    cpu_mm_run(&it, 1);
}

/* T <= CPU_MTP_ROWS rows at positions pos..: st->y[T][hidden] = the head's output y. */
static void rows(lilac_session *s, cpu_mtp *st, int64_t pos, const float *hidden, const int32_t *ids, int T) {
    const lilac_model *m = cpu_session_model(s);
    const lilac_mtp *h = m->mtp;
    const int64_t H = m->cfg.hidden;
    const float eps = m->cfg.rms_eps;
    for (int t = 0; t < T; t++) {
        float *cat = st->cat + (int64_t)t * 2 * H;
        lilac_mat_row(&m->embed, ids[t], st->u); /* u as scratch for the embedding row */
        cpu_rmsnorm(cat, st->u, h->norm_emb, H, eps);
        cpu_rmsnorm(cat + H, hidden + (int64_t)t * H, h->norm_hid, H, eps);
    }
    product(&h->fc, st->cat, T, st->u);
    cpu_mtp_layer(s, &h->layer, st->u, T, pos);
    for (int t = 0; t < T; t++) cpu_rmsnorm(st->y + (int64_t)t * H, st->u + (int64_t)t * H, h->norm, H, eps);
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

static int mtp_prefill(lilac_session *s, int64_t pos, const float *hidden, const int32_t *ids, int n, lilac_logits_mode mode,
                       float *logits, lilac_err *err) {
    cpu_mtp *st = state(s, err);
    if (!st) return -1;
    const lilac_model *m = cpu_session_model(s);
    const int64_t H = m->cfg.hidden, V = m->cfg.vocab;
    if (n <= 0) return lilac_fail(err, "mtp prefill: no rows");
    if (pos < 0 || pos > st->pos)
        return lilac_fail(err, "mtp prefill: position %lld is past the head's %lld committed rows", (long long)pos,
                          (long long)st->pos);
    if (pos + n > cpu_session_max_seq(s))
        return lilac_fail(err, "mtp prefill: %lld + %d rows exceed the session's %lld positions", (long long)pos, n,
                          (long long)cpu_session_max_seq(s));
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return lilac_fail(err, "mtp prefill: token id %d at index %d is outside the vocabulary [0, %lld)", ids[i], i,
                              (long long)V);
    for (int done = 0; done < n;) {
        const int T = n - done < CPU_MTP_ROWS ? n - done : CPU_MTP_ROWS;
        rows(s, st, pos + done, hidden + (int64_t)done * H, ids + done, T);
        if (mode == LOGITS_ALL) product(&m->lm_head, st->y, T, logits + (int64_t)done * V);
        done += T;
        if (done == n) {
            memcpy(st->y_last, st->y + (int64_t)(T - 1) * H, sizeof(float) * (size_t)H);
            if (mode == LOGITS_ALL) memcpy(st->logits_last, logits + (int64_t)(n - 1) * V, sizeof(float) * (size_t)V);
            else product(&m->lm_head, st->y_last, 1, st->logits_last);
            if (mode == LOGITS_LAST) memcpy(logits, st->logits_last, sizeof(float) * (size_t)V);
        }
    }
    st->pos = pos + n;
    st->have_last = true;
    return 0;
}

static int mtp_draft(lilac_session *s, int k, int32_t *drafts, float *logits, lilac_err *err) {
    cpu_mtp *st = state(s, err);
    if (!st) return -1;
    const lilac_model *m = cpu_session_model(s);
    const int64_t H = m->cfg.hidden, V = m->cfg.vocab;
    if (k < 1) return lilac_fail(err, "mtp draft: k must be at least 1, got %d", k);
    if (!st->have_last) return lilac_fail(err, "mtp draft: no committed row to draft from (run prefill first)");
    if (st->pos + k - 1 > cpu_session_max_seq(s))
        return lilac_fail(err, "mtp draft: %d drafts from position %lld exceed the session's %lld positions", k,
                          (long long)st->pos, (long long)cpu_session_max_seq(s));
    drafts[0] = argmax(st->logits_last, V);
    if (logits) memcpy(logits, st->logits_last, sizeof(float) * (size_t)V);
    float *y = xmalloc(sizeof(float) * (size_t)H), *lg = logits ? NULL : xmalloc(sizeof(float) * (size_t)V);
    memcpy(y, st->y_last, sizeof(float) * (size_t)H);
    for (int i = 1; i < k; i++) {
        rows(s, st, st->pos + i - 1, y, &drafts[i - 1], 1);
        memcpy(y, st->y, sizeof(float) * (size_t)H);
        float *out = logits ? logits + (int64_t)i * V : lg;
        product(&m->lm_head, y, 1, out);
        drafts[i] = argmax(out, V);
    }
    free(y);
    free(lg);
    return 0;
}

static int64_t mtp_pos(const lilac_session *s) {
    cpu_mtp *const *p = cpu_session_mtp((lilac_session *)s);
    return *p ? (*p)->pos : 0;
}

const lilac_mtp_ops cpu_mtp_ops = {
    .hidden_record = cpu_hidden_record,
    .prefill = mtp_prefill,
    .draft = mtp_draft,
    .pos = mtp_pos,
};
