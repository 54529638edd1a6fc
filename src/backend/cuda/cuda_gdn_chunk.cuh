// cuda_gdn_chunk.cuh — the gated delta rule of a prefill in chunks of 64 tokens, its
// products on the tensor cores (the chunked "WY" form), for every prefill call (a prompt's
// piece of up to CHUNK tokens) of GDN_CHUNK_MIN = 128 tokens or more: 2x the serial kernel
// at 1k-16k tokens, +5-6% on a whole 1k/4k/32k prefill (docs/perf.md).
//
// The serial kernel (k_gdn_recur) runs, per value head j and token t,
//   d_t = beta_t (v_t - a_t S^T k_t),   S = a_t S + k_t d_t^T,   o_t = S^T q_t
// (S: dk x dv, a_t = exp(g_t) the decay), one token after another: ~230 instructions a
// token on one warp per scheduler (docs/perf.md). Over a chunk of L tokens from
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
// gates, and the triangular solve for [U | W] in blocks of 16 rows (the off-diagonal
// sums on the tensor cores, the 16-row triangles by forward substitution). Phase B
// (k_gdn_chunk_b, one block per head and 32 state columns, serial over the chunks): D,
// O and the new state, four products per chunk, the next chunk's operands loading
// meanwhile.
//
// Precision: every product is 3xTF32 on mma.sync m16n8k8 (see gdc::mma3: ~2^-19
// relative, f32-faithful like the serial kernel: o and the state within ~1e-5 of the
// double reference); the decays come as exp of differences of the log-decay sums (never
// a ratio of two underflowing products); the triangles are solved in f32.
//
// Shapes: dk = dv = 128 (the model's), L = 64. Scratch per layer call: U, W
// [chunks][Hv][64][128], M [chunks][Hv][64][64], the log-decay sums [chunks][Hv][64].
// test_gdn --chunk checks both phases on the device (every length, chunk boundaries, a
// 4k prefill), test_gdn --time times them against the serial kernel. Without a GPU, the
// CUDA emulator (tests/cuda/emu, whose mma.h carries the instruction's fragment map)
// runs both phases in CI (test_gdn_chunk_emu.cc): built with -DLILAC_CUEMU.
#pragma once
#include <stdint.h>

// GDC_TIMELINE (test_gdn's build only): phase A's thread 0 stamps the global timer at each of its
// steps into gdc_tl[block][mark] (test_gdn --time prints the medians over blocks).
#if defined(GDC_TIMELINE) && !defined(LILAC_CUEMU)
constexpr int GDC_TL_BLOCKS = 4096, GDC_TL_CHUNKS = 256, GDC_TL_MARKS = 8;
__device__ unsigned long long gdc_tl[GDC_TL_BLOCKS][GDC_TL_MARKS];
#define GDC_MARK(i)                                                                                                     \
    do {                                                                                                                \
        const unsigned b_ = blockIdx.y * gridDim.x + blockIdx.x;                                                        \
        if (threadIdx.x == 0 && b_ < GDC_TL_BLOCKS) gdc_tl[b_][i] = gtimer();                                           \
    } while (0)
// Phase B: block (0, 0)'s thread 0 at each step of each chunk c < GDC_TL_CHUNKS into gdc_tlb[c][mark].
__device__ unsigned long long gdc_tlb[GDC_TL_CHUNKS][GDC_TL_MARKS];
#define GDC_MARKB(c, i)                                                                                                 \
    do {                                                                                                                \
        if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && (c) < GDC_TL_CHUNKS) gdc_tlb[c][i] = gtimer();     \
    } while (0)
#else
#define GDC_MARK(i) ((void)0)
#define GDC_MARKB(c, i) ((void)0)
#endif

#ifdef LILAC_CUEMU // the emulator's copies land at once; its mma.h stands in for the tensor cores
#include "mma.h" // (pdl_wait and the cp.async stand-ins: the emulator's cuda_runtime.h)
#define GDC_SMEM(name) float *const name = reinterpret_cast<float *>(cuemu::dyn_smem)
#else
#include <atomic>

#include "cuda_common.cuh"
#define GDC_SMEM(name) extern __shared__ __align__(128) float name[]
#endif

namespace gdc {
constexpr int L = 64;       // tokens per chunk
constexpr int DK = 128;     // key dim = value dim
constexpr int CW = 32;      // phase B: state columns per block
constexpr int NTA = 256;    // phase A: threads per block (8 warps)
constexpr int NTB = 256;    // phase B: 8 warps, two per scheduler (1.07x over 4: docs/perf.md)
// Row strides in shared memory (floats), chosen so that every fragment load below is free
// of bank conflicts: a tile read as A row by row, or as B with its columns stored as rows
// (ldA, ldBt: lane (g, t) reads row g, column t), wants a stride of 4 mod 32; a tile read
// as B row by row, or as A stored transposed (ldB, ldAt: row t, column g), 8 mod 32.
constexpr int LQ = DK + 4;  // 132: q, k (phase A) and W, q (phase B) rows
constexpr int LK = DK + 8;  // 136: phase B's k rows (K^T as A)
constexpr int LA = L + 4;   // 68: the 64 x 64 matrices (A, M)
constexpr int LC = CW + 8;  // 40: phase B's 32-column blocks (S, U and D as B)
constexpr int LX = 2 * DK + 8; // 264: phase A's solve, [U | W] (as B), over Ks and Qs (2 L LQ floats)
static_assert(L * LX <= 2 * L * LQ, "phase A: X fits over Ks and Qs");
constexpr size_t smem_a(int hb) { return sizeof(float) * (2 * L * LQ + hb * (L * LA + 3 * L)); } // phase A, hb heads a block
constexpr size_t smem_b = sizeof(float) * (DK * LC + 2 * (L * LQ + L * LA + L * LC + L) + L * LQ + L * LK + L * LC);

// The products: mma.sync m16n8k8 with tf32 operands and f32 accumulation, each operand
// split x = hi + lo (hi: x with its low 13 bits cleared, exactly a tf32; lo = x - hi,
// exact in f32, which the tensor core reads truncated to tf32), hi.hi, lo.hi and hi.lo
// into three accumulators (acc3; one MMA per step of 8 on each dependency chain, so a
// warp has three times the products in flight), summed hi + (lo.hi + hi.lo) at the end:
// ~2^-19 relative per product. Fragment map
// (PTX ISA; g = lane / 4, t = lane % 4): A 16 x 8: (g, t), (g + 8, t), (g, t + 4),
// (g + 8, t + 4); B 8 x 8: (t, g), (t + 4, g); C 16 x 8: (g, 2t), (g, 2t + 1),
// (g + 8, 2t), (g + 8, 2t + 1).
struct fragA {
    uint32_t h[4], l[4];
};
struct fragB {
    uint32_t h[2], l[2];
};
__device__ __forceinline__ void split(float v, uint32_t &h, uint32_t &l) {
    const uint32_t u = __float_as_uint(v) & 0xffffe000u;
    h = u;
    l = __float_as_uint(v - __uint_as_float(u));
}
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef LILAC_CUEMU
    cuemu::mma_m16n8k8_tf32(d, a, b);
#else
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
struct acc3 {
    float h[4], a[4], b[4]; // hi.hi, lo.hi, hi.lo
    __device__ __forceinline__ float v(int i) const { return h[i] + (a[i] + b[i]); }
    __device__ __forceinline__ void set(int i, float x) { h[i] = x, a[i] = 0.0f, b[i] = 0.0f; }
};
__device__ __forceinline__ void mma3(acc3 &c, const fragA &a, const fragB &b) {
    mma(c.a, a.l, b.h);
    mma(c.b, a.h, b.l);
    mma(c.h, a.h, b.h);
}
// A (16 x 8) at p, row-major: A(m, k) = p[m ld + k]
__device__ __forceinline__ void ldA(fragA &f, const float *p, int ld, int g, int t) {
    split(p[g * ld + t], f.h[0], f.l[0]);
    split(p[(g + 8) * ld + t], f.h[1], f.l[1]);
    split(p[g * ld + t + 4], f.h[2], f.l[2]);
    split(p[(g + 8) * ld + t + 4], f.h[3], f.l[3]);
}
// A (16 x 8) stored transposed at p: A(m, k) = p[k ld + m]
__device__ __forceinline__ void ldAt(fragA &f, const float *p, int ld, int g, int t) {
    split(p[t * ld + g], f.h[0], f.l[0]);
    split(p[t * ld + g + 8], f.h[1], f.l[1]);
    split(p[(t + 4) * ld + g], f.h[2], f.l[2]);
    split(p[(t + 4) * ld + g + 8], f.h[3], f.l[3]);
}
// B (8 x 8) at p, row-major: B(k, n) = p[k ld + n]
__device__ __forceinline__ void ldB(fragB &f, const float *p, int ld, int g, int t) {
    split(p[t * ld + g], f.h[0], f.l[0]);
    split(p[(t + 4) * ld + g], f.h[1], f.l[1]);
}
// B (8 x 8) stored transposed at p: B(k, n) = p[n ld + k]
__device__ __forceinline__ void ldBt(fragB &f, const float *p, int ld, int g, int t) {
    split(p[g * ld + t], f.h[0], f.l[0]);
    split(p[g * ld + t + 4], f.h[1], f.l[1]);
}
__device__ __forceinline__ void prefetch_l2(const float *p) {
#ifndef LILAC_CUEMU
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
    (void)p;
#endif
}
__device__ __forceinline__ float4 ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ void st4(float *p, float4 v) { *reinterpret_cast<float4 *>(p) = v; }
__device__ __forceinline__ float2 ld2(const float *p) { return *reinterpret_cast<const float2 *>(p); }
__device__ __forceinline__ void st2(float *p, float x, float y) { *reinterpret_cast<float2 *>(p) = make_float2(x, y); }
} // namespace gdc

// Phase A. Grid (chunks, Hv / HB), gdc::NTA threads, gdc::smem_a(HB) bytes (two blocks per SM).
// Inputs as k_gdn_recur's (conv_out after k_gdn_prep: q, k normalised, q scaled) plus lgd,
// the log decays [T][Hv]. Writes U, W, M and Gc (the inclusive log-decay sums) of chunk c,
// head j at c * Hv + j; rows past the last token are zero (Gc there: the chunk's total).
// M's tiles above the diagonal (16 x 16) are not written: phase B copies them but never uses them.
// A block serves HB v-heads of one q/k head (HB = 2 where Hv / Hk is even, as in the model): their
// K K^T and Q K^T are the same products, so it loads q and k and runs the products once, then masks
// and decays them per head and solves the heads one after the other (the second head's K rows for
// its right-hand side from global memory: the first head's solve is laid over Ks).
template <int HB>
__global__ void __launch_bounds__(gdc::NTA, 2)
    k_gdn_chunk_a(const float *conv_out, int64_t CD, int64_t KD, int Hk, int Hv, const float *beta, const float *lgd,
                  int T, float *U, float *W, float *M, float *Gc) {
    using namespace gdc;
    GDC_SMEM(gsm);
    float *const Ks = gsm, *const Qs = Ks + L * LQ, *const As = Qs + L * LQ; // As [HB][L][LA]: the solves' matrices A
    float *const Gs = As + HB * L * LA, *const Bs = Gs + HB * L, *const Bg = Bs + HB * L; // [HB][L]: G, beta, beta gamma
    pdl_wait();
    GDC_MARK(0);
    const int c = blockIdx.x, j0 = blockIdx.y * HB, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int t0 = c * L, n = T - t0 < L ? T - t0 : L, hk = j0 / (Hv / Hk);
    // Every load is issued before any result is needed: warp h's decays and betas (head j0 + h),
    // the chunk's v rows into L2 (read after the products, one 128-byte line a thread), q and k.
    const int ta = 2 * lane, tb = ta + 1;
    float a0 = 0.0f, a1 = 0.0f, ba = 0.0f, bb = 0.0f;
    if (warp < HB) {
        const int j = j0 + warp;
        if (ta < n) a0 = lgd[(int64_t)(t0 + ta) * Hv + j], ba = beta[(int64_t)(t0 + ta) * Hv + j];
        if (tb < n) a1 = lgd[(int64_t)(t0 + tb) * Hv + j], bb = beta[(int64_t)(t0 + tb) * Hv + j];
    }
#pragma unroll
    for (int h = 0; h < HB; h++)
        if (tid / 4 < n) prefetch_l2(conv_out + (int64_t)(t0 + tid / 4) * CD + 2 * KD + (int64_t)(j0 + h) * DK + 32 * (tid & 3));
#pragma unroll
    for (int i = tid; i < L * (DK / 4); i += NTA) {
        const int t = i / (DK / 4), e = (i % (DK / 4)) * 4;
        float4 q = make_float4(0.f, 0.f, 0.f, 0.f), k = q;
        if (t < n) {
            const float *row = conv_out + (int64_t)(t0 + t) * CD;
            q = ld4(row + (int64_t)hk * DK + e);
            k = ld4(row + KD + (int64_t)hk * DK + e);
        }
        st4(Qs + t * LQ + e, q);
        st4(Ks + t * LQ + e, k);
    }
    if (warp < HB) { // Gs = inclusive sums of the log decays (two tokens a lane), Bs = beta
        float s = a0 + a1;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float u = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += u;
        }
        float *const G = Gs + warp * L, *const B = Bs + warp * L, *const BG = Bg + warp * L;
        G[ta] = s - a1;
        G[tb] = s;
        B[ta] = ba;
        B[tb] = bb;
        BG[ta] = ba * expf(s - a1);
        BG[tb] = bb * expf(s);
    }
    __syncthreads();
    GDC_MARK(1);
    // K K^T and Q K^T, the ten 16 x 16 tiles on and below the diagonal (row tile rt, column
    // tile tj <= rt, numbered row by row): warp w takes tiles w and w + 8; then, per head, the
    // masks and decays on the accumulators, A into As and M out
#pragma unroll 1
    for (int idx = warp; idx < 10; idx += NTA / 32) {
        const int rt = idx >= 6 ? 3 : idx >= 3 ? 2 : idx >= 1 ? 1 : 0, tj = idx - rt * (rt + 1) / 2, r0 = 16 * rt;
        acc3 kk2[2] = {}, qk2[2] = {}; // K K^T, Q K^T
#pragma unroll 4
        for (int kk = 0; kk < DK / 8; kk++) {
            fragA fk, fq;
            ldA(fk, Ks + r0 * LQ + kk * 8, LQ, g, t4);
            ldA(fq, Qs + r0 * LQ + kk * 8, LQ, g, t4);
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                fragB fb; // B(k, s) = K[s][k]
                ldBt(fb, Ks + (16 * tj + 8 * nt) * LQ + kk * 8, LQ, g, t4);
                mma3(kk2[nt], fk, fb);
                mma3(qk2[nt], fq, fb);
            }
        }
#pragma unroll
        for (int hh = 0; hh < HB; hh++) {
            const float *const G = Gs + hh * L, *const B = Bs + hh * L;
            float *const A = As + hh * L * LA, *const Mo = M + ((int64_t)c * Hv + j0 + hh) * L * L;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int h = 0; h < 2; h++) { // rows g and g + 8
                    const int r = r0 + g + 8 * h, s = 16 * tj + 8 * nt + 2 * t4;
                    float mv[2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float dec = s + e <= r ? expf(G[r] - G[s + e]) : 0.0f;
                        A[r * LA + s + e] = s + e < r ? B[r] * dec * kk2[nt].v(2 * h + e) : 0.0f;
                        mv[e] = dec * qk2[nt].v(2 * h + e);
                    }
                    st2(Mo + r * L + s, mv[0], mv[1]);
                }
        }
    }
    // (I + A) X = R, R = [beta V | beta gamma K] (64 x 256; X = [U | W]), in blocks of 16 rows
    // over Ks and Qs (rows 32.. over Qs, free after the products; rows ..31 over Ks, once
    // every thread holds its part of R):
    //   X_i = (I + A_ii)^-1 (R_i - sum_{j<i} A_ij X_j)
    // the sums on the tensor cores, the 16-row triangles by forward substitution, one
    // column per thread. Warp w owns columns 32w.. of the sums and of the triangles, so
    // once R is in place the solve needs the warp's own synchronisation only.
    float *const X = gsm; // [L][LX]: rows 0..31 over Ks, rows 32..63 over Qs exactly
    __syncthreads(); // every product done (Qs free), As complete
    GDC_MARK(2);
    // R in 16-byte pieces, coalesced: thread tid takes rows tid / 32 + 8 m (m < 8), columns
    // 4 (tid % 32).. of V (global) and of K (Ks for the first head; global, after the first
    // head's solve went over Ks, for the others), all 16 loads in flight at once (one
    // load a column and token takes 17 us of a 40 us block: docs/perf.md)
    const int rr = tid >> 5, e4 = 4 * (tid & 31);
#pragma unroll 1
    for (int hh = 0; hh < HB; hh++) {
        const int j = j0 + hh;
        const float *const B = Bs + hh * L, *const BG = Bg + hh * L, *const A = As + hh * L * LA;
        float4 v[L / 8], k[L / 8];
#pragma unroll
        for (int m = 0; m < L / 8; m++) {
            const int t = rr + 8 * m;
            const float *const row = conv_out + (int64_t)(t0 + (t < n ? t : 0)) * CD;
            const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
            v[m] = t < n ? ld4(row + 2 * KD + (int64_t)j * DK + e4) : z;
            k[m] = hh == 0 ? ld4(Ks + t * LQ + e4) : t < n ? ld4(row + KD + (int64_t)hk * DK + e4) : z;
        }
        __syncthreads(); // every read of Ks (first head) or of the last head's X done
#pragma unroll
        for (int m = 0; m < L / 8; m++) {
            const int t = rr + 8 * m;
            const float b = B[t], bg = BG[t];
            st4(X + t * LX + e4, make_float4(b * v[m].x, b * v[m].y, b * v[m].z, b * v[m].w));
            st4(X + t * LX + DK + e4, make_float4(bg * k[m].x, bg * k[m].y, bg * k[m].z, bg * k[m].w));
        }
        __syncthreads(); // R in place
        GDC_MARK(3 + 2 * hh);
#pragma unroll 1
        for (int i = 0; i < L / 16; i++) {
            if (i > 0) { // X_i -= A_i,<i X_<i: rows 16i.., the warp's 32 columns
                acc3 p[4] = {};
#pragma unroll 1
                for (int kk = 0; kk < 2 * i; kk++) {
                    fragA fa;
                    ldA(fa, A + 16 * i * LA + kk * 8, LA, g, t4);
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        fragB fb;
                        ldB(fb, X + kk * 8 * LX + 32 * warp + 8 * nt, LX, g, t4);
                        mma3(p[nt], fa, fb);
                    }
                }
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    float *const xa = X + (16 * i + g) * LX + 32 * warp + 8 * nt + 2 * t4, *const xb = xa + 8 * LX;
                    const float2 u = ld2(xa), v = ld2(xb);
                    st2(xa, u.x - p[nt].v(0), u.y - p[nt].v(1));
                    st2(xb, v.x - p[nt].v(2), v.y - p[nt].v(3));
                }
                __syncwarp();
            }
            float x[16]; // the triangle, column tid
#pragma unroll
            for (int a = 0; a < 16; a++) x[a] = X[(16 * i + a) * LX + tid];
#pragma unroll
            for (int a = 1; a < 16; a++) {
                const float *arow = A + (16 * i + a) * LA + 16 * i;
                float p0 = x[a], p1 = 0.0f;
#pragma unroll
                for (int b = 0; b < a; b++) {
                    if (b & 1) p1 -= arow[b] * x[b];
                    else p0 -= arow[b] * x[b];
                }
                x[a] = p0 + p1;
            }
#pragma unroll
            for (int a = 0; a < 16; a++) X[(16 * i + a) * LX + tid] = x[a];
            __syncwarp();
        }
        GDC_MARK(4 + 2 * hh);
        __syncthreads(); // X complete (each warp solved its own 32 columns)
        const int64_t cj = (int64_t)c * Hv + j;
#pragma unroll 4
        for (int i = tid; i < L * (2 * DK / 4); i += NTA) { // a warp: half a row, all U or all W
            const int t = i / (2 * DK / 4), cc = (i % (2 * DK / 4)) * 4;
            st4((cc < DK ? U : W) + (cj * L + t) * DK + (cc & (DK - 1)), ld4(X + t * LX + cc));
        }
        if (tid < L) Gc[cj * L + tid] = Gs[hh * L + tid];
    }
    GDC_MARK(7);
}

// Phase B. Grid (Hv, 128 / gdc::CW), gdc::NTB threads, gdc::smem_b bytes; serial over the
// chunks of T tokens. Reads phase A's U, W, M, Gc and conv_out's q, k; updates the state
// ssm [Hv][dk][dv] in place and writes o [T][Hv * dv] as k_gdn_recur does.
// Per chunk, warp w (row tile rt = w % 4, column half w / 4 of the 32 columns): W S0 and
// Q S0 (rows 16 rt.., from the same fragments of S0), D = U - W S0 written over U and,
// times exp(G_L - G), into Dp; (barrier) the new state gamma_L S0 + K^T Dp (rows 16w..,
// all 32 columns, in registers); (barrier) the new state into Ss, O = diag(gamma) Q S0 +
// M D (M's lower tiles only), O out. Loads overlap the products by cp.async: chunk
// c + 1's W, M, U and log-decay sums (double-buffered) from the first barrier on, its q
// rows from the second, its k rows from the third (each once this chunk's are read).
__global__ void __launch_bounds__(gdc::NTB, 1)
    k_gdn_chunk_b(const float *conv_out, int64_t CD, int64_t KD, int Hk, int Hv, const float *U, const float *W,
                  const float *M, const float *Gc, float *ssm, float *o, int T) {
    using namespace gdc;
    GDC_SMEM(gsm);
    float *const Ss = gsm;              // the state's 32 columns [DK][LC]
    float *const Wb = Ss + DK * LC;     // [2][L][LQ]
    float *const Mb = Wb + 2 * L * LQ;  // [2][L][LA]
    float *const Ub = Mb + 2 * L * LA;  // [2][L][LC]: U's columns, then D
    float *const Gb = Ub + 2 * L * LC;  // [2][L]
    float *const Qr = Gb + 2 * L;       // q rows [L][LQ]
    float *const Kr = Qr + L * LQ;      // k rows [L][LK]
    float *const Dp = Kr + L * LK;      // diag(exp(G_L - G)) D [L][LC]
    pdl_wait();
    const int j = blockIdx.x, col0 = blockIdx.y * CW, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3, hk = j / (Hv / Hk), rt = warp & 3, n0 = 2 * (warp >> 2);
    const int64_t VD = (int64_t)Hv * DK;
    const int nch = (T + L - 1) / L, r0 = 16 * rt;
    float *const Sg = ssm + (int64_t)j * DK * DK + col0;
    // chunk c's W, M, U columns and log-decay sums into buffer b: one commit group
    auto issue_wmu = [&](int c, int b) {
        const int64_t cj = (int64_t)c * Hv + j;
        for (int i = tid; i < L * (DK / 4); i += NTB) {
            const int t = i / (DK / 4), e = (i % (DK / 4)) * 4;
            cp_async16(Wb + (b * L + t) * LQ + e, W + (cj * L + t) * DK + e, true);
        }
        for (int i = tid; i < L * (L / 4); i += NTB) {
            const int t = i / (L / 4), e = (i % (L / 4)) * 4;
            cp_async16(Mb + (b * L + t) * LA + e, M + (cj * L + t) * L + e, true);
        }
        for (int i = tid; i < L * (CW / 4); i += NTB) {
            const int t = i / (CW / 4), e = (i % (CW / 4)) * 4;
            cp_async16(Ub + (b * L + t) * LC + e, U + (cj * L + t) * DK + col0 + e, true);
        }
        if (tid < L / 4) cp_async16(Gb + b * L + 4 * tid, Gc + cj * L + 4 * tid, true);
        cp_async_commit();
    };
    // chunk c's q rows (off 0) or k rows (off KD) into dst (zero past the last token): one
    // commit group; an empty one past the last chunk keeps the count
    auto issue_rows = [&](int c, float *dst, int ld, int64_t off) {
        const int t0 = c * L, n = T - t0 < L ? T - t0 : L;
        if (c < nch)
            for (int i = tid; i < L * (DK / 4); i += NTB) {
                const int t = i / (DK / 4), e = (i % (DK / 4)) * 4;
                const float *row = conv_out + (int64_t)(t0 + (t < n ? t : 0)) * CD + off + (int64_t)hk * DK;
                cp_async16(dst + t * ld + e, row + e, t < n);
            }
        cp_async_commit();
    };
    for (int i = tid; i < DK * (CW / 4); i += NTB) {
        const int r = i / (CW / 4), e = (i % (CW / 4)) * 4;
        st4(Ss + r * LC + e, ld4(Sg + (int64_t)r * DK + e));
    }
    issue_wmu(0, 0);
    issue_rows(0, Qr, LQ, 0);
    issue_rows(0, Kr, LK, KD);
#pragma unroll 1
    for (int c = 0; c < nch; c++) {
        const int b = c & 1, t0 = c * L, n = T - t0 < L ? T - t0 : L;
        // pending: chunk c's W, M, U, G, then its q, then its k
        GDC_MARKB(c, 0);
        cp_async_wait<1>();
        __syncthreads(); // (A) everyone's W, M, U, G, q (and, first time round, S); buffer b ^ 1 free
        GDC_MARKB(c, 1);
        if (c + 1 < nch) issue_wmu(c + 1, b ^ 1);
        else cp_async_commit(); // (an empty group keeps the count)
        const float *const Wc = Wb + b * L * LQ, *const Mc = Mb + b * L * LA, *const Gs = Gb + b * L;
        float *const Dc = Ub + b * L * LC;
        const float GL = Gs[n - 1], ga = Gs[r0 + g], gb = Gs[r0 + g + 8];
        // W S0 and Q S0 (rows 16 rt.., the warp's 16 columns) from the same fragments of S0;
        // D = U - W S0 out, Q S0 kept for O (scaled by gamma below)
        acc3 oa[2] = {};
        {
            acc3 p[2] = {};
#pragma unroll 2
            for (int kk = 0; kk < DK / 8; kk++) {
                fragA fw, fq;
                ldA(fw, Wc + r0 * LQ + kk * 8, LQ, g, t4);
                ldA(fq, Qr + r0 * LQ + kk * 8, LQ, g, t4);
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    fragB fb;
                    ldB(fb, Ss + kk * 8 * LC + 8 * (n0 + nt), LC, g, t4);
                    mma3(p[nt], fw, fb);
                    mma3(oa[nt], fq, fb);
                }
            }
            const float ea = expf(GL - ga), eb = expf(GL - gb);
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const int ia = (r0 + g) * LC + 8 * (n0 + nt) + 2 * t4, ib = ia + 8 * LC;
                const float2 ua = ld2(Dc + ia), ub = ld2(Dc + ib);
                const float d0 = ua.x - p[nt].v(0), d1 = ua.y - p[nt].v(1);
                const float d2 = ub.x - p[nt].v(2), d3 = ub.y - p[nt].v(3);
                st2(Dc + ia, d0, d1);
                st2(Dc + ib, d2, d3);
                st2(Dp + ia, d0 * ea, d1 * ea);
                st2(Dp + ib, d2 * eb, d3 * eb);
            }
        }
        GDC_MARKB(c, 2);
        cp_async_wait<1>(); // this thread's k rows
        GDC_MARKB(c, 3);
        __syncthreads();    // (B) everyone's, and D, Dp; every read of q done
        GDC_MARKB(c, 4);
        issue_rows(c + 1, Qr, LQ, 0);
        // the new state, gamma_L S0 + K^T Dp (rows 16w..), kept in registers until every
        // warp has read S0
        acc3 sn[4];
        const float gl = expf(GL);
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const int ia = (16 * warp + g) * LC + 8 * nt + 2 * t4;
            const float2 x = ld2(Ss + ia), y = ld2(Ss + ia + 8 * LC);
            sn[nt].set(0, gl * x.x);
            sn[nt].set(1, gl * x.y);
            sn[nt].set(2, gl * y.x);
            sn[nt].set(3, gl * y.y);
        }
#pragma unroll 4
        for (int kk = 0; kk < L / 8; kk++) {
            fragA fa; // A(i, s) = K[s][i]
            ldAt(fa, Kr + kk * 8 * LK + 16 * warp, LK, g, t4);
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                fragB fb;
                ldB(fb, Dp + kk * 8 * LC + 8 * nt, LC, g, t4);
                mma3(sn[nt], fa, fb);
            }
        }
        GDC_MARKB(c, 5);
        __syncthreads(); // (C) every read of S0 and k done
        GDC_MARKB(c, 6);
        issue_rows(c + 1, Kr, LK, KD);
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const int ia = (16 * warp + g) * LC + 8 * nt + 2 * t4;
            st2(Ss + ia, sn[nt].v(0), sn[nt].v(1));
            st2(Ss + ia + 8 * LC, sn[nt].v(2), sn[nt].v(3));
        }
        const float qa = expf(ga), qb = expf(gb);
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            oa[nt].set(0, qa * oa[nt].v(0));
            oa[nt].set(1, qa * oa[nt].v(1));
            oa[nt].set(2, qb * oa[nt].v(2));
            oa[nt].set(3, qb * oa[nt].v(3));
        }
        // O += M D: M is zero above the diagonal, so row tile rt needs columns < 16 (rt + 1)
#pragma unroll 1
        for (int kk = 0; kk < 2 * rt + 2; kk++) {
            fragA fa;
            ldA(fa, Mc + r0 * LA + kk * 8, LA, g, t4);
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                fragB fb;
                ldB(fb, Dc + kk * 8 * LC + 8 * (n0 + nt), LC, g, t4);
                mma3(oa[nt], fa, fb);
            }
        }
        float *const orow = o + (int64_t)(t0 + r0 + g) * VD + (int64_t)j * DK + col0 + 8 * n0 + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            if (r0 + g < n) st2(orow + 8 * nt, oa[nt].v(0), oa[nt].v(1));
            if (r0 + g + 8 < n) st2(orow + 8 * VD + 8 * nt, oa[nt].v(2), oa[nt].v(3));
        }
        GDC_MARKB(c, 7);
    }
    cp_async_wait<0>();
    __syncthreads(); // the last state stored by every warp
    for (int i = tid; i < DK * (CW / 4); i += NTB) {
        const int r = i / (CW / 4), e = (i % (CW / 4)) * 4;
        st4(Sg + (int64_t)r * DK + e, ld4(Ss + r * LC + e));
    }
}

// Whether the chunked form serves a layer's shape.
static inline bool gdn_chunk_ok(int dk, int dv, int Hk, int Hv) {
    return dk == gdc::DK && dv == gdc::DK && Hk > 0 && Hv % Hk == 0;
}
// Phase A's v-heads a block: two where a q/k head has an even number of them (its products shared).
static inline int gdn_chunk_hb(int Hk, int Hv) { return (Hv / Hk) % 2 == 0 ? 2 : 1; }
// Scratch floats for T tokens: U and W, M, the log-decay sums.
static inline size_t gdn_chunk_scratch(int T, int Hv) {
    const size_t nc = (size_t)((T + gdc::L - 1) / gdc::L) * (size_t)Hv * gdc::L;
    return nc * (2 * gdc::DK + gdc::L + 1);
}
// The two phases on stream st (plain launches; the kernels' shared-memory opt-in is set here once per
// device, as attn_prefill_go does). scratch: gdn_chunk_scratch(T, Hv) floats.
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
        e = cudaFuncSetAttribute(k_gdn_chunk_a<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gdc::smem_a(1));
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(k_gdn_chunk_a<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gdc::smem_a(2));
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
    const int hb = gdn_chunk_hb(Hk, Hv);
    const dim3 ga((unsigned)nch, (unsigned)(Hv / hb));
    e = hb == 2 ? cudaLaunchKernel(k_gdn_chunk_a<2>, ga, dim3(gdc::NTA), aa, gdc::smem_a(2), st)
                : cudaLaunchKernel(k_gdn_chunk_a<1>, ga, dim3(gdc::NTA), aa, gdc::smem_a(1), st);
    if (e != cudaSuccess) return e;
    const float *Uc = U, *Wc = W, *Mc = M, *Gcc = Gc;
    void *ab[] = {(void *)&conv_out, &CD, &KD, &Hk, &Hv, (void *)&Uc, (void *)&Wc, (void *)&Mc, (void *)&Gcc, &ssm, &o, &T};
    e = cudaLaunchKernel(k_gdn_chunk_b, dim3((unsigned)Hv, (unsigned)(gdc::DK / gdc::CW)), dim3(gdc::NTB), ab, gdc::smem_b, st);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}
