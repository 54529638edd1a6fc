// cuda_packed.cuh — 4-bit weights in tensor-core fragment order, and the decode
// GEMV that reads them.
//
// Why: a decode GEMV streams every weight once, and on the plain MLX layout the
// CUDA cores spend ~3 instructions per weight (unpack, convert, FMA): the
// kernels ended up instruction-bound at ~20% of the memory bandwidth. Repacked
// once at load, a warp reads a 16-row x 64-column group as one fully coalesced
// 512-byte load (16 bytes per lane) whose 32-bit words are exactly the A
// fragments of four mma.m16n8k16 (one per 16 columns), and the scale/bias pairs
// of the 16 rows as one 64-byte load. Unpacking a fragment register is a shift,
// a mask and a bf16x2 subtraction for two weights; the tensor cores do the
// multiplies. Codes stay exact (bf16 holds 0..15), the activations go in as
// bf16 hi + lo (columns 0 and 1 of the MMA's B), so the result is f32-faithful
// like every other matrix product of the backend.
//
// Layout, per expert e, row block rb (16 rows, zero-padded), group G (64 columns):
//   pk [((e*RB + rb)*ng + G)*32 + lane]: uint4, word ks = columns 64G+16ks .. +15
//   word ks of lane (g = lane>>2, t = lane&3), with r0 = 16rb+g, c0 = 64G+16ks+2t:
//     bits 4i (low code) and 16+4i (high code) of fragment register a_i:
//     a0 = (r0, c0|c0+1), a1 = (r0+8, c0|c0+1), a2 = (r0, c0+8|c0+9), a3 = (r0+8, c0+8|c0+9)
//   psb[((e*RB + rb)*ng + G)*16 + r] = bf16 scale | bf16 bias << 16 of row 16rb+r.
#pragma once
#include "cuda_gemm.cuh"

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
// row_dot, bf16 hi and lo pairs, group sums), then `stages` weight stages, each
// one set of the packed layout (8/ns row blocks: codes, then scale/bias pairs).
static inline size_t gemv_stage_u4(int64_t cols, int ns) { return (size_t)(8 / ns) * (size_t)(cols / 64) * 36; }
__host__ __device__ inline size_t gemv_xsmem(int64_t cols) {
    return (gemv_smem(cols) + (size_t)cols / 2 * 4 * 2 + (size_t)cols / 64 * 4 + 15) / 16 * 16;
}
#define GEMV_SMEM_STAGES (110u << 10) // weight stages per block; another kernel's block still fits beside
static inline int gemv_stages(int64_t cols, int ns) {
    const size_t per = gemv_stage_u4(cols, ns) * 16;
    const size_t n = GEMV_SMEM_STAGES / per;
    return n < 2 ? 2 : n > 4 ? 4 : (int)n;
}

#define TCG_MAX 8
// The one-token GEMV (decode) for a job (see gemv_job). Packed matrices: a
// "set" is 8/NS row blocks of 16 rows; warp w takes row block w % (8/NS) of
// the set and groups w / (8/NS) + NS*i, partial sums meeting in shared memory.
// A block stages its input once and loops over job.upb consecutive sets; the
// sets stream through job.stages shared-memory stages by cp.async, the first
// ones issued before the block waits for its predecessor kernel (weights do
// not depend on it), after which it lets the next kernel launch: that one's
// blocks, beside this one's, start their own weight copies while this one
// computes. A decode step thus streams weights across kernel boundaries
// instead of paying a DRAM round trip per kernel (or per 16 rows).
// Other matrices (8-bit router and shared-expert gate, bf16 checkpoints, 4-bit
// with other group sizes) take one row per warp with row_dot (a set of 8 rows).
// Expert mode (topi != null): blockIdx.y is a routing slot (input row slot /
// x_div, expert topi[slot]); the output row is the slot. The last block runs
// the job's tail (gemv_tail).
template <int XM, int NS>
__global__ void __launch_bounds__(256, 2) k_gemv(gemv_job job, const float *x, int64_t ldx, int64_t xoff,
                                                    const int *topi, int x_div) {
    constexpr int RBB = 8 / NS;
    extern __shared__ __align__(16) float xs[];
    __shared__ float red[32];
    __shared__ float part[8][17];
    int mi = 0;
    while (mi + 1 < job.n && (int)blockIdx.x >= job.start[mi + 1]) mi++;
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
        W = dmat_expert(W, topi[slot]);
        x += (int64_t)(slot / x_div) * ldx;
        yrow = slot;
    }
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int64_t cols = W.cols, ng = cols / 64, blk = blockIdx.x - job.start[mi];
    const bool tc = W.pk != nullptr;
    const int64_t nrb = (W.rows + 15) / 16;
    const int slice = warp / RBB, ngw = (int)(ng / NS);
    const int upb = job.upb > 1 ? job.upb : 1, S = job.stages;
    const int64_t set0 = blk * upb, nset = tc ? (nrb + RBB - 1) / RBB : (W.rows + 7) / 8;
    const int nk = (int)(nset - set0 < upb ? nset - set0 : upb); // >= 1: the grid has no empty blocks
    const int64_t su4 = (int64_t)RBB * ng * 36; // one stage: RBB*ng*32 code uint4, then RBB*ng*4 of scale/bias
    uint4 *stg = (uint4 *)(xs + gemv_xsmem(cols) / sizeof(float));
    // Copies set k into stage k % S (one commit group per call, empty past the block's sets).
    auto issue = [&](int k) {
        if (tc && k < nk) {
            const int64_t rb0 = (set0 + k) * RBB, nb = nrb - rb0 < RBB ? nrb - rb0 : RBB;
            const int64_t nc = nb * ng * 32, n = nc + nb * ng * 4;
            const uint4 *pk = W.pk + rb0 * ng * 32, *ps = (const uint4 *)(W.psb + rb0 * ng * 16);
            uint4 *d = stg + (int64_t)(k % S) * su4;
            for (int64_t i = tid; i < n; i += 256) {
                if (i < nc) cp_async16(d + i, pk + i, true);
                else cp_async16(d + (int64_t)RBB * ng * 32 + (i - nc), ps + (i - nc), true);
            }
        }
        cp_async_commit();
    };
    for (int k = 0; k < S - 1; k++) issue(k);
    if (!routed) {
        pdl_trigger(); // every block's first copies are in flight: the next kernel may start its own
        pdl_wait();
    } else {
        pdl_trigger();
    }

    // Stage the input: f32 (padded, for row_dot), bf16 hi/lo pairs, f32 sums per 64 columns.
    uint32_t *xh2 = (uint32_t *)(xs + gemv_smem(cols) / sizeof(float)), *xl2 = xh2 + cols / 2;
    float *xsg = (float *)(xl2 + cols / 2);
    float4 xr[GEMV_STAGE], xu[GEMV_STAGE];
    const int64_t n4 = cols / 4;
#pragma unroll
    for (int u = 0; u < GEMV_STAGE; u++) {
        const int64_t q = tid + (int64_t)u * blockDim.x;
        xr[u] = q < n4 ? *(const float4 *)(x + 4 * q) : make_float4(0, 0, 0, 0);
        if (XM == XM_SWIGLU) xu[u] = q < n4 ? *(const float4 *)(x + xoff + 4 * q) : make_float4(0, 0, 0, 0);
    }
    float inv = 1.0f;
    if (XM == XM_NORM) {
        float ss = 0.0f;
#pragma unroll
        for (int u = 0; u < GEMV_STAGE; u++) ss += xr[u].x * xr[u].x + xr[u].y * xr[u].y + xr[u].z * xr[u].z + xr[u].w * xr[u].w;
        inv = rsqrtf(block_sum(ss, red) / (float)cols + job.eps);
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
            const float4 g4 = *(const float4 *)(job.gain + 4 * q);
            v[0] *= inv * g4.x; v[1] *= inv * g4.y; v[2] *= inv * g4.z; v[3] *= inv * g4.w;
            if (job.xn_out && blockIdx.x == 0 && blockIdx.y == 0) *(float4 *)(job.xn_out + 4 * q) = make_float4(v[0], v[1], v[2], v[3]);
        }
        if (!in) v[0] = v[1] = v[2] = v[3] = 0.0f;
        // every thread takes part in the 16-lane group sum (64 columns)
        float gs = (v[0] + v[1]) + (v[2] + v[3]);
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) gs += __shfl_xor_sync(0xffffffffu, gs, o);
        if (!in) continue;
        *(float4 *)(xs + xs_idx(4 * q)) = make_float4(v[0], v[1], v[2], v[3]);
        __nv_bfloat16 h[4], l[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            h[e] = __float2bfloat16(v[e]);
            l[e] = __float2bfloat16(v[e] - __bfloat162float(h[e]));
        }
        *(uint2 *)(xh2 + 2 * q) = *(const uint2 *)h;
        *(uint2 *)(xl2 + 2 * q) = *(const uint2 *)l;
        if ((tid & 15) == 0) xsg[q / 16] = gs;
    }
    __syncthreads();

    float *y = job.y[mi] + yrow * job.ldy[mi];
    const int accum = job.accum[mi];
    if (!tc) { // one row per warp, 8 rows per set
        for (int k = 0; k < nk; k++) {
            const int64_t r = (set0 + k) * 8 + warp;
            float v = r < W.rows ? row_dot(W, r, xs, lane) : 0.0f;
            v = warp_sum(v);
            if (lane == 0 && r < W.rows) y[r] = accum ? y[r] + v : v;
        }
        gemv_tail_run(job.tail);
        return;
    }
    for (int k = 0; k < nk; k++) {
        issue(k + S - 1); // into the stage set k-1 used: every thread is past it (the barrier below)
        switch (S) {      // set k has landed: at most S-1 later groups still pending
        case 2: cp_async_wait<1>(); break;
        case 3: cp_async_wait<2>(); break;
        default: cp_async_wait<3>(); break;
        }
        __syncthreads();
        const uint4 *sw = stg + (int64_t)(k % S) * su4;
        const uint32_t *ssb = (const uint32_t *)(sw + (int64_t)RBB * ng * 32);
        const int rbl = warp % RBB;
        const int64_t rb = (set0 + k) * RBB + rbl;
        float acc0 = 0.0f, acc1 = 0.0f; // rows 16rb+g and +8 (lanes with t == 0)
        if (rb < nrb) {
#pragma unroll
            for (int i = 0; i < TCG_MAX; i++)
                if (i < ngw) {
                    const int64_t G = slice + (int64_t)NS * i;
                    const uint4 pq = sw[(rbl * ng + G) * 32 + lane];
                    const uint32_t wq[4] = {pq.x, pq.y, pq.z, pq.w};
                    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int ks = 0; ks < 4; ks++) {
                        const int64_t kp = G * 32 + ks * 8 + t; // bf16 pair index of column 64G + 16ks + 2t
                        const uint32_t *src = g == 0 ? xh2 : xl2;
                        const uint32_t b0 = g < 2 ? src[kp] : 0u, b1 = g < 2 ? src[kp + 4] : 0u;
                        const uint32_t a[4] = {pk_frag(wq[ks], 0), pk_frag(wq[ks], 1), pk_frag(wq[ks], 2), pk_frag(wq[ks], 3)};
                        mma_bf16(p, a, b0, b1);
                    }
                    // lane t=0: p[0] + p[1] = row g (hi + lo columns), p[2] + p[3] = row g+8
                    const uint32_t own = ssb[(rbl * ng + G) * 16 + g + 8 * (t & 1)];
                    const uint32_t other = __shfl_down_sync(0xffffffffu, own, 1);
                    const float xg = xsg[G];
                    acc0 += __uint_as_float(own << 16) * (p[0] + p[1]) + __uint_as_float(own & 0xFFFF0000u) * xg;
                    acc1 += __uint_as_float(other << 16) * (p[2] + p[3]) + __uint_as_float(other & 0xFFFF0000u) * xg;
                }
        }
        if (t == 0) {
            part[warp][g] = acc0;
            part[warp][g + 8] = acc1;
        }
        __syncthreads();
        if (tid < 16 * RBB) {
            const int rl = tid / 16, r = tid % 16;
            float v = 0.0f;
#pragma unroll
            for (int sl = 0; sl < NS; sl++) v += part[sl * RBB + rl][r];
            const int64_t row = ((set0 + k) * RBB + rl) * 16 + r;
            if (row < W.rows) y[row] = accum ? y[row] + v : v;
        }
        // part is rewritten after the next set's first barrier, which every reader above passes first
    }
    cp_async_wait<0>();
    gemv_tail_run(job.tail);
}

// Launches k_gemv for a job (the backend's gemv() and the kernel tests). slots
// > 0: expert mode over topi. blocks: the grid to aim for (about one block per
// SM, so that the next kernel's blocks fit beside); each block then loops over
// job.upb sets. 0: one set per block.
template <int XM, int NS>
static cudaError_t gemv_go(cudaStream_t st, bool pdl, dim3 g, size_t sm, gemv_job &j, const float *x, int64_t ldx,
                           int64_t xoff, const int *topi, int x_div) {
    static size_t sm_set = 0; // the dynamic shared memory this instance is allowed (set once per size)
    if (sm > 48u * 1024 && sm > sm_set) {
        const cudaError_t e = cudaFuncSetAttribute(k_gemv<XM, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        if (e != cudaSuccess) return e;
        sm_set = sm;
    }
    return launch_ex(st, pdl, k_gemv<XM, NS>, g, dim3(256), sm, j, x, ldx, xoff, topi, x_div);
}
static inline cudaError_t gemv_launch(cudaStream_t st, bool pdl, gemv_job &j, int xm, const float *x, int64_t ldx,
                                      int64_t xoff, const int *topi, int x_div, int slots, int blocks) {
    const int ns = gemv_ns(j.W[0].cols / 64), ys = slots > 0 ? slots : 1;
    int64_t sets = 0;
    for (int i = 0; i < j.n; i++) {
        const int rpb = gemv_rows_per_block(j.W[i], ns);
        sets += (j.W[i].rows + rpb - 1) / rpb * (topi && !j.plain[i] ? ys : 1);
    }
    j.upb = blocks > 0 ? (int)((sets + blocks - 1) / blocks) : 1;
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
    const size_t sm = gemv_xsmem(cols) + (size_t)j.stages * gemv_stage_u4(cols, ns) * 16;
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
