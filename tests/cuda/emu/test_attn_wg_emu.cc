// test_attn_wg_emu.cc — the prefill attention on wgmma (src/backend/cuda/cuda_attn_wg.cuh:
// k_attn_wg) run by the CUDA emulator on the CPU, against causal gated attention in double.
// Checks the kernel's logic where CI has no GPU: the swizzled Q/K/V tiles and the two kinds of
// descriptors that read them (K-major for Q and K, MN-major for V), the S accumulator reused as
// P's A fragments, the causal mask and its diagonal tiles, the online softmax across tiles, the two
// warpgroups' turns over the key tiles and the merge of their partial results (also when one has none), GQA,
// partial query tiles, and that nothing past the chunk's last key is read (those cache rows are
// NaN) while every output is written (the output starts as NaN). tests/cuda/test_attn.cu checks
// the same kernel on the device. Build (tests/run.sh does):
//   g++ -std=c++20 -O1 -g -pthread -DLILAC_CUEMU -Itests/cuda/emu -Isrc -x c++
//       tests/cuda/emu/test_attn_wg_emu.cc -lm -o build/test_attn_wg_emu
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "cuda_runtime.h"
#define EMU_SEED 0x2545F4914F6CDD1Dull
#include "emu_test.h"
#include "backend/cuda/cuda_attn_wg.cuh"

static float bf16_round(float f) { // nearest even (finite values)
    uint32_t u = __float_as_uint(f);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    return __uint_as_float(u);
}


// nh query heads over nkv KV heads, T queries at position pos; qp pieces of Q and P.
static void run_case(int nh, int nkv, int T, int pos, int qp) {
    const int HD = attn_wg::HD;
    const int rows = pos + T + 9; // 9 poisoned rows past the valid ones
    std::vector<float> qg((size_t)T * nh * 2 * HD), out((size_t)T * nh * HD, NAN);
    std::vector<__nv_bfloat16> kc((size_t)rows * nkv * HD), vc(kc.size());
    std::vector<float> kf(kc.size()), vf(kc.size());
    for (size_t i = 0; i < qg.size(); i++) qg[i] = (i % (2 * HD)) < (size_t)HD ? sym(3.0f) : sym(4.0f);
    for (size_t i = 0; i < kc.size(); i++) {
        const bool valid = i / ((size_t)nkv * HD) < (size_t)(pos + T);
        kf[i] = valid ? bf16_round(sym(1.5f)) : NAN;
        vf[i] = valid ? bf16_round(sym(1.0f)) : NAN;
        kc[i].x = (unsigned short)(__float_as_uint(kf[i]) >> 16);
        vc[i].x = (unsigned short)(__float_as_uint(vf[i]) >> 16);
    }
    int dpos = pos;
    const float *q_p = qg.data();
    const __nv_bfloat16 *k_p = kc.data(), *v_p = vc.data();
    const int *pos_p = &dpos;
    float *o_p = out.data();
    void *args[] = {&q_p, &k_p, &v_p, &pos_p, &T, &nh, &nkv, &o_p};
    const dim3 g((unsigned)(((T + attn_wg::BM - 1) / attn_wg::BM) * nh));
    if (qp == 2) cudaLaunchKernel(k_attn_wg<2>, g, dim3(attn_wg::NT), args, attn_wg::smem(2));
    else cudaLaunchKernel(k_attn_wg<1>, g, dim3(attn_wg::NT), args, attn_wg::smem(1));

    // the reference: the queries the kernel multiplies (with one piece, bf16 of the log2-domain q)
    const float qs = lilac_fa::q_scale(HD);
    double err = 0.0, big = 0.0;
    std::vector<double> sc((size_t)(pos + T));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const int kh = h / (nh / nkv);
            const float *q = &qg[((size_t)t * nh + h) * 2 * HD];
            double mx = -INFINITY;
            for (int j = 0; j <= pos + t; j++) {
                double a = 0.0;
                for (int d = 0; d < HD; d++) {
                    const double qd = qp == 1 ? (double)bf16_round(q[d] * qs) : (double)q[d] * qs;
                    a += qd * kf[((size_t)j * nkv + kh) * HD + d];
                }
                sc[(size_t)j] = a; // log2 domain
                mx = std::max(mx, a);
            }
            double sum = 0.0;
            for (int j = 0; j <= pos + t; j++) sum += (sc[(size_t)j] = exp2(sc[(size_t)j] - mx));
            for (int d = 0; d < HD; d++) {
                double a = 0.0;
                for (int j = 0; j <= pos + t; j++) a += sc[(size_t)j] * vf[((size_t)j * nkv + kh) * HD + d];
                const double r = a / sum / (1.0 + exp(-(double)q[HD + d]));
                const float gv = out[((size_t)t * nh + h) * HD + d];
                err = std::isfinite(gv) ? std::max(err, fabs(gv - r)) : INFINITY;
                big = std::max(big, fabs(r));
            }
        }
    const double rel = err / big, bar = qp == 1 ? 4e-3 : 1e-4; // the bars of test_attn (see there)
    const bool ok = rel <= bar;
    printf("  nh=%2d nkv=%d T=%3d pos=%3d  %s  max|err|/max|ref| = %.2e  %s\n", nh, nkv, T, pos,
           qp == 2 ? "two pieces" : "one piece ", rel, ok ? "PASS" : "FAIL");
    (ok ? passes : fails)++;
}

int main(void) {
    printf("k_attn_wg under the CUDA emulator\n");
    for (int qp : {2, 1}) {
        run_case(4, 2, 70, 30, qp); // a full and a partial query tile; diagonal tiles at an odd offset
        run_case(2, 2, 64, 0, qp);  // one full tile, no GQA, the diagonal at the tile edge
        run_case(2, 1, 5, 150, qp); // few queries after a long past: three key tiles, the last partial
        run_case(2, 1, 20, 300, qp); // six key tiles: three turns of each warpgroup
    }
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
