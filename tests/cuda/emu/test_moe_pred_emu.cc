// test_moe_pred_emu.cc — the decode MoE's expert prediction (src/backend/cuda/cuda_moe_pred.cuh:
// k_pred_c, the composite C = Wr diag(g) Wo made at load, and k_moe_predict, which orders the
// experts from the residual before the mixer output and the mixer output alone) run by the CUDA
// emulator on the CPU, against the router's logits in double on the residual after the output
// projection, as the model computes them. Checks C, the predicted logits (up to C's bf16
// rounding), the predicted top-k, the L2 prefetches it asks for (exactly the predicted experts'
// packed codes and scale/bias pairs, in aligned pieces), the ids it leaves for the statistics,
// and the arrival count left at zero. Build (tests/run.sh does):
//   g++ -std=c++20 -O1 -g -pthread -DLILAC_CUEMU -Itests/cuda/emu -Isrc -x c++
//       tests/cuda/emu/test_moe_pred_emu.cc -lm -o build/test_moe_pred_emu
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <utility>
#include <vector>

#define EMU_SEED 0x5DEECE66D1234567ull
#include "cuda_runtime.h"
#include "emu_test.h"
#include "backend/cuda/cuda_moe_pred.cuh"
#include "emu_packed.h"

// A matrix in the checkpoint's layout: MLX affine (bits 4 or 8, group 64: codes packed
// 32/bits to a u32 word from bit 0, bf16 scale and bias per group) or bf16 (bits 16).
struct cm {
    int64_t rows, cols;
    int bits;
    std::vector<uint32_t> q;
    std::vector<__nv_bfloat16> s, b, w;
    std::vector<double> val; // the value of each element, as the model reads it
    dmat view() const {
        dmat d = {};
        d.type = bits == 16 ? 1 : 0, d.bits = bits, d.group = 64, d.rows = rows, d.cols = cols, d.stride = rows;
        d.n_experts = 1;
        if (bits == 16) d.w = w.data();
        else d.q = q.data(), d.s = s.data(), d.b = b.data();
        return d;
    }
};
static cm make_cm(int64_t rows, int64_t cols, int bits) {
    cm m;
    m.rows = rows, m.cols = cols, m.bits = bits;
    m.val.resize((size_t)(rows * cols));
    if (bits == 16) {
        m.w.resize(m.val.size());
        for (size_t i = 0; i < m.w.size(); i++) {
            m.w[i] = __float2bfloat16_rn(sym(0.08f));
            m.val[i] = __bfloat162float(m.w[i]);
        }
        return m;
    }
    const int per = 32 / bits;
    const int64_t ng = cols / 64;
    m.q.assign((size_t)(rows * cols / per), 0u);
    m.s.resize((size_t)(rows * ng));
    m.b.resize(m.s.size());
    for (size_t i = 0; i < m.s.size(); i++) {
        const float sc = (float)((0.002 + 0.01 * urand()) * (bits == 4 ? 1.0 : 1.0 / 16.0));
        m.s[i] = __float2bfloat16_rn(sc);
        m.b[i] = __float2bfloat16_rn(-sc * (float)((1 << bits) / 2) * (float)(0.8 + 0.4 * urand()));
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const uint32_t code = (uint32_t)(urand() * (1 << bits)) & ((1u << bits) - 1u);
            m.q[(size_t)((r * cols + c) / per)] |= code << (bits * (int)(c % per));
            const size_t gi = (size_t)(r * ng + c / 64);
            m.val[(size_t)(r * cols + c)] = (double)__bfloat162float(m.s[gi]) * code + (double)__bfloat162float(m.b[gi]);
        }
    return m;
}

static void run_case(int64_t E, int64_t H, int64_t O, int K, int rbits, int obits) {
    const cm Wr = make_cm(E, H, rbits), Wo = make_cm(H, O, obits);
    const int64_t I = 64;
    const qm gt = make_qm(I, H, E), up = make_qm(I, H, E), dn = make_qm(H, I, E);
    std::vector<float> g((size_t)H);
    for (auto &v : g) v = 0.5f + (float)urand();
    // C = Wr diag(g) Wo
    std::vector<__nv_bfloat16> C((size_t)(E * O));
    {
        dmat r = Wr.view(), o = Wo.view();
        const float *gp = g.data();
        __nv_bfloat16 *cp = C.data();
        void *args[] = {&r, &gp, &o, &cp};
        cudaLaunchKernel(k_pred_c, dim3((unsigned)((O + PC_C - 1) / PC_C), (unsigned)((E + PC_R - 1) / PC_R)), dim3(256), args, 0);
    }
    double cmax = 0.0, cerr = 0.0;
    for (int64_t e = 0; e < E; e++)
        for (int64_t c = 0; c < O; c++) {
            double ref = 0.0;
            for (int64_t h = 0; h < H; h++) ref += Wr.val[(size_t)(e * H + h)] * g[(size_t)h] * Wo.val[(size_t)(h * O + c)];
            cmax = std::max(cmax, fabs(ref));
            cerr = std::max(cerr, fabs(ref - (double)__bfloat162float(C[(size_t)(e * O + c)])));
        }
    const bool c_ok = cerr / cmax < 4e-3; // bf16: 2^-9 of each element
    dmat Cv = {};
    Cv.type = 1, Cv.bits = 16, Cv.group = 64, Cv.rows = E, Cv.cols = O, Cv.stride = E, Cv.n_experts = 1, Cv.w = C.data();

    std::vector<float> lp((size_t)E);
    std::vector<int> stat((size_t)K + 2, -1);
    unsigned count = 0;
    bool all_ok = c_ok;
    double worst = 0.0;
    for (int rep = 0; rep < 2; rep++) { // twice: the second launch needs the count left at zero
        std::vector<float> x((size_t)H), o((size_t)O);
        for (auto &v : x) v = sym(1.5f);
        for (auto &v : o) v = sym(1.0f);
        // the router's logits as the model makes them, up to the RMS: Wr (g ⊙ (x + Wo o))
        std::vector<double> xn((size_t)H), ref((size_t)E);
        for (int64_t h = 0; h < H; h++) {
            double a = x[(size_t)h];
            for (int64_t c = 0; c < O; c++) a += Wo.val[(size_t)(h * O + c)] * o[(size_t)c];
            xn[(size_t)h] = a * g[(size_t)h];
        }
        double lmax = 0.0;
        for (int64_t e = 0; e < E; e++) {
            double a = 0.0;
            for (int64_t h = 0; h < H; h++) a += Wr.val[(size_t)(e * H + h)] * xn[(size_t)h];
            ref[(size_t)e] = a;
            lmax = std::max(lmax, fabs(a));
        }
        moe_pred_args a = {};
        a.Wr = Wr.view(), a.C = Cv, a.g = g.data(), a.x = x.data(), a.o = o.data(), a.lp = lp.data(), a.count = &count;
        int pids[MOE_KMAX] = {-1, -1, -1, -1, -1, -1, -1, -1};
        a.K = K, a.ids = pids, a.Wg = gt.view(), a.Wu = up.view(), a.Wd = dn.view(), a.stat = stat.data();
        std::vector<std::pair<uintptr_t, uint32_t>> pf;
        cuemu_prefetched = &pf;
        void *args[] = {&a};
        cudaLaunchKernel(k_moe_predict, dim3((unsigned)((E + MOE_PRED_ROWS - 1) / MOE_PRED_ROWS)), dim3(256), args,
                         moe_pred_smem(H, O));
        // (both ways of asking: bulk prefetches on even launches, line by line on odd ones)
        cudaLaunchKernel(rep % 2 ? k_moe_fetch<true> : k_moe_fetch<false>, dim3(MOE_FETCH_BLOCKS), dim3(32), args, 0);
        cuemu_prefetched = nullptr;
        double lerr = 0.0;
        for (int64_t e = 0; e < E; e++) lerr = std::max(lerr, fabs((double)lp[(size_t)e] - ref[(size_t)e]));
        worst = std::max(worst, lerr / lmax);
        const bool l_ok = lerr / lmax < 1e-2;
        // the predicted ids: the reference's top-k, up to orders within the logits' error
        std::vector<int> ids((size_t)E);
        for (int e = 0; e < E; e++) ids[(size_t)e] = e;
        std::stable_sort(ids.begin(), ids.end(), [&](int p, int q) { return ref[(size_t)p] > ref[(size_t)q]; });
        bool ids_ok = true;
        for (int k = 0; k < K; k++) {
            ids_ok = ids_ok && pids[k] == stat[(size_t)k];
            const int got = stat[(size_t)k];
            const int64_t at = std::find(ids.begin(), ids.end(), got) - ids.begin();
            if (at >= E || (at >= K && ref[(size_t)ids[(size_t)K - 1]] - ref[(size_t)got] > 2 * lerr)) ids_ok = false;
            for (int j = 0; j < k; j++) ids_ok = ids_ok && stat[(size_t)j] != got;
        }
        // the prefetches: 16-byte aligned pieces of at most MOE_PRED_PIECE that cover exactly the
        // predicted experts' gate, up and down codes and scale/bias pairs
        std::vector<std::pair<uintptr_t, uintptr_t>> want, have;
        for (int k = 0; k < K && ids_ok; k++)
            for (const qm *m : {&gt, &up, &dn}) {
                const dmat W = dmat_expert(m->view(), stat[(size_t)k]);
                const uintptr_t n = (uintptr_t)(W.pk_rb * (W.cols / 64));
                want.push_back({(uintptr_t)W.pk, (uintptr_t)W.pk + 512 * n});
                want.push_back({(uintptr_t)W.psb, (uintptr_t)W.psb + 64 * n});
            }
        bool pf_ok = ids_ok;
        for (auto &p : pf) {
            pf_ok = pf_ok && p.first % 16 == 0 && p.second % 16 == 0 && p.second > 0 && p.second <= MOE_PRED_PIECE;
            have.push_back({p.first, p.first + p.second});
        }
        auto merge = [](std::vector<std::pair<uintptr_t, uintptr_t>> v) {
            std::sort(v.begin(), v.end());
            std::vector<std::pair<uintptr_t, uintptr_t>> m;
            for (auto &r : v)
                if (!m.empty() && r.first <= m.back().second) m.back().second = std::max(m.back().second, r.second);
                else m.push_back(r);
            return m;
        };
        pf_ok = pf_ok && merge(want) == merge(have) && have.size() >= want.size();
        const bool ok = l_ok && ids_ok && pf_ok && count == 0;
        all_ok = all_ok && ok;
        if (!ok)
            printf("  launch %d: logits err %.2e of max|l| %s, ids %s, prefetches %zu %s, count %u\n", rep, lerr / lmax,
                   l_ok ? "ok" : "BAD", ids_ok ? "ok" : "BAD", pf.size(), pf_ok ? "ok" : "BAD", count);
    }
    printf("%s moe_pred E=%lld H=%lld O=%lld K=%d router %d-bit, out_proj %d-bit: C err %.2e of max|C|, "
           "logits err %.2e of max|l|\n",
           all_ok ? "PASS" : "FAIL", (long long)E, (long long)H, (long long)O, K, rbits, obits, cerr / cmax, worst);
    all_ok ? passes++ : fails++;
}

int main() {
    run_case(64, 256, 512, 8, 8, 4);   // the model's formats: an 8-bit router, a 4-bit out_proj (smaller)
    run_case(40, 128, 256, 3, 16, 16); // a bf16 checkpoint; rows that do not fill the last tile or block
    run_case(256, 128, 128, 8, 8, 4);  // 256 experts: topk_warp's widest
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
