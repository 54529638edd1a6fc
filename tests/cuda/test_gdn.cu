// test_gdn.cu — the Gated DeltaNet kernels of src/backend/cuda/cuda_gdn.cuh
// against plain CPU loops written here, in double (run on the device:
// build/cuda-tests/test_gdn [--quick] [--chunk] [--time]; no model needed).
//
// --chunk: every prefill through the chunked form instead of k_gdn_recur
// (cuda_gdn_chunk.cuh, the backend's default from 128 tokens: k_gdn_chunk_a /
// k_gdn_chunk_b after k_gdn_prep's log decays), at the real shape, at every length and
// over the chunk boundaries (64 tokens), with the same reference and bars.
// --time: the two forms' speed at 16 .. 16k tokens (a benchmark: nothing fails on it).
//
// Both paths of gdn_layer (cuda_backend.cu), launched exactly as it launches them:
//   prefill (T tokens): k_conv<4> -> k_gdn_prep -> k_gdn_recur<dk, rg, c> -> k_gated_norm (several rg, c)
//   decode (one token): k_gdn_step<dk/GDN_G, 4>, when gdn_step_threads(dv) > 0 (else the
//                       prefill path with T = 1, as gdn_layer does)
// on random inputs at the model's shape (Hk = 16 q/k heads, Hv = 32 v-heads, dk = dv
// = 128, conv width 4, conv dim 8192) and at smaller ones (dk 32/64/256, dv 32..256,
// Hv/Hk 1, 2, 4). A case is a sequence of segments (prefill of n tokens, or one
// decode step) from a random recurrent state and a random double-buffered conv
// state, at a starting position p0 of either parity; after every segment the
// checks are:
//   o[n][Hv*dv]           max|gpu-ref| / max|ref| <= 1e-4 (poisoned with NaN first)
//   recurrent state       max|gpu-ref| / max|ref| <= 1e-4
//   conv state [2][3][CD] bit-exact: the buffer the next pass reads ((p+n)&1) holds
//                         the last 3 raw inputs, the other one is untouched
// and, on the prefill path, the intermediates (to say which kernel is wrong):
//   k_conv's output, k_gdn_prep's q/k/v rows   <= 1e-5 relative, per part
//   k_gdn_prep's beta and decay                <= 1e-6 absolute
//   where dk = 128: k_conv with the prep fused (the backend's launch there) against the two launches, from the
//   same conv state: conv output, beta, decay, log decays and both conv buffers byte for byte
// Token counts cover the tiling: k_conv segments of CONV_TS = 32 tokens,
// k_gdn_recur staging buffers of 16 tokens (8 where a key row's padded length exceeds 160). Every prefill is
// followed by decode steps, and the reference is checked once more against one
// CPU loop over the whole sequence (prefill of T then a step = the loop over T+1).
//
// Inputs at the model's scales: activations N(0,1), conv weights N(0,0.5^2),
// A_log = log U(1,16), dt_bias small for half the heads and log-small (slow decay,
// long memory) for the other half, one head past softplus' linear threshold (20),
// so the decay spans (0,1); the initial state U(-1,1) (nonzero: it must be read).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "../unit/check.h"
#include "cuda_test.h"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_gemm_tc.cuh"
#include "backend/cuda/cuda_gdn.cuh"
#include "backend/cuda/cuda_attn_split.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_argmax.cuh"
#define GDC_TIMELINE // phase A's in-kernel timestamps (this binary's copy of the kernels only)
#include "backend/cuda/cuda_gdn_chunk.cuh"

static double rnd_u() { return (double)((rnd() >> 11) + 1) * (1.0 / 9007199254740993.0); } // in (0, 1)
static float rnd_unif(float lo, float hi) { return (float)(lo + (hi - lo) * rnd_u()); }
static float rnd_normal(float sd) { // Box-Muller
    return (float)(sd * sqrt(-2.0 * log(rnd_u())) * cos(6.283185307179586 * rnd_u()));
}

// ---------------------------------------------------------------- geometry and inputs

enum { KC = 4 };               // conv width: the model's, and the only one k_gdn_step is built for
static const float EPS = 1e-6f; // rms_eps (the gated norm)
static const double TOL_O = 1e-4, TOL_S = 1e-4, TOL_STAGE = 1e-5, TOL_GATE = 1e-6;
static int fused_cases = 0; // prefill segments whose fused conv + prep was compared with the two launches

struct geo {
    int Hk, Hv, dk, dv;
    int64_t KD() const { return (int64_t)Hk * dk; }
    int64_t VD() const { return (int64_t)Hv * dv; }
    int64_t CD() const { return 2 * KD() + VD(); } // conv channels: [q KD | k KD | v VD]
    bool step_ok() const { return gdn_step_threads(dv) > 0; } // gdn_layer's condition for k_gdn_step (K = 4)
};
static const geo REAL = {16, 32, 128, 128};

// Every input of a case: per-token rows for all N tokens of its segments, and the
// layer's parameters.
struct inputs {
    std::vector<float> qkv, z, bb, ba;          // [N][CD], [N][VD], [N][Hv], [N][Hv]
    std::vector<float> convw, A_log, dt_bias, nw; // [CD][KC], [Hv], [Hv], [dv]
};

static void make_inputs(const geo &G, int N, inputs &in) {
    const int64_t CD = G.CD(), VD = G.VD();
    in.qkv.resize((size_t)(N * CD));
    in.z.resize((size_t)(N * VD));
    in.bb.resize((size_t)N * G.Hv);
    in.ba.resize((size_t)N * G.Hv);
    for (auto &x : in.qkv) x = rnd_normal(1.0f);
    for (auto &x : in.z) x = rnd_normal(1.0f);
    for (auto &x : in.bb) x = rnd_normal(1.0f);
    for (auto &x : in.ba) x = rnd_normal(1.0f);
    in.convw.resize((size_t)(CD * KC));
    for (auto &x : in.convw) x = rnd_normal(0.5f); // conv output ~ N(0,1)
    in.A_log.resize((size_t)G.Hv);
    in.dt_bias.resize((size_t)G.Hv);
    for (int j = 0; j < G.Hv; j++) {
        in.A_log[(size_t)j] = logf(rnd_unif(1.0f, 16.0f));
        // Odd heads: softplus(a + dt_bias) ~ 1e-3..0.1, decay near 1 (the state is
        // remembered for many tokens); even heads: decay anywhere in (0, 1).
        in.dt_bias[(size_t)j] = j % 2 ? rnd_unif(-6.0f, -2.0f) : rnd_unif(-0.5f, 0.5f);
    }
    if (G.Hv >= 4) in.dt_bias[(size_t)G.Hv - 2] = 21.0f; // a + dt_bias > 20 for most tokens: softplus' linear branch
    in.nw.resize((size_t)G.dv);
    for (auto &x : in.nw) x = rnd_unif(0.5f, 1.5f);
}

// ---------------------------------------------------------------- CPU reference (double)
//
// Straight from the definition (spec/model.md 3.3), one token after the other:
//   conv:   c_t = silu(sum_k w[ch][k] m_{t-3+k}), m at negative t from the conv state
//           (the last 3 raw inputs, oldest first), which then holds the last 3 inputs
//   q/k:    q^ = q / sqrt(|q|^2 + 1e-6) / sqrt(dk),  k^ = k / sqrt(|k|^2 + 1e-6)
//   gates:  beta = sigmoid(b),  a = exp(-exp(A_log) softplus(a_in + dt_bias))
//   state:  S <- a S;  r = S^T k^;  d = beta (v - r);  S <- S + k^ d^T;  o = S^T q^
//   out:    w * o / sqrt(mean(o^2) + eps) * silu(z)
// v-head j reads q/k head j / (Hv/Hk). The conv state stays in float: it only ever
// holds raw inputs, so the kernels' copy must match it bit for bit.

struct ref_state {
    std::vector<float> conv; // [KC-1][CD]
    std::vector<double> S;   // [Hv][dk][dv]
};

// Tokens t0 .. t0+n-1: c[n][CD] = conv + SiLU; the conv state advanced.
static void ref_conv(const geo &G, const inputs &in, int t0, int n, std::vector<float> &conv, std::vector<double> &c) {
    const int64_t CD = G.CD();
    c.assign((size_t)(n * CD), 0.0);
    std::vector<float> next((size_t)((KC - 1) * CD));
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < CD; ch++) {
        // raw input of channel ch at token s of the segment (s < 0: from the state)
        auto x = [&](int s) -> float {
            return s >= 0 ? in.qkv[(size_t)((t0 + s) * CD + ch)] : conv[(size_t)((KC - 1 + s) * CD + ch)];
        };
        for (int t = 0; t < n; t++) {
            double acc = 0.0;
            for (int k = 0; k < KC; k++) acc += (double)in.convw[(size_t)(ch * KC + k)] * x(t - (KC - 1) + k);
            c[(size_t)(t * CD + ch)] = acc / (1.0 + exp(-acc));
        }
        for (int k = 0; k < KC - 1; k++) next[(size_t)(k * CD + ch)] = x(n - (KC - 1) + k);
    }
    conv.swap(next);
}

// In place on c: q and k heads L2-normalised (q also by 1/sqrt(dk)); the gates.
static void ref_prep(const geo &G, const inputs &in, int t0, int n, std::vector<double> &c, std::vector<double> &beta,
                     std::vector<double> &decay) {
    const int64_t CD = G.CD();
    beta.assign((size_t)n * G.Hv, 0.0);
    decay.assign((size_t)n * G.Hv, 0.0);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++) {
        for (int h = 0; h < 2 * G.Hk; h++) { // q heads 0..Hk-1, then the k heads: contiguous dk each
            double *v = &c[(size_t)(t * CD + (int64_t)h * G.dk)];
            double ss = 0.0;
            for (int i = 0; i < G.dk; i++) ss += v[i] * v[i];
            const double sc = (h < G.Hk ? 1.0 / sqrt((double)G.dk) : 1.0) / sqrt(ss + 1e-6);
            for (int i = 0; i < G.dk; i++) v[i] *= sc;
        }
        for (int j = 0; j < G.Hv; j++) {
            const size_t i = (size_t)(t0 + t) * G.Hv + j, o = (size_t)t * G.Hv + j;
            beta[o] = 1.0 / (1.0 + exp(-(double)in.bb[i]));
            const double xa = (double)in.ba[i] + in.dt_bias[(size_t)j];
            decay[o] = exp(-exp((double)in.A_log[(size_t)j]) * log1p(exp(xa))); // softplus without a threshold
        }
    }
}

// The recurrence and the gated norm over the n tokens of c (after ref_prep): o[n][VD].
static void ref_recur(const geo &G, const inputs &in, int t0, int n, const std::vector<double> &c,
                      const std::vector<double> &beta, const std::vector<double> &decay, std::vector<double> &S,
                      std::vector<double> &o) {
    const int64_t CD = G.CD(), KD = G.KD(), VD = G.VD();
    const int dk = G.dk, dv = G.dv;
    o.assign((size_t)(n * VD), 0.0);
#pragma omp parallel for schedule(dynamic, 1)
    for (int j = 0; j < G.Hv; j++) {
        const int hk = j / (G.Hv / G.Hk);
        double *Sj = &S[(size_t)j * dk * dv]; // Sj[i*dv + m]: key i, value m
        std::vector<double> r((size_t)dv), ov((size_t)dv);
        for (int t = 0; t < n; t++) {
            const double *row = &c[(size_t)(t * CD)];
            const double *q = row + (int64_t)hk * dk, *k = row + KD + (int64_t)hk * dk, *v = row + 2 * KD + (int64_t)j * dv;
            const double a = decay[(size_t)t * G.Hv + j], bt = beta[(size_t)t * G.Hv + j];
            for (int m = 0; m < dv; m++) r[(size_t)m] = 0.0;
            for (int i = 0; i < dk; i++)
                for (int m = 0; m < dv; m++) {
                    Sj[(size_t)i * dv + m] *= a;
                    r[(size_t)m] += Sj[(size_t)i * dv + m] * k[i];
                }
            for (int m = 0; m < dv; m++) r[(size_t)m] = bt * (v[m] - r[(size_t)m]); // delta
            for (int m = 0; m < dv; m++) ov[(size_t)m] = 0.0;
            for (int i = 0; i < dk; i++)
                for (int m = 0; m < dv; m++) {
                    Sj[(size_t)i * dv + m] += k[i] * r[(size_t)m];
                    ov[(size_t)m] += Sj[(size_t)i * dv + m] * q[i];
                }
            double ss = 0.0;
            for (int m = 0; m < dv; m++) ss += ov[(size_t)m] * ov[(size_t)m];
            const double inv = 1.0 / sqrt(ss / dv + (double)EPS);
            const float *z = &in.z[(size_t)((t0 + t) * VD + (int64_t)j * dv)];
            double *out = &o[(size_t)(t * VD + (int64_t)j * dv)];
            for (int m = 0; m < dv; m++)
                out[m] = ov[(size_t)m] * inv * in.nw[(size_t)m] * ((double)z[m] / (1.0 + exp(-(double)z[m])));
        }
    }
}

// The whole layer core over tokens t0 .. t0+n-1 (conv state and S advanced).
static void ref_tokens(const geo &G, const inputs &in, int t0, int n, ref_state &st, std::vector<double> &o) {
    std::vector<double> c, beta, decay;
    ref_conv(G, in, t0, n, st.conv, c);
    ref_prep(G, in, t0, n, c, beta, decay);
    ref_recur(G, in, t0, n, c, beta, decay, st.S, o);
}

// ---------------------------------------------------------------- comparisons

// max|got - ref| / max|ref| over rows x columns [c0, c0+nc) of row-major matrices
// with leading dimension ld; a non-finite got (unwritten: NaN poison) gives inf.
static double rel_err(const float *got, const double *ref, int64_t rows, int64_t ld, int64_t c0, int64_t nc) {
    double md = 0.0, mr = 0.0;
    bool bad = false;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = c0; i < c0 + nc; i++) {
            const double g = got[r * ld + i], x = ref[r * ld + i];
            mr = fmax(mr, fabs(x));
            if (!isfinite(g)) bad = true;
            else md = fmax(md, fabs(g - x));
        }
    return bad ? INFINITY : mr > 0.0 ? md / mr : md;
}
static double rel_err(const std::vector<float> &got, const std::vector<double> &ref) {
    return rel_err(got.data(), ref.data(), 1, (int64_t)ref.size(), 0, (int64_t)ref.size());
}
static double abs_err(const std::vector<float> &got, const std::vector<double> &ref) {
    double md = 0.0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!isfinite(got[i])) return INFINITY;
        md = fmax(md, fabs((double)got[i] - ref[i]));
    }
    return md;
}

// ---------------------------------------------------------------- launches (as gdn_layer)

struct gpu_bufs {
    dbuf<float> qkv, z, bb, ba, conv_out, beta, decay, o; // per segment, sized for the longest
    dbuf<float> lgd, scratch;                             // the chunked form's log decays and scratch
    dbuf<float> conv2, ssm;                               // the layer's state: [2][KC-1][CD], [Hv][dk][dv]
    dbuf<float> convw, A_log, dt_bias, nw;
    dbuf<int> pos; // d_pos: the segment's first position
    gpu_bufs(const geo &G, int Tmax)
        : qkv((size_t)(Tmax * G.CD())), z((size_t)(Tmax * G.VD())), bb((size_t)Tmax * G.Hv), ba((size_t)Tmax * G.Hv),
          conv_out((size_t)(Tmax * G.CD())), beta((size_t)Tmax * G.Hv), decay((size_t)Tmax * G.Hv),
          o((size_t)(Tmax * G.VD())), lgd((size_t)Tmax * G.Hv), scratch(gdn_chunk_scratch(Tmax, G.Hv)), conv2((size_t)(2 * (KC - 1) * G.CD())), ssm((size_t)G.Hv * G.dk * G.dv),
          convw((size_t)(G.CD() * KC)), A_log((size_t)G.Hv), dt_bias((size_t)G.Hv), nw((size_t)G.dv), pos(1) {}
};

// conv_launch: one thread per channel and CONV_TS-token segment, 128 per block.
static void launch_conv(const geo &G, gpu_bufs &d, int T) {
    const int64_t CD = G.CD();
    const dim3 g((unsigned)((CD + 127) / 128), (unsigned)((T + CONV_TS - 1) / CONV_TS));
    k_conv<KC><<<g, 128>>>(d.qkv.p, d.conv2.p, d.convw.p, d.conv_out.p, T, CD, d.pos.p, gdn_prep_args{});
    CKL();
}
// k_conv with k_gdn_prep's work fused (gdn_layer's launch where dk = 128).
static void launch_conv_prep(const geo &G, gpu_bufs &d, int T) {
    const int64_t CD = G.CD();
    const dim3 g((unsigned)((CD + 127) / 128), (unsigned)((T + CONV_TS - 1) / CONV_TS));
    const gdn_prep_args pp = {2 * G.Hk, G.Hk, G.Hv, G.dk, d.bb.p, d.ba.p, d.A_log.p, d.dt_bias.p, d.beta.p, d.decay.p, d.lgd.p};
    k_conv<KC><<<g, 128>>>(d.qkv.p, d.conv2.p, d.convw.p, d.conv_out.p, T, CD, d.pos.p, pp);
    CKL();
}
template <typename T> static bool same_bytes(const std::vector<T> &a, const std::vector<T> &b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0;
}
static void launch_prep(const geo &G, gpu_bufs &d, int T) {
    k_gdn_prep<<<T, 256>>>(d.conv_out.p, G.CD(), 2 * G.Hk, G.Hk, G.dk, d.bb.p, d.ba.p, d.A_log.p, d.dt_bias.p, G.Hv,
                           d.beta.p, d.decay.p, d.lgd.p);
    CKL();
}
// k_gdn_recur<dk, rg, c> as gdn_layer picks it (gdn_recur_kernel: rg threads per state column, c
// columns per thread, 4 warps a block); then k_gated_norm, one warp per (token, v-head), 8 a block. Every case
// runs at each (rg, c) of main's list.
static int recur_rg = 4, recur_c = 1;
static bool do_time = false;  // --time: time_prefill only
static bool use_chunk = false; // --chunk: the chunked form where it serves the shape
static bool chunked(const geo &G) { return use_chunk && gdn_chunk_ok(G.dk, G.dv, G.Hk, G.Hv); }
static void launch_recur_norm(const geo &G, gpu_bufs &d, int T) {
    if (chunked(G)) {
        CK(gdn_chunk_launch(d.conv_out.p, G.CD(), G.KD(), G.Hk, G.Hv, d.beta.p, d.lgd.p, d.ssm.p, d.o.p, T, d.scratch.p, 0));
        k_gated_norm<<<(unsigned)((T * G.Hv + 7) / 8), 256>>>(d.o.p, d.z.p, d.nw.p, (int64_t)T, G.Hv, G.dv, EPS, g4_split{}, false);
        CKL();
        return;
    }
    dim3 g;
    int rg = recur_rg, c = recur_c; // as gdn_layer: the requested shape, lowered where it does not fit
    const gdn_recur_fn recur = gdn_recur_kernel(G.dk, rg, c, G.Hv, G.dv, &g);
    if (!recur) { fprintf(stderr, "no k_gdn_recur for dk = %d\n", G.dk); exit(2); }
    recur<<<g, 128>>>(d.conv_out.p, G.CD(), G.KD(), G.Hk, G.Hv, G.dv, d.beta.p, d.decay.p, d.ssm.p, d.o.p, T);
    CKL();
    k_gated_norm<<<(unsigned)((T * G.Hv + 7) / 8), 256>>>(d.o.p, d.z.p, d.nw.p, (int64_t)T, G.Hv, G.dv, EPS, g4_split{}, false);
    CKL();
}
// k_gdn_step<dk/GDN_G, 4>: a cluster of GDN_SPLIT blocks per v-head, as gdn_layer launches it.
static void launch_step(const geo &G, gpu_bufs &d) {
    const unsigned threads = (unsigned)gdn_step_threads(G.dv);
    const size_t sm = gdn_step_smem(G.dv);
#define STEP(KPT) k_gdn_step<KPT, KC><<<G.Hv * GDN_SPLIT, threads, sm>>>(d.qkv.p, d.conv2.p, d.convw.p, G.CD(), G.KD(), G.Hk, G.Hv,   \
                                                             G.dv, d.bb.p, d.ba.p, d.A_log.p, d.dt_bias.p, d.ssm.p, d.z.p, \
                                                             d.nw.p, EPS, d.o.p, d.pos.p)
    switch (G.dk) {
    case 32: STEP(32 / GDN_G); break;
    case 64: STEP(64 / GDN_G); break;
    case 128: STEP(128 / GDN_G); break;
    case 256: STEP(256 / GDN_G); break;
    default: fprintf(stderr, "no k_gdn_step for dk = %d\n", G.dk); exit(2);
    }
#undef STEP
    CKL();
}

// ---------------------------------------------------------------- one case

struct seg {
    int n;     // tokens
    bool step; // the decode kernel (n = 1) rather than the prefill chain
};
static seg pre(int n) { return {n, false}; } // prefill of n tokens
static const seg DEC = {1, true};              // one decode step

static bool quick = false;
static int cases_run = 0, cases_failed = 0;

// Runs the segments from random states at position p0; checks after each one.
// Returns whether everything matched; prints one line with the worst errors.
static bool run_case(const geo &G, int p0, const std::vector<seg> &segs) {
    const int64_t CD = G.CD(), VD = G.VD();
    const size_t nconv = (size_t)((KC - 1) * CD), nS = (size_t)G.Hv * G.dk * G.dv;
    int N = 0, Tmax = 1;
    // e.g. "Hk=16 Hv=32 dk=128 dv=128 p0=64 [P17 D D]": P = prefill chain, D = decode step
    int erg = recur_rg, ec = recur_c; // the shape k_gdn_recur runs at for this geometry
    {
        dim3 g;
        gdn_recur_kernel(G.dk, erg, ec, G.Hv, G.dv, &g);
    }
    std::string label = (chunked(G) ? std::string("chunked") : "rg=" + std::to_string(erg) + " c=" + std::to_string(ec)) +
                        " Hk=" + std::to_string(G.Hk) + " Hv=" + std::to_string(G.Hv) + " dk=" + std::to_string(G.dk) +
                        " dv=" + std::to_string(G.dv) + " p0=" + std::to_string(p0) + " [";
    for (size_t i = 0; i < segs.size(); i++) {
        label += i ? " " : "";
        label += segs[i].step ? (G.step_ok() ? "D" : "D(prefill path)") : "P" + std::to_string(segs[i].n);
        N += segs[i].n;
        Tmax = std::max(Tmax, segs[i].n);
    }
    label += "]";

    inputs in;
    make_inputs(G, N, in);
    // Both conv buffers random and different: reading the wrong parity shows.
    std::vector<float> conv2(2 * nconv), S0(nS);
    for (auto &x : conv2) x = rnd_normal(1.0f);
    for (auto &x : S0) x = rnd_unif(-1.0f, 1.0f);

    gpu_bufs d(G, Tmax);
    d.convw.put(in.convw);
    d.A_log.put(in.A_log);
    d.dt_bias.put(in.dt_bias);
    d.nw.put(in.nw);
    d.conv2.put(conv2);
    d.ssm.put(S0);

    ref_state st;
    st.conv.assign(conv2.begin() + (ptrdiff_t)((p0 & 1) * nconv), conv2.begin() + (ptrdiff_t)((p0 & 1 ? 2 : 1) * nconv));
    st.S.assign(S0.begin(), S0.end());
    const ref_state st0 = st;
    std::vector<double> o_all((size_t)(N * VD)); // the segments' reference outputs, for the whole-sequence check

    double w_o = 0, w_S = 0, w_conv = 0, w_qkv = 0, w_gate = 0; // worst over the segments
    size_t conv_bad = 0;
    bool ok = true;
    int t0 = 0, p = p0;
    for (size_t si = 0; si < segs.size(); si++) {
        const int n = segs[si].n;
        const bool step = segs[si].step && G.step_ok();
        d.qkv.put_n(&in.qkv[(size_t)(t0 * CD)], (size_t)(n * CD));
        d.z.put_n(&in.z[(size_t)(t0 * VD)], (size_t)(n * VD));
        d.bb.put_n(&in.bb[(size_t)t0 * G.Hv], (size_t)n * G.Hv);
        d.ba.put_n(&in.ba[(size_t)t0 * G.Hv], (size_t)n * G.Hv);
        d.pos.put(&p);
        d.o.fill_bytes(0xff); // NaN: every output must be written
        d.conv_out.fill_bytes(0xff);
        d.beta.fill_bytes(0xff);
        d.decay.fill_bytes(0xff);

        std::vector<double> c, beta, decay, o;
        ref_conv(G, in, t0, n, st.conv, c);
        if (step) {
            launch_step(G, d);
            ref_prep(G, in, t0, n, c, beta, decay);
        } else {
            const std::vector<float> conv0 = d.conv2.get(); // (the fused launch below starts from it again)
            launch_conv(G, d, n);
            const std::vector<float> gc = d.conv_out.get((size_t)(n * CD));
            const double e_conv = rel_err(gc.data(), c.data(), 1, n * CD, 0, n * CD);
            launch_prep(G, d, n);
            ref_prep(G, in, t0, n, c, beta, decay);
            const std::vector<float> gq = d.conv_out.get((size_t)(n * CD)), gb = d.beta.get((size_t)n * G.Hv),
                                     ga = d.decay.get((size_t)n * G.Hv);
            // q, k and v separately: the normalised q is ~1/sqrt(dk) the size of v
            const double e_q = rel_err(gq.data(), c.data(), n, CD, 0, G.KD()),
                         e_k = rel_err(gq.data(), c.data(), n, CD, G.KD(), G.KD()),
                         e_v = rel_err(gq.data(), c.data(), n, CD, 2 * G.KD(), VD);
            const double e_qkv = fmax(e_q, fmax(e_k, e_v)), e_gate = fmax(abs_err(gb, beta), abs_err(ga, decay));
            w_conv = fmax(w_conv, e_conv);
            w_qkv = fmax(w_qkv, e_qkv);
            w_gate = fmax(w_gate, e_gate);
            CHECKF(e_conv <= TOL_STAGE, "%s segment %zu: k_conv output off by %.3e (relative)", label.c_str(), si, e_conv);
            CHECKF(e_qkv <= TOL_STAGE, "%s segment %zu: k_gdn_prep q/k/v off by %.3e / %.3e / %.3e (relative)",
                   label.c_str(), si, e_q, e_k, e_v);
            CHECKF(e_gate <= TOL_GATE, "%s segment %zu: k_gdn_prep beta/decay off by %.3e (absolute)", label.c_str(), si,
                   e_gate);
            ok = ok && e_conv <= TOL_STAGE && e_qkv <= TOL_STAGE && e_gate <= TOL_GATE;
            if (G.dk == 128) { // the fused conv + prep: every output byte for byte that of the two launches
                const std::vector<float> lg = d.lgd.get((size_t)n * G.Hv), cs = d.conv2.get();
                d.conv2.put(conv0);
                d.conv_out.fill_bytes(0xff), d.beta.fill_bytes(0xff), d.decay.fill_bytes(0xff), d.lgd.fill_bytes(0xff);
                launch_conv_prep(G, d, n);
                const bool s_out = same_bytes(d.conv_out.get((size_t)(n * CD)), gq), s_beta = same_bytes(d.beta.get((size_t)n * G.Hv), gb),
                           s_dec = same_bytes(d.decay.get((size_t)n * G.Hv), ga), s_lgd = same_bytes(d.lgd.get((size_t)n * G.Hv), lg),
                           s_st = same_bytes(d.conv2.get(), cs), same = s_out && s_beta && s_dec && s_lgd && s_st;
                CHECKF(same, "%s segment %zu: k_conv with the prep fused differs from k_conv + k_gdn_prep in%s%s%s%s%s", label.c_str(),
                       si, s_out ? "" : " q/k/v", s_beta ? "" : " beta", s_dec ? "" : " decay", s_lgd ? "" : " log decays",
                       s_st ? "" : " conv state");
                ok = ok && same;
                fused_cases++;
            }
            launch_recur_norm(G, d, n);
        }
        ref_recur(G, in, t0, n, c, beta, decay, st.S, o);
        std::copy(o.begin(), o.end(), o_all.begin() + (ptrdiff_t)(t0 * VD));

        // o and the recurrent state
        const double e_o = rel_err(d.o.get((size_t)(n * VD)), o), e_S = rel_err(d.ssm.get(), st.S);
        w_o = fmax(w_o, e_o);
        w_S = fmax(w_S, e_S);
        CHECKF(e_o <= TOL_O, "%s segment %zu (%s, pos %d): o off by %.3e (relative)", label.c_str(), si,
               step ? "k_gdn_step" : "prefill", p, e_o);
        CHECKF(e_S <= TOL_S, "%s segment %zu (%s, pos %d): recurrent state off by %.3e (relative)", label.c_str(), si,
               step ? "k_gdn_step" : "prefill", p, e_S);
        ok = ok && e_o <= TOL_O && e_S <= TOL_S;

        // The conv state: the next pass (at p + n) reads buffer (p+n)&1; the other
        // buffer keeps what it held (the step lets blocks read it while others write).
        memcpy(&conv2[((size_t)(p + n) & 1) * nconv], st.conv.data(), sizeof(float) * nconv);
        const std::vector<float> gconv = d.conv2.get();
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < 2 * nconv; i++)
            if (memcmp(&gconv[i], &conv2[i], sizeof(float)) != 0 && bad++ == 0) first = i;
        conv_bad += bad;
        if (bad) {
            const size_t buf = first / nconv, row = first % nconv / (size_t)CD, ch = first % (size_t)CD;
            CHECKF(false, "%s segment %zu (%s, pos %d): conv state: %zu element(s) differ; first buffer %zu (%s) row %zu channel %zu: %.9g, want %.9g",
                   label.c_str(), si, step ? "k_gdn_step" : "k_conv", p, bad, buf,
                   buf == ((size_t)(p + n) & 1) ? "the next read" : "must be untouched", row, ch, gconv[first], conv2[first]);
            ok = false;
        }
        t0 += n;
        p += n;
    }

    // The segmented reference against one loop over all N tokens (no state carried
    // between calls): checks the reference's own carry, i.e. prefill of T then a
    // step equals the loop over T + 1 tokens.
    {
        ref_state whole = st0;
        std::vector<double> o;
        ref_tokens(G, in, 0, N, whole, o);
        double md = 0, mr = 0, sd = 0, sr = 0;
        for (size_t i = 0; i < o.size(); i++) md = fmax(md, fabs(o[i] - o_all[i])), mr = fmax(mr, fabs(o[i]));
        for (size_t i = 0; i < nS; i++) sd = fmax(sd, fabs(whole.S[i] - st.S[i])), sr = fmax(sr, fabs(whole.S[i]));
        const bool same = md <= 1e-9 * mr && sd <= 1e-9 * sr && whole.conv == st.conv;
        CHECKF(same, "%s: the reference by segments differs from one loop over the %d tokens (o %.3e, S %.3e)",
               label.c_str(), N, md / mr, sd / sr);
        ok = ok && same;
    }

    printf("%s %-62s o %.2e  state %.2e  conv state %s", ok ? "PASS" : "FAIL", label.c_str(), w_o, w_S,
           conv_bad ? "DIFFERS" : "exact");
    if (w_conv > 0 || w_qkv > 0 || w_gate > 0) printf("  (k_conv %.1e, prep %.1e, gates %.1e)", w_conv, w_qkv, w_gate);
    printf("\n");
    fflush(stdout);
    cases_run++;
    cases_failed += !ok;
    return ok;
}

// ---------------------------------------------------------------- the cases

// Prefill at the real shape over the tiling boundaries, from an even and an odd
// position, each followed by two decode steps (one of each parity).
static void test_real_prefill(void) {
    const int Ts[] = {1, 2, 15, 16, 17, 31, 32, 33, 100, 2048};
    for (int p0 : {64, 1001})
        for (int T : Ts) {
            if (quick && T > 100) continue;
            run_case(REAL, p0, {pre(T), DEC, DEC});
        }
}

// Decode steps only, at the real shape, from random states at both parities.
static void test_real_decode(void) {
    for (int p0 : {0, 7, 4096}) run_case(REAL, p0, {DEC, DEC, DEC, DEC});
}

// Chunked prefill continuing after decode steps and other chunks, at odd and
// even positions (as a long prompt or a multi-turn conversation runs).
static void test_real_chunks(void) {
    run_case(REAL, 0, {pre(17), DEC, pre(33), DEC, DEC, pre(2), pre(1), pre(64), DEC});
    run_case(REAL, 3, {pre(100), pre(31), DEC, pre(16), pre(15), DEC});
}

// The chunked form's boundaries (64 tokens a chunk), from both parities, each followed by
// two decode steps; and a long prefill.
static void test_real_chunk_bounds(void) {
    for (int p0 : {64, 1001})
        for (int T : {63, 64, 65, 127, 128, 129, 200}) run_case(REAL, p0, {pre(T), DEC, DEC});
    if (!quick) run_case(REAL, 5, {pre(4096), DEC});
}

// Smaller geometries: dk 32/64/256 (k_gdn_recur's 8-token staging at 256; KPT 8,
// 16, 64 in k_gdn_step), dv 32..256 (cw = dv/4 columns per cluster block: 8..64),
// one v-head per q/k head, four per q/k head, dk != dv.
static void test_small_shapes(void) {
    const geo geos[] = {{2, 4, 32, 32}, {2, 4, 64, 64}, {4, 4, 64, 32}, {1, 4, 32, 128}, {1, 2, 256, 64}, {2, 2, 128, 256}};
    const int Ts[] = {1, 2, 7, 8, 9, 15, 16, 17, 33, 100};
    for (const geo &G : geos) {
        for (int p0 : {2, 5})
            for (int T : Ts) run_case(G, p0, {pre(T), DEC, DEC});
        run_case(G, 1, {DEC, pre(40), DEC, pre(3), DEC});
    }
}

// --time: the recurrence of one layer's T-token prefill at the real shape, the serial
// kernel (the backend's rg = 8, c = 2) against the chunked form's two phases (events,
// the median of 15 launches). A benchmark, not a check: nothing fails on speed.
static float time_ms(const std::function<void()> &f) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int r = 0; r < 16; r++) {
        CK(cudaEventRecord(a));
        f();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float x = 0;
        CK(cudaEventElapsedTime(&x, a, b));
        if (r) ms.push_back(x); // the first is a warm-up
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}
// An in-kernel timeline (gdc_tl or gdc_tlb, rows of GDC_TL_MARKS stamps): cleared, one launch, read back.
template <class Sym>
static std::vector<unsigned long long> timeline(Sym &sym, int rows, const std::function<void()> &launch) {
    std::vector<unsigned long long> tl((size_t)rows * GDC_TL_MARKS, 0);
    CK(cudaMemcpyToSymbol(sym, tl.data(), sizeof(unsigned long long) * tl.size()));
    launch();
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpyFromSymbol(tl.data(), sym, sizeof(unsigned long long) * tl.size()));
    return tl;
}
// For each of the marks, the median over the first n rows of (the mark - the row's first stamp), in us.
static void print_medians(const std::vector<unsigned long long> &tl, int n, const char *const *names, const std::vector<int> &marks) {
    for (int m : marks) {
        std::vector<double> v;
        for (int r = 0; r < n; r++)
            v.push_back(1e-3 * (double)(tl[(size_t)r * GDC_TL_MARKS + m] - tl[(size_t)r * GDC_TL_MARKS]));
        std::sort(v.begin(), v.end());
        printf(" %s %.2f", names[m], v[v.size() / 2]);
    }
    printf("\n");
}
static void time_prefill(int T) {
    const geo G = REAL;
    inputs in;
    make_inputs(G, T, in);
    gpu_bufs d(G, T);
    d.qkv.put(in.qkv);
    d.bb.put(in.bb);
    d.ba.put(in.ba);
    d.convw.put(in.convw);
    d.A_log.put(in.A_log);
    d.dt_bias.put(in.dt_bias);
    d.nw.put(in.nw);
    CK(cudaMemset(d.conv2.p, 0, sizeof(float) * d.conv2.n));
    CK(cudaMemset(d.ssm.p, 0, sizeof(float) * d.ssm.n));
    CK(cudaMemset(d.pos.p, 0, sizeof(int)));
    launch_conv(G, d, T);
    launch_prep(G, d, T);
    CK(cudaDeviceSynchronize());
    dim3 g;
    int rg = 8, c = 2;
    const gdn_recur_fn recur = gdn_recur_kernel(G.dk, rg, c, G.Hv, G.dv, &g);
    const float t_serial = time_ms([&] {
        recur<<<g, 128>>>(d.conv_out.p, G.CD(), G.KD(), G.Hk, G.Hv, G.dv, d.beta.p, d.decay.p, d.ssm.p, d.o.p, T);
        CKL();
    });
    CK(gdn_chunk_launch(d.conv_out.p, G.CD(), G.KD(), G.Hk, G.Hv, d.beta.p, d.lgd.p, d.ssm.p, d.o.p, T, d.scratch.p, 0));
    const int nch = (T + gdc::L - 1) / gdc::L;
    const size_t nc = (size_t)nch * (size_t)G.Hv * gdc::L;
    float *U = d.scratch.p, *W = U + nc * gdc::DK, *M = W + nc * gdc::DK, *Gc = M + nc * gdc::L;
    const int hb = gdn_chunk_hb(G.Hk, G.Hv);
    auto phase_a = [&](int h) { // h v-heads a block
        if (h == 2)
            k_gdn_chunk_a<2><<<dim3((unsigned)nch, (unsigned)(G.Hv / 2)), gdc::NTA, gdc::smem_a(2)>>>(
                d.conv_out.p, G.CD(), G.KD(), G.Hk, G.Hv, d.beta.p, d.lgd.p, T, U, W, M, Gc);
        else
            k_gdn_chunk_a<1><<<dim3((unsigned)nch, (unsigned)G.Hv), gdc::NTA, gdc::smem_a(1)>>>(
                d.conv_out.p, G.CD(), G.KD(), G.Hk, G.Hv, d.beta.p, d.lgd.p, T, U, W, M, Gc);
        CKL();
    };
    auto phase_b = [&] {
        k_gdn_chunk_b<<<dim3((unsigned)G.Hv, (unsigned)(gdc::DK / gdc::CW)), gdc::NTB, gdc::smem_b>>>(
            d.conv_out.p, G.CD(), G.KD(), G.Hk, G.Hv, U, W, M, Gc, d.ssm.p, d.o.p, T);
        CKL();
    };
    const float t_a1 = time_ms([&] { phase_a(1); });
    const float t_a = time_ms([&] { phase_a(hb); });
    const float t_b = time_ms(phase_b);
    const float t_all = time_ms([&] {
        CK(gdn_chunk_launch(d.conv_out.p, G.CD(), G.KD(), G.Hk, G.Hv, d.beta.p, d.lgd.p, d.ssm.p, d.o.p, T, d.scratch.p, 0));
    });
    // phase A's timeline: thread 0's stamps, us from the block's start, the median over blocks
    for (int h : {hb, 1}) {
        const auto tl = timeline(gdc_tl, GDC_TL_BLOCKS, [&] { phase_a(h); });
        const int nb = std::min(GDC_TL_BLOCKS, nch * G.Hv / h);
        printf("  phase A timeline, %d head(s) a block, T=%d (us from its start, median of %d blocks):", h, T, nb);
        const char *names[8] = {"", "q/k in", "products", "rhs 0", "solve 0", "rhs 1", "solve 1", "end"};
        print_medians(tl, nb, names, h == 2 ? std::vector<int>{1, 2, 3, 4, 5, 6, 7} : std::vector<int>{1, 2, 3, 4, 7});
    }
    { // phase B's timeline: block (0, 0)'s thread 0, us from each chunk's start, the median over its chunks
        const auto tl = timeline(gdc_tlb, GDC_TL_CHUNKS, phase_b);
        const int nc2 = std::min(GDC_TL_CHUNKS, nch);
        printf("  phase B timeline, T=%d (us from a chunk's start, median of %d chunks):", T, nc2);
        const char *names[8] = {"", "barrier A", "W S0, Q S0, D", "k rows in", "barrier B", "K^T D", "barrier C", "M D, o out"};
        print_medians(tl, nc2, names, {1, 2, 3, 4, 5, 6, 7});
    }
    printf("time T=%5d: serial k_gdn_recur<rg 8, c 2> %8.1f us; chunked %8.1f us (phase A %8.1f [%d heads a block; one: %8.1f], "
           "phase B %8.1f): %.2fx\n", T, 1e3 * t_serial, 1e3 * t_all, 1e3 * t_a, hb, 1e3 * t_a1, 1e3 * t_b, t_serial / t_all);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--chunk")) use_chunk = true;
        else if (!strcmp(argv[i], "--time")) do_time = true;
        else {
            fprintf(stderr, "usage: test_gdn [--quick] [--chunk] [--time]\n");
            return 2;
        }
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) { fprintf(stderr, "no CUDA device\n"); return 2; }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s (sm_%d%d)%s\n", prop.name, prop.major, prop.minor, quick ? "  --quick: T = 2048 skipped" : "");
    printf("bars: o and state max|err|/max|ref| <= %.0e; conv state exact; stages %.0e relative, gates %.0e absolute\n",
           TOL_O, TOL_STAGE, TOL_GATE);
    if (do_time) {
        for (int T : {16, 64, 128, 256, 1024, 4096, 16384}) time_prefill(T);
        return 0;
    }
    if (use_chunk) { // the chunked prefill (the decode steps between and after are k_gdn_step's)
        printf("prefill: the chunked form (k_gdn_chunk_a, k_gdn_chunk_b)\n");
        TEST(test_real_prefill);
        TEST(test_real_chunks);
        TEST(test_real_chunk_bounds);
    }
    const int shapes[][2] = {{8, 2}, {4, 1}, {8, 1}, {16, 2}, {16, 1}};
    for (int si = 0; si < (use_chunk ? 0 : 5); si++) {
        recur_rg = shapes[si][0];
        recur_c = shapes[si][1];
        TEST(test_real_prefill);
        if (si == 0) TEST(test_real_decode); // the decode kernel does not depend on rg, c
        TEST(test_real_chunks);
        TEST(test_small_shapes);
    }
    printf("cases: %d run, %d failed\n", cases_run, cases_failed);
    if (fused_cases) printf("k_conv with the prep fused: %d segment(s), byte for byte k_conv + k_gdn_prep\n", fused_cases);
    const int rc = check_summary();
    printf("%s\n", rc ? "FAIL" : "PASS");
    return rc;
}
