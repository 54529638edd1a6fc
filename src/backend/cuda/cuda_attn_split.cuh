// cuda_attn_split.cuh — attention over key splits: k_attn_prep (the token's q/k norms, RoPE and its
// cache rows), k_attn (a few query tokens on the CUDA cores), the decode attention (cuda_attn_dec.cuh)
// and k_attn_combine, which merges the splits' partials and applies the output gate.
#pragma once
#include "cuda_common.cuh"

// ---------------------------------------------------------------- gated attention

// A value into f32, or into the bf16 of the KV cache (round to nearest even).
__device__ __forceinline__ void put_val(float *d, float v) { *d = v; }
__device__ __forceinline__ void put_val(__nv_bfloat16 *d, float v) { *d = __float2bfloat16_rn(v); }

// One head row through RMSNorm (gain g) and NeoX RoPE on its first rd dims at
// position pos, times mul, by one warp, into dst (f32, or a bf16 cache row):
// an f32 dst may be src (each lane writes only the pair (i, i + rd/2) or the
// element it read). inv_freq[i] = theta^(-2i/rd) in f32, as the CPU reference
// computes it once per session.
template <typename T>
__device__ __forceinline__ void warp_norm_rope(const float *src, const float *g, int hd, int rd, int64_t pos,
                                               const float *inv_freq, float eps, float mul, T *dst) {
    const int lane = threadIdx.x & 31, half = rd / 2;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) ss += src[i] * src[i];
    const float inv = rsqrtf(warp_sum(ss) / (float)hd + eps);
    for (int i = lane; i < hd; i += 32) {
        if (i < half) {
            const float a = src[i] * inv * g[i], b = src[i + half] * inv * g[i + half];
            float sn, cs;
            sincosf((float)pos * inv_freq[i], &sn, &cs);
            put_val(dst + i, (a * cs - b * sn) * mul);
            put_val(dst + i + half, (b * cs + a * sn) * mul);
        } else if (i >= rd) {
            put_val(dst + i, src[i] * inv * g[i] * mul);
        }
    }
}

// q_norm + RoPE on query head h of token t (in place), or k_norm + RoPE on key
// head h - nh and both k and v into the bf16 cache (rounded to nearest even) at
// position pos + t. Grid (T, nh + nkv), one warp each. (One decode token:
// k_attn_dec_mma does this itself.)
__global__ void k_attn_prep(float *qg, const float *kx, const float *vx, const float *qn, const float *kn,
                            __nv_bfloat16 *kc, __nv_bfloat16 *vc, const int *d_pos, int nh, int nkv, int hd, int rd,
                            const float *inv_freq, float eps) {
    pdl_wait();
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int64_t p = (int64_t)*d_pos + t, kvw = (int64_t)nkv * hd;
    if (h < nh) {
        float *q = qg + (int64_t)t * 2 * nh * hd + (int64_t)h * 2 * hd;
        warp_norm_rope(q, qn, hd, rd, p, inv_freq, eps, 1.0f, q);
        return;
    }
    const int64_t o = (int64_t)(h - nh) * hd;
    warp_norm_rope(kx + t * kvw + o, kn, hd, rd, p, inv_freq, eps, 1.0f, kc + p * kvw + o);
    for (int i = lane; i < hd; i += 32) vc[p * kvw + o + i] = __float2bfloat16_rn(vx[t * kvw + o + i]);
}

// Causal attention of token t, head h over keys [0, pos + t] of the bf16 cache,
// split over gridDim.z key ranges. 4 warps, each an online softmax over its
// keys; lane holds DPL = hd/32 dims. One split: writes o * sigmoid(gate);
// several: partials.
template <int DPL>
__global__ void __launch_bounds__(128) k_attn(const float *qg, const __nv_bfloat16 *kc, const __nv_bfloat16 *vc,
                                              const int *d_pos, int nh, int nkv, float *out, float *part) {
    pdl_wait();
    const int h = blockIdx.x, t = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    const int hd = DPL * 32, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kh = h / (nh / nkv);
    const int64_t n = (int64_t)*d_pos + t + 1, kvw = (int64_t)nkv * hd;
    const int64_t j0 = n * s / S, j1 = n * (s + 1) / S;
    const float *q = qg + (int64_t)t * 2 * nh * hd + (int64_t)h * 2 * hd;
    const float scale = rsqrtf((float)hd);
    float qr[DPL], acc[DPL];
#pragma unroll
    for (int d = 0; d < DPL; d++) {
        qr[d] = q[lane * DPL + d] * scale;
        acc[d] = 0.0f;
    }
    float mx = -INFINITY, l = 0.0f;
#pragma unroll 4
    for (int64_t j = j0 + warp; j < j1; j += 4) {
        const __nv_bfloat16 *kr = kc + j * kvw + (int64_t)kh * hd + lane * DPL;
        float dot = 0.0f;
#pragma unroll
        for (int d = 0; d < DPL; d++) dot += qr[d] * __bfloat162float(kr[d]);
        dot = warp_sum(dot);
        const float mn = fmaxf(mx, dot), corr = expf(mx - mn), pj = expf(dot - mn);
        l = l * corr + pj;
        const __nv_bfloat16 *vr = vc + j * kvw + (int64_t)kh * hd + lane * DPL;
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[d] = acc[d] * corr + pj * __bfloat162float(vr[d]);
        mx = mn;
    }
    __shared__ float sm[4], sl[4];
    __shared__ float sacc[4][DPL * 32];
    if (lane == 0) { sm[warp] = mx; sl[warp] = l; }
#pragma unroll
    for (int d = 0; d < DPL; d++) sacc[warp][lane * DPL + d] = acc[d];
    __syncthreads();
    float M = fmaxf(fmaxf(sm[0], sm[1]), fmaxf(sm[2], sm[3]));
    float w[4], L = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        w[i] = sm[i] == -INFINITY ? 0.0f : expf(sm[i] - M);
        L += sl[i] * w[i];
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) a += sacc[i][d] * w[i];
        if (S == 1) {
            const float g = q[hd + d];
            out[(int64_t)t * nh * hd + (int64_t)h * hd + d] = a / L / (1.0f + expf(-g));
        } else {
            float *pp = part + (((int64_t)t * nh + h) * S + s) * (hd + 2);
            pp[d] = a;
            if (d == 0) { pp[hd] = M; pp[hd + 1] = L; }
        }
    }
}

#include "cuda_attn_dec.cuh" // k_attn_dec_mma: the decode attention

// Merge the split partials of k_attn / k_attn_dec_mma and apply the output gate
// (hd a multiple of 32; S <= 128). Grid (nh, T, hd/32): block z takes dims
// [32z, 32z + 32), lane = dim; warp w sums the splits w, w + 8, ... (at most
// 16, their partials all loaded at once, before the global max M is known);
// every warp finds M and the normaliser itself; the 8 warps' sums meet in
// shared memory. Every load is issued at once (one L2 round trip): the splits'
// maxima and sums sit four per lane, and a warp's split weights come by shuffle.
// (One block per head looping over its splits, 16 blocks, takes 9-17 us at 64
// splits; this grid 9.0 us alone in test_attn with three dependent rounds of
// loads: docs/perf.md.)
__host__ __device__ inline dim3 attn_combine_grid(int nh, int T, int hd) {
    return dim3((unsigned)nh, (unsigned)T, (unsigned)(hd / 32));
}
__global__ void __launch_bounds__(256) k_attn_combine(const float *qg, const float *part, int S, int nh, int hd, float *out) {
    pdl_trigger_early();
    pdl_wait();
    __shared__ float red[8][32];
    const int h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int d = 32 * blockIdx.z + lane, nj = (S - warp + 7) / 8; // this warp's splits: warp + 8j, j < nj (<= 16)
    const float *pp = part + ((int64_t)t * nh + h) * S * (hd + 2);
    // every load in one round trip: the gate, this warp's partials, and each split's max and sum
    // (split lane in m0/l0, split lane + 32 in m1/l1, lane + 64 in m2/l2, lane + 96 in m3/l3)
    const float g = qg[(int64_t)t * 2 * nh * hd + (int64_t)h * 2 * hd + hd + d];
    float v[16];
#pragma unroll
    for (int j = 0; j < 16; j++)
        if (j < nj) v[j] = pp[(warp + 8 * j) * (hd + 2) + d];
    float m[4], l[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int sp = lane + 32 * i;
        m[i] = sp < S ? pp[sp * (hd + 2) + hd] : -INFINITY;
        l[i] = sp < S ? pp[sp * (hd + 2) + hd + 1] : 0.0f;
    }
    const float M = warp_max(fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3])));
    float e[4], L = 0.0f; // e[i]: split lane + 32 i's weight exp(m - M) (0 for an empty split)
#pragma unroll
    for (int i = 0; i < 4; i++) {
        e[i] = m[i] == -INFINITY ? 0.0f : expf(m[i] - M);
        L += l[i] * e[i];
    }
    L = warp_sum(L);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; j++) { // split warp + 8j is held by lane (warp + 8j) % 32, in e[(warp + 8j) / 32]
        const int sp = warp + 8 * j, q = sp >> 5; // warp-uniform
        const float w = __shfl_sync(0xffffffffu, q == 0 ? e[0] : q == 1 ? e[1] : q == 2 ? e[2] : e[3], sp & 31);
        if (j < nj) acc += w * v[j];
    }
    red[warp][lane] = acc;
    __syncthreads();
    if (warp == 0) {
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < 8; w++) a += red[w][lane];
        out[(int64_t)t * nh * hd + (int64_t)h * hd + d] = a / L / (1.0f + expf(-g));
    }
}
