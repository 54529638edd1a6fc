/* synth.c — `lilac synth`: a random-weight checkpoint of the real Qwen3.6-35B-A3B
 * geometry (or fewer layers) in the mlx-community 4-bit format, deterministic by
 * seed, written in parallel. It is how the full-size path is tested and
 * benchmarked where the real weights cannot be downloaded.
 *
 * Weights are drawn directly in quantised form: uniform 4-bit (8-bit) codes,
 * and per group a scale s = ±sigma/sd(q) and bias b = -s*mean(q), so every
 * matrix has zero-mean entries of standard deviation sigma = gain/sqrt(fan_in)
 * and activations stay in a realistic range through all 40 layers.
 *
 * `--router` changes only the router rows (and, for `one`/`skew`, the embedding
 * biases): see lilac_synth_router in synth.h; `random`, the default, changes nothing. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"
#include "synth.h"
#include "tensors.h"

typedef struct {
    char name[160];
    st_dtype dtype;
    int ndim;
    int64_t shape[3];
    int kind;       /* what to fill it with, see fill() */
    float sigma;    /* matrix entry std (codes) or value scale */
    int bits;       /* for codes/scales/biases of quantised matrices */
    int role;       /* R_*: the tensors --router modes change */
    int layer;      /* of a router */
    int shard;
    size_t offset, nbytes;
} spec;

enum { K_CODES, K_SCALES, K_BIASES, K_GAIN, K_CONV, K_ALOG, K_DTBIAS, K_ONES };
enum { R_NONE, R_EMBED, R_ROUTER };

typedef struct {
    spec *v;
    int n, cap;
} specs;

static void add(specs *S, const char *name, st_dtype dt, int ndim, int64_t a, int64_t b, int64_t c, int kind,
                float sigma, int bits) {
    if (S->n == S->cap) S->v = xrealloc(S->v, sizeof(spec) * (size_t)(S->cap = S->cap ? 2 * S->cap : 256));
    spec *s = &S->v[S->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->dtype = dt;
    s->ndim = ndim;
    s->shape[0] = a; s->shape[1] = b; s->shape[2] = c;
    s->kind = kind;
    s->sigma = sigma;
    s->bits = bits;
    size_t n = st_dtype_size(dt);
    for (int i = 0; i < ndim; i++) n *= (size_t)s->shape[i];
    s->nbytes = n;
}

/* A quantised matrix [E?, rows, cols]: .weight (u32), .scales and .biases (bf16). */
static void add_q(specs *S, const char *base, int64_t E, int64_t rows, int64_t cols, int bits, float gain) {
    char n[200];
    const float sigma = gain / sqrtf((float)cols);
    const int nd = E ? 3 : 2;
    const int64_t a = E ? E : rows, b = E ? rows : cols * bits / 32, b2 = E ? rows : cols / 64;
    const int64_t c = E ? cols * bits / 32 : 0, c2 = E ? cols / 64 : 0;
    snprintf(n, sizeof n, "%s.weight", base);
    add(S, n, ST_U32, nd, a, b, c, K_CODES, sigma, bits);
    snprintf(n, sizeof n, "%s.scales", base);
    add(S, n, ST_BF16, nd, a, b2, c2, K_SCALES, sigma, bits);
    snprintf(n, sizeof n, "%s.biases", base);
    add(S, n, ST_BF16, nd, a, b2, c2, K_BIASES, sigma, bits);
}

/* The last quantised matrix added (its .weight, .scales, .biases) plays `role` (in `layer`). */
static void mark(specs *S, int role, int layer) {
    for (int i = S->n - 3; i < S->n; i++) {
        S->v[i].role = role;
        S->v[i].layer = layer;
    }
}

int lilac_synth_router_parse(const char *name) {
    static const char *names[] = {"random", "ties", "one", "skew"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

const char *lilac_synth_router_name(lilac_synth_router r) {
    switch (r) {
    case LILAC_ROUTER_RANDOM: return "random";
    case LILAC_ROUTER_TIES: return "ties";
    case LILAC_ROUTER_ONE: return "one";
    case LILAC_ROUTER_SKEW: return "skew";
    }
    return "?";
}

int lilac_synth_one_expert(int E) { return E > 0 ? (E / 2 + 3) % E : 0; }

float lilac_synth_router_shift(lilac_synth_router r, int E, int e) {
    if (r == LILAC_ROUTER_ONE) return e == lilac_synth_one_expert(E) ? 10.0f : 0.0f;
    if (r != LILAC_ROUTER_SKEW) return 0.0f;
    /* Hot experts at the ends of the warp-sized index blocks (the CUDA router keeps
     * expert lane + 32u in lane `lane`), strongest first; every other expert whose
     * index is not a multiple of 4 is cold, the rest keep their random rows. */
    const int hot[8] = {5, E / 4 - 1, E / 4, E / 2 - 1, E / 2, 25 * E / 32, E - 2, E - 1};
    const float mu[8] = {6.0f, 5.0f, 4.0f, 3.0f, 2.5f, 2.0f, 1.5f, 1.0f};
    for (int i = 0; i < 8; i++)
        if (e == hot[i]) return mu[i];
    return e % 4 ? -8.0f : 0.0f;
}

/* splitmix64: a counter-based generator, so any element is reproducible. */
static inline uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static inline float unif(uint64_t key) { return (float)((mix(key) >> 40) * (1.0 / 16777216.0)); } /* [0,1) */

/* Fill spec s (index si) into buf. Scales and biases of a group come from the
 * same key so that s and b match; biases centre the codes' mean. */
static void fill(const spec *s, int si, uint64_t seed, lilac_synth_router router, void *buf) {
    const uint64_t base = mix(seed * 1000003ull + (uint64_t)si * 7919ull);
    size_t n = s->nbytes / st_dtype_size(s->dtype);
    /* TIES: every router row repeats row 0 (elements keyed by their column only). */
    const size_t row_len = (size_t)s->shape[1];
    const bool tie = router == LILAC_ROUTER_TIES && s->role == R_ROUTER;
    const bool offset = router == LILAC_ROUTER_ONE || router == LILAC_ROUTER_SKEW;
    if (s->kind == K_CODES) {
        uint32_t *u = buf;
        for (size_t i = 0; i < n; i++) u[i] = (uint32_t)mix(base + (tie ? i % row_len : i));
        return;
    }
    /* ONE/SKEW: the router bias shift per unit of logit shift. A token's normalised
     * hidden state carries the embedding offset c as c/sqrt(1+c^2) per entry
     * (entries of sd 1 plus c, RMS-normalised), so raising every bias of a router
     * row by a adds a*H*c/sqrt(1+c^2) to its logit. Each layer's output dilutes
     * that share of the residual stream: measured on the CPU reference at the real
     * dimensions, the mean entry of the normalised MoE input falls as about
     * 0.43/sqrt(1 + 0.37*layer) (0.43, 0.29, 0.20 at layers 0, 3, 11), so the
     * shift grows with depth by sqrt(1 + layer/3) to keep the skew through all 40. */
    const float c = LILAC_SYNTH_EMBED_OFFSET;
    const float per_logit = sqrtf(1.0f + (float)s->layer / 3.0f) / ((float)row_len * 64.0f * c / sqrtf(1.0f + c * c));
    uint16_t *h = buf;
    float *f = buf;
    const float levels = (float)((1 << s->bits) - 1);
    const float q_sd = levels / sqrtf(12.0f) * sqrtf(1.0f + 2.0f / levels); /* sd of uniform {0..levels} */
    for (size_t i = 0; i < n; i++) {
        /* group key: shared by the scales and biases tensors of one matrix (si-1/si-2 offsets). */
        float v;
        switch (s->kind) {
        case K_SCALES:
        case K_BIASES: {
            const int owner = s->kind == K_SCALES ? si - 1 : si - 2; /* the .weight spec index */
            const uint64_t gk = mix(seed * 1000003ull + (uint64_t)owner * 7919ull + 0x5151) + (tie ? i % row_len : i);
            const float jitter = 0.75f + 0.5f * unif(gk);
            const float sc = (unif(gk ^ 0xabcdef) < 0.5f ? -1.0f : 1.0f) * s->sigma * jitter / q_sd;
            v = s->kind == K_SCALES ? sc : -sc * levels * 0.5f;
            if (s->kind == K_BIASES && offset && s->role == R_EMBED) v += c;
            if (s->kind == K_BIASES && offset && s->role == R_ROUTER)
                v += per_logit * lilac_synth_router_shift(router, (int)s->shape[0], (int)(i / row_len));
            h[i] = f32_to_bf16(v);
            break;
        }
        case K_GAIN: h[i] = f32_to_bf16(1.0f + 0.1f * (unif(base + i) - 0.5f)); break;
        case K_ONES: h[i] = f32_to_bf16(1.0f); break;
        case K_CONV: h[i] = f32_to_bf16(0.5f * (unif(base + i) - 0.5f)); break;
        case K_DTBIAS: h[i] = f32_to_bf16(0.5f * (unif(base + i) - 0.5f)); break;
        case K_ALOG: f[i] = logf(1.0f + 15.0f * unif(base + i)); break;
        }
    }
}

void lilac_synth_ensure_attention(lilac_config *c) {
    if (c->n_layers < 2) return;
    for (int l = 0; l < c->n_layers; l++)
        if (c->is_full[l]) return;
    c->is_full[c->n_layers - 1] = true;
}

static void write_config(FILE *f, const lilac_config *c, const char *note) {
    const int L = c->n_layers, nfreq = c->rotary_dim / 2, ms = (nfreq * 11 + 16) / 32;
    fprintf(f, "{\n  \"model_type\": \"qwen3_5_moe\",\n  \"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"],\n");
    if (note) fprintf(f, "  \"lilac_note\": \"%s\",\n", note);
    fprintf(f, "  \"tie_word_embeddings\": false,\n  \"text_config\": {\n    \"model_type\": \"qwen3_5_moe_text\",\n");
    fprintf(f, "    \"hidden_size\": %lld, \"num_hidden_layers\": %d, \"vocab_size\": %lld, \"rms_norm_eps\": %g,\n",
            (long long)c->hidden, L, (long long)c->vocab, (double)c->rms_eps);
    fprintf(f, "    \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"full_attention_interval\": %d,\n",
            c->n_heads, c->n_kv_heads, c->head_dim, c->full_interval);
    fprintf(f, "    \"layer_types\": [");
    for (int l = 0; l < L; l++) fprintf(f, "%s\"%s\"", l ? ", " : "", c->is_full[l] ? "full_attention" : "linear_attention");
    fprintf(f, "],\n    \"linear_num_key_heads\": %d, \"linear_num_value_heads\": %d, \"linear_key_head_dim\": %d,\n",
            c->lin_k_heads, c->lin_v_heads, c->lin_k_dim);
    fprintf(f, "    \"linear_value_head_dim\": %d, \"linear_conv_kernel_dim\": %d,\n", c->lin_v_dim, c->conv_kernel);
    fprintf(f, "    \"num_experts\": %d, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %lld,\n", c->n_experts,
            c->top_k, (long long)c->moe_inter);
    fprintf(f, "    \"shared_expert_intermediate_size\": %lld, \"max_position_embeddings\": %lld,\n",
            (long long)c->shared_inter, (long long)c->max_pos);
    fprintf(f, "    \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %.17g, \"partial_rotary_factor\": %.17g, "
               "\"mrope_section\": [%d, %d, %d], \"mrope_interleaved\": true},\n",
            c->rope_theta, (double)c->rotary_dim / c->head_dim, ms, ms, nfreq - 2 * ms);
    fprintf(f, "    \"eos_token_id\": %d, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"\n  },\n", c->eos_id);
    fprintf(f, "  \"quantization\": {\n    \"group_size\": 64, \"bits\": 4, \"mode\": \"affine\"");
    for (int l = 0; l < L; l++)
        for (int k = 0; k < lilac_n_layer_tensors; k++) {
            const lilac_layer_tensor *t = &lilac_layer_tensors[k];
            if (!lilac_tensor_is_matrix(t) || t->bits == 4 || !lilac_tensor_in_layer(t, c, l)) continue;
            char n[200];
            lilac_tensor_mlx_name(n, sizeof n, t, l);
            fprintf(f, ",\n    \"%s\": {\"group_size\": 64, \"bits\": %d}", n, t->bits);
        }
    fprintf(f, "\n  }\n}\n");
}

int lilac_synth_write(const char *out, const lilac_config *cc, const lilac_synth_opts *o, lilac_err *err) {
    const lilac_config *c = cc;
    const int64_t H = c->hidden, E = c->n_experts, I = c->moe_inter, SI = c->shared_inter;
    const int64_t VD = cfg_lin_val_dim(c), hd = c->head_dim;
    const uint64_t seed = o->seed;
    if (H % 64 || VD % 64 || I % 64 || SI % 64 || (2 * c->n_heads * hd) % 64 || c->vocab < 1)
        return lilac_fail(err, "synth: hidden, value and expert widths must be multiples of the group size 64");

    specs S = {0};
    char n[200];
    add_q(&S, "language_model.model.embed_tokens", 0, c->vocab, H, 4, 1.0f * sqrtf((float)H));
    mark(&S, R_EMBED, 0);
    add_q(&S, "language_model.lm_head", 0, c->vocab, H, 4, 2.0f);
    add(&S, "language_model.model.norm.weight", ST_BF16, 1, H, 0, 0, K_GAIN, 0, 0);
    int max_rank = 0;
    for (int k = 0; k < lilac_n_layer_tensors; k++)
        max_rank = lilac_layer_tensors[k].synth_rank > max_rank ? lilac_layer_tensors[k].synth_rank : max_rank;
    for (int l = 0; l < c->n_layers; l++)
        for (int r = 0; r <= max_rank; r++) /* synth's own order: its seeds key on the position */
            for (int k = 0; k < lilac_n_layer_tensors; k++) {
                const lilac_layer_tensor *t = &lilac_layer_tensors[k];
                if (t->synth_rank != r || !lilac_tensor_in_layer(t, c, l)) continue;
                const int64_t rows = lilac_dim_size(c, t->rows);
                lilac_tensor_mlx_name(n, sizeof n, t, l);
                switch (t->kind) {
                case TK_MATRIX:
                case TK_EXPERTS:
                    add_q(&S, n, t->kind == TK_EXPERTS ? E : 0, rows, lilac_dim_size(c, t->cols), t->bits, 1.0f);
                    if (t->field == offsetof(lilac_layer, router)) mark(&S, R_ROUTER, l);
                    break;
                case TK_GAIN:
                case TK_NORM_W: add(&S, n, ST_BF16, 1, rows, 0, 0, K_GAIN, 0, 0); break;
                case TK_DT_BIAS: add(&S, n, ST_BF16, 1, rows, 0, 0, K_DTBIAS, 0, 0); break;
                case TK_A_LOG: add(&S, n, ST_F32, 1, rows, 0, 0, K_ALOG, 0, 0); break;
                case TK_CONV: add(&S, n, ST_BF16, 3, rows, c->conv_kernel, 1, K_CONV, 0, 0); break;
                }
            }
    /* Shards of at most ~5 GB, in spec order. */
    const size_t SHARD = o->shard_bytes ? o->shard_bytes : (size_t)-1;
    int n_shards = 1;
    size_t cur = 0;
    for (int i = 0; i < S.n; i++) {
        if (cur && cur + S.v[i].nbytes > SHARD) { n_shards++; cur = 0; }
        S.v[i].shard = n_shards - 1;
        S.v[i].offset = cur;
        cur += S.v[i].nbytes;
    }
    if (mkdir(out, 0755) < 0 && errno != EEXIST) {
        free(S.v);
        return lilac_fail(err, "synth: cannot create %s: %s", out, strerror(errno));
    }

    char path[4096];
    size_t total = 0;
    double t0 = lilac_now();
    int *fds = xcalloc((size_t)n_shards, sizeof(int));
    size_t *hdr = xcalloc((size_t)n_shards, sizeof(size_t));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
    FILE *idx = fopen(path, "w");
    if (!idx) lilac_die("synth: %s: %s", path, strerror(errno));
    fprintf(idx, "{\n  \"metadata\": {},\n  \"weight_map\": {");
    for (int sh = 0; sh < n_shards; sh++) {
        /* Header JSON, padded with spaces to a multiple of 8 bytes. */
        size_t cap = 1 << 20, len = 0;
        char *h = xmalloc(cap);
        len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"mlx\"}");
        for (int i = 0; i < S.n; i++) {
            const spec *s = &S.v[i];
            if (s->shard != sh) continue;
            if (cap - len < 512) h = xrealloc(h, cap *= 2);
            len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", s->name,
                                    st_dtype_name(s->dtype));
            for (int d = 0; d < s->ndim; d++) len += (size_t)snprintf(h + len, cap - len, d ? ",%lld" : "%lld", (long long)s->shape[d]);
            len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", s->offset, s->offset + s->nbytes);
            fprintf(idx, "%s\n    \"%s\": \"model-%05d-of-%05d.safetensors\"", total++ ? "," : "", s->name, sh + 1, n_shards);
        }
        len += (size_t)snprintf(h + len, cap - len, "}");
        while (len % 8) h[len++] = ' ';
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", out, sh + 1, n_shards);
        fds[sh] = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fds[sh] < 0) lilac_die("synth: %s: %s", path, strerror(errno));
        uint64_t hl = len;
        unsigned char le[8];
        for (int b = 0; b < 8; b++) le[b] = (unsigned char)(hl >> (8 * b));
        if (write(fds[sh], le, 8) != 8 || write(fds[sh], h, len) != (ssize_t)len)
            lilac_die("synth: writing %s: %s", path, strerror(errno));
        hdr[sh] = 8 + len;
        free(h);
    }
    fprintf(idx, "\n  }\n}\n");
    fclose(idx);

    size_t bytes = 0;
    int failed = 0, done_tensors = 0, tenth = 0;
    const bool tty = isatty(STDERR_FILENO);
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : bytes, failed)
    for (int i = 0; i < S.n; i++) {
        const spec *s = &S.v[i];
        void *buf = malloc(s->nbytes ? s->nbytes : 1);
        if (!buf) { failed++; continue; }
        fill(s, i, (uint64_t)seed, o->router, buf);
        size_t done = 0;
        while (done < s->nbytes) {
            ssize_t w = pwrite(fds[s->shard], (char *)buf + done, s->nbytes - done, (off_t)(hdr[s->shard] + s->offset + done));
            if (w <= 0) { failed++; break; }
            done += (size_t)w;
        }
        bytes += done;
        free(buf);
        if (!o->quiet) { /* a line per 10% of the tensors, or a TTY bar */
#pragma omp critical(synth_progress)
            {
                const int t = 10 * ++done_tensors / S.n;
                if (tty) fprintf(stderr, "\rsynth: %d/%d tensors (%d%%)\033[K", done_tensors, S.n, 100 * done_tensors / S.n);
                else if (t > tenth) fprintf(stderr, "synth: %d/%d tensors (%d%%)\n", done_tensors, S.n, 100 * done_tensors / S.n);
                if (t > tenth) tenth = t;
            }
        }
    }
    if (!o->quiet && tty) fputs("\r\033[K", stderr);
    for (int sh = 0; sh < n_shards; sh++)
        if (close(fds[sh]) < 0) failed++;
    if (failed) lilac_die("synth: writing the checkpoint failed (disk full?)");

    snprintf(path, sizeof path, "%s/config.json", out);
    FILE *f = fopen(path, "w");
    if (!f) {
        free(S.v);
        return lilac_fail(err, "synth: %s: %s", path, strerror(errno));
    }
    write_config(f, c, o->config_note);
    if (fclose(f) != 0) {
        free(S.v);
        return lilac_fail(err, "synth: writing %s failed", path);
    }
    double t1 = lilac_now();
    if (!o->quiet)
        fprintf(stderr, "synth: %d tensors, %.2f GB in %d shard(s) in %.1f s (%.2f GB/s, %d threads), seed %llu\n", S.n,
                bytes / 1e9, n_shards, t1 - t0, bytes / 1e9 / (t1 - t0), omp_get_max_threads(), (unsigned long long)seed);
    free(fds);
    free(hdr);
    free(S.v);
    return 0;
}
