/* weights.c — map every text tensor of a checkpoint into lilac_model, checking
 * presence, dtype and shape against the config. Both layouts (weights.h). */
#include "weights.h"

#include <omp.h>

#include "quantize.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- matrices ---------------------------------------------------------- */

lilac_matrix lilac_mat_expert(const lilac_matrix *m, int e) {
    lilac_matrix v = *m;
    int64_t r0 = (int64_t)e * m->expert_rows_stride;
    v.n_experts = 1;
    if (m->type == MAT_AFFINE) {
        v.q += r0 * (m->cols * m->bits / 32);
        v.scales += r0 * (m->cols / m->group);
        v.biases += r0 * (m->cols / m->group);
    } else {
        v.w += r0 * m->cols;
    }
    return v;
}

size_t lilac_mat_bytes(const lilac_matrix *m) {
    size_t rows = (size_t)m->rows * (size_t)m->n_experts;
    if (m->type == MAT_AFFINE)
        return rows * ((size_t)m->cols * (size_t)m->bits / 8 + 2 * 2 * (size_t)(m->cols / m->group));
    return rows * (size_t)m->cols * 2;
}

/* Dequantise one row of `bits`-bit codes; bits is a compile-time constant in
 * each caller below, so the unpacking unrolls and vectorises. */
static inline void row_affine(const uint32_t *q, const uint16_t *sc, const uint16_t *bi, int64_t cols, int group,
                              int bits, float *out) {
    const int per_word = 32 / bits;
    const uint32_t mask = (1u << bits) - 1u;
    const int64_t ngroups = cols / group, wpg = group / per_word;
    for (int64_t g = 0; g < ngroups; g++) {
        const float s = bf16_to_f32(sc[g]), b = bf16_to_f32(bi[g]);
        const uint32_t *qg = q + g * wpg;
        float *o = out + g * group;
        for (int64_t wi = 0; wi < wpg; wi++)
            for (int j = 0; j < per_word; j++) o[wi * per_word + j] = s * (float)((qg[wi] >> (j * bits)) & mask) + b;
    }
}

void lilac_mat_row(const lilac_matrix *m, int64_t r, float *out) {
    if (m->type == MAT_BF16) {
        const uint16_t *w = m->w + r * m->cols;
        for (int64_t c = 0; c < m->cols; c++) out[c] = bf16_to_f32(w[c]);
        return;
    }
    const int64_t ngroups = m->cols / m->group;
    const uint32_t *q = m->q + r * (m->cols * m->bits / 32);
    const uint16_t *sc = m->scales + r * ngroups, *bi = m->biases + r * ngroups;
    if (m->bits == 4) row_affine(q, sc, bi, m->cols, m->group, 4, out);
    else row_affine(q, sc, bi, m->cols, m->group, 8, out);
}

/* ---- loader ------------------------------------------------------------- */

/* A heap buffer the model owns (freed with it; backends see it like a tensor). */
static void *own(lilac_model *m, size_t n) {
    void *p = xmalloc(n ? n : 1);
    m->owned = xrealloc(m->owned, sizeof(void *) * (size_t)(m->n_owned + 1));
    m->owned_bytes = xrealloc(m->owned_bytes, sizeof(size_t) * (size_t)(m->n_owned + 1));
    m->owned[m->n_owned] = p;
    m->owned_bytes[m->n_owned++] = n;
    return p;
}

/* The tensor's data, or an aligned copy the model owns when the file placed it
 * at an address not aligned to its element size (safetensors allows any offset;
 * the kernels read whole elements). */
static const void *aligned_data(lilac_model *m, const st_tensor *t) {
    const size_t es = st_dtype_size(t->dtype);
    if (es <= 1 || (uintptr_t)t->data % es == 0) return t->data;
    void *p = own(m, t->nbytes);
    memcpy(p, t->data, t->nbytes);
    return p;
}

typedef struct {
    lilac_model *m;
    bool *used;          /* per st tensor: consumed by the loader */
    lilac_err *err;
    size_t total_bytes;
} loader;

static const char *shard_name(const loader *L, const st_tensor *t) {
    const char *p = L->m->st.shards[t->shard].path, *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Find `name`, check dtype and shape; mark it used. */
static const st_tensor *need(loader *L, const char *name, st_dtype dt, int ndim, const int64_t *shape) {
    const st_tensor *t = st_find(&L->m->st, name);
    if (!t) {
        lilac_fail(L->err, "%s: tensor \"%s\" is missing", L->m->dir, name);
        return NULL;
    }
    if (t->dtype != dt) {
        lilac_fail(L->err, "%s: tensor \"%s\": dtype %s, expected %s", shard_name(L, t), name,
                   st_dtype_name(t->dtype), st_dtype_name(dt));
        return NULL;
    }
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char a[128], b[128];
        shape_str(a, sizeof a, t->ndim, t->shape);
        shape_str(b, sizeof b, ndim, shape);
        lilac_fail(L->err, "%s: tensor \"%s\": shape %s, expected %s (from config.json)", shard_name(L, t), name, a, b);
        return NULL;
    }
    L->used[t - L->m->st.tensors] = true;
    L->total_bytes += t->nbytes;
    return t;
}

/* A matrix stored as `base`.weight (+ .scales/.biases when quantized).
 * n_exp > 0: a stacked [n_exp, rows, cols] tensor. `module` names the module
 * for the per-module quantization override lookup. `wname` overrides the
 * weight tensor name (HF fused experts have no ".weight" suffix). */
static int load_matrix(loader *L, lilac_matrix *out, const char *base, const char *wname, int n_exp, int64_t rows,
                       int64_t cols) {
    char name[256], sname[256], bname[256];
    snprintf(name, sizeof name, "%s", wname ? wname : base);
    if (!wname) snprintf(name, sizeof name, "%s.weight", base);
    snprintf(sname, sizeof sname, "%s.scales", base);
    snprintf(bname, sizeof bname, "%s.biases", base);
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    out->n_experts = n_exp ? n_exp : 1;
    out->expert_rows_stride = rows;
    int nd = n_exp ? 3 : 2;
    int64_t shape[3];
    int k = 0;
    if (n_exp) shape[k++] = n_exp;
    shape[k] = rows;
    if (st_find(&L->m->st, sname)) {
        int bits, group;
        lilac_config_quant_for(&L->m->cfg, base, &bits, &group);
        if (bits != 4 && bits != 8)
            return lilac_fail(L->err, "%s: quantization bits %d for \"%s\" unsupported (lilac reads 4 and 8)", L->m->dir,
                              bits, base);
        if (cols % group || cols % (32 / bits))
            return lilac_fail(L->err, "%s: \"%s\": in_features %lld not divisible by group_size %d", L->m->dir, base,
                              (long long)cols, group);
        out->type = MAT_AFFINE;
        out->bits = bits;
        out->group = group;
        shape[k + 1] = cols * bits / 32;
        const st_tensor *w = need(L, name, ST_U32, nd, shape);
        if (!w) return -1;
        shape[k + 1] = cols / group;
        const st_tensor *s = need(L, sname, ST_BF16, nd, shape);
        if (!s) return -1;
        const st_tensor *b = need(L, bname, ST_BF16, nd, shape);
        if (!b) return -1;
        out->q = aligned_data(L->m, w);
        out->scales = aligned_data(L->m, s);
        out->biases = aligned_data(L->m, b);
    } else {
        out->type = MAT_BF16;
        shape[k + 1] = cols;
        const st_tensor *w = need(L, name, ST_BF16, nd, shape);
        if (!w) return -1;
        out->w = aligned_data(L->m, w);
    }
    return 0;
}

/* A small vector [n] (BF16 or F32) converted to f32; `add_one` turns a
 * zero-centred norm weight w into its gain 1+w (HF layout). */
static float *load_vec(loader *L, const char *name, int64_t n, int64_t n2, bool add_one) {
    const st_tensor *t = st_find(&L->m->st, name);
    if (!t) {
        lilac_fail(L->err, "%s: tensor \"%s\" is missing", L->m->dir, name);
        return NULL;
    }
    st_dtype dt = t->dtype == ST_F32 ? ST_F32 : ST_BF16;
    int64_t shape[3] = {n, n2, 1};
    int nd = n2 ? 2 : 1;
    if (n2 == -1) { /* conv1d: MLX [C,K,1] or HF [C,1,K] */
        const lilac_config *c = &L->m->cfg;
        nd = 3;
        if (L->m->layout == LAYOUT_MLX) { shape[1] = c->conv_kernel; shape[2] = 1; }
        else { shape[1] = 1; shape[2] = c->conv_kernel; }
    }
    if (!need(L, name, dt, nd, shape)) return NULL;
    int64_t count = (int64_t)(t->nbytes / st_dtype_size(dt));
    float *v = xmalloc(sizeof(float) * (size_t)count);
    for (int64_t i = 0; i < count; i++) {
        float x;
        if (dt == ST_F32) memcpy(&x, (const char *)t->data + 4 * i, 4);
        else {
            uint16_t h;
            memcpy(&h, (const char *)t->data + 2 * i, 2);
            x = bf16_to_f32(h);
        }
        v[i] = add_one ? 1.0f + x : x;
    }
    return v;
}

static bool skipped_name(const char *n) {
    return !strncmp(n, "vision_tower.", 13) || !strncmp(n, "model.visual.", 13) || !strncmp(n, "mtp.", 4) ||
           strstr(n, ".mtp.") != NULL || !strncmp(n, "language_model.mtp", 18) || !strncmp(n, "model.mtp", 9);
}

#define TRY(x) do { if ((x) < 0) return -1; } while (0)
#define TRYP(p, x) do { if (!((p) = (x))) return -1; } while (0)

static int load_layer(loader *L, int i) {
    lilac_model *m = L->m;
    const lilac_config *c = &m->cfg;
    lilac_layer *ly = &m->layers[i];
    const bool hf = m->layout == LAYOUT_HF;
    const int64_t H = c->hidden;
    char p[160], n[256], n2[256];
    snprintf(p, sizeof p, hf ? "model.language_model.layers.%d" : "language_model.model.layers.%d", i);
    ly->is_full = c->is_full[i];

    snprintf(n, sizeof n, "%s.input_layernorm.weight", p);
    TRYP(ly->in_norm, load_vec(L, n, H, 0, hf));
    snprintf(n, sizeof n, "%s.post_attention_layernorm.weight", p);
    TRYP(ly->post_norm, load_vec(L, n, H, 0, hf));

    if (!ly->is_full) {
        const int64_t conv = cfg_conv_dim(c), vd = cfg_lin_val_dim(c);
        snprintf(n, sizeof n, "%s.linear_attn.in_proj_qkv", p);
        TRY(load_matrix(L, &ly->in_qkv, n, NULL, 0, conv, H));
        snprintf(n, sizeof n, "%s.linear_attn.in_proj_z", p);
        TRY(load_matrix(L, &ly->in_z, n, NULL, 0, vd, H));
        snprintf(n, sizeof n, "%s.linear_attn.in_proj_b", p);
        TRY(load_matrix(L, &ly->in_b, n, NULL, 0, c->lin_v_heads, H));
        snprintf(n, sizeof n, "%s.linear_attn.in_proj_a", p);
        TRY(load_matrix(L, &ly->in_a, n, NULL, 0, c->lin_v_heads, H));
        snprintf(n, sizeof n, "%s.linear_attn.out_proj", p);
        TRY(load_matrix(L, &ly->out_proj, n, NULL, 0, H, vd));
        snprintf(n, sizeof n, "%s.linear_attn.conv1d.weight", p);
        TRYP(ly->conv, load_vec(L, n, conv, -1, false));
        snprintf(n, sizeof n, "%s.linear_attn.A_log", p);
        TRYP(ly->A_log, load_vec(L, n, c->lin_v_heads, 0, false));
        snprintf(n, sizeof n, "%s.linear_attn.dt_bias", p);
        TRYP(ly->dt_bias, load_vec(L, n, c->lin_v_heads, 0, false));
        snprintf(n, sizeof n, "%s.linear_attn.norm.weight", p);
        TRYP(ly->gdn_norm, load_vec(L, n, c->lin_v_dim, 0, false));
    } else {
        const int64_t hd = c->head_dim;
        snprintf(n, sizeof n, "%s.self_attn.q_proj", p);
        TRY(load_matrix(L, &ly->q_proj, n, NULL, 0, 2 * c->n_heads * hd, H));
        snprintf(n, sizeof n, "%s.self_attn.k_proj", p);
        TRY(load_matrix(L, &ly->k_proj, n, NULL, 0, c->n_kv_heads * hd, H));
        snprintf(n, sizeof n, "%s.self_attn.v_proj", p);
        TRY(load_matrix(L, &ly->v_proj, n, NULL, 0, c->n_kv_heads * hd, H));
        snprintf(n, sizeof n, "%s.self_attn.o_proj", p);
        TRY(load_matrix(L, &ly->o_proj, n, NULL, 0, H, c->n_heads * hd));
        snprintf(n, sizeof n, "%s.self_attn.q_norm.weight", p);
        TRYP(ly->q_norm, load_vec(L, n, hd, 0, hf));
        snprintf(n, sizeof n, "%s.self_attn.k_norm.weight", p);
        TRYP(ly->k_norm, load_vec(L, n, hd, 0, hf));
    }

    const int64_t I = c->moe_inter, E = c->n_experts, S = c->shared_inter;
    snprintf(n, sizeof n, "%s.mlp.gate", p);
    TRY(load_matrix(L, &ly->router, n, NULL, 0, E, H));
    snprintf(n, sizeof n, "%s.mlp.shared_expert.gate_proj", p);
    TRY(load_matrix(L, &ly->sh_gate, n, NULL, 0, S, H));
    snprintf(n, sizeof n, "%s.mlp.shared_expert.up_proj", p);
    TRY(load_matrix(L, &ly->sh_up, n, NULL, 0, S, H));
    snprintf(n, sizeof n, "%s.mlp.shared_expert.down_proj", p);
    TRY(load_matrix(L, &ly->sh_down, n, NULL, 0, H, S));
    snprintf(n, sizeof n, "%s.mlp.shared_expert_gate", p);
    TRY(load_matrix(L, &ly->sh_expert_gate, n, NULL, 0, 1, H));
    if (hf) {
        /* Fused [E, 2I, H]: rows 0..I-1 gate, I..2I-1 up. */
        snprintf(n, sizeof n, "%s.mlp.experts", p);
        snprintf(n2, sizeof n2, "%s.mlp.experts.gate_up_proj", p);
        TRY(load_matrix(L, &ly->exp_gate, n, n2, (int)E, 2 * I, H));
        ly->exp_gate.rows = I;
        ly->exp_gate.expert_rows_stride = 2 * I;
        ly->exp_up = ly->exp_gate;
        ly->exp_up.w += I * H;
        snprintf(n2, sizeof n2, "%s.mlp.experts.down_proj", p);
        TRY(load_matrix(L, &ly->exp_down, n, n2, (int)E, H, I));
    } else {
        snprintf(n, sizeof n, "%s.mlp.switch_mlp.gate_proj", p);
        TRY(load_matrix(L, &ly->exp_gate, n, NULL, (int)E, I, H));
        snprintf(n, sizeof n, "%s.mlp.switch_mlp.up_proj", p);
        TRY(load_matrix(L, &ly->exp_up, n, NULL, (int)E, I, H));
        snprintf(n, sizeof n, "%s.mlp.switch_mlp.down_proj", p);
        TRY(load_matrix(L, &ly->exp_down, n, NULL, (int)E, H, I));
    }
    return 0;
}

int lilac_model_load(lilac_model *m, const char *dir, lilac_err *err) {
    memset(m, 0, sizeof *m);
    m->dir = xstrdup(dir);
    if (lilac_config_load(&m->cfg, dir, err) < 0) goto fail;
    if (st_open_dir(&m->st, dir, err) < 0) goto fail;
    const lilac_config *c = &m->cfg;
    if (st_find(&m->st, "language_model.model.embed_tokens.weight")) m->layout = LAYOUT_MLX;
    else if (st_find(&m->st, "model.language_model.embed_tokens.weight")) m->layout = LAYOUT_HF;
    else {
        lilac_fail(err, "%s: no embedding tensor (expected \"language_model.model.embed_tokens.weight\" (MLX) or "
                        "\"model.language_model.embed_tokens.weight\" (HF))", dir);
        goto fail;
    }
    loader L = {.m = m, .used = xcalloc((size_t)m->st.n_tensors, sizeof(bool)), .err = err};
    const bool hf = m->layout == LAYOUT_HF;
    int rc = load_matrix(&L, &m->embed, hf ? "model.language_model.embed_tokens" : "language_model.model.embed_tokens",
                         NULL, 0, c->vocab, c->hidden);
    if (rc == 0) {
        if (c->tie_embeddings) m->lm_head = m->embed;
        else rc = load_matrix(&L, &m->lm_head, hf ? "lm_head" : "language_model.lm_head", NULL, 0, c->vocab, c->hidden);
    }
    if (rc == 0) {
        m->final_norm = load_vec(&L, hf ? "model.language_model.norm.weight" : "language_model.model.norm.weight",
                                 c->hidden, 0, hf);
        if (!m->final_norm) rc = -1;
    }
    if (rc == 0) {
        m->layers = xcalloc((size_t)c->n_layers, sizeof(lilac_layer));
        for (int i = 0; i < c->n_layers && rc == 0; i++) rc = load_layer(&L, i);
    }
    for (int i = 0; rc == 0 && i < m->st.n_tensors; i++) {
        const st_tensor *t = &m->st.tensors[i];
        if (L.used[i]) continue;
        if (skipped_name(t->name)) {
            m->n_skipped++;
            continue;
        }
        rc = lilac_fail(err, "%s: unexpected tensor \"%s\" (not part of a %d-layer qwen3_5_moe text model)",
                        shard_name(&L, t), t->name, c->n_layers);
    }
    free(L.used);
    if (rc == 0) return 0;
fail:
    lilac_model_free(m);
    return -1;
}

/* ---- quantization at load ---------------------------------------------------- */


static int quantize_mat(lilac_model *m, lilac_matrix *x, int bits, const char *what, lilac_err *err) {
    if (x->type != MAT_BF16 || x->rows == 0) return 0;
    const int group = 64;
    const int64_t R = x->rows, C = x->cols, E = x->n_experts, wpr = C * bits / 32, gpr = C / group;
    if (C % group) return lilac_fail(err, "%s: %lld columns, not a multiple of the group size %d", what, (long long)C, group);
    uint32_t *q = own(m, sizeof(uint32_t) * (size_t)(E * R * wpr));
    uint16_t *sc = own(m, sizeof(uint16_t) * (size_t)(E * R * gpr)), *bi = own(m, sizeof(uint16_t) * (size_t)(E * R * gpr));
    const int64_t RB = 64, nblk = (R + RB - 1) / RB;
    int64_t bad_at = -1;
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t u = 0; u < E * nblk; u++) {
        const int64_t e = u / nblk, r0 = (u % nblk) * RB, n = R - r0 < RB ? R - r0 : RB;
        const lilac_matrix v = lilac_mat_expert(x, (int)e);
        const int64_t o = e * R + r0;
        int64_t bad = lilac_affine_quantize_bf16(v.w + r0 * C, n, C, bits, group, q + o * wpr, sc + o * gpr, bi + o * gpr);
        if (bad >= 0) {
#pragma omp critical
            bad_at = o * C + bad;
        }
    }
    if (bad_at >= 0) return lilac_fail(err, "%s: non-finite weight at element %lld", what, (long long)bad_at);
    x->type = MAT_AFFINE;
    x->bits = bits;
    x->group = group;
    x->q = q;
    x->scales = sc;
    x->biases = bi;
    x->w = NULL;
    x->expert_rows_stride = R;
    return 0;
}

static void round_gain(float *g, int64_t n) {
    for (int64_t i = 0; g && i < n; i++) g[i] = bf16_to_f32(f32_to_bf16(g[i]));
}

int lilac_model_quantize(lilac_model *m, lilac_err *err) {
    if (m->layout != LAYOUT_HF) return 0;
    const lilac_config *c = &m->cfg;
    char what[96];
    if (quantize_mat(m, &m->embed, 4, "embed_tokens", err) < 0) return -1;
    if (c->tie_embeddings) m->lm_head = m->embed;
    else if (quantize_mat(m, &m->lm_head, 4, "lm_head", err) < 0) return -1;
    round_gain(m->final_norm, c->hidden);
    for (int l = 0; l < c->n_layers; l++) {
        lilac_layer *y = &m->layers[l];
        struct { lilac_matrix *mat; int bits; const char *name; } mats[] = {
            {&y->in_qkv, 4, "in_proj_qkv"}, {&y->in_z, 4, "in_proj_z"}, {&y->in_b, 4, "in_proj_b"},
            {&y->in_a, 4, "in_proj_a"}, {&y->out_proj, 4, "out_proj"}, {&y->q_proj, 4, "q_proj"},
            {&y->k_proj, 4, "k_proj"}, {&y->v_proj, 4, "v_proj"}, {&y->o_proj, 4, "o_proj"},
            {&y->router, 8, "mlp.gate"}, {&y->exp_gate, 4, "experts (gate)"}, {&y->exp_up, 4, "experts (up)"},
            {&y->exp_down, 4, "experts.down_proj"}, {&y->sh_gate, 4, "shared_expert.gate_proj"},
            {&y->sh_up, 4, "shared_expert.up_proj"}, {&y->sh_down, 4, "shared_expert.down_proj"},
            {&y->sh_expert_gate, 8, "shared_expert_gate"},
        };
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            snprintf(what, sizeof what, "layer %d %s", l, mats[i].name);
            if (quantize_mat(m, mats[i].mat, mats[i].bits, what, err) < 0) return -1;
        }
        round_gain(y->in_norm, c->hidden);
        round_gain(y->post_norm, c->hidden);
        if (y->is_full) {
            round_gain(y->q_norm, c->head_dim);
            round_gain(y->k_norm, c->head_dim);
        }
    }
    return 0;
}

void lilac_model_free(lilac_model *m) {
    if (m->layers) {
        for (int i = 0; i < m->cfg.n_layers; i++) {
            lilac_layer *l = &m->layers[i];
            free(l->in_norm); free(l->post_norm); free(l->conv); free(l->A_log);
            free(l->dt_bias); free(l->gdn_norm); free(l->q_norm); free(l->k_norm);
        }
        free(m->layers);
    }
    free(m->final_norm);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->owned_bytes);
    st_close(&m->st);
    lilac_config_free(&m->cfg);
    free(m->dir);
    memset(m, 0, sizeof *m);
}
