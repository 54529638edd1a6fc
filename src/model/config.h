/* config.h — the text-model geometry of Qwen3.6-35B-A3B (model_type qwen3_5_moe),
 * read from config.json (multimodal wrapper with `text_config`, or a bare text
 * config), plus the MLX `quantization` block with its per-module overrides. */
#ifndef LILAC_CONFIG_H
#define LILAC_CONFIG_H

#include "../util/common.h"

#define LILAC_MAX_LAYERS 256
#define LILAC_MAX_QUANT_OVERRIDES 4096

typedef struct {
    char module[160]; /* e.g. "language_model.model.layers.3.mlp.gate" */
    int bits;
    int group_size;
} lilac_quant_override;

typedef struct {
    int64_t hidden;           /* hidden_size, 2048 */
    int n_layers;             /* num_hidden_layers, 40 */
    int64_t vocab;            /* vocab_size, 248320 */
    float rms_eps;            /* rms_norm_eps, 1e-6 */
    bool tie_embeddings;      /* tie_word_embeddings, false */
    bool is_full[LILAC_MAX_LAYERS]; /* from layer_types, or (i+1)%interval==0 */
    int full_interval;        /* full_attention_interval, 4 */
    /* gated attention */
    int n_heads;              /* num_attention_heads, 16 */
    int n_kv_heads;           /* num_key_value_heads, 2 */
    int head_dim;             /* head_dim, 256 */
    int rotary_dim;           /* head_dim * partial_rotary_factor, 64 */
    double rope_theta;        /* rope_parameters.rope_theta, 1e7 */
    int64_t max_pos;          /* max_position_embeddings, 262144 */
    /* gated deltanet */
    int lin_k_heads;          /* linear_num_key_heads, 16 */
    int lin_v_heads;          /* linear_num_value_heads, 32 */
    int lin_k_dim;            /* linear_key_head_dim, 128 */
    int lin_v_dim;            /* linear_value_head_dim, 128 */
    int conv_kernel;          /* linear_conv_kernel_dim, 4 */
    /* moe */
    int n_experts;            /* num_experts, 256 */
    int top_k;                /* num_experts_per_tok, 8 */
    int64_t moe_inter;        /* moe_intermediate_size, 512 */
    int64_t shared_inter;     /* shared_expert_intermediate_size, 512 */
    bool norm_topk;           /* norm_topk_prob (absent -> true) */
    int eos_id;               /* text_config.eos_token_id (-1 if absent) */
    /* quantization block (MLX); quantized == false for HF bf16 checkpoints */
    bool quantized;
    int q_bits, q_group;
    char q_mode[16];
    int n_overrides;
    lilac_quant_override *overrides;
} lilac_config;

/* Parse config.json text. `path` is for error messages. Refuses any
 * model_type other than qwen3_5_moe (wrapper) / qwen3_5_moe_text (bare), and
 * any inconsistent geometry (e.g. v heads not a multiple of k heads), naming
 * the field, the expected and the found value. Returns 0 or -1 + err. */
int lilac_config_parse(lilac_config *c, const char *json_text, size_t len, const char *path,
                       lilac_err *err);

/* Read DIR/config.json and parse it. */
int lilac_config_load(lilac_config *c, const char *dir, lilac_err *err);

/* Quantization for one module path ("language_model.model.layers.0.mlp.gate"):
 * the override if any, else the base bits/group. */
void lilac_config_quant_for(const lilac_config *c, const char *module, int *bits, int *group);

/* Derived sizes. */
static inline int64_t cfg_lin_key_dim(const lilac_config *c) { return (int64_t)c->lin_k_heads * c->lin_k_dim; }
static inline int64_t cfg_lin_val_dim(const lilac_config *c) { return (int64_t)c->lin_v_heads * c->lin_v_dim; }
static inline int64_t cfg_conv_dim(const lilac_config *c) { return 2 * cfg_lin_key_dim(c) + cfg_lin_val_dim(c); }

/* Fill with the real Qwen3.6-35B-A3B geometry (used by `lilac info` to report
 * differences, and by synth). */
void lilac_config_real(lilac_config *c);

/* Print a line per field that differs from the real model to `out` (FILE*);
 * returns the number of differences. */
int lilac_config_diff_real(const lilac_config *c, void *out);

void lilac_config_free(lilac_config *c);

/* config.json larger than this is refused (it is a few KB; a device or a huge file is not one). */
#define LILAC_CONFIG_MAX_BYTES ((size_t)16 << 20)

#endif
