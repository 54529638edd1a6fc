// emu/cuda_runtime.h — a CPU stand-in for the part of the CUDA runtime and device
// language that src/backend/cuda/cuda_sample.cu and tests/cuda/test_sample.cu use,
// so that both run unchanged on a machine without a GPU (checking the kernels'
// logic: indices, scans, block and warp synchronisation; not timing, not the
// hardware's memory model). Put this directory first on the include path and
// compile as C++20 with g++:
//
//   g++ -std=c++20 -O1 -g -pthread -ffp-contract=off -Itests/cuda/emu -Isrc -x c++
//       tests/cuda/test_sample.cu -x c++ src/backend/cuda/cuda_sample.cu -x none
//       build/src/model/sampler.o build/src/util/common.o -lm -o /tmp/test_sample_emu
//   /tmp/test_sample_emu --quick        (CUEMU_MAX_THREADS=128 runs blocks narrower: faster)
//
// A kernel launch runs its blocks one after another; a block's threads are
// fibers (ucontext) on the calling thread, switched at __syncthreads and at warp
// intrinsics (which exchange values through a per-warp barrier). Every warp
// intrinsic must be reached by all 32 lanes with the full mask (as the code under
// test promises) and every __syncthreads by the whole block: anything else is
// reported as a deadlock. CUEMU_SHUFFLE=1 resumes the threads in a random order
// after each barrier, so a missing barrier shows up as a wrong result. Device
// memory is host memory. Grids may be 2-D; a launch's dynamic shared memory is
// cuemu::dyn_smem. mma.h beside this file stands in for mma.sync m16n8k8 (tf32), for
// src/backend/cuda/cuda_gdn_chunk.cuh (tests/cuda/emu/test_gdn_chunk_emu.cc); wgmma.h for
// wgmma.mma_async m64n64k16 (bf16), for src/backend/cuda/cuda_wgmma.cuh's users
// (tests/cuda/emu/test_gemm_wg_emu.cc, test_attn_wg_emu.cc).
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <ucontext.h>

#include <chrono>
#include <type_traits>
#include <tuple>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct alignas(8) uint2 {
    unsigned x, y;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
struct alignas(8) float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct alignas(8) int2 {
    int x, y;
};
inline int2 make_int2(int x, int y) { return {x, y}; }
#define __align__(n) alignas(n)

namespace cuemu {
struct idx3 {
    unsigned x, y, z;
};
struct barrier {
    unsigned count, expected, phase;
};
struct fiber {
    ucontext_t ctx;  // first entry only; later switches are _setjmp/_longjmp (no signal-mask syscalls)
    jmp_buf jb;
    char *stack;
    bool started, done;
    const unsigned *wait;  // phase counter it waits on (null: runnable)
    unsigned wait_phase;
};
struct warp {
    barrier bar;
    uint64_t slot[32];
};
inline idx3 tid, bid;  // of the running fiber
inline dim3 bdim, gdim;
inline std::vector<fiber> fibers;
inline unsigned cur;
inline jmp_buf sched;
inline barrier block_bar;
inline std::vector<warp> warps;
inline void (*body)(void *);
inline void *body_arg;
inline unsigned char *dyn_smem; // the launch's dynamic shared memory (kernels read it through a macro)

inline void arrive(barrier &b) {
    if (++b.count == b.expected) {
        b.count = 0;
        b.phase++;
        return;
    }
    fiber &f = fibers[cur];
    f.wait = &b.phase;
    f.wait_phase = b.phase;
    if (!_setjmp(f.jb)) _longjmp(sched, 1);
}
inline warp &my_warp() { return warps[tid.x >> 5]; }
inline void check_mask(unsigned m) {
    if (m != 0xffffffffu) {
        fprintf(stderr, "cuemu: warp intrinsic with partial mask %08x\n", m);
        abort();
    }
}
// Every lane publishes v; returns lane src's value.
template <typename T>
inline T exchange(T v, int src) {
    static_assert(sizeof(T) <= 8, "exchange");
    warp &w = my_warp();
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    w.slot[tid.x & 31] = b;
    arrive(w.bar);
    const uint64_t r = w.slot[src & 31];
    arrive(w.bar);
    T out;
    memcpy(&out, &r, sizeof out);
    return out;
}
} // namespace cuemu

#define threadIdx cuemu::tid
#define blockIdx cuemu::bid
#define blockDim cuemu::bdim
#define gridDim cuemu::gdim

inline void __syncthreads() { cuemu::arrive(cuemu::block_bar); }
inline void __syncwarp(unsigned m = 0xffffffffu) {
    cuemu::check_mask(m);
    cuemu::arrive(cuemu::my_warp().bar);
}
template <typename T>
inline T __shfl_sync(unsigned m, T v, int src, int = 32) {
    cuemu::check_mask(m);
    return cuemu::exchange(v, src);
}
template <typename T>
inline T __shfl_xor_sync(unsigned m, T v, int x, int = 32) {
    cuemu::check_mask(m);
    return cuemu::exchange(v, (int)(cuemu::tid.x & 31) ^ x);
}
template <typename T>
inline T __shfl_up_sync(unsigned m, T v, unsigned d, int = 32) {
    cuemu::check_mask(m);
    const int lane = (int)(cuemu::tid.x & 31);
    return cuemu::exchange(v, lane >= (int)d ? lane - (int)d : lane);
}
template <typename T>
inline T __shfl_down_sync(unsigned m, T v, unsigned d, int = 32) {
    cuemu::check_mask(m);
    const int lane = (int)(cuemu::tid.x & 31);
    return cuemu::exchange(v, lane + (int)d < 32 ? lane + (int)d : lane);
}
// redux.sync over the warp's ints (every lane gets the result)
inline int cuemu_reduce(unsigned m, int v, bool mx) {
    cuemu::check_mask(m);
    cuemu::warp &w = cuemu::my_warp();
    w.slot[cuemu::tid.x & 31] = (uint64_t)(int64_t)v;
    cuemu::arrive(w.bar);
    int r = (int)(int64_t)w.slot[0];
    for (int i = 1; i < 32; i++) {
        const int x = (int)(int64_t)w.slot[i];
        r = mx ? (x > r ? x : r) : (x < r ? x : r);
    }
    cuemu::arrive(w.bar);
    return r;
}
inline int __reduce_max_sync(unsigned m, int v) { return cuemu_reduce(m, v, true); }
inline int __reduce_min_sync(unsigned m, int v) { return cuemu_reduce(m, v, false); }
inline unsigned __ballot_sync(unsigned m, int pred) {
    cuemu::check_mask(m);
    cuemu::warp &w = cuemu::my_warp();
    w.slot[cuemu::tid.x & 31] = pred != 0;
    cuemu::arrive(w.bar);
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= (unsigned)(w.slot[i] != 0) << i;
    cuemu::arrive(w.bar);
    return r;
}
inline int __all_sync(unsigned m, int pred) { return __ballot_sync(m, pred) == 0xffffffffu; }
inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __double2float_rn(double x) { return (float)x; }
inline unsigned long long __double2ull_rn(double x) { return (unsigned long long)nearbyint(x); }
inline unsigned long long __double2ull_rd(double x) { return (unsigned long long)floor(x); }
inline unsigned long long __double2ull_ru(double x) { return (unsigned long long)ceil(x); }
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline int __float_as_int(float f) { return (int)__float_as_uint(f); }
inline float __int_as_float(int i) { return __uint_as_float((unsigned)i); }
inline long long __double2ll_rn(double x) { return (long long)nearbyint(x); }
template <typename T> inline T __ldg(const T *p) { return *p; }
template <typename T> inline T __ldcg(const T *p) { return *p; }
inline void __threadfence() {}

// Stand-ins for cuda_common.cuh's device helpers as the emulated kernels use them: copies land
// at once (so the emulator checks what a pipeline copies where, not when); a 32-bit
// shared-memory address is an offset into the launch's dynamic shared memory.
inline void pdl_wait() {}
inline void pdl_trigger() {}
inline void pdl_trigger_early() {}
inline unsigned long long gtimer() { return 0; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
#include "backend/cuda/cuda_reduce.cuh" // warp_sum, block_sum, ... as the kernels have them
inline long long clock64() { return 0; }
inline float atomicAdd(float *p, float v) {
    const float o = *p;
    *p = o + v;
    return o;
}
// One byte of the pair (x, y) per selector nibble (the low 3 bits of each), as PRMT's default mode.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFFu) << (8 * i);
    return r;
}
// mbarriers and bulk copies (cuda_common.cuh): a copy lands at once; the barrier's 64 bits hold the
// completed phases (bits 0-15), the arrivals it expects (16-23) and still awaits (24-31), and the
// transaction bytes still due (32-63). A wait for a phase that has not completed aborts: on the GPU
// it would never return, or return on an older phase of the same parity.
namespace cuemu {
struct mbar_state {
    unsigned phase, count, pending;
    int tx;
};
inline mbar_state mbar_get(const uint64_t *b) {
    return {(unsigned)(*b & 0xFFFFu), (unsigned)(*b >> 16 & 0xFFu), (unsigned)(*b >> 24 & 0xFFu), (int)(uint32_t)(*b >> 32)};
}
inline void mbar_put(uint64_t *b, mbar_state m) {
    if (m.pending == 0 && m.tx == 0) { // the phase completes
        m.phase = (m.phase + 1) & 0xFFFFu;
        m.pending = m.count;
    }
    *b = (uint64_t)m.phase | (uint64_t)m.count << 16 | (uint64_t)m.pending << 24 | (uint64_t)(uint32_t)m.tx << 32;
}
} // namespace cuemu
inline void mbar_init(uint64_t *bar, unsigned count) { *bar = (uint64_t)count << 16 | (uint64_t)count << 24; }
inline void mbar_fence_init() {}
inline void mbar_expect(uint64_t *bar, unsigned bytes) {
    cuemu::mbar_state m = cuemu::mbar_get(bar);
    m.pending--;
    m.tx += (int)bytes;
    cuemu::mbar_put(bar, m);
}
inline void bulk_g2s(void *smem, const void *gmem, unsigned bytes, uint64_t *bar) {
    if (((uintptr_t)smem | (uintptr_t)gmem | bytes) & 15u) {
        fprintf(stderr, "cuemu: bulk copy of %u bytes not 16-byte aligned\n", bytes);
        abort();
    }
    memcpy(smem, gmem, bytes);
    cuemu::mbar_state m = cuemu::mbar_get(bar);
    m.tx -= (int)bytes;
    cuemu::mbar_put(bar, m);
}
inline void mbar_wait(uint64_t *bar, unsigned parity) {
    if ((cuemu::mbar_get(bar).phase & 1u) == (parity & 1u)) {
        fprintf(stderr, "cuemu: mbarrier wait for phase parity %u, which has not completed\n", parity & 1u);
        abort();
    }
}
inline void cp_async4(void *smem, const void *gmem, bool valid) {
    if (valid) memcpy(smem, gmem, 4);
    else memset(smem, 0, 4);
}
inline void cp_async8(void *smem, const void *gmem) { memcpy(smem, gmem, 8); }
inline void cp_async16(void *smem, const void *gmem, bool valid) {
    if (valid) memcpy(smem, gmem, 16);
    else memset(smem, 0, 16);
}
inline uint32_t smem_u32(const void *p) { return (uint32_t)((const unsigned char *)p - cuemu::dyn_smem); }
inline void cp_async16_s(uint32_t s, const void *gmem, bool valid) { cp_async16(cuemu::dyn_smem + s, gmem, valid); }
inline void cp_async4_s(uint32_t s, const void *gmem, bool valid) {
    if (valid) memcpy(cuemu::dyn_smem + s, gmem, 4);
    else memset(cuemu::dyn_smem + s, 0, 4);
}
inline void cp_async_commit() {}
template <int N> inline void cp_async_wait() {}
namespace cuemu {
inline barrier named_bar[16]; // bar_sync's, by id (each completes before its block ends)
}
inline void bar_sync(int id, int n) {
    cuemu::barrier &b = cuemu::named_bar[id & 15];
    if (b.count == 0) b.expected = (unsigned)n;
    cuemu::arrive(b);
}

// ---------------------------------------------------------------- runtime

typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorInvalidValue = 1 };
typedef struct cuemu_stream *cudaStream_t;
typedef struct cuemu_event {
    double t;
} *cudaEvent_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
                      cudaMemcpyDefault };
#define cudaHostAllocDefault 0
#define cudaHostAllocMapped 2

inline const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated CUDA error" : "no error"; }
inline const char *cudaGetErrorName(cudaError_t e) { return e ? "cudaErrorEmulated" : "cudaSuccess"; }
inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
inline cudaError_t cudaMalloc(void **p, size_t n) {
    *p = calloc(1, n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <typename T>
inline cudaError_t cudaMalloc(T **p, size_t n) {
    return cudaMalloc((void **)p, n);
}
inline cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
inline cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) { return cudaMalloc(p, n); }
inline cudaError_t cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
inline cudaError_t cudaFreeHost(void *p) { return cudaFree(p); }
inline cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned) {
    *d = h;
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
    memmove(d, s, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t = 0) {
    return cudaMemcpy(d, s, n, k);
}
inline cudaError_t cudaMemset(void *d, int v, size_t n) {
    memset(d, v, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t = 0) { return cudaMemset(d, v, n); }
inline cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = nullptr;
    return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
inline double cuemu_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = new cuemu_event{0};
    return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t = 0) {
    e->t = cuemu_now();
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float)((b->t - a->t) * 1e3);
    return cudaSuccess;
}

namespace cuemu {
template <typename... P, size_t... I>
inline void call(void (*f)(P...), void **args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<P>> *>(args[I])...);
}
} // namespace cuemu

namespace cuemu {
inline void fiber_main() {
    body(body_arg);
    fibers[cur].done = true;
    _longjmp(sched, 1);
}
// Switch to fiber t until it waits at a barrier or ends.
__attribute__((noinline)) inline void resume(unsigned t) {
    fiber &f = fibers[t];
    cur = t;
    tid = {t, 0, 0};
    if (!_setjmp(sched)) {
        if (!f.started) {
            f.started = true;
            setcontext(&f.ctx);
        }
        _longjmp(f.jb, 1);
    }
}
// Run one block: resume runnable fibers until all are done; no progress in a full
// pass means some never reach the barrier the others wait at.
inline void run_block(unsigned nt, uint64_t *shuffle) {
    static const size_t STACK = 256 << 10;
    if (fibers.size() < nt) fibers.resize(nt);  // stacks are kept for later launches
    block_bar = {0, nt, 0};
    warps.assign(nt / 32, warp{{0, 32, 0}, {0}});
    for (unsigned t = 0; t < nt; t++) {
        fiber &f = fibers[t];
        if (!f.stack) f.stack = (char *)malloc(STACK);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = STACK;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_main, 0);
        f.started = f.done = false;
        f.wait = nullptr;
    }
    std::vector<unsigned> order(nt);
    for (unsigned t = 0; t < nt; t++) order[t] = t;
    for (;;) {
        bool all_done = true, progress = false;
        if (shuffle)
            for (unsigned i = nt; i > 1; i--) {
                *shuffle = *shuffle * 6364136223846793005ull + 1442695040888963407ull;
                std::swap(order[i - 1], order[(unsigned)(*shuffle >> 33) % i]);
            }
        for (unsigned k = 0; k < nt; k++) {
            const unsigned t = order[k];
            fiber &f = fibers[t];
            if (f.done) continue;
            all_done = false;
            if (f.wait && *f.wait == f.wait_phase) continue;
            f.wait = nullptr;
            resume(t);
            progress = true;
        }
        if (all_done) return;
        if (!progress) {
            fprintf(stderr, "cuemu: deadlock in block %u (a barrier or warp intrinsic not reached by all)\n", bid.x);
            abort();
        }
    }
}
} // namespace cuemu

// Blocks run one after another (x fastest, then y); CUEMU_MAX_THREADS (a multiple of 32)
// narrows them; smem bytes of dynamic shared memory (zeroed, 128-byte aligned) in
// cuemu::dyn_smem, shared by the blocks in turn.
template <typename... P>
inline cudaError_t cudaLaunchKernel(void (*f)(P...), dim3 g, dim3 b, void **args, size_t smem = 0, cudaStream_t = 0) {
    unsigned nt = b.x;
    if (const char *m = getenv("CUEMU_MAX_THREADS")) {
        const unsigned lim = (unsigned)atoi(m);
        if (lim >= 32 && lim % 32 == 0 && lim < nt) nt = lim;
    }
    if (nt % 32 || b.y != 1 || b.z != 1 || g.z != 1) {
        fprintf(stderr, "cuemu: unsupported launch shape\n");
        abort();
    }
    static uint64_t shuffle_state = 0x853c49e6748fea9bull;
    const char *sh = getenv("CUEMU_SHUFFLE");
    cuemu::bdim = dim3(nt);
    cuemu::gdim = g;
    struct launch {
        void (*f)(P...);
        void **args;
    } L{f, args};
    cuemu::body = [](void *p) {
        launch *l = (launch *)p;
        cuemu::call(l->f, l->args, std::index_sequence_for<P...>{});
    };
    cuemu::body_arg = &L;
    cuemu::dyn_smem = smem ? (unsigned char *)aligned_alloc(128, (smem + 127) / 128 * 128) : nullptr;
    if (smem && !cuemu::dyn_smem) return cudaErrorMemoryAllocation;
    if (smem) memset(cuemu::dyn_smem, 0, smem);
    for (unsigned by = 0; by < g.y; by++)
        for (unsigned blk = 0; blk < g.x; blk++) {
            cuemu::bid = {blk, by, 0};
            cuemu::run_block(nt, sh && *sh == '1' ? &shuffle_state : nullptr);
        }
    free(cuemu::dyn_smem);
    cuemu::dyn_smem = nullptr;
    cuemu::body_arg = nullptr;
    return cudaSuccess;
}
// cuda_common.cuh's launcher, as the kernels' host sides call it (programmatic serialization
// means nothing here: launches run one after another): the arguments as the kernel's types.
template <typename... P, typename... A, size_t... I>
inline cudaError_t cuemu_launch(void (*k)(P...), dim3 g, dim3 b, size_t sm, std::index_sequence<I...>, A &&...a) {
    std::tuple<std::remove_cv_t<std::remove_reference_t<P>>...> t(static_cast<A &&>(a)...);
    void *args[] = {(void *)&std::get<I>(t)..., nullptr};
    return cudaLaunchKernel(k, g, b, args, sm);
}
template <typename... P, typename... A>
inline cudaError_t launch_ex(cudaStream_t, bool, void (*k)(P...), dim3 g, dim3 b, size_t sm, A &&...a) {
    return cuemu_launch(k, g, b, sm, std::index_sequence_for<P...>{}, static_cast<A &&>(a)...);
}
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <typename F>
inline cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) { return cudaSuccess; }
