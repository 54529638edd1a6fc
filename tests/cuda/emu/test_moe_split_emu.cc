// test_moe_split_emu.cc — the decode MoE kernel (src/backend/cuda/cuda_moe_dec.cuh:
// k_moe_split: the router's top-k, the routed gate/up, SwiGLU and down projection, the
// shared expert, the fixed-point sums and the last unit's fold) run by the CUDA emulator
// on the CPU, against the same MoE in double from the same codes. Checks the kernel's
// logic where CI has no GPU: every lane's fragments of the integer MMAs (emu/mma.h
// stands in for mma.m16n8k32 s8 in the PTX fragment map), the packed layout as
// cuda_packed.cuh documents it (built here from the codes, independently of k_repack4),
// the staged int8 pieces, the top-k with ties, and the sums left at zero for the next
// launch. test_matmul checks the same kernel on the device. Build (tests/run.sh does):
//   g++ -std=c++20 -O1 -g -pthread -DLILAC_CUEMU -Itests/cuda/emu -Isrc -x c++
//       tests/cuda/emu/test_moe_split_emu.cc -lm -o build/test_moe_split_emu
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "cuda_runtime.h"
#include "emu_test.h"
#include "backend/cuda/cuda_moe_dec.cuh"


// A 4-bit affine matrix of n stacked experts (rows x cols, group 64): codes, bf16 scales and
// biases, and the packed layout of cuda_packed.cuh made from them.
struct qm {
    int64_t rows, cols, n, rb;
    std::vector<uint8_t> q;                 // [n][rows][cols] codes 0..15
    std::vector<__nv_bfloat16> s, b;        // [n][rows][cols / 64]
    std::vector<uint4> pk;                  // [n][rb][cols / 64][32 lanes]
    std::vector<uint32_t> psb;              // [n][rb][cols / 64][16 rows]
    std::vector<uint32_t> mq;               // the MLX codes' place (dmat_expert moves q/s/b too; zeros)
    double w(int64_t e, int64_t r, int64_t c) const {
        const size_t gi = (size_t)((e * rows + r) * (cols / 64) + c / 64);
        return (double)__bfloat162float(s[gi]) * q[(size_t)((e * rows + r) * cols + c)] + (double)__bfloat162float(b[gi]);
    }
    dmat view() const {
        dmat d = {};
        d.type = 0, d.bits = 4, d.group = 64, d.rows = rows, d.cols = cols, d.stride = rows, d.n_experts = (int)n;
        d.q = mq.data(), d.s = s.data(), d.b = b.data(), d.pk = pk.data(), d.psb = psb.data(), d.pk_rb = rb;
        return d;
    }
};
static qm make_qm(int64_t rows, int64_t cols, int64_t n) {
    qm m;
    m.rows = rows, m.cols = cols, m.n = n, m.rb = (rows + 15) / 16;
    const int64_t ng = cols / 64;
    m.q.resize((size_t)(n * rows * cols));
    for (auto &v : m.q) v = (uint8_t)(urand() * 16.0) & 15;
    m.s.resize((size_t)(n * rows * ng));
    m.b.resize(m.s.size());
    for (size_t i = 0; i < m.s.size(); i++) {
        const float sc = (float)(0.004 + 0.012 * urand());
        m.s[i] = __float2bfloat16_rn(sc);
        m.b[i] = __float2bfloat16_rn(-sc * (float)(6.0 + 4.0 * urand()));
    }
    m.mq.assign((size_t)(n * rows * cols / 8), 0u);
    m.pk.assign((size_t)(n * m.rb * ng * 32), uint4{0, 0, 0, 0});
    m.psb.assign((size_t)(n * m.rb * ng * 16), 0u);
    auto code = [&](int64_t e, int64_t r, int64_t c) -> uint32_t { return r < rows ? m.q[(size_t)((e * rows + r) * cols + c)] : 0u; };
    for (int64_t e = 0; e < n; e++)
        for (int64_t rb = 0; rb < m.rb; rb++)
            for (int64_t G = 0; G < ng; G++) {
                const size_t at = (size_t)((e * m.rb + rb) * ng + G);
                for (int lane = 0; lane < 32; lane++) {
                    const int g = lane >> 2, t = lane & 3;
                    const int64_t r0 = 16 * rb + g;
                    uint32_t wd[4];
                    for (int ks = 0; ks < 4; ks++) {
                        const int64_t c0 = 64 * G + 16 * ks + 2 * t;
                        // bits 4i (low code) and 16 + 4i (high code) of register a_i:
                        // a0 (r0, c0|c0+1), a1 (r0+8, c0|c0+1), a2 (r0, c0+8|c0+9), a3 (r0+8, c0+8|c0+9)
                        const int64_t rr[4] = {r0, r0 + 8, r0, r0 + 8}, cc[4] = {c0, c0, c0 + 8, c0 + 8};
                        uint32_t v = 0;
                        for (int i = 0; i < 4; i++) v |= code(e, rr[i], cc[i]) << (4 * i) | code(e, rr[i], cc[i] + 1) << (16 + 4 * i);
                        wd[ks] = v;
                    }
                    m.pk[at * 32 + (size_t)lane] = uint4{wd[0], wd[1], wd[2], wd[3]};
                }
                for (int r = 0; r < 16; r++) {
                    const int64_t row = 16 * rb + r;
                    if (row >= rows) continue;
                    const size_t gi = (size_t)((e * rows + row) * ng + G);
                    uint16_t sb, bb;
                    memcpy(&sb, &m.s[gi], 2);
                    memcpy(&bb, &m.b[gi], 2);
                    m.psb[at * 16 + (size_t)r] = (uint32_t)sb | (uint32_t)bb << 16;
                }
            }
    return m;
}

static double silu(double v) { return v / (1.0 + exp(-v)); }

// One token's MoE in double: x0 + Σ_k topw_k Wd[e_k] (silu(Wg[e_k] xn) * (Wu[e_k] xn)) + σ(sg) Ws swiglu(shgu).
static std::vector<double> reference(const qm &gt, const qm &up, const qm &dn, const qm &sh, const std::vector<float> &xn,
                                     const std::vector<float> &lg, const std::vector<float> &shgu, float sg, int K, int norm,
                                     const std::vector<float> &x0) {
    const int64_t H = dn.rows, I = gt.rows, SI = sh.cols;
    const int E = (int)lg.size();
    std::vector<int> ids((size_t)E);
    for (int e = 0; e < E; e++) ids[(size_t)e] = e;
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return lg[(size_t)a] > lg[(size_t)b]; });
    double mx = -1e300, z = 0.0, tot = 0.0;
    for (float v : lg) mx = std::max(mx, (double)v);
    for (float v : lg) z += exp((double)v - mx);
    std::vector<double> w((size_t)K);
    for (int k = 0; k < K; k++) tot += w[(size_t)k] = exp((double)lg[(size_t)ids[(size_t)k]] - mx) / z;
    if (norm)
        for (auto &v : w) v /= tot;
    std::vector<double> y(x0.begin(), x0.end());
    for (int k = 0; k < K; k++) {
        const int e = ids[(size_t)k];
        for (int64_t j = 0; j < I; j++) {
            double ga = 0.0, u = 0.0;
            for (int64_t c = 0; c < H; c++) ga += gt.w(e, j, c) * xn[(size_t)c], u += up.w(e, j, c) * xn[(size_t)c];
            const double h = w[(size_t)k] * silu(ga) * u;
            for (int64_t r = 0; r < H; r++) y[(size_t)r] += dn.w(e, r, j) * h;
        }
    }
    const double gs = 1.0 / (1.0 + exp(-(double)sg));
    for (int64_t j = 0; j < SI; j++) {
        const double h = gs * silu(shgu[(size_t)j]) * shgu[(size_t)(SI + j)];
        for (int64_t r = 0; r < H; r++) y[(size_t)r] += sh.w(0, r, j) * h;
    }
    return y;
}

static void run_case(int64_t H, int64_t I, int K, int E, int norm, bool tie) {
    const qm gt = make_qm(I, H, E), up = make_qm(I, H, E), dn = make_qm(H, I, E), sh = make_qm(H, I, 1);
    const int64_t SI = I;
    std::vector<float> xn((size_t)H), lg((size_t)E), shgu((size_t)(2 * SI)), x((size_t)H);
    for (auto &v : xn) v = sym(2.0f);
    for (auto &v : lg) v = sym(3.0f);
    for (auto &v : shgu) v = sym(2.0f);
    for (auto &v : x) v = sym(1.0f);
    if (tie && E > 5) lg[3] = lg[5] = 9.0f, lg[1] = 8.5f, lg[E - 1] = 8.5f; // ties at the top and at rank 2: lowest id first
    const float sg = -0.4f;
    const int nsg = moe_split_nsg(sh.view(), H, I, K, 132);
    if (!nsg) {
        printf("FAIL moe_split H=%lld I=%lld: refused\n", (long long)H, (long long)I);
        fails++;
        return;
    }
    const unsigned grid = (unsigned)moe_split_grid(K, I, SI, nsg);
    std::vector<unsigned long long> acc((size_t)H, 0ull);
    unsigned count = 0;
    std::vector<double> ref = reference(gt, up, dn, sh, xn, lg, shgu, sg, K, norm, x);
    // twice: the second launch starts from the first one's x and needs the sums and the count left at zero
    std::vector<float> xr(ref.begin(), ref.end());
    ref = reference(gt, up, dn, sh, xn, lg, shgu, sg, K, norm, xr);
    const dmat Wg = gt.view(), Wu = up.view(), Wd = dn.view(), Ws = sh.view();
    const float *xn_p = xn.data(), *lg_p = lg.data(), *sh_p = shgu.data(), *sg_p = &sg;
    float *x_p = x.data();
    unsigned long long *acc_p = acc.data(), *prof = nullptr;
    unsigned *cnt_p = &count;
    int64_t Hv = H, Iv = I, SIv = SI;
    int Ev = E, nv = norm, Kv = K;
    void *args[] = {(void *)&Wg, (void *)&Wu, (void *)&Wd, (void *)&Ws, &xn_p, &Hv, &lg_p, &Ev, &nv, &sh_p, &Iv, &SIv, &sg_p, &Kv,
                    &acc_p, &cnt_p, &x_p, &prof};
    for (int rep = 0; rep < 2; rep++) {
        if (nsg == 2) cudaLaunchKernel(k_moe_split<2>, dim3(grid), dim3(256), args, moe_split_smem(H, 2));
        else cudaLaunchKernel(k_moe_split<1>, dim3(grid), dim3(256), args, moe_split_smem(H, 1));
    }
    double md = 0.0, mr = 0.0;
    for (int64_t r = 0; r < H; r++) {
        md = std::max(md, fabs((double)x[(size_t)r] - ref[(size_t)r]));
        mr = std::max(mr, fabs(ref[(size_t)r] - (double)xr[(size_t)r]));
    }
    size_t left = 0;
    for (unsigned long long v : acc) left += v != 0;
    const double rel = md / mr;
    // int8 pieces resolve xn and h to 2^-21 of their groups' largest; the sums are exact to 2^-32
    const bool ok = rel < 2e-5 && left == 0 && count == 0;
    printf("%s moe_split H=%5lld I=%4lld K=%d of %3d experts, norm %d%s, grid %u (shared groups a unit %d): "
           "max|x - ref| / max|ref step| %.2e after two launches, sums left %zu, count %u\n",
           ok ? "PASS" : "FAIL", (long long)H, (long long)I, K, E, norm, tie ? ", ties" : "", grid, nsg, rel, left, count);
    ok ? passes++ : fails++;
}

int main() {
    run_case(2048, 512, 8, 12, 1, true);  // the model's shape (12 experts, not 256: memory): 128 routed + 4 shared units
    run_case(2048, 512, 8, 10, 0, false);
    run_case(256, 1024, 3, 16, 1, true);  // 16 down groups; the shared expert two groups a unit
    run_case(128, 64, 2, 4, 1, false);    // two input groups; 4 routed units, one shared
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
