// cuda_moe.cuh — the MoE's routing and combine: the router's top-k (k_topk, k_topk_reg), the
// prefill's count -> scan -> scatter of routing slots into per-expert tiles, and k_moe_combine
// (the experts' outputs and the shared expert's into the residual stream, the next norm fused).
#pragma once
#include "cuda_common.cuh"
#include "cuda_topk.cuh"
#include "cuda_norm.cuh" // norm_row_out

// ---------------------------------------------------------------- mixture of experts

// Router, one warp per token: softmax over all E logits (f32), top-K by
// repeated warp argmax (ties: lowest index, as the CPU reference), renormalise.
// counts[e] += 1 per pick when counts is given.
__global__ void k_topk(const float *logits, int E, int K, int norm, int *topi, float *topw, int *counts) {
    pdl_wait();
    extern __shared__ float p[]; // [E]
    const int t = blockIdx.x, lane = threadIdx.x;
    const float *lg = logits + (int64_t)t * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, lg[e]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) sum += (p[e] = expf(lg[e] - mx));
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    __syncwarp();
    float tot = 0.0f;
    for (int k = 0; k < K; k++) {
        float v = -1.0f;
        int idx = 0x7fffffff;
        for (int e = lane; e < E; e += 32)
            if (p[e] > v) { v = p[e]; idx = e; }
        warp_argmax(v, idx);
        const float w = v * inv;
        tot += w;
        if (lane == 0) {
            topi[t * K + k] = idx;
            topw[t * K + k] = w;
            p[idx] = -1.0f;
            if (counts) atomicAdd(&counts[idx], 1);
        }
        __syncwarp();
    }
    if (norm && lane < K) topw[t * K + lane] /= tot;
}

template <int PL>
__global__ void k_topk_reg(const float *logits, int E, int K, int norm, int *topi, float *topw, int *counts) {
    pdl_wait();
    topk_warp<PL>(logits + (int64_t)blockIdx.x * E, E, K, norm, topi, topw, counts, blockIdx.x);
}

// Exclusive scan of the per-expert counts into offs[0..E]; resets counts and
// cursor. With `tiles`: the GEMM tile map, one entry (expert, first token) per
// 64 tokens of each expert (empty experts get none), count in *n_tiles.
// One block of MOE_SCAN_THREADS, a thread per expert (the experts in chunks of
// that many): one thread walking 256 experts takes 65 us of a 4k prefill layer,
// a block-wide scan a few.
#define MOE_SCAN_THREADS 256
__global__ void __launch_bounds__(MOE_SCAN_THREADS) k_moe_scan(int *counts, int E, int *offs, int *cursor, int2 *tiles, int *n_tiles) {
    pdl_wait();
    __shared__ int wc[MOE_SCAN_THREADS / 32], wt[MOE_SCAN_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int acc = 0, nt = 0; // the slots and tiles of the chunks before this one (every thread the same)
    for (int e0 = 0; e0 < E; e0 += MOE_SCAN_THREADS) {
        const int e = e0 + (int)threadIdx.x;
        const int c = e < E ? counts[e] : 0, ct = (c + 63) / 64;
        int ic = c, it = ct; // inclusive scans: within the warp, then the warps' totals
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
            const int a = __shfl_up_sync(0xffffffffu, ic, d), b = __shfl_up_sync(0xffffffffu, it, d);
            if (lane >= d) ic += a, it += b;
        }
        if (lane == 31) wc[warp] = ic, wt[warp] = it;
        __syncthreads();
        int bc = 0, bt = 0, sc = 0, st = 0; // the warps before this one; the whole chunk
        for (int w = 0; w < MOE_SCAN_THREADS / 32; w++) {
            if (w < warp) bc += wc[w], bt += wt[w];
            sc += wc[w], st += wt[w];
        }
        if (e < E) {
            const int o = acc + bc + ic - c, t0 = nt + bt + it - ct;
            offs[e] = o;
            counts[e] = 0;
            cursor[e] = 0;
            if (tiles)
                for (int i = 0; i < ct; i++) tiles[t0 + i] = make_int2(e, 64 * i);
        }
        acc += sc, nt += st;
        __syncthreads(); // wc/wt are read before the next chunk writes them
    }
    if (threadIdx.x == 0) {
        offs[E] = acc;
        if (n_tiles) *n_tiles = nt;
    }
}

// Each routing slot (t*K + k) takes its place in its expert's run.
__global__ void k_moe_scatter(const int *topi, int n_slots, const int *offs, int *cursor, int *sorted) {
    pdl_wait();
    const int slot = blockIdx.x * blockDim.x + threadIdx.x;
    if (slot >= n_slots) return;
    const int e = topi[slot];
    sorted[offs[e] + atomicAdd(&cursor[e], 1)] = slot;
}

// x[t] += sum_k w[t][k] * ye[t*K + k] + sigmoid(sg[t]) * shy[t]   (the MoE output and the residual).
// With `gain` (one block per row): then the next layer's input RMSNorm into
// xn[t]. Without: grid (T, blocks of 1024 columns), elementwise. Four columns
// a thread (H is a multiple of 64: up_mat's rule for every matrix, the router's
// columns among them): the K rows of ye are ~2/3 of a 4k prefill's bytes here,
// and four-wide loads keep 4x the bytes in flight (108 us a layer, against 146 us,
// ~2.7 TB/s, with one float a load).
__global__ void k_moe_combine(float *x, const float *ye, const float *topw, int K, const float *shy, const float *sg,
                              int64_t H, const float *gain, float *xn, float eps, g4_split sp) {
    pdl_wait();
    __shared__ float red[32];
    const int t = blockIdx.x;
    const float gs = 1.0f / (1.0f + expf(-sg[t]));
    float ss = 0.0f;
    const int64_t h_first = (int64_t)blockIdx.y * blockDim.x + threadIdx.x, h_step = (int64_t)gridDim.y * blockDim.x;
    const float4 *ye4 = (const float4 *)ye, *shy4 = (const float4 *)shy;
    float4 *x4 = (float4 *)x;
    const int64_t H4 = H / 4;
    for (int64_t h = h_first; h < H4; h += h_step) {
        const float4 sh = shy4[(int64_t)t * H4 + h];
        float4 a = make_float4(gs * sh.x, gs * sh.y, gs * sh.z, gs * sh.w);
#pragma unroll 8
        for (int k = 0; k < K; k++) {
            const float w = topw[t * K + k];
            const float4 y = ye4[((int64_t)t * K + k) * H4 + h];
            a.x += w * y.x, a.y += w * y.y, a.z += w * y.z, a.w += w * y.w;
        }
        float4 v = x4[(int64_t)t * H4 + h];
        v.x += a.x, v.y += a.y, v.z += a.z, v.w += a.w;
        x4[(int64_t)t * H4 + h] = v;
        ss += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
    }
    if (!gain) return;
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)H + eps);
    norm_row_out(x + (int64_t)t * H, inv, gain, xn ? xn + (int64_t)t * H : nullptr, H, sp, t);
}
