// test_attn_dec_emu.cc — the decode attention on the tensor cores (src/backend/cuda/cuda_attn_dec.cuh:
// k_attn_dec_mma) run by the CUDA emulator on the CPU, against one token's attention in double.
// Checks the kernel's logic where CI has no GPU: the fragment maps of its three matrix moves (K as
// ldmatrix's A, V^T by ldmatrix.trans, P^T by movmatrix.trans) and of the MMA, the swizzled tiles, the
// query heads' norm and RoPE, key p's row (made, stored to the cache, scored from shared memory), the
// masks of partial tiles and empty splits, the online softmax across tiles and buffers, GQA groups
// under 8 (padded heads), the warps' merge and the partials' layout. Cache rows past p are NaN (never
// read) and the partials start as NaN (every one written). tests/cuda/test_attn.cu checks the same
// kernel on the device. Build (tests/run.sh does):
//   g++ -std=c++20 -O1 -g -pthread -DLILAC_CUEMU -Itests/cuda/emu -Isrc -x c++
//       tests/cuda/emu/test_attn_dec_emu.cc -lm -o build/test_attn_dec_emu
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "cuda_runtime.h"
#include "emu_test.h"
#include "backend/cuda/cuda_attn_dec.cuh"


// RMSNorm with gain g, then RoPE on the first rd dims (pairs i, i + rd/2), then times mul: in double.
static void norm_rope(const float *x, const float *gn, int hd, int rd, int64_t pos, const float *invf, double eps, double mul,
                      double *y) {
    double ss = 0.0;
    for (int i = 0; i < hd; i++) ss += (double)x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / hd + eps);
    std::vector<double> n((size_t)hd);
    for (int i = 0; i < hd; i++) n[(size_t)i] = x[i] * inv * gn[i];
    for (int i = 0; i < hd; i++) y[i] = n[(size_t)i] * mul;
    for (int i = 0; i < rd / 2; i++) {
        const double a = n[(size_t)i], b = n[(size_t)(i + rd / 2)], th = (double)pos * invf[i];
        y[i] = (a * cos(th) - b * sin(th)) * mul;
        y[i + rd / 2] = (b * cos(th) + a * sin(th)) * mul;
    }
}

// nh query heads over nkv KV heads of HD dims, the token at position pos, S splits.
template <int HD>
static void run_case(int nh, int nkv, int pos, int S) {
    const int G = nh / nkv, rd = HD / 4, kvw = nkv * HD;
    const float eps = 1e-6f;
    const int rows = pos + 1 + 9; // 9 poisoned rows past key p
    std::vector<float> qg((size_t)nh * 2 * HD), kx((size_t)kvw), vx((size_t)kvw), qn(HD), kn(HD), invf((size_t)rd / 2);
    std::vector<__nv_bfloat16> kc((size_t)rows * kvw), vc(kc.size());
    for (size_t i = 0; i < qg.size(); i++) qg[i] = sym(3.0f);
    for (size_t i = 0; i < kc.size(); i++) {
        const bool valid = i / (size_t)kvw < (size_t)pos; // row pos: written by the kernel
        kc[i] = __float2bfloat16_rn(valid ? sym(1.5f) : NAN);
        vc[i] = __float2bfloat16_rn(valid ? sym(1.0f) : NAN);
    }
    for (int i = 0; i < kvw; i++) kx[(size_t)i] = sym(2.0f), vx[(size_t)i] = sym(1.0f);
    for (int i = 0; i < HD; i++) qn[(size_t)i] = 1.0f + sym(0.5f), kn[(size_t)i] = 1.0f + sym(0.5f);
    for (int i = 0; i < rd / 2; i++) invf[(size_t)i] = (float)pow(1e7, -2.0 * i / rd);
    std::vector<float> part((size_t)nh * S * (HD + 2), NAN);
    int dpos = pos;
    const float *q_p = qg.data(), *kx_p = kx.data(), *vx_p = vx.data(), *qn_p = qn.data(), *kn_p = kn.data(), *if_p = invf.data();
    __nv_bfloat16 *k_p = kc.data(), *v_p = vc.data();
    const int *pos_p = &dpos;
    float *part_p = part.data();
    unsigned long long *prof = nullptr;
    float epsv = eps;
    int rdv = rd;
    void *args[] = {&q_p, &kx_p, &vx_p, &qn_p, &kn_p, &if_p, &rdv, &epsv, &k_p, &v_p, &pos_p, &nh, &nkv, &part_p, &S, &prof};
    cudaLaunchKernel(k_attn_dec_mma<HD>, dim3((unsigned)nkv, (unsigned)S), dim3(adec::NT), args, attn_dec_mma_smem(HD));

    // key p's row as the kernel stored it (the reference takes it as stored; checked against the double
    // norm + rope: within the bf16 rounding of the f32 arithmetic before it), and V's: bf16 of v, bit for bit
    bool row_ok = true;
    std::vector<double> y((size_t)HD);
    for (int h = 0; h < nkv; h++) {
        norm_rope(&kx[(size_t)h * HD], kn.data(), HD, rd, pos, invf.data(), eps, 1.0, y.data());
        for (int i = 0; i < HD; i++) {
            const float got = __bfloat162float(kc[(size_t)pos * kvw + (size_t)h * HD + (size_t)i]);
            if (!(fabs(got - y[(size_t)i]) <= fabs(y[(size_t)i]) * (1.0 / 256) + 1e-6)) row_ok = false;
            if (vc[(size_t)pos * kvw + (size_t)h * HD + (size_t)i].x != __float2bfloat16_rn(vx[(size_t)h * HD + (size_t)i]).x)
                row_ok = false;
        }
    }
    // the splits merged in double, against softmax(q k / sqrt(HD)) v in double
    double err = 0.0, mx = 0.0;
    size_t bad = 0;
    std::vector<double> q((size_t)HD), sc((size_t)pos + 1);
    for (int h = 0; h < nh; h++) {
        const int kh = h / G;
        norm_rope(&qg[(size_t)h * 2 * HD], qn.data(), HD, rd, pos, invf.data(), eps, 1.0 / sqrt((double)HD), q.data());
        double m = -INFINITY;
        for (int j = 0; j <= pos; j++) {
            double a = 0.0;
            for (int d = 0; d < HD; d++) a += q[(size_t)d] * __bfloat162float(kc[(size_t)j * kvw + (size_t)kh * HD + (size_t)d]);
            sc[(size_t)j] = a;
            m = fmax(m, a);
        }
        double l = 0.0;
        for (int j = 0; j <= pos; j++) l += exp(sc[(size_t)j] - m);
        double M = -INFINITY;
        for (int s = 0; s < S; s++) M = fmax(M, (double)part[((size_t)h * S + (size_t)s) * (HD + 2) + HD]);
        double L = 0.0;
        for (int s = 0; s < S; s++) {
            const float *pp = &part[((size_t)h * S + (size_t)s) * (HD + 2)];
            L += pp[HD] == -INFINITY ? 0.0 : pp[HD + 1] * exp(pp[HD] - M);
        }
        for (int d = 0; d < HD; d++) {
            double ref = 0.0, got = 0.0;
            for (int j = 0; j <= pos; j++)
                ref += exp(sc[(size_t)j] - m) * __bfloat162float(vc[(size_t)j * kvw + (size_t)kh * HD + (size_t)d]);
            ref /= l;
            for (int s = 0; s < S; s++) {
                const float *pp = &part[((size_t)h * S + (size_t)s) * (HD + 2)];
                if (pp[HD] != -INFINITY) got += pp[d] * exp(pp[HD] - M);
                else if (pp[d] != 0.0f || pp[HD + 1] != 0.0f) bad++; // an empty split: acc 0, sum 0
            }
            got /= L;
            if (!isfinite(got)) bad++;
            err = fmax(err, fabs(got - ref));
            mx = fmax(mx, fabs(ref));
        }
    }
    const double rel = err / mx;
    const bool ok = rel <= 2e-5 && bad == 0 && row_ok;
    printf("%s k_attn_dec_mma hd=%3d nh=%2d nkv=%d pos=%4d splits=%2d: max|err|/max|ref| = %.2e%s%s\n", ok ? "PASS" : "FAIL",
           HD, nh, nkv, pos, S, rel, bad ? ", UNWRITTEN or non-finite partials" : "", row_ok ? "" : ", key p's row WRONG");
    (ok ? passes : fails)++;
}

int main() {
    // hd 256, G = 8 (the model): empty splits and one partial tile each (64 splits), then 4 and 2 splits
    // with full, partial and several tiles (every buffer of the three reused)
    run_case<256>(16, 2, 0, 64);
    run_case<256>(16, 2, 70, 64);
    run_case<256>(16, 2, 17, 4);
    run_case<256>(16, 2, 300, 2);
    // hd 128: G = 6 (padded heads), G = 1, one split holding every key (and key p)
    run_case<128>(12, 2, 150, 2);
    run_case<128>(4, 4, 40, 3);
    run_case<128>(8, 2, 200, 1);
    printf("%s: %d passed, %d failed\n", fails ? "FAIL" : "PASS", passes, fails);
    return fails ? 1 : 0;
}
