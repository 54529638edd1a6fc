// cuda_argmax.cuh — the greedy pick after the head: k_argmax over the vocabulary, the next input
// id and the host-mapped ring written on the device.
#pragma once
#include "cuda_common.cuh"

// ---------------------------------------------------------------- head

// Greedy pick over the vocabulary (ties: lowest id). Writes the token as the
// next step's input, into the host-visible ring, and advances the position.
// Many blocks (one block took 22 us for 248k logits): each folds its best
// (value, id) into *best as one 64-bit key, order-preserving float bits over
// the complement of the id, so atomicMax keeps the largest value and, among
// equals, the lowest id; the last block to arrive (*arrived) writes the token
// and resets both words for the next launch. NaN and -inf are never picked;
// with nothing else the pick is token 0, as the CPU reference.
#define ARGMAX_THREADS 256
__global__ void __launch_bounds__(ARGMAX_THREADS) k_argmax(const float *logits, int64_t V, int *next_id, int *ring,
                                                          int ring_size, int *d_step, int *d_pos,
                                                          unsigned long long *best, unsigned *arrived) {
    pdl_wait();
    __shared__ float bv[ARGMAX_THREADS / 32];
    __shared__ int64_t bi[ARGMAX_THREADS / 32];
    __shared__ bool last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float v = -INFINITY;
    int64_t idx = 0x7fffffffffffll;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + tid; i < V; i += (int64_t)gridDim.x * blockDim.x)
        if (logits[i] > v) { v = logits[i]; idx = i; }
    warp_argmax(v, idx);
    if (lane == 0) { bv[warp] = v; bi[warp] = idx; }
    __syncthreads();
    if (tid == 0) {
        for (int i = 1; i < ARGMAX_THREADS / 32; i++)
            if (bv[i] > bv[0] || (bv[i] == bv[0] && bi[i] < bi[0])) { bv[0] = bv[i]; bi[0] = bi[i]; }
        if (bi[0] < V) {
            const unsigned u = __float_as_uint(bv[0]), o = (u & 0x80000000u) ? ~u : u | 0x80000000u;
            atomicMax(best, (unsigned long long)o << 32 | (0xffffffffu - (unsigned)bi[0]));
        }
        __threadfence();
        last = atomicAdd(arrived, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last || tid) return;
    __threadfence();
    const unsigned long long k = atomicExch(best, 0ull);
    *arrived = 0;
    const int tok = k ? (int)(0xffffffffu - (unsigned)(k & 0xffffffffu)) : 0;
    *next_id = tok;
    if (ring) {
        const int s = *d_step;
        ((volatile int *)ring)[s % ring_size] = tok;
        *d_step = s + 1;
    }
    if (d_pos) *d_pos += 1;
}
// The grid for V logits: about 8 per thread, at most 512 blocks.
static inline unsigned argmax_blocks(int64_t V) {
    const int64_t b = (V + 8 * ARGMAX_THREADS - 1) / (8 * ARGMAX_THREADS);
    return (unsigned)(b < 1 ? 1 : b > 512 ? 512 : b);
}
