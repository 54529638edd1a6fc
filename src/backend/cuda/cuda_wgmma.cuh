// cuda_wgmma.cuh — Hopper's warpgroup MMA (wgmma) as the kernels use it: m64nNk16 (N = 64, and
// 32 or 16 for a GEMM tile with fewer tokens), bf16 in, f32 accumulate, the B operand (and A where it is not in registers)
// read by the tensor cores from shared memory through a descriptor, 128-byte swizzled.
// Users: k_gemm_wg (cuda_gemm_wg.cuh) and k_attn_wg (cuda_attn_wg.cuh).
//
// Shared-memory operands, the one layout both kernels store: rows of 64 bf16 (128 B) in
// 8-row atoms of 1,024 B, 16-byte chunk c of row r at r * 128 + ((c ^ (r & 7)) << 4),
// the region 1,024-byte aligned (the swizzle is a function of address bits 4-9).
//  - K-major (the k index runs along the row): element (k, n) of a k16 step at
//    start + (n / 8) SBO + (n % 8) 128 + 2 k; SBO = 1,024 (the next 8 rows); LBO unused.
//  - MN-major (n runs along the row; wg_desc_mn, the transpose flag set): element (k, n)
//    at start + (n / 64) LBO + (k / 8) SBO + (k % 8) 128 + 2 (n % 64); SBO = 1,024 (the
//    next 8 k rows), LBO the distance between 64-column blocks.
// tests/cuda/emu/wgmma.h decodes descriptors the same way for the CPU emulator.
//
// sm_90a only: elsewhere (WG_ON 0) the wrappers are empty and the kernels trap; the host
// runs them only where k_wg_probe, compiled the same way, reports the wgmma build.
#pragma once
#include "cuda_common.cuh"
#ifdef LILAC_CUEMU
#include "wgmma.h"
#endif

#if defined(LILAC_CUEMU) || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define WG_ON 1
#else
#define WG_ON 0
#endif

#ifdef LILAC_CUEMU // the emulated MMA completes at once; copies are visible as they land
inline void wg_fence() {}
inline void wg_commit() {}
template <int N> inline void wg_wait() {}
inline void wg_proxy_fence() {}
inline void wg_pin(float &) {}
#define WG_SMEM(name) unsigned char *const name = cuemu::dyn_smem
#elif WG_ON
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// The shared-memory writes this thread made (st.shared, cp.async that landed), visible to
// the async proxy (wgmma's reads of shared memory).
__device__ __forceinline__ void wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
#else
__device__ __forceinline__ void wg_fence() {}
__device__ __forceinline__ void wg_commit() {}
template <int N> __device__ __forceinline__ void wg_wait() {}
__device__ __forceinline__ void wg_proxy_fence() {}
#endif
#ifndef LILAC_CUEMU
#define WG_SMEM(name) extern __shared__ unsigned char name[]
// Pins a register's value to this point of the program (the compiler cannot see wgmma's asynchronous writes).
__device__ __forceinline__ void wg_pin(float &r) { asm volatile("" : "+f"(r)::"memory"); }
#endif
template <int N> __device__ __forceinline__ void wg_pin(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) wg_pin(r[i]);
}
// 1 where the wgmma kernels were built (sm_90a) for the device that runs this, else 0: the host's
// switch (a compute capability of 9.0 alone does not say which image runs, e.g. under PTX JIT).
__global__ void k_wg_probe(int *on) { *on = WG_ON; }

// The bits of bf16(f), rounded to nearest even (finite f).
__device__ __forceinline__ uint32_t wg_bf16_rn(float f) {
#ifdef LILAC_CUEMU
    const uint32_t u = __float_as_uint(f);
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
#else
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#endif
}

// Descriptors of a swizzled operand whose first element is at shared address a (bit 62: the
// 128-byte swizzle; addresses, LBO and SBO in 16-byte units).
__device__ __forceinline__ uint64_t wg_desc_k(uint32_t a) { // K-major: SBO 1,024, LBO unused (1)
    return (uint64_t)((a & 0x3FFFFu) >> 4) | 1ull << 16 | (uint64_t)(1024 >> 4) << 32 | 1ull << 62;
}
__device__ __forceinline__ uint64_t wg_desc_mn(uint32_t a, uint32_t lbo) { // MN-major: SBO 1,024, LBO lbo
    return (uint64_t)((a & 0x3FFFFu) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(1024 >> 4) << 32 | 1ull << 62;
}

#if WG_ON && !defined(LILAC_CUEMU)
#define WG_D8 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define WG_D16                                                                                                          \
    WG_D8, "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define WG_D32                                                                                                          \
    WG_D16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),     \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WG_D8_S "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define WG_D16_S "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define WG_D32_S                                                                                                        \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                           \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#endif

// d (+)= A (64 x 16: this warp's 16 rows as an m16n8k16 A fragment, in registers) * B (16 x N,
// shared memory: K-major, or MN-major with TB = 1); accumulate 0: d = A B. N = 16, 32 or 64: the
// columns past N (registers d[N/2 ..]) are left as they are.
// d[4j + c]: row 16 (warp in the group) + lane / 4 + 8 (c >> 1), column 8j + 2 (lane % 4) + (c & 1).
template <int N = 64, int TB = 0>
__device__ __forceinline__ void wg_mma_64xN(float (&d)[32], const uint32_t (&a)[4], uint64_t desc, int accumulate) {
    static_assert(N == 16 || N == 32 || N == 64, "wgmma widths: 16, 32, 64");
#ifdef LILAC_CUEMU
    cuemu::wgmma_m64nNk16_bf16(d, N, a, 0, desc, accumulate, TB);
#elif WG_ON
    if constexpr (N == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32_S ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                     : WG_D32
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(TB));
    else if constexpr (N == 32)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " WG_D16_S ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
                     : WG_D16
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(TB));
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " WG_D8_S ", {%8, %9, %10, %11}, %12, p, 1, 1, %14;\n}\n"
                     : WG_D8
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(TB));
#else
    (void)d, (void)a, (void)desc, (void)accumulate;
#endif
}
template <int TB = 0>
__device__ __forceinline__ void wg_mma_64x64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc, int accumulate) {
    wg_mma_64xN<64, TB>(d, a, desc, accumulate);
}
// The same with A (64 x 16, K-major) from shared memory too.
__device__ __forceinline__ void wg_mma_64x64_ss(float (&d)[32], uint64_t adesc, uint64_t bdesc, int accumulate) {
#ifdef LILAC_CUEMU
    cuemu::wgmma_m64nNk16_bf16(d, 64, nullptr, adesc, bdesc, accumulate, 0);
#elif WG_ON
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32_S ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WG_D32
                 : "l"(adesc), "l"(bdesc), "r"(accumulate));
#else
    (void)d, (void)adesc, (void)bdesc, (void)accumulate;
#endif
}
