/* convert.c — `lilac convert`: see convert.h.
 *
 * What mlx-lm's conversion does, step by step, and where it is mirrored here:
 *  - load_config: config.json, plus generation_config.json's eos_token_id copied to
 *    the top level (write_config);
 *  - Model(args): TextModelArgs renames rope_parameters.rope_type -> type in place,
 *    and that mutated dict is what gets saved (write_config);
 *  - sanitize (spec §2.2): vision and mtp.* dropped (lilac keeps a whole MTP
 *    head, quantized, in mtp.safetensors outside the index: add_mtp), names moved under
 *    language_model., fused experts split into switch_mlp.{gate,up,down}_proj,
 *    conv1d [C,1,K] -> [C,K,1] (same bytes: the middle axis has size 1), norms
 *    bf16(w+1) (build_plan, run_unit);
 *  - cast to the config dtype (bfloat16) except A_log (cast_predicate);
 *  - quantize_model: every Linear/Embedding/SwitchLinear whose input width divides
 *    the group size, mlp.gate and mlp.shared_expert_gate at 8 bits / 64 (the
 *    model's quant_predicate), MLX's CPU affine quantizer (quantize_group);
 *  - save_model: tensors in the model's parameter order cut into shards of at most
 *    5 GiB, each shard a safetensors file whose header has sorted keys and no
 *    padding ({"__metadata__":{"format":"mlx"}}), model.safetensors.index.json
 *    (json.dump indent=4) with total_size and total_parameters;
 *  - save_config: top-level keys sorted, vision_config and _name_or_path dropped,
 *    quantization (+ per-module overrides) duplicated as quantization_config,
 *    json.dump indent=4 (py_json_dump reproduces Python's formatting).
 * Tensor data inside a shard is laid out in name order (MLX uses its hash map's
 * order, which is not reproducible); every tensor's bytes, the header entries'
 * names/dtypes/shapes, the index and the config are identical.
 *
 * Streaming: the work is cut into units of at most ~8 MiB of input (rows of a
 * matrix; one expert of a fused expert tensor at most), read with pread, quantized
 * and written with pwrite straight to their final offsets, on all threads. Memory is
 * a few buffers per thread. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "../model/config.h"
#include "../model/quantize.h"
#include "../model/safetensors.h"
#include "../model/tensors.h"
#include "../util/diag.h"
#include "../util/sbuf.h"
#include "convert.h"


/* ------------------------------------------------------------------------- */
/* The plan: output tensors and the jobs that produce them.                  */

typedef enum { K_QUANT, K_BF16, K_KEEP, K_NORM } job_kind;

typedef struct {
    char name[200];
    st_dtype dtype;
    int ndim;
    int64_t shape[3];
    size_t nbytes;
    int64_t numel_orig; /* parameters counted by mlx-lm's total_parameters */
    int shard;
    size_t off; /* offset in the shard's data region */
    bool mtp;   /* goes to the MTP sidecar mtp.safetensors (not in the index) */
} otensor;

typedef struct {
    job_kind kind;
    const st_tensor *src;
    int64_t E, rows, cols;      /* K_QUANT: per-expert output geometry (E = 1 for 2-D) */
    int64_t src_rows_e, row0;   /* K_QUANT: source rows per expert, first source row used */
    int bits, group;
    int out[3];                 /* otensor indices (weight, scales, biases) or out[0] */
} job;

typedef struct {
    int job;
    int64_t e, r0, n; /* K_QUANT: rows [r0, r0+n) of expert e; else elements [r0, r0+n) */
    size_t in_bytes;
} unit;

typedef struct {
    otensor *t;
    int nt, capt;
    job *j;
    int nj, capj;
    unit *u;
    int nu, capu;
    size_t in_total; /* bytes of input read */
} plan;

static int add_out(plan *P, const char *name, st_dtype dt, int ndim, const int64_t *shape, int64_t numel_orig) {
    if (P->nt == P->capt) P->t = xrealloc(P->t, sizeof(otensor) * (size_t)(P->capt = P->capt ? 2 * P->capt : 256));
    otensor *t = &P->t[P->nt];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    size_t n = st_dtype_size(dt);
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    t->nbytes = n;
    t->numel_orig = numel_orig;
    return P->nt++;
}

static job *add_job(plan *P) {
    if (P->nj == P->capj) P->j = xrealloc(P->j, sizeof(job) * (size_t)(P->capj = P->capj ? 2 * P->capj : 256));
    job *j = &P->j[P->nj++];
    memset(j, 0, sizeof *j);
    return j;
}

static int64_t st_numel(const st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

typedef struct {
    const st_set *st;
    const lilac_config *cfg;
    int bits, group;
    bool cast_bf16; /* config dtype is bfloat16: floating tensors (but A_log) cast to bf16 */
    lilac_err *err;
    bool *used;     /* per input tensor: consumed by the plan */
} ctx;

/* Find source tensor `name`, check its shape and that its dtype is one we convert. */
static const st_tensor *need(ctx *C, const char *name, int ndim, int64_t a, int64_t b, int64_t c) {
    const st_tensor *t = st_find(C->st, name);
    if (!t) {
        lilac_fail(C->err, "convert: tensor %s is missing from the checkpoint", name);
        return NULL;
    }
    int64_t want[3] = {a, b, c};
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    char s1[96], s2[96];
    if (!ok) {
        lilac_fail(C->err, "convert: tensor %s: expected shape %s, found %s", name, lilac_shape_str(s1, sizeof s1, ndim, want),
                   lilac_shape_str(s2, sizeof s2, t->ndim, t->shape));
        return NULL;
    }
    if (t->dtype != ST_BF16 && !(t->dtype == ST_F32 && C->cast_bf16)) {
        lilac_fail(C->err, "convert: tensor %s: expected dtype BF16%s, found %s", name, C->cast_bf16 ? " or F32" : "",
                   st_dtype_name(t->dtype));
        return NULL;
    }
    C->used[t - C->st->tensors] = true;
    return t;
}

/* A matrix (or E stacked matrices): quantized when its width divides the group size. */
static int add_matrix(plan *P, ctx *C, const char *out, const st_tensor *src, int64_t E, int64_t rows, int64_t cols,
                      int64_t src_rows_e, int64_t row0, bool gate8) {
    char n[240];
    const bool stacked = src->ndim == 3;
    if (cols % C->group != 0) { /* mlx-lm leaves it unquantized */
        if (row0 != 0 || src_rows_e != rows) /* a slice of a fused tensor: not supported */
            return lilac_fail(C->err, "convert: %s: width %lld is not a multiple of the group size %d", src->name,
                              (long long)cols, C->group);
        job *j = add_job(P);
        j->kind = K_BF16;
        j->src = src;
        snprintf(n, sizeof n, "%s.weight", out);
        j->out[0] = add_out(P, n, ST_BF16, src->ndim, src->shape, st_numel(src));
        return 0;
    }
    const int bits = gate8 ? 8 : C->bits, group = gate8 ? 64 : C->group;
    if (cols % group) return lilac_fail(C->err, "convert: %s: width %lld is not a multiple of 64", src->name, (long long)cols);
    job *j = add_job(P);
    *j = (job){.kind = K_QUANT, .src = src, .E = E, .rows = rows, .cols = cols, .src_rows_e = src_rows_e, .row0 = row0,
               .bits = bits, .group = group};
    int64_t sw[3], ss[3];
    int nd = stacked ? 3 : 2, k = 0;
    if (stacked) sw[k] = ss[k] = E, k++;
    sw[k] = ss[k] = rows;
    sw[k + 1] = cols * bits / 32;
    ss[k + 1] = cols / group;
    snprintf(n, sizeof n, "%s.weight", out);
    j->out[0] = add_out(P, n, ST_U32, nd, sw, E * rows * cols);
    snprintf(n, sizeof n, "%s.scales", out);
    j->out[1] = add_out(P, n, ST_BF16, nd, ss, 0);
    snprintf(n, sizeof n, "%s.biases", out);
    j->out[2] = add_out(P, n, ST_BF16, nd, ss, 0);
    return 0;
}

static int add_vec(plan *P, ctx *C, const char *out, const st_tensor *src, job_kind kind, int ndim, const int64_t *shape) {
    job *j = add_job(P);
    j->kind = kind;
    j->src = src;
    st_dtype dt = kind == K_KEEP ? src->dtype : ST_BF16;
    if (kind != K_KEEP && !C->cast_bf16) dt = src->dtype;
    j->out[0] = add_out(P, out, dt, ndim, shape, st_numel(src));
    return 0;
}

/* One tensor of a layer (tensors.h): its HF source s checked, its MLX output(s) o planned; hf_prefix:
 * the layer's HF prefix (for the per-expert check). */
static int add_layer_tensor_named(plan *P, ctx *C, const lilac_layer_tensor *lt, const char *s, const char *o,
                                  const char *hf_prefix) {
    const lilac_config *c = C->cfg;
    const int64_t rows = lilac_dim_size(c, lt->rows), cols = lilac_dim_size(c, lt->cols), E = c->n_experts;
    const st_tensor *t;
    switch (lt->kind) {
    case TK_MATRIX:
        if (!(t = need(C, s, 2, rows, cols, 0))) return -1;
        return add_matrix(P, C, o, t, 1, rows, cols, rows, 0, lt->bits == 8);
    case TK_EXPERTS: {
        const int64_t parts = lt->hf_parts > 1 ? lt->hf_parts : 1;
        if (lt->hf_parts > 1 && lt->hf_part == 0 && !st_find(C->st, s)) {
            char alt[240];
            snprintf(alt, sizeof alt, "%smlp.experts.0.gate_proj.weight", hf_prefix);
            if (st_find(C->st, alt))
                return lilac_fail(C->err, "convert: %s: experts stored one by one; only the fused layout "
                                          "(mlp.experts.gate_up_proj, as in Qwen/Qwen3.6-35B-A3B) is supported", alt);
        }
        if (!(t = need(C, s, 3, E, parts * rows, cols))) return -1;
        return add_matrix(P, C, o, t, E, rows, cols, parts * rows, lt->hf_part * rows, false);
    }
    case TK_CONV: {
        const int64_t K = c->conv_kernel, cs[3] = {rows, K, 1};
        if (!(t = need(C, s, 3, rows, 1, K))) return -1;
        return add_vec(P, C, o, t, K_BF16, 3, cs);
    }
    case TK_GAIN:
    case TK_NORM_W:
    case TK_DT_BIAS:
    case TK_A_LOG:
        if (!(t = need(C, s, 1, rows, 0, 0))) return -1;
        /* A_log stays as stored (mlx-lm's cast_predicate); norm gains become bf16(1+w); the rest is cast */
        add_vec(P, C, o, t, lt->kind == TK_A_LOG ? K_KEEP : lt->kind == TK_GAIN ? K_NORM : K_BF16, 1, t->shape);
        if (lt->flags & TF_NONLEAF) P->t[P->nt - 1].numel_orig = 0;
        return 0;
    }
    return 0;
}

static int add_layer_tensor(plan *P, ctx *C, const lilac_layer_tensor *lt, int l) {
    char s[240], o[240], pre[64];
    lilac_tensor_hf_name(s, sizeof s, lt, l);
    lilac_tensor_mlx_name(o, sizeof o, lt, l);
    snprintf(pre, sizeof pre, LILAC_HF_LAYER, l);
    return add_layer_tensor_named(P, C, lt, s, o, pre);
}

/* Whether the checkpoint carries an MTP head (a stray mtp.* tensor or two does not count). */
static bool has_mtp_head(const st_set *st) {
    return st_find(st, "mtp.fc.weight") && st_find(st, LILAC_MTP_LAYER "input_layernorm.weight");
}

/* The MTP head for mtp.safetensors: quantized as the main model's layers are (4-bit, the router and
 * shared-expert gate 8-bit), norms bf16(1+w), names as lilac_mtp_tensor_name's MLX form. */
static int add_mtp(plan *P, ctx *C) {
    const lilac_config *c = C->cfg;
    const int first = P->nt;
    char s[240], o[240];
    for (int k = 0; k < lilac_n_mtp_tensors; k++) {
        const lilac_layer_tensor *lt = &lilac_mtp_tensors[k];
        const int64_t rows = lilac_dim_size(c, lt->rows), cols = lilac_dim_size(c, lt->cols);
        const st_tensor *t;
        if (lilac_tensor_is_matrix(lt)) {
            snprintf(s, sizeof s, "%s.weight", lt->name);
            if (!(t = need(C, s, 2, rows, cols, 0)) || add_matrix(P, C, lt->name, t, 1, rows, cols, rows, 0, false)) return -1;
        } else {
            if (!(t = need(C, lt->name, 1, rows, 0, 0))) return -1;
            add_vec(P, C, lt->name, t, K_NORM, 1, t->shape);
        }
    }
    for (int k = 0; k < lilac_n_layer_tensors; k++) {
        const lilac_layer_tensor *lt = &lilac_layer_tensors[k];
        if (!lilac_tensor_in_mtp(lt)) continue;
        lilac_mtp_tensor_name(s, sizeof s, lt, true);
        lilac_mtp_tensor_name(o, sizeof o, lt, false);
        if (add_layer_tensor_named(P, C, lt, s, o, LILAC_MTP_LAYER) < 0) return -1;
    }
    for (int i = first; i < P->nt; i++) P->t[i].mtp = true;
    return 0;
}

/* Every output tensor, in the order of mlx-lm's model.parameters() (which decides
 * the shard split), then the MTP head's (its own file). */
static int build_plan(plan *P, ctx *C, bool no_mtp, bool mtp_only) {
    const lilac_config *c = C->cfg;
    const int64_t H = c->hidden, V = c->vocab;
    const char *HP = "model.language_model.", *OP = "language_model.model.";
    char s[240], o[240];
    const st_tensor *t;
#define SRC(...) (snprintf(s, sizeof s, __VA_ARGS__), s)
#define OUT(...) (snprintf(o, sizeof o, __VA_ARGS__), o)
#define NEED(nd, a, b, cc) if (!(t = need(C, s, nd, a, b, cc))) return -1

    if (mtp_only) {
        if (!has_mtp_head(C->st))
            return lilac_fail(C->err, "convert: --mtp-only: the checkpoint has no MTP head (mtp.fc.weight and "
                                      LILAC_MTP_LAYER "input_layernorm.weight)");
        return add_mtp(P, C);
    }
    SRC("%sembed_tokens.weight", HP);
    NEED(2, V, H, 0);
    if (add_matrix(P, C, OUT("%sembed_tokens", OP), t, 1, V, H, V, 0, false)) return -1;
    for (int l = 0; l < c->n_layers; l++)
        for (int k = 0; k < lilac_n_layer_tensors; k++) {
            const lilac_layer_tensor *lt = &lilac_layer_tensors[k];
            if (!lilac_tensor_in_layer(lt, c, l)) continue;
            if (add_layer_tensor(P, C, lt, l) < 0) return -1;
        }
    SRC("%snorm.weight", HP);
    NEED(1, H, 0, 0);
    add_vec(P, C, OUT("%snorm.weight", OP), t, K_NORM, 1, t->shape);
    if (!c->tie_embeddings) {
        SRC("lm_head.weight");
        NEED(2, V, H, 0);
        if (add_matrix(P, C, "language_model.lm_head", t, 1, V, H, V, 0, false)) return -1;
    } else if ((t = st_find(C->st, "lm_head.weight"))) {
        C->used[t - C->st->tensors] = true; /* tied: sanitize drops it */
    }
    if (!no_mtp && has_mtp_head(C->st) && add_mtp(P, C) < 0) return -1;
    /* Everything else must be vision or MTP. */
    for (int i = 0; i < C->st->n_tensors; i++) {
        const st_tensor *x = &C->st->tensors[i];
        if (C->used[i]) continue;
        const bool mtp = strstr(x->name, "mtp.") != NULL;
        if (!strncmp(x->name, "model.visual.", 13) || !strncmp(x->name, "vision_tower", 12)) continue;
        if (mtp) continue; /* --no-mtp, or not a whole head */
        return lilac_fail(C->err, "convert: unexpected tensor %s (%s %s) in %s: not part of a qwen3_5_moe checkpoint "
                                  "with this config", x->name, st_dtype_name(x->dtype),
                          lilac_shape_str(s, sizeof s, x->ndim, x->shape), C->st->shards[x->shard].path);
    }
#undef SRC
#undef OUT
#undef NEED
    return 0;
}

/* Cut jobs into units of at most ~8 MiB of input. */
#define UNIT_BYTES ((size_t)8 << 20)

static void add_unit(plan *P, int j, int64_t e, int64_t r0, int64_t n, size_t in_bytes) {
    if (P->nu == P->capu) P->u = xrealloc(P->u, sizeof(unit) * (size_t)(P->capu = P->capu ? 2 * P->capu : 1024));
    P->u[P->nu++] = (unit){j, e, r0, n, in_bytes};
    P->in_total += in_bytes;
}

static void make_units(plan *P) {
    for (int ji = 0; ji < P->nj; ji++) {
        const job *j = &P->j[ji];
        const size_t es = st_dtype_size(j->src->dtype);
        if (j->kind == K_QUANT) {
            const size_t row_bytes = (size_t)j->cols * es;
            int64_t step = (int64_t)(UNIT_BYTES / row_bytes);
            if (step < 1) step = 1;
            for (int64_t e = 0; e < j->E; e++)
                for (int64_t r = 0; r < j->rows; r += step) {
                    int64_t n = j->rows - r < step ? j->rows - r : step;
                    add_unit(P, ji, e, r, n, (size_t)n * row_bytes);
                }
        } else {
            const int64_t numel = st_numel(j->src);
            const int64_t step = (int64_t)(UNIT_BYTES / es);
            for (int64_t r = 0; r < numel || (numel == 0 && r == 0); r += step) {
                int64_t n = numel - r < step ? numel - r : step;
                add_unit(P, ji, 0, r, n, (size_t)n * es);
                if (numel == 0) break;
            }
        }
    }
}

/* ------------------------------------------------------------------------- */
/* I/O helpers.                                                              */

static int pread_all(int fd, void *buf, size_t n, off_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, off + (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        done += (size_t)r;
    }
    return 0;
}

static int pwrite_all(int fd, const void *buf, size_t n, off_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(fd, (const char *)buf + done, n - done, off + (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        done += (size_t)w;
    }
    return 0;
}

static char *pjoin(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

static int copy_file(const char *src, const char *dst, lilac_err *err) {
    int in = open(src, O_RDONLY);
    if (in < 0) return lilac_fail(err, "convert: %s: %s", src, strerror(errno));
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0) {
        close(in);
        return lilac_fail(err, "convert: %s: %s", dst, strerror(errno));
    }
    char buf[1 << 16];
    ssize_t r;
    off_t off = 0;
    int rc = 0;
    while ((r = read(in, buf, sizeof buf)) > 0) {
        if (pwrite_all(out, buf, (size_t)r, off) < 0) {
            rc = -1;
            break;
        }
        off += r;
    }
    if (r < 0) rc = -1;
    if (fsync(out) != 0) rc = -1;
    close(in);
    if (close(out) != 0) rc = -1;
    if (rc) return lilac_fail(err, "convert: copying %s to %s failed: %s", src, dst, strerror(errno));
    return 0;
}

/* Remove a directory this tool created (flat: files only). */
static int remove_partial(const char *dir, lilac_err *err) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : lilac_fail(err, "convert: %s: %s", dir, strerror(errno));
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char *p = pjoin(dir, de->d_name);
        if (unlink(p) != 0) {
            lilac_fail(err, "convert: cannot remove %s: %s", p, strerror(errno));
            free(p);
            closedir(d);
            return -1;
        }
        free(p);
    }
    closedir(d);
    if (rmdir(dir) != 0) return lilac_fail(err, "convert: cannot remove %s: %s", dir, strerror(errno));
    return 0;
}

static int fsync_path(const char *p) {
    int fd = open(p, O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* Python json.dump(obj, indent=4) (ensure_ascii, shortest float repr).       */

/* repr(float) */
static void py_float(sbuf *b, double d) {
    if (isnan(d)) { sb_puts(b, "NaN"); return; }
    if (isinf(d)) { sb_puts(b, d > 0 ? "Infinity" : "-Infinity"); return; }
    if (d == 0) { sb_puts(b, signbit(d) ? "-0.0" : "0.0"); return; }
    char tmp[64];
    int p;
    for (p = 0; p < 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p, d);
        if (strtod(tmp, NULL) == d) break;
    }
    /* tmp: [-]D[.DDD]e[+-]XX */
    char digits[32];
    int nd = 0;
    const char *q = tmp;
    bool neg = *q == '-';
    if (neg) q++;
    while (*q && *q != 'e') {
        if (*q != '.') digits[nd++] = *q;
        q++;
    }
    int ex = atoi(q + 1);
    if (neg) sb_puts(b, "-");
    if (ex >= -4 && ex < 16) {
        if (ex >= 0) {
            for (int i = 0; i <= ex; i++) sb_put(b, i < nd ? &digits[i] : "0", 1);
            sb_puts(b, ".");
            if (nd > ex + 1) sb_put(b, digits + ex + 1, (size_t)(nd - ex - 1));
            else sb_puts(b, "0");
        } else {
            sb_puts(b, "0.");
            for (int i = 0; i < -ex - 1; i++) sb_puts(b, "0");
            sb_put(b, digits, (size_t)nd);
        }
    } else {
        sb_put(b, digits, 1);
        if (nd > 1) {
            sb_puts(b, ".");
            sb_put(b, digits + 1, (size_t)(nd - 1));
        }
        sb_printf(b, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    }
}

static void py_string(sbuf *b, const char *s, size_t n) {
    sb_puts(b, "\"");
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp;
        int len = 1;
        if (c < 0x80) cp = c;
        else if ((c & 0xE0) == 0xC0 && i + 1 < n) cp = ((c & 0x1Fu) << 6) | (s[i + 1] & 0x3F), len = 2;
        else if ((c & 0xF0) == 0xE0 && i + 2 < n) cp = ((c & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3F), len = 3;
        else if (i + 3 < n) cp = ((c & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) | (s[i + 3] & 0x3F), len = 4;
        else cp = 0xFFFD;
        i += (size_t)len;
        switch (cp) {
        case '"': sb_puts(b, "\\\""); continue;
        case '\\': sb_puts(b, "\\\\"); continue;
        case '\n': sb_puts(b, "\\n"); continue;
        case '\r': sb_puts(b, "\\r"); continue;
        case '\t': sb_puts(b, "\\t"); continue;
        case '\b': sb_puts(b, "\\b"); continue;
        case '\f': sb_puts(b, "\\f"); continue;
        default: break;
        }
        if (cp >= 0x20 && cp <= 0x7E) {
            char ch = (char)cp;
            sb_put(b, &ch, 1);
        } else if (cp >= 0x10000) {
            cp -= 0x10000;
            sb_printf(b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
        } else {
            sb_printf(b, "\\u%04x", cp);
        }
    }
    sb_puts(b, "\"");
}

static void py_indent(sbuf *b, int level) {
    sb_puts(b, "\n");
    for (int i = 0; i < level; i++) sb_puts(b, "    ");
}

static int cmp_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static void py_json(sbuf *b, json_t *v, int level, bool sort) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        size_t n = json_object_size(v);
        if (!n) { sb_puts(b, "{}"); return; }
        const char **keys = xmalloc(sizeof(char *) * n);
        size_t k = 0;
        const char *key;
        json_t *val;
        json_object_foreach(v, key, val) keys[k++] = key;
        if (sort) qsort(keys, n, sizeof *keys, cmp_key);
        sb_puts(b, "{");
        for (size_t i = 0; i < n; i++) {
            py_indent(b, level + 1);
            py_string(b, keys[i], strlen(keys[i]));
            sb_puts(b, ": ");
            py_json(b, json_object_get(v, keys[i]), level + 1, false);
            if (i + 1 < n) sb_puts(b, ",");
        }
        py_indent(b, level);
        sb_puts(b, "}");
        free(keys);
        return;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(v);
        if (!n) { sb_puts(b, "[]"); return; }
        sb_puts(b, "[");
        for (size_t i = 0; i < n; i++) {
            py_indent(b, level + 1);
            py_json(b, json_array_get(v, i), level + 1, false);
            if (i + 1 < n) sb_puts(b, ",");
        }
        py_indent(b, level);
        sb_puts(b, "]");
        return;
    }
    case JSON_STRING: py_string(b, json_string_value(v), json_string_length(v)); return;
    case JSON_INTEGER: sb_printf(b, "%lld", (long long)json_integer_value(v)); return;
    case JSON_REAL: py_float(b, json_real_value(v)); return;
    case JSON_TRUE: sb_puts(b, "true"); return;
    case JSON_FALSE: sb_puts(b, "false"); return;
    case JSON_NULL: sb_puts(b, "null"); return;
    }
}

static bool py_truthy(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return json_object_size(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_TRUE: return true;
    default: return false;
    }
}

/* config.json as mlx-lm's load_config -> Model(args) -> quantize_model -> save_config writes it. */
static int write_config(const char *from, const char *path, const lilac_config *c, int bits, int group, lilac_err *err) {
    char *cp = pjoin(from, "config.json");
    json_error_t je;
    json_t *root = json_load_file(cp, 0, &je);
    if (!root || !json_is_object(root)) {
        lilac_fail(err, "convert: %s: %s", cp, root ? "expected a JSON object" : je.text);
        free(cp);
        json_decref(root);
        return -1;
    }
    free(cp);
    char *gp = pjoin(from, "generation_config.json");
    json_t *gen = json_load_file(gp, 0, &je);
    free(gp);
    if (gen && json_is_object(gen)) {
        json_t *eos = json_object_get(gen, "eos_token_id");
        if (eos && py_truthy(eos)) json_object_set(root, "eos_token_id", eos);
    }
    json_decref(gen);
    json_t *tc = json_object_get(root, "text_config");
    if (!json_is_object(tc)) tc = root;
    json_t *rp = json_object_get(tc, "rope_parameters");
    if (json_is_object(rp) && json_object_size(rp) && !json_object_get(rp, "type") && json_object_get(rp, "rope_type")) {
        json_t *rt = json_incref(json_object_get(rp, "rope_type"));
        json_object_del(rp, "rope_type");
        json_object_set_new(rp, "type", rt);
    }
    json_t *q = json_object();
    json_object_set_new(q, "group_size", json_integer(group));
    json_object_set_new(q, "bits", json_integer(bits));
    json_object_set_new(q, "mode", json_string("affine"));
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < lilac_n_layer_tensors; i++) { /* the 8-bit gates */
            const lilac_layer_tensor *t = &lilac_layer_tensors[i];
            if (!lilac_tensor_is_matrix(t) || t->bits != 8 || !lilac_tensor_in_layer(t, c, l)) continue;
            char k[200];
            lilac_tensor_mlx_name(k, sizeof k, t, l);
            json_t *ov = json_object();
            json_object_set_new(ov, "group_size", json_integer(64));
            json_object_set_new(ov, "bits", json_integer(8));
            json_object_set_new(q, k, ov);
        }
    json_object_set(root, "quantization", q);
    json_object_set_new(root, "quantization_config", q);
    json_object_del(root, "_name_or_path");
    json_object_del(root, "vision_config");
    sbuf b = {0};
    py_json(&b, root, 0, true);
    json_decref(root);
    FILE *f = fopen(path, "wb");
    int rc = 0;
    if (!f || fwrite(b.p, 1, b.n, f) != b.n || fflush(f) != 0 || fsync(fileno(f)) != 0) rc = -1;
    if (f && fclose(f) != 0) rc = -1;
    free(b.p);
    if (rc) return lilac_fail(err, "convert: writing %s failed: %s", path, strerror(errno));
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Running the units.                                                        */

typedef struct {
    const plan *P;
    const st_set *st;
    int *in_fd;            /* per input shard */
    int *out_fd;           /* per output shard */
    size_t *data_start;    /* per output shard: 8 + header length */
    int failed;            /* first failure wins */
    char fail_msg[1024];
} runner;

static void fail_once(runner *R, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_once(runner *R, const char *fmt, ...) {
#pragma omp critical(convert_fail)
    {
        if (!R->failed) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(R->fail_msg, sizeof R->fail_msg, fmt, ap);
            va_end(ap);
            R->failed = 1;
        }
    }
}

static off_t src_off(const runner *R, const st_tensor *t) {
    return (off_t)((const char *)t->data - (const char *)R->st->shards[t->shard].map);
}

static int out_write(runner *R, int oi, const void *buf, size_t n, size_t off) {
    const otensor *t = &R->P->t[oi];
    if (pwrite_all(R->out_fd[t->shard], buf, n, (off_t)(R->data_start[t->shard] + t->off + off)) < 0) {
        fail_once(R, "convert: writing %s failed: %s", t->name, strerror(errno));
        return -1;
    }
    return 0;
}

typedef struct {
    void *in;
    uint16_t *h;
    uint32_t *q;
    uint16_t *s, *b;
    size_t cap_in, cap_h, cap_q, cap_s, cap_b;
} tbufs;

static void *grow(void *p, size_t *cap, size_t need) {
    if (need <= *cap) return p;
    free(p);
    *cap = need;
    return xmalloc(need);
}

static void elem_index(const st_tensor *t, int64_t i, char *buf, size_t cap) {
    int64_t idx[ST_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = t->shape[d] ? i % t->shape[d] : 0;
        i = t->shape[d] ? i / t->shape[d] : 0;
    }
    lilac_shape_str(buf, cap, t->ndim, idx);
}

/* The byte range of the input a unit reads. */
static void unit_range(const runner *R, const unit *u, int *fd, off_t *off) {
    const job *j = &R->P->j[u->job];
    const size_t es = st_dtype_size(j->src->dtype);
    *fd = R->in_fd[j->src->shard];
    if (j->kind == K_QUANT)
        *off = src_off(R, j->src) + (off_t)((size_t)(u->e * j->src_rows_e + j->row0 + u->r0) * (size_t)j->cols * es);
    else
        *off = src_off(R, j->src) + (off_t)((size_t)u->r0 * es);
}

static void prefetch_unit(const runner *R, const unit *u) {
    int fd;
    off_t off;
    unit_range(R, u, &fd, &off);
    posix_fadvise(fd, off, (off_t)u->in_bytes, POSIX_FADV_WILLNEED);
}

/* Read once: drop the pages so a 72 GB input does not churn the page cache. */
static void drop_unit(const runner *R, const unit *u) {
    int fd;
    off_t off;
    unit_range(R, u, &fd, &off);
    posix_fadvise(fd, off, (off_t)u->in_bytes, POSIX_FADV_DONTNEED);
}

static void run_unit(runner *R, const unit *u, tbufs *B) {
    const job *j = &R->P->j[u->job];
    const st_tensor *src = j->src;
    const int in_fd = R->in_fd[src->shard];
    const size_t es = st_dtype_size(src->dtype);
    char where[128];
    if (j->kind == K_QUANT) {
        const int64_t cols = j->cols, n = u->n;
        const int64_t src_row = u->e * j->src_rows_e + j->row0 + u->r0;
        B->in = grow(B->in, &B->cap_in, u->in_bytes);
        if (pread_all(in_fd, B->in, u->in_bytes, src_off(R, src) + (off_t)((size_t)src_row * (size_t)cols * es)) < 0) {
            fail_once(R, "convert: reading %s from %s failed: %s", src->name, R->st->shards[src->shard].path,
                      errno ? strerror(errno) : "file too short");
            return;
        }
        const uint16_t *w = B->in;
        if (src->dtype == ST_F32) { /* cast to bf16 first, as mlx-lm does before quantizing */
            B->h = grow(B->h, &B->cap_h, (size_t)(n * cols) * 2);
            const float *f = B->in;
            for (int64_t i = 0; i < n * cols; i++) B->h[i] = f32_to_bf16(f[i]);
            w = B->h;
        }
        const size_t qw = (size_t)(n * cols * j->bits / 32), ng = (size_t)(n * cols / j->group);
        B->q = grow(B->q, &B->cap_q, qw * 4);
        B->s = grow(B->s, &B->cap_s, ng * 2);
        B->b = grow(B->b, &B->cap_b, ng * 2);
        int64_t bad = lilac_affine_quantize_bf16(w, n, cols, j->bits, j->group, B->q, B->s, B->b);
        if (bad >= 0) {
            int64_t r = bad / cols, cidx = bad % cols;
            int64_t flat = (src_row + r) * cols + cidx;
            elem_index(src, flat, where, sizeof where);
            float x = bf16_to_f32(w[bad]);
            fail_once(R, "convert: %s%s is %s: refusing to quantize a non-finite weight", src->name, where,
                      isnan(x) ? "NaN" : (x > 0 ? "+inf" : "-inf"));
            return;
        }
        const size_t row0 = (size_t)(u->e * j->rows + u->r0);
        out_write(R, j->out[0], B->q, qw * 4, row0 * (size_t)(cols * j->bits / 32) * 4);
        out_write(R, j->out[1], B->s, ng * 2, row0 * (size_t)(cols / j->group) * 2);
        out_write(R, j->out[2], B->b, ng * 2, row0 * (size_t)(cols / j->group) * 2);
        return;
    }
    /* elementwise */
    B->in = grow(B->in, &B->cap_in, u->in_bytes);
    if (pread_all(in_fd, B->in, u->in_bytes, src_off(R, src) + (off_t)((size_t)u->r0 * es)) < 0) {
        fail_once(R, "convert: reading %s from %s failed", src->name, R->st->shards[src->shard].path);
        return;
    }
    const otensor *ot = &R->P->t[j->out[0]];
    if (j->kind == K_KEEP || (ot->dtype == src->dtype && j->kind == K_BF16)) {
        if (j->kind != K_KEEP) {
            const uint16_t *h = B->in;
            for (int64_t i = 0; i < u->n; i++)
                if (!isfinite(bf16_to_f32(h[i]))) {
                    elem_index(src, u->r0 + i, where, sizeof where);
                    fail_once(R, "convert: %s%s is not finite", src->name, where);
                    return;
                }
        }
        out_write(R, j->out[0], B->in, u->in_bytes, (size_t)u->r0 * es);
        return;
    }
    /* K_BF16 from F32, or K_NORM: w + 1 in the source dtype, then to the output dtype. */
    const size_t oes = st_dtype_size(ot->dtype);
    B->h = grow(B->h, &B->cap_h, (size_t)u->n * oes);
    for (int64_t i = 0; i < u->n; i++) {
        float x = src->dtype == ST_F32 ? ((const float *)B->in)[i] : bf16_to_f32(((const uint16_t *)B->in)[i]);
        if (!isfinite(x)) {
            elem_index(src, u->r0 + i, where, sizeof where);
            fail_once(R, "convert: %s%s is not finite", src->name, where);
            return;
        }
        if (j->kind == K_NORM) {
            x = x + 1.0f;
            if (src->dtype == ST_BF16) x = bf16_to_f32(f32_to_bf16(x));
        }
        if (ot->dtype == ST_BF16) B->h[i] = f32_to_bf16(x);
        else ((float *)(void *)B->h)[i] = x;
    }
    out_write(R, j->out[0], B->h, (size_t)u->n * oes, (size_t)u->r0 * oes);
}

/* ------------------------------------------------------------------------- */
/* Progress.                                                                 */

typedef struct {
    double t0, last;
    size_t done, total;
    bool tty, quiet;
    int printed, tenth; /* tenth: the last 10% step a line was printed for (not a TTY) */
} progress;

static void fmt_time(char *buf, size_t cap, double s) {
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, cap, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

static void progress_tick(progress *pg, size_t add, const char *name, bool final) {
    pg->done += add;
    if (pg->quiet) return;
    double now = lilac_now();
    /* A TTY bar at most 5 times a second; otherwise a line per 10% of the bytes. */
    const int tenth = pg->total ? (int)(10 * pg->done / pg->total) : 10;
    if (!final && (pg->tty ? now - pg->last < 0.2 : tenth <= pg->tenth)) return;
    pg->tenth = tenth;
    pg->last = now;
    double el = now - pg->t0, rate = el > 0 ? pg->done / el : 0;
    char eta[32];
    fmt_time(eta, sizeof eta, rate > 0 ? (pg->total - pg->done) / rate : -1);
    if (pg->tty) {
        fprintf(stderr, "\r\033[Kconvert: %5.1f%%  %.2f/%.2f GB  %.2f GB/s  ETA %s  %s", pg->total ? 100.0 * pg->done / pg->total : 100.0,
                pg->done / 1e9, pg->total / 1e9, rate / 1e9, eta, final ? "" : name);
        if (final) fputc('\n', stderr);
    } else {
        fprintf(stderr, "convert: %5.1f%%  %.2f/%.2f GB  %.2f GB/s  ETA %s  %s\n", pg->total ? 100.0 * pg->done / pg->total : 100.0,
                pg->done / 1e9, pg->total / 1e9, rate / 1e9, eta, final ? "done" : name);
    }
    fflush(stderr);
    pg->printed++;
}

/* ------------------------------------------------------------------------- */

static int cmp_otensor_name(const void *a, const void *b) {
    const otensor *x = *(const otensor *const *)a, *y = *(const otensor *const *)b;
    return strcmp(x->name, y->name);
}

static const char *const COPY_FILES[] = {
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
    "added_tokens.json", "chat_template.jinja", "chat_template.json", "generation_config.json",
};

static const char *dtype_cfg(json_t *root) {
    json_t *d = json_object_get(root, "torch_dtype");
    if (json_is_string(d)) return json_string_value(d);
    json_t *tc = json_object_get(root, "text_config");
    d = json_is_object(tc) ? json_object_get(tc, "dtype") : NULL;
    return json_is_string(d) ? json_string_value(d) : NULL;
}

int lilac_convert(const char *from, const char *to, const lilac_convert_opts *opt, lilac_err *err) {
    const int bits = opt->bits ? opt->bits : 4, group = opt->group ? opt->group : 64;
    if (bits != 2 && bits != 4 && bits != 8) return lilac_fail(err, "convert: --bits %d: supported are 2, 4 and 8", bits);
    if (group != 32 && group != 64 && group != 128)
        return lilac_fail(err, "convert: --group-size %d: supported are 32, 64 and 128", group);
    const size_t shard_limit = opt->shard_bytes ? opt->shard_bytes : ((size_t)5 << 30);
    const double t0 = lilac_now();

    /* Refuse an existing output before reading anything (--mtp-only: the directory it completes). */
    struct stat sb;
    if (opt->mtp_only) {
        char *cp = pjoin(to, "config.json"), *mp = pjoin(to, LILAC_MTP_FILE);
        const bool has_cfg = stat(cp, &sb) == 0, has_mtp = stat(mp, &sb) == 0;
        free(cp);
        free(mp);
        if (!has_cfg) return lilac_fail(err, "convert: --mtp-only: %s has no config.json (expected the checkpoint to complete)", to);
        if (has_mtp) return lilac_fail(err, "convert: --mtp-only: %s/%s already exists", to, LILAC_MTP_FILE);
    } else if (stat(to, &sb) == 0) {
        DIR *d = S_ISDIR(sb.st_mode) ? opendir(to) : NULL;
        int entries = 0;
        struct dirent *de;
        while (d && (de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) entries++;
        if (d) closedir(d);
        if (!S_ISDIR(sb.st_mode) || entries)
            return lilac_fail(err, "convert: %s already exists; remove it or choose another --to", to);
    }

    /* Config: geometry (validated) and the raw JSON (dtype, already quantized?). */
    lilac_config cfg;
    if (lilac_config_load(&cfg, from, err) < 0) return -1;
    if (opt->mtp_only) { /* the directory completed must be this model's geometry */
        lilac_config tc;
        if (lilac_config_load(&tc, to, err) < 0) {
            lilac_config_free(&cfg);
            return -1;
        }
        const bool same = tc.hidden == cfg.hidden && tc.vocab == cfg.vocab && tc.n_experts == cfg.n_experts &&
                          tc.moe_inter == cfg.moe_inter && tc.shared_inter == cfg.shared_inter &&
                          tc.n_heads == cfg.n_heads && tc.n_kv_heads == cfg.n_kv_heads && tc.head_dim == cfg.head_dim;
        lilac_config_free(&tc);
        if (!same) {
            lilac_config_free(&cfg);
            return lilac_fail(err, "convert: --mtp-only: %s is not a checkpoint of %s's geometry", to, from);
        }
    }
    int rc = -1;
    plan P = {0};
    st_set st = {0};
    bool *used = NULL;
    runner R = {0};
    char *tmp = NULL;
    {
        char *cp = pjoin(from, "config.json");
        json_error_t je;
        json_t *root = json_load_file(cp, 0, &je);
        free(cp);
        if (!root) {
            lilac_fail(err, "convert: %s/config.json: %s", from, je.text);
            goto out;
        }
        const char *dt = dtype_cfg(root);
        bool cast = dt && !strcmp(dt, "bfloat16");
        bool quantized = json_object_get(root, "quantization") || json_object_get(root, "quantization_config");
        if (dt && strcmp(dt, "bfloat16") && strcmp(dt, "float32")) {
            lilac_fail(err, "convert: %s/config.json: dtype \"%s\": only bfloat16 checkpoints are converted", from, dt);
            json_decref(root);
            goto out;
        }
        json_decref(root);
        if (quantized || cfg.quantized) {
            lilac_fail(err, "convert: %s is already quantized (config.json has a quantization block)", from);
            goto out;
        }
        if (st_open_dir(&st, from, err) < 0) goto out;
        used = xcalloc((size_t)st.n_tensors, sizeof(bool));
        ctx C = {&st, &cfg, bits, group, cast, err, used};
        if (build_plan(&P, &C, opt->no_mtp, opt->mtp_only) < 0) goto out;
    }
    make_units(&P);

    /* Shards: model parameter order, at most shard_limit bytes (mlx-lm make_shards). */
    int n_shards = 0, n_main = 0, mtp_shard = -1;
    {
        size_t cur = 0;
        for (int i = 0; i < P.nt; i++) {
            if (P.t[i].mtp) continue;
            if (!n_shards || cur + P.t[i].nbytes > shard_limit) {
                n_shards++;
                cur = 0;
            }
            P.t[i].shard = n_shards - 1;
            cur += P.t[i].nbytes;
        }
        n_main = n_shards;
        for (int i = 0; i < P.nt; i++)
            if (P.t[i].mtp) P.t[i].shard = mtp_shard = n_main;
        if (mtp_shard >= 0) n_shards++;
    }
    /* Within a shard: data in name order; header with sorted keys, no padding. */
    char **headers = xcalloc((size_t)n_shards, sizeof(char *));
    size_t *hlen = xcalloc((size_t)n_shards, sizeof(size_t));
    size_t *shard_size = xcalloc((size_t)n_shards, sizeof(size_t));
    size_t out_total = 0, total_size = 0;
    int64_t total_params = 0;
    otensor **sorted = xmalloc(sizeof(otensor *) * (size_t)(P.nt ? P.nt : 1));
    for (int sh = 0; sh < n_shards; sh++) {
        int n = 0;
        for (int i = 0; i < P.nt; i++)
            if (P.t[i].shard == sh) sorted[n++] = &P.t[i];
        qsort(sorted, (size_t)n, sizeof *sorted, cmp_otensor_name);
        sbuf h = {0};
        sb_puts(&h, "{\"__metadata__\":{\"format\":\"mlx\"}");
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            otensor *t = sorted[i];
            t->off = off;
            sb_printf(&h, ",\"%s\":{\"data_offsets\":[%zu,%zu],\"dtype\":\"%s\",\"shape\":[", t->name, off, off + t->nbytes,
                   st_dtype_name(t->dtype));
            for (int d = 0; d < t->ndim; d++) sb_printf(&h, d ? ",%lld" : "%lld", (long long)t->shape[d]);
            sb_puts(&h, "]}");
            off += t->nbytes;
        }
        sb_puts(&h, "}");
        headers[sh] = h.p;
        hlen[sh] = h.n;
        shard_size[sh] = 8 + h.n + off;
        out_total += shard_size[sh];
    }
    for (int i = 0; i < P.nt; i++) {
        if (P.t[i].mtp) continue;
        total_size += P.t[i].nbytes;
        total_params += P.t[i].numel_orig;
    }
    free(sorted);

    /* The work directory: a previous interrupted run's is removed (restart). */
    {
        size_t n = strlen(to) + 32;
        tmp = xmalloc(n);
        snprintf(tmp, n, "%s.lilac-partial", to);
        while (n > 0 && tmp[strlen(tmp) - 1] == '/') tmp[strlen(tmp) - 1] = 0;
        if (stat(tmp, &sb) == 0) {
            if (!opt->quiet) fprintf(stderr, "convert: removing %s left by an interrupted run\n", tmp);
            if (remove_partial(tmp, err) < 0) goto out_h;
        }
        if (mkdir(tmp, 0755) != 0) {
            lilac_fail(err, "convert: cannot create %s: %s", tmp, strerror(errno));
            goto out_h;
        }
    }
    /* Free space, checked up front. */
    {
        struct statvfs vfs;
        size_t need = out_total + (1u << 20) * 16;
        unsigned long long avail = 0;
        if (statvfs(tmp, &vfs) == 0) avail = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
        else avail = (unsigned long long)-1;
        if (lilac_diag()->convert_free_bytes) avail = strtoull(lilac_diag()->convert_free_bytes, NULL, 10);
        if (avail < need) {
            lilac_fail(err, "convert: not enough free disk space for %s: the output needs %.2f GB, %.2f GB are free", to,
                       need / 1e9, avail / 1e9);
            remove_partial(tmp, NULL);
            goto out_h;
        }
    }

    /* Open input shards and create the output shards (header written, size reserved). */
    R.P = &P;
    R.st = &st;
    R.in_fd = xmalloc(sizeof(int) * (size_t)st.n_shards);
    for (int i = 0; i < st.n_shards; i++) {
        R.in_fd[i] = open(st.shards[i].path, O_RDONLY);
        if (R.in_fd[i] < 0) {
            lilac_fail(err, "convert: %s: %s", st.shards[i].path, strerror(errno));
            for (int k = 0; k < i; k++) close(R.in_fd[k]);
            goto out_h;
        }
        posix_fadvise(R.in_fd[i], 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    R.out_fd = xmalloc(sizeof(int) * (size_t)n_shards);
    R.data_start = xmalloc(sizeof(size_t) * (size_t)n_shards);
    char fname[64];
    for (int sh = 0; sh < n_shards; sh++) {
        if (sh == mtp_shard) snprintf(fname, sizeof fname, LILAC_MTP_FILE);
        else if (n_main == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", sh + 1, n_main);
        char *p = pjoin(tmp, fname);
        R.out_fd[sh] = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644);
        unsigned char le[8];
        for (int b = 0; b < 8; b++) le[b] = (unsigned char)((uint64_t)hlen[sh] >> (8 * b));
        int e = 0;
        if (R.out_fd[sh] < 0) e = errno;
        else {
            int fr = posix_fallocate(R.out_fd[sh], 0, (off_t)shard_size[sh]);
            if (fr != 0 && fr != EOPNOTSUPP && fr != EINVAL) e = fr;
            else if (ftruncate(R.out_fd[sh], (off_t)shard_size[sh]) != 0) e = errno;
            else if (pwrite_all(R.out_fd[sh], le, 8, 0) < 0 || pwrite_all(R.out_fd[sh], headers[sh], hlen[sh], 8) < 0) e = errno;
        }
        if (e) {
            lilac_fail(err, "convert: creating %s (%.2f GB) failed: %s", p, shard_size[sh] / 1e9, strerror(e));
            free(p);
            for (int k = 0; k <= sh; k++)
                if (R.out_fd[k] >= 0) close(R.out_fd[k]);
            for (int k = 0; k < st.n_shards; k++) close(R.in_fd[k]);
            remove_partial(tmp, NULL);
            goto out_h;
        }
        free(p);
        R.data_start[sh] = 8 + hlen[sh];
    }

    /* The work. */
    progress pg = {.t0 = lilac_now(), .total = P.in_total, .tty = isatty(2), .quiet = opt->quiet};
    pg.last = pg.t0;
    const long die_after = lilac_diag()->convert_die_after;
    long units_done = 0;
    /* Default: every core, and at least 4 threads so that reads overlap compute on small machines
     * (measured: 2 cores, 4 threads 31 s vs 2 threads 46 s for 15.5 GB, docs/perf.md). */
    /* At most 32 by default: the work is disk-bound long before, and each thread holds ~14 MiB. */
    int threads = opt->threads > 0 ? opt->threads : (omp_get_max_threads() < 4 ? 4 : omp_get_max_threads());
    if (opt->threads <= 0 && threads > 32) threads = 32;
    if (!opt->quiet)
        fprintf(stderr, "convert: %s -> %s: %d tensors in, %d out, %.2f GB -> %.2f GB in %d shard(s), %d-bit/%d, %d threads\n", from,
                to, st.n_tensors, P.nt, P.in_total / 1e9, out_total / 1e9, n_shards, bits, group, threads);
#pragma omp parallel num_threads(threads)
    {
        tbufs B = {0};
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < P.nu; i++) {
            if (R.failed) continue;
            /* Ask the kernel to start reading a few units ahead, so that reads overlap compute. */
            for (int a = i + 1; a <= i + 2 * threads && a < P.nu; a += threads) prefetch_unit(&R, &P.u[a]);
            run_unit(&R, &P.u[i], &B);
            drop_unit(&R, &P.u[i]);
#pragma omp critical(convert_progress)
            {
                units_done++;
                if (die_after >= 0 && units_done > die_after) _exit(3);
                progress_tick(&pg, P.u[i].in_bytes, P.j[P.u[i].job].src->name, false);
            }
        }
        free(B.in);
        free(B.h);
        free(B.q);
        free(B.s);
        free(B.b);
    }
    for (int k = 0; k < st.n_shards; k++) {
        posix_fadvise(R.in_fd[k], 0, 0, POSIX_FADV_DONTNEED);
        close(R.in_fd[k]);
    }
    int sync_fail = 0;
    for (int sh = 0; sh < n_shards; sh++) {
        if (fsync(R.out_fd[sh]) != 0) sync_fail = errno ? errno : EIO;
        if (close(R.out_fd[sh]) != 0) sync_fail = errno ? errno : EIO;
    }
    if (R.failed || sync_fail) {
        if (R.failed) lilac_fail(err, "%s", R.fail_msg);
        else lilac_fail(err, "convert: writing %s failed: %s", tmp, strerror(sync_fail));
        remove_partial(tmp, NULL);
        goto out_h;
    }
    progress_tick(&pg, 0, "", true);

    /* --mtp-only: the sidecar joins the existing directory. */
    if (opt->mtp_only) {
        char *s = pjoin(tmp, LILAC_MTP_FILE), *d = pjoin(to, LILAC_MTP_FILE);
        const int e = rename(s, d) != 0 ? errno : 0;
        free(s);
        free(d);
        if (e) {
            lilac_fail(err, "convert: moving %s/%s into %s failed: %s", tmp, LILAC_MTP_FILE, to, strerror(e));
            goto out_h;
        }
        rmdir(tmp);
        fsync_path(to);
        if (!opt->quiet)
            fprintf(stderr, "convert: wrote %s/%s: %d tensors, %.2f GB in %.1f s\n", to, LILAC_MTP_FILE, P.nt,
                    out_total / 1e9, lilac_now() - t0);
        rc = 0;
        goto out_h;
    }
    /* Index, config, tokenizer and template files. */
    {
        sbuf ix = {0};
        sb_printf(&ix, "{\n    \"metadata\": {\n        \"total_size\": %zu,\n        \"total_parameters\": %lld\n    },\n    \"weight_map\": {",
               total_size, (long long)total_params);
        otensor **byname = xmalloc(sizeof(otensor *) * (size_t)(P.nt ? P.nt : 1));
        int nb = 0;
        for (int i = 0; i < P.nt; i++)
            if (!P.t[i].mtp) byname[nb++] = &P.t[i]; /* the sidecar stays out of mlx-lm's index */
        qsort(byname, (size_t)nb, sizeof *byname, cmp_otensor_name);
        for (int i = 0; i < nb; i++) {
            if (n_main == 1) snprintf(fname, sizeof fname, "model.safetensors");
            else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", byname[i]->shard + 1, n_main);
            sb_puts(&ix, "\n        ");
            py_string(&ix, byname[i]->name, strlen(byname[i]->name));
            sb_printf(&ix, ": \"%s\"%s", fname, i + 1 < nb ? "," : "");
        }
        sb_puts(&ix, nb ? "\n    }\n}" : "}\n}");
        free(byname);
        char *p = pjoin(tmp, "model.safetensors.index.json");
        FILE *f = fopen(p, "wb");
        int bad = !f || fwrite(ix.p, 1, ix.n, f) != ix.n || fflush(f) != 0 || fsync(fileno(f)) != 0;
        if (f && fclose(f) != 0) bad = 1;
        free(ix.p);
        if (bad) {
            lilac_fail(err, "convert: writing %s failed: %s", p, strerror(errno));
            free(p);
            remove_partial(tmp, NULL);
            goto out_h;
        }
        free(p);
        p = pjoin(tmp, "config.json");
        if (write_config(from, p, &cfg, bits, group, err) < 0) {
            free(p);
            remove_partial(tmp, NULL);
            goto out_h;
        }
        free(p);
        int copied = 0;
        for (size_t i = 0; i < sizeof COPY_FILES / sizeof *COPY_FILES; i++) {
            char *s = pjoin(from, COPY_FILES[i]);
            if (access(s, R_OK) == 0) {
                char *d = pjoin(tmp, COPY_FILES[i]);
                int e = copy_file(s, d, err);
                free(d);
                if (e < 0) {
                    free(s);
                    remove_partial(tmp, NULL);
                    goto out_h;
                }
                copied++;
            }
            free(s);
        }
        DIR *d = opendir(from);
        struct dirent *de;
        while (d && (de = readdir(d))) { /* *.py, as mlx-lm copies them */
            size_t n = strlen(de->d_name);
            if (n < 4 || strcmp(de->d_name + n - 3, ".py")) continue;
            char *s = pjoin(from, de->d_name), *t = pjoin(tmp, de->d_name);
            int e = copy_file(s, t, err);
            free(s);
            free(t);
            if (e < 0) {
                closedir(d);
                remove_partial(tmp, NULL);
                goto out_h;
            }
        }
        if (d) closedir(d);
        if (!opt->quiet && !copied)
            fprintf(stderr, "convert: note: no tokenizer or chat template files in %s to copy\n", from);
    }
    /* Publish: one rename of the directory. */
    fsync_path(tmp);
    if (rename(tmp, to) != 0) {
        lilac_fail(err, "convert: renaming %s to %s failed: %s (the converted checkpoint is complete in %s)", tmp, to,
                   strerror(errno), tmp);
        goto out_h;
    }
    {
        char *parent = xstrdup(to);
        char *sl = strrchr(parent, '/');
        if (sl && sl != parent) *sl = 0;
        else if (sl) sl[1] = 0;
        else strcpy(parent, ".");
        fsync_path(parent);
        free(parent);
    }
    if (!opt->quiet)
        fprintf(stderr, "convert: wrote %s: %d tensors, %.2f GB in %d shard(s) in %.1f s (%.2f GB/s of input)\n", to, P.nt,
                out_total / 1e9, n_shards, lilac_now() - t0, P.in_total / 1e9 / (lilac_now() - t0));
    rc = 0;
out_h:
    for (int sh = 0; sh < n_shards; sh++) free(headers[sh]);
    free(headers);
    free(hlen);
    free(shard_size);
out:
    free(R.in_fd);
    free(R.out_fd);
    free(R.data_start);
    free(tmp);
    free(used);
    free(P.t);
    free(P.j);
    free(P.u);
    st_close(&st);
    lilac_config_free(&cfg);
    return rc;
}
