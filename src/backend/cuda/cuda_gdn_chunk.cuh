// cuda_gdn_chunk.cuh — the gated delta rule of a prefill in chunks of 64 tokens, its
// products on the tensor cores (the chunked "WY" form; opt-in: LILAC_GDN_CHUNK=1).
//
// The serial kernel (k_gdn_recur) runs, per value head j and token t,
//   d_t = beta_t (v_t - a_t S^T k_t),   S = a_t S + k_t d_t^T,   o_t = S^T q_t
// (S: dk x dv, a_t = exp(g_t) the decay), one token after another: ~230 instructions a
// token on one warp per scheduler (docs/perf.md, run 72). Over a chunk of L tokens from
// the state S0, with G_t = g_1 + .. + g_t (so gamma_t = exp(G_t)), unrolling gives
//   S_t = gamma_t S0 + sum_{s<=t} exp(G_t - G_s) k_s d_s^T,
// and the d_t solve one lower-triangular system,
//   (I + A) D = diag(beta) V - diag(beta gamma) K S0,
//   A[t][s] = beta_t exp(G_t - G_s) k_t.k_s  (s < t),
// so D = U - W S0 with U = (I + A)^-1 diag(beta) V and W = (I + A)^-1 diag(beta gamma) K,
// which depend on the chunk's inputs only. Then
//   O   = diag(gamma) Q S0 + M D,   M[t][s] = exp(G_t - G_s) q_t.k_s  (s <= t),
//   S_L = gamma_L S0 + K'^T D,      K'[s] = exp(G_L - G_s) k_s.
// Phase A (k_gdn_chunk_a, every chunk and head at once): K K^T and Q K^T, the masks and
// gates, and the triangular solve for [U | W] (forward substitution, one column per
// thread, in registers). Phase B (k_gdn_chunk_b, one block per head and 32 state
// columns, serial over the chunks): D, O and the new state, three products per chunk,
// the next chunk's operands loading meanwhile.
//
// Precision: every product is 3xTF32 (each operand split hi + lo in tf32, lo.hi + hi.lo
// + hi.hi, f32 accumulation: ~2^-21 relative, f32-faithful like the serial kernel); the
// decays come as exp of differences of the log-decay sums (never a ratio of two
// underflowing products); the solve is f32. The products use WMMA (m16n16k8 tf32),
// whose fragments are loaded from f32 tiles in shared memory and split element by
// element (the split does not depend on the fragment layout).
//
// Shapes: dk = dv = 128 (the model's), L = 64. Scratch per layer call: U, W
// [chunks][Hv][64][128], M [chunks][Hv][64][64], the log-decay sums [chunks][Hv][64].
// Not yet run on a GPU (written in session 10; docs/perf.md); the serial kernel stays
// the default until test_gdn --chunk and a benchmark say otherwise. Without a GPU, the
// CUDA emulator (tests/cuda/emu, with its WMMA stand-in) runs both phases in CI
// (test_gdn_chunk_emu.cc): built with -DLILAC_CUEMU.
#pragma once
#include <mma.h>

#ifdef LILAC_CUEMU // the emulator's copies land at once
__device__ __forceinline__ void pdl_wait() {}
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    if (valid) memcpy(smem, gmem, 16);
    else memset(smem, 0, 16);
}
__device__ __forceinline__ void cp_async_commit() {}
template <int N> __device__ __forceinline__ void cp_async_wait() {}
#define GDC_SMEM(name) float *const name = reinterpret_cast<float *>(cuemu::dyn_smem)
#else
#include <atomic>

#include "cuda_common.cuh"
#define GDC_SMEM(name) extern __shared__ __align__(128) float name[]
#endif

namespace gdc {
using namespace nvcuda;
constexpr int L = 64;        // tokens per chunk
constexpr int DK = 128;      // key dim = value dim
constexpr int LD = DK + 4;   // floats per 128-wide row in shared memory
constexpr int LA = L + 4;    // floats per 64-wide row
constexpr int CW = 32;       // phase B: state columns per block
constexpr int LC = CW + 4;   // floats per 32-wide row
constexpr int NT = 128;      // threads per block (4 warps)
constexpr size_t smem_a = sizeof(float) * (3 * L * LD + 2 * L * LA + 2 * L);
constexpr size_t smem_b = sizeof(float) * (DK * LC + 2 * (L * LD + L * LA + L * LC + L) + 2 * L * LD + 2 * L * LC);

typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa_row;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fa_col;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fb_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fb_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 8, float> facc;

// A fragment loaded from f32 (in hi) as hi + lo tf32 parts, times sign.
template <class F>
__device__ __forceinline__ void split(F &hi, F &lo, float sign = 1.0f) {
#pragma unroll
    for (int i = 0; i < hi.num_elements; i++) {
        const float v = sign * hi.x[i], h = wmma::__float_to_tf32(v);
        hi.x[i] = h;
        lo.x[i] = wmma::__float_to_tf32(v - h);
    }
}
template <class FA, class FB>
__device__ __forceinline__ void mma3(facc &c, const FA &ah, const FA &al, const FB &bh, const FB &bl) {
    wmma::mma_sync(c, al, bh, c);
    wmma::mma_sync(c, ah, bl, c);
    wmma::mma_sync(c, ah, bh, c);
}
// c += sign A B over nk steps of 8: A a 16-row tile, row-major (lda), B 16 columns,
// row-major (ldb), both f32 in shared memory.
__device__ __forceinline__ void mma3_rr(facc &c, const float *A, int lda, const float *B, int ldb, int nk, float sign = 1.0f) {
#pragma unroll 4
    for (int kk = 0; kk < nk; kk++) {
        fa_row ah, al;
        wmma::load_matrix_sync(ah, A + kk * 8, lda);
        split(ah, al, sign);
        fb_row bh, bl;
        wmma::load_matrix_sync(bh, B + kk * 8 * ldb, ldb);
        split(bh, bl);
        mma3(c, ah, al, bh, bl);
    }
}
__device__ __forceinline__ float4 ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ void st4(float *p, float4 v) { *reinterpret_cast<float4 *>(p) = v; }
__device__ __forceinline__ float4 mul4(float4 v, float s) { return make_float4(v.x * s, v.y * s, v.z * s, v.w * s); }
} // namespace gdc

// Phase A. Grid (chunks, Hv), gdc::NT threads, gdc::smem_a bytes. Inputs as k_gdn_recur's
// (conv_out after k_gdn_prep: q, k normalised, q scaled) plus lgd, the log decays [T][Hv].
// Writes U, W, M and Gc (the inclusive log-decay sums) of chunk c, head j at c * Hv + j;
// rows past the last token are zero (Gc there: the chunk's total).
__global__ void __launch_bounds__(gdc::NT, 1)
    k_gdn_chunk_a(const float *conv_out, int64_t CD, int64_t KD, int Hk, int Hv, const float *beta, const float *lgd,
                  int T, float *U, float *W, float *M, float *Gc) {
    using namespace gdc;
    GDC_SMEM(gsm);
    float *const Ks = gsm, *const Qs = Ks + L * LD, *const Vs = Qs + L * LD; // Qs later holds W, Vs U
    float *const KK = Vs + L * LD, *const QK = KK + L * LA, *const Gs = QK + L * LA, *const Bs = Gs + L;
    pdl_wait();
    const int c = blockIdx.x, j = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int t0 = c * L, n = T - t0 < L ? T - t0 : L, hk = j / (Hv / Hk);
    for (int i = tid; i < L * (DK / 4); i += NT) {
        const int t = i / (DK / 4), e = (i % (DK / 4)) * 4;
        float4 q = make_float4(0.f, 0.f, 0.f, 0.f), k = q, v = q;
        if (t < n) {
            const float *row = conv_out + (int64_t)(t0 + t) * CD;
            q = ld4(row + (int64_t)hk * DK + e);
            k = ld4(row + KD + (int64_t)hk * DK + e);
            v = ld4(row + 2 * KD + (int64_t)j * DK + e);
        }
        st4(Qs + t * LD + e, q);
        st4(Ks + t * LD + e, k);
        st4(Vs + t * LD + e, v);
    }
    if (warp == 0) { // Gs = inclusive sums of the log decays (two tokens a lane), Bs = beta
        const int ta = 2 * lane, tb = ta + 1;
        const float a0 = ta < n ? lgd[(int64_t)(t0 + ta) * Hv + j] : 0.0f, a1 = tb < n ? lgd[(int64_t)(t0 + tb) * Hv + j] : 0.0f;
        float s = a0 + a1;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float u = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += u;
        }
        Gs[ta] = s - a1;
        Gs[tb] = s;
        Bs[ta] = ta < n ? beta[(int64_t)(t0 + ta) * Hv + j] : 0.0f;
        Bs[tb] = tb < n ? beta[(int64_t)(t0 + tb) * Hv + j] : 0.0f;
    }
    __syncthreads();
    // K K^T and Q K^T, lower tiles only: warp w computes row tile w
#pragma unroll 1
    for (int tj = 0; tj < 4; tj++) {
        facc ck, cq;
        wmma::fill_fragment(ck, 0.0f);
        wmma::fill_fragment(cq, 0.0f);
        if (tj <= warp) {
#pragma unroll 4
            for (int kk = 0; kk < DK / 8; kk++) {
                fb_col bh, bl; // B = K^T: B[k][s] = K[s][k], K's rows as columns
                wmma::load_matrix_sync(bh, Ks + tj * 16 * LD + kk * 8, LD);
                split(bh, bl);
                fa_row ah, al;
                wmma::load_matrix_sync(ah, Ks + warp * 16 * LD + kk * 8, LD);
                split(ah, al);
                mma3(ck, ah, al, bh, bl);
                wmma::load_matrix_sync(ah, Qs + warp * 16 * LD + kk * 8, LD);
                split(ah, al);
                mma3(cq, ah, al, bh, bl);
            }
        }
        wmma::store_matrix_sync(KK + warp * 16 * LA + tj * 16, ck, LA, wmma::mem_row_major);
        wmma::store_matrix_sync(QK + warp * 16 * LA + tj * 16, cq, LA, wmma::mem_row_major);
    }
    __syncthreads();
    // A (into KK) and M (into QK): the masks and the decays between tokens
    for (int i = tid; i < L * L; i += NT) {
        const int t = i / L, s = i % L;
        const float dec = s <= t ? expf(Gs[t] - Gs[s]) : 0.0f;
        KK[t * LA + s] = s < t ? Bs[t] * dec * KK[t * LA + s] : 0.0f;
        QK[t * LA + s] = dec * QK[t * LA + s];
    }
    // the right-hand sides [beta V | beta gamma K] into Vs and Qs (Q is not needed again here)
    for (int i = tid; i < L * (DK / 4); i += NT) {
        const int t = i / (DK / 4), e = (i % (DK / 4)) * 4;
        st4(Vs + t * LD + e, mul4(ld4(Vs + t * LD + e), Bs[t]));
        st4(Qs + t * LD + e, mul4(ld4(Ks + t * LD + e), Bs[t] * expf(Gs[t])));
    }
    __syncthreads();
    // (I + A) X = B by forward substitution: thread tid solves column tid of U (Vs) and of W
    // (Qs) in registers, two partial sums per row for two independent FMA chains each
    const int64_t cj = (int64_t)c * Hv + j;
    {
        float x[L], y[L];
#pragma unroll
        for (int t = 0; t < L; t++) {
            x[t] = Vs[t * LD + tid];
            y[t] = Qs[t * LD + tid];
        }
#pragma unroll
        for (int t = 1; t < L; t++) {
            float x0 = x[t], x1 = 0.0f, y0 = y[t], y1 = 0.0f;
#pragma unroll
            for (int s = 0; s < t; s++) {
                const float a = KK[t * LA + s];
                if (s & 1) {
                    x1 -= a * x[s];
                    y1 -= a * y[s];
                } else {
                    x0 -= a * x[s];
                    y0 -= a * y[s];
                }
            }
            x[t] = x0 + x1;
            y[t] = y0 + y1;
        }
        float *const Uo = U + cj * L * DK + tid, *const Wo = W + cj * L * DK + tid;
#pragma unroll
        for (int t = 0; t < L; t++) {
            Uo[t * DK] = x[t];
            Wo[t * DK] = y[t];
        }
    }
    for (int i = tid; i < L * (L / 4); i += NT) {
        const int t = i / (L / 4), e = (i % (L / 4)) * 4;
        st4(M + (cj * L + t) * L + e, ld4(QK + t * LA + e));
    }
    if (tid < L) Gc[cj * L + tid] = Gs[tid];
}

// Phase B. Grid (Hv, 128 / gdc::CW), gdc::NT threads, gdc::smem_b bytes; serial over the
// chunks of T tokens. Reads phase A's U, W, M, Gc and conv_out's q, k; updates the state
// ssm [Hv][dk][dv] in place and writes o [T][Hv * dv] as k_gdn_recur does.
// Loads overlap the products: chunk c + 1's W, M, U and log-decay sums (double-buffered)
// and chunk c's raw q and k rows come by cp.async while D = U - W S is computed; the
// decays are applied to D's rows (K'^T D = K^T (diag(exp(G_L - G)) D)) and to O's rows
// (diag(gamma) Q S) instead of to the q and k rows, so those are copied as they are.
__global__ void __launch_bounds__(gdc::NT, 1)
    k_gdn_chunk_b(const float *conv_out, int64_t CD, int64_t KD, int Hk, int Hv, const float *U, const float *W,
                  const float *M, const float *Gc, float *ssm, float *o, int T) {
    using namespace gdc;
    GDC_SMEM(gsm);
    float *const Ss = gsm;              // the state's 32 columns [DK][LC]
    float *const Wb = Ss + DK * LC;     // [2][L][LD]
    float *const Mb = Wb + 2 * L * LD;  // [2][L][LA]
    float *const Ub = Mb + 2 * L * LA;  // [2][L][LC]: U's columns, then D
    float *const Gb = Ub + 2 * L * LC;  // [2][L]
    float *const Qr = Gb + 2 * L;       // q rows [L][LD]
    float *const Kr = Qr + L * LD;      // k rows [L][LD]
    float *const Dp = Kr + L * LD;      // diag(exp(G_L - G)) D [L][LC]
    float *const Oc = Dp + L * LC;      // [L][LC]
    pdl_wait();
    const int j = blockIdx.x, col0 = blockIdx.y * CW, tid = threadIdx.x, warp = tid >> 5;
    const int hk = j / (Hv / Hk);
    const int64_t VD = (int64_t)Hv * DK;
    float *const Sg = ssm + (int64_t)j * DK * DK + col0;
    // chunk c's W, M, U columns and log-decay sums into buffer b: one commit group
    auto issue_wmu = [&](int c, int b) {
        const int64_t cj = (int64_t)c * Hv + j;
        for (int i = tid; i < L * (DK / 4); i += NT) {
            const int t = i / (DK / 4), e = (i % (DK / 4)) * 4;
            cp_async16(Wb + (b * L + t) * LD + e, W + (cj * L + t) * DK + e, true);
        }
        for (int i = tid; i < L * (L / 4); i += NT) {
            const int t = i / (L / 4), e = (i % (L / 4)) * 4;
            cp_async16(Mb + (b * L + t) * LA + e, M + (cj * L + t) * L + e, true);
        }
        for (int i = tid; i < L * (CW / 4); i += NT) {
            const int t = i / (CW / 4), e = (i % (CW / 4)) * 4;
            cp_async16(Ub + (b * L + t) * LC + e, U + (cj * L + t) * DK + col0 + e, true);
        }
        if (tid < L / 4) cp_async16(Gb + b * L + 4 * tid, Gc + cj * L + 4 * tid, true);
        cp_async_commit();
    };
    // chunk c's q and k rows (zero past the last token): one commit group
    auto issue_qk = [&](int c) {
        const int t0 = c * L, n = T - t0 < L ? T - t0 : L;
        for (int i = tid; i < L * (DK / 4); i += NT) {
            const int t = i / (DK / 4), e = (i % (DK / 4)) * 4;
            const float *row = conv_out + (int64_t)(t0 + (t < n ? t : 0)) * CD;
            cp_async16(Qr + t * LD + e, row + (int64_t)hk * DK + e, t < n);
            cp_async16(Kr + t * LD + e, row + KD + (int64_t)hk * DK + e, t < n);
        }
        cp_async_commit();
    };
    for (int i = tid; i < DK * (CW / 4); i += NT) {
        const int r = i / (CW / 4), e = (i % (CW / 4)) * 4;
        st4(Ss + r * LC + e, ld4(Sg + (int64_t)r * DK + e));
    }
    const int nch = (T + L - 1) / L;
    issue_wmu(0, 0);
#pragma unroll 1
    for (int c = 0; c < nch; c++) {
        const int b = c & 1, t0 = c * L, n = T - t0 < L ? T - t0 : L;
        // Qr, Kr and buffer b ^ 1 were last read before the previous chunk's last barrier
        issue_qk(c);
        if (c + 1 < nch) issue_wmu(c + 1, b ^ 1);
        else cp_async_commit(); // (an empty group keeps the count)
        cp_async_wait<2>();     // this thread's part of chunk c's W, M, U, G
        __syncthreads();        // everyone's (and, first time round, S)
        const float *const Wc = Wb + b * L * LD, *const Mc = Mb + b * L * LA, *const Gs = Gb + b * L;
        float *const Dc = Ub + b * L * LC;
        const float GL = Gs[n - 1];
        // D = U - W S0: warp w, row tile w, both column tiles
#pragma unroll
        for (int tj = 0; tj < 2; tj++) {
            facc d;
            wmma::load_matrix_sync(d, Dc + warp * 16 * LC + tj * 16, LC, wmma::mem_row_major);
            mma3_rr(d, Wc + warp * 16 * LD, LD, Ss + tj * 16, LC, DK / 8, -1.0f);
            wmma::store_matrix_sync(Dc + warp * 16 * LC + tj * 16, d, LC, wmma::mem_row_major);
        }
        __syncthreads();
        for (int i = tid; i < L * (CW / 4); i += NT) {
            const int t = i / (CW / 4), e = (i % (CW / 4)) * 4;
            st4(Dp + t * LC + e, mul4(ld4(Dc + t * LC + e), expf(GL - Gs[t])));
        }
        cp_async_wait<1>(); // this thread's q and k rows
        __syncthreads();    // everyone's, and Dp
        // the new state, gamma_L S0 + K^T Dp (row tiles 2w, 2w + 1), kept in registers until
        // every warp has read S0
        facc sn[2][2];
        const float gl = expf(GL);
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int bb = 0; bb < 2; bb++) {
                wmma::load_matrix_sync(sn[a][bb], Ss + (2 * warp + a) * 16 * LC + bb * 16, LC, wmma::mem_row_major);
#pragma unroll
                for (int i = 0; i < sn[a][bb].num_elements; i++) sn[a][bb].x[i] *= gl;
            }
#pragma unroll 2
        for (int kk = 0; kk < L / 8; kk++) {
            fb_row bh[2], bl[2];
#pragma unroll
            for (int bb = 0; bb < 2; bb++) {
                wmma::load_matrix_sync(bh[bb], Dp + kk * 8 * LC + bb * 16, LC);
                split(bh[bb], bl[bb]);
            }
#pragma unroll
            for (int a = 0; a < 2; a++) {
                fa_col ah, al; // A = K^T: A[i][s] = K[s][i]
                wmma::load_matrix_sync(ah, Kr + kk * 8 * LD + (2 * warp + a) * 16, LD);
                split(ah, al);
#pragma unroll
                for (int bb = 0; bb < 2; bb++) mma3(sn[a][bb], ah, al, bh[bb], bl[bb]);
            }
        }
        // O = diag(gamma) (Q S0) + M D, in two passes through Oc: warp w, row tile w
#pragma unroll
        for (int tj = 0; tj < 2; tj++) {
            facc oc;
            wmma::fill_fragment(oc, 0.0f);
            mma3_rr(oc, Qr + warp * 16 * LD, LD, Ss + tj * 16, LC, DK / 8);
            wmma::store_matrix_sync(Oc + warp * 16 * LC + tj * 16, oc, LC, wmma::mem_row_major);
        }
        __syncthreads(); // every read of S0 done; Q S0 complete
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int bb = 0; bb < 2; bb++)
                wmma::store_matrix_sync(Ss + (2 * warp + a) * 16 * LC + bb * 16, sn[a][bb], LC, wmma::mem_row_major);
        for (int i = tid; i < L * (CW / 4); i += NT) {
            const int t = i / (CW / 4), e = (i % (CW / 4)) * 4;
            st4(Oc + t * LC + e, mul4(ld4(Oc + t * LC + e), expf(Gs[t])));
        }
        __syncthreads();
#pragma unroll
        for (int tj = 0; tj < 2; tj++) {
            facc oc;
            wmma::load_matrix_sync(oc, Oc + warp * 16 * LC + tj * 16, LC, wmma::mem_row_major);
            mma3_rr(oc, Mc + warp * 16 * LA, LA, Dc + tj * 16, LC, L / 8);
            wmma::store_matrix_sync(Oc + warp * 16 * LC + tj * 16, oc, LC, wmma::mem_row_major);
        }
        __syncthreads();
        for (int i = tid; i < n * (CW / 4); i += NT) {
            const int t = i / (CW / 4), e = (i % (CW / 4)) * 4;
            st4(o + (int64_t)(t0 + t) * VD + (int64_t)j * DK + col0 + e, ld4(Oc + t * LC + e));
        }
        __syncthreads(); // Oc, Qr, Kr and buffer b are written again next round
    }
    cp_async_wait<0>();
    for (int i = tid; i < DK * (CW / 4); i += NT) {
        const int r = i / (CW / 4), e = (i % (CW / 4)) * 4;
        st4(Sg + (int64_t)r * DK + e, ld4(Ss + r * LC + e));
    }
}

// Whether the chunked form serves a layer's shape.
static inline bool gdn_chunk_ok(int dk, int dv, int Hk, int Hv) {
    return dk == gdc::DK && dv == gdc::DK && Hk > 0 && Hv % Hk == 0;
}
// Scratch floats for T tokens: U and W, M, the log-decay sums.
static inline size_t gdn_chunk_scratch(int T, int Hv) {
    const size_t nc = (size_t)((T + gdc::L - 1) / gdc::L) * (size_t)Hv * gdc::L;
    return nc * (2 * gdc::DK + gdc::L + 1);
}
// The two phases on stream st (plain launches; the kernels' shared-memory opt-in is set
// here once per device, as attn_prefill_go does). scratch: gdn_chunk_scratch(T, Hv) floats.
static inline cudaError_t gdn_chunk_launch(const float *conv_out, int64_t CD, int64_t KD, int Hk, int Hv, const float *beta,
                                           const float *lgd, float *ssm, float *o, int T, float *scratch, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    cudaError_t e = cudaSuccess;
#ifndef LILAC_CUEMU
    static std::atomic<unsigned long long> done{0};
    int dev = 0;
    e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    const unsigned long long bit = dev < 64 ? 1ull << dev : 0ull;
    if (!bit || !(done.load(std::memory_order_relaxed) & bit)) {
        e = cudaFuncSetAttribute(k_gdn_chunk_a, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gdc::smem_a);
        if (e == cudaSuccess) e = cudaFuncSetAttribute(k_gdn_chunk_b, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gdc::smem_b);
        if (e != cudaSuccess) return e;
        done.fetch_or(bit, std::memory_order_relaxed);
    }
#endif
    const int nch = (T + gdc::L - 1) / gdc::L;
    const size_t nc = (size_t)nch * (size_t)Hv * gdc::L;
    float *U = scratch, *W = U + nc * gdc::DK, *M = W + nc * gdc::DK, *Gc = M + nc * gdc::L;
    // cudaLaunchKernel rather than <<< >>>, so that the emulator runs this function too
    void *aa[] = {(void *)&conv_out, &CD, &KD, &Hk, &Hv, (void *)&beta, (void *)&lgd, &T, &U, &W, &M, &Gc};
    e = cudaLaunchKernel(k_gdn_chunk_a, dim3((unsigned)nch, (unsigned)Hv), dim3(gdc::NT), aa, gdc::smem_a, st);
    if (e != cudaSuccess) return e;
    const float *Uc = U, *Wc = W, *Mc = M, *Gcc = Gc;
    void *ab[] = {(void *)&conv_out, &CD, &KD, &Hk, &Hv, (void *)&Uc, (void *)&Wc, (void *)&Mc, (void *)&Gcc, &ssm, &o, &T};
    e = cudaLaunchKernel(k_gdn_chunk_b, dim3((unsigned)Hv, (unsigned)(gdc::DK / gdc::CW)), dim3(gdc::NT), ab, gdc::smem_b, st);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}
