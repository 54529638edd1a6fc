// cuda_reduce.cuh — warp and block reductions: sums, maxima, the (value, index) argmax.
// Included by cuda_common.cuh, and by the CUDA emulator's runtime (tests/cuda/emu), so that
// emulated kernels reduce with the same code.
#pragma once
#include <math.h>

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Warp-wide (value, index) maximum; ties go to the lowest index (as the CPU reference).
template <typename I>
__device__ __forceinline__ void warp_argmax(float &v, I &idx) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const I oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
    }
}

// Block-wide sum (MAX: maximum); `sh` holds >= 32 floats. All threads get the result.
template <bool MAX>
__device__ __forceinline__ float block_reduce(float v, float *sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : MAX ? -INFINITY : 0.0f;
    return MAX ? warp_max(v) : warp_sum(v);
}
__device__ __forceinline__ float block_sum(float v, float *sh) { return block_reduce<false>(v, sh); }
// block_sum for the first use of `sh` in a kernel: no earlier reader to wait for, so one
// barrier instead of two.
__device__ __forceinline__ float block_sum_first(float v, float *sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    return warp_sum(lane < nw ? sh[lane] : 0.0f);
}
__device__ __forceinline__ float block_max(float v, float *sh) { return block_reduce<true>(v, sh); }
