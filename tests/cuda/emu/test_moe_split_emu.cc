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
#include "emu_packed.h"


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
        if (nsg == 2) cudaLaunchKernel(k_moe_split<2>, dim3(grid), dim3(MOE_SPLIT_THREADS), args, moe_split_smem(H, 2));
        else cudaLaunchKernel(k_moe_split<1>, dim3(grid), dim3(MOE_SPLIT_THREADS), args, moe_split_smem(H, 1));
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
