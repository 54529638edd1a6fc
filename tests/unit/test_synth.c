/* test_synth.c — `lilac synth` router modes (synth.h), observed through the CPU
 * reference on small checkpoints with the real router shape (256 experts, top-8,
 * hidden 1024) built in temp dirs:
 *  - the default output is byte-identical to what synth wrote before the modes
 *    existed (pinned FNV-1a hashes), and a mode changes only the router (ties) or
 *    the router and the embedding biases (one, skew);
 *  - ties: every router row is identical, and the CPU backend routes every token
 *    to experts 0..7 in every layer. Observed by zeroing experts' down
 *    projections in the files: zeroing experts 8..255 leaves every logit
 *    bit-identical (they are never picked; each token picks 8 distinct experts,
 *    so it picks exactly 0..7), zeroing expert 7 changes them (the same edit on a
 *    random-router checkpoint changes them too: the probe is sensitive);
 *  - one: zeroing the favoured expert in one layer changes the logits of nearly
 *    every single-token prompt (it is picked), zeroing a neighbour few;
 *  - skew: the cold experts are never picked, the strongest hot ones nearly always. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "model/safetensors.h"
#include "model/synth.h"

enum { E = 256, K = 8, NTOK = 32 };

static void small_cfg(lilac_config *c, int layers) {
    lilac_config_real(c);
    c->hidden = 1024;
    c->n_layers = layers;
    c->vocab = 256;
    c->n_heads = 2;
    c->n_kv_heads = 1;
    c->head_dim = 64;
    c->rotary_dim = 16;
    c->lin_k_heads = 2;
    c->lin_v_heads = 4;
    c->lin_k_dim = 64;
    c->lin_v_dim = 64;
    c->conv_kernel = 4;
    c->n_experts = E;
    c->top_k = K;
    c->moe_inter = 64;
    c->shared_inter = 64;
    c->eos_id = 1;
    for (int l = 0; l < layers; l++) c->is_full[l] = (l + 1) % 4 == 0;
}

static char *synth_dir(int layers, lilac_synth_router r, uint64_t seed) {
    char tmpl[] = "/tmp/lilac_synth_XXXXXX";
    char *d = mkdtemp(tmpl);
    if (!d) abort();
    lilac_config c;
    small_cfg(&c, layers);
    lilac_synth_opts o = {.seed = seed, .quiet = true, .router = r};
    lilac_err err = {{0}};
    const int rc = lilac_synth_write(d, &c, &o, &err);
    CHECKF(rc == 0, "%s", err.msg);
    lilac_config_free(&c);
    return xstrdup(d);
}

static void rm_dir(char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
    free(dir);
}

static uint64_t fnv_file(const char *dir, const char *name) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t h = 0xcbf29ce484222325ull;
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        for (size_t i = 0; i < n; i++) { h ^= buf[i]; h *= 0x100000001b3ull; }
    fclose(f);
    return h;
}

/* Zero the down projection (scales and biases: its output becomes exactly 0) of
 * the experts of `layer` that `pick` selects (or, with pick NULL, expert `only`)
 * in the checkpoint files. With `saved` (2 buffers, freed by the caller), the
 * two tensors' bytes from before go there; restore_experts writes them back. */
static void edit_experts(const char *dir, int layer, bool (*pick)(int e), int only, unsigned char **saved,
                         unsigned char *const *restore) {
    st_set st = {0};
    lilac_err err = {{0}};
    if (st_open_dir(&st, dir, &err) < 0) { CHECKF(0, "%s", err.msg); return; }
    const char *part[2] = {"scales", "biases"};
    for (int p = 0; p < 2; p++) {
        char name[200];
        snprintf(name, sizeof name, "language_model.model.layers.%d.mlp.switch_mlp.down_proj.%s", layer, part[p]);
        const st_tensor *t = st_find(&st, name);
        CHECKF(t != NULL, "%s missing", name);
        if (!t) continue;
        const st_shard *sh = &st.shards[t->shard];
        const size_t off = (size_t)((const char *)t->data - (const char *)sh->map), per = t->nbytes / E;
        unsigned char *buf = xmalloc(t->nbytes);
        memcpy(buf, restore ? restore[p] : t->data, t->nbytes);
        if (saved) saved[p] = xmalloc(t->nbytes), memcpy(saved[p], t->data, t->nbytes);
        for (int e = 0; !restore && e < E; e++)
            if (pick ? pick(e) : e == only) memset(buf + (size_t)e * per, 0, per);
        FILE *f = fopen(sh->path, "r+b");
        CHECK(f != NULL);
        if (f) {
            CHECK(fseek(f, (long)off, SEEK_SET) == 0 && fwrite(buf, 1, t->nbytes, f) == t->nbytes);
            CHECK(fclose(f) == 0);
        }
        free(buf);
    }
    st_close(&st);
}
static void zero_experts(const char *dir, int layer, bool (*pick)(int e), int only) {
    edit_experts(dir, layer, pick, only, NULL, NULL);
}

/* Logits of the CPU reference: a prompt of n tokens (LOGITS_ALL, n > 1), or
 * (single) each of the n tokens alone in a fresh session. [n][vocab]. */
static float *logits(const char *dir, const int32_t *ids, int n, bool single) {
    lilac_model M;
    lilac_err err = {{0}};
    if (lilac_model_load(&M, dir, &err) < 0) { CHECKF(0, "%s", err.msg); return NULL; }
    const lilac_backend *B = lilac_backend_get("cpu", &err);
    lilac_session *s = B ? B->session_new(&M, 256, 1, &err) : NULL; /* one thread: tiny matmuls */
    CHECKF(s != NULL, "%s", err.msg);
    float *out = xmalloc(sizeof(float) * (size_t)n * (size_t)M.cfg.vocab);
    if (!single) CHECKF(B->forward(s, ids, n, LOGITS_ALL, out, &err) == 0, "%s", err.msg);
    for (int i = 0; single && i < n; i++) {
        B->session_reset(s);
        CHECKF(B->forward(s, ids + i, 1, LOGITS_LAST, out + (int64_t)i * M.cfg.vocab, &err) == 0, "%s", err.msg);
    }
    if (s) B->session_free(s);
    lilac_model_free(&M);
    return out;
}

/* Rows (of vocab 256) that differ in any bit. */
static int rows_changed(const float *a, const float *b, int n) {
    int c = 0;
    for (int i = 0; i < n; i++) c += memcmp(a + i * 256, b + i * 256, sizeof(float) * 256) != 0;
    return c;
}

static bool is_router(const char *name) { return strstr(name, ".mlp.gate.") != NULL; }
static bool is_embed_bias(const char *name) { return !strcmp(name, "language_model.model.embed_tokens.biases"); }

/* Tensors of a and b: identical except those `may_differ` admits, which must differ. */
static void same_except(const char *a, const char *b, bool (*may_differ)(const char *)) {
    st_set x = {0}, y = {0};
    lilac_err err = {{0}};
    CHECKF(st_open_dir(&x, a, &err) == 0 && st_open_dir(&y, b, &err) == 0, "%s", err.msg);
    CHECK(x.n_tensors == y.n_tensors && x.n_tensors > 0);
    for (int i = 0; i < x.n_tensors && i < y.n_tensors; i++) {
        const st_tensor *s = &x.tensors[i], *t = &y.tensors[i];
        CHECK(!strcmp(s->name, t->name) && s->nbytes == t->nbytes);
        const bool same = s->nbytes == t->nbytes && !memcmp(s->data, t->data, s->nbytes);
        CHECKF(same != may_differ(s->name), "%s: %s", s->name, same ? "unchanged" : "changed");
    }
    st_close(&x);
    st_close(&y);
}
static bool router_all(const char *n) { return is_router(n); }
static bool router_bias_or_embed(const char *n) { return (is_router(n) && strstr(n, ".biases")) || is_embed_bias(n); }

static void test_parse(void) {
    CHECK(lilac_synth_router_parse("random") == LILAC_ROUTER_RANDOM);
    CHECK(lilac_synth_router_parse("ties") == LILAC_ROUTER_TIES);
    CHECK(lilac_synth_router_parse("one") == LILAC_ROUTER_ONE);
    CHECK(lilac_synth_router_parse("skew") == LILAC_ROUTER_SKEW);
    CHECK(lilac_synth_router_parse("Ties") == -1 && lilac_synth_router_parse("") == -1);
    for (int r = 0; r < 4; r++) CHECK(lilac_synth_router_parse(lilac_synth_router_name((lilac_synth_router)r)) == r);
    CHECK(lilac_synth_one_expert(256) == 131);
    int hot = 0, cold = 0;
    for (int e = 0; e < 256; e++) {
        const float s = lilac_synth_router_shift(LILAC_ROUTER_SKEW, 256, e);
        hot += s > 0;
        cold += s < 0;
        CHECK(lilac_synth_router_shift(LILAC_ROUTER_RANDOM, 256, e) == 0 && lilac_synth_router_shift(LILAC_ROUTER_TIES, 256, e) == 0);
        CHECK((lilac_synth_router_shift(LILAC_ROUTER_ONE, 256, e) > 0) == (e == 131));
    }
    CHECK(hot == 8 && cold == 187);
}

/* The default (random) router writes what synth wrote before --router existed:
 * FNV-1a of the three files of this geometry at seed 5, from the code before. */
static void test_default_unchanged(void) {
    char *d = synth_dir(4, LILAC_ROUTER_RANDOM, 5);
    CHECK(fnv_file(d, "config.json") == 0xe1da955953f5fb74ull);
    CHECK(fnv_file(d, "model-00001-of-00001.safetensors") == 0x1a3f5b333fdfce33ull);
    CHECK(fnv_file(d, "model.safetensors.index.json") == 0xc9852d3fd551d3d9ull);
    rm_dir(d);
}

static void test_modes_change_only_the_router(void) {
    char *r = synth_dir(2, LILAC_ROUTER_RANDOM, 9), *t = synth_dir(2, LILAC_ROUTER_TIES, 9);
    char *o = synth_dir(2, LILAC_ROUTER_ONE, 9), *s = synth_dir(2, LILAC_ROUTER_SKEW, 9);
    same_except(r, t, router_all);            /* ties: codes, scales and biases of every row */
    same_except(r, o, router_bias_or_embed);  /* one/skew: biases only (codes and scales kept) */
    same_except(r, s, router_bias_or_embed);
    /* ties: every router row is row 0, bit for bit. */
    lilac_model M;
    lilac_err err = {{0}};
    CHECKF(lilac_model_load(&M, t, &err) == 0, "%s", err.msg);
    for (int l = 0; l < M.cfg.n_layers; l++) {
        const lilac_matrix *g = &M.layers[l].router;
        CHECK(g->type == MAT_AFFINE && g->bits == 8 && g->rows == E);
        const int64_t w = g->cols / 4, ng = g->cols / 64;
        int differ = 0;
        for (int64_t e = 1; e < E; e++)
            differ += memcmp(g->q + e * w, g->q, 4 * (size_t)w) || memcmp(g->scales + e * ng, g->scales, 2 * (size_t)ng) ||
                      memcmp(g->biases + e * ng, g->biases, 2 * (size_t)ng);
        CHECKF(differ == 0, "layer %d: %d rows differ from row 0", l, differ);
    }
    lilac_model_free(&M);
    rm_dir(r);
    rm_dir(t);
    rm_dir(o);
    rm_dir(s);
}

static bool from_k(int e) { return e >= K; }

static void test_ties_routes_to_first_k(void) {
    int32_t ids[NTOK];
    check_ids(ids, NTOK, 1, 256u);
    for (int mode = 0; mode < 2; mode++) {
        char *d = synth_dir(2, mode ? LILAC_ROUTER_TIES : LILAC_ROUTER_RANDOM, 3);
        float *ref = logits(d, ids, NTOK, false), *one = logits(d, ids, 4, true);
        zero_experts(d, 0, from_k, -1);
        zero_experts(d, 1, from_k, -1);
        float *a = logits(d, ids, NTOK, false), *a1 = logits(d, ids, 4, true);
        const int ch = ref && a ? rows_changed(ref, a, NTOK) : -1, ch1 = one && a1 ? rows_changed(one, a1, 4) : -1;
        if (mode) CHECKF(ch == 0 && ch1 == 0, "ties: zeroing experts 8..255 changed %d of %d positions, %d of 4 single tokens", ch, NTOK, ch1);
        else CHECKF(ch == NTOK && ch1 == 4, "random: zeroing experts 8..255 changed only %d of %d positions", ch, NTOK);
        if (mode) {
            zero_experts(d, 1, NULL, K - 1);
            float *b = logits(d, ids, NTOK, false);
            const int chb = a && b ? rows_changed(a, b, NTOK) : -1;
            CHECKF(chb == NTOK, "ties: zeroing expert 7 of layer 1 changed %d of %d positions", chb, NTOK);
            free(b);
        }
        free(ref); free(one); free(a); free(a1);
        rm_dir(d);
    }
}

/* Single-token prompts (of the n in ids, whose reference logits are ref) whose
 * logits change when expert e of `layer` is zeroed in checkpoint d. */
static int picked_by(const char *d, const float *ref, int layer, int e, const int32_t *ids, int n) {
    unsigned char *saved[2] = {NULL, NULL};
    edit_experts(d, layer, NULL, e, saved, NULL);
    float *a = logits(d, ids, n, true);
    edit_experts(d, layer, NULL, -1, NULL, saved);
    const int c = ref && a ? rows_changed(ref, a, n) : -1;
    free(saved[0]);
    free(saved[1]);
    free(a);
    return c;
}

static void test_one_dominates(void) {
    int32_t ids[NTOK];
    check_ids(ids, NTOK, 2, 256u);
    const int fav = lilac_synth_one_expert(E);
    char *d = synth_dir(2, LILAC_ROUTER_ONE, 4), *r = synth_dir(2, LILAC_ROUTER_RANDOM, 4);
    float *ref = logits(d, ids, NTOK, true), *rref = logits(r, ids, NTOK, true);
    for (int l = 0; l < 2; l++) {
        const int c = picked_by(d, ref, l, fav, ids, NTOK), n = picked_by(d, ref, l, fav + 1, ids, NTOK);
        printf("  one, layer %d: expert %d picked by %d of %d tokens, expert %d by %d\n", l, fav, c, NTOK, fav + 1, n);
        CHECK(c >= NTOK * 95 / 100);
        CHECK(n >= 0 && n <= NTOK / 4);
    }
    const int rnd = picked_by(r, rref, 0, fav, ids, NTOK);
    CHECKF(rnd >= 0 && rnd <= NTOK / 4, "random: expert %d picked by %d of %d", fav, rnd, NTOK);
    /* and the probe's restore is exact */
    float *again = logits(d, ids, NTOK, true);
    CHECK(ref && again && rows_changed(ref, again, NTOK) == 0);
    free(again);
    free(ref);
    free(rref);
    rm_dir(d);
    rm_dir(r);
}

static bool cold(int e) { return lilac_synth_router_shift(LILAC_ROUTER_SKEW, E, e) < 0; }

static void test_skew(void) {
    int32_t ids[NTOK];
    check_ids(ids, NTOK, 3, 256u);
    char *d = synth_dir(2, LILAC_ROUTER_SKEW, 4);
    float *ref = logits(d, ids, NTOK, false), *one = logits(d, ids, NTOK, true);
    /* The three strongest hot experts (logit +6, +5, +4) are picked by nearly every token. */
    const int hot[3] = {5, E / 4 - 1, E / 4};
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 3; h++) {
            const int c = picked_by(d, one, l, hot[h], ids, NTOK);
            printf("  skew, layer %d: hot expert %d picked by %d of %d tokens\n", l, hot[h], c, NTOK);
            CHECK(c >= NTOK * 9 / 10);
        }
    /* The cold experts (187 of 256) are never picked, in a prompt or alone. */
    zero_experts(d, 0, cold, -1);
    zero_experts(d, 1, cold, -1);
    float *a = logits(d, ids, NTOK, false), *a1 = logits(d, ids, NTOK, true);
    CHECK(ref && a && rows_changed(ref, a, NTOK) == 0);
    CHECK(one && a1 && rows_changed(one, a1, NTOK) == 0);
    free(ref); free(one); free(a); free(a1);
    rm_dir(d);
}

/* Layer kinds: 2 and 3 layers gain a full-attention last layer; 1, 4 and 40
 * keep the every-4th pattern of the real model unchanged. */
static void test_ensure_attention(void) {
    for (int L = 1; L <= 40; L++) {
        lilac_config c;
        lilac_config_real(&c);
        c.n_layers = L;
        bool before[64];
        for (int l = 0; l < L; l++) before[l] = c.is_full[l];
        lilac_synth_ensure_attention(&c);
        int nfull = 0;
        for (int l = 0; l < L; l++) {
            nfull += c.is_full[l];
            if (L >= 4 || L == 1) CHECKF(c.is_full[l] == before[l], "layers %d: layer %d changed", L, l);
            else CHECKF(c.is_full[l] == (l == L - 1), "layers %d: layer %d kind", L, l);
        }
        CHECKF(L < 2 ? nfull == 0 : nfull >= 1, "layers %d: %d attention layers", L, nfull);
        CHECKF(L < 4 || nfull == L / 4, "layers %d: %d attention layers", L, nfull);
        lilac_config_free(&c);
    }
}

int main(void) {
    TEST(test_ensure_attention);
    TEST(test_parse);
    TEST(test_default_unchanged);
    TEST(test_modes_change_only_the_router);
    TEST(test_ties_routes_to_first_k);
    TEST(test_one_dominates);
    TEST(test_skew);
    return check_summary();
}
