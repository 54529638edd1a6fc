/* tensors.c — the table of a layer's tensors (tensors.h). */
#include "tensors.h"

#include <stdio.h>

#define F(x) offsetof(lilac_layer, x)

/* In mlx-lm's parameter order: the mixer (GDN or attention), the two norms, the MoE. */
const lilac_layer_tensor lilac_layer_tensors[] = {
    /* name                              hf                            layers   kind        rows              cols              bits part/parts flags       field            synth */
    {"linear_attn.conv1d.weight",         NULL,                         TL_GDN,  TK_CONV,    DIM_CONV,         DIM_ONE,          0, 0, 0, 0,          F(conv),         7},
    {"linear_attn.in_proj_qkv",           NULL,                         TL_GDN,  TK_MATRIX,  DIM_CONV,         DIM_HIDDEN,       4, 0, 0, 0,          F(in_qkv),       2},
    {"linear_attn.in_proj_z",             NULL,                         TL_GDN,  TK_MATRIX,  DIM_LIN_VAL,      DIM_HIDDEN,       4, 0, 0, 0,          F(in_z),         3},
    {"linear_attn.in_proj_b",             NULL,                         TL_GDN,  TK_MATRIX,  DIM_LIN_V_HEADS,  DIM_HIDDEN,       4, 0, 0, 0,          F(in_b),         4},
    {"linear_attn.in_proj_a",             NULL,                         TL_GDN,  TK_MATRIX,  DIM_LIN_V_HEADS,  DIM_HIDDEN,       4, 0, 0, 0,          F(in_a),         5},
    {"linear_attn.dt_bias",               NULL,                         TL_GDN,  TK_DT_BIAS, DIM_LIN_V_HEADS,  DIM_ONE,          0, 0, 0, TF_NONLEAF, F(dt_bias),      9},
    {"linear_attn.A_log",                 NULL,                         TL_GDN,  TK_A_LOG,   DIM_LIN_V_HEADS,  DIM_ONE,          0, 0, 0, TF_NONLEAF, F(A_log),        8},
    {"linear_attn.norm.weight",           NULL,                         TL_GDN,  TK_NORM_W,  DIM_LIN_V_DIM,    DIM_ONE,          0, 0, 0, 0,          F(gdn_norm),     10},
    {"linear_attn.out_proj",              NULL,                         TL_GDN,  TK_MATRIX,  DIM_HIDDEN,       DIM_LIN_VAL,      4, 0, 0, 0,          F(out_proj),     6},
    {"self_attn.q_proj",                  NULL,                         TL_ATTN, TK_MATRIX,  DIM_Q_GATED,      DIM_HIDDEN,       4, 0, 0, 0,          F(q_proj),       2},
    {"self_attn.k_proj",                  NULL,                         TL_ATTN, TK_MATRIX,  DIM_KV,           DIM_HIDDEN,       4, 0, 0, 0,          F(k_proj),       3},
    {"self_attn.v_proj",                  NULL,                         TL_ATTN, TK_MATRIX,  DIM_KV,           DIM_HIDDEN,       4, 0, 0, 0,          F(v_proj),       4},
    {"self_attn.o_proj",                  NULL,                         TL_ATTN, TK_MATRIX,  DIM_HIDDEN,       DIM_ATTN,         4, 0, 0, 0,          F(o_proj),       5},
    {"self_attn.q_norm.weight",           NULL,                         TL_ATTN, TK_GAIN,    DIM_HEAD,         DIM_ONE,          0, 0, 0, 0,          F(q_norm),       6},
    {"self_attn.k_norm.weight",           NULL,                         TL_ATTN, TK_GAIN,    DIM_HEAD,         DIM_ONE,          0, 0, 0, 0,          F(k_norm),       7},
    {"input_layernorm.weight",            NULL,                         TL_ALL,  TK_GAIN,    DIM_HIDDEN,       DIM_ONE,          0, 0, 0, 0,          F(in_norm),      0},
    {"post_attention_layernorm.weight",   NULL,                         TL_ALL,  TK_GAIN,    DIM_HIDDEN,       DIM_ONE,          0, 0, 0, 0,          F(post_norm),    1},
    {"mlp.gate",                          NULL,                         TL_ALL,  TK_MATRIX,  DIM_EXPERTS,      DIM_HIDDEN,       8, 0, 0, 0,          F(router),       11},
    {"mlp.switch_mlp.gate_proj",          "mlp.experts.gate_up_proj",   TL_ALL,  TK_EXPERTS, DIM_MOE_INTER,    DIM_HIDDEN,       4, 0, 2, 0,          F(exp_gate),     16},
    {"mlp.switch_mlp.up_proj",            "mlp.experts.gate_up_proj",   TL_ALL,  TK_EXPERTS, DIM_MOE_INTER,    DIM_HIDDEN,       4, 1, 2, 0,          F(exp_up),       17},
    {"mlp.switch_mlp.down_proj",          "mlp.experts.down_proj",      TL_ALL,  TK_EXPERTS, DIM_HIDDEN,       DIM_MOE_INTER,    4, 0, 1, 0,          F(exp_down),     18},
    {"mlp.shared_expert.gate_proj",       NULL,                         TL_ALL,  TK_MATRIX,  DIM_SHARED_INTER, DIM_HIDDEN,       4, 0, 0, 0,          F(sh_gate),      13},
    {"mlp.shared_expert.down_proj",       NULL,                         TL_ALL,  TK_MATRIX,  DIM_HIDDEN,       DIM_SHARED_INTER, 4, 0, 0, 0,          F(sh_down),      15},
    {"mlp.shared_expert.up_proj",         NULL,                         TL_ALL,  TK_MATRIX,  DIM_SHARED_INTER, DIM_HIDDEN,       4, 0, 0, 0,          F(sh_up),        14},
    {"mlp.shared_expert_gate",            NULL,                         TL_ALL,  TK_MATRIX,  DIM_ONE,          DIM_HIDDEN,       8, 0, 0, 0,          F(sh_expert_gate), 12},
};
const int lilac_n_layer_tensors = (int)(sizeof lilac_layer_tensors / sizeof lilac_layer_tensors[0]);

#undef F
#define F(x) offsetof(lilac_mtp, x)

/* The MTP head beside its decoder layer; synth_rank: synth's order (its seeds key on it). */
const lilac_layer_tensor lilac_mtp_tensors[] = {
    {"mtp.fc",                            NULL,                         0,       TK_MATRIX,  DIM_HIDDEN,       DIM_HIDDEN2,      4, 0, 0, 0,          F(fc),           0},
    {"mtp.pre_fc_norm_embedding.weight",  NULL,                         0,       TK_GAIN,    DIM_HIDDEN,       DIM_ONE,          0, 0, 0, 0,          F(norm_emb),     1},
    {"mtp.pre_fc_norm_hidden.weight",     NULL,                         0,       TK_GAIN,    DIM_HIDDEN,       DIM_ONE,          0, 0, 0, 0,          F(norm_hid),     2},
    {"mtp.norm.weight",                   NULL,                         0,       TK_GAIN,    DIM_HIDDEN,       DIM_ONE,          0, 0, 0, 0,          F(norm),         3},
};
const int lilac_n_mtp_tensors = (int)(sizeof lilac_mtp_tensors / sizeof lilac_mtp_tensors[0]);

#undef F

void lilac_mtp_tensor_name(char *buf, size_t n, const lilac_layer_tensor *t, bool hf) {
    if (hf && t->hf) snprintf(buf, n, LILAC_MTP_LAYER "%s", t->hf);
    else snprintf(buf, n, LILAC_MTP_LAYER "%s%s", t->name, hf && lilac_tensor_is_matrix(t) ? ".weight" : "");
}

int64_t lilac_dim_size(const lilac_config *c, lilac_dim d) {
    switch (d) {
    case DIM_ONE: return 1;
    case DIM_HIDDEN: return c->hidden;
    case DIM_EXPERTS: return c->n_experts;
    case DIM_MOE_INTER: return c->moe_inter;
    case DIM_SHARED_INTER: return c->shared_inter;
    case DIM_CONV: return cfg_conv_dim(c);
    case DIM_LIN_VAL: return cfg_lin_val_dim(c);
    case DIM_LIN_V_HEADS: return c->lin_v_heads;
    case DIM_LIN_V_DIM: return c->lin_v_dim;
    case DIM_Q_GATED: return 2 * (int64_t)c->n_heads * c->head_dim;
    case DIM_KV: return (int64_t)c->n_kv_heads * c->head_dim;
    case DIM_ATTN: return (int64_t)c->n_heads * c->head_dim;
    case DIM_HEAD: return c->head_dim;
    case DIM_HIDDEN2: return 2 * c->hidden;
    }
    return 0;
}

bool lilac_tensor_in_layer(const lilac_layer_tensor *t, const lilac_config *c, int l) {
    return (t->layers & (c->is_full[l] ? TL_ATTN : TL_GDN)) != 0;
}

void lilac_tensor_mlx_name(char *buf, size_t n, const lilac_layer_tensor *t, int l) {
    int k = snprintf(buf, n, LILAC_MLX_LAYER, l);
    if (k >= 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, "%s", t->name);
}

void lilac_tensor_hf_name(char *buf, size_t n, const lilac_layer_tensor *t, int l) {
    int k = snprintf(buf, n, LILAC_HF_LAYER, l);
    if (k < 0 || (size_t)k >= n) return;
    if (t->hf) snprintf(buf + k, n - (size_t)k, "%s", t->hf);
    else snprintf(buf + k, n - (size_t)k, "%s%s", t->name, lilac_tensor_is_matrix(t) ? ".weight" : "");
}

float **lilac_layer_vec(lilac_layer *y, const lilac_layer_tensor *t) { return (float **)((char *)y + t->field); }

lilac_matrix *lilac_layer_mat(lilac_layer *y, const lilac_layer_tensor *t) {
    return (lilac_matrix *)((char *)y + t->field);
}

const char *lilac_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && len < cap; i++) len += (size_t)snprintf(buf + len, cap - len, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
    return buf;
}
