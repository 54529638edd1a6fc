// bench_phase.cu — what one dependent step of a decode pass costs on this GPU when it
// does almost nothing: the floor under each of the ~213 kernels of a step.
//
// A decode step is a chain of phases, each needing the whole output of the one before
// (the residual's norm, the router's logits, ...). Here every phase is the least such a
// step can be: each block reads the previous phase's 2,048-float vector (8 KB, from the
// L2), takes its RMS (a block sum), optionally stages it as the decode GEMV does (the int8
// pieces of pk_stage4), and writes its 2,048 / grid rows of the next vector. Timed
//   - as kernels: NP launches captured in one CUDA graph, with programmatic dependent
//     launch (as lilac's step runs) and without; with PDL also with the trigger after the
//     staging (LATE), with the blocks padded to 116 KB of shared memory (one a SM at most),
//     at a grid of one block a SM, and with only warp 0 waiting for the predecessor (ONE);
//     each line also says on how many SMs a launch had two or more of its blocks (%smid);
//   - as one persistent cooperative kernel walking the NP phases with a grid barrier
//     (grid_sync, below) between them;
// against an empty kernel's launch. A benchmark, not a test: it prints microseconds per
// phase (docs/perf.md) and checks only that every phase ran (the vectors match the CPU's).
//
//   build/cuda-tests/bench_phase
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "cuda_test.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_packed_dot.cuh"

// ---------------------------------------------------------------- grid barrier
// (the persistent kernel's; launched cooperatively, so every CTA is resident)

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(unsigned *p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Sense-reversing barrier over the whole grid: the last CTA to arrive resets the
// count and bumps the generation the others spin on. Writes before it are
// visible to every CTA after it (fences around the arrival).
__device__ __forceinline__ void grid_sync(unsigned *bar, unsigned long long *prof, int &nb) {
    __syncthreads();
    if (threadIdx.x == 0) {
        if (prof) prof[(2 * nb) * gridDim.x + blockIdx.x] = gtimer();
        const unsigned g = ld_acquire(bar + 32);
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            *(volatile unsigned *)bar = 0;
            __threadfence();
            st_release(bar + 32, g + 1);
        } else {
            // A CTA that never arrives (not co-resident: impossible with a cooperative
            // launch) would hang the GPU: after 2^28 polls (minutes), fail the launch instead.
            for (unsigned spins = 0; *(volatile unsigned *)(bar + 32) == g; spins++)
                if (spins > (1u << 28)) __trap();
        }
        __threadfence();
        if (prof) prof[(2 * nb + 1) * gridDim.x + blockIdx.x] = gtimer();
    }
    nb++;
    __syncthreads();
}

static const int N = 2048;   // the vector: the model's hidden size
static const int NP = 64;    // phases a graph or a persistent launch
static const int REPS = 15;  // timed replays (median)
static const int NT = 256;   // threads a block
static cudaStream_t st;

// One phase in one block: read in[0, N), RMS, (STAGE: pk_stage4 of the normalised
// vector into xq/xsg, as k_gemv stages its input), write rows [r0, r0 + R) of out.
template <bool STAGE>
__device__ __forceinline__ void phase(const float *in, float *out, int r0, int R, float *red, uint4 *xq, float *xsg) {
    float4 v[N / 4 / NT];
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < N / 4 / NT; u++) {
        v[u] = *(const float4 *)(in + 4 * (threadIdx.x + u * NT));
        ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
    }
    const float inv = rsqrtf(block_sum(ss, red) / (float)N + 1e-6f);
    if (STAGE) {
#pragma unroll
        for (int u = 0; u < N / 4 / NT; u++) {
            const float4 w = make_float4(v[u].x * inv, v[u].y * inv, v[u].z * inv, v[u].w * inv);
            pk_stage4(w, threadIdx.x + u * NT, true, xq, xsg);
        }
        __syncthreads();
    }
    // out = 0.5 in / rms + 0.25 (+ a staged piece's share, so the staging is not dead code)
    for (int r = threadIdx.x; r < R && r0 + r < N; r += NT) {
        float y = 0.5f * in[r0 + r] * inv + 0.25f;
        if (STAGE) y += 1e-30f * (float)((const int8_t *)xq)[r & 255];
        out[r0 + r] = y;
    }
}

// The SM a block ran on: smid[phase * MAXG + block] (where the launches' blocks land).
static const int MAXG = 512;
__device__ __forceinline__ unsigned sm_id() {
    unsigned r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}

// ONE: only warp 0 waits for the predecessor (griddepcontrol.wait makes its writes visible to the
// whole grid); the other warps wait at the block barrier, where a warp issues nothing.
template <bool STAGE, bool LATE, bool ONE = false>
__global__ void __launch_bounds__(NT) k_phase(const float *in, float *out, int *smid, int p) {
    __shared__ float red[32];
    __shared__ uint4 xq[N / 4];
    __shared__ float xsg[N / 32];
    if (!LATE) pdl_trigger(); // as lilac's kernels: the next one may launch at once
    if (ONE) {
        if (threadIdx.x < 32) pdl_wait();
        __syncthreads();
    } else {
        pdl_wait();
    }
    const int R = (N + gridDim.x - 1) / gridDim.x;
    phase<STAGE>(in, out, blockIdx.x * R, R, red, xq, xsg);
    if (LATE) pdl_trigger();
    if (threadIdx.x == 0) smid[p * MAXG + blockIdx.x] = (int)sm_id();
}

template <bool STAGE>
__global__ void __launch_bounds__(NT) k_phase_persist(float *a, float *b, int np, unsigned *bar) {
    __shared__ float red[32];
    __shared__ uint4 xq[N / 4];
    __shared__ float xsg[N / 32];
    const int R = (N + gridDim.x - 1) / gridDim.x;
    int nb = 0;
    for (int p = 0; p < np; p++) {
        phase<STAGE>(p & 1 ? b : a, p & 1 ? a : b, blockIdx.x * R, R, red, xq, xsg);
        grid_sync(bar, nullptr, nb);
    }
}

__global__ void k_empty(int *sink) {
    pdl_trigger();
    pdl_wait();
    if (threadIdx.x == 1023) *sink = 0; // never
}

// Median microseconds per phase of what body() enqueues (NP phases), captured in a graph.
template <class F>
static double time_capture(F body, int per) { return graph_median_ms(st, body, REPS) * 1000.0 / per; }

// The CPU's vector after np phases from x (the check that every phase ran).
static std::vector<float> cpu_phases(std::vector<float> x, int np) {
    std::vector<float> y(N);
    for (int p = 0; p < np; p++) {
        double ss = 0;
        for (float v : x) ss += (double)v * v;
        const float inv = (float)(1.0 / sqrt(ss / N + 1e-6));
        for (int i = 0; i < N; i++) y[i] = 0.5f * x[i] * inv + 0.25f;
        x.swap(y);
    }
    return x;
}

int main() {
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    sms = prop.multiProcessorCount;
    printf("device %s, %d SMs; a phase: read %d floats, block sum, write %d / grid rows\n", prop.name, sms, N, N);
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    float *a, *b;
    unsigned *bar;
    int *sink;
    CK(cudaMalloc(&a, N * sizeof(float)));
    CK(cudaMalloc(&b, N * sizeof(float)));
    CK(cudaMalloc(&bar, 128 * sizeof(unsigned)));
    CK(cudaMalloc(&sink, sizeof(int)));
    int *smid;
    CK(cudaMalloc(&smid, (size_t)NP * MAXG * sizeof(int)));
    CK(cudaMemset(bar, 0, 128 * sizeof(unsigned)));
    std::vector<float> x0(N);
    for (int i = 0; i < N; i++) x0[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    const std::vector<float> want = cpu_phases(x0, NP);
    int failed = 0;
    // the vector after one fresh pass of NP phases from x0 (reset, then the body once), against the CPU's
    auto check = [&](const char *what, const float *res) {
        std::vector<float> got(N);
        CK(cudaMemcpy(got.data(), res, N * sizeof(float), cudaMemcpyDeviceToHost));
        double err = 0;
        for (int i = 0; i < N; i++) err = fmax(err, fabs((double)got[i] - want[i]));
        if (err > 1e-4) {
            printf("  %s: max |err| %.3g against the CPU: FAILED\n", what, err);
            failed++;
        }
    };
    auto reset = [&]() { CK(cudaMemcpy(a, x0.data(), N * sizeof(float), cudaMemcpyHostToDevice)); };

    for (int pdl = 1; pdl >= 0; pdl--) {
        const double us = time_capture([&]() {
            for (int p = 0; p < NP; p++) CK(launch_ex(st, pdl != 0, k_empty, dim3(2 * sms), dim3(NT), 0, sink));
        }, NP);
        printf("empty kernel, %d blocks, %s: %.2f us a launch\n", 2 * sms, pdl ? "PDL" : "no PDL", us);
    }
    const int grids[2] = {128, 256};
    const size_t PAD = 116u << 10; // over half a SM's 227 KB: one block a SM at most
    CK(cudaFuncSetAttribute(k_phase<true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PAD));
    CK(cudaFuncSetAttribute(k_phase<false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PAD));
    for (int stage = 0; stage < 2; stage++)
        for (int gi = 0; gi < 2; gi++) {
            const int G = grids[gi];
            // variants: 0 PDL, 1 no PDL, 2 PDL + late trigger, 3 PDL + padded, 4 PDL at grid 132 (128 only),
            // 5 PDL + one warp waits
            for (int var = 0; var < 6; var++) {
                if ((var == 3 && G > sms) || (var == 4 && G != 128)) continue;
                const int Gv = var == 4 ? sms : G;
                const bool pdl = var != 1;
                const size_t sm = var == 3 ? PAD : 0;
                auto body = [&]() {
                    for (int p = 0; p < NP; p++) {
                        const float *in = p & 1 ? b : a;
                        float *out = p & 1 ? a : b;
                        if (var == 5)
                            CK(stage ? launch_ex(st, pdl, k_phase<true, false, true>, dim3(Gv), dim3(NT), sm, in, out, smid, p)
                                     : launch_ex(st, pdl, k_phase<false, false, true>, dim3(Gv), dim3(NT), sm, in, out, smid, p));
                        else if (var == 2)
                            CK(stage ? launch_ex(st, pdl, k_phase<true, true>, dim3(Gv), dim3(NT), sm, in, out, smid, p)
                                     : launch_ex(st, pdl, k_phase<false, true>, dim3(Gv), dim3(NT), sm, in, out, smid, p));
                        else
                            CK(stage ? launch_ex(st, pdl, k_phase<true, false>, dim3(Gv), dim3(NT), sm, in, out, smid, p)
                                     : launch_ex(st, pdl, k_phase<false, false>, dim3(Gv), dim3(NT), sm, in, out, smid, p));
                    }
                };
                // each replay continues from the last one's vector; the check runs one fresh pass
                const double us = time_capture(body, NP);
                reset();
                body();
                CK(cudaStreamSynchronize(st));
                static const char *vn[6] = {" (PDL)", "", " (PDL, late trigger)", " (PDL, 116 KB a block)", " (PDL)",
                                            " (PDL, one warp waits)"};
                char what[96];
                snprintf(what, sizeof what, "kernels%s, grid %d%s", vn[var], Gv, stage ? ", staged" : "");
                check(what, NP & 1 ? b : a);
                // where the check pass's blocks ran: SMs holding two or more blocks of one launch
                std::vector<int> where((size_t)NP * MAXG);
                CK(cudaMemcpy(where.data(), smid, where.size() * sizeof(int), cudaMemcpyDeviceToHost));
                double dbl = 0;
                for (int p = 0; p < NP; p++) {
                    std::vector<int> n(1024, 0);
                    for (int i = 0; i < Gv; i++) n[(size_t)where[(size_t)p * MAXG + i] & 1023]++;
                    for (int c : n) dbl += c >= 2;
                }
                printf("%-52s %6.2f us a phase (%.1f SMs a launch with 2+ of its blocks)\n", what, us, dbl / NP);
            }
            int fit = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, stage ? k_phase_persist<true> : k_phase_persist<false>, NT, 0));
            if (fit * sms < G) {
                printf("persistent, grid %d: does not fit (%d a SM)\n", G, fit);
                continue;
            }
            auto pbody = [&]() {
                int np = NP;
                CK(stage ? launch_coop(st, false, k_phase_persist<true>, dim3(G), dim3(NT), 0, a, b, np, bar)
                         : launch_coop(st, false, k_phase_persist<false>, dim3(G), dim3(NT), 0, a, b, np, bar));
            };
            const double us = time_capture(pbody, NP);
            reset();
            pbody();
            CK(cudaStreamSynchronize(st));
            char what[96];
            snprintf(what, sizeof what, "persistent + grid barrier, grid %d%s", G, stage ? ", staged" : "");
            check(what, NP & 1 ? b : a);
            printf("%-52s %6.2f us a phase\n", what, us);
        }
    printf("%s\n", failed ? "bench_phase: FAILED" : "bench_phase: every variant ran every phase");
    return failed ? 1 : 0;
}
