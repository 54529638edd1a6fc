/* weights.c — map every text tensor of a checkpoint into lilac_model, checking
 * presence, dtype and shape against the config. Both layouts (weights.h). */
#include "weights.h"

#include <omp.h>

#include "quantize.h"
#include "tensors.h"

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
    bool infer_bits;     /* quantized matrices: bits and group from the shapes (the MTP sidecar is not in config.json) */
} loader;

static const char *shard_name(const loader *L, const st_tensor *t) {
    const char *p = L->m->st.shards[t->shard].path, *s = strrchr(p, '/');
    return s ? s + 1 : p;
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
        lilac_shape_str(a, sizeof a, t->ndim, t->shape);
        lilac_shape_str(b, sizeof b, ndim, shape);
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
    const st_tensor *st_s = st_find(&L->m->st, sname), *st_w = st_find(&L->m->st, name);
    if (st_s) {
        int bits, group;
        lilac_config_quant_for(&L->m->cfg, base, &bits, &group);
        if (L->infer_bits && st_w && st_w->ndim == nd && st_s->ndim == nd && st_s->shape[nd - 1] > 0) {
            bits = (int)(st_w->shape[nd - 1] * 32 / cols);
            group = (int)(cols / st_s->shape[nd - 1]);
            if (group <= 0 || st_w->shape[nd - 1] * 32 != bits * cols || group * st_s->shape[nd - 1] != cols)
                return lilac_fail(L->err, "%s: \"%s\": shapes of .weight and .scales do not fit %lld columns", L->m->dir,
                                  base, (long long)cols);
        }
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

/* Qwen3.5's per-expert MTP tensors PREFIX"mlp.experts.E.LEAF.weight" [rows, cols], stacked into
 * one [E, rows, cols] copy the model owns. */
static int load_experts_split(loader *L, lilac_matrix *x, const char *prefix, const lilac_layer_tensor *t, int64_t rows,
                              int64_t cols) {
    const int E = L->m->cfg.n_experts;
    const char *leaf = strrchr(t->name, '.') + 1; /* gate_proj, up_proj, down_proj */
    const size_t per = (size_t)(rows * cols);
    uint16_t *w = own(L->m, per * (size_t)E * 2);
    for (int e = 0; e < E; e++) {
        char n[256];
        snprintf(n, sizeof n, "%smlp.experts.%d.%s.weight", prefix, e, leaf);
        const int64_t shape[2] = {rows, cols};
        const st_tensor *st = need(L, n, ST_BF16, 2, shape);
        if (!st) return -1;
        memcpy(w + per * (size_t)e, st->data, per * 2);
    }
    *x = (lilac_matrix){.type = MAT_BF16, .rows = rows, .cols = cols, .w = w, .n_experts = E, .expert_rows_stride = rows};
    return 0;
}

/* The tensors of one decoder layer, as the table (tensors.h) lists them, named PREFIX + the HF or MLX
 * name; per_expert: HF experts stored one tensor per expert (Qwen3.5's MTP head). */
static int load_layer_tensors(loader *L, lilac_layer *ly, const char *prefix, bool hf, bool per_expert) {
    const lilac_config *c = &L->m->cfg;
    for (int k = 0; k < lilac_n_layer_tensors; k++) {
        const lilac_layer_tensor *t = &lilac_layer_tensors[k];
        if (!(t->layers & (ly->is_full ? TL_ATTN : TL_GDN))) continue;
        const int64_t rows = lilac_dim_size(c, t->rows), cols = lilac_dim_size(c, t->cols);
        char n[256];
        snprintf(n, sizeof n, "%s%s", prefix, hf && t->hf ? t->hf : t->name);
        if (!lilac_tensor_is_matrix(t)) {
            TRYP(*lilac_layer_vec(ly, t), load_vec(L, n, rows, t->kind == TK_CONV ? -1 : 0, hf && t->kind == TK_GAIN));
            continue;
        }
        lilac_matrix *x = lilac_layer_mat(ly, t);
        const int n_exp = t->kind == TK_EXPERTS ? c->n_experts : 0;
        if (hf && per_expert && t->kind == TK_EXPERTS) {
            TRY(load_experts_split(L, x, prefix, t, rows, cols));
            continue;
        }
        if (!hf || t->hf_parts < 2) {
            TRY(load_matrix(L, x, n, hf && t->hf ? n : NULL, n_exp, rows, cols));
            continue;
        }
        /* HF fuses these experts' matrices ([E, parts*rows, cols]): part 0 maps the tensor, each
         * later part is a view of it `part` blocks of rows further on. */
        if (t->hf_part == 0) {
            TRY(load_matrix(L, x, n, n, n_exp, (int64_t)t->hf_parts * rows, cols));
            x->rows = rows;
            x->expert_rows_stride = (int64_t)t->hf_parts * rows;
        } else {
            *x = *lilac_layer_mat(ly, t - t->hf_part);
            x->w += (int64_t)t->hf_part * rows * cols;
        }
    }
    return 0;
}

static int load_layer(loader *L, int i) {
    lilac_model *m = L->m;
    lilac_layer *ly = &m->layers[i];
    ly->is_full = m->cfg.is_full[i];
    char prefix[64];
    snprintf(prefix, sizeof prefix, m->layout == LAYOUT_HF ? LILAC_HF_LAYER : LILAC_MLX_LAYER, i);
    return load_layer_tensors(L, ly, prefix, m->layout == LAYOUT_HF, false);
}

/* The MTP head, when mtp.fc and the layer's input norm are present (a stray mtp.* tensor or two, as
 * some test checkpoints carry, is skipped like vision tensors): lilac convert's form when mtp.fc is quantized (norms stored
 * as 1+w), else the official bf16 form (norms as w; experts fused, or per expert when the fused
 * tensor is absent). Every tensor of the head must be there. */
static int load_mtp(loader *L) {
    lilac_model *m = L->m;
    const lilac_config *c = &m->cfg;
    if (!st_find(&m->st, "mtp.fc.weight") || !st_find(&m->st, LILAC_MTP_LAYER "input_layernorm.weight")) return 0;
    lilac_mtp *h = m->mtp = xcalloc(1, sizeof *h);
    const size_t b0 = L->total_bytes;
    h->quantized = st_find(&m->st, "mtp.fc.scales") != NULL;
    const bool hf = !h->quantized;
    h->per_expert = hf && !st_find(&m->st, LILAC_MTP_LAYER "mlp.experts.gate_up_proj");
    L->infer_bits = true;
    int rc = 0;
    for (int k = 0; k < lilac_n_mtp_tensors && rc == 0; k++) {
        const lilac_layer_tensor *t = &lilac_mtp_tensors[k];
        const int64_t rows = lilac_dim_size(c, t->rows);
        if (lilac_tensor_is_matrix(t))
            rc = load_matrix(L, (lilac_matrix *)((char *)h + t->field), t->name, NULL, 0, rows, lilac_dim_size(c, t->cols));
        else if (!(*(float **)((char *)h + t->field) = load_vec(L, t->name, rows, 0, hf)))
            rc = -1;
    }
    h->layer.is_full = true;
    if (rc == 0) rc = load_layer_tensors(L, &h->layer, LILAC_MTP_LAYER, hf, h->per_expert);
    L->infer_bits = false;
    h->bytes = L->total_bytes - b0;
    return rc;
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
    if (rc == 0) rc = load_mtp(&L);
    for (int i = 0; rc == 0 && i < m->st.n_tensors; i++) {
        const st_tensor *t = &m->st.tensors[i];
        if (L.used[i]) continue;
        if (m->mtp && !strncmp(t->name, "mtp.", 4)) {
            rc = lilac_fail(err, "%s: unexpected tensor \"%s\" in the MTP head", shard_name(&L, t), t->name);
            break;
        }
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
    *x = (lilac_matrix){.type = MAT_AFFINE, .rows = R, .cols = C, .bits = bits, .group = group, .q = q, .scales = sc,
                        .biases = bi, .n_experts = (int)E, .expert_rows_stride = R};
    return 0;
}

static void round_gain(float *g, int64_t n) {
    for (int64_t i = 0; g && i < n; i++) g[i] = bf16_to_f32(f32_to_bf16(g[i]));
}

int lilac_model_quantize(lilac_model *m, lilac_err *err) {
    if (m->layout != LAYOUT_HF && !(m->mtp && !m->mtp->quantized)) return 0;
    const lilac_config *c = &m->cfg;
    char what[160];
    if (quantize_mat(m, &m->embed, 4, "embed_tokens", err) < 0) return -1;
    if (c->tie_embeddings) m->lm_head = m->embed;
    else if (quantize_mat(m, &m->lm_head, 4, "lm_head", err) < 0) return -1;
    round_gain(m->final_norm, c->hidden);
    lilac_mtp *h = m->mtp;
    if (h) {
        for (int k = 0; k < lilac_n_mtp_tensors; k++) {
            const lilac_layer_tensor *t = &lilac_mtp_tensors[k];
            if (lilac_tensor_is_matrix(t)) {
                if (quantize_mat(m, (lilac_matrix *)((char *)h + t->field), t->bits, t->name, err) < 0) return -1;
            } else if (!h->quantized) {
                round_gain(*(float **)((char *)h + t->field), lilac_dim_size(c, t->rows));
            }
        }
        for (int k = 0; k < lilac_n_layer_tensors; k++) {
            const lilac_layer_tensor *t = &lilac_layer_tensors[k];
            if (!lilac_tensor_in_mtp(t)) continue;
            if (t->kind == TK_GAIN && !h->quantized) round_gain(*lilac_layer_vec(&h->layer, t), lilac_dim_size(c, t->rows));
            if (!lilac_tensor_is_matrix(t)) continue;
            snprintf(what, sizeof what, "MTP %s", t->name);
            if (quantize_mat(m, lilac_layer_mat(&h->layer, t), t->bits, what, err) < 0) return -1;
        }
    }
    for (int l = 0; l < c->n_layers; l++) {
        lilac_layer *y = &m->layers[l];
        for (int k = 0; k < lilac_n_layer_tensors; k++) {
            const lilac_layer_tensor *t = &lilac_layer_tensors[k];
            if (!lilac_tensor_in_layer(t, c, l)) continue;
            if (t->kind == TK_GAIN) round_gain(*lilac_layer_vec(y, t), lilac_dim_size(c, t->rows));
            if (!lilac_tensor_is_matrix(t)) continue;
            snprintf(what, sizeof what, "layer %d %s", l, t->name);
            if (quantize_mat(m, lilac_layer_mat(y, t), t->bits, what, err) < 0) return -1;
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
    if (m->mtp) {
        lilac_layer *l = &m->mtp->layer;
        free(l->in_norm); free(l->post_norm); free(l->q_norm); free(l->k_norm);
        free(m->mtp->norm_emb); free(m->mtp->norm_hid); free(m->mtp->norm);
        free(m->mtp);
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
