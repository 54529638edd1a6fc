// cuda_common.cuh — shared by the CUDA kernels and the host side: the device
// matrix view, warp/block reductions, error checks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_matrix.cuh"

#include "cuda_reduce.cuh" // warp and block sums and maxima, argmax

// Programmatic dependent launch (Hopper): kernels are launched so that they may
// start while their predecessor finishes; pdl_wait() blocks until the
// predecessor grid has completed and its writes are visible (a no-op when the
// kernel was launched normally). Every kernel calls it before reading anything a
// predecessor wrote; pdl_trigger() lets the successor launch early (without it,
// the successor launches as this grid's blocks exit). Nothing before pdl_wait()
// may read memory that any kernel writes: launches can run several kernels ahead.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" :::); }
// The same at the start of kernels whose successor can launch and prefetch its
// weights meanwhile (k_gdn_step, k_attn_dec_mma, k_attn_combine): decode is faster
// when the next GEMV's weight loads overlap these short kernels (docs/perf.md).
__device__ __forceinline__ void pdl_trigger_early() { pdl_trigger(); }

// A launch on stream st, with programmatic stream serialization when pdl (see
// above); coop: cooperative (every block resident at once, for a grid barrier, or an error).
template <typename... P, typename... A>
static inline cudaError_t launch_attr(cudaStream_t st, bool pdl, bool coop, void (*k)(P...), dim3 g, dim3 b, size_t sm,
                                      A &&...a) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g;
    cfg.blockDim = b;
    cfg.dynamicSmemBytes = sm;
    cfg.stream = st;
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    if (pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (coop) {
        at[n].id = cudaLaunchAttributeCooperative;
        at[n++].val.cooperative = 1;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, k, static_cast<A &&>(a)...);
}
template <typename... P, typename... A>
static inline cudaError_t launch_ex(cudaStream_t st, bool pdl, void (*k)(P...), dim3 g, dim3 b, size_t sm, A &&...a) {
    return launch_attr(st, pdl, false, k, g, b, sm, static_cast<A &&>(a)...);
}
template <typename... P, typename... A>
static inline cudaError_t launch_coop(cudaStream_t st, bool pdl, void (*k)(P...), dim3 g, dim3 b, size_t sm, A &&...a) {
    return launch_attr(st, pdl, true, k, g, b, sm, static_cast<A &&>(a)...);
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + __expf(-x)); }

// Asynchronous global->shared copies (sm_80+) to a 32-bit shared-memory address (smem_u32):
// `valid` false zero-fills the destination.
__device__ __forceinline__ void cp_async16_s(uint32_t s, const void *gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4_s(uint32_t s, const void *gmem, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 4 : 0));
}
// The same to a generic pointer into shared memory.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    cp_async16_s((unsigned)__cvta_generic_to_shared(smem), gmem, valid);
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem, bool valid) {
    cp_async4_s((unsigned)__cvta_generic_to_shared(smem), gmem, valid);
}
__device__ __forceinline__ void cp_async8(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// A shared-memory address as the 32-bit offset PTX takes.
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
// Bulk copies by the tensor memory accelerator (sm_90): one thread moves a contiguous
// range (16-byte aligned, a multiple of 16 bytes) into shared memory and the copy
// completes on an mbarrier that counts its bytes: one thread's few instructions where
// cp.async takes every lane's (the decode GEMV's stages: docs/perf.md).
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// After every mbar_init, before a bulk copy or another thread uses the barriers (then a __syncthreads).
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// This thread's arrival, announcing `bytes` of copies that will complete on bar.
__device__ __forceinline__ void mbar_expect(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_g2s(void *smem, const void *gmem, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(smem)),
                 "l"(gmem), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
// Blocks until phase `parity` of bar has completed (its copies landed and are visible to this thread).
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
    asm volatile("{\n"
                 ".reg .pred P1;\n"
                 "WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                 "@!P1 bra WAIT_%=;\n"
                 "}\n" ::"r"(smem_u32(bar)),
                 "r"(parity)
                 : "memory");
}
// Four 8x8 b16 matrices from shared memory (lanes 8i..8i+7 give matrix i's row addresses); _t: transposed.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
// D += A (16 x 16, row) * B (16 x 8, col), bf16 in, f32 accumulate (the PTX fragment map:
// g = lane / 4, t = lane % 4; a0 (g, 2t|2t+1), a1 (g + 8, ..), a2 (g, 2t+8|2t+9), a3 (g + 8, ..);
// b0 (k 2t|2t+1, n g), b1 (k 2t+8|2t+9, n g); c (g + 8 (i >> 1), 2t + (i & 1))).
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// An 8x8 b16 matrix held as ldmatrix leaves it (lane l: row l / 4, columns 2 (l % 4), +1), transposed
// across the warp: lane l gets row l / 4 of the transpose.
__device__ __forceinline__ uint32_t movmatrix_t(uint32_t x) {
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
// A barrier of the n threads (whole warps) that call it with the same id (1..15; __syncthreads uses 0).
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

// The global timer (ns): in-kernel timestamps of the profiling hooks.
__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
