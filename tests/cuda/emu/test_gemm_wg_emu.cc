// test_gemm_wg_emu.cc — the 4-bit prefill GEMM on wgmma (src/backend/cuda/cuda_gemm_wg.cuh:
// k_gemm_wg) run by the CUDA emulator on the CPU, against the dequantised product in double.
// Checks the kernel's logic where CI has no GPU: the packed codes' unpacking into A
// fragments, the input parts' swizzled placement and the descriptors that read them back,
// the stage pipeline, partial tiles, the fold, the bias product's windows (its A operand gathered
// from the scale/bias pairs, its B operand the group sums in three pieces), the expert tile map
// (grouped mode).
// tests/cuda/test_matmul.cu checks the same kernel on the device. The weights are packed
// here from cuda_packed.cuh's description of the layout (a second implementation of
// k_repack4's map), the input split as k_split_x does. Build (tests/run.sh does):
//   g++ -std=c++20 -O1 -g -pthread -DLILAC_CUEMU -Itests/cuda/emu -Isrc -x c++
//       tests/cuda/emu/test_gemm_wg_emu.cc -lm -o build/test_gemm_wg_emu
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "cuda_runtime.h"
#include "backend/cuda/cuda_gemm_wg.cuh"

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint32_t urand32() {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}
static double urand() { return (double)urand32() / 4294967296.0; }
static uint16_t bf16_rne(float f) { // round to nearest even (finite inputs)
    uint32_t u = __float_as_uint(f);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static float bf16_f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// E experts of R x K 4-bit affine weights (group 64), packed as cuda_packed.cuh describes.
struct qw {
    int E;
    int64_t R, K, RB;
    std::vector<uint8_t> q;         // [E][R][K] codes
    std::vector<float> s, b;        // [E][R][K/64], bf16 values
    std::vector<uint4> pk;          // [E][RB][K/64][32]
    std::vector<uint32_t> psb;      // [E][RB][K/64][16]
    std::vector<uint32_t> mq;       // MLX-layout stand-ins (dmat_expert offsets them; never read)
    std::vector<__nv_bfloat16> ms, mb;
    dmat W;
    double w(int e, int64_t r, int64_t c) const {
        const size_t g = (size_t)((e * R + r) * (K / 64) + c / 64);
        return (double)s[g] * q[(size_t)((e * R + r) * K + c)] + b[g];
    }
};
static qw *make_qw(int E, int64_t R, int64_t K) {
    qw *m = new qw();
    m->E = E, m->R = R, m->K = K, m->RB = (R + 15) / 16;
    const int64_t ng = K / 64;
    m->q.resize((size_t)(E * R * K));
    for (auto &c : m->q) c = (uint8_t)(urand32() & 15);
    m->s.resize((size_t)(E * R * ng));
    m->b.resize(m->s.size());
    for (size_t i = 0; i < m->s.size(); i++) {
        m->s[i] = bf16_f(bf16_rne((float)(0.002 + 0.01 * urand())));
        m->b[i] = bf16_f(bf16_rne((float)(-0.05 + 0.02 * urand())));
    }
    m->pk.assign((size_t)(E * m->RB * ng * 32), uint4{0, 0, 0, 0});
    m->psb.assign((size_t)(E * m->RB * ng * 16), 0u);
    for (int e = 0; e < E; e++)
        for (int64_t rb = 0; rb < m->RB; rb++)
            for (int64_t G = 0; G < ng; G++) {
                const int64_t blk = (e * m->RB + rb) * ng + G;
                for (int lane = 0; lane < 32; lane++) {
                    const int g = lane >> 2, t = lane & 3;
                    uint32_t wd[4];
                    for (int ks = 0; ks < 4; ks++) { // bits 4i (low code) and 16 + 4i (high code) of register a_i
                        uint32_t w = 0;
                        for (int i = 0; i < 4; i++) {
                            const int64_t r = 16 * rb + g + (i & 1) * 8, c = 64 * G + 16 * ks + 2 * t + (i >> 1) * 8;
                            if (r >= R) continue;
                            const uint32_t lo = m->q[(size_t)((e * R + r) * K + c)], hi = m->q[(size_t)((e * R + r) * K + c + 1)];
                            w |= lo << (4 * i) | hi << (16 + 4 * i);
                        }
                        wd[ks] = w;
                    }
                    m->pk[(size_t)(blk * 32 + lane)] = uint4{wd[0], wd[1], wd[2], wd[3]};
                }
                for (int r16 = 0; r16 < 16; r16++) {
                    const int64_t r = 16 * rb + r16;
                    if (r >= R) continue;
                    const size_t gi = (size_t)((e * R + r) * ng + G);
                    m->psb[(size_t)(blk * 16 + r16)] = (uint32_t)bf16_rne(m->s[gi]) | (uint32_t)bf16_rne(m->b[gi]) << 16;
                }
            }
    m->mq.assign((size_t)(E * R * K / 8), 0u);
    m->ms.assign((size_t)(E * R * ng), __nv_bfloat16{0});
    m->mb.assign(m->ms.size(), __nv_bfloat16{0});
    dmat &W = m->W;
    memset(&W, 0, sizeof W);
    W.type = 0, W.bits = 4, W.group = 64, W.rows = R, W.cols = K, W.stride = R, W.n_experts = E;
    W.q = m->mq.data(), W.s = m->ms.data(), W.b = m->mb.data();
    W.pk = m->pk.data(), W.psb = m->psb.data(), W.pk_rb = m->RB;
    return m;
}

// T input rows of K, split as k_split_x does: xh = bf16(x), xl = bf16(x - xh), f32 sums per group
// in three bf16 pieces by windows of 16 groups (xsw, cuda_gemm4_tile.cuh: wg_xsw_win).
struct xin {
    std::vector<float> x, xs;
    std::vector<__nv_bfloat16> xh, xl, xsw;
};
static xin make_x(int64_t T, int64_t K, float amp) {
    xin v;
    v.x.resize((size_t)(T * K));
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < K; c++) v.x[(size_t)(t * K + c)] = (float)(2.0 * urand() - 1.0) * (t % 3 == 1 ? amp : 1.0f);
    v.xh.resize(v.x.size());
    v.xl.resize(v.x.size());
    v.xs.assign((size_t)(T * K / 64), 0.0f);
    for (size_t i = 0; i < v.x.size(); i++) {
        const uint16_t h = bf16_rne(v.x[i]);
        v.xh[i].x = h;
        v.xl[i].x = bf16_rne(v.x[i] - bf16_f(h));
        v.xs[i / 64] += v.x[i];
    }
    const int ng = (int)(K / 64);
    v.xsw.assign((size_t)wg_xsw_win(T, ng, 0), __nv_bfloat16{0}); // (the empty slots: zero)
    for (int64_t t = 0; t < T; t++)
        for (int G = 0; G < ng; G++) {
            const float s = v.xs[(size_t)(t * ng + G)];
            const uint16_t h = bf16_rne(s), m = bf16_rne(s - bf16_f(h)), l = bf16_rne(s - bf16_f(h) - bf16_f(m));
            const int64_t at = wg_xsw_win(t, ng, G / 16) + G % 16;
            v.xsw[(size_t)at].x = h, v.xsw[(size_t)(at + 16)].x = m, v.xsw[(size_t)(at + 32)].x = l;
        }
    return v;
}

static int fails = 0, passes = 0;

// Launch k_gemm_wg over one matrix (plain: tiles == nullptr) and check y[slot][m] against
// sum_k w(e(slot), m, k) x(slot / x_div, k), each slot against its own size.
static void run_case(const char *what, qw *m, const xin &x, int64_t T, int S, const std::vector<int> &slot_e,
                     const int *offs, const int *sorted, const std::vector<int2> &tl, int x_div) {
    const int64_t R = m->R, K = m->K;
    std::vector<float> y((size_t)(S * R), NAN); // NaN: every output must be written
    g4_job j;
    memset(&j, 0, sizeof j);
    j.n = 1;
    j.W[0] = m->W;
    j.y[0] = y.data();
    j.ldy[0] = R;
    j.start[1] = (int)((R + G4_BM - 1) / G4_BM);
    const int nt = (int)tl.size();
    const __nv_bfloat16 *xh = x.xh.data(), *xl = x.xl.data();
    const __nv_bfloat16 *xs = x.xsw.data();
    int Ti = (int)T;
    const int *n_tiles = &nt;
    const int2 *tiles = tl.empty() ? nullptr : tl.data();
    if (!tiles) n_tiles = nullptr;
    void *args[] = {&j, &xh, &xl, &xs, &Ti, &offs, &sorted, &tiles, &n_tiles, &x_div};
    const dim3 g((unsigned)j.start[1], tiles ? (unsigned)nt + 2 : (unsigned)((T + G4_BN - 1) / G4_BN));
    cudaLaunchKernel(k_gemm_wg, g, dim3(256), args, wg_smem());
    double e = 0.0;
    for (int sl = 0; sl < S; sl++) {
        const float *xr = &x.x[(size_t)(sl / x_div) * (size_t)K];
        std::vector<double> ref((size_t)R);
        double size = 0.0;
        for (int64_t r = 0; r < R; r++) {
            double a = 0.0, aa = 0.0;
            for (int64_t c = 0; c < K; c++) {
                a += m->w(slot_e[(size_t)sl], r, c) * xr[c];
                aa += fabs(m->w(slot_e[(size_t)sl], r, c) * xr[c]);
            }
            ref[(size_t)r] = a;
            size = std::max(size, std::max(fabs(a), aa / sqrt((double)K)));
        }
        for (int64_t r = 0; r < R; r++) {
            const float gv = y[(size_t)sl * (size_t)R + (size_t)r];
            e = std::isfinite(gv) ? std::max(e, fabs((double)gv - ref[(size_t)r]) / (size > 0 ? size : 1.0)) : INFINITY;
        }
    }
    const bool ok = e <= 1e-4;
    printf("  %-52s rel err %.2e  %s\n", what, e, ok ? "PASS" : "FAIL");
    (ok ? passes : fails)++;
}

static void plain(int64_t R, int64_t K, int64_t T, float amp) {
    qw *m = make_qw(1, R, K);
    const xin x = make_x(T, K, amp);
    char what[96];
    snprintf(what, sizeof what, "plain %lld x %lld, %lld tokens%s", (long long)R, (long long)K, (long long)T,
             amp != 1.0f ? ", rows 1e5x apart" : "");
    run_case(what, m, x, T, (int)T, std::vector<int>((size_t)T, 0), nullptr, nullptr, {}, 1);
    delete m;
}

// Grouped: T tokens x KS slots, slot s to expert (7s + s/5) % E, slots sorted by expert and the
// (expert, 64 tokens) tile map built as k_moe_scan does; two spare grid rows past n_tiles.
static void grouped(int E, int64_t R, int64_t K, int64_t T, int KS) {
    qw *m = make_qw(E, R, K);
    const xin x = make_x(T, K, 1.0f);
    const int S = (int)(T * KS);
    std::vector<int> ex((size_t)S), offs((size_t)E + 1, 0), sorted;
    std::vector<int2> tl;
    for (int sl = 0; sl < S; sl++) ex[(size_t)sl] = (7 * sl + sl / 5) % E;
    for (int e = 0; e < E; e++) {
        offs[(size_t)e] = (int)sorted.size();
        for (int sl = 0; sl < S; sl++)
            if (ex[(size_t)sl] == e) sorted.push_back(sl);
        for (int n0 = 0; offs[(size_t)e] + n0 < (int)sorted.size(); n0 += G4_BN) tl.push_back(make_int2(e, n0));
    }
    offs[(size_t)E] = (int)sorted.size();
    char what[96];
    snprintf(what, sizeof what, "grouped %d experts of %lld x %lld, %lld tokens x %d slots", E, (long long)R, (long long)K,
             (long long)T, KS);
    run_case(what, m, x, T, S, ex, offs.data(), sorted.data(), tl, KS);
    delete m;
}

// A swiglu job (cuda_gemm4_tile.cuh): gate and up matrices of the same rows, the epilogue writing
// h = silu(gate) * up split for the next GEMM. Against k_split_x<1>'s arithmetic (written out here)
// on the same kernel's plain outputs of each matrix: the same bits, parts and group sums alike.
static void launch_wg(const g4_job &j, const xin &x, int64_t T, const int *offs, const int *sorted, const std::vector<int2> &tl,
                      int x_div, unsigned gx) {
    const int nt = (int)tl.size();
    const __nv_bfloat16 *xh = x.xh.data(), *xl = x.xl.data(), *xs = x.xsw.data();
    int Ti = (int)T;
    const int *n_tiles = tl.empty() ? nullptr : &nt;
    const int2 *tiles = tl.empty() ? nullptr : tl.data();
    void *args[] = {(void *)&j, &xh, &xl, &xs, &Ti, &offs, &sorted, &tiles, &n_tiles, &x_div};
    const dim3 g(gx, tiles ? (unsigned)nt + 2 : (unsigned)((T + G4_BN - 1) / G4_BN));
    cudaLaunchKernel(k_gemm_wg, g, dim3(256), args, wg_smem());
}
static void pair_case(int E, int64_t I, int64_t K, int64_t T, int KS) {
    qw *gm = make_qw(E, I, K), *um = make_qw(E, I, K);
    const xin x = make_x(T, K, 1.0f);
    const int S = (int)(T * KS);
    std::vector<int> offs, sorted;
    std::vector<int2> tl;
    if (E > 1) { // grouped, slot s to expert (7s + s/5) % E
        offs.assign((size_t)E + 1, 0);
        for (int e = 0; e < E; e++) {
            offs[(size_t)e] = (int)sorted.size();
            for (int sl = 0; sl < S; sl++)
                if ((7 * sl + sl / 5) % E == e) sorted.push_back(sl);
            for (int n0 = 0; offs[(size_t)e] + n0 < (int)sorted.size(); n0 += G4_BN) tl.push_back(make_int2(e, n0));
        }
        offs[(size_t)E] = S;
    }
    const int *po = E > 1 ? offs.data() : nullptr, *ps = E > 1 ? sorted.data() : nullptr;
    // each matrix alone (plain outputs)
    std::vector<float> yg((size_t)(S * I), NAN), yu((size_t)(S * I), NAN);
    for (int w = 0; w < 2; w++) {
        g4_job j;
        memset(&j, 0, sizeof j);
        j.n = 1;
        j.W[0] = (w ? um : gm)->W;
        j.y[0] = (w ? yu : yg).data();
        j.ldy[0] = I;
        j.start[1] = (int)((I + G4_BM - 1) / G4_BM);
        launch_wg(j, x, T, po, ps, tl, KS, (unsigned)j.start[1]);
    }
    // the pair
    const int ng = (int)(I / 64);
    std::vector<__nv_bfloat16> oh((size_t)(S * I)), ol((size_t)(S * I)), osw((size_t)wg_xsw_win(S, ng, 0));
    for (auto *v : {&oh, &ol, &osw})
        for (auto &b : *v) b.x = 0xFFFF; // NaN: every value must be written
    g4_job j;
    memset(&j, 0, sizeof j);
    j.n = 2;
    j.W[0] = gm->W, j.W[1] = um->W;
    j.start[1] = j.start[2] = (int)(I / 64);
    j.swiglu = 1;
    j.oh = oh.data(), j.ol = ol.data(), j.osw = osw.data();
    launch_wg(j, x, T, po, ps, tl, KS, (unsigned)j.start[1]);
    int bad = 0;
    for (int sl = 0; sl < S; sl++) {
        std::vector<float> hs((size_t)I);
        for (int64_t c = 0; c < I; c++) {
            const float e = g4_swiglu(yg[(size_t)(sl * I + c)], yu[(size_t)(sl * I + c)]);
            const uint16_t h = bf16_rne(e), l = bf16_rne(e - bf16_f(h));
            bad += oh[(size_t)(sl * I + c)].x != h || ol[(size_t)(sl * I + c)].x != l;
            hs[(size_t)c] = e;
        }
        for (int G = 0; G < ng; G++) { // k_split_x's order: 4 columns a lane, then a 16-lane xor tree
            float ln[16];
            for (int i = 0; i < 16; i++) {
                const float *e = &hs[(size_t)(64 * G + 4 * i)];
                ln[i] = (e[0] + e[1]) + (e[2] + e[3]);
            }
            for (int o = 8; o > 0; o >>= 1) {
                float nx[16];
                for (int i = 0; i < 16; i++) nx[i] = ln[i] + ln[i ^ o];
                memcpy(ln, nx, sizeof ln);
            }
            const float sm = ln[0];
            const uint16_t h = bf16_rne(sm), m = bf16_rne(sm - bf16_f(h)), l = bf16_rne(sm - bf16_f(h) - bf16_f(m));
            const int64_t at = wg_xsw_win(sl, ng, G / 16) + G % 16;
            bad += osw[(size_t)at].x != h || osw[(size_t)(at + 16)].x != m || osw[(size_t)(at + 32)].x != l;
        }
        for (int k = 0; k < 48; k++) // a partial last window's empty slots: zero
            if ((ng & 15) && (k & 15) >= (ng & 15)) bad += osw[(size_t)(wg_xsw_win(sl, ng, (ng - 1) / 16) + k)].x != 0;
    }
    char what[96];
    snprintf(what, sizeof what, "swiglu pair %d x %lld x %lld, %lld tokens x %d", E, (long long)I, (long long)K, (long long)T, KS);
    printf("  %-52s %d values differ  %s\n", what, bad, bad ? "FAIL" : "PASS");
    (bad ? fails : passes)++;
    delete gm;
    delete um;
}

int main(void) {
    printf("k_gemm_wg under the CUDA emulator\n");
    plain(200, 256, 65, 1.0f);   // rows not a multiple of 16 or 128; a second 64-token tile of one token
    plain(40, 128, 7, 1.0f);     // one partial row tile; two groups (fewer than the stages loaded ahead)
    plain(128, 384, 64, 1e5f);   // rows of very different size; six groups (every stage reused)
    grouped(3, 144, 192, 70, 2); // 140 slots over 3 experts: full and partial tiles
    plain(136, 1152, 40, 1.0f);  // 18 groups: the bias product's full window of 16 and a partial one
    plain(128, 2048, 64, 1e5f);  // 32 groups: two full windows (both XB buffers)
    plain(128, 2560, 64, 1.0f);  // 40 groups: a third, partial window (XB buffer 0 reused)
    // the narrower MMAs of a tile of few tokens (16 wide up to 16 tokens, 32 up to 32), at each edge
    plain(40, 128, 17, 1.0f);    // 17: 32 wide
    plain(128, 384, 80, 1e5f);   // a second tile of 16: 16 wide, full
    plain(136, 1152, 32, 1.0f);  // 32: 32 wide, full; 18 groups
    plain(200, 256, 97, 1.0f);   // a second tile of 33: 64 wide
    grouped(5, 144, 192, 70, 2); // 28 slots an expert: 32 wide
    // the SwiGLU pair (gate and up in one block, the next GEMM's split input out)
    pair_case(1, 128, 192, 70, 1);  // plain: 64 + 6 tokens (64 and 16 wide); two row blocks of 64
    pair_case(5, 64, 128, 70, 2);   // grouped: 28 slots an expert (32 wide); one group
    pair_case(3, 1152, 64, 30, 3);  // 18 groups: a full and a partial window of the sums
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
