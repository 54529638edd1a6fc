/* config.c — see config.h.
 *
 * Field lookup: geometry comes from `text_config` when the file is the
 * multimodal wrapper, else from the top level. tie_word_embeddings and
 * eos_token_id fall back to the top level of the wrapper when text_config
 * lacks them. Defaults for absent optional fields follow mlx-lm
 * (mlx_lm/models/qwen3_5.py TextModelArgs) so the two engines agree:
 * full_attention_interval 4, rope_theta 100000, partial_rotary_factor 0.25,
 * norm_topk_prob true, tie_word_embeddings false. rope: when `rope_parameters`
 * is an object its rope_theta / partial_rotary_factor are used (absent ones
 * take the defaults above, as mlx-lm does); otherwise the legacy top-level
 * keys, else the defaults.
 *
 * Sizes are also capped (LIM_DIM etc. below) so that products of a few of
 * them, as the engine computes them in int64, can never overflow.
 *
 * On failure *c is left zeroed (nothing to free). */
#include "config.h"
#include "../util/json_brief.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define LIM_DIM (1 << 20)      /* widths, head counts, head dims, expert counts */
#define LIM_VOCAB (1 << 24)    /* vocab_size */
#define LIM_POS (1LL << 40)    /* max_position_embeddings */

#define DEF_ROPE_THETA 100000.0
#define DEF_PARTIAL_ROTARY 0.25
#define DEF_MAX_POS 262144
#define DEF_FULL_INTERVAL 4

/* A short rendering of a JSON value for "found ..." in messages. */

typedef struct {
    const char *path;
    const char *prefix; /* "text_config." or "" for messages */
    lilac_err *err;
} ctx;

/* Integer field in [lo, hi]. Absent: required -> error, else *out = def. */
static int get_int(const ctx *x, json_t *obj, const char *key, bool required, long long def, long long lo,
                   long long hi, long long *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) {
            return lilac_fail(x->err, "%s: %s%s: expected an integer in [%lld, %lld], found nothing (field absent)",
                              x->path, x->prefix, key, lo, hi);
        }
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        char found[64];
        json_brief(v, found, sizeof found);
        return lilac_fail(x->err, "%s: %s%s: expected an integer in [%lld, %lld], found %s", x->path, x->prefix,
                          key, lo, hi, found);
    }
    *out = (long long)json_integer_value(v);
    return 0;
}

static int get_int32(const ctx *x, json_t *obj, const char *key, bool required, long long def, long long lo,
                     long long hi, int *out) {
    long long v;
    if (get_int(x, obj, key, required, def, lo, hi, &v) != 0) return -1;
    *out = (int)v;
    return 0;
}

static int get_bool(const ctx *x, json_t *obj, json_t *fallback, const char *key, bool def, bool *out) {
    json_t *v = json_object_get(obj, key);
    if ((!v || json_is_null(v)) && fallback) v = json_object_get(fallback, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) {
        char found[64];
        json_brief(v, found, sizeof found);
        return lilac_fail(x->err, "%s: %s%s: expected true or false, found %s", x->path, x->prefix, key, found);
    }
    *out = json_is_true(v);
    return 0;
}

/* Number field (integer or real), finite, in (lo, hi] (lo exclusive). */
static int get_num(const ctx *x, json_t *obj, const char *where, const char *key, bool required, double def,
                   double lo, double hi, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return lilac_fail(x->err, "%s: %s%s: expected a number in (%g, %g], found nothing (field absent)",
                              x->path, where, key, lo, hi);
        *out = def;
        return 0;
    }
    double d = json_is_number(v) ? json_number_value(v) : NAN;
    if (!json_is_number(v) || !isfinite(d) || !(d > lo) || !(d <= hi)) {
        char found[64];
        json_brief(v, found, sizeof found);
        return lilac_fail(x->err, "%s: %s%s: expected a number in (%g, %g], found %s", x->path, where, key, lo, hi,
                          found);
    }
    *out = d;
    return 0;
}

static int cmp_override(const void *a, const void *b) {
    return strcmp(((const lilac_quant_override *)a)->module, ((const lilac_quant_override *)b)->module);
}

static bool valid_bits(long long b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }
static bool valid_group(long long g) { return g == 32 || g == 64 || g == 128; }

/* bits / group_size of a quantization object `q` (base block or override).
 * Absent keys take *bits / *group as they come in (when those are > 0). */
static int quant_pair(const ctx *x, json_t *q, const char *where, int *bits, int *group) {
    json_t *b = json_object_get(q, "bits"), *g = json_object_get(q, "group_size");
    char found[64];
    if (b || *bits <= 0) {
        if (!json_is_integer(b) || !valid_bits(json_integer_value(b))) {
            json_brief(b, found, sizeof found);
            return lilac_fail(x->err, "%s: %s.bits: expected one of 2,3,4,5,6,8, found %s", x->path, where, found);
        }
        *bits = (int)json_integer_value(b);
    }
    if (g || *group <= 0) {
        if (!json_is_integer(g) || !valid_group(json_integer_value(g))) {
            json_brief(g, found, sizeof found);
            return lilac_fail(x->err, "%s: %s.group_size: expected one of 32,64,128, found %s", x->path, where,
                              found);
        }
        *group = (int)json_integer_value(g);
    }
    return 0;
}

static int parse_quant(lilac_config *c, const ctx *x, json_t *q, const char *qname) {
    char found[64];
    if (!json_is_object(q)) {
        json_brief(q, found, sizeof found);
        return lilac_fail(x->err, "%s: %s: expected an object {group_size, bits, mode}, found %s", x->path, qname,
                          found);
    }
    c->q_bits = 0;
    c->q_group = 0;
    if (quant_pair(x, q, qname, &c->q_bits, &c->q_group) != 0) return -1;
    json_t *m = json_object_get(q, "mode");
    const char *mode = "affine";
    if (m && !json_is_null(m)) {
        if (!json_is_string(m) || strcmp(json_string_value(m), "affine") != 0) {
            json_brief(m, found, sizeof found);
            return lilac_fail(x->err, "%s: %s.mode: expected \"affine\" (the only mode lilac supports), found %s",
                              x->path, qname, found);
        }
        mode = json_string_value(m);
    }
    snprintf(c->q_mode, sizeof c->q_mode, "%s", mode);
    c->quantized = true;

    /* Per-module overrides: any other key whose value is an object carrying
     * bits and/or group_size; `false` marks a module left unquantized
     * (stored as bits 0, group 0); `true` means "the base" and needs no entry. */
    size_t cap = 0;
    const char *key;
    json_t *v;
    json_object_foreach(q, key, v) {
        bool is_ovr = (json_is_object(v) && (json_object_get(v, "bits") || json_object_get(v, "group_size"))) ||
                      json_is_false(v);
        if (!is_ovr) continue;
        char where[256];
        snprintf(where, sizeof where, "%s[\"%.160s\"]", qname, key);
        if (strlen(key) >= sizeof c->overrides[0].module || strlen(key) == 0)
            return lilac_fail(x->err, "%s: %s: expected a module name of 1..%zu characters, found %zu characters",
                              x->path, where, sizeof c->overrides[0].module - 1, strlen(key));
        if (c->n_overrides >= LILAC_MAX_QUANT_OVERRIDES)
            return lilac_fail(x->err, "%s: %s: expected at most %d per-module overrides, found more", x->path,
                              qname, LILAC_MAX_QUANT_OVERRIDES);
        int bits = c->q_bits, group = c->q_group;
        if (json_is_false(v)) {
            bits = 0;
            group = 0;
        } else if (quant_pair(x, v, where, &bits, &group) != 0) {
            return -1;
        }
        if ((size_t)c->n_overrides == cap) {
            cap = cap ? cap * 2 : 64;
            c->overrides = xrealloc(c->overrides, sizeof(lilac_quant_override) * cap);
        }
        lilac_quant_override *o = &c->overrides[c->n_overrides++];
        memset(o, 0, sizeof *o);
        memcpy(o->module, key, strlen(key) + 1);
        o->bits = bits;
        o->group_size = group;
    }
    if (c->n_overrides > 1)
        qsort(c->overrides, (size_t)c->n_overrides, sizeof(lilac_quant_override), cmp_override);
    return 0;
}

static int parse_root(lilac_config *c, json_t *root, const char *path, lilac_err *err) {
    ctx x = {path, "", err};
    char found[64];
    if (!json_is_object(root)) {
        json_brief(root, found, sizeof found);
        return lilac_fail(err, "%s: expected a JSON object, found %s", path, found);
    }
    json_t *mt = json_object_get(root, "model_type");
    const char *mts = json_string_value(mt);
    json_t *text = root, *wrapper = NULL;
    if (mts && strcmp(mts, "qwen3_5_moe") == 0) {
        json_t *tc = json_object_get(root, "text_config");
        if (tc && !json_is_null(tc)) {
            if (!json_is_object(tc)) {
                json_brief(tc, found, sizeof found);
                return lilac_fail(err, "%s: text_config: expected an object, found %s", path, found);
            }
            text = tc;
            wrapper = root;
            x.prefix = "text_config.";
            json_t *tmt = json_object_get(tc, "model_type");
            const char *tms = json_string_value(tmt);
            if (tmt && !json_is_null(tmt) &&
                (!tms || (strcmp(tms, "qwen3_5_moe_text") != 0 && strcmp(tms, "qwen3_5_moe") != 0))) {
                json_brief(tmt, found, sizeof found);
                return lilac_fail(err, "%s: text_config.model_type: expected \"qwen3_5_moe_text\", found %s", path,
                                  found);
            }
        }
    } else if (!mts || strcmp(mts, "qwen3_5_moe_text") != 0) {
        json_brief(mt, found, sizeof found);
        return lilac_fail(err,
                          "%s: model_type: expected \"qwen3_5_moe\" (with text_config) or \"qwen3_5_moe_text\", "
                          "found %s",
                          path, found);
    }

    long long v;
    if (get_int(&x, text, "hidden_size", true, 0, 1, LIM_DIM, &v)) return -1;
    c->hidden = v;
    if (get_int32(&x, text, "num_hidden_layers", true, 0, 1, LILAC_MAX_LAYERS, &c->n_layers)) return -1;
    if (get_int32(&x, text, "num_attention_heads", true, 0, 1, LIM_DIM, &c->n_heads)) return -1;
    if (get_int32(&x, text, "num_key_value_heads", true, 0, 1, LIM_DIM, &c->n_kv_heads)) return -1;
    if (get_int32(&x, text, "head_dim", true, 0, 1, LIM_DIM, &c->head_dim)) return -1;
    if (get_int32(&x, text, "linear_num_key_heads", true, 0, 1, LIM_DIM, &c->lin_k_heads)) return -1;
    if (get_int32(&x, text, "linear_num_value_heads", true, 0, 1, LIM_DIM, &c->lin_v_heads)) return -1;
    if (get_int32(&x, text, "linear_key_head_dim", true, 0, 1, LIM_DIM, &c->lin_k_dim)) return -1;
    if (get_int32(&x, text, "linear_value_head_dim", true, 0, 1, LIM_DIM, &c->lin_v_dim)) return -1;
    if (get_int32(&x, text, "linear_conv_kernel_dim", true, 0, 1, 64, &c->conv_kernel)) return -1;
    if (get_int32(&x, text, "num_experts", true, 0, 1, LIM_DIM, &c->n_experts)) return -1;
    if (get_int32(&x, text, "num_experts_per_tok", true, 0, 1, LIM_DIM, &c->top_k)) return -1;
    if (get_int(&x, text, "moe_intermediate_size", true, 0, 1, LIM_DIM, &v)) return -1;
    c->moe_inter = v;
    if (get_int(&x, text, "shared_expert_intermediate_size", true, 0, 1, LIM_DIM, &v)) return -1;
    c->shared_inter = v;
    if (get_int(&x, text, "vocab_size", true, 0, 1, LIM_VOCAB, &v)) return -1;
    c->vocab = v;
    double eps;
    if (get_num(&x, text, x.prefix, "rms_norm_eps", true, 0, 0.0, 1.0, &eps)) return -1;
    c->rms_eps = (float)eps;
    if (!(c->rms_eps > 0.0f)) /* a positive double below FLT_MIN rounds to 0 */
        return lilac_fail(err, "%s: %srms_norm_eps: expected a positive float, found %g (0 as float32)", path,
                          x.prefix, eps);

    if (get_int32(&x, text, "full_attention_interval", false, DEF_FULL_INTERVAL, 1, LILAC_MAX_LAYERS,
                  &c->full_interval))
        return -1;
    if (get_int(&x, text, "max_position_embeddings", false, DEF_MAX_POS, 1, LIM_POS, &v)) return -1;
    c->max_pos = v;
    if (get_bool(&x, text, wrapper, "tie_word_embeddings", false, &c->tie_embeddings)) return -1;
    if (get_bool(&x, text, NULL, "norm_topk_prob", true, &c->norm_topk)) return -1;

    /* Consistency. */
    if (c->n_heads % c->n_kv_heads != 0)
        return lilac_fail(err,
                          "%s: %snum_key_value_heads: expected a divisor of num_attention_heads (%d), found %d",
                          path, x.prefix, c->n_heads, c->n_kv_heads);
    if (c->lin_v_heads % c->lin_k_heads != 0)
        return lilac_fail(err,
                          "%s: %slinear_num_value_heads: expected a multiple of linear_num_key_heads (%d), found %d",
                          path, x.prefix, c->lin_k_heads, c->lin_v_heads);
    if (c->top_k > c->n_experts)
        return lilac_fail(err, "%s: %snum_experts_per_tok: expected at most num_experts (%d), found %d", path,
                          x.prefix, c->n_experts, c->top_k);

    /* Layer pattern. */
    json_t *lt = json_object_get(text, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)c->n_layers) {
            if (json_is_array(lt))
                return lilac_fail(err,
                                  "%s: %slayer_types: expected %d entries (num_hidden_layers), found %zu", path,
                                  x.prefix, c->n_layers, json_array_size(lt));
            json_brief(lt, found, sizeof found);
            return lilac_fail(err, "%s: %slayer_types: expected an array of %d strings, found %s", path, x.prefix,
                              c->n_layers, found);
        }
        for (int i = 0; i < c->n_layers; i++) {
            json_t *e = json_array_get(lt, (size_t)i);
            const char *s = json_string_value(e);
            if (s && strcmp(s, "full_attention") == 0)
                c->is_full[i] = true;
            else if (s && strcmp(s, "linear_attention") == 0)
                c->is_full[i] = false;
            else {
                json_brief(e, found, sizeof found);
                return lilac_fail(err,
                                  "%s: %slayer_types[%d]: expected \"linear_attention\" or \"full_attention\", found %s",
                                  path, x.prefix, i, found);
            }
        }
    } else {
        for (int i = 0; i < c->n_layers; i++) c->is_full[i] = (i + 1) % c->full_interval == 0;
    }

    /* RoPE. */
    json_t *rp = json_object_get(text, "rope_parameters");
    double partial;
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp)) {
            json_brief(rp, found, sizeof found);
            return lilac_fail(err, "%s: %srope_parameters: expected an object, found %s", path, x.prefix, found);
        }
        char where[64];
        snprintf(where, sizeof where, "%srope_parameters.", x.prefix);
        if (get_num(&x, rp, where, "rope_theta", false, DEF_ROPE_THETA, 0.0, 1e30, &c->rope_theta)) return -1;
        if (get_num(&x, rp, where, "partial_rotary_factor", false, DEF_PARTIAL_ROTARY, 0.0, 1.0, &partial))
            return -1;
    } else {
        if (get_num(&x, text, x.prefix, "rope_theta", false, DEF_ROPE_THETA, 0.0, 1e30, &c->rope_theta)) return -1;
        if (get_num(&x, text, x.prefix, "partial_rotary_factor", false, DEF_PARTIAL_ROTARY, 0.0, 1.0, &partial))
            return -1;
    }
    c->rotary_dim = (int)(c->head_dim * partial);
    if (c->rotary_dim < 2 || c->rotary_dim % 2 != 0 || c->rotary_dim > c->head_dim)
        return lilac_fail(err,
                          "%s: %spartial_rotary_factor: expected head_dim (%d) x factor to give an even rotary "
                          "dim in [2, %d], found %g -> %d",
                          path, x.prefix, c->head_dim, c->head_dim, partial, c->rotary_dim);

    /* eos_token_id: int, or the first of an array; -1 if absent. */
    json_t *eos = json_object_get(text, "eos_token_id");
    if ((!eos || json_is_null(eos)) && wrapper) eos = json_object_get(wrapper, "eos_token_id");
    c->eos_id = -1;
    if (eos && !json_is_null(eos)) {
        json_t *e0 = json_is_array(eos) ? json_array_get(eos, 0) : eos;
        if (json_is_array(eos) && json_array_size(eos) == 0) {
            e0 = NULL;
        } else if (!json_is_integer(e0) || json_integer_value(e0) < 0 || json_integer_value(e0) > INT32_MAX) {
            json_brief(eos, found, sizeof found);
            return lilac_fail(err,
                              "%s: %seos_token_id: expected a non-negative integer or an array of them, found %s",
                              path, x.prefix, found);
        }
        if (e0) c->eos_id = (int)json_integer_value(e0);
    }

    /* Quantization: top level first, then text_config. */
    static const char *qkeys[2] = {"quantization", "quantization_config"};
    json_t *scopes[2] = {root, text != root ? text : NULL};
    for (int s = 0; s < 2; s++) {
        if (!scopes[s]) continue;
        for (int k = 0; k < 2; k++) {
            json_t *q = json_object_get(scopes[s], qkeys[k]);
            if (!q || json_is_null(q)) continue;
            char qname[64];
            snprintf(qname, sizeof qname, "%s%s", s == 1 ? "text_config." : "", qkeys[k]);
            return parse_quant(c, &x, q, qname);
        }
    }
    c->quantized = false;
    c->q_bits = 0;
    c->q_group = 0;
    snprintf(c->q_mode, sizeof c->q_mode, "none");
    return 0;
}

int lilac_config_parse(lilac_config *c, const char *json_text, size_t len, const char *path, lilac_err *err) {
    if (!path) path = "config.json";
    if (!c) return lilac_fail(err, "%s: no config struct given", path);
    memset(c, 0, sizeof *c);
    if (!json_text) return lilac_fail(err, "%s: no text given", path);
    json_error_t jerr;
    json_t *root = json_loadb(json_text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return lilac_fail(err, "%s: not valid JSON (line %d, column %d): %s", path, jerr.line, jerr.column,
                          jerr.text);
    int rc = parse_root(c, root, path, err);
    json_decref(root);
    if (rc != 0) lilac_config_free(c);
    return rc;
}

int lilac_config_load(lilac_config *c, const char *dir, lilac_err *err) {
    if (c) memset(c, 0, sizeof *c);
    if (!dir || !*dir) return lilac_fail(err, "model directory: expected a path, found an empty string");
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    char *path = xmalloc(n + sizeof "/config.json");
    memcpy(path, dir, n);
    memcpy(path + n, "/config.json", sizeof "/config.json");
    size_t len = 0;
    char *text = lilac_read_file_max(path, LILAC_CONFIG_MAX_BYTES, &len, err);
    if (!text) {
        free(path);
        return -1;
    }
    int rc = lilac_config_parse(c, text, len, path, err);
    free(text);
    free(path);
    return rc;
}

void lilac_config_quant_for(const lilac_config *c, const char *module, int *bits, int *group) {
    int b = c ? c->q_bits : 0, g = c ? c->q_group : 0;
    if (c && module && c->overrides && c->n_overrides > 0) {
        lilac_quant_override key;
        size_t n = strlen(module);
        if (n < sizeof key.module) {
            memcpy(key.module, module, n + 1);
            const lilac_quant_override *o =
                bsearch(&key, c->overrides, (size_t)c->n_overrides, sizeof key, cmp_override);
            if (o) {
                b = o->bits;
                g = o->group_size;
            }
        }
    }
    if (bits) *bits = b;
    if (group) *group = g;
}

void lilac_config_real(lilac_config *c) {
    memset(c, 0, sizeof *c);
    c->hidden = 2048;
    c->n_layers = 40;
    c->vocab = 248320;
    c->rms_eps = 1e-6f;
    c->tie_embeddings = false;
    c->full_interval = 4;
    for (int i = 0; i < c->n_layers; i++) c->is_full[i] = (i + 1) % 4 == 0;
    c->n_heads = 16;
    c->n_kv_heads = 2;
    c->head_dim = 256;
    c->rotary_dim = 64;
    c->rope_theta = 1e7;
    c->max_pos = 262144;
    c->lin_k_heads = 16;
    c->lin_v_heads = 32;
    c->lin_k_dim = 128;
    c->lin_v_dim = 128;
    c->conv_kernel = 4;
    c->n_experts = 256;
    c->top_k = 8;
    c->moe_inter = 512;
    c->shared_inter = 512;
    c->norm_topk = true;
    c->eos_id = 248044;
    c->quantized = true;
    c->q_bits = 4;
    c->q_group = 64;
    snprintf(c->q_mode, sizeof c->q_mode, "affine");
    /* mlx-community/Qwen3.6-35B-A3B-4bit: router and shared-expert gate at 8 bits. */
    c->n_overrides = 2 * c->n_layers;
    c->overrides = xcalloc((size_t)c->n_overrides, sizeof(lilac_quant_override));
    for (int i = 0; i < c->n_layers; i++) {
        lilac_quant_override *o = &c->overrides[2 * i];
        snprintf(o[0].module, sizeof o[0].module, "language_model.model.layers.%d.mlp.gate", i);
        snprintf(o[1].module, sizeof o[1].module, "language_model.model.layers.%d.mlp.shared_expert_gate", i);
        o[0].bits = o[1].bits = 8;
        o[0].group_size = o[1].group_size = 64;
    }
    qsort(c->overrides, (size_t)c->n_overrides, sizeof(lilac_quant_override), cmp_override);
}

int lilac_config_diff_real(const lilac_config *c, void *out) {
    FILE *f = out;
    lilac_config r;
    lilac_config_real(&r);
    int n = 0;
#define DIFF_I(name, field)                                                                             \
    do {                                                                                                \
        if ((long long)c->field != (long long)r.field) {                                                \
            if (f) fprintf(f, "  %s: %lld (real model: %lld)\n", name, (long long)c->field, (long long)r.field); \
            n++;                                                                                        \
        }                                                                                               \
    } while (0)
#define DIFF_B(name, field)                                                                             \
    do {                                                                                                \
        if (c->field != r.field) {                                                                      \
            if (f) fprintf(f, "  %s: %s (real model: %s)\n", name, c->field ? "true" : "false",          \
                           r.field ? "true" : "false");                                                 \
            n++;                                                                                        \
        }                                                                                               \
    } while (0)
    DIFF_I("hidden_size", hidden);
    DIFF_I("num_hidden_layers", n_layers);
    DIFF_I("vocab_size", vocab);
    if (c->rms_eps != r.rms_eps) {
        if (f) fprintf(f, "  rms_norm_eps: %g (real model: %g)\n", (double)c->rms_eps, (double)r.rms_eps);
        n++;
    }
    DIFF_B("tie_word_embeddings", tie_embeddings);
    DIFF_I("full_attention_interval", full_interval);
    {
        int m = c->n_layers < r.n_layers ? c->n_layers : r.n_layers;
        if (m > LILAC_MAX_LAYERS) m = LILAC_MAX_LAYERS;
        for (int i = 0; i < m; i++) {
            if (c->is_full[i] != r.is_full[i]) {
                if (f)
                    fprintf(f, "  layer_types[%d]: %s (real model: %s)\n", i,
                            c->is_full[i] ? "full_attention" : "linear_attention",
                            r.is_full[i] ? "full_attention" : "linear_attention");
                n++;
                break; /* one line for the whole pattern */
            }
        }
    }
    DIFF_I("num_attention_heads", n_heads);
    DIFF_I("num_key_value_heads", n_kv_heads);
    DIFF_I("head_dim", head_dim);
    DIFF_I("rotary_dim", rotary_dim);
    if (c->rope_theta != r.rope_theta) {
        if (f) fprintf(f, "  rope_theta: %g (real model: %g)\n", c->rope_theta, r.rope_theta);
        n++;
    }
    DIFF_I("max_position_embeddings", max_pos);
    DIFF_I("linear_num_key_heads", lin_k_heads);
    DIFF_I("linear_num_value_heads", lin_v_heads);
    DIFF_I("linear_key_head_dim", lin_k_dim);
    DIFF_I("linear_value_head_dim", lin_v_dim);
    DIFF_I("linear_conv_kernel_dim", conv_kernel);
    DIFF_I("num_experts", n_experts);
    DIFF_I("num_experts_per_tok", top_k);
    DIFF_I("moe_intermediate_size", moe_inter);
    DIFF_I("shared_expert_intermediate_size", shared_inter);
    DIFF_B("norm_topk_prob", norm_topk);
#undef DIFF_I
#undef DIFF_B
    lilac_config_free(&r);
    return n;
}

void lilac_config_free(lilac_config *c) {
    if (!c) return;
    free(c->overrides);
    memset(c, 0, sizeof *c);
}
