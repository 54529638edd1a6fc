// cuda_topk.cuh — the router's top-k of one token by one warp (k_topk_reg, the decode
// GEMV's and the decode MoE's prologues). Also built by the CUDA
// emulator (tests/cuda/emu) for the decode MoE's test there.
#pragma once
#ifdef LILAC_CUEMU
#include "cuda_runtime.h"
#else
#include "cuda_common.cuh"
#endif

// The router's top-k of one token by one warp, the probabilities in registers (E <= 32 * PL):
// every round is a warp argmax by two redux instructions.
template <int PL>
__device__ __forceinline__ void topk_warp(const float *lg, int E, int K, int norm, int *topi, float *topw, int *counts,
                                          int t) {
    const int lane = threadIdx.x & 31;
    float p[PL];
    float mx = -INFINITY;
#pragma unroll
    for (int u = 0; u < PL; u++) {
        const int e = lane + 32 * u;
        p[u] = e < E ? __ldcg(lg + e) : -INFINITY; // L2: may have been written by other blocks of this grid
        mx = fmaxf(mx, p[u]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int u = 0; u < PL; u++) {
        p[u] = lane + 32 * u < E ? expf(p[u] - mx) : -1.0f;
        sum += p[u] > 0.0f ? p[u] : 0.0f;
    }
    const float inv = 1.0f / warp_sum(sum);
    float tot = 0.0f;
    for (int k = 0; k < K; k++) {
        float v = -1.0f;
        int idx = 0x7fffffff;
#pragma unroll
        for (int u = 0; u < PL; u++)
            if (p[u] > v) { v = p[u]; idx = lane + 32 * u; }
        // the warp's largest p (non-negative floats order as their bits; taken or absent: -1), then the
        // lowest id holding it: two redux instructions instead of five rounds of two shuffles
        const int vb = v >= 0.0f ? __float_as_int(v) : -1, mb = __reduce_max_sync(0xffffffffu, vb);
        idx = __reduce_min_sync(0xffffffffu, vb == mb ? idx : 0x7fffffff);
        v = mb >= 0 ? __int_as_float(mb) : -1.0f;
        const float w = v * inv;
        tot += w;
#pragma unroll
        for (int u = 0; u < PL; u++)
            if (lane + 32 * u == idx) p[u] = -1.0f;
        if (lane == 0) {
            topi[t * K + k] = idx;
            topw[t * K + k] = w;
            if (counts) atomicAdd(&counts[idx], 1);
        }
    }
    __syncwarp();
    if (norm && lane < K) topw[t * K + lane] = topw[t * K + lane] / tot;
}
