/* weights.h — the loaded model: config + every text tensor, mapped (not copied)
 * from the checkpoint, in one of two layouts:
 *   MLX 4-bit  (mlx-community): u32 codes + bf16 scales/biases, 8-bit router and
 *              shared-expert gate, experts as switch_mlp.{gate,up,down}_proj,
 *              conv1d [C,4,1], norms stored as 1+w;
 *   HF bf16    (Qwen official): plain bf16 matrices, fused experts.gate_up_proj,
 *              conv1d [C,1,4], norms stored as w (zero-centred).
 * Matrices stay in their file form (lilac_matrix below); the small vectors
 * (norm gains, conv taps, A_log, dt_bias) are converted once to f32 in one
 * convention: gains are the multiplier itself (1+w), conv taps are [C][K]. */
#ifndef LILAC_WEIGHTS_H
#define LILAC_WEIGHTS_H

#include "config.h"
#include "safetensors.h"

typedef enum { MAT_AFFINE, MAT_BF16 } lilac_mat_type;

/* A weight matrix y = W x with W [rows, cols] (rows = out features), possibly
 * one of `n_experts` stacked matrices (expert e starts at e * expert_stride
 * elements/rows-worth of data; see lilac_mat_expert). */
typedef struct {
    lilac_mat_type type;
    int64_t rows, cols;
    int bits, group;               /* MAT_AFFINE only: 4 or 8, 64 */
    const uint32_t *q;             /* MAT_AFFINE: [rows, cols*bits/32] packed codes */
    const uint16_t *scales;        /* MAT_AFFINE: [rows, cols/group] bf16 */
    const uint16_t *biases;        /* MAT_AFFINE: [rows, cols/group] bf16 */
    const uint16_t *w;             /* MAT_BF16:   [rows, cols] bf16 */
    int n_experts;                 /* 1 for plain matrices */
    int64_t expert_rows_stride;    /* rows between consecutive experts in the data */
} lilac_matrix;

/* View of expert e of a stacked matrix. */
lilac_matrix lilac_mat_expert(const lilac_matrix *m, int e);

/* Bytes the matrix occupies in the checkpoint. */
size_t lilac_mat_bytes(const lilac_matrix *m);

typedef struct {
    bool is_full;
    float *in_norm;            /* [hidden] gain */
    float *post_norm;          /* [hidden] gain */
    /* gated deltanet (is_full == false) */
    lilac_matrix in_qkv;       /* [conv_dim, hidden] */
    lilac_matrix in_z;         /* [v_heads*v_dim, hidden] */
    lilac_matrix in_b;         /* [v_heads, hidden] */
    lilac_matrix in_a;         /* [v_heads, hidden] */
    float *conv;               /* [conv_dim][conv_kernel] taps; tap K-1 = current token */
    float *A_log;              /* [v_heads] */
    float *dt_bias;            /* [v_heads] */
    float *gdn_norm;           /* [v_dim] gated-norm weight (direct, not 1+w) */
    lilac_matrix out_proj;     /* [hidden, v_heads*v_dim] */
    /* gated attention (is_full == true) */
    lilac_matrix q_proj;       /* [n_heads*head_dim*2, hidden]: per head [query | gate] */
    lilac_matrix k_proj;       /* [n_kv*head_dim, hidden] */
    lilac_matrix v_proj;       /* [n_kv*head_dim, hidden] */
    lilac_matrix o_proj;       /* [hidden, n_heads*head_dim] */
    float *q_norm;             /* [head_dim] gain */
    float *k_norm;             /* [head_dim] gain */
    /* moe */
    lilac_matrix router;       /* [n_experts, hidden] (8-bit in MLX) */
    lilac_matrix exp_gate;     /* n_experts x [moe_inter, hidden] */
    lilac_matrix exp_up;       /* n_experts x [moe_inter, hidden] */
    lilac_matrix exp_down;     /* n_experts x [hidden, moe_inter] */
    lilac_matrix sh_gate;      /* [shared_inter, hidden] */
    lilac_matrix sh_up;        /* [shared_inter, hidden] */
    lilac_matrix sh_down;      /* [hidden, shared_inter] */
    lilac_matrix sh_expert_gate; /* [1, hidden] */
} lilac_layer;

typedef enum { LAYOUT_MLX, LAYOUT_HF } lilac_layout;

/* The multi-token-prediction head (mtp.*): one draft step maps the target's
 * final-normed hidden state h_p and the embedding of token x_{p+1} to logits
 * for x_{p+2}:
 *   u = fc · concat(rmsnorm(E[x])·norm_emb, rmsnorm(h)·norm_hid)   (embedding first)
 *   u = decoder layer (a full gated-attention layer + MoE, its own KV cache)
 *   y = rmsnorm(u)·norm;  logits = lm_head · y   (embedding and lm_head shared)
 * y is also the h of the next chained step. Stored either in the official HF
 * form (bf16, norms as w, experts fused [E,2I,H] as Qwen3.6 or one tensor per
 * expert as Qwen3.5) or as `lilac convert` writes it to mtp.safetensors
 * (affine 4-bit, router and shared-expert gate 8-bit, norms as 1+w). Gains
 * here are the multiplier (1+w) either way. */
typedef struct {
    lilac_matrix fc;           /* [hidden, 2*hidden] */
    float *norm_emb;           /* [hidden] gain on the token's embedding */
    float *norm_hid;           /* [hidden] gain on the incoming hidden state */
    float *norm;               /* [hidden] final gain (mtp.norm) */
    lilac_layer layer;         /* is_full: attention + MoE tensors set */
    bool per_expert;           /* read from Qwen3.5's per-expert tensors */
    bool quantized;            /* stored as lilac convert writes it */
    size_t bytes;              /* bytes of its tensors in the checkpoint */
} lilac_mtp;

typedef struct {
    lilac_config cfg;
    lilac_layout layout;
    st_set st;
    char *dir;
    lilac_matrix embed;        /* [vocab, hidden] */
    lilac_matrix lm_head;      /* [vocab, hidden] (= embed when tied) */
    float *final_norm;         /* [hidden] gain */
    lilac_layer *layers;       /* [n_layers] */
    lilac_mtp *mtp;            /* the MTP head, NULL when the checkpoint has none */
    int n_skipped;             /* vision tensors (and an incomplete MTP head's) ignored */
    /* Heap buffers the model owns (matrices quantized at load), with their sizes:
     * backends treat them like checkpoint tensors. */
    void **owned;
    size_t *owned_bytes;
    int n_owned;
} lilac_model;

/* Load DIR (config.json + safetensors). Detects the layout, checks every
 * expected tensor's presence, dtype and shape against the config, skips
 * vision_tower.* / model.visual.* and refuses any other unknown tensor. The
 * MTP head is loaded when mtp.fc and mtp.layers.0.input_layernorm are present
 * (in the shards or in the sidecar mtp.safetensors), and then every one of its
 * tensors must be; otherwise m->mtp is NULL (stray mtp.* tensors are skipped). On
 * failure: -1 and one line in err naming file and tensor. */
int lilac_model_load(lilac_model *m, const char *dir, lilac_err *err);
void lilac_model_free(lilac_model *m);

/* Quantize every bf16 matrix of an HF-layout model in memory, exactly as
 * `lilac convert` (and mlx-lm) would: 4-bit, group 64; the router and the shared
 * expert gate 8-bit; norm gains rounded to bf16(1+w) as the converted file stores
 * them. Afterwards the model computes what the converted checkpoint computes.
 * The MTP head's bf16 matrices are quantized the same way (also beside an MLX
 * main model). Otherwise a no-op for MLX checkpoints. 0, or -1 + err (a
 * non-finite weight, named). */
int lilac_model_quantize(lilac_model *m, lilac_err *err);

/* Dequantise row r of a matrix into out[cols] (f32): w = s*q + b per group. */
void lilac_mat_row(const lilac_matrix *m, int64_t r, float *out);

#endif
