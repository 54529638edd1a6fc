/* demo_model.c — see demo_model.h. */
#include "demo_model.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../model/safetensors.h"
#include "../model/small_tokenizer.h"
#include "../model/synth.h"
#include "../util/sbuf.h"

/* ---- geometry (the tiny oracle case: every feature, small) ---- */
enum {
    D_H = 128, D_LAYERS = 4, D_HEADS = 4, D_KV = 2, D_HD = 64, D_LK = 2, D_LV = 4, D_KD = 32, D_VD = 32, D_CONV = 4,
    D_E = 16, D_TOPK = 4, D_I = 64, D_SI = 64, D_V = LILAC_DEMO_VOCAB
};

/* ---- tokenizer: the shared small byte-level BPE (model/small_tokenizer.h) ---- */

static int write_tokenizer(const char *dir, int *eos_out, lilac_err *err) {
    if (lilac_small_tokenizer_write(dir, D_V, eos_out, err) < 0) return -1;
    static const char README[] =
        "lilac demo model: the Qwen3.6-35B-A3B architecture at a tiny size with RANDOM weights, in the\n"
        "mlx-community 4-bit format, plus a small byte-level BPE tokenizer. Its output is gibberish; it exists\n"
        "to try lilac's API offline. Rebuild with `lilac demo --rebuild`.\n";
    char path[4096];
    snprintf(path, sizeof path, "%s/README.txt", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return lilac_fail(err, "demo: cannot write %s: %s", path, strerror(errno));
    size_t w = fwrite(README, 1, sizeof README - 1, f);
    if (fclose(f) != 0 || w != sizeof README - 1) return lilac_fail(err, "demo: writing %s failed", path);
    return 0;
}

/* ---- weights: the synth writer at the demo's geometry --------------------- */

static int write_weights(const char *dir, int eos, lilac_err *err) {
    lilac_config real;
    lilac_config_real(&real);
    lilac_config c = {.hidden = D_H, .n_layers = D_LAYERS, .vocab = D_V, .rms_eps = real.rms_eps,
                      .full_interval = real.full_interval, .n_heads = D_HEADS, .n_kv_heads = D_KV, .head_dim = D_HD,
                      .rotary_dim = D_HD / 4, .rope_theta = real.rope_theta, .max_pos = real.max_pos,
                      .lin_k_heads = D_LK, .lin_v_heads = D_LV, .lin_k_dim = D_KD, .lin_v_dim = D_VD,
                      .conv_kernel = D_CONV, .n_experts = D_E, .top_k = D_TOPK, .moe_inter = D_I, .shared_inter = D_SI,
                      .norm_topk = real.norm_topk, .eos_id = eos};
    lilac_config_free(&real);
    for (int l = 0; l < D_LAYERS; l++) c.is_full[l] = (l + 1) % 4 == 0;
    lilac_synth_opts o = {.seed = 20260601, .config_note = "lilac demo: random weights, the text is gibberish", .quiet = true};
    return lilac_synth_write(dir, &c, &o, err);
}

int lilac_demo_build(const char *dir, lilac_err *err) {
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) return lilac_fail(err, "demo: cannot create %s: %s", dir, strerror(errno));
    int eos = 0;
    if (write_tokenizer(dir, &eos, err) < 0) return -1;
    return write_weights(dir, eos, err);
}

static int mkdirs(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) < 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

int lilac_demo_dir(char *out, size_t n, lilac_err *err) {
    const char *x = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (x && x[0]) snprintf(out, n, "%s/lilac/demo-v%d", x, LILAC_DEMO_VERSION);
    else if (home && home[0]) snprintf(out, n, "%s/.cache/lilac/demo-v%d", home, LILAC_DEMO_VERSION);
    else return lilac_fail(err, "demo: neither XDG_CACHE_HOME nor HOME is set; pass --out DIR");
    return 0;
}

int lilac_demo_ensure(const char *dir, lilac_err *err) {
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/config.json", dir); /* written last */
    if (access(probe, R_OK) == 0) return 0;
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = 0;
        if (mkdirs(parent) < 0) return lilac_fail(err, "demo: cannot create %s: %s", parent, strerror(errno));
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp%d", dir, (int)getpid());
    if (lilac_demo_build(tmp, err) < 0) return -1;
    if (rename(tmp, dir) < 0) {
        if (access(probe, R_OK) == 0) return 0; /* built concurrently by another process */
        return lilac_fail(err, "demo: cannot move %s to %s: %s", tmp, dir, strerror(errno));
    }
    return 0;
}
