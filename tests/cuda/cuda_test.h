// cuda_test.h — what the kernel test programs (tests/cuda/test_*.cu) share: CUDA
// error checks that end the program with a FAIL line, a device buffer, and a
// seeded generator (splitmix64), so every run draws the same inputs.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include <cuda_runtime.h>

#define CK(call)                                                                                         \
    do {                                                                                                 \
        cudaError_t e_ = (call);                                                                         \
        if (e_ != cudaSuccess) {                                                                         \
            fprintf(stderr, "%s:%d: %s: %s\nFAIL (CUDA error)\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)
// After every launch: the launch itself, then its execution.
#define CKL()                                    \
    do {                                         \
        CK(cudaGetLastError());                  \
        CK(cudaDeviceSynchronize());             \
    } while (0)

template <typename T>
struct dbuf {
    T *p = nullptr;
    size_t n = 0;
    explicit dbuf(size_t n_) : n(n_) { CK(cudaMalloc((void **)&p, sizeof(T) * (n ? n : 1))); }
    ~dbuf() {
        const cudaError_t e = cudaFree(p);
        if (e != cudaSuccess) fprintf(stderr, "cudaFree: %s\n", cudaGetErrorString(e));
    }
    dbuf(const dbuf &) = delete;
    dbuf &operator=(const dbuf &) = delete;
    void put(const T *h) { CK(cudaMemcpy(p, h, sizeof(T) * n, cudaMemcpyHostToDevice)); }
    void put(const std::vector<T> &h) { put(h.data()); }
    // The first m elements only (a segment's rows into a buffer sized for the longest).
    void put_n(const T *h, size_t m) { CK(cudaMemcpy(p, h, sizeof(T) * m, cudaMemcpyHostToDevice)); }
    std::vector<T> get(size_t m = (size_t)-1) const {
        if (m > n) m = n;
        std::vector<T> h(m);
        CK(cudaMemcpy(h.data(), p, sizeof(T) * m, cudaMemcpyDeviceToHost));
        return h;
    }
    void fill_bytes(int b) { CK(cudaMemset(p, b, sizeof(T) * n)); } // 0xff: NaN in every float
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static inline uint64_t rnd() { // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline int rnd_int(int n) { return (int)(rnd() % (uint64_t)n); }
static inline float rnd_unit() { return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)); } // [0, 1)
static inline float rnd_sym(float a) { return (2.0f * rnd_unit() - 1.0f) * a; }                 // [-a, a)

// The benchmarks' timing: what body() enqueues on st, captured once into a CUDA graph, then
// replayed (3 warm-ups, reps timed); the median replay in milliseconds.
template <class F>
static double graph_median_ms(cudaStream_t st, F body, int reps) {
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    body();
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int w = 0; w < 3; w++) CK(cudaGraphLaunch(ge, st));
    std::vector<float> ms;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float t = 0;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(gr));
    return ms[ms.size() / 2];
}
