// test_attn.cu — the tensor-core prefill attention (cuda_attn.cuh), the
// GQA-packed decode attention (k_attn_dec_mma + k_attn_combine) and the cache rows
// of k_attn_prep against a double-precision CPU reference, and their speed
// against k_attn on the real model's shape. Run on the device:
// build/cuda-tests/test_attn
//
// Every case gets fresh random inputs; the cache rows past pos + T are NaN (the
// kernel must not read them) and the output is poisoned with NaN before the launch
// (every element must be written). The cache is bf16, as the backend keeps it: the
// random K/V are rounded to bf16 (nearest even) and the reference reads those same
// values, so the bar measures the kernels' own arithmetic, not the cache's rounding
// (up to 2^-8 relative, which the model-level test_cuda covers): the prefill kernel's ~16-bit
// splits of Q and P (3-6e-6 emulated up to 4k keys, header of cuda_attn.cuh) and decode's f32
// (~2e-7 emulated) sit well inside max|err| / max|ref| <= 1e-4 (5e-4 past 32k keys, see
// run_case), the bars of the f32 cache, whose kernels measured the same orders.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda_test.h"
#include "backend/cuda/cuda_attn.cuh"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_gemm_tc.cuh"
#include "backend/cuda/cuda_gdn.cuh"
#include "backend/cuda/cuda_attn_split.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_argmax.cuh"

struct Case {
    int nh, nkv, hd, T, pos;
};

static double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Median milliseconds of 20 runs of fn (after 3 warm-ups), timed with events on stream st.
template <class F>
static double time_ms(cudaStream_t st, F fn) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < 3; i++) fn();
    for (int i = 0; i < 20; i++) {
        CK(cudaEventRecord(a, st));
        fn();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float t;
        CK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return median(ms);
}

// The cache's bf16 (round to nearest even; NaN stays NaN) of every x into b, and x
// replaced by that value: what the kernels read is what the reference reads.
static void to_cache(std::vector<float> &x, std::vector<__nv_bfloat16> &b) {
    b.resize(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        b[i] = __float2bfloat16_rn(x[i]);
        x[i] = __bfloat162float(b[i]);
    }
}

// out[t][h][:] in double, as k_attn: softmax over keys j <= pos + t, gated.
static void reference(const Case &c, const std::vector<float> &qg, const std::vector<float> &kc,
                      const std::vector<float> &vc, std::vector<double> &ref) {
    const int nh = c.nh, nkv = c.nkv, hd = c.hd, T = c.T, pos = c.pos;
    const double scale = 1.0 / sqrt((double)hd);
#pragma omp parallel
    {
        std::vector<double> s((size_t)pos + T), o((size_t)hd);
#pragma omp for schedule(dynamic, 4)
        for (int th = 0; th < T * nh; th++) {
            const int t = th / nh, h = th % nh, kh = h / (nh / nkv), n = pos + t + 1;
            const float *q = &qg[((size_t)t * nh + h) * 2 * hd];
            double mx = -INFINITY;
            for (int j = 0; j < n; j++) {
                const float *k = &kc[((size_t)j * nkv + kh) * hd];
                double d[4] = {0, 0, 0, 0};
                for (int i = 0; i < hd; i += 4)
                    for (int u = 0; u < 4; u++) d[u] += (double)q[i + u] * k[i + u];
                s[(size_t)j] = (d[0] + d[1] + d[2] + d[3]) * scale;
                mx = fmax(mx, s[(size_t)j]);
            }
            double l = 0;
            std::fill(o.begin(), o.end(), 0.0);
            for (int j = 0; j < n; j++) {
                const double p = exp(s[(size_t)j] - mx);
                l += p;
                const float *v = &vc[((size_t)j * nkv + kh) * hd];
                for (int i = 0; i < hd; i++) o[(size_t)i] += p * v[i];
            }
            for (int i = 0; i < hd; i++)
                ref[((size_t)t * nh + h) * hd + i] = o[(size_t)i] / l / (1.0 + exp(-(double)q[hd + i]));
        }
    }
}

// max|got - ref| / max|ref|; NaN (an element not written, or a bad value) -> inf.
static double rel_err(const std::vector<float> &got, const std::vector<double> &ref, size_t *n_nan) {
    double md = 0, mr = 0;
    *n_nan = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        mr = fmax(mr, fabs(ref[i]));
        if (!isfinite(got[i])) {
            (*n_nan)++;
            continue;
        }
        md = fmax(md, fabs((double)got[i] - ref[i]));
    }
    return *n_nan ? INFINITY : md / mr;
}

// qp: the kernel's pieces of Q and P (attn_prefill_launch's qp); wg: the wgmma kernel
// (k_attn_wg, hd 256) instead of k_attn_prefill. With one piece the
// reference takes the queries the kernel multiplies (bf16 of q times the kernel's f32
// log2-domain scale, mapped back to natural units), so that what remains is P's rounding.
static bool run_case(const Case &c, bool timed, int qp = 2, bool wg = false) {
    const int nh = c.nh, nkv = c.nkv, hd = c.hd, T = c.T, pos = c.pos;
    const size_t rows = (size_t)pos + T + 40; // 40 poisoned rows past the valid ones
    const size_t nq = (size_t)T * nh * 2 * hd, nkvel = rows * nkv * hd, no = (size_t)T * nh * hd;
    std::vector<float> qg(nq), kc(nkvel), vc(nkvel);
    for (size_t i = 0; i < nq; i++) {
        const size_t d = i % (2 * (size_t)hd);
        qg[i] = d < (size_t)hd ? rnd_sym(3.0f) : rnd_sym(4.0f); // query, gate
    }
    for (size_t i = 0; i < nkvel; i++) {
        const bool valid = i / ((size_t)nkv * hd) < (size_t)pos + T;
        kc[i] = valid ? rnd_sym(1.5f) : NAN;
        vc[i] = valid ? rnd_sym(1.0f) : NAN;
    }
    std::vector<__nv_bfloat16> kb, vb;
    to_cache(kc, kb);
    to_cache(vc, vb);
    float *dq, *dout;
    __nv_bfloat16 *dk, *dv;
    int *dpos;
    CK(cudaMalloc(&dq, nq * 4));
    CK(cudaMalloc(&dk, nkvel * 2));
    CK(cudaMalloc(&dv, nkvel * 2));
    CK(cudaMalloc(&dout, no * 4));
    CK(cudaMalloc(&dpos, sizeof(int)));
    CK(cudaMemcpy(dq, qg.data(), nq * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, kb.data(), nkvel * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, vb.data(), nkvel * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dpos, &pos, sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xFF, no * 4)); // NaN

    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaError_t e = attn_prefill_launch(dq, dk, dv, dpos, T, nh, nkv, hd, dout, st, qp, wg);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    bool ok = e == cudaSuccess;
    if (!ok) printf("  launch/run error: %s\n", cudaGetErrorString(e));
    std::vector<float> got(no);
    CK(cudaMemcpy(got.data(), dout, no * 4, cudaMemcpyDeviceToHost));
    std::vector<double> ref(no);
    if (qp == 1) {
        const float qs = lilac_fa::q_scale(hd); // as the kernel scales q
        const double back = log(2.0) * sqrt((double)hd);
        std::vector<float> qr(qg);
        for (size_t i = 0; i < nq; i++)
            if (i % (2 * (size_t)hd) < (size_t)hd) qr[i] = (float)((double)__bfloat162float(__float2bfloat16_rn(qg[i] * qs)) * back);
        reference(c, qr, kc, vc, ref);
    } else {
        reference(c, qg, kc, vc, ref);
    }
    size_t n_nan = 0;
    const double err = rel_err(got, ref, &n_nan);
    // Over tens of thousands of keys the f32 tensor-core accumulation of P.V runs
    // ~1,000 tile additions deep, and near-uniform attention over random keys shrinks
    // the output (max|ref|) ~1/sqrt(keys): measured 1.5e-4 at 40k keys (2e-5 at 4k).
    // Key-split partials (flash-decoding) would shorten the chains; until then the
    // bar past 32k keys is 5e-4, still 40x inside the model-level 2e-2.
    // One bf16 piece of P (qp 1, against the bf16-q reference): each weight but the row's
    // largest (exp2(0) = 1, exact) moves by up to 2^-9 relative, so the output by up to
    // 2^-9 max|v| (~2e-3 of max|ref| for the short rows): the bar is 4e-3.
    const double bar = qp == 1 ? 4e-3 : (size_t)pos + T > 32768 ? 5e-4 : 1e-4;
    ok = ok && err <= bar;
    printf("%s%s%s nh=%2d nkv=%d hd=%3d T=%4d pos=%5d  max|err|/max|ref| = %.3e", ok ? "PASS" : "FAIL",
           wg ? " wgmma" : "", qp == 1 ? " bf16 Q,P" : "", nh, nkv, hd, T, pos, err);
    if (n_nan) printf("  (%zu non-finite / unwritten elements)", n_nan);
    printf("\n");
    fflush(stdout);

    const double flops = 4.0 * T * (pos + (T + 1) / 2.0) * nh * hd;
    double tn = 0.0;
    if (timed && ok) {
        tn = time_ms(st, [&]() { CK(attn_prefill_launch(dq, dk, dv, dpos, T, nh, nkv, hd, dout, st, qp, wg)); });
        printf("  time %s%s  %8.3f ms  %7.2f TFLOP/s (useful f32-equivalent, median of 20)\n",
               wg ? "k_attn_wg" : "k_attn_prefill", qp == 1 ? " (bf16 Q,P)" : "", tn, flops / tn * 1e-9);
    }
    if (timed && ok && qp == 2 && !wg) { // the peer: k_attn, one split, on the same inputs
        float *dout2;
        CK(cudaMalloc(&dout2, no * 4));
        CK(cudaMemset(dout2, 0xFF, no * 4));
        const dim3 g((unsigned)nh, (unsigned)T, 1);
        auto peer = [&]() {
            switch (hd) {
            case 64: k_attn<2><<<g, 128, 0, st>>>(dq, dk, dv, dpos, nh, nkv, dout2, nullptr); break;
            case 128: k_attn<4><<<g, 128, 0, st>>>(dq, dk, dv, dpos, nh, nkv, dout2, nullptr); break;
            default: k_attn<8><<<g, 128, 0, st>>>(dq, dk, dv, dpos, nh, nkv, dout2, nullptr); break;
            }
            CK(cudaGetLastError());
        };
        const double tp = time_ms(st, peer);
        CK(cudaMemcpy(got.data(), dout2, no * 4, cudaMemcpyDeviceToHost));
        const double perr = rel_err(got, ref, &n_nan);
        printf("  time k_attn (peer) %8.3f ms  %7.2f TFLOP/s  (its max|err|/max|ref| = %.3e)  speed-up %.1fx\n", tp,
               flops / tp * 1e-9, perr, tp / tn);
        CK(cudaFree(dout2));
    }
    CK(cudaStreamDestroy(st));
    CK(cudaFree(dq));
    CK(cudaFree(dk));
    CK(cudaFree(dv));
    CK(cudaFree(dout));
    CK(cudaFree(dpos));
    return ok;
}

// RMSNorm (gain g) then NeoX RoPE on the first rd dims at position pos, in
// double, as the CPU reference's attention does to q and k (inv_freq in f32).
static void norm_rope_ref(const float *x, const std::vector<float> &g, int hd, int rd, int pos,
                          const std::vector<float> &inv_freq, double eps, double *y) {
    double ss = 0.0;
    for (int i = 0; i < hd; i++) ss += (double)x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / hd + eps);
    for (int i = 0; i < hd; i++) y[i] = x[i] * inv * g[(size_t)i];
    for (int i = 0; i < rd / 2; i++) {
        const double ang = (double)(float)((float)pos * inv_freq[(size_t)i]), a = y[i], b = y[i + rd / 2];
        y[i] = a * cos(ang) - b * sin(ang);
        y[i + rd / 2] = b * cos(ang) + a * sin(ang);
    }
}

// A cache row against its double value: the error beyond round-to-nearest (half a
// bf16 step at the double value), over max|ref|; NaN -> inf. The f32 arithmetic
// before the rounding adds ~1e-7 (bar: 2e-6); truncation instead of rounding shows
// as up to 2^-9 (~2e-3).
static double rne_err(const __nv_bfloat16 *got, const double *ref, size_t n, size_t *n_nan) {
    double err = 0, mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        const double k = __bfloat162float(got[i]);
        int e;
        frexp(ref[i], &e); // |x| in [2^(e-1), 2^e): bf16 steps of 2^(e-8)
        if (!isfinite(k)) (*n_nan)++;
        else err = fmax(err, (fabs(k - ref[i]) - ldexp(1.0, e - 9)) / mx);
    }
    return *n_nan ? INFINITY : err;
}
// Every got[i] the bf16 of x[i] (round to nearest even), bit for bit.
static bool is_rne(const __nv_bfloat16 *got, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const __nv_bfloat16 v = __float2bfloat16_rn(x[i]);
        if (memcmp(&got[i], &v, sizeof v)) return false;
    }
    return true;
}

// k_attn_prep (prefill and the decode fallback): T tokens at position pos; q normed
// and roped in place, and rows pos .. pos + T - 1 of the bf16 cache written (the rows
// around them start as NaN and must stay so).
static bool run_prep_case(const Case &c) {
    const int nh = c.nh, nkv = c.nkv, hd = c.hd, T = c.T, pos = c.pos, rd = hd / 4;
    const float eps = 1e-6f;
    const size_t nq = (size_t)T * nh * 2 * hd, kvw = (size_t)nkv * hd, rows = (size_t)pos + T + 1;
    std::vector<float> qg(nq), kx((size_t)T * kvw), vx((size_t)T * kvw), qn((size_t)hd), kn((size_t)hd), invf((size_t)rd / 2);
    for (size_t i = 0; i < nq; i++) qg[i] = rnd_sym(3.0f);
    for (size_t i = 0; i < kx.size(); i++) { kx[i] = rnd_sym(2.0f); vx[i] = rnd_sym(1.0f); }
    for (int i = 0; i < hd; i++) { qn[(size_t)i] = 1.0f + rnd_sym(0.5f); kn[(size_t)i] = 1.0f + rnd_sym(0.5f); }
    for (int i = 0; i < rd / 2; i++) invf[(size_t)i] = (float)pow(1e7, -2.0 * i / rd);
    dbuf<float> dq(nq), dkx(kx.size()), dvx(vx.size()), dqn((size_t)hd), dkn((size_t)hd), dinvf((size_t)rd / 2);
    dbuf<__nv_bfloat16> dk(rows * kvw), dv(rows * kvw);
    dbuf<int> dpos(1);
    dq.put(qg);
    dkx.put(kx);
    dvx.put(vx);
    dqn.put(qn);
    dkn.put(kn);
    dinvf.put(invf);
    dpos.put(&pos);
    dk.fill_bytes(0xff); // NaN
    dv.fill_bytes(0xff);
    k_attn_prep<<<dim3((unsigned)T, (unsigned)(nh + nkv)), 32>>>(dq.p, dkx.p, dvx.p, dqn.p, dkn.p, dk.p, dv.p, dpos.p, nh, nkv,
                                                                 hd, rd, dinvf.p, eps);
    CKL();
    const std::vector<float> q = dq.get();
    const std::vector<__nv_bfloat16> k = dk.get(), v = dv.get();
    std::vector<double> y((size_t)hd), qref(nq), kref((size_t)T * kvw);
    std::vector<float> qgot(nq);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            const size_t o = ((size_t)t * nh + h) * 2 * hd;
            norm_rope_ref(&qg[o], qn, hd, rd, pos + t, invf, eps, &qref[o]);
            for (int i = 0; i < hd; i++) qref[o + hd + i] = qg[o + hd + i]; // the gate half, untouched
        }
        for (int h = 0; h < nkv; h++) {
            const size_t o = (size_t)t * kvw + (size_t)h * hd;
            norm_rope_ref(&kx[o], kn, hd, rd, pos + t, invf, eps, &kref[o]);
        }
    }
    size_t n_nan = 0, k_nan = 0, poisoned = 0;
    const double qerr = rel_err(q, qref, &n_nan), kerr = rne_err(&k[(size_t)pos * kvw], kref.data(), (size_t)T * kvw, &k_nan);
    const bool vok = is_rne(&v[(size_t)pos * kvw], vx.data(), (size_t)T * kvw);
    for (size_t i = 0; i < rows * kvw; i++) // rows outside [pos, pos + T): not written
        if (i / kvw < (size_t)pos || i / kvw >= (size_t)pos + T)
            poisoned += !isnan(__bfloat162float(k[i])) + !isnan(__bfloat162float(v[i]));
    const bool ok = qerr <= 1e-5 && kerr <= 2e-6 && vok && !poisoned;
    printf("%s prep nh=%2d nkv=%d hd=%3d T=%2d pos=%5d  q max|err|/max|ref| = %.3e, K rows %.3e beyond rounding, V rows %s%s\n",
           ok ? "PASS" : "FAIL", nh, nkv, hd, T, pos, qerr, kerr, vok ? "exact" : "WRONG", poisoned ? ", rows outside WRITTEN" : "");
    return ok;
}

// Decode (one token at position pos): k_attn_dec_mma over S splits, merged by
// k_attn_combine, against the same reference; timed at the model's shape
// against k_attn + k_attn_combine (32 splits, one block per query head).
// k_attn_dec_mma also norms and ropes the token's raw q and k (rotary dims hd/4,
// theta 1e7, as the model) and writes its K/V row, which starts as NaN: the
// row is checked (K: each element the bf16 nearest the double norm + rope, up
// to the f32 arithmetic before the rounding; V: the bf16 of v, bit for bit),
// and the output through it (the reference takes the K row as stored: a value
// that rounded the other way near a midpoint moves the output by up to ~1e-4).
static bool run_dec_case(const Case &c, bool timed) {
    const int nh = c.nh, nkv = c.nkv, hd = c.hd, pos = c.pos, S = ADEC_S, rd = hd / 4;
    const float eps = 1e-6f;
    const size_t rows = (size_t)pos + 1 + 40; // poisoned rows past the valid ones
    const size_t nq = (size_t)nh * 2 * hd, nkvel = rows * nkv * hd, no = (size_t)nh * hd, kvw = (size_t)nkv * hd;
    std::vector<float> qg(nq), kc(nkvel), vc(nkvel), kx(kvw), vx(kvw), qn((size_t)hd), kn((size_t)hd), invf((size_t)rd / 2);
    for (size_t i = 0; i < nq; i++) qg[i] = i % (2 * (size_t)hd) < (size_t)hd ? rnd_sym(3.0f) : rnd_sym(4.0f);
    for (size_t i = 0; i < nkvel; i++) {
        const bool valid = i / kvw < (size_t)pos; // row pos: written by the kernel
        kc[i] = valid ? rnd_sym(1.5f) : NAN;
        vc[i] = valid ? rnd_sym(1.0f) : NAN;
    }
    std::vector<__nv_bfloat16> kb, vb;
    to_cache(kc, kb);
    to_cache(vc, vb);
    for (size_t i = 0; i < kvw; i++) { kx[i] = rnd_sym(2.0f); vx[i] = rnd_sym(1.0f); }
    for (int i = 0; i < hd; i++) { qn[(size_t)i] = 1.0f + rnd_sym(0.5f); kn[(size_t)i] = 1.0f + rnd_sym(0.5f); }
    for (int i = 0; i < rd / 2; i++) invf[(size_t)i] = (float)pow(1e7, -2.0 * i / rd);
    float *dq, *dout, *dpart, *dkx, *dvx, *dqn, *dkn, *dinvf;
    __nv_bfloat16 *dk, *dv;
    int *dpos;
    CK(cudaMalloc(&dq, nq * 4));
    CK(cudaMalloc(&dk, nkvel * 2));
    CK(cudaMalloc(&dv, nkvel * 2));
    CK(cudaMalloc(&dout, no * 4));
    CK(cudaMalloc(&dpart, (size_t)nh * 128 * (hd + 2) * 4)); // up to 128 splits (the timing below)
    CK(cudaMalloc(&dpos, sizeof(int)));
    CK(cudaMalloc(&dkx, kvw * 4));
    CK(cudaMalloc(&dvx, kvw * 4));
    CK(cudaMalloc(&dqn, (size_t)hd * 4));
    CK(cudaMalloc(&dkn, (size_t)hd * 4));
    CK(cudaMalloc(&dinvf, (size_t)rd / 2 * 4));
    CK(cudaMemcpy(dq, qg.data(), nq * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, kb.data(), nkvel * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, vb.data(), nkvel * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dpos, &pos, sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dkx, kx.data(), kvw * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dvx, vx.data(), kvw * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dqn, qn.data(), (size_t)hd * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dkn, kn.data(), (size_t)hd * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dinvf, invf.data(), (size_t)rd / 2 * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xFF, no * 4));
    CK(cudaMemset(dpart, 0xFF, (size_t)nh * S * (hd + 2) * 4));
    const size_t sm = attn_dec_mma_smem(hd);
    // the kernel under test over Sx splits, with test_attn's timeline when pr
    auto dec = [&](int Sx, unsigned long long *pr) {
        const dim3 g((unsigned)nkv, (unsigned)Sx);
        if (hd == 128)
            k_attn_dec_mma<128><<<g, adec::NT, sm>>>(dq, dkx, dvx, dqn, dkn, dinvf, rd, eps, dk, dv, dpos, nh, nkv, dpart, Sx, pr);
        else
            k_attn_dec_mma<256><<<g, adec::NT, sm>>>(dq, dkx, dvx, dqn, dkn, dinvf, rd, eps, dk, dv, dpos, nh, nkv, dpart, Sx, pr);
        CK(cudaGetLastError());
    };
    auto run = [&]() {
        dec(S, nullptr);
        k_attn_combine<<<attn_combine_grid(nh, 1, hd), 256>>>(dq, dpart, S, nh, hd, dout);
        CK(cudaGetLastError());
    };
    run();
    CK(cudaDeviceSynchronize());
    std::vector<float> got(no);
    std::vector<__nv_bfloat16> krow(kvw), vrow(kvw);
    CK(cudaMemcpy(got.data(), dout, no * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(krow.data(), dk + (size_t)pos * kvw, kvw * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(vrow.data(), dv + (size_t)pos * kvw, kvw * 2, cudaMemcpyDeviceToHost));
    // the reference's inputs: q normed and roped in place, row pos of the cache as the kernel stored it
    std::vector<double> y((size_t)hd), krow_ref(kvw);
    for (int h = 0; h < nh; h++) {
        float *q = &qg[(size_t)h * 2 * hd];
        norm_rope_ref(q, qn, hd, rd, pos, invf, eps, y.data());
        for (int i = 0; i < hd; i++) q[i] = (float)y[(size_t)i];
    }
    for (int h = 0; h < nkv; h++) {
        norm_rope_ref(&kx[(size_t)h * hd], kn, hd, rd, pos, invf, eps, &krow_ref[(size_t)h * hd]);
        for (int i = 0; i < hd; i++) {
            kc[(size_t)pos * kvw + (size_t)h * hd + i] = __bfloat162float(krow[(size_t)h * hd + i]);
            vc[(size_t)pos * kvw + (size_t)h * hd + i] = __bfloat162float(vrow[(size_t)h * hd + i]);
        }
    }
    std::vector<double> ref(no);
    Case c1 = c;
    c1.T = 1;
    reference(c1, qg, kc, vc, ref);
    size_t n_nan = 0, row_nan = 0;
    const double err = rel_err(got, ref, &n_nan);
    const double kerr = rne_err(krow.data(), krow_ref.data(), kvw, &row_nan);
    const bool vok = is_rne(vrow.data(), vx.data(), kvw);
    // k_attn (one block per query head, 32 splits) + the same combine, on the normed and roped q and the
    // row k_attn_dec wrote: the path of head sizes and groups k_attn_dec does not take
    float *dq2;
    CK(cudaMalloc(&dq2, nq * 4));
    CK(cudaMemcpy(dq2, qg.data(), nq * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xFF, no * 4));
    if (hd == 128) k_attn<4><<<dim3((unsigned)nh, 1, 32), 128>>>(dq2, dk, dv, dpos, nh, nkv, dout, dpart);
    else k_attn<8><<<dim3((unsigned)nh, 1, 32), 128>>>(dq2, dk, dv, dpos, nh, nkv, dout, dpart);
    CK(cudaGetLastError());
    k_attn_combine<<<attn_combine_grid(nh, 1, hd), 256>>>(dq2, dpart, 32, nh, hd, dout);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaFree(dq2));
    std::vector<float> got32(no);
    CK(cudaMemcpy(got32.data(), dout, no * 4, cudaMemcpyDeviceToHost));
    size_t n32 = 0;
    const double err32 = rel_err(got32, ref, &n32);
    bool ok = err <= 1e-4 && kerr <= 2e-6 && vok && err32 <= 1e-4;
    printf("%s decode %s nh=%2d nkv=%d hd=%3d pos=%6d  max|err|/max|ref| = %.3e, its K row %.3e beyond rounding, V row %s; "
           "k_attn + combine of 32 splits %.3e", ok ? "PASS" : "FAIL", "mma ", nh, nkv, hd, pos, err, kerr,
           vok ? "exact" : "WRONG", err32);
    if (n_nan || row_nan || n32) printf("  (%zu non-finite / unwritten elements)", n_nan + row_nan + n32);
    printf("\n");
    if (timed && ok) {
        const double tn = time_ms(0, run) * 1000.0;
        const double tp = time_ms(0, [&]() {
            k_attn<8><<<dim3((unsigned)nh, 1, 32), 128>>>(dq, dk, dv, dpos, nh, nkv, dout, dpart);
            k_attn_combine<<<attn_combine_grid(nh, 1, hd), 256>>>(dq, dpart, 32, nh, hd, dout);
        }) * 1000.0;
        const double tc = time_ms(0, [&]() { k_attn_combine<<<attn_combine_grid(nh, 1, hd), 256>>>(dq, dpart, S, nh, hd, dout); }) * 1000.0;
        const double bytes = 2.0 * (pos + 1) * nkv * hd * sizeof(__nv_bfloat16);
        printf("  time decode attention (%s): k_attn_dec_mma + combine %7.2f us (%.2f TB/s of K/V; combine alone %.2f us), k_attn + "
               "combine %7.2f us: %.1fx\n", "k_attn_dec_mma", tn, bytes / tn * 1e-6, tc, tp, tp / tn);
        // where a launch's time goes (hd 256): 20 launches in a row per split count, then one with
        // in-kernel timestamps, us from the first block's start, median / max over blocks
        if (hd == 256) {
            cudaEvent_t a, b;
            CK(cudaEventCreate(&a));
            CK(cudaEventCreate(&b));
            for (const int Sx : {32, 64, 128}) {
                unsigned long long *dprof;
                const size_t nb = (size_t)nkv * Sx;
                CK(cudaMalloc(&dprof, 5 * nb * sizeof(unsigned long long)));
                float ms[2];
                for (int pass = 0; pass < 2; pass++) { // k_attn_dec alone, then with the combine
                    dec(Sx, nullptr);
                    CK(cudaEventRecord(a));
                    for (int i = 0; i < 20; i++) {
                        dec(Sx, nullptr);
                        if (pass) k_attn_combine<<<attn_combine_grid(nh, 1, hd), 256>>>(dq, dpart, Sx, nh, hd, dout);
                    }
                    CK(cudaEventRecord(b));
                    CK(cudaEventSynchronize(b));
                    CK(cudaEventElapsedTime(&ms[pass], a, b));
                }
                // the output of the last combine of Sx splits, against the same reference
                std::vector<float> gs(no);
                CK(cudaMemcpy(gs.data(), dout, no * 4, cudaMemcpyDeviceToHost));
                size_t ns = 0;
                const double es = rel_err(gs, ref, &ns);
                const bool sok = es <= 1e-4 && ns == 0;
                ok = ok && sok;
                dec(Sx, dprof);
                CK(cudaDeviceSynchronize());
                std::vector<unsigned long long> pr(5 * nb);
                CK(cudaMemcpy(pr.data(), dprof, pr.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
                const unsigned long long t0 = *std::min_element(pr.begin(), pr.begin() + (long)nb);
                printf("    %s splits %3d (max|err|/max|ref| %.3e): k_attn_dec %6.2f us, + combine %6.2f us per launch "
                       "(20 in a row); timeline", sok ? "PASS" : "FAIL", Sx, es, 1000.0f * ms[0] / 20, 1000.0f * ms[1] / 20);
                const char *name[5] = {"start", "issued+q", "tile 0", "tiles done", "end"};
                for (int i = 0; i < 5; i++) {
                    std::vector<float> v(nb);
                    for (size_t k = 0; k < nb; k++) v[k] = (float)(pr[i * nb + k] - t0) * 1e-3f;
                    std::sort(v.begin(), v.end());
                    printf("%s %s %.2f / %.2f", i ? "," : "", name[i], v[nb / 2], v[nb - 1]);
                }
                printf("\n");
                CK(cudaFree(dprof));
            }
            CK(cudaEventDestroy(a));
            CK(cudaEventDestroy(b));
        }
    }
    CK(cudaFree(dq));
    CK(cudaFree(dk));
    CK(cudaFree(dv));
    CK(cudaFree(dout));
    CK(cudaFree(dpart));
    CK(cudaFree(dpos));
    CK(cudaFree(dkx));
    CK(cudaFree(dvx));
    CK(cudaFree(dqn));
    CK(cudaFree(dkn));
    CK(cudaFree(dinvf));
    return ok;
}

int main(void) {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    std::vector<Case> cases;
    for (int pos : {0, 5, 2048})
        for (int T : {1, 17, 63, 64, 65, 2047, 2048}) cases.push_back({16, 2, 256, T, pos});
    for (int pos : {0, 100})
        for (int T : {1, 63, 64, 65, 300}) cases.push_back({4, 2, 64, T, pos});
    cases.push_back({8, 2, 128, 100, 37});
    cases.push_back({16, 2, 256, 64, 40000});
    int pass = 0, fail = 0;
    int *don, wg_on = 0; // the wgmma kernel where its sm_90a image runs (the backend's switch)
    CK(cudaMalloc(&don, sizeof(int)));
    k_wg_probe<<<1, 1>>>(don);
    CK(cudaGetLastError());
    CK(cudaMemcpy(&wg_on, don, sizeof(int), cudaMemcpyDeviceToHost));
    CK(cudaFree(don));
    printf("k_attn_wg (wgmma): %s\n", wg_on ? "tested" : "not built for this device");
    for (const Case &c : cases) {
        const bool timed = c.nh == 16 && c.nkv == 2 && c.hd == 256 && c.T == 2048 && c.pos == 2048;
        for (int wg = 0; wg <= (wg_on && c.hd == attn_wg::HD ? 1 : 0); wg++)
            for (int qp : {2, 1}) { // the default pieces, then --attn-precision bf16's
                if (run_case(c, timed, qp, wg))
                    pass++;
                else
                    fail++;
            }
    }
    CK(cudaFuncSetAttribute(k_attn_dec_mma<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)attn_dec_mma_smem(128)));
    CK(cudaFuncSetAttribute(k_attn_dec_mma<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)attn_dec_mma_smem(256)));
    // decode: empty splits (pos < S), one partial tile, tile edges, long contexts; GQA groups of 8, 4 and 1
    for (int pos : {0, 1, 15, 16, 17, 31, 32, 63, 64, 65, 127, 128, 129, 2047, 4095, 32767, 131071}) {
        if (run_dec_case({16, 2, 256, 1, pos}, pos == 4095 || pos == 32767 || pos == 131071)) pass++;
        else fail++;
    }
    for (Case c : {Case{8, 2, 128, 1, 100}, Case{4, 4, 128, 1, 777}, Case{16, 2, 256, 1, 40000}, Case{12, 2, 128, 1, 5000},
                   Case{16, 2, 256, 1, 6000}}) {
        if (run_dec_case(c, false)) pass++;
        else fail++;
    }
    for (Case c : {Case{16, 2, 256, 5, 0}, Case{16, 2, 256, 3, 4090}, Case{4, 2, 64, 7, 100}}) {
        if (run_prep_case(c)) pass++;
        else fail++;
    }
    printf("%s: %d passed, %d failed\n", fail ? "FAIL" : "PASS", pass, fail);
    return fail ? 1 : 0;
}
