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
#define __shared__ static thread_local // a block's own: cluster blocks run on threads of their own

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
#define __align__(n) __attribute__((aligned(n)))

namespace cuemu {
struct idx3 {
    unsigned x, y, z;
};
} // namespace cuemu
// The running fiber's thread and block, and the launch's shape (variables, not macros: a launch
// configuration has members of the same names).
inline thread_local cuemu::idx3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;
namespace cuemu {
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
inline thread_local std::vector<fiber> fibers;
inline thread_local unsigned cur;
inline thread_local jmp_buf sched;
inline thread_local barrier block_bar;
inline thread_local std::vector<warp> warps;
inline thread_local void (*body)(void *);
inline thread_local void *body_arg;
inline thread_local unsigned char *dyn_smem; // the launch's dynamic shared memory (kernels read it through a macro)

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
inline warp &my_warp() { return warps[cur >> 5]; }
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
    w.slot[cur & 31] = b;
    arrive(w.bar);
    const uint64_t r = w.slot[src & 31];
    arrive(w.bar);
    T out;
    memcpy(&out, &r, sizeof out);
    return out;
}
} // namespace cuemu


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
    return cuemu::exchange(v, (int)(cuemu::cur & 31) ^ x);
}
template <typename T>
inline T __shfl_up_sync(unsigned m, T v, unsigned d, int = 32) {
    cuemu::check_mask(m);
    const int lane = (int)(cuemu::cur & 31);
    return cuemu::exchange(v, lane >= (int)d ? lane - (int)d : lane);
}
template <typename T>
inline T __shfl_down_sync(unsigned m, T v, unsigned d, int = 32) {
    cuemu::check_mask(m);
    const int lane = (int)(cuemu::cur & 31);
    return cuemu::exchange(v, lane + (int)d < 32 ? lane + (int)d : lane);
}
// redux.sync over the warp's ints (every lane gets the result)
inline int cuemu_reduce(unsigned m, int v, bool mx) {
    cuemu::check_mask(m);
    cuemu::warp &w = cuemu::my_warp();
    w.slot[cuemu::cur & 31] = (uint64_t)(int64_t)v;
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
    w.slot[cuemu::cur & 31] = pred != 0;
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
inline int atomicMax(int *p, int v) {
    int o = *p;
    if (v > o) *p = v;
    return o;
}
inline unsigned atomicMax(unsigned *p, unsigned v) {
    unsigned o = *p;
    if (v > o) *p = v;
    return o;
}
inline unsigned long long atomicMax(unsigned long long *p, unsigned long long v) {
    unsigned long long o = *p;
    if (v > o) *p = v;
    return o;
}
inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicExch(unsigned *p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicExch(unsigned long long *p, unsigned long long v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline float atomicExch(float *p, float v) {
    const float o = *p;
    *p = v;
    return o;
}
inline unsigned atomicCAS(unsigned *p, unsigned c, unsigned v) {
    __atomic_compare_exchange_n(p, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return c;
}
inline int atomicCAS(int *p, int c, int v) {
    __atomic_compare_exchange_n(p, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return c;
}
inline unsigned atomicInc(unsigned *p, unsigned lim) {
    const unsigned o = *p;
    *p = o >= lim ? 0 : o + 1;
    return o;
}
// CUDA's device-side min and max overloads.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
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
inline thread_local barrier named_bar[16]; // bar_sync's, by id (each completes before its block ends)
}
inline void bar_sync(int id, int n) {
    cuemu::barrier &b = cuemu::named_bar[id & 15];
    if (b.count == 0) b.expected = (unsigned)n;
    cuemu::arrive(b);
}

// ---------------------------------------------------------------- runtime
//
// One emulated device that answers like an H100 (sm_90, 132 SMs, 80 GB). Streams and events run
// synchronously: every operation is done when its call returns. While a thread captures a stream,
// its launches, copies and sets are recorded into the graph instead (their arguments copied; a
// copy reads its source when the graph runs, as a copy node does) and a graph launch replays them.

#include <functional>
#include <mutex>
#include <condition_variable>
#include <thread>
#include <unordered_map>

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorStreamCaptureImplicit = 906,
};
struct cuemu_stream {
    unsigned flags;
};
typedef cuemu_stream *cudaStream_t;
typedef struct cuemu_event {
    double t;
} *cudaEvent_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
                      cudaMemcpyDefault };
#define cudaHostAllocDefault 0
#define cudaHostAllocPortable 1
#define cudaHostAllocMapped 2
#define cudaStreamDefault 0
#define cudaStreamNonBlocking 1
#define cudaEventDefault 0
#define cudaEventBlockingSync 1
#define cudaEventDisableTiming 2
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeRelaxed };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone, cudaStreamCaptureStatusActive, cudaStreamCaptureStatusInvalidated };
enum cudaDeviceAttr { cudaDevAttrMaxThreadsPerBlock = 1, cudaDevAttrMultiProcessorCount = 16,
                      cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76,
                      cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
struct cudaDeviceProp {
    char name[256];
    int major, minor, multiProcessorCount, maxThreadsPerBlock, warpSize, regsPerBlock, l2CacheSize;
    int pciBusID, pciDeviceID, pciDomainID, clockRate, memoryClockRate, memoryBusWidth;
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin, sharedMemPerMultiprocessor;
};
namespace cuemu {
inline const char *const device_name = "emulated H100 (CPU)";
const size_t device_bytes = 80ull << 30;
struct graph {
    std::vector<std::function<void()>> ops;
};
inline thread_local graph *capture; // the graph this thread's stream work goes to, or null
inline std::mutex alloc_mu;
inline std::unordered_map<void *, size_t> allocs;
inline size_t alloc_bytes;
// Run op now, or record it while this thread captures.
inline cudaError_t submit(std::function<void()> op) {
    if (capture) capture->ops.push_back(std::move(op));
    else op();
    return cudaSuccess;
}
} // namespace cuemu
typedef cuemu::graph *cudaGraph_t;
typedef cuemu::graph *cudaGraphExec_t;

inline const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated CUDA error" : "no error"; }
inline const char *cudaGetErrorName(cudaError_t e) { return e ? "cudaErrorEmulated" : "cudaSuccess"; }
inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
inline cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
inline cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", cuemu::device_name);
    p->major = 9, p->minor = 0, p->multiProcessorCount = 132, p->maxThreadsPerBlock = 1024, p->warpSize = 32;
    p->regsPerBlock = 65536, p->l2CacheSize = 50 << 20, p->clockRate = 1980000, p->memoryClockRate = 2619000;
    p->memoryBusWidth = 5120, p->totalGlobalMem = cuemu::device_bytes, p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = 227 << 10, p->sharedMemPerMultiprocessor = 228 << 10;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev) {
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, dev);
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)p.sharedMemPerBlockOptin; break;
    default: return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}
// C entry points (lilac's C side calls these two by name; weak: both backend units include this).
extern "C" __attribute__((weak)) cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) {
    std::lock_guard<std::mutex> g(cuemu::alloc_mu);
    *tot = cuemu::device_bytes;
    *fr = cuemu::alloc_bytes < cuemu::device_bytes ? cuemu::device_bytes - cuemu::alloc_bytes : 0;
    return cudaSuccess;
}
// The PCI address names the emulator, where lilac's start-up line shows the device.
extern "C" __attribute__((weak)) cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int) {
    snprintf(bus, (size_t)len, "cpu-emulator (emulated H100)");
    return cudaSuccess;
}
// Device memory is host memory, zeroed, 256-byte aligned as cudaMalloc's; counted against the 80 GB.
inline cudaError_t cudaMalloc(void **p, size_t n) {
    std::lock_guard<std::mutex> g(cuemu::alloc_mu);
    *p = nullptr;
    if (n > cuemu::device_bytes - cuemu::alloc_bytes) return cudaErrorMemoryAllocation;
    const size_t r = (n + 255) / 256 * 256;
    *p = aligned_alloc(256, r ? r : 256);
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0, r);
    cuemu::allocs[*p] = n;
    cuemu::alloc_bytes += n;
    return cudaSuccess;
}
template <typename T>
inline cudaError_t cudaMalloc(T **p, size_t n) {
    return cudaMalloc((void **)p, n);
}
inline cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    std::lock_guard<std::mutex> g(cuemu::alloc_mu);
    auto it = cuemu::allocs.find(p);
    if (it == cuemu::allocs.end()) return cudaErrorInvalidValue;
    cuemu::alloc_bytes -= it->second;
    cuemu::allocs.erase(it);
    free(p);
    return cudaSuccess;
}
inline cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) {
    *p = calloc(1, n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <typename T>
inline cudaError_t cudaHostAlloc(T **p, size_t n, unsigned f) {
    return cudaHostAlloc((void **)p, n, f);
}
inline cudaError_t cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, 0); }
template <typename T>
inline cudaError_t cudaMallocHost(T **p, size_t n) {
    return cudaHostAlloc((void **)p, n, 0);
}
inline cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
inline cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned) {
    *d = h;
    return cudaSuccess;
}
template <typename T>
inline cudaError_t cudaHostGetDevicePointer(T **d, void *h, unsigned f) {
    return cudaHostGetDevicePointer((void **)d, h, f);
}
inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind = cudaMemcpyDefault, cudaStream_t = 0) {
    return cuemu::submit([=] { memmove(d, s, n); });
}
inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
    memmove(d, s, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t = 0) {
    return cuemu::submit([=] { memset(d, v, n); });
}
inline cudaError_t cudaMemset(void *d, int v, size_t n) {
    memset(d, v, n);
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = new cuemu_stream{0};
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) {
    *s = new cuemu_stream{f};
    return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete s;
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
inline double cuemu_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = new cuemu_event{0};
    return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t = 0) {
    if (!cuemu::capture) e->t = cuemu_now();
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float)((b->t - a->t) * 1e3);
    return cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned = 0) { return cudaSuccess; }
// Graphs: a capture records this thread's stream work (every stream: work on a second stream
// joins a capture through events, and here all streams are one); a launch replays it in order.
inline cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
    if (cuemu::capture) return cudaErrorStreamCaptureImplicit;
    cuemu::capture = new cuemu::graph;
    return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g) {
    if (!cuemu::capture) return cudaErrorInvalidValue;
    *g = cuemu::capture;
    cuemu::capture = nullptr;
    return cudaSuccess;
}
inline cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus *s) {
    *s = cuemu::capture ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long = 0) {
    *x = new cuemu::graph(*g);
    return cudaSuccess;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t) {
    if (cuemu::capture) return cudaErrorStreamCaptureImplicit;
    for (auto &op : x->ops) op();
    return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
    delete x;
    return cudaSuccess;
}

// Clusters (__cluster_dims__): a kernel declared with one is aligned to 2^(16 + x) bytes, which tells
// the launcher its cluster size x (2, 4 or 8; a section would do for plain functions, but g++ ignores
// it on templates). A kernel without clusters that lands there by chance loses nothing: its blocks
// then run on threads of their own, still one at a time. The blocks of a cluster run on threads of
// their own (so that each has its own __shared__ variables), one at a time: a block runs until it
// ends or waits at the cluster barrier, then hands over to the next, in rank order; so runs stay
// deterministic.
#define __cluster_dims__(x, y, z) __attribute__((aligned(1 << (16 + (x))), noinline))
namespace cuemu {
inline unsigned cluster_size_of(const void *f) {
    const uintptr_t a = (uintptr_t)f;
    for (unsigned x = 8; x >= 2; x /= 2)
        if (a % ((uintptr_t)1 << (16 + x)) == 0) return x;
    return 1;
}
struct cluster_run {
    std::mutex mu;
    std::condition_variable cv;
    unsigned n, turn = 0, arrived = 0, phase = 0;
    std::vector<bool> done;
    std::vector<char *> anchor; // each block thread's tls_anchor
};
inline thread_local cluster_run *cluster;
inline thread_local unsigned cluster_rank;
inline thread_local char tls_anchor;
// Hand the turn to the next block that has not ended (caller holds the lock).
inline void cluster_pass(cluster_run &c) {
    for (unsigned k = 1; k <= c.n; k++) {
        const unsigned r = (c.turn + k) % c.n;
        if (!c.done[r]) {
            c.turn = r;
            break;
        }
    }
    c.cv.notify_all();
}
// Block-level arrival at the cluster barrier (one fiber of the block calls it).
inline void cluster_arrive() {
    cluster_run &c = *cluster;
    std::unique_lock<std::mutex> l(c.mu);
    const unsigned ph = c.phase;
    if (++c.arrived == c.n) {
        c.arrived = 0;
        c.phase++;
        return;
    }
    unsigned passes = 0;
    while (c.phase == ph) {
        cluster_pass(c);
        c.cv.wait(l, [&] { return c.turn == cluster_rank; });
        if (c.phase == ph && ++passes > 2 * c.n) {
            fprintf(stderr, "cuemu: deadlock at a cluster barrier (a block ended without reaching it)\n");
            abort();
        }
    }
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
    threadIdx = {t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y)};
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
    warps.assign((nt + 31) / 32, warp{{0, 32, 0}, {0}});
    if (nt % 32) warps.back().bar.expected = nt % 32;
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
            fprintf(stderr, "cuemu: deadlock in block %u (a barrier or warp intrinsic not reached by all)\n", blockIdx.x);
            abort();
        }
    }
}
inline uint64_t shuffle_state = 0x853c49e6748fea9bull;
inline uint64_t *shuffle_on() {
    const char *sh = getenv("CUEMU_SHUFFLE");
    return sh && *sh == '1' ? &shuffle_state : nullptr;
}
// One launch, now: blocks one after another (x fastest, then y, then z), or a cluster's blocks in
// turn on threads of their own. CUEMU_MAX_THREADS (a multiple of 32) narrows 1-D blocks (for
// kernels that take their width from blockDim only); smem bytes of dynamic shared memory (zeroed,
// 128-byte aligned) in cuemu::dyn_smem, a block's own.
inline void run_launch(const void *f, dim3 g, dim3 b, size_t smem, void (*fn)(void *), void *arg) {
    unsigned nt = b.x * b.y * b.z;
    if (const char *m = getenv("CUEMU_MAX_THREADS")) {
        const unsigned lim = (unsigned)atoi(m);
        if (b.y == 1 && b.z == 1 && lim >= 32 && lim % 32 == 0 && lim < nt) nt = b.x = lim;
    }
    if (nt == 0 || nt > 1024 || g.x == 0 || g.y == 0 || g.z == 0) {
        fprintf(stderr, "cuemu: launch of grid %ux%ux%u, block %ux%ux%u\n", g.x, g.y, g.z, b.x, b.y, b.z);
        abort();
    }
    unsigned cs = cluster_size_of(f);
    if (g.x % cs) cs = 1;
    auto block = [&](unsigned bx, unsigned by, unsigned bz) {
        blockDim = b, gridDim = g, body = fn, body_arg = arg;
        blockIdx = {bx, by, bz};
        dyn_smem = smem ? (unsigned char *)aligned_alloc(128, (smem + 127) / 128 * 128) : nullptr;
        if (smem) memset(dyn_smem, 0, smem);
        run_block(nt, shuffle_on());
        free(dyn_smem);
        dyn_smem = nullptr;
    };
    for (unsigned bz = 0; bz < g.z; bz++)
        for (unsigned by = 0; by < g.y; by++)
            for (unsigned bx = 0; bx < g.x; bx += cs) {
                if (cs == 1) {
                    block(bx, by, bz);
                    continue;
                }
                cluster_run c;
                c.n = cs;
                c.done.assign(cs, false);
                c.anchor.assign(cs, nullptr);
                std::vector<std::thread> th;
                for (unsigned r = 0; r < cs; r++) // every thread registers its anchor before any block runs
                    th.emplace_back([&, r] {
                        cluster = &c;
                        cluster_rank = r;
                        std::unique_lock<std::mutex> l(c.mu);
                        c.anchor[r] = &tls_anchor;
                        c.cv.notify_all();
                        c.cv.wait(l, [&] { return c.turn == r && std::find(c.anchor.begin(), c.anchor.end(), nullptr) == c.anchor.end(); });
                        l.unlock();
                        block(bx + r, by, bz);
                        l.lock();
                        c.done[r] = true;
                        cluster_pass(c);
                    });
                for (auto &t : th) t.join();
            }
}
template <typename... P, size_t... I>
inline void call_tuple(void (*f)(P...), std::tuple<std::remove_cv_t<std::remove_reference_t<P>>...> &t, std::index_sequence<I...>) {
    f(std::get<I>(t)...);
}
// A launch with its arguments as the kernel's parameter types, now or into the capture.
template <typename... P>
inline cudaError_t launch_tuple(void (*f)(P...), dim3 g, dim3 b, size_t smem,
                                std::tuple<std::remove_cv_t<std::remove_reference_t<P>>...> t) {
    typedef std::tuple<std::remove_cv_t<std::remove_reference_t<P>>...> args_t;
    struct launch {
        void (*f)(P...);
        args_t t;
    };
    return submit([=]() mutable {
        launch L{f, t};
        run_launch((const void *)f, g, b, smem, [](void *p) {
            launch *l = (launch *)p;
            args_t copy = l->t; // every thread its own parameters, as on the GPU
            call_tuple(l->f, copy, std::index_sequence_for<P...>{});
        }, &L);
    });
}
template <typename... P, size_t... I>
inline std::tuple<std::remove_cv_t<std::remove_reference_t<P>>...> args_tuple(void **args, std::index_sequence<I...>) {
    return {*static_cast<std::remove_cv_t<std::remove_reference_t<P>> *>(args[I])...};
}
} // namespace cuemu

template <typename... P>
inline cudaError_t cudaLaunchKernel(void (*f)(P...), dim3 g, dim3 b, void **args, size_t smem = 0, cudaStream_t = 0) {
    return cuemu::launch_tuple(f, g, b, smem, cuemu::args_tuple<P...>(args, std::index_sequence_for<P...>{}));
}
// cudaLaunchKernelEx: programmatic serialization means nothing here (launches run one after another);
// a cooperative launch's blocks are all resident as far as the kernel can tell (none waits on another).
enum cudaLaunchAttributeID { cudaLaunchAttributeCooperative = 2, cudaLaunchAttributeProgrammaticStreamSerialization = 5 };
struct cudaLaunchAttributeValue {
    int cooperative, programmaticStreamSerializationAllowed;
};
struct cudaLaunchAttribute {
    cudaLaunchAttributeID id;
    cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned numAttrs;
};
template <typename... P, typename... A>
inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *c, void (*f)(P...), A &&...a) {
    static_assert(sizeof...(P) == sizeof...(A), "cudaLaunchKernelEx: argument count");
    return cuemu::launch_tuple(f, c->gridDim, c->blockDim, c->dynamicSmemBytes,
                               std::tuple<std::remove_cv_t<std::remove_reference_t<P>>...>(static_cast<A &&>(a)...));
}
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8, cudaFuncAttributePreferredSharedMemoryCarveout = 9 };
template <typename F>
inline cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) { return cudaSuccess; }
template <typename F>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F, int threads, size_t) {
    *n = threads > 0 ? 2048 / threads : 0;
    return cudaSuccess;
}
// A launch's dynamic shared memory as an array of T (cuda_common.cuh's macro, for the emulator).
#define LILAC_DYN_SMEM(T, name, al) T *const name = reinterpret_cast<T *>(cuemu::dyn_smem)
