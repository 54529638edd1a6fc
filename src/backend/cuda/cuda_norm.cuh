// cuda_norm.cuh — the embedding gather and the RMSNorms of the forward pass (the prefill norms also
// write their output as the next GEMM's split input). Each mirrors a step of src/backend/cpu/cpu_forward.c.
#pragma once
#include "cuda_common.cuh"
#include "cuda_gemm4_tile.cuh" // g4_split: the prefill norms write their output split for the GEMM after them

// ---------------------------------------------------------------- embedding / norms

// x[t] = dequantised row ids[t] of the embedding. Grid (T, column blocks). The first
// kernel of every pass, and it never lets its successor launch early: k_gdn_step reads
// its state before its predecessor wait, relying on the previous pass having ended.
__global__ void k_embed(dmat E, const int *ids, float *x) {
    pdl_wait();
    const int t = blockIdx.x;
    const int64_t row = ids[t], H = E.cols, c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= H) return;
    float *xo = x + (int64_t)t * H;
    if (E.type == 1) {
        xo[c] = __bfloat162float(E.w[row * H + c]);
        return;
    }
    const int per_word = 32 / E.bits;
    const uint32_t mask = (1u << E.bits) - 1u;
    const int64_t wpr = H / per_word, ng = H / E.group;
    const uint32_t w = E.q[row * wpr + c / per_word];
    const float q = (float)((w >> ((c % per_word) * E.bits)) & mask);
    const int64_t g = row * ng + c / E.group;
    xo[c] = __bfloat162float(E.s[g]) * q + __bfloat162float(E.b[g]);
}

// Row y = x * inv * gain of H columns (a multiple of 64), four a thread, and into the split sp of row
// `row` when sp.xh: the same bits k_split_x would make from y (whose 120 launches of a 4k prefill,
// 3.0 ms, mostly re-read what a norm had just written); then yr may be null (only the split is read).
// After a barrier: xr may be another thread's writes.
__device__ __forceinline__ void norm_row_out(const float *xr, float inv, const float *gain, float *yr, int64_t H,
                                             const g4_split &sp, int64_t row) {
    if (!sp.xh) {
        for (int64_t i = threadIdx.x; i < H; i += blockDim.x) yr[i] = xr[i] * inv * gain[i];
        return;
    }
    g4_split_pad(sp, row, (int)(H / 64));
    for (int64_t c0 = 0; c0 < H; c0 += (int64_t)blockDim.x * 4) { // every thread every round (the group sums)
        const int64_t c = c0 + (int64_t)threadIdx.x * 4;
        const bool in = c < H;
        float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (in) {
            const float4 v = *(const float4 *)(xr + c), g = *(const float4 *)(gain + c);
            e[0] = v.x * inv * g.x, e[1] = v.y * inv * g.y, e[2] = v.z * inv * g.z, e[3] = v.w * inv * g.w;
            if (yr) *(float4 *)(yr + c) = make_float4(e[0], e[1], e[2], e[3]);
        }
        g4_split4(sp, e, in, row, c, H);
    }
}

// Optional residual add, then RMSNorm: x += r (r may be null); y = x * rsqrt(mean(x^2)+eps) * gain.
// Row t of x is row t of y; rows [row0, row0 + gridDim.x). sp.xh: y's rows also split (row t of y is
// row t of the split; H a multiple of 64), and y may be null (not written).
__global__ void k_add_rmsnorm(float *x, const float *r, const float *gain, float *y, int64_t H, float eps, int row0,
                              g4_split sp) {
    pdl_wait();
    __shared__ float sh[32];
    const int64_t t = row0 + blockIdx.x;
    float *xr = x + t * H;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
        float v = xr[i];
        if (r) xr[i] = v = v + r[t * H + i];
        ss += v * v;
    }
    ss = block_sum(ss, sh);
    const float inv = rsqrtf(ss / (float)H + eps);
    norm_row_out(xr, inv, gain, y ? y + (int64_t)blockIdx.x * H : nullptr, H, sp, blockIdx.x);
}
