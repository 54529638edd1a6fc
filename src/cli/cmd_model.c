/* cmd_model.c — the model commands: info, logits (teacher forcing), generate (greedy). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "../backend/backend.h"
#include "../chat/chat.h"
#include "../model/safetensors.h"
#include "../tokenizer/tokenizer.h"
#include "../util/npy.h"
#include "commands.h"

/* Options every model command shares. */
typedef struct {
    const char *model, *backend, *attn_precision;
    long threads;
    bool quantize; /* HF bf16 checkpoint: quantize in memory at load, as `lilac convert` would */
    bool attn_bf16; /* --attn-precision bf16 (set by open_model) */
} model_opts;

static bool common_opt(int argc, char **argv, int *i, model_opts *o) {
    return opt_str(argc, argv, i, "--model", &o->model) || opt_str(argc, argv, i, "--backend", &o->backend) ||
           opt_range(argc, argv, i, "--threads", 1, OPT_MAX_THREADS, &o->threads) || opt_flag(argc, argv, i, "--quantize", &o->quantize) ||
           opt_str(argc, argv, i, "--attn-precision", &o->attn_precision);
}

static void open_model(const char *cmd, model_opts *o, lilac_model *m, const lilac_backend **be) {
    if (!o->model) o->model = getenv("LILAC_MODEL");
    if (!o->model)
        lilac_die("%s: no model: pass --model DIR or set LILAC_MODEL (an mlx-community Qwen3.6-35B-A3B-4bit "
                  "or Qwen/Qwen3.6-35B-A3B directory)", cmd);
    lilac_err err = {{0}};
    if (be && !(*be = lilac_backend_get(o->backend, &err))) lilac_die("%s", err.msg);
    if (be) {
        const int bf16 = opt_attn_bf16(cmd, o->attn_precision, (*be)->set_attn_bf16 != NULL, &err);
        if (bf16 < 0) lilac_die("%s", err.msg);
        o->attn_bf16 = bf16 == 1;
    }
    if (o->threads < 0) lilac_die("--threads must be positive");
    if (o->threads > 0) omp_set_num_threads((int)o->threads);
    if (lilac_model_load(m, o->model, &err) < 0) lilac_die("%s", err.msg);
    if (o->quantize && lilac_model_quantize(m, &err) < 0) lilac_die("%s", err.msg);
}

/* ---- info --------------------------------------------------------------- */

static size_t vec_bytes(int64_t n) { return (size_t)n * 2; }

int cmd_info(int argc, char **argv) {
    model_opts o = {0};
    for (int i = 1; i < argc; i++)
        if (!common_opt(argc, argv, &i, &o)) opt_unknown("info", argv[i]);
    lilac_model m;
    open_model("info", &o, &m, NULL);
    const lilac_config *c = &m.cfg;
    int n_full = 0;
    size_t b_attn = 0, b_gdn = 0, b_router = 0, b_exp = 0, b_shared = 0, b_norm = vec_bytes(c->hidden);
    for (int l = 0; l < c->n_layers; l++) {
        const lilac_layer *y = &m.layers[l];
        n_full += y->is_full;
        if (y->is_full)
            b_attn += lilac_mat_bytes(&y->q_proj) + lilac_mat_bytes(&y->k_proj) + lilac_mat_bytes(&y->v_proj) +
                      lilac_mat_bytes(&y->o_proj) + vec_bytes(2 * c->head_dim);
        else
            b_gdn += lilac_mat_bytes(&y->in_qkv) + lilac_mat_bytes(&y->in_z) + lilac_mat_bytes(&y->in_b) +
                     lilac_mat_bytes(&y->in_a) + lilac_mat_bytes(&y->out_proj) +
                     vec_bytes(cfg_conv_dim(c) * c->conv_kernel + 2 * c->lin_v_heads + c->lin_v_dim);
        b_router += lilac_mat_bytes(&y->router);
        b_exp += lilac_mat_bytes(&y->exp_gate) + lilac_mat_bytes(&y->exp_up) + lilac_mat_bytes(&y->exp_down);
        b_shared += lilac_mat_bytes(&y->sh_gate) + lilac_mat_bytes(&y->sh_up) + lilac_mat_bytes(&y->sh_down) +
                    lilac_mat_bytes(&y->sh_expert_gate);
        b_norm += vec_bytes(2 * c->hidden);
    }
    size_t b_embed = lilac_mat_bytes(&m.embed), b_head = c->tie_embeddings ? 0 : lilac_mat_bytes(&m.lm_head);
    size_t total = b_embed + b_head + b_attn + b_gdn + b_router + b_exp + b_shared + b_norm;
    printf("model      %s\n", m.dir);
    if (m.layout == LAYOUT_MLX)
        printf("format     MLX affine %d-bit, group %d (mlx-community layout)\n", c->q_bits, c->q_group);
    else
        printf("format     HF bf16 (official layout)\n");
    printf("files      %d safetensors file(s), %d tensors, %d skipped\n", m.st.n_shards, m.st.n_tensors,
           m.n_skipped);
    if (m.mtp)
        printf("mtp        MTP head: %.1f MB, %s%s (not counted in the totals below)\n", m.mtp->bytes / 1e6,
               m.mtp->quantized ? "affine (lilac convert)" : "HF bf16",
               m.mtp->quantized ? "" : m.mtp->per_expert ? ", experts one tensor each (Qwen3.5)" : ", experts fused (Qwen3.6)");
    else
        printf("mtp        no MTP head\n");
    printf("layers     %d (%d Gated DeltaNet, %d gated attention)\n", c->n_layers, c->n_layers - n_full, n_full);
    printf("hidden     %lld, vocab %lld, max context %lld\n", (long long)c->hidden, (long long)c->vocab,
           (long long)c->max_pos);
    printf("attention  %d heads / %d kv heads x %d, rotary %d, theta %g\n", c->n_heads, c->n_kv_heads, c->head_dim,
           c->rotary_dim, c->rope_theta);
    printf("deltanet   %d k heads / %d v heads, k %d, v %d, conv %d\n", c->lin_k_heads, c->lin_v_heads, c->lin_k_dim,
           c->lin_v_dim, c->conv_kernel);
    printf("moe        %d experts, top %d, expert %lld, shared %lld\n", c->n_experts, c->top_k,
           (long long)c->moe_inter, (long long)c->shared_inter);
    printf("bytes      embedding %.1f MB, lm_head %.1f MB, attention %.1f MB, deltanet %.1f MB,\n"
           "           router %.1f MB, experts %.1f MB, shared experts %.1f MB, norms %.2f MB; total %.3f GB\n",
           b_embed / 1e6, b_head / 1e6, b_attn / 1e6, b_gdn / 1e6, b_router / 1e6, b_exp / 1e6, b_shared / 1e6,
           b_norm / 1e6, total / 1e9);
    printf("per token  %.1f MB of weights read per decoded token (top-%d experts)\n",
           (b_head + b_attn + b_gdn + b_router + b_shared + b_norm + b_exp * (double)c->top_k / c->n_experts +
            (double)b_embed / c->vocab) / 1e6, c->top_k);
    int ndiff = lilac_config_diff_real(c, NULL);
    if (ndiff == 0) printf("geometry   the real Qwen3.6-35B-A3B\n");
    else {
        printf("geometry   differs from the real Qwen3.6-35B-A3B in %d field(s):\n", ndiff);
        lilac_config_diff_real(c, stdout);
    }
    lilac_model_free(&m);
    return 0;
}

/* ---- logits ------------------------------------------------------------- */

static int argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int)best;
}


int cmd_logits(int argc, char **argv) {
    model_opts o = {0};
    const char *ids_s = NULL, *out = NULL, *routes = NULL, *mtp_out = NULL;
    long drafts = 1;
    for (int i = 1; i < argc; i++)
        if (!common_opt(argc, argv, &i, &o) && !opt_str(argc, argv, &i, "--ids", &ids_s) &&
            !opt_str(argc, argv, &i, "--out", &out) && !opt_str(argc, argv, &i, "--routes", &routes) &&
            !opt_str(argc, argv, &i, "--mtp", &mtp_out) && !opt_range(argc, argv, &i, "--drafts", 1, 64, &drafts))
            opt_unknown("logits", argv[i]);
    if (!ids_s || !out)
        lilac_die("usage: lilac logits --model DIR --ids 1,2,3 --out FILE.npy [--routes FILE.npy] [--mtp FILE.npy [--drafts K]]");
    lilac_err err = {{0}};
    int32_t *ids;
    int n = lilac_parse_ids(ids_s, &ids, &err);
    if (n < 0) lilac_die("%s", err.msg);
    lilac_model m;
    const lilac_backend *be;
    open_model("logits", &o, &m, &be);
    lilac_session *s = be->session_new(&m, n + (mtp_out ? drafts : 0), (int)o.threads, &err);
    if (!s) lilac_die("%s", err.msg);
    if (o.attn_bf16) be->set_attn_bf16(s, true);
    float *logits = xmalloc(sizeof(float) * (size_t)n * (size_t)m.cfg.vocab);
    /* --routes: the experts each layer picked for each token, [n_layers][n][top_k] int32 (-1 where the
     * backend did not record), so that an outside oracle can replay this run's routing
     * (tools/device/hf_full.py): a near-tie broken the other way then does not hide the arithmetic. */
    int32_t *rt = NULL;
    const int64_t rt_shape[3] = {m.cfg.n_layers, n, m.cfg.top_k};
    if (routes) {
        if (!be->route_record) lilac_die("logits: --routes: the %s backend cannot record its routing", be->name);
        const size_t len = (size_t)rt_shape[0] * (size_t)rt_shape[1] * (size_t)rt_shape[2];
        rt = xmalloc(sizeof(int32_t) * len);
        for (size_t i = 0; i < len; i++) rt[i] = -1;
        be->route_record(s, rt, n);
    }
    /* --mtp: the MTP head's logits, [n + K - 1, vocab]: the shifted pass over the prompt (row p: the
     * final-normed hidden state at p and token p+1, the last row's token being the greedy next token),
     * then K-1 chained greedy drafts from the last row. */
    float *hidden = NULL;
    if (mtp_out) {
        if (!be->mtp) lilac_die("logits: --mtp: the %s backend has no MTP head support", be->name);
        if (!m.mtp) lilac_die("logits: --mtp: %s has no MTP head (mtp.* tensors)", m.dir);
        hidden = xmalloc(sizeof(float) * (size_t)n * (size_t)m.cfg.hidden);
        be->mtp->hidden_record(s, hidden, n);
    }
    if (be->forward(s, ids, n, LOGITS_ALL, logits, &err) < 0) lilac_die("%s", err.msg);
    if (rt) be->route_record(s, NULL, 0);
    if (mtp_out) {
        be->mtp->hidden_record(s, NULL, 0);
        const int64_t V = m.cfg.vocab, K = drafts;
        int32_t *next = xmalloc(sizeof(int32_t) * (size_t)n), *d = xmalloc(sizeof(int32_t) * (size_t)K);
        for (int i = 0; i + 1 < n; i++) next[i] = ids[i + 1];
        next[n - 1] = argmax(logits + (int64_t)(n - 1) * V, V);
        float *ml = xmalloc(sizeof(float) * (size_t)(n + K) * (size_t)V);
        if (be->mtp->prefill(s, 0, hidden, next, n, LOGITS_ALL, ml, &err) < 0) lilac_die("%s", err.msg);
        if (K > 1 && be->mtp->draft(s, (int)K, d, ml + (int64_t)(n - 1) * V, &err) < 0) lilac_die("%s", err.msg);
        const int64_t mshape[2] = {n + K - 1, V};
        if (npy_write(mtp_out, "<f4", ml, 2, mshape, &err) < 0) lilac_die("%s", err.msg);
        free(ml);
        free(next);
        free(d);
        free(hidden);
    }
    int64_t shape[2] = {n, m.cfg.vocab};
    if (npy_write(out, "<f4", logits, 2, shape, &err) < 0) lilac_die("%s", err.msg);
    if (rt && npy_write(routes, "<i4", rt, 3, rt_shape, &err) < 0) lilac_die("%s", err.msg);
    free(rt);
    free(logits);
    free(ids);
    be->session_free(s);
    lilac_model_free(&m);
    return 0;
}

/* ---- generate ----------------------------------------------------------- */

typedef struct {
    int eos, eos2, produced;
    lilac_detok *detok; /* text mode: stream text instead of ids */
} gen_state;

/* Print each token as it arrives (an id, or its text once complete UTF-8);
 * stop at end-of-sequence. */
static bool on_token(void *ud, int32_t tok) {
    gen_state *g = ud;
    g->produced++;
    if (tok == g->eos || tok == g->eos2) return false;
    if (g->detok) {
        const char *out;
        size_t len;
        int stop = -1;
        lilac_detok_push(g->detok, tok, &out, &len, &stop);
        fwrite(out, 1, len, stdout);
    } else {
        printf(g->produced > 1 ? " %d" : "%d", tok);
    }
    fflush(stdout);
    return true;
}

/* The prompt of `generate`: --ids as given; --prompt TEXT tokenized as HF does
 * (special tokens parsed); --chat: TEXT as a user message through the model's
 * chat template (content can never become control tokens). */
static int prompt_ids(const char *model, const char *ids_s, const char *text, bool chat, bool no_think,
                      lilac_tokenizer **tok_out, int32_t **ids, lilac_err *err) {
    if (ids_s) return lilac_parse_ids(ids_s, ids, err);
    lilac_tokenizer *tok = lilac_tok_load(model, err);
    if (!tok) return -1;
    *tok_out = tok;
    lilac_ids v = {0};
    int rc;
    if (chat) {
        json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", text);
        if (!msgs) return lilac_fail(err, "--chat: the prompt is not valid UTF-8");
        lilac_chat_opts o;
        lilac_chat_opts_default(&o);
        o.enable_thinking = !no_think;
        lilac_prompt pr = {0};
        rc = lilac_chat_render(msgs, NULL, &o, &pr, err);
        json_decref(msgs);
        if (rc == 0) rc = lilac_prompt_encode(tok, &pr, false, &v, err);
        lilac_prompt_free(&pr);
    } else {
        rc = lilac_tok_encode(tok, text, strlen(text), LILAC_TOK_SPECIAL, &v, err);
    }
    if (rc < 0) { lilac_ids_free(&v); return -1; }
    if (v.n == 0) { lilac_ids_free(&v); return lilac_fail(err, "the prompt is empty"); }
    *ids = v.ids;
    return (int)v.n;
}

int cmd_generate(int argc, char **argv) {
    model_opts o = {0};
    const char *ids_s = NULL, *text = NULL;
    long max_tokens = 64;
    bool ignore_eos = false, timing = false, chat = false, no_think = false;
    for (int i = 1; i < argc; i++)
        if (!common_opt(argc, argv, &i, &o) && !opt_str(argc, argv, &i, "--ids", &ids_s) &&
            !opt_str(argc, argv, &i, "--prompt", &text) && !opt_flag(argc, argv, &i, "--chat", &chat) &&
            !opt_flag(argc, argv, &i, "--no-thinking", &no_think) &&
            !opt_range(argc, argv, &i, "--max-tokens", 0, 1L << 24, &max_tokens) && !opt_flag(argc, argv, &i, "--ignore-eos", &ignore_eos) &&
            !opt_flag(argc, argv, &i, "--timing", &timing))
            opt_unknown("generate", argv[i]);
    if (!ids_s == !text)
        lilac_die("usage: lilac generate --model DIR (--ids 1,2,3 | --prompt TEXT [--chat [--no-thinking]]) --max-tokens N");
    if (chat && !text) lilac_die("--chat needs --prompt TEXT");
    if (max_tokens < 0) lilac_die("--max-tokens must be >= 0");
    lilac_err err = {{0}};
    lilac_model m;
    const lilac_backend *be;
    open_model("generate", &o, &m, &be);
    lilac_tokenizer *tok = NULL;
    int32_t *ids;
    int n = prompt_ids(o.model, ids_s, text, chat, no_think, &tok, &ids, &err);
    if (n < 0) lilac_die("%s", err.msg);
    lilac_session *s = be->session_new(&m, n + max_tokens + 1, (int)o.threads, &err);
    if (!s) lilac_die("%s", err.msg);
    if (o.attn_bf16) be->set_attn_bf16(s, true);
    float *logits = xmalloc(sizeof(float) * (size_t)m.cfg.vocab);
    double t0 = lilac_now();
    if (be->forward(s, ids, n, LOGITS_LAST, logits, &err) < 0) lilac_die("%s", err.msg);
    double t1 = lilac_now();
    gen_state g = {.eos = ignore_eos ? -1 : m.cfg.eos_id, .eos2 = -1};
    if (tok) {
        g.detok = lilac_detok_new(tok, NULL, 0, true);
        if (!ignore_eos) g.eos2 = lilac_tok_added_id(tok, "<|im_end|>");
    }
    if (max_tokens > 0) {
        int32_t first = argmax(logits, m.cfg.vocab);
        if (on_token(&g, first) && max_tokens > 1 &&
            be->decode_greedy(s, first, (int)max_tokens - 1, on_token, &g, &err) < 0)
            lilac_die("%s", err.msg);
    }
    char dmg[512];
    if (st_damaged(dmg, sizeof dmg)) lilac_die("generate: %s was truncated or rewritten while it ran", dmg);
    if (g.detok) {
        const char *out;
        size_t len;
        lilac_detok_finish(g.detok, &out, &len);
        fwrite(out, 1, len, stdout);
        lilac_detok_free(g.detok);
    }
    printf("\n");
    double t2 = lilac_now();
    if (timing)
        fprintf(stderr, "prefill %d tokens %.3f s (%.1f tok/s), decode %d tokens %.3f s (%.2f tok/s), backend %s\n", n,
                t1 - t0, n / (t1 - t0), g.produced, t2 - t1, g.produced > 1 ? (g.produced - 1) / (t2 - t1) : 0.0,
                be->name);
    free(logits);
    free(ids);
    if (tok) lilac_tok_free(tok);
    be->session_free(s);
    lilac_model_free(&m);
    return 0;
}
