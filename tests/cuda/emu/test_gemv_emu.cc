// test_gemv_emu.cc — the decode GEMV (src/backend/cuda/cuda_gemv.cuh: k_gemv through
// gemv_launch) run by the CUDA emulator on the CPU, against the same products in double from
// the same codes. Checks the kernel's logic where CI has no GPU: the weight stages (bulk copies
// completing on mbarriers, whose phases the emulator tracks: a wait for a phase that has not
// completed aborts), several sets per block with the stages wrapping round, the input staged as
// int8 pieces (plain, RMSNorm with the normalised input written out, SwiGLU), rows added into the
// residual stream, several matrices in one launch (one of them 8-bit, through row_dot), and
// routed slots (expert mode, also with the router's top-k made in the kernel, a tie included);
// and pk_stage4's bytes against the layout formula of cuda_packed_dot.cuh, in both ways kernels call it.
// test_matmul checks the same kernel on the device. Build (tests/run.sh does):
//   g++ -std=c++20 -O1 -g -pthread -DLILAC_CUEMU -Itests/cuda/emu -Isrc -x c++
//       tests/cuda/emu/test_gemv_emu.cc -lm -o build/test_gemv_emu
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda_runtime.h"
#define EMU_SEED 0x2545F4914F6CDD1Dull
#include "emu_test.h"
#include "backend/cuda/cuda_gemv.cuh"
#include "emu_packed.h"

// An 8-bit affine matrix in the MLX layout (four codes a word, group 64), for row_dot.
struct q8 {
    int64_t rows, cols;
    std::vector<uint32_t> q;
    std::vector<__nv_bfloat16> s, b;
    double w(int64_t r, int64_t c) const {
        const size_t gi = (size_t)(r * (cols / 64) + c / 64);
        const uint32_t code = q[(size_t)((r * cols + c) / 4)] >> (8 * (c % 4)) & 0xFFu;
        return (double)__bfloat162float(s[gi]) * code + (double)__bfloat162float(b[gi]);
    }
    dmat view() const {
        dmat d = {};
        d.type = 0, d.bits = 8, d.group = 64, d.rows = rows, d.cols = cols, d.stride = rows, d.n_experts = 1;
        d.q = q.data(), d.s = s.data(), d.b = b.data();
        return d;
    }
};
static q8 make_q8(int64_t rows, int64_t cols) {
    q8 m;
    m.rows = rows, m.cols = cols;
    m.q.resize((size_t)(rows * cols / 4));
    for (auto &v : m.q) v = (uint32_t)(urand() * 4294967296.0);
    m.s.resize((size_t)(rows * cols / 64));
    m.b.resize(m.s.size());
    for (size_t i = 0; i < m.s.size(); i++) {
        const float sc = (float)(0.0002 + 0.0006 * urand());
        m.s[i] = __float2bfloat16_rn(sc);
        m.b[i] = __float2bfloat16_rn(-sc * (float)(100.0 + 50.0 * urand()));
    }
    return m;
}

static std::vector<float> rand_vec(int64_t n, float a) {
    std::vector<float> v((size_t)n);
    for (auto &x : v) x = sym(a);
    return v;
}
static double rel_err(const std::vector<float> &y, const std::vector<double> &ref) {
    double e = 0.0, m = 0.0;
    for (size_t i = 0; i < y.size(); i++) {
        const double d = fabs((double)y[i] - ref[i]);
        e = std::isnan(d) ? INFINITY : std::max(e, d);
        m = std::max(m, fabs(ref[i]));
    }
    return m > 0.0 ? e / m : e;
}
static void verdict(bool ok, const char *what, double e) {
    printf("%s %-58s max|y - ref| / max|ref| %.2e\n", ok ? "PASS" : "FAIL", what, e);
    ok ? passes++ : fails++;
}

// The input as the kernel takes it (xm), from the raw row (x, and x + cols for SwiGLU's up half).
static std::vector<double> gemv_input(const std::vector<float> &x, int64_t cols, int xm, const std::vector<float> &gain) {
    std::vector<double> v((size_t)cols);
    double ss = 0.0;
    for (int64_t c = 0; c < cols; c++) ss += (double)x[(size_t)c] * x[(size_t)c];
    const double inv = 1.0 / sqrt(ss / (double)cols + 1e-6);
    for (int64_t c = 0; c < cols; c++) {
        const double a = x[(size_t)c];
        v[(size_t)c] = xm == XM_NORM ? a * inv * gain[(size_t)c] : xm == XM_SWIGLU ? a / (1.0 + exp(-a)) * x[(size_t)(cols + c)] : a;
    }
    return v;
}

// One launch of a job over the matrices ms (4-bit packed ones, and an 8-bit one when q8m is given)
// at `blocks` (gemv_launch's grid aim: fewer blocks, more sets each), against the double products.
static void plain_case(const char *what, std::vector<const qm *> ms, const q8 *q8m, int xm, bool accum, int blocks) {
    const int64_t cols = ms.empty() ? q8m->cols : ms[0]->cols;
    const std::vector<float> x = rand_vec(xm == XM_SWIGLU ? 2 * cols : cols, 2.0f), gain = rand_vec(cols, 1.5f);
    const std::vector<double> xin = gemv_input(x, cols, xm, gain);
    gemv_job j = {};
    std::vector<std::vector<float>> y;
    std::vector<std::vector<double>> ref;
    auto add = [&](dmat W, auto wfn) {
        const int i = j.n++;
        std::vector<float> y0 = accum ? rand_vec(W.rows, 1.0f) : std::vector<float>((size_t)W.rows, NAN); // poison
        std::vector<double> r((size_t)W.rows);
        for (int64_t row = 0; row < W.rows; row++) {
            double a = accum ? y0[(size_t)row] : 0.0;
            for (int64_t c = 0; c < cols; c++) a += wfn(row, c) * xin[(size_t)c];
            r[(size_t)row] = a;
        }
        y.push_back(y0);
        ref.push_back(r);
        j.W[i] = W;
        j.ldy[i] = W.rows;
        j.accum[i] = accum;
    };
    for (const qm *m : ms) add(m->view(), [m](int64_t r, int64_t c) { return m->w(0, r, c); });
    if (q8m) add(q8m->view(), [q8m](int64_t r, int64_t c) { return q8m->w(r, c); });
    for (int i = 0; i < j.n; i++) j.y[i] = y[(size_t)i].data();
    std::vector<float> xn((size_t)cols, NAN);
    j.gain = gain.data();
    j.eps = 1e-6f;
    if (xm == XM_NORM) j.xn_out = xn.data();
    if (gemv_launch(0, false, j, xm, x.data(), cols, cols, nullptr, 1, 0, blocks) != cudaSuccess) {
        verdict(false, what, INFINITY);
        return;
    }
    double e = 0.0;
    for (int i = 0; i < j.n; i++) e = std::max(e, rel_err(y[(size_t)i], ref[(size_t)i]));
    bool ok = e <= 2e-6;
    if (xm == XM_NORM) {
        const double en = rel_err(xn, xin);
        if (!(en <= 1e-6)) { ok = false; printf("  xn_out: max|xn - ref| / max|ref| %.2e\n", en); }
    }
    char line[160];
    snprintf(line, sizeof line, "%s (%d sets a block at most)", what, j.upb);
    verdict(ok, line, e);
}

// pk_stage4 against the layout formula it implements (cuda_packed_dot.cuh: piece n of column c at byte
// 64 n + 256 G + 16 ((w & 7) >> 1) + 4 ks + 2 (w & 1) + (w >> 3), G = c / 64, ks = c % 64 / 16,
// w = c % 16; int8 casts of i8_pieces of c's value over its group's σ), byte by byte, over
// inputs with zero groups, mixed magnitudes and rounding ties, in both ways the kernels call it:
// a block's threads over consecutive quads (k_gemv, the MoE stagers), and one warp's 16 lanes
// with lanes 16-31 idle (k_moe_split's h and shared-expert staging).
static void stage_ref(const std::vector<float> &x, int64_t n4, std::vector<uint8_t> &xb, std::vector<float> &xsg) {
    for (int64_t G = 0; G < n4 / 16; G++) {
        float m = 0.0f, qs[16];
        for (int k = 0; k < 16; k++) {
            const float *v = &x[(size_t)(64 * G + 4 * k)];
            qs[k] = (v[0] + v[1]) + (v[2] + v[3]);
            m = fmaxf(m, fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
        }
        // the xor butterfly's association at the group's first lane
        const float gs = (((qs[0] + qs[8]) + (qs[4] + qs[12])) + ((qs[2] + qs[10]) + (qs[6] + qs[14]))) +
                         (((qs[1] + qs[9]) + (qs[5] + qs[13])) + ((qs[3] + qs[11]) + (qs[7] + qs[15])));
        const float inv = m > 0.0f ? 127.0f / m : 0.0f;
        for (int64_t c = 64 * G; c < 64 * G + 64; c++) {
            const int64_t cc = c & 63, ks = cc >> 4, w = cc & 15;
            const int64_t at = 256 * G + 16 * ((w & 7) >> 1) + 4 * ks + 2 * (w & 1) + (w >> 3);
            float a, b, cp;
            i8_pieces(x[(size_t)c] * inv, a, b, cp);
            xb[(size_t)at] = (uint8_t)(int8_t)a;
            xb[(size_t)at + 64] = (uint8_t)(int8_t)b;
            xb[(size_t)at + 128] = (uint8_t)(int8_t)cp;
        }
        xsg[(size_t)(2 * G)] = gs;
        xsg[(size_t)(2 * G + 1)] = m * (1.0f / 127.0f);
    }
}
__global__ void k_stage_quads(const float *x, int64_t n4, int warp_mode, uint4 *xq) {
    float *xsg = (float *)(xq + n4);
    if (warp_mode) { // warp 0, lanes 0-15 one quad each of group blockIdx.x
        if (threadIdx.x >= 32) return;
        const int lane = threadIdx.x, q = lane & 15;
        const int64_t gq = (int64_t)blockIdx.x * 16 + q;
        const float4 v = lane < 16 ? *(const float4 *)(x + 4 * gq) : make_float4(0, 0, 0, 0);
        pk_stage4(v, gq, lane < 16, xq, xsg);
        return;
    }
    for (int64_t q0 = 0; q0 < n4; q0 += blockDim.x) {
        const int64_t q = q0 + threadIdx.x;
        const bool in = q < n4;
        pk_stage4(in ? *(const float4 *)(x + 4 * q) : make_float4(0, 0, 0, 0), q, in, xq, xsg);
    }
}
static void stage_bytes_case(int64_t cols) {
    const int64_t n4 = cols / 4, ng = cols / 64;
    std::vector<float> x((size_t)cols);
    for (int64_t c = 0; c < cols; c++) {
        const int64_t G = c / 64;
        const float mag = G % 5 == 0 ? 0.0f : G % 5 == 1 ? 1e-30f : G % 5 == 2 ? 3e4f : 1.0f;
        x[(size_t)c] = sym(1.0f) * mag * (c % 7 == 0 ? 1e-3f : 1.0f);
        if (G % 5 == 3 && c % 9 == 0) x[(size_t)c] = (float)((c % 13) - 6) * 0.5f; // halves: rintf ties
    }
    std::vector<uint8_t> rb((size_t)n4 * 16, 0);
    std::vector<float> rs((size_t)ng * 2);
    stage_ref(x, n4, rb, rs);
    for (int wm = 0; wm < 2; wm++) {
        std::vector<uint4> xq((size_t)(n4 + cols / 128), uint4{0, 0, 0, 0}); // pieces, then {Σx, σ} per group
        const float *xp = x.data();
        uint4 *qp = xq.data();
        int64_t n4v = n4;
        void *args[] = {&xp, &n4v, &wm, &qp};
        cudaLaunchKernel(k_stage_quads, dim3(wm ? (unsigned)ng : 1u), dim3(256), args, 0);
        const uint8_t *gb = (const uint8_t *)xq.data();
        const float *gsg = (const float *)(xq.data() + n4);
        size_t bad = 0;
        for (int64_t i = 0; i < n4 * 16; i++)
            if ((i / 64) % 4 != 3 && gb[i] != rb[(size_t)i]) bad++; // (piece 3: nobody writes or reads it)
        for (int64_t i = 0; i < 2 * ng; i++) bad += memcmp(&gsg[i], &rs[(size_t)i], sizeof(float)) != 0;
        char line[120];
        snprintf(line, sizeof line, "pk_stage4 bytes, %lld columns, %s", (long long)cols, wm ? "one warp's 16 lanes" : "a block's quads");
        printf("%s %-58s bytes or sums differing from the layout: %zu\n", bad ? "FAIL" : "PASS", line, bad);
        bad ? fails++ : passes++;
    }
}

// Routed slots in double: slot s multiplies expert e[s] of m with the input row at x + s * xstride.
static std::vector<double> slots_ref(const qm &m, const std::vector<int> &e, const std::vector<float> &x, int64_t xstride) {
    std::vector<double> ref(e.size() * (size_t)m.rows);
    for (size_t s = 0; s < e.size(); s++)
        for (int64_t r = 0; r < m.rows; r++) {
            double a = 0.0;
            for (int64_t c = 0; c < m.cols; c++) a += m.w(e[s], r, c) * x[s * (size_t)xstride + (size_t)c];
            ref[s * (size_t)m.rows + (size_t)r] = a;
        }
    return ref;
}
// An expert-mode job of m alone, its slots' rows into y.
static gemv_job slots_job(const qm &m, std::vector<float> &y) {
    gemv_job j = {};
    j.n = 1;
    j.W[0] = m.view();
    j.y[0] = y.data();
    j.ldy[0] = m.rows;
    return j;
}

// Expert mode: slots 0 .. ns-1 multiply expert topi[slot] of a stacked matrix with input row slot.
static void expert_case(int64_t rows, int64_t cols, int E, int ns, int blocks) {
    const qm m = make_qm(rows, cols, E);
    std::vector<int> topi((size_t)ns);
    for (int s = 0; s < ns; s++) topi[(size_t)s] = (int)((s * 7 + 3) % E);
    const std::vector<float> x = rand_vec((int64_t)ns * cols, 2.0f);
    std::vector<float> y((size_t)(ns * rows), NAN);
    const std::vector<double> ref = slots_ref(m, topi, x, cols);
    gemv_job j = slots_job(m, y);
    const bool ok0 = gemv_launch(0, false, j, XM_PLAIN, x.data(), cols, 0, topi.data(), 1, ns, blocks) == cudaSuccess;
    const double e = ok0 ? rel_err(y, ref) : INFINITY;
    char line[160];
    snprintf(line, sizeof line, "experts: %d slots of %d x %lld x %lld (%d sets a block at most)", ns, E, (long long)rows,
             (long long)cols, j.upb);
    verdict(ok0 && e <= 2e-6, line, e);
}

// Expert mode with the router's top-k made by every block (job.tk_logits): the K slots take the
// top-K experts of E logits (a tie at the top: the lower id first), all of one input row; block
// (0,0) writes the ids and the renormalised weights.
static void topk_case(int E, int K, int64_t rows, int64_t cols, int blocks) {
    const qm m = make_qm(rows, cols, E);
    const std::vector<float> x = rand_vec(cols, 2.0f);
    std::vector<float> lg = rand_vec(E, 3.0f);
    std::vector<int> ids((size_t)E);
    auto rank = [&] { // by logit, ties by the lower id (the CPU reference's order)
        for (int e = 0; e < E; e++) ids[(size_t)e] = e;
        std::sort(ids.begin(), ids.end(), [&](int a, int b) { return lg[(size_t)a] > lg[(size_t)b] || (lg[(size_t)a] == lg[(size_t)b] && a < b); });
    };
    rank();
    lg[(size_t)ids[1]] = lg[(size_t)ids[0]]; // a tie at the top
    rank();
    double mx = -1e300, tot = 0.0;
    for (float v : lg) mx = std::max(mx, (double)v);
    for (int k = 0; k < K; k++) tot += exp((double)lg[(size_t)ids[(size_t)k]] - mx);
    std::vector<float> y((size_t)(K * rows), NAN), tw((size_t)K, NAN);
    std::vector<int> ti((size_t)K, -1), decoy((size_t)K, 0); // the kernel must not read the decoy ids
    const std::vector<double> ref = slots_ref(m, std::vector<int>(ids.begin(), ids.begin() + K), x, 0);
    gemv_job j = slots_job(m, y);
    j.tk_logits = lg.data(), j.tk_E = E, j.tk_K = K, j.tk_norm = 1, j.tk_topi = ti.data(), j.tk_topw = tw.data();
    const bool ok0 = gemv_launch(0, false, j, XM_PLAIN, x.data(), cols, 0, decoy.data(), K, K, blocks) == cudaSuccess;
    double we = 0.0;
    bool same = ok0;
    for (int k = 0; k < K; k++) {
        same = same && ti[(size_t)k] == ids[(size_t)k];
        const double w = exp((double)lg[(size_t)ids[(size_t)k]] - mx) / tot;
        we = std::max(we, fabs((double)tw[(size_t)k] - w) / w);
    }
    const double e = ok0 ? rel_err(y, ref) : INFINITY;
    char line[160];
    snprintf(line, sizeof line, "top-%d of %d in the kernel, %lld x %lld (ids %s, weights %.1e)", K, E, (long long)rows,
             (long long)cols, same ? "the same" : "DIFFER", we);
    verdict(same && we <= 1e-6 && e <= 2e-6, line, e);
}

int main() {
    printf("k_gemv on the emulator, %d threads a block\n", GEMV_THREADS);
    const qm a = make_qm(256, 2048, 1); // 16 sets of one row block (NS 8): 8 a block at 2 blocks, stages wrap twice
    const qm b = make_qm(40, 512, 1);   // NS 2: sets of four row blocks, the last one partial
    const qm c = make_qm(48, 4096, 1);  // out_proj's width: two stages
    const q8 r8 = make_q8(37, 2048);    // the router's kind: row_dot, a row a warp
    plain_case("plain 256 x 2048, 2 blocks", {&a}, nullptr, XM_PLAIN, false, 2);
    plain_case("rmsnorm + gain, accumulated, 256 x 2048, 4 blocks", {&a}, nullptr, XM_NORM, true, 4);
    plain_case("swiglu 256 x 2048, 3 blocks", {&a}, nullptr, XM_SWIGLU, false, 3);
    plain_case("plain 40 x 512, 1 block", {&b}, nullptr, XM_PLAIN, false, 1);
    plain_case("rmsnorm, accumulated, 48 x 4096, 2 blocks", {&c}, nullptr, XM_NORM, true, 2);
    plain_case("rmsnorm: 4-bit 256 x 2048 and 8-bit 37 x 2048 in one launch", {&a}, &r8, XM_NORM, false, 6);
    plain_case("plain, one set a block", {&a}, nullptr, XM_PLAIN, false, 0);
    stage_bytes_case(2048);
    stage_bytes_case(320); // a block's last round partly out
    expert_case(64, 2048, 5, 3, 2);
    topk_case(16, 4, 32, 2048, 2);
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
