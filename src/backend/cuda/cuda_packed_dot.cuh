// cuda_packed_dot.cuh — the packed 4-bit product: one packed 16 x 64 group (cuda_packed.cuh's layout) times an input
// staged as int8 pieces, on the integer tensor cores: the product the decode GEMV and
// the decode MoE kernels are made of, and the pieces the prefill GEMM's input is split
// into. Also built by the CUDA emulator (tests/cuda/emu: its mma.h stands in for the MMA).
#pragma once
#ifdef LILAC_CUEMU
#include "mma.h"
#else
#include "cuda_common.cuh"
#endif

// An input value over its group's sigma (u = x / sigma, |u| <= 127) as three int8 pieces,
// u ~ a + b/128 + c/16384: the integer-tensor-core input of the decode GEMV (pk_stage4)
// and of the prefill GEMM (k_split_x). |b| <= 64 for a finite u; a NaN gives -127 and two
// NaN pieces that the int8 conversion turns into 0 (the group sum carries the NaN).
__device__ __forceinline__ void i8_pieces(float u, float &a, float &b, float &c) {
    a = fminf(fmaxf(rintf(u), -127.0f), 127.0f);
    const float r = (u - a) * 128.0f;
    b = rintf(r);
    c = fminf(fmaxf(rintf((r - b) * 128.0f), -127.0f), 127.0f);
}

#ifndef LILAC_CUEMU
__device__ __forceinline__ void imma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// The same with C = 0 (d is written, not read: no zeroed accumulators to set up).
__device__ __forceinline__ void imma_s8_z(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}
#endif

// The packed products run on the integer tensor cores (mma m16n8k32, s8): the
// codes of a packed word, masked, are already the bytes of an A fragment, and
// the input goes in as three int8 pieces per 64-column group G,
//   x ≈ σ_G (a + b/128 + c/16384),  σ_G = max|x| / 127,
// in B columns 0, 1 and 2 of the same MMA (exact s32 sums). That resolves x
// to 2^-21 of its group's largest value (the bf16 hi/lo split this replaced:
// 2^-16 of each value) in about half the instructions per weight: one
// mask per four codes instead of three operations per two, and two MMAs per
// group instead of four.
//   K order: lane (g, t)'s word ks holds rows g (low nibble of each byte) and
//   g+8 (high) at columns c0, c0+8, c0+1, c0+9 (c0 = 16ks + 2t), so that is
//   the order of the k index inside each 4-byte fragment register; the pieces
//   are staged in the same order:
//   xq[((G*4 + n)*4 + t)*16 + ks*4 + byte] = piece n (0..2) of column
//   64G + 16ks + c, for byte = 0, 1, 2, 3 <-> c = 2t, 2t+8, 2t+1, 2t+9.
//   xsg[2G] = Σ_G x (f32, for the bias), xsg[2G+1] = σ_G.
// (imma_s8 below; on the emulator, tests/cuda/emu/mma.h's stand-in)

// One packed group (16 rows x 64 columns; this lane's fragment word pq and
// scale/bias word psr, see the layout above) times the staged input (xq, and
// xs2 = {Σx, σ} of the group). Adds rows g and g+8 of s*Σqx + b*Σx to
// acc0/acc1 in lanes t == 0. Warp-uniform (it shuffles).
__device__ __forceinline__ void pk_group(uint4 pq, uint32_t psr, const uint4 *xq, float2 xs2, int64_t G, int g, int t,
                                         float &acc0, float &acc1) {
    const uint4 B = xq[(G * 4 + (g & 3)) * 4 + t]; // lanes g = 3..7: pieces nobody reads
    const uint32_t M = 0x0F0F0F0Fu;
    int d[4] = {0, 0, 0, 0};
    imma_s8(d, pq.x & M, (pq.x >> 4) & M, pq.y & M, (pq.y >> 4) & M, B.x, B.y); // columns 0..31
    imma_s8(d, pq.z & M, (pq.z >> 4) & M, pq.w & M, (pq.w >> 4) & M, B.z, B.w); // 32..63
    // lane t=0: d0, d1 = pieces 0, 1 of row g; d2, d3 of row g+8; lane t=1: d0, d2 = piece 2
    const int e0 = __shfl_down_sync(0xffffffffu, d[0], 1), e2 = __shfl_down_sync(0xffffffffu, d[2], 1);
    const uint32_t other = __shfl_down_sync(0xffffffffu, psr, 1);
    const float p0 = (float)d[0] + (float)d[1] * (1.0f / 128.0f) + (float)e0 * (1.0f / 16384.0f);
    const float p8 = (float)d[2] + (float)d[3] * (1.0f / 128.0f) + (float)e2 * (1.0f / 16384.0f);
    acc0 += __uint_as_float(psr << 16) * xs2.y * p0 + __uint_as_float(psr & 0xFFFF0000u) * xs2.x;
    acc1 += __uint_as_float(other << 16) * xs2.y * p8 + __uint_as_float(other & 0xFFFF0000u) * xs2.x;
}

// Columns 4q..4q+3 of an input row (values v4) staged for pk_group: the int8
// pieces into xq, Σx and σ into xsg. Called by whole warps over consecutive q
// (the 16 quads of a group are 16 consecutive lanes); `in` false: this lane
// has no quad (it still takes part in the shuffles).
__device__ __forceinline__ void pk_stage4(float4 v4, int64_t q, bool in, uint4 *xq, float *xsg) {
    const float v[4] = {v4.x, v4.y, v4.z, v4.w};
    float gs = in ? (v[0] + v[1]) + (v[2] + v[3]) : 0.0f;
    float m = in ? fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))) : 0.0f;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) {
        gs += __shfl_xor_sync(0xffffffffu, gs, o);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    if (!in) return;
    const float inv = m > 0.0f ? 127.0f / m : 0.0f; // m = inf: pieces 0, σ inf; NaN x: Σx carries it
    // 32-bit byte offsets from the group's base: 48 fewer instructions than 64-bit ones from xq
    int8_t *xb = (int8_t *)xq + (q >> 4) * 256; // group G = q / 16: 16 uint4 (4 piece planes of 64 bytes)
    const int ql = (int)q & 15;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int cc = 4 * ql + e, ks = cc >> 4, w = cc & 15;
        const int at = ((w & 7) >> 1) * 16 + ks * 4 + (w & 1) * 2 + (w >> 3); // piece 0
        float a, b, c;
        i8_pieces(v[e] * inv, a, b, c);
        xb[at] = (int8_t)a;
        xb[at + 64] = (int8_t)b; // piece 1: n + 1 is 4 uint4 = 64 bytes on
        xb[at + 128] = (int8_t)c;
    }
    if ((q & 15) == 0) {
        xsg[2 * (q / 16)] = gs;
        xsg[2 * (q / 16) + 1] = m * (1.0f / 127.0f);
    }
}
