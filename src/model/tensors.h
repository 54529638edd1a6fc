/* tensors.h — the tensors of one decoder layer, each once: its name in the
 * mlx-community layout and in the official HF bf16 layout, which layers hold it,
 * its shape in config terms, its bits in the mlx-community checkpoint, and the
 * lilac_layer field it loads into. The loader (weights.c), quantization at load,
 * `lilac convert` (tools/convert.c) and `lilac synth` (synth.c, and through it
 * the demo model) all walk this table.
 *
 * The table is in the order of mlx-lm's model.parameters(), which decides the
 * shard split of a converted checkpoint. */
#ifndef LILAC_TENSORS_H
#define LILAC_TENSORS_H

#include <stddef.h>

#include "weights.h"

/* Which layers hold a tensor. */
typedef enum { TL_GDN = 1, TL_ATTN = 2, TL_ALL = 3 } lilac_tensor_layers;

typedef enum {
    TK_MATRIX,  /* a linear map: MLX `name`.weight (u32 codes) + .scales/.biases, HF `name`.weight (bf16) */
    TK_EXPERTS, /* n_experts stacked matrices: MLX switch_mlp.*, HF the fused experts.* tensors */
    TK_GAIN,    /* an RMSNorm gain: MLX stores 1+w, HF stores w (zero-centred) */
    TK_NORM_W,  /* the gated norm's weight: used as stored, in both layouts */
    TK_DT_BIAS, /* a bias vector (bf16) */
    TK_A_LOG,   /* A_log: f32 in MLX, never cast */
    TK_CONV,    /* the causal conv taps: MLX [C, K, 1], HF [C, 1, K] */
} lilac_tensor_kind;

/* A dimension, in terms of the config. */
typedef enum {
    DIM_ONE,
    DIM_HIDDEN,       /* hidden */
    DIM_EXPERTS,      /* n_experts */
    DIM_MOE_INTER,    /* moe_inter */
    DIM_SHARED_INTER, /* shared_inter */
    DIM_CONV,         /* cfg_conv_dim: the q, k and v channels of the GDN */
    DIM_LIN_VAL,      /* cfg_lin_val_dim: lin_v_heads * lin_v_dim */
    DIM_LIN_V_HEADS,  /* lin_v_heads */
    DIM_LIN_V_DIM,    /* lin_v_dim */
    DIM_Q_GATED,      /* 2 * n_heads * head_dim: per head [query | gate] */
    DIM_KV,           /* n_kv_heads * head_dim */
    DIM_ATTN,         /* n_heads * head_dim */
    DIM_HEAD,         /* head_dim */
    DIM_HIDDEN2,      /* 2 * hidden: the MTP head's fc input */
} lilac_dim;

/* TF_NONLEAF: a parameter of a module with children (the GDN's dt_bias and
 * A_log): mlx-lm's total_parameters leaves it out. */
enum { TF_NONLEAF = 1 };

typedef struct {
    const char *name;       /* MLX, after "language_model.model.layers.N."; matrices without ".weight" */
    const char *hf;         /* HF, after "model.language_model.layers.N.", when not `name` (+ ".weight"
                             * for a matrix): the full tensor name */
    lilac_tensor_layers layers;
    lilac_tensor_kind kind;
    lilac_dim rows, cols;   /* a matrix [rows, cols] (an expert's, for TK_EXPERTS); a vector [rows] */
    int bits;               /* matrices: 4 or 8 in the mlx-community checkpoint (and when quantized at load) */
    int hf_part, hf_parts;  /* TK_EXPERTS: rows block hf_part of hf_parts in the fused HF tensor */
    int flags;              /* TF_* */
    size_t field;           /* offsetof(lilac_layer, ...) (lilac_mtp_tensors: offsetof(lilac_mtp, ...)):
                             * a lilac_matrix, or a float * for vectors */
    int synth_rank;         /* the order synth writes a layer's tensors in (its seeds key on it) */
} lilac_layer_tensor;

extern const lilac_layer_tensor lilac_layer_tensors[];
extern const int lilac_n_layer_tensors;

/* The prefixes of layer l's tensor names, ending with '.'. */
#define LILAC_MLX_LAYER "language_model.model.layers.%d."
#define LILAC_HF_LAYER "model.language_model.layers.%d."

/* The MTP head (weights.h lilac_mtp). Its decoder layer holds the tensors of
 * lilac_layer_tensors that a full-attention layer holds (lilac_tensor_in_mtp),
 * named LILAC_MTP_LAYER + the HF name in the official release and + the MLX
 * name in lilac convert's mtp.safetensors; the rest of the head is
 * lilac_mtp_tensors (full names, the same in both forms). The embedding and
 * lm_head are the main model's. */
#define LILAC_MTP_LAYER "mtp.layers.0."
#define LILAC_MTP_FILE "mtp.safetensors"
extern const lilac_layer_tensor lilac_mtp_tensors[];
extern const int lilac_n_mtp_tensors;
static inline bool lilac_tensor_in_mtp(const lilac_layer_tensor *t) { return (t->layers & TL_ATTN) != 0; }
/* The name of the MTP layer's tensor t: HF (hf true; matrices with ".weight" unless t->hf names the
 * fused tensor) or MLX (matrices without ".weight"). */
void lilac_mtp_tensor_name(char *buf, size_t n, const lilac_layer_tensor *t, bool hf);

int64_t lilac_dim_size(const lilac_config *c, lilac_dim d);
/* Whether layer l of the model holds tensor t. */
bool lilac_tensor_in_layer(const lilac_layer_tensor *t, const lilac_config *c, int l);
/* The MLX name of t in layer l (matrices without ".weight"). */
void lilac_tensor_mlx_name(char *buf, size_t n, const lilac_layer_tensor *t, int l);
/* The HF name of t in layer l: the full tensor name. */
void lilac_tensor_hf_name(char *buf, size_t n, const lilac_layer_tensor *t, int l);
/* Vectors: the float * field of layer y that t loads into. Matrices: the lilac_matrix. */
float **lilac_layer_vec(lilac_layer *y, const lilac_layer_tensor *t);
lilac_matrix *lilac_layer_mat(lilac_layer *y, const lilac_layer_tensor *t);
/* "[a,b,c]": a tensor's shape for messages. Returns buf. */
const char *lilac_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape);
static inline bool lilac_tensor_is_matrix(const lilac_layer_tensor *t) {
    return t->kind == TK_MATRIX || t->kind == TK_EXPERTS;
}

#endif
