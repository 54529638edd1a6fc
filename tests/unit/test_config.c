/* test_config.c — config.json parsing: the real Qwen3.6 wrapper (MLX 4-bit,
 * with per-module quantization overrides), bare text configs, defaults, and
 * every refusal naming its field with the expected and found values. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "model/config.h"

/* Test JSON is written with single quotes for readability; q() turns them
 * into double quotes (returns a static buffer). */
static const char *q(const char *s) {
    static char buf[16384];
    size_t n = strlen(s);
    if (n >= sizeof buf) abort();
    for (size_t i = 0; i <= n; i++) buf[i] = s[i] == '\'' ? '"' : s[i];
    return buf;
}

#define LT4 "'linear_attention','linear_attention','linear_attention','full_attention'"
/* The real config.json of mlx-community/Qwen3.6-35B-A3B-4bit (text-relevant
 * parts; 2 of the 80 overrides per quantization block kept). */
static const char *REAL =
    "{'architectures':['Qwen3_5MoeForConditionalGeneration'],'image_token_id':248056,"
    "'model_type':'qwen3_5_moe',"
    "'quantization':{'group_size':64,'bits':4,'mode':'affine',"
    "  'language_model.model.layers.0.mlp.gate':{'group_size':64,'bits':8},"
    "  'language_model.model.layers.0.mlp.shared_expert_gate':{'group_size':64,'bits':8},"
    "  'language_model.model.layers.39.mlp.gate':{'group_size':64,'bits':8}},"
    "'quantization_config':{'group_size':64,'bits':4,'mode':'affine',"
    "  'language_model.model.layers.0.mlp.gate':{'group_size':64,'bits':8}},"
    "'text_config':{'attention_bias':false,'attention_dropout':0.0,'attn_output_gate':true,"
    "  'bos_token_id':null,'dtype':'bfloat16','eos_token_id':248044,'full_attention_interval':4,"
    "  'head_dim':256,'hidden_act':'silu','hidden_size':2048,'initializer_range':0.02,"
    "  'layer_types':[" LT4 "," LT4 "," LT4 "," LT4 "," LT4 "," LT4 "," LT4 "," LT4 "," LT4 "," LT4 "],"
    "  'linear_conv_kernel_dim':4,'linear_key_head_dim':128,'linear_num_key_heads':16,"
    "  'linear_num_value_heads':32,'linear_value_head_dim':128,'mamba_ssm_dtype':'float32',"
    "  'max_position_embeddings':262144,'model_type':'qwen3_5_moe_text','moe_intermediate_size':512,"
    "  'mtp_num_hidden_layers':1,'mtp_use_dedicated_embeddings':false,'num_attention_heads':16,"
    "  'num_experts':256,'num_experts_per_tok':8,'num_hidden_layers':40,'num_key_value_heads':2,"
    "  'pad_token_id':null,'rms_norm_eps':1e-06,"
    "  'rope_parameters':{'mrope_interleaved':true,'mrope_section':[11,11,10],"
    "     'partial_rotary_factor':0.25,'rope_theta':10000000,'rope_type':'default'},"
    "  'router_aux_loss_coef':0.001,'shared_expert_intermediate_size':512,'use_cache':true,"
    "  'vocab_size':248320},"
    "'tie_word_embeddings':false,'transformers_version':'4.57.1','video_token_id':248057,"
    "'vision_config':{'depth':27,'hidden_size':1152,'model_type':'qwen3_5_moe','num_heads':16},"
    "'vision_end_token_id':248054,'vision_start_token_id':248053}";

/* A small bare text config: only the required fields. */
static const char *BARE =
    "{'model_type':'qwen3_5_moe_text','hidden_size':64,'num_hidden_layers':6,"
    "'num_attention_heads':4,'num_key_value_heads':2,'head_dim':16,'linear_num_key_heads':2,"
    "'linear_num_value_heads':4,'linear_key_head_dim':8,'linear_value_head_dim':12,"
    "'linear_conv_kernel_dim':4,'num_experts':8,'num_experts_per_tok':2,'moe_intermediate_size':32,"
    "'shared_expert_intermediate_size':48,'vocab_size':300,'rms_norm_eps':1e-5}";

static const char *REQUIRED[] = {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "vocab_size", "rms_norm_eps",
};
#define N_REQUIRED ((int)(sizeof REQUIRED / sizeof REQUIRED[0]))

static int parse_str(lilac_config *c, const char *json, lilac_err *err) {
    err->msg[0] = 0;
    return lilac_config_parse(c, json, strlen(json), "m/config.json", err);
}

/* Parse `base` (single-quoted) after setting text[key] = value (value is JSON,
 * single-quoted; NULL deletes the key). `text` is text_config when the
 * wrapper has one, else the root. Returns the parse result. */
static int parse_mod(lilac_config *c, const char *base, const char *key, const char *value, lilac_err *err) {
    json_error_t je;
    json_t *root = json_loads(q(base), 0, &je);
    if (!root) {
        fprintf(stderr, "test JSON broken: %s\n", je.text);
        abort();
    }
    json_t *text = json_object_get(root, "text_config");
    if (!text) text = root;
    if (value) {
        json_t *v = json_loads(q(value), JSON_DECODE_ANY, &je);
        if (!v) {
            fprintf(stderr, "test value broken: %s: %s\n", value, je.text);
            abort();
        }
        json_object_set_new(text, key, v);
    } else {
        json_object_del(text, key);
    }
    char *s = json_dumps(root, 0);
    json_decref(root);
    int rc = parse_str(c, s, err);
    free(s);
    return rc;
}

/* Expect refusal; the message must contain each of the given fragments. */
#define EXPECT_FAIL(rc, err, ...) do { \
    CHECK_FAIL_MSG(rc, err, __VA_ARGS__); \
    CHECKF(strstr((err).msg, "m/config.json") != NULL, "message lacks the path: %s", (err).msg); \
} while (0)

static void test_real_wrapper(void) {
    lilac_config c;
    lilac_err err;
    int rc = parse_str(&c, q(REAL), &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(c.hidden == 2048);
    CHECK(c.n_layers == 40);
    CHECK(c.vocab == 248320);
    CHECK(c.rms_eps == 1e-6f);
    CHECK(!c.tie_embeddings);
    CHECK(c.full_interval == 4);
    int nfull = 0;
    for (int i = 0; i < 40; i++) {
        CHECKF(c.is_full[i] == ((i + 1) % 4 == 0), "layer %d", i);
        nfull += c.is_full[i];
    }
    CHECK(nfull == 10);
    CHECK(c.n_heads == 16 && c.n_kv_heads == 2 && c.head_dim == 256);
    CHECK(c.rotary_dim == 64);
    CHECK(c.rope_theta == 1e7);
    CHECK(c.max_pos == 262144);
    CHECK(c.lin_k_heads == 16 && c.lin_v_heads == 32 && c.lin_k_dim == 128 && c.lin_v_dim == 128);
    CHECK(c.conv_kernel == 4);
    CHECK(cfg_lin_key_dim(&c) == 2048 && cfg_lin_val_dim(&c) == 4096 && cfg_conv_dim(&c) == 8192);
    CHECK(c.n_experts == 256 && c.top_k == 8);
    CHECK(c.moe_inter == 512 && c.shared_inter == 512);
    CHECK(c.norm_topk);
    CHECK(c.eos_id == 248044);
    CHECK(c.quantized && c.q_bits == 4 && c.q_group == 64 && strcmp(c.q_mode, "affine") == 0);
    CHECK(c.n_overrides == 3); /* from `quantization`, not `quantization_config` */
    int b = 0, g = 0;
    lilac_config_quant_for(&c, "language_model.model.layers.0.mlp.gate", &b, &g);
    CHECK(b == 8 && g == 64);
    lilac_config_quant_for(&c, "language_model.model.layers.0.mlp.shared_expert_gate", &b, &g);
    CHECK(b == 8 && g == 64);
    lilac_config_quant_for(&c, "language_model.model.layers.39.mlp.gate", &b, &g);
    CHECK(b == 8 && g == 64);
    lilac_config_quant_for(&c, "language_model.model.layers.3.mlp.gate", &b, &g);
    CHECK(b == 4 && g == 64);
    lilac_config_quant_for(&c, "language_model.model.layers.0.mlp.gate.x", &b, &g);
    CHECK(b == 4 && g == 64);
    lilac_config_quant_for(&c, "language_model.model.layers.0.mlp", &b, &g);
    CHECK(b == 4 && g == 64);
    lilac_config_quant_for(&c, "language_model.model.embed_tokens", &b, &g);
    CHECK(b == 4 && g == 64);
    CHECK(lilac_config_diff_real(&c, NULL) == 0);
    lilac_config_free(&c);
    CHECK(c.overrides == NULL && c.n_overrides == 0);
}

static void test_bare_text_defaults(void) {
    lilac_config c;
    lilac_err err;
    int rc = parse_str(&c, q(BARE), &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(c.hidden == 64 && c.n_layers == 6 && c.vocab == 300);
    CHECK(c.rms_eps == 1e-5f);
    CHECK(c.full_interval == 4);
    for (int i = 0; i < 6; i++) CHECKF(c.is_full[i] == (i == 3), "layer %d", i);
    CHECK(c.rope_theta == 100000.0); /* mlx-lm default */
    CHECK(c.rotary_dim == 4);        /* 16 * 0.25 */
    CHECK(c.max_pos == 262144);
    CHECK(!c.tie_embeddings);
    CHECK(c.norm_topk);
    CHECK(c.eos_id == -1);
    CHECK(!c.quantized && c.n_overrides == 0 && c.overrides == NULL);
    CHECK(c.lin_v_dim == 12 && c.shared_inter == 48 && c.moe_inter == 32);
    int b = -1, g = -1;
    lilac_config_quant_for(&c, "language_model.model.layers.0.mlp.gate", &b, &g);
    CHECK(b == 0 && g == 0);
    lilac_config_free(&c);
}

static void test_bare_qwen3_5_moe_without_text_config(void) {
    lilac_config c;
    lilac_err err;
    int rc = parse_mod(&c, BARE, "model_type", "'qwen3_5_moe'", &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(c.hidden == 64);
    lilac_config_free(&c);
}

static void test_model_type_refused(void) {
    lilac_config c;
    lilac_err err;
    int rc = parse_mod(&c, BARE, "model_type", "'qwen3_next'", &err);
    EXPECT_FAIL(rc, err, "model_type", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text");
    CHECK(c.overrides == NULL);
    rc = parse_mod(&c, BARE, "model_type", NULL, &err);
    EXPECT_FAIL(rc, err, "model_type", "absent");
    rc = parse_mod(&c, BARE, "model_type", "7", &err);
    EXPECT_FAIL(rc, err, "model_type", "found 7");
    /* the wrapper's text_config must be the moe text model */
    rc = parse_mod(&c, REAL, "model_type", "'qwen3_5_text'", &err);
    EXPECT_FAIL(rc, err, "text_config.model_type", "qwen3_5_text");
    /* a text_config that is not an object */
    char *real = xstrdup(q(REAL));
    json_t *root = json_loads(real, 0, NULL);
    json_object_set_new(root, "text_config", json_integer(3));
    char *s = json_dumps(root, 0);
    rc = parse_str(&c, s, &err);
    EXPECT_FAIL(rc, err, "text_config", "expected an object");
    free(s);
    json_decref(root);
    free(real);
}

static void test_required_fields(void) {
    for (int i = 0; i < N_REQUIRED; i++) {
        lilac_config c;
        lilac_err err;
        int rc = parse_mod(&c, BARE, REQUIRED[i], NULL, &err);
        EXPECT_FAIL(rc, err, REQUIRED[i], "absent");
        /* same inside text_config of the wrapper: the message says where */
        rc = parse_mod(&c, REAL, REQUIRED[i], NULL, &err);
        EXPECT_FAIL(rc, err, REQUIRED[i], "text_config.");
        /* wrong types / non-positive values */
        rc = parse_mod(&c, BARE, REQUIRED[i], "0", &err);
        EXPECT_FAIL(rc, err, REQUIRED[i], "found 0");
        rc = parse_mod(&c, BARE, REQUIRED[i], "-3", &err);
        EXPECT_FAIL(rc, err, REQUIRED[i], "found -3");
        rc = parse_mod(&c, BARE, REQUIRED[i], "'12'", &err);
        EXPECT_FAIL(rc, err, REQUIRED[i], "found \"12\"");
        if (strcmp(REQUIRED[i], "rms_norm_eps") != 0) {
            rc = parse_mod(&c, BARE, REQUIRED[i], "16.5", &err);
            EXPECT_FAIL(rc, err, REQUIRED[i], "16.5", "integer");
        }
    }
}

static void test_ranges(void) {
    lilac_config c;
    lilac_err err;
    int rc = parse_mod(&c, BARE, "num_hidden_layers", "257", &err);
    EXPECT_FAIL(rc, err, "num_hidden_layers", "256", "found 257");
    rc = parse_mod(&c, BARE, "num_hidden_layers", "256", &err);
    CHECKF(rc == 0, "%s", err.msg);
    lilac_config_free(&c);
    rc = parse_mod(&c, BARE, "hidden_size", "99999999999999999", &err);
    EXPECT_FAIL(rc, err, "hidden_size", "99999999999999999");
    rc = parse_mod(&c, BARE, "rms_norm_eps", "1e-300", &err);
    EXPECT_FAIL(rc, err, "rms_norm_eps");
    rc = parse_mod(&c, BARE, "rms_norm_eps", "2.0", &err);
    EXPECT_FAIL(rc, err, "rms_norm_eps", "found 2.0");
    rc = parse_mod(&c, BARE, "max_position_embeddings", "0", &err);
    EXPECT_FAIL(rc, err, "max_position_embeddings", "found 0");
    rc = parse_mod(&c, BARE, "full_attention_interval", "0", &err);
    EXPECT_FAIL(rc, err, "full_attention_interval", "found 0");
    rc = parse_mod(&c, BARE, "tie_word_embeddings", "1", &err);
    EXPECT_FAIL(rc, err, "tie_word_embeddings", "true or false", "found 1");
    rc = parse_mod(&c, BARE, "norm_topk_prob", "'yes'", &err);
    EXPECT_FAIL(rc, err, "norm_topk_prob", "found \"yes\"");
}

static void test_consistency(void) {
    lilac_config c;
    lilac_err err;
    int rc = parse_mod(&c, BARE, "num_key_value_heads", "3", &err);
    EXPECT_FAIL(rc, err, "num_key_value_heads", "num_attention_heads (4)", "found 3");
    rc = parse_mod(&c, BARE, "linear_num_value_heads", "3", &err);
    EXPECT_FAIL(rc, err, "linear_num_value_heads", "linear_num_key_heads (2)", "found 3");
    rc = parse_mod(&c, BARE, "num_experts_per_tok", "9", &err);
    EXPECT_FAIL(rc, err, "num_experts_per_tok", "num_experts (8)", "found 9");
    rc = parse_mod(&c, BARE, "num_experts_per_tok", "8", &err);
    CHECKF(rc == 0, "%s", err.msg);
    lilac_config_free(&c);
}

static void test_layer_types(void) {
    lilac_config c;
    lilac_err err;
    /* layer_types overrides the interval */
    int rc = parse_mod(&c, BARE, "layer_types",
                       "['full_attention','linear_attention','full_attention','linear_attention',"
                       "'linear_attention','full_attention']",
                       &err);
    CHECKF(rc == 0, "%s", err.msg);
    bool want[6] = {true, false, true, false, false, true};
    for (int i = 0; i < 6; i++) CHECKF(c.is_full[i] == want[i], "layer %d", i);
    lilac_config_free(&c);
    rc = parse_mod(&c, BARE, "layer_types", "['full_attention','linear_attention']", &err);
    EXPECT_FAIL(rc, err, "layer_types", "6", "found 2");
    rc = parse_mod(&c, BARE, "layer_types",
                   "['full_attention','linear_attention','sliding_attention','linear_attention',"
                   "'linear_attention','full_attention']",
                   &err);
    EXPECT_FAIL(rc, err, "layer_types[2]", "sliding_attention", "linear_attention");
    rc = parse_mod(&c, BARE, "layer_types", "'full'", &err);
    EXPECT_FAIL(rc, err, "layer_types", "array");
    /* no layer_types: the interval decides */
    rc = parse_mod(&c, BARE, "full_attention_interval", "2", &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(c.full_interval == 2);
    for (int i = 0; i < 6; i++) CHECKF(c.is_full[i] == (i % 2 == 1), "layer %d", i);
    lilac_config_free(&c);
}

static void test_rope(void) {
    lilac_config c;
    lilac_err err;
    /* legacy top-level keys */
    char *base = xstrdup(BARE);
    base[strlen(base) - 1] = 0;
    char buf[2048];
    snprintf(buf, sizeof buf, "%s,'rope_theta':5000000,'partial_rotary_factor':0.5}", base);
    int rc = parse_str(&c, q(buf), &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(c.rope_theta == 5e6 && c.rotary_dim == 8);
    lilac_config_free(&c);
    /* rope_parameters with only rope_theta: the factor takes mlx-lm's default */
    rc = parse_mod(&c, BARE, "rope_parameters", "{'rope_type':'default','rope_theta':1000}", &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(c.rope_theta == 1000.0 && c.rotary_dim == 4);
    lilac_config_free(&c);
    /* rope_parameters wins over legacy keys (as in mlx-lm) */
    snprintf(buf, sizeof buf, "%s,'rope_theta':5,'rope_parameters':{'partial_rotary_factor':1.0}}", base);
    rc = parse_str(&c, q(buf), &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(c.rope_theta == 100000.0 && c.rotary_dim == 16);
    lilac_config_free(&c);
    /* odd rotary dim: 16 * 0.3125 = 5 */
    rc = parse_mod(&c, BARE, "rope_parameters", "{'partial_rotary_factor':0.3125}", &err);
    EXPECT_FAIL(rc, err, "partial_rotary_factor", "even", "-> 5");
    rc = parse_mod(&c, BARE, "rope_parameters", "{'partial_rotary_factor':1.5}", &err);
    EXPECT_FAIL(rc, err, "rope_parameters.partial_rotary_factor", "found 1.5");
    rc = parse_mod(&c, BARE, "rope_parameters", "{'rope_theta':-1}", &err);
    EXPECT_FAIL(rc, err, "rope_parameters.rope_theta", "found -1");
    rc = parse_mod(&c, BARE, "rope_parameters", "[1]", &err);
    EXPECT_FAIL(rc, err, "rope_parameters", "object");
    free(base);
}

static void test_eos_and_tie(void) {
    lilac_config c;
    lilac_err err;
    int rc = parse_mod(&c, BARE, "eos_token_id", "[248046, 248044]", &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(c.eos_id == 248046);
    lilac_config_free(&c);
    rc = parse_mod(&c, BARE, "eos_token_id", "7", &err);
    CHECK(rc == 0 && c.eos_id == 7);
    lilac_config_free(&c);
    rc = parse_mod(&c, BARE, "eos_token_id", "[]", &err);
    CHECK(rc == 0 && c.eos_id == -1);
    lilac_config_free(&c);
    rc = parse_mod(&c, BARE, "eos_token_id", "null", &err);
    CHECK(rc == 0 && c.eos_id == -1);
    lilac_config_free(&c);
    rc = parse_mod(&c, BARE, "eos_token_id", "'</s>'", &err);
    EXPECT_FAIL(rc, err, "eos_token_id", "</s>");
    rc = parse_mod(&c, BARE, "eos_token_id", "[-2]", &err);
    EXPECT_FAIL(rc, err, "eos_token_id", "[-2]");
    rc = parse_mod(&c, BARE, "tie_word_embeddings", "true", &err);
    CHECK(rc == 0 && c.tie_embeddings);
    lilac_config_free(&c);
    rc = parse_mod(&c, BARE, "norm_topk_prob", "false", &err);
    CHECK(rc == 0 && !c.norm_topk);
    lilac_config_free(&c);
    /* wrapper: tie_word_embeddings / eos at the top level when text_config lacks them */
    json_t *root = json_loads(q(REAL), 0, NULL);
    json_t *text = json_object_get(root, "text_config");
    json_object_del(text, "eos_token_id");
    json_object_set_new(root, "eos_token_id", json_integer(5));
    json_object_set_new(root, "tie_word_embeddings", json_true());
    char *s = json_dumps(root, 0);
    rc = parse_str(&c, s, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(c.tie_embeddings && c.eos_id == 5);
    lilac_config_free(&c);
    free(s);
    json_decref(root);
}

static void test_quantization(void) {
    lilac_config c;
    lilac_err err;
    /* quantization_config only, override with bits only inherits the base group */
    int rc = parse_mod(&c, BARE, "quantization_config",
                       "{'group_size':32,'bits':4,'quant_method':'mlx',"
                       "'model.layers.0.mlp.gate':{'bits':8},"
                       "'model.layers.1.mlp.gate':{'group_size':128},"
                       "'model.layers.2.mlp.gate':false,"
                       "'model.layers.3.mlp.gate':true}",
                       &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(c.quantized && c.q_bits == 4 && c.q_group == 32 && strcmp(c.q_mode, "affine") == 0);
    CHECK(c.n_overrides == 3);
    int b, g;
    lilac_config_quant_for(&c, "model.layers.0.mlp.gate", &b, &g);
    CHECK(b == 8 && g == 32);
    lilac_config_quant_for(&c, "model.layers.1.mlp.gate", &b, &g);
    CHECK(b == 4 && g == 128);
    lilac_config_quant_for(&c, "model.layers.2.mlp.gate", &b, &g);
    CHECK(b == 0 && g == 0);
    lilac_config_quant_for(&c, "model.layers.3.mlp.gate", &b, &g);
    CHECK(b == 4 && g == 32);
    lilac_config_free(&c);
    /* quantization inside text_config as a fallback */
    json_t *root = json_loads(q(REAL), 0, NULL);
    json_t *qb = json_object_get(root, "quantization");
    json_incref(qb);
    json_object_del(root, "quantization");
    json_object_del(root, "quantization_config");
    json_object_set_new(json_object_get(root, "text_config"), "quantization", qb);
    char *s = json_dumps(root, 0);
    rc = parse_str(&c, s, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(c.quantized && c.q_bits == 4 && c.n_overrides == 3);
    lilac_config_free(&c);
    free(s);
    /* and nothing at all: not quantized */
    json_object_del(json_object_get(root, "text_config"), "quantization");
    s = json_dumps(root, 0);
    rc = parse_str(&c, s, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(!c.quantized && c.n_overrides == 0);
    CHECK(lilac_config_diff_real(&c, NULL) == 0); /* quantization is not geometry */
    lilac_config_free(&c);
    free(s);
    json_decref(root);
    /* refusals */
    rc = parse_mod(&c, BARE, "quantization", "{'group_size':32,'bits':4,'mode':'mxfp4'}", &err);
    EXPECT_FAIL(rc, err, "quantization.mode", "affine", "mxfp4");
    rc = parse_mod(&c, BARE, "quantization", "{'group_size':32,'bits':7}", &err);
    EXPECT_FAIL(rc, err, "quantization.bits", "found 7");
    rc = parse_mod(&c, BARE, "quantization", "{'group_size':48,'bits':4}", &err);
    EXPECT_FAIL(rc, err, "quantization.group_size", "found 48");
    rc = parse_mod(&c, BARE, "quantization", "{'bits':4}", &err);
    EXPECT_FAIL(rc, err, "quantization.group_size", "absent");
    rc = parse_mod(&c, BARE, "quantization", "4", &err);
    EXPECT_FAIL(rc, err, "quantization", "object");
    rc = parse_mod(&c, BARE, "quantization", "{'group_size':64,'bits':4,'a.b':{'bits':9}}", &err);
    EXPECT_FAIL(rc, err, "quantization[\"a.b\"].bits", "found 9");
    CHECK(c.overrides == NULL && c.n_overrides == 0);
}

static void test_bad_json(void) {
    lilac_config c;
    lilac_err err;
    int rc = parse_str(&c, "{\"model_type\": ", &err);
    EXPECT_FAIL(rc, err, "JSON");
    rc = parse_str(&c, "[1,2]", &err);
    EXPECT_FAIL(rc, err, "object");
    rc = parse_str(&c, q("{'model_type':'qwen3_5_moe_text','model_type':'qwen3_5_moe_text'}"), &err);
    EXPECT_FAIL(rc, err, "duplicate");
    rc = lilac_config_parse(&c, "", 0, "m/config.json", &err);
    EXPECT_FAIL(rc, err, "JSON");
}

static void test_load_dir(void) {
    char tmpl[] = "/tmp/lilac_cfg_XXXXXX";
    char *dir = mkdtemp(tmpl);
    CHECK(dir != NULL);
    if (!dir) return;
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    lilac_config c;
    lilac_err err;
    int rc = lilac_config_load(&c, dir, &err);
    CHECK(rc != 0 && strstr(err.msg, path) != NULL);
    FILE *f = fopen(path, "w");
    fputs(q(REAL), f);
    fclose(f);
    rc = lilac_config_load(&c, dir, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(c.hidden == 2048 && c.n_overrides == 3);
    lilac_config_free(&c);
    /* errors name the file */
    f = fopen(path, "w");
    fputs(q("{'model_type':'llama'}"), f);
    fclose(f);
    rc = lilac_config_load(&c, dir, &err);
    CHECK(rc != 0 && strstr(err.msg, path) != NULL && strstr(err.msg, "llama") != NULL);
    unlink(path);
    rmdir(dir);
}

static void test_real_and_diff(void) {
    lilac_config r;
    lilac_config_real(&r);
    CHECK(r.hidden == 2048 && r.n_layers == 40 && r.vocab == 248320 && r.rotary_dim == 64);
    CHECK(r.rope_theta == 1e7 && r.quantized && r.q_bits == 4 && r.q_group == 64);
    CHECK(r.is_full[3] && !r.is_full[0] && r.is_full[39]);
    CHECK(cfg_conv_dim(&r) == 8192);
    int b, g;
    lilac_config_quant_for(&r, "language_model.model.layers.17.mlp.shared_expert_gate", &b, &g);
    CHECK(b == 8 && g == 64);
    lilac_config_quant_for(&r, "language_model.model.layers.17.mlp.switch_mlp.up_proj", &b, &g);
    CHECK(b == 4 && g == 64);
    CHECK(lilac_config_diff_real(&r, NULL) == 0);

    lilac_config c;
    lilac_err err;
    int rc = parse_str(&c, q(BARE), &err);
    CHECKF(rc == 0, "%s", err.msg);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    int n = lilac_config_diff_real(&c, mem);
    fclose(mem);
    CHECKF(n >= 15, "n=%d", n);
    CHECKF(strstr(text, "  hidden_size: 64 (real model: 2048)\n") != NULL, "%s", text);
    CHECKF(strstr(text, "  num_hidden_layers: 6 (real model: 40)\n") != NULL, "%s", text);
    CHECKF(strstr(text, "  rope_theta: 100000 (real model: 1e+07)\n") != NULL, "%s", text);
    int lines = 0;
    for (const char *p = text; *p; p++) lines += *p == '\n';
    CHECK(lines == n);
    free(text);
    lilac_config_free(&c);

    /* one field differs: exactly one line */
    r.moe_inter = 768;
    text = NULL;
    mem = open_memstream(&text, &len);
    n = lilac_config_diff_real(&r, mem);
    fclose(mem);
    CHECK(n == 1);
    CHECKF(strcmp(text, "  moe_intermediate_size: 768 (real model: 512)\n") == 0, "%s", text);
    free(text);
    lilac_config_free(&r);
}

int main(void) {
    TEST(test_real_wrapper);
    TEST(test_bare_text_defaults);
    TEST(test_bare_qwen3_5_moe_without_text_config);
    TEST(test_model_type_refused);
    TEST(test_required_fields);
    TEST(test_ranges);
    TEST(test_consistency);
    TEST(test_layer_types);
    TEST(test_rope);
    TEST(test_eos_and_tie);
    TEST(test_quantization);
    TEST(test_bad_json);
    TEST(test_load_dir);
    TEST(test_real_and_diff);
    return check_summary();
}
