// emu/mma.h — a CPU stand-in for the one tensor-core instruction that
// src/backend/cuda/cuda_gdn_chunk.cuh uses, mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32,
// for the emulator of cuda_runtime.h beside it.
//
// The warp's 32 lanes each hand in their share of A (16 x 8), B (8 x 8) and C (16 x 8) in
// the PTX ISA's fragment map (g = lane / 4, t = lane % 4):
//   A: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
//   B: b0 (k t, n g), b1 (k t + 4, n g)
//   C, D: c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1)
// The lanes meet at the warp barrier, each computes its own D from the whole tiles and
// they meet again: so a kernel that puts an element in the wrong lane or register gets a
// wrong product here, as on the GPU. The operands are tf32 as the hardware reads them:
// the low 13 bits of each 32-bit register are ignored (truncation); products exact, sums
// in f32 in k order.
#pragma once
#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

namespace cuemu {
struct mma_slots {
    float a[32][4], b[32][2], c[32][4];
};
inline std::vector<mma_slots> mma_ex; // one per warp of the running block
inline float tf32_bits(uint32_t u) { return __uint_as_float(u & 0xffffe000u); }
inline void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    const unsigned w = tid.x >> 5, lane = tid.x & 31;
    if (mma_ex.size() < warps.size()) mma_ex.resize(warps.size());
    mma_slots &s = mma_ex[w];
    for (int i = 0; i < 4; i++) s.a[lane][i] = tf32_bits(a[i]);
    for (int i = 0; i < 2; i++) s.b[lane][i] = tf32_bits(b[i]);
    for (int i = 0; i < 4; i++) s.c[lane][i] = d[i];
    arrive(warps[w].bar);
    float A[16][8], B[8][8];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        A[g][t] = s.a[l][0];
        A[g + 8][t] = s.a[l][1];
        A[g][t + 4] = s.a[l][2];
        A[g + 8][t + 4] = s.a[l][3];
        B[t][g] = s.b[l][0];
        B[t + 4][g] = s.b[l][1];
    }
    const int g = (int)lane >> 2, t = (int)lane & 3;
    for (int i = 0; i < 4; i++) {
        const int m = g + 8 * (i >> 1), n = 2 * t + (i & 1);
        float acc = s.c[lane][i];
        for (int k = 0; k < 8; k++) acc += A[m][k] * B[k][n];
        d[i] = acc;
    }
    arrive(warps[w].bar);
}
} // namespace cuemu
