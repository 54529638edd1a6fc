// test_gdn_chunk_emu.cc — the chunked GDN prefill (src/backend/cuda/cuda_gdn_chunk.cuh:
// gdn_chunk_launch, k_gdn_chunk_a, k_gdn_chunk_b) run by the CUDA emulator on the CPU,
// against the serial gated delta rule in double. Checks the kernels' logic (indexing,
// masks, the solve, every lane's fragments of the tensor-core products, barriers,
// the state carried between calls) where CI has no GPU; test_gdn --chunk checks the
// same kernels on the device. Build (tests/run.sh does):
//   g++ -std=c++20 -O1 -g -pthread -DLILAC_CUEMU -Itests/cuda/emu -Isrc -x c++
//       tests/cuda/emu/test_gdn_chunk_emu.cc -lm -o build/test_gdn_chunk_emu
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "cuda_runtime.h"
#include "backend/cuda/cuda_gdn_chunk.cuh"

// Two geometries: two v-heads a q/k head (as the model: phase A's blocks serve two heads) and one.
static const int DK = 128;
static int Hk = 2, Hv = 4;
static int64_t KD, VD, CD;
static void set_geo(int hk, int hv) { Hk = hk, Hv = hv, KD = (int64_t)Hk * DK, VD = (int64_t)Hv * DK, CD = 2 * KD + VD; }

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static double urand() { // in [0, 1)
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) * (1.0 / 9007199254740992.0);
}
static double nrand() { return sqrt(-2.0 * log(1.0 - urand())) * cos(6.283185307179586 * urand()); }

// One segment's inputs as k_gdn_prep leaves them: q, k L2-normalised (q also / sqrt(dk)),
// v, beta, the log decays (head 3 decays hard: softplus past its linear threshold).
struct seg_in {
    int T;
    std::vector<float> conv, beta, lgd;
};
static seg_in make_seg(int T) {
    seg_in s{T, std::vector<float>((size_t)T * CD), std::vector<float>((size_t)T * Hv), std::vector<float>((size_t)T * Hv)};
    for (int t = 0; t < T; t++) {
        float *row = &s.conv[(size_t)t * CD];
        for (int64_t i = 0; i < CD; i++) row[i] = (float)nrand();
        for (int h = 0; h < 2 * Hk; h++) {
            double ss = 0;
            for (int i = 0; i < DK; i++) ss += (double)row[h * DK + i] * row[h * DK + i];
            const double sc = (h < Hk ? 1.0 / sqrt((double)DK) : 1.0) / sqrt(ss + 1e-6);
            for (int i = 0; i < DK; i++) row[h * DK + i] = (float)(row[h * DK + i] * sc);
        }
        for (int j = 0; j < Hv; j++) {
            s.beta[(size_t)t * Hv + j] = (float)urand();
            const double rate = j == 3 ? 20.0 + 300.0 * urand() : exp(-4.0 + 5.0 * urand());
            s.lgd[(size_t)t * Hv + j] = (float)(-rate * (j == 1 ? 0.01 : 1.0)); // head 1: long memory
        }
    }
    return s;
}

// The serial rule in double: S [Hv][DK][DK] (key row, value column), o [T][VD].
static void ref_segment(const seg_in &s, std::vector<double> &S, std::vector<double> &o) {
    o.assign((size_t)s.T * VD, 0.0);
    std::vector<double> r(DK), d(DK);
    for (int t = 0; t < s.T; t++) {
        const float *row = &s.conv[(size_t)t * CD];
        for (int j = 0; j < Hv; j++) {
            const int hk = j / (Hv / Hk);
            const float *q = row + hk * DK, *k = row + KD + hk * DK, *v = row + 2 * KD + j * DK;
            double *Sj = &S[(size_t)j * DK * DK];
            const double a = exp((double)s.lgd[(size_t)t * Hv + j]), b = s.beta[(size_t)t * Hv + j];
            for (int m = 0; m < DK; m++) {
                double acc = 0;
                for (int i = 0; i < DK; i++) acc += Sj[i * DK + m] * k[i];
                d[m] = b * (v[m] - a * acc);
            }
            for (int i = 0; i < DK; i++)
                for (int m = 0; m < DK; m++) Sj[i * DK + m] = a * Sj[i * DK + m] + k[i] * d[m];
            for (int m = 0; m < DK; m++) {
                double acc = 0;
                for (int i = 0; i < DK; i++) acc += Sj[i * DK + m] * q[i];
                o[(size_t)t * VD + j * DK + m] = acc;
            }
        }
    }
}

static double rel(const std::vector<float> &got, const std::vector<double> &ref) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!isfinite(got[i])) return INFINITY;
        md = fmax(md, fabs(got[i] - ref[i]));
        mr = fmax(mr, fabs(ref[i]));
    }
    return mr > 0 ? md / mr : md;
}

// Segments of the given lengths from one random state, the state carried through.
static bool run(const std::vector<int> &lens) {
    std::vector<double> S((size_t)Hv * DK * DK);
    for (auto &x : S) x = 2.0 * urand() - 1.0;
    std::vector<float> Sf(S.begin(), S.end());
    bool ok = true;
    printf("segments");
    for (int T : lens) printf(" %d", T);
    printf(":");
    for (int T : lens) {
        seg_in s = make_seg(T);
        std::vector<float> o((size_t)T * VD, NAN), scratch(gdn_chunk_scratch(T, Hv), NAN);
        const cudaError_t e = gdn_chunk_launch(s.conv.data(), CD, KD, Hk, Hv, s.beta.data(), s.lgd.data(), Sf.data(),
                                               o.data(), T, scratch.data(), 0);
        std::vector<double> ro;
        ref_segment(s, S, ro);
        const double eo = rel(o, ro), es = rel(Sf, S);
        printf("  T=%d o %.2e state %.2e", T, eo, es);
        ok = ok && e == cudaSuccess && eo <= 1e-4 && es <= 1e-4;
    }
    printf("  %s\n", ok ? "PASS" : "FAIL");
    return ok;
}

int main(void) {
    int pass = 0, fail = 0;
    const std::vector<std::vector<int>> cases = {{1}, {5}, {63}, {64}, {65}, {130}, {64, 1, 70}, {17, 100}};
    set_geo(2, 4);
    for (const auto &c : cases) (run(c) ? pass : fail)++;
    set_geo(2, 2);
    printf("Hk = Hv = 2:\n");
    for (const auto &c : {cases[2], cases[6]}) (run(c) ? pass : fail)++;
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}
