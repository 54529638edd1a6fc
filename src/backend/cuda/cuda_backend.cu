// cuda_backend.cu — the CUDA backend behind the C interface of backend.h.
//
// Weights go to the GPU in their checkpoint form (4-bit/8-bit codes + bf16
// scales and biases, or bf16), each safetensors tensor uploaded once through
// pinned staging buffers with overlapped copies. A session owns the device
// state (KV cache, GDN state and conv windows) and scratch for one prefill
// chunk. forward() runs the same steps as cpu_forward.c, kernel by kernel; the
// greedy decode loop replays one CUDA graph per token: the argmax kernel writes
// the next input id on the device and into a host-mapped ring the host reads
// one step behind, so the host never waits inside a step.
//
// One translation unit, in parts: cuda_model_upload.cuh (weights on the device),
// cuda_session.cuh (a session's state and set-up), cuda_forward.cuh (the forward
// pass) and cuda_steps.cuh (forward(), decode, snapshots, sampling); the kernels
// are in the headers included below. Here: the shared definitions, the device
// check, the backend's table and bench's measurements.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <utility>
#include <vector>

extern "C" {
#include "../backend.h"
#include "../../util/diag.h"
}
#include "cuda_norm.cuh"
#include "cuda_gemm_tc.cuh"
#include "cuda_gdn.cuh"
#include "cuda_attn_split.cuh"
#include "cuda_moe.cuh"
#include "cuda_argmax.cuh"
#include "cuda_sample.cuh"
#include "cuda_gemm.cuh"
#include "cuda_gemm_wg.cuh"
#include "cuda_packed.cuh"
#include "cuda_attn.cuh"
#include "cuda_gdn_chunk.cuh"

#define CK(call)                                                                                        \
    do {                                                                                                \
        cudaError_t e_ = (call);                                                                        \
        if (e_ != cudaSuccess)                                                                          \
            return lilac_fail(err, "CUDA error %s at %s:%d (%s)", cudaGetErrorName(e_), __FILE__, __LINE__, \
                              cudaGetErrorString(e_));                                                  \
    } while (0)
#define CKL() CK(cudaGetLastError())

// Prefill tokens per pass: bounds activation memory (~0.6 GB per 2048 rows at
// the model's size). 4096 rather than 2048: each expert's tile of tokens is
// fuller and its weights are read half as often (prefill +9% at 4k, +6% at
// 32k; docs/perf.md).
static const int CHUNK = 4096;
// Prefill calls of this many tokens or more take the chunked GDN form (cuda_gdn_chunk.cuh): serial
// and chunked are even at 128 tokens, chunked 1.4x at 256 (test_gdn --time).
static const int GDN_CHUNK_MIN = 128;
// k_gdn_recur's threads per state column and columns per thread (gdn_recur_kernel adapts them
// to the shape): 8 and 2 (docs/perf.md).
static const int GDN_RECUR_RG = 8, GDN_RECUR_COLS = 2;
static const int RING = 1024;   // decoded ids visible to the host
static const int ATT_SPLITS = 32;
static_assert(ATT_SPLITS <= 128, "k_attn_combine merges up to 128 splits");

extern "C" bool lilac_cuda_available(lilac_err *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        lilac_fail(err, "no CUDA GPU available (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        cudaGetLastError();
        return false;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return false;
    if (p.major < 9) {
        lilac_fail(err, "GPU %s is compute capability %d.%d; lilac's CUDA backend needs Hopper (9.0)", p.name, p.major,
                   p.minor);
        return false;
    }
    return true;
}

#include "cuda_model_upload.cuh"
#include "cuda_session.cuh"
#include "cuda_forward.cuh"
#include "cuda_steps.cuh"

extern "C" const lilac_backend lilac_backend_cuda = {
    "cuda", cuda_session_new, cuda_session_free, cuda_session_reset, cuda_session_pos, cuda_forward, cuda_decode_greedy,
    cuda_snapshot, cuda_restore, cuda_snapshot_free, cuda_snapshot_pos, cuda_snapshot_bytes, cuda_forward_batch,
    cuda_sample_begin, cuda_forward_sample, cuda_forward_batch_sample,
    nullptr, // set_kv_bf16: this backend's cache is always bf16
    cuda_route_record,
    nullptr, // route_replay: the CPU reference replays, this backend records
    nullptr, // route_regret
    2,       // kv_bytes: bf16
    cuda_set_attn_bf16,
    cuda_sample_constrain,
    nullptr, // mtp: the MTP head runs on the CPU backend only, for now
};

// ---------------------------------------------------------------- measurements for bench

// Device-to-device copy bandwidth (bytes read + written per second), 2 GB buffers.
extern "C" double lilac_cuda_copy_bandwidth(void) {
    const size_t n = 1ull << 30;
    void *a = nullptr, *b = nullptr;
    cudaEvent_t e0, e1;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) {
        cudaFree(a);
        cudaGetLastError();
        return 0;
    }
    cudaMemset(a, 1, n);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int i = 0; i < 6; i++) {
        cudaEventRecord(e0);
        cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i > 0 && ms < best) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return cudaGetLastError() == cudaSuccess ? 2.0 * n / (best / 1e3) : 0;
}

extern "C" double lilac_cuda_mem_used(void) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return 0;
    return (double)(tot - fr);
}
