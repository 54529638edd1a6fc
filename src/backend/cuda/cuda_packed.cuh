// cuda_packed.cuh — 4-bit weights in tensor-core fragment order (the decode GEMV
// that reads them, k_gemv, is in cuda_gemv.cuh), and the one-token MoE down
// projection k_moe_down.
//
// Why: a decode GEMV streams every weight once, and on the plain MLX layout the
// CUDA cores spend ~3 instructions per weight (unpack, convert, FMA): the
// kernels ended up instruction-bound at ~20% of the memory bandwidth. Repacked
// once at load, a warp reads a 16-row x 64-column group as one fully coalesced
// 512-byte load (16 bytes per lane) whose 32-bit words are exactly the A
// fragments of four bf16 mma.m16n8k16 (one per 16 columns; the prefill GEMM,
// cuda_gemm.cuh, unpacks them with a shift, a mask and a bf16x2 subtraction)
// and, masked with 0x0F0F0F0F, of two s8 mma.m16n8k32 (the decode GEMV below,
// one instruction per four codes); the scale/bias pairs of the 16 rows are one
// 64-byte load. Codes stay exact either way; the tensor cores do the multiplies.
//
// Layout, per expert e, row block rb (16 rows, zero-padded), group G (64 columns):
//   pk [((e*RB + rb)*ng + G)*32 + lane]: uint4, word ks = columns 64G+16ks .. +15
//   word ks of lane (g = lane>>2, t = lane&3), with r0 = 16rb+g, c0 = 64G+16ks+2t:
//     bits 4i (low code) and 16+4i (high code) of fragment register a_i:
//     a0 = (r0, c0|c0+1), a1 = (r0+8, c0|c0+1), a2 = (r0, c0+8|c0+9), a3 = (r0+8, c0+8|c0+9)
//   psb[((e*RB + rb)*ng + G)*16 + r] = bf16 scale | bf16 bias << 16 of row 16rb+r.
#pragma once
#include "cuda_gemm.cuh"
#include "cuda_gemv.cuh"     // k_gemv, which reads this layout
#include "cuda_moe_dec.cuh" // MOE_KMAX, phase A, k_moe_split

__host__ __device__ inline bool pk_ok(const dmat &W) {
    return W.type == 0 && W.bits == 4 && W.group == 64 && W.cols % 64 == 0;
}

// One uint4 of pk (and one psb entry for lanes < 16) per thread, from the MLX layout.
__global__ void k_repack4(dmat W, int64_t RB, uint4 *pk, uint32_t *psb) {
    const int64_t ng = W.cols / 64, wpr = W.cols / 8;
    const int64_t n = (int64_t)W.n_experts * RB * ng * 32;
    const uint16_t *sb = (const uint16_t *)W.s, *bb = (const uint16_t *)W.b;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int lane = (int)(i & 31), g = lane >> 2, t = lane & 3;
        const int64_t blk = i >> 5, G = blk % ng, erb = blk / ng, rb = erb % RB, e = erb / RB;
        const int64_t row0 = e * W.stride; // the expert's first row in the MLX tensor
        uint32_t out[4];
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            uint32_t w = 0;
#pragma unroll
            for (int a = 0; a < 4; a++) {
                const int64_t r = 16 * rb + g + (a & 1) * 8, c = 64 * G + 16 * ks + 2 * t + (a >> 1) * 8;
                if (r < W.rows) {
                    const uint32_t word = W.q[(row0 + r) * wpr + c / 8];
                    const uint32_t lo = (word >> (4 * (c % 8))) & 15u, hi = (word >> (4 * (c % 8) + 4)) & 15u;
                    w |= lo << (4 * a) | hi << (16 + 4 * a);
                }
            }
            out[ks] = w;
        }
        pk[i] = make_uint4(out[0], out[1], out[2], out[3]);
        if (lane < 16) {
            const int64_t r = 16 * rb + lane;
            psb[blk * 16 + lane] = r < W.rows ? (uint32_t)sb[(row0 + r) * ng + G] | (uint32_t)bb[(row0 + r) * ng + G] << 16 : 0u;
        }
    }
}

// The MoE output of one token, added to the residual stream in one kernel:
//   x[h] += sigmoid(sg) * (Ws · swiglu(shgu))[h] + Σ_k topw[k] * (Wd[topi[k]] · swiglu(gu_k))[h]
// Wd (stacked experts) and Ws (the shared expert) packed, both of I columns
// (MG*8 groups at most). One block per 16 rows h: it stages the K+1 SwiGLU
// inputs once, loads every source's 16 x I block at once (warp w takes groups
// w, w+8, ...; the shared expert's before the predecessor wait, the routed ones
// as soon as topi is known), and sums each row in the combine's order. No
// arrival counter, no per-expert output buffer, and each row has one writer.
// Dynamic shared memory: the K+1 staged sources.
__host__ __device__ inline size_t moe_down_smem(int64_t I, int K) {
    return 16 * (size_t)(K + 1) * (size_t)(I / 4 + (I / 32 + 3) / 4);
}
template <int MG>
struct moe_dn_regs { // a row block's weights, per source (slot MOE_KMAX: the shared expert)
    uint4 pq[MOE_KMAX + 1][MG];
    uint32_t ps[MOE_KMAX + 1][MG];
};
// Source slot s's 16 x I block rb of W into registers (W: one expert's view).
template <int MG>
__device__ __forceinline__ void moe_down_load(moe_dn_regs<MG> &R, int s, const dmat &W, int64_t rb, int64_t ng) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < MG; i++) {
        const int64_t G = warp + 8 * i;
        if (G < ng) {
            R.pq[s][i] = __ldg(W.pk + (rb * ng + G) * 32 + lane);
            R.ps[s][i] = __ldg(W.psb + (rb * ng + G) * 16 + g + 8 * (t & 1));
        }
    }
}
// The rest for row block rb once its weights are in R: stage the K+1 inputs
// (routed slot k: swiglu of gu + 2kI when `swiglu`, else the row rin + kI as
// it is; the shared expert: swiglu of shgu), the products, and
// x[h] += tw[K] * shared + Σ_k tw[k] * routed_k, in that order.
template <int MG>
__device__ __forceinline__ void moe_down_rows(const moe_dn_regs<MG> &R, int64_t rb, int64_t rows, int64_t I,
                                              const float *rin, bool swiglu, const float *shgu, const float *tw, int K,
                                              uint4 *msm, float (*part)[MOE_KMAX + 1][17], float *x) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int64_t ng = I / 64, srcw = I / 4 + (I / 32 + 3) / 4; // uint4 per staged source
    const int64_t nq = I / 4, total = (int64_t)(K + 1) * nq;
    for (int64_t i0 = 0; i0 < total; i0 += 256) { // whole warps per round
        const int64_t i = i0 + tid;
        const bool in = i < total;
        const int s = in ? (int)(i / nq) : 0;
        const int64_t q = in ? i % nq : 0;
        const bool sw = s == K || swiglu;
        const float *row = s == K ? shgu : swiglu ? rin + (int64_t)s * 2 * I : rin + (int64_t)s * I;
        float4 v = make_float4(0, 0, 0, 0);
        if (in && sw) { // SwiGLU as k_gemv stages it (precise expf)
            const float4 a = *(const float4 *)(row + 4 * q), b = *(const float4 *)(row + I + 4 * q);
            v = make_float4(a.x / (1.0f + expf(-a.x)) * b.x, a.y / (1.0f + expf(-a.y)) * b.y,
                            a.z / (1.0f + expf(-a.z)) * b.z, a.w / (1.0f + expf(-a.w)) * b.w);
        } else if (in) {
            v = __ldcg((const float4 *)(row + 4 * q)); // L2: rows another block of the same grid may have written
        }
        uint4 *base = msm + (int64_t)s * srcw;
        pk_stage4(v, q, in, base, (float *)(base + I / 4));
    }
    __syncthreads();
    // source s (staged input s) with the registers of slot (compile-time after unrolling)
    auto source = [&](int slot, int s) {
        const uint4 *base = msm + (int64_t)s * srcw;
        float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll
        for (int i = 0; i < MG; i++) {
            const int64_t G = warp + 8 * i;
            if (G < ng) pk_group(R.pq[slot][i], R.ps[slot][i], base, ((const float2 *)(base + I / 4))[G], G, g, t, acc0, acc1);
        }
        if (t == 0) {
            part[warp][s][g] = acc0;
            part[warp][s][g + 8] = acc1;
        }
    };
#pragma unroll
    for (int k = 0; k < MOE_KMAX; k++)
        if (k < K) source(k, k);
    source(MOE_KMAX, K);
    __syncthreads();
    if (tid < 16) {
        auto ye = [&](int s) { // source s's output of this row: its warps' parts in order
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < 8; w++) v += part[w][s][tid];
            return v;
        };
        float a = tw[K] * ye(K);
        for (int k = 0; k < K; k++) a += tw[k] * ye(k);
        const int64_t h = rb * 16 + tid;
        if (h < rows) x[h] += a;
    }
    __syncthreads(); // msm and part are reused by the block's next row block
}
template <int MG>
__global__ void __launch_bounds__(256) k_moe_down(dmat Wd, dmat Ws, const float *gu, const float *shgu, int64_t I,
                                                     const int *topi, const float *topw, const float *sg, int K, float *x) {
    extern __shared__ __align__(16) uint4 msm[]; // per source: int8 pieces (I/4 uint4), {Σx, σ} per group (padded)
    __shared__ float part[8][MOE_KMAX + 1][17];
    __shared__ int ti[MOE_KMAX];
    __shared__ float tw[MOE_KMAX + 1];
    const int tid = threadIdx.x;
    const int64_t ng = I / 64, rb = blockIdx.x;
    moe_dn_regs<MG> R;
    moe_down_load(R, MOE_KMAX, Ws, rb, ng); // the shared expert: source K, kept in the last slot
    pdl_trigger();
    pdl_wait();
    if (tid < K) ti[tid] = topi[tid];
    if (tid <= K) tw[tid] = tid < K ? topw[tid] : 1.0f / (1.0f + expf(-*sg));
    __syncthreads();
#pragma unroll
    for (int k = 0; k < MOE_KMAX; k++)
        if (k < K) moe_down_load(R, k, dmat_expert(Wd, ti[k]), rb, ng);
    moe_down_rows(R, rb, Wd.rows, I, gu, true, shgu, tw, K, msm, part, x);
}

// Whether k_moe_split serves a layer's gate/up (with k_moe_down's test on its down
// projections): packed gate/up of H <= 2048 columns.
static inline bool moe_split_ok(const dmat &Wg, const dmat &Wu, int64_t H, int64_t I, int K, int E) {
    return Wg.pk && Wu.pk && Wg.cols == H && Wu.cols == H && Wg.rows == I && Wu.rows == I && H <= 64 * 2 * MOE_AG &&
           I % 32 == 0 && E <= 256 && K >= 1 && K <= MOE_KMAX;
}

// Whether k_moe_down serves a layer: packed experts and shared expert of the same width.
static inline int moe_down_mg(const dmat &Wd, const dmat &Ws, int K) {
    if (!Wd.pk || !Ws.pk || Wd.cols != Ws.cols || Wd.rows != Ws.rows || K > MOE_KMAX) return 0;
    const int64_t ng = Wd.cols / 64;
    return ng <= 8 ? 1 : ng <= 16 ? 2 : 0;
}
