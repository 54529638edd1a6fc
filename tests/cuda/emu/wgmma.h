// emu/wgmma.h — a CPU stand-in for the warpgroup MMA of src/backend/cuda/cuda_wgmma.cuh,
// wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 with A from registers or from shared
// memory and B from shared memory, K-major or MN-major (transposed), and the narrower m64n32k16 and
// m64n16k16 (the first N columns: D's registers past N/2 untouched), for the emulator of
// cuda_runtime.h beside it.
//
// The warpgroup's 128 threads each hand in their share of A (64 x 16) and of D (64 x 64):
// warp w of the group holds rows 16w .. 16w + 15 in the m16n8k16 fragment map (g = lane / 4,
// t = lane % 4): a0 (g, 2t|2t+1), a1 (g + 8, 2t|2t+1), a2 (g, 2t+8|2t+9), a3 (g + 8, 2t+8|2t+9),
// each register two bf16 with the lower k in the low half; d[4j + c] (row g + 8 (c >> 1),
// column 8j + 2t + (c & 1)). Shared-memory operands come through their descriptors, decoded
// as the hardware does with the 128-byte swizzle: K-major element (k, n) (for A: (k, m)) at
// start + (n / 8) SBO + (n % 8) 128 + 2k; MN-major element (k, n) at start + (n / 64) LBO +
// (k / 8) SBO + (k % 8) 128 + 2 (n % 64); then address bits 4-6 XORed with bits 7-9. Any
// other swizzle mode or a base offset aborts. The threads meet at the warpgroup's barrier,
// each computes its own D, and they meet again: a kernel that puts an element in the wrong
// register, lane or shared-memory place gets a wrong product here, as on the GPU. Products
// are exact (bf16 x bf16), sums in f32 in k order; the MMA completes at once (commit and
// wait are no-ops), so the emulator checks layouts, not asynchrony.
#pragma once
#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

namespace cuemu {
struct wg_slots {
    uint32_t a[128][4];
};
inline thread_local std::vector<wg_slots> wg_ex;    // one per warpgroup of the running block
inline thread_local std::vector<barrier> wg_bar;
inline float bf16_bits(uint32_t u16) { return __uint_as_float(u16 << 16); }
// The bf16 at swizzled shared address addr (before the swizzle).
inline float wg_smem_bf16(uint32_t addr) {
    addr ^= ((addr >> 7) & 7) << 4;
    uint16_t v;
    memcpy(&v, dyn_smem + addr, 2);
    return bf16_bits(v);
}
inline void wg_desc_check(uint64_t desc) {
    if ((desc >> 62) != 1 || ((desc >> 49) & 7) != 0) {
        fprintf(stderr, "cuemu: wgmma descriptor %016llx: only the 128-byte swizzle at base offset 0 is emulated\n",
                (unsigned long long)desc);
        abort();
    }
}
// a: this thread's A fragment, or null for A from shared memory (K-major, adesc); tnsp_b: B MN-major.
inline void wgmma_m64nNk16_bf16(float (&d)[32], int N, const uint32_t *a, uint64_t adesc, uint64_t bdesc, int accumulate,
                                int tnsp_b) {
    const unsigned grp = cur >> 7, l = cur & 127, nwg = blockDim.x * blockDim.y * blockDim.z / 128;
    if (wg_ex.size() < nwg) wg_ex.resize(nwg);
    if (wg_bar.size() != nwg) wg_bar.assign(nwg, barrier{0, 128, 0});
    if (blockDim.x % 128) {
        fprintf(stderr, "cuemu: wgmma in a block of %u threads (not whole warpgroups)\n", blockDim.x);
        abort();
    }
    wg_desc_check(bdesc);
    wg_slots &s = wg_ex[grp];
    if (a)
        for (int i = 0; i < 4; i++) s.a[l][i] = a[i];
    arrive(wg_bar[grp]);
    const int w = (int)(l >> 5), lane = (int)(l & 31), g = lane >> 2, t = lane & 3;
    // this thread's two rows of A and all of B
    float A[2][16], B[16][64];
    if (a) { // from the 4 lanes of its warp that share g
        for (int tt = 0; tt < 4; tt++) {
            const uint32_t *r = s.a[32 * w + 4 * g + tt];
            for (int h = 0; h < 2; h++) { // h: row g (a0, a2) or g + 8 (a1, a3)
                A[h][2 * tt] = bf16_bits(r[h] & 0xFFFFu), A[h][2 * tt + 1] = bf16_bits(r[h] >> 16);
                A[h][2 * tt + 8] = bf16_bits(r[2 + h] & 0xFFFFu), A[h][2 * tt + 9] = bf16_bits(r[2 + h] >> 16);
            }
        }
    } else {
        wg_desc_check(adesc);
        const uint32_t start = (uint32_t)(adesc & 0x3FFF) << 4, sbo = (uint32_t)((adesc >> 32) & 0x3FFF) << 4;
        for (int h = 0; h < 2; h++) {
            const int m = 16 * w + g + 8 * h;
            for (int k = 0; k < 16; k++) A[h][k] = wg_smem_bf16(start + (uint32_t)(m / 8) * sbo + (uint32_t)(m % 8) * 128 + 2 * (uint32_t)k);
        }
    }
    const uint32_t start = (uint32_t)(bdesc & 0x3FFF) << 4, lbo = (uint32_t)((bdesc >> 16) & 0x3FFF) << 4,
                   sbo = (uint32_t)((bdesc >> 32) & 0x3FFF) << 4;
    for (int n = 0; n < 64; n++)
        for (int k = 0; k < 16; k++)
            B[k][n] = tnsp_b ? wg_smem_bf16(start + (uint32_t)(n / 64) * lbo + (uint32_t)(k / 8) * sbo + (uint32_t)(k % 8) * 128 + 2 * (uint32_t)(n % 64))
                             : wg_smem_bf16(start + (uint32_t)(n / 8) * sbo + (uint32_t)(n % 8) * 128 + 2 * (uint32_t)k);
    for (int j = 0; j < N / 8; j++)
        for (int c = 0; c < 4; c++) {
            const int h = c >> 1, n = 8 * j + 2 * t + (c & 1);
            float acc = accumulate ? d[4 * j + c] : 0.0f;
            for (int k = 0; k < 16; k++) acc += A[h][k] * B[k][n];
            d[4 * j + c] = acc;
        }
    arrive(wg_bar[grp]);
}
} // namespace cuemu
