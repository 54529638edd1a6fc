// test_kernels.cu — the MoE routing kernels (cuda_moe.cuh) and the greedy argmax (cuda_argmax.cuh)
// of src/backend/cuda against plain CPU loops written here (run on
// the device: build/cuda-tests/test_kernels; no model needed).
//
// The routing pipeline as moe_layer launches it for prefill: k_topk_reg<8> (or
// k_topk, E > 256) with per-expert counts -> k_moe_scan -> k_moe_scatter, at the
// real router shape (E = 256, K = 8) for T = 1, 8, 9, 63, 64, 65, 2047, 2048 tokens
// (the prefill chunk is 2048), on random logits and under skew: every token to
// one expert, every logit of a row tied, ties among the top few, most experts
// empty, -inf entries, rows with fewer finite logits than K, huge magnitudes.
// Checks: the top-k ids identical (ties: lowest index), weights within 1e-6
// relative (with and without renormalisation), counts = the ids' histogram,
// offs = its exclusive scan, `sorted` a permutation of the slots grouped by
// expert (order within an expert is free: compared as sets), counts and cursor
// reset by the scan; a second pass over other logits on the same buffers (the
// next layer) gives the same. Also k_topk_reg<1|2|4> and k_topk at other (E, K).
// k_argmax: lowest index among ties, the ring slot, step and position updates.
// The prefill norms that write their output split for the next GEMM (k_add_rmsnorm,
// k_moe_combine, k_gated_norm with a g4_split): the split byte for byte what k_split_x
// makes from their output, the output bit for bit the same as without the split, and the same split
// when they write no output (only the split is read).
//
// The CPU reference mirrors the kernels' f32 order of operations where it
// matters (the softmax sum: per-lane partials, then a butterfly), so only expf
// (device <= 2 ulp) separates them. Test logits keep every finite exponent either
// normal or exactly 0 (no value 85..110 below the row maximum), so the order of
// the probabilities is the order of the logits on both sides.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "../unit/check.h"
#include "cuda_test.h"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_gemm_tc.cuh"
#include "backend/cuda/cuda_gdn.cuh"
#include "backend/cuda/cuda_attn_split.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_argmax.cuh"
#include "backend/cuda/cuda_gemm.cuh" // k_split_x: the reference split of the norms' outputs

// On a grid of 1/256 in [lo, hi): distinct values differ by >= 1/256, so their
// exponentials differ by far more than expf's error.
static float rnd_grid(float lo, float hi) { return lo + (float)rnd_int((int)((hi - lo) * 256.0f)) / 256.0f; }

// ---------------------------------------------------------------- CPU reference

// Softmax over E (the kernels' f32 order), top-K by repeated argmax (ties: lowest
// index), weights p/sum, renormalised over the K when norm.
static void ref_topk(const float *lg, int E, int K, int norm, int *ti, float *tw) {
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = fmaxf(mx, lg[e]);
    std::vector<float> p((size_t)E);
    float part[32];
    for (int l = 0; l < 32; l++) {
        part[l] = 0.0f;
        for (int e = l; e < E; e += 32) part[l] += (p[(size_t)e] = expf(lg[e] - mx));
    }
    for (int o = 16; o > 0; o >>= 1) { // the warp butterfly: every lane ends with the same sum
        float nx[32];
        for (int l = 0; l < 32; l++) nx[l] = part[l] + part[l ^ o];
        memcpy(part, nx, sizeof part);
    }
    const float inv = 1.0f / part[0];
    float tot = 0.0f;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (p[(size_t)e] >= 0.0f && (best < 0 || p[(size_t)e] > p[(size_t)best])) best = e;
        ti[k] = best;
        tw[k] = p[(size_t)best] * inv;
        tot += tw[k];
        p[(size_t)best] = -1.0f;
    }
    if (norm)
        for (int k = 0; k < K; k++) tw[k] = tw[k] / tot;
}

// ---------------------------------------------------------------- logit patterns

enum pattern { P_RANDOM, P_ONE, P_ALL_TIED, P_TIES_TOP, P_EMPTY, P_EXTREME, P_SKEW, P_COUNT };
static const char *pattern_name[P_COUNT] = {"random", "all-to-one", "all-tied", "ties-at-top",
                                            "most-empty", "inf/huge", "hot-experts"};

static void make_logits(pattern pt, int T, int E, std::vector<float> &lg) {
    lg.assign((size_t)T * E, 0.0f);
    const int fav = (E / 2 + 3) % E;
    for (int t = 0; t < T; t++) {
        float *r = &lg[(size_t)t * E];
        switch (pt) {
        case P_RANDOM:
            for (int e = 0; e < E; e++) r[e] = rnd_grid(-8, 8);
            break;
        case P_ONE: // every token's first pick is `fav`
            for (int e = 0; e < E; e++) r[e] = rnd_grid(-4, 4);
            r[fav] = 30.0f;
            break;
        case P_ALL_TIED: { // every logit of the row equal: experts 0..K-1, weights 1/E (1/K renormalised)
            const float v = rnd_grid(-20, 20);
            for (int e = 0; e < E; e++) r[e] = v;
            break;
        }
        case P_TIES_TOP: // three levels: many exact ties among the top K
            for (int e = 0; e < E; e++) r[e] = (float)rnd_int(3);
            if (t % 3 == 0) r[E - 1] = 2.0f; // a tie at the last index
            break;
        case P_EMPTY: // only a few experts ever get a high logit: the rest are empty
            for (int e = 0; e < E; e++) r[e] = rnd_grid(-60, -40);
            for (int j = 0; j < 9; j++) r[(3 + 37 * j) % E] = rnd_grid(0, 4);
            break;
        case P_EXTREME:
            for (int e = 0; e < E; e++) r[e] = rnd_grid(-8, 8);
            switch (t % 6) {
            case 0: // a few finite, the rest -inf: fewer than K candidates with p > 0
                for (int e = 0; e < E; e++) r[e] = -INFINITY;
                for (int j = 0; j < 3; j++) r[rnd_int(E)] = rnd_grid(-2, 2);
                break;
            case 1: // huge values: everything but the maximum underflows to exactly 0
                r[rnd_int(E)] = 1e30f;
                r[rnd_int(E)] = -3e38f;
                r[rnd_int(E)] = 3.0e38f;
                break;
            case 2: // -inf sprinkled among finite values
                for (int e = 0; e < E; e += 1 + rnd_int(4)) r[e] = -INFINITY;
                break;
            case 3: // two equal huge maxima, both picked, weight 1/2 each
                r[E - 1] = 3.0e38f;
                r[E / 3] = 3.0e38f;
                break;
            case 4: // very negative but finite everywhere, one entry 200 above the rest
                for (int e = 0; e < E; e++) r[e] = rnd_grid(-1e4f, -1e4f + 30);
                r[rnd_int(E)] = -1e4f + 230;
                break;
            default: // the maximum at the last index, the runner-up at the first
                r[E - 1] = 20.0f;
                r[0] = 19.0f;
                break;
            }
            break;
        case P_SKEW: // like `lilac synth --router skew`: a few hot experts, many cold
            for (int e = 0; e < E; e++) r[e] = rnd_grid(-3, 3) + (e % 4 ? -8.0f : 0.0f);
            {
                const int hot[8] = {5, E / 4 - 1, E / 4, E / 2 - 1, E / 2, 25 * E / 32, E - 2, E - 1};
                for (int j = 0; j < 8; j++) r[hot[j] % E] = rnd_grid(-3, 3) + 6.0f - 0.6f * j;
            }
            break;
        default: break;
        }
    }
}

// ---------------------------------------------------------------- routing pipeline

enum which { W_REG, W_SHARED };

static void launch_topk(which w, int T, int E, int K, int norm, const float *lg, int *topi, float *topw, int *counts) {
    if (w == W_SHARED) {
        k_topk<<<T, 32, sizeof(float) * (size_t)E>>>(lg, E, K, norm, topi, topw, counts);
    } else if (E <= 32) {
        k_topk_reg<1><<<T, 32>>>(lg, E, K, norm, topi, topw, counts);
    } else if (E <= 64) {
        k_topk_reg<2><<<T, 32>>>(lg, E, K, norm, topi, topw, counts);
    } else if (E <= 128) {
        k_topk_reg<4><<<T, 32>>>(lg, E, K, norm, topi, topw, counts);
    } else if (E <= 256) {
        k_topk_reg<8><<<T, 32>>>(lg, E, K, norm, topi, topw, counts);
    } else {
        fprintf(stderr, "no register top-k for E = %d\n", E);
        exit(2);
    }
    CKL();
}

enum { TILE = 64 }; // tokens per entry of the tile map

static double worst_rel_w = 0; // largest relative weight difference seen

// One routing pass at (T, E, K) on `lg`, on the caller's count/cursor/offs
// buffers (which must hold zero counts, as a previous pass leaves them).
// Returns the number of mismatches (also reported through CHECK).
struct route_bufs {
    dbuf<float> lg, topw;
    dbuf<int> topi, counts, offs, cursor, sorted, n_tiles;
    dbuf<int2> tiles;
    route_bufs(int T, int E, int K)
        : lg((size_t)T * E), topw((size_t)T * K), topi((size_t)T * K), counts((size_t)E), offs((size_t)E + 1),
          cursor((size_t)E), sorted((size_t)T * K), n_tiles(1), tiles((size_t)T * K / TILE + (size_t)E + 1) {}
};

static int route_pass(route_bufs &b, which w, int T, int E, int K, int norm, bool grouped, const std::vector<float> &lg,
                      const char *what) {
    int bad = 0;
    const int slots = T * K;
    b.lg.put(lg);
    b.topi.fill_bytes(0xff);
    b.topw.fill_bytes(0xff); // NaN: any weight left unwritten fails
    b.offs.fill_bytes(0x55);
    b.sorted.fill_bytes(0xff);
    launch_topk(w, T, E, K, norm, b.lg.p, b.topi.p, b.topw.p, grouped ? b.counts.p : nullptr);

    // reference
    std::vector<int> ti((size_t)slots);
    std::vector<float> tw((size_t)slots);
    for (int t = 0; t < T; t++) ref_topk(&lg[(size_t)t * E], E, K, norm, &ti[(size_t)t * K], &tw[(size_t)t * K]);
    const std::vector<int> gi = b.topi.get();
    const std::vector<float> gw = b.topw.get();
    int id_bad = 0, w_bad = 0, first = -1;
    for (int s = 0; s < slots; s++) {
        const bool idok = gi[(size_t)s] == ti[(size_t)s];
        const float r = tw[(size_t)s], g = gw[(size_t)s];
        const double rel = r == g ? 0.0 : fabs((double)g - r) / fmax(fabs((double)r), 1e-38);
        if (rel > worst_rel_w && rel < 1e30) worst_rel_w = rel;
        const bool wok = rel <= 1e-6 && !isnan(g);
        id_bad += !idok;
        w_bad += !wok;
        if ((!idok || !wok) && first < 0) first = s;
    }
    if (first >= 0) {
        const int t = first / K;
        fprintf(stderr, "  %s: %d id and %d weight mismatch(es); first at token %d slot %d: id %d (ref %d) w %.9g (ref %.9g)\n",
                what, id_bad, w_bad, t, first % K, gi[(size_t)first], ti[(size_t)first], gw[(size_t)first], tw[(size_t)first]);
        fprintf(stderr, "    ref ids:");
        for (int k = 0; k < K; k++) fprintf(stderr, " %d", ti[(size_t)t * K + k]);
        fprintf(stderr, "\n    gpu ids:");
        for (int k = 0; k < K; k++) fprintf(stderr, " %d", gi[(size_t)t * K + k]);
        fprintf(stderr, "\n");
    }
    CHECK(id_bad == 0);
    CHECK(w_bad == 0);
    bad += id_bad + w_bad;
    if (!grouped) {
        const std::vector<int> c = b.counts.get();
        int nz = 0;
        for (int e = 0; e < E; e++) nz += c[(size_t)e] != 0;
        CHECKF(nz == 0, "%s: counts written without a counts buffer", what);
        return bad + nz;
    }

    // counts = histogram of the (reference) ids
    std::vector<int> hist((size_t)E, 0), offs((size_t)E + 1);
    for (int s = 0; s < slots; s++)
        if (ti[(size_t)s] >= 0 && ti[(size_t)s] < E) hist[(size_t)ti[(size_t)s]]++;
    offs[0] = 0;
    for (int e = 0; e < E; e++) offs[(size_t)e + 1] = offs[(size_t)e] + hist[(size_t)e];
    const std::vector<int> gc = b.counts.get();
    const bool counts_ok = gc == hist;
    CHECKF(counts_ok, "%s: per-expert counts differ from the histogram of the ids", what);
    bad += !counts_ok;

    b.cursor.fill_bytes(0x55); // the scan must reset the cursor whatever it held
    b.tiles.fill_bytes(0x55);
    b.n_tiles.fill_bytes(0x55);
    k_moe_scan<<<1, MOE_SCAN_THREADS>>>(b.counts.p, E, b.offs.p, b.cursor.p, b.tiles.p, b.n_tiles.p);
    CKL();
    { // one (expert, first token) per TILE tokens of each non-empty expert, in expert order
        std::vector<int2> want_tiles;
        for (int e = 0; e < E; e++)
            for (int n0 = 0; n0 < hist[(size_t)e]; n0 += TILE) want_tiles.push_back(make_int2(e, n0));
        const int nt = b.n_tiles.get()[0];
        const std::vector<int2> gt = b.tiles.get();
        bool tiles_ok = nt == (int)want_tiles.size();
        for (int i = 0; tiles_ok && i < nt; i++)
            tiles_ok = gt[(size_t)i].x == want_tiles[(size_t)i].x && gt[(size_t)i].y == want_tiles[(size_t)i].y;
        CHECKF(tiles_ok, "%s: tile map wrong (%d tiles, want %zu)", what, nt, want_tiles.size());
        bad += !tiles_ok;
    }
    const std::vector<int> go = b.offs.get(), gc2 = b.counts.get(), gcur = b.cursor.get();
    const bool offs_ok = go == offs;
    const bool reset_ok = std::all_of(gc2.begin(), gc2.end(), [](int v) { return v == 0; }) &&
                          std::all_of(gcur.begin(), gcur.end(), [](int v) { return v == 0; });
    CHECKF(offs_ok, "%s: offs is not the exclusive scan of the counts (offs[E] %d, want %d)", what, go[(size_t)E], offs[(size_t)E]);
    CHECKF(reset_ok, "%s: the scan left counts or cursor nonzero", what);
    bad += !offs_ok + !reset_ok;
    if (!offs_ok || !reset_ok) return bad; // the scatter would write out of bounds

    k_moe_scatter<<<(slots + 255) / 256, 256>>>(b.topi.p, slots, b.offs.p, b.cursor.p, b.sorted.p);
    CKL();
    std::vector<int> gs = b.sorted.get();
    const std::vector<int> gcur2 = b.cursor.get();
    CHECKF(gcur2 == hist, "%s: after the scatter, cursor != counts", what);
    bad += gcur2 != hist;
    // Grouped by expert: the slots of expert e fill sorted[offs[e], offs[e+1]), in any order.
    int grp_bad = 0, first_e = -1;
    std::vector<int> want;
    for (int e = 0; e < E; e++) {
        want.clear();
        for (int s = 0; s < slots; s++)
            if (ti[(size_t)s] == e) want.push_back(s);
        std::vector<int> got(gs.begin() + offs[(size_t)e], gs.begin() + offs[(size_t)e + 1]);
        std::sort(got.begin(), got.end());
        if (got != want) {
            grp_bad++;
            if (first_e < 0) first_e = e;
        }
    }
    CHECKF(grp_bad == 0, "%s: sorted is not the slots grouped by expert (%d expert(s) differ, first %d)", what, grp_bad, first_e);
    std::sort(gs.begin(), gs.end());
    bool perm = true;
    for (int s = 0; s < slots; s++) perm &= gs[(size_t)s] == s;
    CHECKF(perm, "%s: sorted is not a permutation of the %d slots", what, slots);
    bad += grp_bad + !perm;
    return bad;
}

static void test_routing_real_shape(void) {
    const int E = 256, K = 8;
    const int Ts[] = {1, 8, 9, 63, 64, 65, 2047, 2048};
    int runs = 0, bad_runs = 0;
    for (int ti = 0; ti < (int)(sizeof Ts / sizeof Ts[0]); ti++) {
        const int T = Ts[ti];
        route_bufs b(T, E, K);
        b.counts.fill_bytes(0); // as the session allocates it; every pass leaves it zero
        for (int pt = 0; pt < P_COUNT; pt++) {
            std::vector<float> lg, lg2;
            make_logits((pattern)pt, T, E, lg);
            make_logits((pattern)((pt + 1) % P_COUNT), T, E, lg2);
            for (int w = 0; w < 2; w++)
                for (int norm = 1; norm >= 0; norm--) {
                    char what[128];
                    snprintf(what, sizeof what, "%s E=%d K=%d T=%d %s norm=%d", w ? "k_topk" : "k_topk_reg<8>", E, K, T,
                             pattern_name[pt], norm);
                    int bad = route_pass(b, (which)w, T, E, K, norm, true, lg, what);
                    // the next layer on the same buffers, other logits
                    bad += route_pass(b, (which)w, T, E, K, norm, true, lg2, what);
                    // the decode path: no counts
                    bad += route_pass(b, (which)w, T, E, K, norm, false, lg, what);
                    runs++;
                    bad_runs += bad != 0;
                }
        }
    }
    printf("  routing E=256 K=8: %d configurations (T x pattern x kernel x norm), %d with mismatches; "
           "largest weight difference %.2e relative\n", runs, bad_runs, worst_rel_w);
}

// Other router widths: each register variant, a width not a multiple of 32, and
// the shared-memory kernel beyond 256 experts.
static void test_routing_other_shapes(void) {
    struct { int E, K; which w; } cfg[] = {{16, 4, W_REG},  {17, 8, W_REG},   {32, 8, W_REG},    {64, 8, W_REG},
                                           {100, 6, W_REG}, {128, 8, W_REG},  {256, 1, W_REG},   {256, 32, W_REG},
                                           {200, 8, W_SHARED}, {300, 8, W_SHARED}, {512, 10, W_SHARED}};
    const int Ts[] = {1, 65, 2048};
    int runs = 0, bad_runs = 0;
    for (const auto &c : cfg)
        for (int T : Ts) {
            route_bufs b(T, c.E, c.K);
            b.counts.fill_bytes(0);
            for (int pt = 0; pt < P_COUNT; pt++) {
                std::vector<float> lg;
                make_logits((pattern)pt, T, c.E, lg);
                char what[128];
                snprintf(what, sizeof what, "%s E=%d K=%d T=%d %s", c.w == W_SHARED ? "k_topk" : "k_topk_reg", c.E, c.K,
                         T, pattern_name[pt]);
                const int bad = route_pass(b, c.w, T, c.E, c.K, 1, true, lg, what) +
                                route_pass(b, c.w, T, c.E, c.K, 0, false, lg, what);
                runs++;
                bad_runs += bad != 0;
            }
        }
    printf("  routing at other (E, K): %d configurations, %d with mismatches\n", runs, bad_runs);
}

// ---------------------------------------------------------------- argmax

static int64_t ref_argmax(const std::vector<float> &v) {
    int64_t b = 0;
    for (int64_t i = 1; i < (int64_t)v.size(); i++)
        if (v[(size_t)i] > v[(size_t)b]) b = i;
    return b;
}

static void test_argmax(void) {
    const int64_t Vs[] = {1, 31, 32, 1000, 1024, 1025, 8192, 248320};
    dbuf<int> next(1), ring(8), step(1), pos(1);
    dbuf<unsigned long long> best(1);
    dbuf<unsigned> arrived(1);
    best.fill_bytes(0);
    arrived.fill_bytes(0);
    // the backend's grid, then one block and the most blocks (one logit or none for some)
    auto grid = [](int64_t V, int pt) { return pt % 3 == 0 ? argmax_blocks(V) : pt % 3 == 1 ? 1u : 512u; };
    int runs = 0, bad = 0;
    for (int64_t V : Vs) {
        dbuf<float> lg((size_t)V);
        for (int pt = 0; pt < 9; pt++) {
            std::vector<float> v((size_t)V);
            for (auto &x : v) x = rnd_grid(-30, 30);
            switch (pt) {
            case 0: break; // random (chance ties included)
            case 1: v[0] = 100.0f; break;
            case 2: v[(size_t)V - 1] = 100.0f; break;
            case 3: // equal maxima spread over warps and block strides: the lowest wins
                for (int j = 0; j < 6; j++) v[(size_t)((V - 1) - (int64_t)j * (V / 6 + 1) % V)] = 77.0f;
                v[(size_t)(V / 2)] = 77.0f;
                break;
            case 4: std::fill(v.begin(), v.end(), 1.5f); break; // all equal: 0
            case 5: // -inf everywhere but a few
                std::fill(v.begin(), v.end(), -INFINITY);
                v[(size_t)(V * 2 / 3)] = -5.0f;
                v[(size_t)(V / 3)] = -5.0f;
                break;
            case 6: // huge magnitudes
                v[(size_t)rnd_int((int)V)] = -3.0e38f;
                v[(size_t)rnd_int((int)V)] = 3.0e38f;
                break;
            case 7: // the same maximum at index i and i + 1024 (same thread, two strides)
                v[(size_t)((V - 1) % 1024)] = 50.0f;
                if (V > 1024) v[(size_t)((V - 1) % 1024 + 1024 < V ? (V - 1) % 1024 + 1024 : 0)] = 50.0f;
                break;
            default: // ties one index apart in two warps (lanes 31 and 32)
                if (V > 32) v[31] = v[32] = 60.0f;
                break;
            }
            lg.put(v);
            const int st0 = 13 + pt, pos0 = 1000 + pt;
            step.put(&st0);
            pos.put(&pos0);
            ring.fill_bytes(0xff);
            const bool with_ring = pt % 2 == 0;
            k_argmax<<<grid(V, pt), ARGMAX_THREADS>>>(lg.p, V, next.p, with_ring ? ring.p : nullptr, 8,
                                                     with_ring ? step.p : nullptr, with_ring ? pos.p : nullptr, best.p, arrived.p);
            CKL();
            // the scratch words are back at zero for the next launch
            CHECKF(best.get()[0] == 0 && arrived.get()[0] == 0, "argmax V=%lld case %d: scratch not reset", (long long)V, pt);
            const int want = (int)ref_argmax(v), got = next.get()[0];
            const std::vector<int> r = ring.get();
            const int st = step.get()[0], ps = pos.get()[0];
            bool ok = got == want;
            if (with_ring) {
                ok &= r[(size_t)(st0 % 8)] == want && st == st0 + 1 && ps == pos0 + 1;
                for (int j = 0; j < 8; j++) ok &= j == st0 % 8 || r[(size_t)j] == -1;
            } else {
                ok &= st == st0 && ps == pos0 && std::all_of(r.begin(), r.end(), [](int x) { return x == -1; });
            }
            CHECKF(ok, "argmax V=%lld case %d: id %d (want %d), step %d pos %d", (long long)V, pt, got, want, st, ps);
            runs++;
            bad += !ok;
        }
    }
    printf("  argmax: %d cases, %d wrong\n", runs, bad);
    // Every logit -inf or NaN: no maximum; like the CPU reference (and the host
    // sampler), the pick is token 0, never an id outside the vocabulary.
    for (int nan = 0; nan < 2; nan++) {
        const int64_t V = 4096;
        dbuf<float> lg((size_t)V);
        std::vector<float> v((size_t)V, nan ? NAN : -INFINITY);
        lg.put(v);
        k_argmax<<<argmax_blocks(V), ARGMAX_THREADS>>>(lg.p, V, next.p, nullptr, 8, nullptr, nullptr, best.p, arrived.p);
        CKL();
        const int got = next.get()[0];
        CHECKF(got == (int)ref_argmax(v), "argmax over all %s logits: id %d (want %d)", nan ? "NaN" : "-inf", got,
               (int)ref_argmax(v));
    }
}

// ---------------------------------------------------------------- norms with their output split

// A split's buffers for rows x cols, every byte 0xff first (so a slot one side leaves unwritten differs).
struct split_bufs {
    dbuf<__nv_bfloat16> h, l, sw;
    dbuf<float> xs;
    split_bufs(int64_t rows, int64_t cols)
        : h((size_t)(rows * cols)), l((size_t)(rows * cols)), sw((size_t)wg_xsw_win(rows, (int)(cols / 64), 0)),
          xs((size_t)(rows * cols / 64)) {
        h.fill_bytes(0xff), l.fill_bytes(0xff), sw.fill_bytes(0xff), xs.fill_bytes(0xff);
    }
    g4_split sp() { return g4_split{h.p, l.p, sw.p, xs.p}; }
};
template <typename T> static bool same_bytes(const dbuf<T> &a, const dbuf<T> &b) {
    const std::vector<T> x = a.get(), y = b.get();
    return memcmp(x.data(), y.data(), sizeof(T) * x.size()) == 0;
}
// The norm's split (fused) against k_split_x<0> of its output y (rows x cols, row stride cols).
static bool split_matches(split_bufs &fused, const float *y, int64_t rows, int64_t cols) {
    split_bufs ref(rows, cols);
    k_split_x<0><<<(unsigned)rows, 256>>>(y, cols, 0, cols, ref.h.p, ref.l.p, ref.xs.p, nullptr, nullptr, 0, ref.sw.p);
    CKL();
    return same_bytes(fused.h, ref.h) && same_bytes(fused.l, ref.l) && same_bytes(fused.xs, ref.xs) &&
           same_bytes(fused.sw, ref.sw);
}
static std::vector<float> rnd_vec(size_t n, float a) {
    std::vector<float> v(n);
    for (auto &x : v) x = rnd_sym(a);
    return v;
}

static void test_norm_split(void) {
    const float eps = 1e-6f;
    const g4_split none = {nullptr, nullptr, nullptr, nullptr};
    int cases = 0;
    // widths: the model's hidden (32 groups: two whole windows), a partial window (5 groups), one group
    for (int64_t H : {(int64_t)2048, (int64_t)320, (int64_t)64}) {
        const int T = 7;
        const std::vector<float> hx = rnd_vec((size_t)(T * H), 3.0f), hr = rnd_vec((size_t)(T * H), 1.0f),
                                 hg = rnd_vec((size_t)H, 2.0f);
        dbuf<float> x((size_t)(T * H)), r((size_t)(T * H)), g((size_t)H), y((size_t)(T * H)), y0((size_t)(T * H));
        r.put(hr), g.put(hg);
        // k_add_rmsnorm, with and without the residual add
        for (int add = 0; add < 2; add++) {
            x.put(hx);
            k_add_rmsnorm<<<T, 256>>>(x.p, add ? r.p : nullptr, g.p, y0.p, H, eps, 0, none);
            CKL();
            split_bufs f(T, H);
            x.put(hx);
            k_add_rmsnorm<<<T, 256>>>(x.p, add ? r.p : nullptr, g.p, y.p, H, eps, 0, f.sp());
            CKL();
            CHECKF(same_bytes(y, y0), "k_add_rmsnorm H=%lld add=%d: the output changes with the split", (long long)H, add);
            CHECKF(split_matches(f, y.p, T, H), "k_add_rmsnorm H=%lld add=%d: split differs from k_split_x's", (long long)H, add);
            // without y (only the split is read): the same split
            split_bufs f2(T, H);
            x.put(hx);
            k_add_rmsnorm<<<T, 256>>>(x.p, add ? r.p : nullptr, g.p, nullptr, H, eps, 0, f2.sp());
            CKL();
            CHECKF(same_bytes(f2.h, f.h) && same_bytes(f2.l, f.l) && same_bytes(f2.xs, f.xs) && same_bytes(f2.sw, f.sw),
                   "k_add_rmsnorm H=%lld add=%d: the split without y differs", (long long)H, add);
            cases++;
        }
        // k_moe_combine with the next layer's gain (one block a row)
        const int K = 8;
        const std::vector<float> hye = rnd_vec((size_t)(T * K * H), 1.0f), hw = rnd_vec((size_t)(T * K), 1.0f),
                                 hsh = rnd_vec((size_t)(T * H), 1.0f), hsg = rnd_vec((size_t)T, 2.0f);
        dbuf<float> ye((size_t)(T * K * H)), w((size_t)(T * K)), sh((size_t)(T * H)), sg((size_t)T);
        ye.put(hye), w.put(hw), sh.put(hsh), sg.put(hsg);
        x.put(hx);
        k_moe_combine<<<dim3((unsigned)T, 1), 256>>>(x.p, ye.p, w.p, K, sh.p, sg.p, H, g.p, y0.p, eps, none);
        CKL();
        split_bufs f(T, H);
        x.put(hx);
        k_moe_combine<<<dim3((unsigned)T, 1), 256>>>(x.p, ye.p, w.p, K, sh.p, sg.p, H, g.p, y.p, eps, f.sp());
        CKL();
        CHECKF(same_bytes(y, y0), "k_moe_combine H=%lld: the output changes with the split", (long long)H);
        CHECKF(split_matches(f, y.p, T, H), "k_moe_combine H=%lld: split differs from k_split_x's", (long long)H);
        split_bufs f2(T, H);
        x.put(hx);
        k_moe_combine<<<dim3((unsigned)T, 1), 256>>>(x.p, ye.p, w.p, K, sh.p, sg.p, H, g.p, nullptr, eps, f2.sp());
        CKL();
        CHECKF(same_bytes(f2.h, f.h) && same_bytes(f2.l, f.l) && same_bytes(f2.xs, f.xs) && same_bytes(f2.sw, f.sw),
               "k_moe_combine H=%lld: the split without xn differs", (long long)H);
        cases++;
    }
    // k_gated_norm, dv = 128: the model's 32 value heads (64 groups a row) and 8 (16: one window)
    for (int Hv : {32, 8}) {
        const int T = 5, dv = 128;
        const int64_t n = (int64_t)T * Hv * dv;
        const std::vector<float> ho = rnd_vec((size_t)n, 2.0f), hz = rnd_vec((size_t)n, 3.0f), hw = rnd_vec((size_t)dv, 1.5f);
        dbuf<float> o((size_t)n), o0((size_t)n), z((size_t)n), w((size_t)dv);
        z.put(hz), w.put(hw);
        o0.put(ho);
        k_gated_norm<<<(unsigned)((T * Hv + 7) / 8), 256>>>(o0.p, z.p, w.p, (int64_t)T, Hv, dv, eps, none, false);
        CKL();
        split_bufs f(T, (int64_t)Hv * dv);
        o.put(ho);
        k_gated_norm<<<(unsigned)((T * Hv + 7) / 8), 256>>>(o.p, z.p, w.p, (int64_t)T, Hv, dv, eps, f.sp(), false);
        CKL();
        CHECKF(same_bytes(o, o0), "k_gated_norm Hv=%d: the output changes with the split", Hv);
        CHECKF(split_matches(f, o.p, T, (int64_t)Hv * dv), "k_gated_norm Hv=%d: split differs from k_split_x's", Hv);
        // split_only: the same split, o left as it was
        split_bufs f2(T, (int64_t)Hv * dv);
        o.put(ho);
        k_gated_norm<<<(unsigned)((T * Hv + 7) / 8), 256>>>(o.p, z.p, w.p, (int64_t)T, Hv, dv, eps, f2.sp(), true);
        CKL();
        const std::vector<float> oa = o.get();
        CHECKF(memcmp(oa.data(), ho.data(), sizeof(float) * ho.size()) == 0, "k_gated_norm Hv=%d split_only: o was written", Hv);
        CHECKF(same_bytes(f2.h, f.h) && same_bytes(f2.l, f.l) && same_bytes(f2.xs, f.xs) && same_bytes(f2.sw, f.sw),
               "k_gated_norm Hv=%d: the split_only split differs", Hv);
        cases++;
    }
    printf("  norms with their split: %d cases\n", cases);
}

int main(int argc, char **argv) {
    (void)argv;
    if (argc > 1) { fprintf(stderr, "usage: test_kernels\n"); return 2; }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) { fprintf(stderr, "no CUDA device\n"); return 2; }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    TEST(test_routing_real_shape);
    TEST(test_routing_other_shapes);
    TEST(test_argmax);
    TEST(test_norm_split);
    const int rc = check_summary();
    printf("%s\n", rc ? "FAIL" : "PASS");
    return rc;
}
