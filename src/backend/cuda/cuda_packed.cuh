// cuda_packed.cuh — 4-bit weights in tensor-core fragment order, and the decode
// GEMV that reads them.
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

// Warp slices per row block for inputs of ng groups: each warp takes at least 4
// groups when it can (enough work per set), 8 warps per block.
static inline int gemv_ns(int64_t ng) {
    int ns = 8;
    while (ns > 1 && (ng % ns || ng / ns < 4)) ns >>= 1;
    return ns;
}
__host__ __device__ inline int gemv_rows_per_block(const dmat &W, int ns) { return W.pk ? 16 * (8 / ns) : 8; }

// Shared memory of k_gemv: the staged input of `cols` columns (f32 padded for
// row_dot, the int8 pieces of pk_stage4, {Σx, σ} per group), then `stages`
// weight stages, each one set of the packed layout (8/ns row blocks: codes,
// then scale/bias pairs).
static inline size_t gemv_stage_u4(int64_t cols, int ns) { return (size_t)(8 / ns) * (size_t)(cols / 64) * 36; }
__host__ __device__ inline size_t gemv_xsmem(int64_t cols) {
    return (gemv_smem(cols) + (size_t)cols * 4 + (size_t)cols / 64 * 8 + 15) / 16 * 16;
}
// Blocks of k_gemv per SM the compiler budgets registers for (launch bounds).
// 2: 119 registers, 4 weight stages. 3 (an experiment, bench_gemv3): 80
// registers and 3 stages, so that with a grid of two per SM the next kernel's
// block fits beside and issues its copies before its predecessor ends.
#ifndef GEMV_MINB
#define GEMV_MINB 2
#endif
#define GEMV_SMEM_STAGES (GEMV_MINB >= 3 ? 56u << 10 : 110u << 10) // weight stages per 256 threads
// GEMV_WIDE=1 (an experiment): one block of 512 threads where two of 256 shared a SM. Its
// two halves take the block's sets alternately, each with its own stages and barrier,
// and stage the input once between them (with two blocks a SM, each staged it: run 128,
// 7,300-7,900 cycles where one block alone takes 3,400-3,600).
#ifndef GEMV_WIDE
#define GEMV_WIDE 0
#endif
#define GEMV_SUB (GEMV_WIDE ? 2 : 1)  // 256-thread halves of a block
#define GEMV_THREADS (256 * GEMV_SUB)
static inline int gemv_stages(int64_t cols, int ns) {
    const size_t per = gemv_stage_u4(cols, ns) * 16;
    const size_t n = GEMV_SMEM_STAGES / per;
    return n < 2 ? 2 : n > 4 ? 4 : (int)n;
}

#define TCG_MAX 8

// A timestamp (SM clock, global timer) at point i of blocks 0 and last of
// grid row 0, into prof[b*32 + i] and prof[b*32 + 16 + i]: bench_gemv.cu's
// view of where a launch's time goes. prof null (always, outside the bench): nothing.
__device__ __forceinline__ void gemv_mark(unsigned long long *prof, int i) {
    if (!prof || threadIdx.x != 0 || blockIdx.y != 0 || (blockIdx.x != 0 && blockIdx.x != gridDim.x - 1) || i > 15) return;
    const int b = blockIdx.x == 0 ? 0 : 1;
    prof[b * 32 + i] = clock64();
    prof[b * 32 + 16 + i] = gtimer();
}

// An output row: written, or added to y (the residual stream: one adder per row and
// launch) as a reduction the L2 makes, so that no load round trip comes before the block
// may leave (the same f32 sum, rounded to nearest; run 128 with the two changes beside it).
__device__ __forceinline__ void gemv_store(float *y, float v, int accum) {
    if (accum) atomicAdd(y, v);
    else *y = v;
}

// The one-token GEMV (decode) for a job (see gemv_job). Packed matrices: a
// "set" is 8/NS row blocks of 16 rows; warp w takes row block w % (8/NS) of
// the set and groups w / (8/NS) + NS*i, partial sums meeting in shared memory.
// A block stages its input once and loops over job.upb consecutive sets; the
// sets stream through job.stages shared-memory stages by bulk copies, the first
// ones issued before the block waits for its predecessor kernel (weights do
// not depend on it), and then the next kernel may launch (its blocks start as
// this one's leave: two per SM fill the register file). Where the time goes:
// docs/perf.md, session 4 (per-launch issue and staging latency; the bf16
// products this replaced issued 146 warp instructions per 16 x 64 group).
// Other matrices (8-bit router and shared-expert gate, bf16 checkpoints, 4-bit
// with other group sizes) take one row per warp with row_dot (a set of 8 rows).
// Expert mode (topi != null): blockIdx.y is a routing slot (input row slot /
// x_div, expert topi[slot], or the block's own top-k of job.tk_logits); the
// output row is the slot. The last block runs
// the job's tail (gemv_tail).
template <int XM, int NS>
__global__ void __launch_bounds__(GEMV_THREADS, GEMV_WIDE ? 1 : GEMV_MINB)
    k_gemv(gemv_job job, const float *x, int64_t ldx, int64_t xoff, const int *topi, int x_div) {
    constexpr int RBB = 8 / NS;
    extern __shared__ __align__(16) float xs[];
    __shared__ float red[32];
    __shared__ float part[GEMV_SUB][2][8][17];
    gemv_mark(job.prof, 0);
    // this block's matrix: the start[] compares are independent loads (a search loop would chain them)
    int mi = 0;
#pragma unroll
    for (int i = 1; i < GEMV_MATS; i++) mi += i < job.n && (int)blockIdx.x >= job.start[i];
    dmat W = job.W[mi];
    if (job.x[mi]) { x = job.x[mi]; ldx = job.ldx[mi]; xoff = job.xoff[mi]; }
    int64_t yrow = 0;
    const bool routed = topi && !job.plain[mi];
    if (topi && !routed && blockIdx.y > 0) {
        pdl_trigger();
        pdl_wait();
        gemv_tail_run(job.tail);
        return;
    }
    if (routed) {
        pdl_wait(); // the expert ids come from the previous kernel
        const int slot = blockIdx.y;
        int e;
        if (job.tk_logits) { // the router's top-k, made by every block from the logits (no tail, no launch)
            __shared__ int tki[8];
            __shared__ float tkw[8];
            if (threadIdx.x < 32) topk_warp<8>(job.tk_logits, job.tk_E, job.tk_K, job.tk_norm, tki, tkw, nullptr, 0);
            __syncthreads();
            if (blockIdx.x == 0 && blockIdx.y == 0 && (int)threadIdx.x < job.tk_K) { // for the down projections
                job.tk_topi[threadIdx.x] = tki[threadIdx.x];
                job.tk_topw[threadIdx.x] = tkw[threadIdx.x];
            }
            e = tki[slot];
        } else {
            e = topi[slot];
        }
        W = dmat_expert(W, e);
        x += (int64_t)(slot / x_div) * ldx;
        yrow = slot;
    }
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
    // hs: the half of the block (GEMV_WIDE) that takes sets k = hs, hs + GEMV_SUB, ...; warp: its warp 0-7
    const int hs = GEMV_SUB > 1 ? (tid >> 8) : 0, warp = (tid >> 5) & 7, ltid = tid & 255;
    const int64_t cols = W.cols, ng = cols / 64, blk = blockIdx.x - job.start[mi];
    const bool tc = W.pk != nullptr;
    const int64_t nrb = (W.rows + 15) / 16;
    const int slice = warp / RBB, ngw = (int)(ng / NS);
    const int upb = job.upb > 1 ? job.upb : 1, S = job.stages;
    const int64_t set0 = blk * upb, nset = tc ? (nrb + RBB - 1) / RBB : (W.rows + 7) / 8;
    const int nk = (int)(nset - set0 < upb ? nset - set0 : upb); // >= 1: the grid has no empty blocks
    const int64_t su4 = (int64_t)RBB * ng * 36; // one stage: RBB*ng*32 code uint4, then RBB*ng*4 of scale/bias
    uint4 *stg = (uint4 *)(xs + gemv_xsmem(cols) / sizeof(float)) + (int64_t)hs * S * su4; // this half's stages
    // Copies the half's set number kk (the block's set k = kk GEMV_SUB + hs) into stage
    // kk % S: its thread 0 moves the set's codes and scale/bias pairs (contiguous in the
    // packed layout) by two bulk copies that complete on the stage's mbarrier. (Every lane's own cp.async before, run 128: the same step
    // time, 5-19% slower kernels alone, lm_head 93.9 -> 89.0 us.)
    const int rbl = warp % RBB; // the row block of the set this warp multiplies
    __shared__ uint64_t sbar_all[GEMV_SUB][4]; // stage s's copies (S <= 4), per half
    uint64_t *const sbar = sbar_all[hs];
    if (tc) {
        if (tid == 0) {
            for (int h = 0; h < GEMV_SUB; h++)
                for (int s = 0; s < S; s++) mbar_init(&sbar_all[h][s], 1);
            mbar_fence_init();
        }
        __syncthreads();
    }
    auto issue = [&](int kk) {
        const int k = kk * GEMV_SUB + hs;
        if (ltid == 0 && tc && k < nk) {
            const int64_t rb0 = (set0 + k) * RBB, nr = nrb - rb0 < RBB ? nrb - rb0 : RBB; // >= 1
            uint4 *d = stg + (int64_t)(kk % S) * su4;
            const unsigned cb = (unsigned)(nr * ng * 512), sb = (unsigned)(nr * ng * 64);
            mbar_expect(&sbar[kk % S], cb + sb);
            bulk_g2s(d, W.pk + rb0 * ng * 32, cb, &sbar[kk % S]);
            bulk_g2s(d + (int64_t)RBB * ng * 32, W.psb + rb0 * ng * 16, sb, &sbar[kk % S]);
        }
    };
    for (int kk = 0; kk < S - 1; kk++) issue(kk);
    gemv_mark(job.prof, 1);
    if (!routed) {
        pdl_trigger(); // every block's first copies are in flight: the next kernel may start its own
        pdl_wait();
    } else {
        pdl_trigger();
    }
    gemv_mark(job.prof, 2);

    // Stage the input: f32 (padded, for row_dot), the packed products' int8 pieces, group sums and scales.
    uint4 *xb = (uint4 *)(xs + gemv_smem(cols) / sizeof(float));
    float *xsg = (float *)(xb + cols / 4);
    // x, and the second half (SwiGLU) or the gain (RMSNorm), all loaded in one round trip
    float4 xr[GEMV_STAGE], xu[GEMV_STAGE];
    const int64_t n4 = cols / 4;
#pragma unroll
    for (int u = 0; u < GEMV_STAGE; u++) {
        const int64_t q = tid + (int64_t)u * blockDim.x;
        xr[u] = q < n4 ? *(const float4 *)(x + 4 * q) : make_float4(0, 0, 0, 0);
        if (XM == XM_SWIGLU) xu[u] = q < n4 ? *(const float4 *)(x + xoff + 4 * q) : make_float4(0, 0, 0, 0);
        if (XM == XM_NORM) xu[u] = q < n4 ? __ldg((const float4 *)(job.gain + 4 * q)) : make_float4(0, 0, 0, 0);
    }
    float inv = 1.0f;
    if (XM == XM_NORM) {
        float ss = 0.0f;
#pragma unroll
        for (int u = 0; u < GEMV_STAGE; u++) ss += xr[u].x * xr[u].x + xr[u].y * xr[u].y + xr[u].z * xr[u].z + xr[u].w * xr[u].w;
#ifdef GEMV_STAGE_MARKS // bench_gemv_marks: where the staging's time goes (marks 12-14; sets use 4-11)
        gemv_mark(job.prof, 12); // thread 0's input loads have landed
#endif
        inv = rsqrtf(block_sum(ss, red) / (float)cols + job.eps);
#ifdef GEMV_STAGE_MARKS
        gemv_mark(job.prof, 13); // the block's sum of squares
#endif
    }
#pragma unroll
    for (int u = 0; u < GEMV_STAGE; u++) {
        const int64_t q = tid + (int64_t)u * blockDim.x;
        const bool in = q < n4;
        float v[4] = {xr[u].x, xr[u].y, xr[u].z, xr[u].w};
        if (XM == XM_SWIGLU) {
            const float uu[4] = {xu[u].x, xu[u].y, xu[u].z, xu[u].w};
#pragma unroll
            for (int e = 0; e < 4; e++) v[e] = v[e] / (1.0f + expf(-v[e])) * uu[e];
        }
        if (XM == XM_NORM && in) {
            const float4 g4 = xu[u];
            v[0] *= inv * g4.x; v[1] *= inv * g4.y; v[2] *= inv * g4.z; v[3] *= inv * g4.w;
            if (job.xn_out && blockIdx.x == 0 && blockIdx.y == 0) *(float4 *)(job.xn_out + 4 * q) = make_float4(v[0], v[1], v[2], v[3]);
        }
        const float4 v4 = make_float4(v[0], v[1], v[2], v[3]);
        if (in) *(float4 *)(xs + xs_idx(4 * q)) = v4;
        if (tc) pk_stage4(v4, q, in, xb, xsg); // block-uniform: whole warps
    }
#ifdef GEMV_STAGE_MARKS
    gemv_mark(job.prof, 14); // thread 0's pieces written
#endif
    __syncthreads();
    gemv_mark(job.prof, 3);

    float *y = job.y[mi] + yrow * job.ldy[mi];
    const int accum = job.accum[mi];
    if (!tc) { // one row per warp, 8 rows per set
        for (int k = hs; k < nk; k += GEMV_SUB) {
            const int64_t r = (set0 + k) * 8 + warp;
            float v = r < W.rows ? row_dot(W, r, xs, lane) : 0.0f;
            v = warp_sum(v);
            if (lane == 0 && r < W.rows) gemv_store(y + r, v, accum);
        }
        gemv_tail_run(job.tail);
        return;
    }
    for (int kk = 0, k = hs; k < nk; kk++, k += GEMV_SUB) {
        issue(kk + S - 1); // into the stage every warp of the half read for its set kk-1 (before that set's barrier)
        mbar_wait(&sbar[kk % S], (unsigned)(kk / S) & 1u); // the set's copies have landed
        const uint4 *sw = stg + (int64_t)(k % S) * su4;
        const uint32_t *ssb = (const uint32_t *)(sw + (int64_t)RBB * ng * 32);
        const int64_t rb = (set0 + k) * RBB + rbl;
        float acc0 = 0.0f, acc1 = 0.0f; // rows 16rb+g and +8 (lanes with t == 0)
        if (rb < nrb) {
#pragma unroll
            for (int i = 0; i < TCG_MAX; i++)
                if (i < ngw) {
                    const int64_t G = slice + (int64_t)NS * i;
                    const uint32_t psr = t < 2 ? ssb[(rbl * ng + G) * 16 + g + 8 * t] : 0u; // lanes t < 2: their own copies
                    pk_group(sw[(rbl * ng + G) * 32 + lane], psr, xb, ((const float2 *)xsg)[G], G, g, t, acc0, acc1);
                }
        }
        float (*pt)[17] = part[hs][kk & 1]; // double-buffered: one barrier per set
        if (t == 0) {
            pt[warp][g] = acc0;
            pt[warp][g + 8] = acc1;
        }
        if (GEMV_SUB == 1) __syncthreads();
        else if (hs) asm volatile("bar.sync 2, 256;" ::: "memory"); // the half's warps (immediate ids:
        else asm volatile("bar.sync 1, 256;" ::: "memory");          // a register id reserves all 16)
        if (ltid < 16 * RBB) {
            const int rl = ltid / 16, r = ltid % 16;
            float v = 0.0f;
#pragma unroll
            for (int sl = 0; sl < NS; sl++) v += pt[sl * RBB + rl][r];
            const int64_t row = ((set0 + k) * RBB + rl) * 16 + r;
            if (row < W.rows) gemv_store(y + row, v, accum);
        }
        // pt is rewritten two sets on, after the next barrier, which every reader above passes first
        gemv_mark(job.prof, 4 + k);
    }
    gemv_mark(job.prof, 15);
    gemv_tail_run(job.tail);
}

// The MoE output of one token, added to the residual stream in one kernel:
//   x[h] += sigmoid(sg) * (Ws · swiglu(shgu))[h] + Σ_k topw[k] * (Wd[topi[k]] · swiglu(gu_k))[h]
// Wd (stacked experts) and Ws (the shared expert) packed, both of I columns
// (MG*8 groups at most). One block per 16 rows h: it stages the K+1 SwiGLU
// inputs once, loads every source's 16 x I block at once (warp w takes groups
// w, w+8, ...; the shared expert's before the predecessor wait, the routed ones
// as soon as topi is known), and sums each row in the combine's order. No
// arrival counter, no per-expert output buffer, and each row has one writer.
// The two steps are device functions that k_moe_fused shares.
// Dynamic shared memory: k_moe_down's K+1 staged sources; k_moe_fused's, then its staged H-wide input.
__host__ __device__ inline size_t moe_down_smem(int64_t I, int K) {
    return 16 * (size_t)(K + 1) * (size_t)(I / 4 + (I / 32 + 3) / 4);
}
__host__ __device__ inline size_t moe_fused_smem(int64_t H, int64_t I, int K) {
    return moe_down_smem(I, K) + 16 * (size_t)(H / 4 + (H / 32 + 3) / 4);
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
            v = __ldcg((const float4 *)(row + 4 * q)); // L2: written by other blocks of the same grid (k_moe_fused)
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

// One token's whole MoE block after the router in one cooperative kernel:
// every block makes the top-k from the router logits (E <= 256, K <= 8), then
//   A. gate/up and SwiGLU: unit u = (slot k = u / (I/32), 32 intermediate dims
//      d0 = 32 (u % (I/32))): 2 x 2 row blocks of Wg/Wu[topi[k]] over the
//      staged input xn (warp w: row block w & 3, groups w >> 2, +2, ...),
//      act[k*I + d0 + j] = silu(gate_j) * up_j;
//   a grid barrier (all of act written);
//   B. k_moe_down's rows for row blocks rb = blockIdx.x, + gridDim.x, ...
// The first row block's down weights (and the shared expert's, before the
// predecessor wait) are loaded into registers before A starts, so B's loads
// overlap A. It replaces two launches (the gate/up GEMV with its top-k, and
// k_moe_down) and the time between them. Needs H <= 64 * 2 * MOE_AG columns.
template <int MG>
__global__ void __launch_bounds__(256, 1) k_moe_fused(dmat Wg, dmat Wu, dmat Wd, dmat Ws, const float *xn, int64_t H,
                                                      const float *rlog, int E, int norm, const float *shgu, int64_t I,
                                                      const float *sg, int K, float *act, unsigned *bar, float *x,
                                                      unsigned long long *prof) {
    extern __shared__ __align__(16) uint4 msm[]; // B's staged sources, then A's staged xn
    __shared__ float part[8][MOE_KMAX + 1][17];
    __shared__ int ti[MOE_KMAX];
    __shared__ float tw[MOE_KMAX + 1];
    const int tid = threadIdx.x;
    const int64_t ngd = I / 64, ngu = H / 64, nrb = (H + 15) / 16, upk = I / 32, nA = (int64_t)K * upk;
    uint4 *xa = msm + moe_down_smem(I, K) / 16; // A's input: int8 pieces (H/4 uint4), then {Σx, σ} per group
    moe_dn_regs<MG> R;
    // prof (test_matmul's timing; null in the backend): global time at 6 points per block, prof[i * gridDim.x + block]
    auto mark = [&](int i) { if (prof && tid == 0) prof[i * gridDim.x + blockIdx.x] = gtimer(); };
    mark(0);
    const int64_t rb0 = blockIdx.x;
    if (rb0 < nrb) moe_down_load(R, MOE_KMAX, Ws, rb0, ngd);
    pdl_wait(); // the router's logits, xn and the shared expert's gate/up come from the previous kernel
    if (tid < 32) topk_warp<8>(rlog, E, K, norm, ti, tw, nullptr, 0);
    if (tid == 0) tw[K] = 1.0f / (1.0f + expf(-*sg));
    __syncthreads();
    mark(1);
    moe_a_regs A;
    if (blockIdx.x < nA) moe_a_load(A, Wg, Wu, ti[blockIdx.x / upk], blockIdx.x % upk, ngu);
    if (rb0 < nrb)
#pragma unroll
        for (int k = 0; k < MOE_KMAX; k++)
            if (k < K) moe_down_load(R, k, dmat_expert(Wd, ti[k]), rb0, ngd);
    moe_stage_xn(xn, H, xa, threadIdx.x, blockDim.x);
    __syncthreads();
    mark(2);
    for (int64_t u = blockIdx.x; u < nA; u += gridDim.x) {
        if (u != blockIdx.x) moe_a_load(A, Wg, Wu, ti[u / upk], u % upk, ngu);
        const float h = moe_a_swiglu(A, xa, H, &part[0][0][0], (MOE_KMAX + 1) * 17);
        const int64_t d = (u % upk) * 32 + tid;
        if (tid < 32 && d < I) act[(u / upk) * I + d] = h;
    }
    mark(3);
    int nb = 0;
    grid_sync(bar, nullptr, nb); // every act row is written
    pdl_trigger();
    mark(4);
    for (int64_t rb = rb0; rb < nrb; rb += gridDim.x) {
        if (rb != rb0) {
            moe_down_load(R, MOE_KMAX, Ws, rb, ngd);
#pragma unroll
            for (int k = 0; k < MOE_KMAX; k++)
                if (k < K) moe_down_load(R, k, dmat_expert(Wd, ti[k]), rb, ngd);
        }
        moe_down_rows(R, rb, Wd.rows, I, act, false, shgu, tw, K, msm, part, x);
    }
    mark(5);
}
// Its dynamic shared memory, and whether it serves a layer (as k_moe_down, and
// packed gate/up of H <= 2048 columns).
static inline bool moe_fused_ok(const dmat &Wg, const dmat &Wu, int64_t H, int64_t I, int K, int E) {
    return Wg.pk && Wu.pk && Wg.cols == H && Wu.cols == H && Wg.rows == I && Wu.rows == I && H <= 64 * 2 * MOE_AG &&
           I % 32 == 0 && E <= 256 && K >= 1 && K <= MOE_KMAX;
}

// Whether k_moe_down serves a layer: packed experts and shared expert of the same width.
static inline int moe_down_mg(const dmat &Wd, const dmat &Ws, int K) {
    if (!Wd.pk || !Ws.pk || Wd.cols != Ws.cols || Wd.rows != Ws.rows || K > MOE_KMAX) return 0;
    const int64_t ng = Wd.cols / 64;
    return ng <= 8 ? 1 : ng <= 16 ? 2 : 0;
}

// Launches k_gemv for a job (the backend's gemv() and the kernel tests). slots
// > 0: expert mode over topi. blocks: the grid to aim for (the backend: two
// blocks per SM, as many as fit at once); each block then loops over job.upb
// sets. 0: one set per block.
template <int XM, int NS>
static cudaError_t gemv_go(cudaStream_t st, bool pdl, dim3 g, size_t sm, gemv_job &j, const float *x, int64_t ldx,
                           int64_t xoff, const int *topi, int x_div) {
    static size_t sm_set = 0; // the dynamic shared memory this instance is allowed (set once per size)
    if (sm > 48u * 1024 && sm > sm_set) {
        const cudaError_t e = cudaFuncSetAttribute(k_gemv<XM, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        if (e != cudaSuccess) return e;
        sm_set = sm;
    }
    return launch_ex(st, pdl, k_gemv<XM, NS>, g, dim3(GEMV_THREADS), sm, j, x, ldx, xoff, topi, x_div);
}
static inline cudaError_t gemv_launch(cudaStream_t st, bool pdl, gemv_job &j, int xm, const float *x, int64_t ldx,
                                      int64_t xoff, const int *topi, int x_div, int slots, int blocks) {
    const int ns = gemv_ns(j.W[0].cols / 64), ys = slots > 0 ? slots : 1;
    int64_t sets = 0;
    for (int i = 0; i < j.n; i++) {
        const int rpb = gemv_rows_per_block(j.W[i], ns);
        sets += (j.W[i].rows + rpb - 1) / rpb * (topi && !j.plain[i] ? ys : 1);
    }
    const int64_t nb = blocks > 0 ? (blocks + GEMV_SUB - 1) / GEMV_SUB : 0; // blocks of GEMV_THREADS
    j.upb = nb > 0 ? (int)((sets + nb - 1) / nb) : GEMV_SUB;
    if (j.upb < 1) j.upb = 1;
    j.start[0] = 0;
    for (int i = 0; i < j.n; i++) {
        const int rpb = gemv_rows_per_block(j.W[i], ns);
        const int64_t si = (j.W[i].rows + rpb - 1) / rpb;
        j.start[i + 1] = j.start[i] + (int)((si + j.upb - 1) / j.upb);
    }
    const int64_t cols = j.W[0].cols;
    j.stages = gemv_stages(cols, ns);
    const dim3 g((unsigned)j.start[j.n], (unsigned)ys);
    bool packed = false; // weight stages only for jobs with a packed matrix (bf16 checkpoints have none)
    for (int i = 0; i < j.n; i++) packed |= j.W[i].pk != nullptr;
    const size_t sm = gemv_xsmem(cols) + (packed ? (size_t)GEMV_SUB * j.stages * gemv_stage_u4(cols, ns) * 16 : 0);
#define GEMV_GO(XM, NS) return gemv_go<XM, NS>(st, pdl, g, sm, j, x, ldx, xoff, topi, x_div)
#define GEMV_NS_SWITCH(XM)                 \
    switch (ns) {                          \
    case 8: GEMV_GO(XM, 8);                \
    case 4: GEMV_GO(XM, 4);                \
    case 2: GEMV_GO(XM, 2);                \
    default: GEMV_GO(XM, 1);               \
    }
    if (xm == XM_SWIGLU) { GEMV_NS_SWITCH(XM_SWIGLU) }
    else if (xm == XM_NORM) { GEMV_NS_SWITCH(XM_NORM) }
    else { GEMV_NS_SWITCH(XM_PLAIN) }
#undef GEMV_NS_SWITCH
#undef GEMV_GO
}
