/* cpu_forward.c — the whole Qwen3.6-35B-A3B text forward pass in plain C, f32.
 *
 * Read top to bottom: session (state) -> embedding -> per layer
 * [RMSNorm -> GatedDeltaNet or gated attention -> residual -> RMSNorm -> MoE ->
 * residual] -> final norm -> lm_head. Tokens are processed in chunks of up to
 * CHUNK positions so activation memory stays bounded at any prompt length;
 * within a chunk every weight row is read once and used for all tokens.
 * Numerics follow mlx-lm's qwen3_5 model computed in f32 (spec/model.md §3);
 * the matrix products run on the fast kernels (int8 pieces of the activations,
 * cpu_kernels.h) or on the f32 reference (cpu_ops.h), as cpu_mm_kernels() says.
 * Parallel work goes to one persistent thread pool (cpu_pool.h), several
 * products per job (cpu_mm.h). */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "../backend.h"
#include "cpu_mm.h"
#include "cpu_mtp.h"
#include "cpu_ops.h"
#include "cpu_pool.h"

#define CHUNK 512 /* rows per pass: larger chunks dequantise each expert once for more tokens */

/* Rows [t0, t0+n) of a pass belong to session s (positions s->pos ...). A pass
 * over one session's tokens has one group; a batched decode step has one group
 * per session, one row each. Matrix products run over all rows at once; the
 * state-carrying steps (conv window, recurrence, KV cache) per group. */
typedef struct {
    lilac_session *s;
    int t0, n;
} rowgroup;

struct lilac_session {
    const lilac_model *m;
    int64_t pos, max_seq;
    /* per layer (NULL where the layer type does not have it) */
    float **conv_state;  /* GDN: [K-1][conv_dim] raw projected inputs, oldest first */
    float **ssm;         /* GDN: [v_heads][k_dim][v_dim] f32 recurrent state */
    float **kcache;      /* attention: [kv_cap][n_kv*head_dim] (after k_norm + RoPE) */
    float **vcache;      /* attention: [kv_cap][n_kv*head_dim] */
    int64_t kv_cap;
    bool kv_bf16;        /* K and V rows rounded to bf16 (set_kv_bf16: the CUDA backend's cache) */
    /* chunk scratch */
    float *x, *xn, *r;                 /* [CHUNK][hidden] */
    float *qkv, *conv_out, *z, *ba, *bb, *o;  /* GDN */
    float *qg, *kx, *vx, *att;         /* attention */
    float *router, *topw, *sh_g, *sh_u, *sh_y, *sh_gate; /* MoE */
    int *topi;
    /* routed rows gathered by expert: [cap][hidden] inputs and outputs, [cap][moe_inter] gate and up */
    float *moe_x, *moe_g, *moe_u, *moe_y, *moe_wts; /* moe_wts: [cap] routing weight per gathered row */
    int *moe_rows, moe_cap;                        /* [cap] token of each gathered row */
    int *moe_start, *moe_used;                     /* [E+1] first gathered row per expert; [E] experts used */
    cpu_mm *moe_items;                             /* [2E+1] */
    /* quantised inputs of the fast path: the normed rows, GDN output, attention output, shared act,
     * gathered expert inputs and expert act; moe_view: one expert's rows of the last two */
    cpu_qact qa_xn, qa_o, qa_att, qa_sh, qa_moe, qa_moe_act;
    cpu_qact *moe_view;
    float *inv_freq;                   /* [rotary_dim/2] RoPE frequencies */
    rowgroup grp[CHUNK];               /* the groups of the pass this session leads */
    int ngrp;
    /* routing record / replay (route_record, route_replay): tables [n_layers][n][top_k] */
    int32_t *rt_rec;
    const int32_t *rt_rep;
    int rt_rec_cap, rt_rep_cap;
    int rt_n, rt_t0;       /* the forward() call's tokens and the chunk's first (rt_n 0: no table applies) */
    double rt_regret;      /* worst replayed regret since route_replay */
    int64_t rt_differ;     /* replayed rows that differed from the own top-k */
    /* MTP head (cpu_mtp.c): its KV cache is kcache/vcache[n_layers] */
    float *hid_rec;        /* hidden_record's table, hid_cap rows; hid_t0: the chunk's first row (-1: off) */
    int hid_cap, hid_t0;
    cpu_mtp *mtp;
};

/* ---- session ------------------------------------------------------------ */

static void cpu_session_reset(lilac_session *s) {
    const lilac_config *c = &s->m->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        if (s->conv_state[l]) memset(s->conv_state[l], 0, sizeof(float) * (size_t)((c->conv_kernel - 1) * cfg_conv_dim(c)));
        if (s->ssm[l]) memset(s->ssm[l], 0, sizeof(float) * (size_t)(c->lin_v_heads * c->lin_k_dim * c->lin_v_dim));
    }
    s->pos = 0;
    if (s->mtp) cpu_mtp_reset(s->mtp);
}

static void cpu_session_free(lilac_session *s) {
    if (!s) return;
    for (int l = 0; l < s->m->cfg.n_layers; l++) {
        free(s->conv_state[l]); free(s->ssm[l]);
    }
    for (int l = 0; l <= s->m->cfg.n_layers; l++) { free(s->kcache[l]); free(s->vcache[l]); }
    cpu_mtp_free(s->mtp);
    free(s->conv_state); free(s->ssm); free(s->kcache); free(s->vcache);
    float *bufs[] = {s->x, s->xn, s->r, s->qkv, s->conv_out, s->z, s->ba, s->bb, s->o, s->qg, s->kx, s->vx, s->att,
                     s->router, s->topw, s->sh_g, s->sh_u, s->sh_y,
                     s->sh_gate, s->inv_freq};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(s->topi);
    cpu_qact *qas[] = {&s->qa_xn, &s->qa_o, &s->qa_att, &s->qa_sh, &s->qa_moe, &s->qa_moe_act};
    for (size_t i = 0; i < sizeof qas / sizeof qas[0]; i++) cpu_qact_free(qas[i]);
    free(s->moe_view); free(s->moe_x); free(s->moe_g); free(s->moe_u); free(s->moe_y); free(s->moe_wts);
    free(s->moe_rows); free(s->moe_start); free(s->moe_used); free(s->moe_items);
    free(s);
}

static float *fbuf(int64_t n) { return xcalloc((size_t)n, sizeof(float)); }

static lilac_session *cpu_session_new(const lilac_model *m, int64_t max_seq, int threads, lilac_err *err) {
    const lilac_config *c = &m->cfg;
    if (max_seq <= 0 || max_seq > c->max_pos) max_seq = c->max_pos;
    cpu_pool_use(threads);
    (void)err;
    lilac_session *s = xcalloc(1, sizeof *s);
    s->m = m;
    s->max_seq = max_seq;
    int L = c->n_layers;
    s->conv_state = xcalloc((size_t)L, sizeof(float *));
    s->ssm = xcalloc((size_t)L, sizeof(float *));
    s->kcache = xcalloc((size_t)L + 1, sizeof(float *)); /* + the MTP head's */
    s->vcache = xcalloc((size_t)L + 1, sizeof(float *));
    s->hid_t0 = -1;
    for (int l = 0; l < L; l++) {
        if (c->is_full[l]) continue;
        s->conv_state[l] = fbuf((c->conv_kernel - 1) * cfg_conv_dim(c));
        s->ssm[l] = fbuf((int64_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim);
    }
    const int64_t H = c->hidden, C = CHUNK;
    s->x = fbuf(C * H); s->xn = fbuf(C * H); s->r = fbuf(C * H);
    s->qkv = fbuf(C * cfg_conv_dim(c)); s->conv_out = fbuf(C * cfg_conv_dim(c));
    s->z = fbuf(C * cfg_lin_val_dim(c)); s->o = fbuf(C * cfg_lin_val_dim(c));
    s->ba = fbuf(C * c->lin_v_heads); s->bb = fbuf(C * c->lin_v_heads);
    s->qg = fbuf(C * 2 * c->n_heads * c->head_dim);
    s->kx = fbuf(C * c->n_kv_heads * c->head_dim); s->vx = fbuf(C * c->n_kv_heads * c->head_dim);
    s->att = fbuf(C * c->n_heads * c->head_dim);
    s->router = fbuf(C * c->n_experts); s->topw = fbuf(C * c->top_k);
    s->topi = xcalloc((size_t)(C * c->top_k), sizeof(int));
    s->moe_view = xcalloc((size_t)c->n_experts, sizeof(cpu_qact));
    s->moe_start = xcalloc((size_t)c->n_experts + 1, sizeof(int));
    s->moe_used = xcalloc((size_t)c->n_experts, sizeof(int));
    s->moe_items = xcalloc(2 * (size_t)c->n_experts + 1, sizeof(cpu_mm));
    s->sh_g = fbuf(C * c->shared_inter); s->sh_u = fbuf(C * c->shared_inter); s->sh_y = fbuf(C * H);
    s->sh_gate = fbuf(C);
    s->inv_freq = fbuf(c->rotary_dim / 2 + 1);
    for (int i = 0; i < c->rotary_dim / 2; i++) s->inv_freq[i] = (float)pow(c->rope_theta, -2.0 * i / c->rotary_dim);
    return s;
}

static int64_t cpu_session_pos(const lilac_session *s) { return s->pos; }

/* Grow the KV caches of the attention layers to hold `need` positions. */
static void kv_reserve(lilac_session *s, int64_t need) {
    if (need <= s->kv_cap) return;
    const lilac_config *c = &s->m->cfg;
    int64_t cap = s->kv_cap ? s->kv_cap : 256;
    while (cap < need) cap *= 2;
    if (cap > s->max_seq) cap = s->max_seq;
    const size_t row = sizeof(float) * (size_t)(c->n_kv_heads * c->head_dim);
    for (int l = 0; l <= c->n_layers; l++) {
        if (l < c->n_layers ? !c->is_full[l] : !s->m->mtp) continue;
        s->kcache[l] = xrealloc(s->kcache[l], row * (size_t)cap);
        s->vcache[l] = xrealloc(s->vcache[l], row * (size_t)cap);
    }
    s->kv_cap = cap;
}

/* ---- matrix products ---------------------------------------------------- */

typedef struct {
    cpu_qact *a;
    const float *x;
} quant_job;

static void quant_row(void *c, int64_t t) {
    quant_job *j = c;
    cpu_qact_row(j->a, (int)t, j->x + t * j->a->cols);
}

/* x [T][cols] quantised into a for the fast path; NULL where the reference runs. */
static const cpu_qact *quant(cpu_qact *a, const float *x, int T, int64_t cols) {
    if (!cpu_mm_kernels() || cols % 64) return NULL;
    cpu_qact_reserve(a, T, cols);
    quant_job j = {a, x};
    if (T * cols >= 65536) cpu_pool_for(T, quant_row, &j);
    else for (int t = 0; t < T; t++) quant_row(&j, t);
    return a;
}

/* Rows [t0, t0+n) of a as a view of n rows. */
static cpu_qact qview(const cpu_qact *a, int t0, int n) {
    cpu_qact v = *a;
    v.T = v.cap = n;
    v.ph += (int64_t)t0 * a->cols; v.pm += (int64_t)t0 * a->cols; v.pl += (int64_t)t0 * a->cols;
    v.nh += (int64_t)t0 * a->cols; v.nm += (int64_t)t0 * a->cols; v.nl += (int64_t)t0 * a->cols;
    v.dq += (int64_t)t0 * a->ng; v.xs += (int64_t)t0 * a->ng;
    return v;
}

static cpu_mm mm(const lilac_matrix *W, const float *x, const cpu_qact *a, int T, float *y) {
    return (cpu_mm){.W = *W, .x = x, .a = a, .T = T, .y = y, .ystride = W->rows};
}

/* ---- Gated DeltaNet ----------------------------------------------------- */

typedef struct {
    lilac_session *s;
    const lilac_layer *ly;
    int l;
} layer_job;

/* Causal depthwise conv over [state (K-1 rows) | qkv (the group's rows)], then SiLU: channel ch. */
static void conv_channel(void *c, int64_t ch) {
    const layer_job *j = c;
    lilac_session *s = j->s;
    const lilac_config *cf = &s->m->cfg;
    const int64_t CD = cfg_conv_dim(cf);
    const int K = cf->conv_kernel;
    const float *w = j->ly->conv + ch * K;
    for (int gi = 0; gi < s->ngrp; gi++) {
        const rowgroup *g = &s->grp[gi];
        float *conv_state = g->s->conv_state[j->l];
        const float *in = s->qkv + (int64_t)g->t0 * CD;
        for (int t = 0; t < g->n; t++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) {
                int src = t - (K - 1) + k; /* < 0: from the state */
                float x = src >= 0 ? in[(int64_t)src * CD + ch] : conv_state[(int64_t)(K - 1 + src) * CD + ch];
                acc += w[k] * x;
            }
            s->conv_out[(int64_t)(g->t0 + t) * CD + ch] = cpu_silu(acc);
        }
        /* New state: the last K-1 raw inputs of [state | qkv]. */
        float tmp[16];
        for (int k = 0; k < K - 1; k++) {
            int src = g->n - (K - 1) + k;
            tmp[k] = src >= 0 ? in[(int64_t)src * CD + ch] : conv_state[(int64_t)(K - 1 + src) * CD + ch];
        }
        for (int k = 0; k < K - 1; k++) conv_state[(int64_t)k * CD + ch] = tmp[k];
    }
}

/* The recurrence of v-head j of group gi (item = gi * Hv + j), sequential in t. */
static void gdn_head(void *c, int64_t item) {
    const layer_job *jb = c;
    lilac_session *s = jb->s;
    const lilac_layer *ly = jb->ly;
    const lilac_config *cf = &s->m->cfg;
    const int64_t CD = cfg_conv_dim(cf), KD = cfg_lin_key_dim(cf), VD = cfg_lin_val_dim(cf);
    const int Hk = cf->lin_k_heads, Hv = cf->lin_v_heads, dk = cf->lin_k_dim, dv = cf->lin_v_dim;
    const int gi = (int)(item / Hv), j = (int)(item % Hv);
    const float qscale = 1.0f / sqrtf((float)dk);
    const rowgroup *g = &s->grp[gi];
    const int hk = j / (Hv / Hk); /* v-head j reads q/k head j / (Hv/Hk) */
    float *S = g->s->ssm[jb->l] + (int64_t)j * dk * dv; /* S[i][m]: key i, value m */
    float q[512], k[512], r[512];
    const float A = expf(ly->A_log[j]);
    for (int t = g->t0; t < g->t0 + g->n; t++) {
        const float *row = s->conv_out + (int64_t)t * CD;
        const float *qr = row + hk * dk, *kr = row + KD + hk * dk, *v = row + 2 * KD + (int64_t)j * dv;
        float qs = 0.0f, ks = 0.0f;
        for (int i = 0; i < dk; i++) { qs += qr[i] * qr[i]; ks += kr[i] * kr[i]; }
        const float qn = qscale / sqrtf(qs + 1e-6f), kn = 1.0f / sqrtf(ks + 1e-6f);
        for (int i = 0; i < dk; i++) { q[i] = qr[i] * qn; k[i] = kr[i] * kn; }
        const float beta = cpu_sigmoid(s->bb[(int64_t)t * Hv + j]);
        const float xa = s->ba[(int64_t)t * Hv + j] + ly->dt_bias[j];
        const float softplus = xa > 20.0f ? xa : log1pf(expf(xa));
        const float decay = expf(-A * softplus);
        for (int m = 0; m < dv; m++) r[m] = 0.0f;
        for (int i = 0; i < dk; i++) {
            float *Si = S + (int64_t)i * dv;
            for (int m = 0; m < dv; m++) { Si[m] *= decay; r[m] += Si[m] * k[i]; }
        }
        for (int m = 0; m < dv; m++) r[m] = (v[m] - r[m]) * beta; /* delta */
        float *o = s->o + (int64_t)t * VD + (int64_t)j * dv;
        for (int m = 0; m < dv; m++) o[m] = 0.0f;
        for (int i = 0; i < dk; i++) {
            float *Si = S + (int64_t)i * dv;
            for (int m = 0; m < dv; m++) { Si[m] += k[i] * r[m]; o[m] += Si[m] * q[i]; }
        }
        /* Gated RMSNorm: w * rmsnorm(o) * silu(z). */
        const float *z = s->z + (int64_t)t * VD + (int64_t)j * dv;
        cpu_rmsnorm(o, o, ly->gdn_norm, dv, cf->rms_eps);
        for (int m = 0; m < dv; m++) o[m] *= cpu_silu(z[m]);
    }
}

static void gdn_layer(lilac_session *s, const lilac_layer *ly, int l, int T) {
    const lilac_config *c = &s->m->cfg;
    const cpu_qact *qa = quant(&s->qa_xn, s->xn, T, c->hidden);
    const cpu_mm in[4] = {mm(&ly->in_qkv, s->xn, qa, T, s->qkv), mm(&ly->in_z, s->xn, qa, T, s->z),
                          mm(&ly->in_b, s->xn, qa, T, s->bb), mm(&ly->in_a, s->xn, qa, T, s->ba)};
    cpu_mm_run(in, 4);
    layer_job j = {s, ly, l};
    cpu_pool_for(cfg_conv_dim(c), conv_channel, &j);
    /* parallel over heads and groups */
    cpu_pool_for_dynamic((int64_t)s->ngrp * c->lin_v_heads, gdn_head, &j);
    const cpu_qact *qo = quant(&s->qa_o, s->o, T, cfg_lin_val_dim(c));
    const cpu_mm out = mm(&ly->out_proj, s->o, qo, T, s->r);
    cpu_mm_run(&out, 1);
}

/* ---- gated attention ---------------------------------------------------- */

/* NeoX partial rotary on dims [0, rd): pairs (i, i + rd/2); inv_freq[i] =
 * theta^(-2i/rd), computed once per session. */
static void rope(float *x, int rd, int64_t pos, const float *inv_freq) {
    const int half = rd / 2;
    for (int i = 0; i < half; i++) {
        const float ang = (float)pos * inv_freq[i];
        const float cs = cosf(ang), sn = sinf(ang);
        const float a = x[i], b = x[i + half];
        x[i] = a * cs - b * sn;
        x[i + half] = b * cs + a * sn;
    }
}

typedef struct {
    lilac_session *s;
    int T;
    float *row_kc[CHUNK], *row_vc[CHUNK];
    int64_t row_pos[CHUNK], max_len;
    atomic_llong next; /* the next (row, head) item */
} attn_job;

/* Causal softmax attention, items (row t, head h) handed out one at a time. */
static void attn_part(void *c, int tid, int nth) {
    (void)tid, (void)nth;
    attn_job *j = c;
    lilac_session *s = j->s;
    const lilac_config *cf = &s->m->cfg;
    const int nh = cf->n_heads, nkv = cf->n_kv_heads, hd = cf->head_dim, grp = nh / nkv;
    const int64_t kvw = (int64_t)nkv * hd, qgw = 2 * (int64_t)nh * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *sc = NULL;
    for (int64_t it; (it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < (int64_t)j->T * nh;) {
        if (!sc) sc = xmalloc(sizeof(float) * (size_t)j->max_len);
        const int t = (int)(it / nh), h = (int)(it % nh);
        const float *q = s->qg + t * qgw + (int64_t)h * 2 * hd, *gate = q + hd;
        const float *kc = j->row_kc[t], *vc = j->row_vc[t];
        const int kh = h / grp;
        const int64_t n = j->row_pos[t] + 1; /* causal: keys 0..pos */
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            sc[i] = cpu_dot(q, kc + i * kvw + (int64_t)kh * hd, hd) * scale;
            if (sc[i] > mx) mx = sc[i];
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < n; i++) sum += (sc[i] = expf(sc[i] - mx));
        float *o = s->att + (int64_t)t * nh * hd + (int64_t)h * hd;
        for (int d = 0; d < hd; d++) o[d] = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            const float p = sc[i] / sum, *v = vc + i * kvw + (int64_t)kh * hd;
            for (int d = 0; d < hd; d++) o[d] += p * v[d];
        }
        for (int d = 0; d < hd; d++) o[d] *= cpu_sigmoid(gate[d]);
    }
    free(sc);
}

static void attn_layer(lilac_session *s, const lilac_layer *ly, int l, int T) {
    const lilac_config *c = &s->m->cfg;
    const int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    const int64_t kvw = (int64_t)nkv * hd, qgw = 2 * (int64_t)nh * hd;

    const cpu_qact *qa = quant(&s->qa_xn, s->xn, T, c->hidden);
    const cpu_mm in[3] = {mm(&ly->q_proj, s->xn, qa, T, s->qg), mm(&ly->k_proj, s->xn, qa, T, s->kx),
                          mm(&ly->v_proj, s->xn, qa, T, s->vx)};
    cpu_mm_run(in, 3);
    /* Per row: its session's cache and absolute position. */
    attn_job j = {.s = s, .T = T};
    float **row_kc = j.row_kc, **row_vc = j.row_vc;
    int64_t *row_pos = j.row_pos, max_len = 0;
    bool row_bf16[CHUNK];
    for (int gi = 0; gi < s->ngrp; gi++) {
        const rowgroup *g = &s->grp[gi];
        kv_reserve(g->s, g->s->pos + g->n);
        for (int t = 0; t < g->n; t++) {
            row_kc[g->t0 + t] = g->s->kcache[l];
            row_vc[g->t0 + t] = g->s->vcache[l];
            row_bf16[g->t0 + t] = g->s->kv_bf16;
            row_pos[g->t0 + t] = g->s->pos + t;
        }
        if (g->s->pos + g->n > max_len) max_len = g->s->pos + g->n;
    }

    for (int t = 0; t < T; t++) {
        const int64_t p = row_pos[t];
        float *kc = row_kc[t], *vc = row_vc[t];
        for (int h = 0; h < nh; h++) {
            float *q = s->qg + t * qgw + (int64_t)h * 2 * hd; /* [query | gate] per head */
            cpu_rmsnorm(q, q, ly->q_norm, hd, c->rms_eps);
            rope(q, c->rotary_dim, p, s->inv_freq);
        }
        for (int h = 0; h < nkv; h++) {
            float *k = kc + p * kvw + (int64_t)h * hd;
            cpu_rmsnorm(k, s->kx + t * kvw + (int64_t)h * hd, ly->k_norm, hd, c->rms_eps);
            rope(k, c->rotary_dim, p, s->inv_freq);
            float *v = vc + p * kvw + (int64_t)h * hd;
            memcpy(v, s->vx + t * kvw + (int64_t)h * hd, sizeof(float) * (size_t)hd);
            if (row_bf16[t])
                for (int i = 0; i < hd; i++) {
                    k[i] = bf16_to_f32(f32_to_bf16(k[i]));
                    v[i] = bf16_to_f32(f32_to_bf16(v[i]));
                }
        }
    }

    j.max_len = max_len;
    atomic_init(&j.next, 0);
    cpu_pool_run(attn_part, &j);
    const cpu_qact *qo = quant(&s->qa_att, s->att, T, (int64_t)nh * hd);
    const cpu_mm out = mm(&ly->o_proj, s->att, qo, T, s->r);
    cpu_mm_run(&out, 1);
}

/* ---- mixture of experts ------------------------------------------------- */

/* Replace token row ti (own top-k, best first) by the replayed ids ri; account the regret. */
static void replay_row(lilac_session *s, const float *p, int *ti, const int32_t *ri, int K) {
    const float pk = p[ti[K - 1]];
    float pmin = INFINITY;
    bool same = true;
    for (int k = 0; k < K; k++) {
        bool in = false;
        for (int j = 0; j < K; j++) in |= ti[j] == ri[k];
        same &= in;
        pmin = fminf(pmin, p[ri[k]]);
    }
    if (!same) {
        s->rt_differ++;
        if (pk > 0.0f && pmin < pk) s->rt_regret = fmax(s->rt_regret, ((double)pk - pmin) / pk);
    }
    for (int k = 0; k < K; k++) ti[k] = ri[k];
}

static void moe_layer(lilac_session *s, const lilac_layer *ly, int l, int T) {
    const lilac_config *c = &s->m->cfg;
    const int E = c->n_experts, K = c->top_k;
    const int64_t H = c->hidden, I = c->moe_inter, SI = c->shared_inter;
    /* this chunk's rows of the routing tables, if any */
    const int64_t rt_off = ((int64_t)l * s->rt_n + s->rt_t0) * K;
    int32_t *rec = s->rt_n && s->rt_rec ? s->rt_rec + rt_off : NULL;
    const int32_t *rep = s->rt_n && s->rt_rep ? s->rt_rep + rt_off : NULL;

    /* Router, shared expert gate, shared gate and up: one job on the normed rows. */
    const cpu_qact *qa = quant(&s->qa_xn, s->xn, T, H);
    const cpu_mm first[4] = {mm(&ly->router, s->xn, qa, T, s->router), mm(&ly->sh_expert_gate, s->xn, qa, T, s->sh_gate),
                             mm(&ly->sh_gate, s->xn, qa, T, s->sh_g), mm(&ly->sh_up, s->xn, qa, T, s->sh_u)};
    cpu_mm_run(first, 4);
    /* Router: softmax over all experts (f32), top-k (or the replayed ids), renormalise. */
    for (int t = 0; t < T; t++) {
        float *p = s->router + (int64_t)t * E;
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++) if (p[e] > mx) mx = p[e];
        for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - mx));
        for (int e = 0; e < E; e++) p[e] /= sum;
        int *ti = s->topi + t * K;
        float *tw = s->topw + t * K, tot = 0.0f;
        for (int k = 0; k < K; k++) { /* selection by repeated max; ties -> lowest index */
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int j = 0; j < k; j++) taken |= ti[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            ti[k] = best;
        }
        if (rec) for (int k = 0; k < K; k++) rec[t * K + k] = ti[k];
        if (rep && rep[t * K] >= 0) replay_row(s, p, ti, rep + t * K, K);
        for (int k = 0; k < K; k++) tot += tw[k] = p[ti[k]];
        if (c->norm_topk) for (int k = 0; k < K; k++) tw[k] /= tot;
    }

    /* Each expert runs once over the tokens routed to it: the rows gathered by expert (ascending), the gate
     * and up products of all experts as one job, the down products and the shared expert's as another. */
    if (s->moe_cap < T * K) {
        free(s->moe_x); free(s->moe_g); free(s->moe_u); free(s->moe_y); free(s->moe_wts); free(s->moe_rows);
        s->moe_cap = T * K;
        s->moe_wts = fbuf(T * K);
        s->moe_rows = xcalloc((size_t)(T * K), sizeof(int));
        s->moe_x = fbuf((int64_t)T * K * H); s->moe_y = fbuf((int64_t)T * K * H);
        s->moe_g = fbuf((int64_t)T * K * I); s->moe_u = fbuf((int64_t)T * K * I);
    }
    int *rows = s->moe_rows, *start = s->moe_start, *used = s->moe_used, nused = 0, tot = 0;
    float *wts = s->moe_wts;
    cpu_mm *items = s->moe_items;
    for (int e = 0; e < E; e++) {
        start[e] = tot;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (s->topi[t * K + k] == e) { rows[tot] = t; wts[tot] = s->topw[t * K + k]; tot++; }
        if (tot > start[e]) used[nused++] = e;
    }
    start[E] = tot;
    /* the f32 rows for the reference, the quantised ones for the fast kernels */
    if (!qa || !cpu_kernels_take(&ly->exp_gate) || !cpu_kernels_take(&ly->exp_up))
        for (int i = 0; i < tot; i++) memcpy(s->moe_x + i * H, s->xn + rows[i] * H, sizeof(float) * (size_t)H);
    cpu_qact *qm = NULL;
    if (qa) {
        qm = &s->qa_moe;
        cpu_qact_reserve(qm, tot, H);
        for (int i = 0; i < tot; i++) cpu_qact_copy_row(qm, i, qa, rows[i]);
    }
    for (int u = 0; u < nused; u++) {
        const int e = used[u], o = start[e], n = start[e + 1] - o;
        if (qm) s->moe_view[e] = qview(qm, o, n);
        const lilac_matrix g = lilac_mat_expert(&ly->exp_gate, e), up = lilac_mat_expert(&ly->exp_up, e);
        const cpu_qact *v = qm ? &s->moe_view[e] : NULL;
        items[2 * u] = mm(&g, s->moe_x + (int64_t)o * H, v, n, s->moe_g + (int64_t)o * I);
        items[2 * u + 1] = mm(&up, s->moe_x + (int64_t)o * H, v, n, s->moe_u + (int64_t)o * I);
    }
    cpu_mm_run(items, 2 * nused);
    for (int64_t i = 0; i < tot * I; i++) s->moe_g[i] = cpu_silu(s->moe_g[i]) * s->moe_u[i];
    for (int64_t i = 0; i < T * SI; i++) s->sh_g[i] = cpu_silu(s->sh_g[i]) * s->sh_u[i];
    const cpu_qact *qg = quant(&s->qa_moe_act, s->moe_g, tot, I), *qs = quant(&s->qa_sh, s->sh_g, T, SI);
    for (int u = 0; u < nused; u++) {
        const int e = used[u], o = start[e], n = start[e + 1] - o;
        if (qg) s->moe_view[e] = qview(qg, o, n);
        const lilac_matrix d = lilac_mat_expert(&ly->exp_down, e);
        items[u] = mm(&d, s->moe_g + (int64_t)o * I, qg ? &s->moe_view[e] : NULL, n, s->moe_y + (int64_t)o * H);
    }
    items[nused] = mm(&ly->sh_down, s->sh_g, qs, T, s->sh_y);
    cpu_mm_run(items, nused + 1);

    memset(s->r, 0, sizeof(float) * (size_t)(T * H));
    for (int i = 0; i < tot; i++)
        for (int64_t h = 0; h < H; h++) s->r[rows[i] * H + h] += wts[i] * s->moe_y[i * H + h];
    /* Shared expert, scaled by sigmoid(shared_expert_gate . x). */
    for (int t = 0; t < T; t++) {
        const float gs = cpu_sigmoid(s->sh_gate[t]);
        for (int64_t h = 0; h < H; h++) s->r[t * H + h] += gs * s->sh_y[t * H + h];
    }
}

/* ---- the forward pass --------------------------------------------------- */

static void forward_chunk(lilac_session *s, const int32_t *ids, int T, lilac_logits_mode mode, float *logits) {
    const lilac_model *m = s->m;
    const lilac_config *c = &m->cfg;
    const int64_t H = c->hidden;

    for (int t = 0; t < T; t++) lilac_mat_row(&m->embed, ids[t], s->x + t * H);

    for (int l = 0; l < c->n_layers; l++) {
        const lilac_layer *ly = &m->layers[l];
        for (int t = 0; t < T; t++) cpu_rmsnorm(s->xn + t * H, s->x + t * H, ly->in_norm, H, c->rms_eps);
        if (ly->is_full) attn_layer(s, ly, l, T);
        else gdn_layer(s, ly, l, T);
        for (int64_t i = 0; i < T * H; i++) s->x[i] += s->r[i];

        for (int t = 0; t < T; t++) cpu_rmsnorm(s->xn + t * H, s->x + t * H, ly->post_norm, H, c->rms_eps);
        moe_layer(s, ly, l, T);
        for (int64_t i = 0; i < T * H; i++) s->x[i] += s->r[i];
    }
    for (int gi = 0; gi < s->ngrp; gi++) s->grp[gi].s->pos += s->grp[gi].n;
    if (s->hid_t0 >= 0) /* hidden_record */
        for (int t = 0; t < T; t++)
            cpu_rmsnorm(s->hid_rec + (int64_t)(s->hid_t0 + t) * H, s->x + t * H, m->final_norm, H, c->rms_eps);

    if (mode == LOGITS_NONE) return;
    int first = mode == LOGITS_ALL ? 0 : T - 1;
    for (int t = first; t < T; t++) cpu_rmsnorm(s->xn + (t - first) * H, s->x + t * H, m->final_norm, H, c->rms_eps);
    const cpu_qact *qa = quant(&s->qa_xn, s->xn, T - first, H);
    const cpu_mm head = mm(&m->lm_head, s->xn, qa, T - first, logits);
    cpu_mm_run(&head, 1);
}

/* The routing tables fit a call of n tokens; a replay table's rows are -1 throughout or K distinct experts. */
static int check_route_tables(const lilac_session *s, int n, lilac_err *err) {
    const lilac_config *c = &s->m->cfg;
    const int K = c->top_k;
    if (s->rt_rec && n > s->rt_rec_cap)
        return lilac_fail(err, "forward: %d tokens exceed the routing record's %d", n, s->rt_rec_cap);
    if (!s->rt_rep) return 0;
    if (n > s->rt_rep_cap) return lilac_fail(err, "forward: %d tokens exceed the routing replay's %d", n, s->rt_rep_cap);
    for (int64_t r = 0; r < (int64_t)c->n_layers * n; r++) {
        const int32_t *ri = s->rt_rep + r * K;
        bool ok = true;
        for (int k = 0; k < K; k++) {
            if (ri[0] < 0) ok &= ri[k] == -1;
            else ok &= ri[k] >= 0 && ri[k] < c->n_experts;
            for (int j = 0; j < k && ri[0] >= 0; j++) ok &= ri[j] != ri[k];
        }
        if (!ok)
            return lilac_fail(err, "forward: routing replay row (layer %lld, token %lld) is not -1s or %d distinct experts",
                              (long long)(r / n), (long long)(r % n), K);
    }
    return 0;
}

static int cpu_forward(lilac_session *s, const int32_t *ids, int n, lilac_logits_mode mode, float *logits, lilac_err *err) {
    const lilac_config *c = &s->m->cfg;
    if (n <= 0) return lilac_fail(err, "forward: no tokens");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return lilac_fail(err, "token id %d at index %d is outside the vocabulary [0, %lld)", ids[i], i,
                              (long long)c->vocab);
    if (s->pos + n > s->max_seq)
        return lilac_fail(err, "context full: %lld + %d tokens exceed the maximum of %lld", (long long)s->pos, n,
                          (long long)s->max_seq);
    if (check_route_tables(s, n, err) < 0) return -1;
    if (s->hid_rec && n > s->hid_cap)
        return lilac_fail(err, "forward: %d tokens exceed the hidden-state record's %d", n, s->hid_cap);
    for (int done = 0; done < n;) {
        int T = n - done < CHUNK ? n - done : CHUNK;
        bool last = done + T == n;
        lilac_logits_mode cm = mode == LOGITS_ALL ? LOGITS_ALL : (last ? mode : LOGITS_NONE);
        float *out = mode == LOGITS_ALL ? logits + (int64_t)done * c->vocab : logits;
        s->ngrp = 1;
        s->grp[0] = (rowgroup){.s = s, .t0 = 0, .n = T};
        s->rt_n = n;
        s->rt_t0 = done;
        s->hid_t0 = s->hid_rec ? done : -1;
        forward_chunk(s, ids + done, T, cm, out);
        s->rt_n = 0;
        s->hid_t0 = -1;
        done += T;
    }
    return 0;
}

/* ---- batched decode step and snapshots ------------------------------------ */

static int cpu_forward_batch(lilac_session **ss, const int32_t *ids, int n, float *logits, lilac_err *err) {
    if (n <= 0) return lilac_fail(err, "forward_batch: no sessions");
    const lilac_config *c = &ss[0]->m->cfg;
    for (int i = 0; i < n; i++) {
        if (ss[i]->m != ss[0]->m) return lilac_fail(err, "forward_batch: sessions of different models");
        for (int j = 0; j < i; j++)
            if (ss[j] == ss[i]) return lilac_fail(err, "forward_batch: session %d appears twice", i);
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return lilac_fail(err, "token id %d (session %d) is outside the vocabulary [0, %lld)", ids[i], i,
                              (long long)c->vocab);
        if (ss[i]->pos + 1 > ss[i]->max_seq) return lilac_fail(err, "context full in session %d", i);
    }
    for (int done = 0; done < n; done += CHUNK) {
        const int T = n - done < CHUNK ? n - done : CHUNK;
        lilac_session *lead = ss[done];
        lead->rt_n = 0; /* routing tables are per session: not for a batch */
        lead->ngrp = T;
        for (int i = 0; i < T; i++) lead->grp[i] = (rowgroup){.s = ss[done + i], .t0 = i, .n = 1};
        forward_chunk(lead, ids + done, T, LOGITS_ALL, logits + (int64_t)done * c->vocab);
    }
    return 0;
}

struct lilac_snapshot {
    int64_t pos;
    size_t bytes;
    float *data; /* per GDN layer: conv window, then recurrent state */
};

static size_t gdn_floats(const lilac_config *c) {
    return (size_t)((c->conv_kernel - 1) * cfg_conv_dim(c)) + (size_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
}

/* Copy every GDN layer's conv window and recurrent state to (save) or from d. */
static void copy_state(lilac_session *s, float *d, bool save) {
    const lilac_config *c = &s->m->cfg;
    const size_t per = gdn_floats(c), nconv = (size_t)((c->conv_kernel - 1) * cfg_conv_dim(c));
    for (int l = 0; l < c->n_layers; l++) {
        if (c->is_full[l]) continue;
        float *parts[2] = {s->conv_state[l], s->ssm[l]};
        const size_t sizes[2] = {nconv, per - nconv};
        for (int k = 0; k < 2; k++) {
            if (save) memcpy(d, parts[k], sizeof(float) * sizes[k]);
            else memcpy(parts[k], d, sizeof(float) * sizes[k]);
            d += sizes[k];
        }
    }
}

static lilac_snapshot *cpu_snapshot(lilac_session *s, lilac_err *err) {
    const lilac_config *c = &s->m->cfg;
    const size_t per = gdn_floats(c);
    int n_lin = 0;
    for (int l = 0; l < c->n_layers; l++) n_lin += !c->is_full[l];
    lilac_snapshot *snap = calloc(1, sizeof *snap);
    float *d = malloc(sizeof(float) * (per * (size_t)n_lin + 1));
    if (!snap || !d) {
        free(snap);
        free(d);
        lilac_fail(err, "snapshot: out of memory");
        return NULL;
    }
    snap->pos = s->pos;
    snap->data = d;
    snap->bytes = sizeof(float) * per * (size_t)n_lin;
    copy_state(s, d, true);
    return snap;
}

static int cpu_restore(lilac_session *s, const lilac_snapshot *snap, lilac_err *err) {
    if (snap->pos > s->pos) return lilac_fail(err, "restore: snapshot at %lld is ahead of the session (%lld)",
                                              (long long)snap->pos, (long long)s->pos);
    copy_state(s, snap->data, false);
    s->pos = snap->pos;
    if (s->mtp) cpu_mtp_truncate(s->mtp, snap->pos);
    return 0;
}

static void cpu_snapshot_free(lilac_snapshot *snap) {
    if (!snap) return;
    free(snap->data);
    free(snap);
}
static int64_t cpu_snapshot_pos(const lilac_snapshot *snap) { return snap->pos; }
static size_t cpu_snapshot_bytes(const lilac_snapshot *snap) { return snap->bytes; }

static int cpu_decode_greedy(lilac_session *s, int32_t first, int max_new, bool (*on_token)(void *, int32_t), void *ud,
                             lilac_err *err) {
    return lilac_decode_greedy_generic(&lilac_backend_cpu, s, s->m->cfg.vocab, first, max_new, on_token, ud, err);
}

static void cpu_set_kv_bf16(lilac_session *s, bool on) { s->kv_bf16 = on; }

static void cpu_route_record(lilac_session *s, int32_t *ids, int cap) {
    s->rt_rec = ids;
    s->rt_rec_cap = ids ? cap : 0;
}

static void cpu_route_replay(lilac_session *s, const int32_t *ids, int cap) {
    s->rt_rep = ids;
    s->rt_rep_cap = ids ? cap : 0;
    s->rt_regret = 0;
    s->rt_differ = 0;
}

static double cpu_route_regret(const lilac_session *s, int64_t *differ) {
    if (differ) *differ = s->rt_differ;
    return s->rt_regret;
}

const lilac_backend lilac_backend_cpu = {
    .name = "cpu",
    .session_new = cpu_session_new,
    .session_free = cpu_session_free,
    .session_reset = cpu_session_reset,
    .session_pos = cpu_session_pos,
    .forward = cpu_forward,
    .decode_greedy = cpu_decode_greedy,
    .snapshot = cpu_snapshot,
    .restore = cpu_restore,
    .snapshot_free = cpu_snapshot_free,
    .snapshot_pos = cpu_snapshot_pos,
    .snapshot_bytes = cpu_snapshot_bytes,
    .forward_batch = cpu_forward_batch,
    .set_kv_bf16 = cpu_set_kv_bf16,
    .route_record = cpu_route_record,
    .route_replay = cpu_route_replay,
    .route_regret = cpu_route_regret,
    .kv_bytes = 4, /* f32 (set_kv_bf16 rounds the values, the cache stays f32) */
    .mtp = &cpu_mtp_ops,
};

/* ---- hooks of the MTP head (cpu_mtp.h) ------------------------------------ */

cpu_mtp **cpu_session_mtp(lilac_session *s) { return &s->mtp; }
const lilac_model *cpu_session_model(const lilac_session *s) { return s->m; }
int64_t cpu_session_max_seq(const lilac_session *s) { return s->max_seq; }

void cpu_hidden_record(lilac_session *s, float *hidden, int cap) {
    s->hid_rec = hidden;
    s->hid_cap = hidden ? cap : 0;
}

void cpu_mtp_layer(lilac_session *s, const lilac_layer *ly, float *x, int T, int64_t pos) {
    const lilac_config *c = &s->m->cfg;
    const int64_t H = c->hidden, saved = s->pos;
    s->pos = pos; /* attn_layer places the rows at s->pos.. */
    s->ngrp = 1;
    s->grp[0] = (rowgroup){.s = s, .t0 = 0, .n = T};
    s->rt_n = 0;
    for (int t = 0; t < T; t++) cpu_rmsnorm(s->xn + t * H, x + t * H, ly->in_norm, H, c->rms_eps);
    attn_layer(s, ly, c->n_layers, T);
    for (int64_t i = 0; i < T * H; i++) x[i] += s->r[i];
    for (int t = 0; t < T; t++) cpu_rmsnorm(s->xn + t * H, x + t * H, ly->post_norm, H, c->rms_eps);
    moe_layer(s, ly, c->n_layers, T);
    for (int64_t i = 0; i < T * H; i++) x[i] += s->r[i];
    s->pos = saved;
}
