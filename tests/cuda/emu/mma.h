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

// The m16n8k16 bf16 MMA and the shared-memory matrix moves around it, as
// src/backend/cuda/cuda_attn_dec.cuh uses them (cuda_common.cuh has the real ones), in the
// same lane maps (g = lane / 4, t = lane % 4; a register holds two b16, the lower column
// or k index in its low half):
//   mma16816: A 16 x 16: a0 (g, 2t|2t+1), a1 (g + 8, ..), a2 (g, 2t+8|2t+9), a3 (g + 8, ..);
//             B 16 x 8: b0 (k 2t|2t+1, n g), b1 (k 2t+8|2t+9, n g); C as m16n8k8's.
//             Products exact (bf16 x bf16), sums in f32 in k order.
//   ldsm_x4:  lanes 8i .. 8i+7 give the shared addresses of matrix i's 8 rows (16 bytes each);
//             lane l gets row l / 4, columns 2t, 2t+1 of matrix i in register i (_t: of its
//             transpose, i.e. rows 2t, 2t+1 of column l / 4).
//   movmatrix_t: an 8 x 8 matrix held in that map, transposed across the warp.
namespace cuemu {
struct mma16_slots {
    uint32_t a[32][4], b[32][2], x[32];
    float c[32][4];
};
inline std::vector<mma16_slots> mma16_ex; // one per warp of the running block
inline mma16_slots &mma16_my() {
    if (mma16_ex.size() < warps.size()) mma16_ex.resize(warps.size());
    return mma16_ex[tid.x >> 5];
}
inline float b16_lo(uint32_t r) { return __uint_as_float(r << 16); }
inline float b16_hi(uint32_t r) { return __uint_as_float(r & 0xFFFF0000u); }
inline uint16_t smem_b16(uint32_t addr) {
    uint16_t v;
    memcpy(&v, dyn_smem + addr, 2);
    return v;
}
} // namespace cuemu
inline void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    using namespace cuemu;
    const unsigned w = tid.x >> 5, lane = tid.x & 31;
    mma16_slots &s = mma16_my();
    for (int i = 0; i < 4; i++) s.a[lane][i] = a[i], s.c[lane][i] = d[i];
    s.b[lane][0] = b0;
    s.b[lane][1] = b1;
    arrive(warps[w].bar);
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; i++) {
            const int r = g + 8 * (i & 1), k = 2 * t + 8 * (i >> 1);
            A[r][k] = b16_lo(s.a[l][i]);
            A[r][k + 1] = b16_hi(s.a[l][i]);
        }
        for (int i = 0; i < 2; i++) {
            B[2 * t + 8 * i][g] = b16_lo(s.b[l][i]);
            B[2 * t + 8 * i + 1][g] = b16_hi(s.b[l][i]);
        }
    }
    const int g = (int)lane >> 2, t = (int)lane & 3;
    for (int i = 0; i < 4; i++) {
        const int m = g + 8 * (i >> 1), n = 2 * t + (i & 1);
        float acc = s.c[lane][i];
        for (int k = 0; k < 16; k++) acc += A[m][k] * B[k][n];
        d[i] = acc;
    }
    arrive(warps[w].bar);
}
inline void ldsm_x4_any(uint32_t (&r)[4], uint32_t addr, bool trans) {
    using namespace cuemu;
    const unsigned w = tid.x >> 5, lane = tid.x & 31;
    mma16_slots &s = mma16_my();
    s.x[lane] = addr;
    arrive(warps[w].bar);
    const unsigned g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        uint32_t lo, hi;
        if (!trans) {
            lo = smem_b16(s.x[8 * i + g] + 4 * t);
            hi = smem_b16(s.x[8 * i + g] + 4 * t + 2);
        } else {
            lo = smem_b16(s.x[8 * i + 2 * t] + 2 * g);
            hi = smem_b16(s.x[8 * i + 2 * t + 1] + 2 * g);
        }
        r[i] = lo | hi << 16;
    }
    arrive(warps[w].bar);
}
inline void ldsm_x4(uint32_t (&r)[4], uint32_t addr) { ldsm_x4_any(r, addr, false); }
inline void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) { ldsm_x4_any(r, addr, true); }
inline uint32_t movmatrix_t(uint32_t x) {
    using namespace cuemu;
    const unsigned w = tid.x >> 5, lane = tid.x & 31;
    mma16_slots &s = mma16_my();
    s.x[lane] = x;
    arrive(warps[w].bar);
    // out (row g, columns 2t, 2t + 1) = in (rows 2t, 2t + 1, column g); in (r, c) is half c & 1 of lane 4r + c / 2
    const unsigned g = lane >> 2, t = lane & 3;
    const uint32_t lo = (s.x[4 * (2 * t) + g / 2] >> (16 * (g & 1))) & 0xFFFFu,
                   hi = (s.x[4 * (2 * t + 1) + g / 2] >> (16 * (g & 1))) & 0xFFFFu;
    arrive(warps[w].bar);
    return lo | hi << 16;
}

// mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 (imma_s8 in src/backend/cuda/cuda_packed_dot.cuh), in
// the PTX ISA's fragment map (g = lane / 4, t = lane % 4; byte j of a register is element j):
//   A 16 x 32: a0 (g, 4t + j), a1 (g + 8, 4t + j), a2 (g, 16 + 4t + j), a3 (g + 8, 16 + 4t + j)
//   B 32 x 8:  b0 (k 4t + j, n g), b1 (k 16 + 4t + j, n g)
//   C, D: c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1); exact s32 sums.
namespace cuemu {
struct imma_slots {
    uint32_t a[32][4], b[32][2];
};
inline std::vector<imma_slots> imma_ex; // one per warp of the running block
inline int8_t s8_of(uint32_t r, int j) { return (int8_t)(uint8_t)(r >> (8 * j)); }
} // namespace cuemu
inline void imma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    using namespace cuemu;
    const unsigned w = tid.x >> 5, lane = tid.x & 31;
    if (imma_ex.size() < warps.size()) imma_ex.resize(warps.size());
    imma_slots &s = imma_ex[w];
    s.a[lane][0] = a0, s.a[lane][1] = a1, s.a[lane][2] = a2, s.a[lane][3] = a3;
    s.b[lane][0] = b0, s.b[lane][1] = b1;
    arrive(warps[w].bar);
    int A[16][32], B[32][8];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        for (int j = 0; j < 4; j++) {
            A[g][4 * t + j] = s8_of(s.a[l][0], j);
            A[g + 8][4 * t + j] = s8_of(s.a[l][1], j);
            A[g][16 + 4 * t + j] = s8_of(s.a[l][2], j);
            A[g + 8][16 + 4 * t + j] = s8_of(s.a[l][3], j);
            B[4 * t + j][g] = s8_of(s.b[l][0], j);
            B[16 + 4 * t + j][g] = s8_of(s.b[l][1], j);
        }
    }
    const int g = (int)lane >> 2, t = (int)lane & 3;
    for (int i = 0; i < 4; i++) {
        const int m = g + 8 * (i >> 1), n = 2 * t + (i & 1);
        int acc = d[i];
        for (int k = 0; k < 32; k++) acc += A[m][k] * B[k][n];
        d[i] = acc;
    }
    arrive(warps[w].bar);
}
