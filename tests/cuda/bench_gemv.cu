// bench_gemv.cu — how fast the decode GEMV (k_gemv) streams the model's
// matrices, against a plain read of the same bytes and an empty launch, all
// timed the way the decode step runs them: many launches captured in one CUDA
// graph with programmatic dependent launch, each launch reading weights that
// are not in the L2 (copies rotated past its 60 MB). A benchmark, not a test:
// it prints figures and checks nothing but that the launches ran.
//
//   build/cuda-tests/bench_gemv            (tools/device/run.sh runs it)
//
// Rows of the table: the one-token jobs of cuda_backend.cu at the full model's
// shapes (hidden 2048, 256 experts of 512, vocab 248,320). Columns: the read
// floor (k_read over the same bytes, as many blocks as fit), then k_gemv with
// the grid gemv_launch aims for (0 = one 16-row set per block, else that many
// blocks each looping over its sets).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <array>
#include <vector>

#include "cuda_test.h"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_gemm_tc.cuh"
#include "backend/cuda/cuda_gdn.cuh"
#include "backend/cuda/cuda_attn_split.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_argmax.cuh"
#include "backend/cuda/cuda_packed.cuh"

static const int NL = 40;    // launches per graph
static const int REPS = 15;  // timed replays (median)
static cudaStream_t st;

// ---------------------------------------------------------------- device fills (hash of the index: no host work)

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
    uint64_t z = i * 0x9e3779b97f4a7c15ull + seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)(z ^ (z >> 31));
}
__global__ void k_fill_bits(uint32_t *p, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = hash32((uint64_t)i, seed);
}
// bf16 scale in [0.001, 0.003) | bf16 bias in [-0.03, 0) << 16: sane products, no inf/NaN
__global__ void k_fill_sb(uint32_t *p, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t h = hash32((uint64_t)i, seed);
        const __nv_bfloat16 s = __float2bfloat16(0.001f + 0.002f * (float)(h & 0xffff) / 65536.0f);
        const __nv_bfloat16 b = __float2bfloat16(-0.03f * (float)(h >> 16) / 65536.0f);
        p[i] = (uint32_t)__bfloat16_as_ushort(s) | (uint32_t)__bfloat16_as_ushort(b) << 16;
    }
}
__global__ void k_fill_f(float *p, int64_t n, uint32_t seed, float a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = a * ((float)(hash32((uint64_t)i, seed) >> 8) / 8388608.0f - 1.0f);
}

// ---------------------------------------------------------------- reference kernels

__global__ void k_empty(int *sink) {
    pdl_wait();
    pdl_trigger();
    if (threadIdx.x == 1023) *sink = 0; // never: keeps the kernel from being empty of side effects
}

// Reads n16 uint4 (4 loads in flight per thread per round); one word out per block.
__global__ void __launch_bounds__(256) k_read(const uint4 *p, int64_t n16, uint32_t *out) {
    uint32_t acc = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride), d = __ldg(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        const uint4 a = __ldg(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    pdl_wait();
    pdl_trigger();
    if (acc == 0x9e3779b9u) out[blockIdx.x] = acc; // practically never; keeps the loads
}

// ---------------------------------------------------------------- timing

// Median microseconds per launch over REPS replays of a graph of NL launches.
template <class F>
static double time_graph(F launch) {
    return graph_median_ms(st, [&]() { for (int i = 0; i < NL; i++) CK(launch(i)); }, REPS) * 1000.0 / NL;
}

// ---------------------------------------------------------------- matrices

struct bmat {
    dmat W;
    int64_t bytes; // per expert
};
static std::vector<void *> allocs;
template <typename T>
static T *dalloc(int64_t n) {
    T *p;
    CK(cudaMalloc((void **)&p, sizeof(T) * (size_t)n));
    allocs.push_back(p);
    return p;
}
static uint32_t seed_ctr = 1;

// 4-bit group 64 in the packed layout (cuda_packed.cuh), or 8-bit MLX (row_dot).
static bmat make_mat(int64_t rows, int64_t cols, int bits, int experts = 1) {
    bmat m;
    memset(&m, 0, sizeof m);
    dmat &W = m.W;
    W.type = 0;
    W.bits = bits;
    W.group = 64;
    W.rows = rows;
    W.cols = cols;
    W.stride = rows;
    W.n_experts = experts;
    const int64_t ng = cols / 64;
    if (bits == 4) {
        const int64_t RB = (rows + 15) / 16;
        uint4 *pk = dalloc<uint4>(experts * RB * ng * 32);
        uint32_t *psb = dalloc<uint32_t>(experts * RB * ng * 16);
        k_fill_bits<<<1024, 256>>>((uint32_t *)pk, experts * RB * ng * 128, seed_ctr++);
        k_fill_sb<<<1024, 256>>>(psb, experts * RB * ng * 16, seed_ctr++);
        W.pk = pk;
        W.psb = psb;
        W.pk_rb = RB;
        m.bytes = RB * ng * (512 + 64);
    } else {
        uint32_t *q = dalloc<uint32_t>(experts * rows * cols / 4);
        uint32_t *sb = dalloc<uint32_t>(experts * rows * ng); // s then b, bf16 each
        k_fill_bits<<<1024, 256>>>(q, experts * rows * cols / 4, seed_ctr++);
        k_fill_sb<<<1024, 256>>>(sb, experts * rows * ng, seed_ctr++);
        W.q = q;
        W.s = (const __nv_bfloat16 *)sb;
        W.b = (const __nv_bfloat16 *)sb + experts * rows * ng;
        m.bytes = rows * cols + rows * ng * 4;
    }
    CKL();
    return m;
}

// One decode GEMV job: matrices (copies rotated so no launch finds its weights
// in the L2), the input mode and, for experts, the routed slots.
struct bjob {
    const char *name;
    std::vector<std::vector<bmat>> copies; // [copy][matrix]
    std::vector<int> routed;               // per matrix: expert matrix read through topi
    int xm, slots, x_div;
    int tail; // gemv_tail kind run by the last block (TAIL_COMBINE after down)
    bool tk;  // expert mode: the router's top-k made by every block from 256 logits (tk_logits)
    int64_t bytes; // per launch
};

int main(int argc, char **argv) {
    (void)argv;
    if (argc > 1) { fprintf(stderr, "usage: bench_gemv\n"); return 2; }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) { fprintf(stderr, "no CUDA device\n"); return 2; }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int *sink = dalloc<int>(1);
    uint32_t *rsink = dalloc<uint32_t>(1 << 16);

    // BENCH_ONLY=prefix: only the rows whose name starts with it, at the backend's grid (for a profiler run)
    const char *only = getenv("BENCH_ONLY");
    // 1. an empty launch, with and without PDL
    for (int pdl = 0; pdl < 2 && !only; pdl++) {
        const double us = time_graph([&](int) { return launch_ex(st, pdl != 0, k_empty, dim3(2 * sms), dim3(256), 0, sink); });
        printf("empty kernel (%d blocks), %s: %.2f us per launch\n", 2 * sms, pdl ? "PDL" : "no PDL", us);
    }

    // 2. the jobs
    const int64_t H = 2048, I = 512, E = 256, K = 8, V = 248320;
    std::vector<bjob> jobs;
    auto add = [&](const char *name, std::vector<std::array<int64_t, 3>> mats, std::vector<int> routed, int xm, int slots,
                   int x_div, int tail = TAIL_NONE) {
        bjob j;
        j.tail = tail;
        j.tk = false;
        j.name = name;
        j.routed = routed;
        j.xm = xm;
        j.slots = slots;
        j.x_div = x_div;
        j.bytes = 0;
        bool any_routed = false;
        for (size_t i = 0; i < mats.size(); i++) any_routed |= routed[i] != 0;
        const int ncopy = any_routed ? 1 : 8; // experts: 256 of them, 8 drawn per launch
        for (int c = 0; c < ncopy; c++) {
            std::vector<bmat> ms;
            for (size_t i = 0; i < mats.size(); i++) ms.push_back(make_mat(mats[i][0], mats[i][1], (int)mats[i][2], routed[i] ? (int)E : 1));
            j.copies.push_back(ms);
        }
        for (size_t i = 0; i < mats.size(); i++) j.bytes += j.copies[0][i].bytes * (routed[i] ? slots : 1);
        jobs.push_back(j);
    };
    add("gdn in_proj qkv/z/b/a (norm)", {{8192, H, 4}, {4096, H, 4}, {32, H, 4}, {32, H, 4}}, {0, 0, 0, 0}, XM_NORM, 0, 1);
    add("attn q/k/v (norm)", {{8192, H, 4}, {512, H, 4}, {512, H, 4}}, {0, 0, 0}, XM_NORM, 0, 1);
    add("out_proj 2048x4096 (accum)", {{H, 4096, 4}}, {0}, XM_PLAIN, 0, 1);
    add("router 8b + shared gate/up (norm)", {{E, H, 8}, {I, H, 4}, {I, H, 4}, {1, H, 8}}, {0, 0, 0, 0}, XM_NORM, 0, 1);
    add("experts gate/up, 8 slots", {{I, H, 4}, {I, H, 4}}, {1, 1}, XM_PLAIN, (int)K, (int)K);
    add("  + top-k made in-kernel", {{I, H, 4}, {I, H, 4}}, {1, 1}, XM_PLAIN, (int)K, (int)K);
    jobs.back().tk = true;
    add("experts down 8 + shared (swiglu)", {{H, I, 4}, {H, I, 4}}, {1, 0}, XM_SWIGLU, (int)K, 1);
    add("  + combine tail", {{H, I, 4}, {H, I, 4}}, {1, 0}, XM_SWIGLU, (int)K, 1, TAIL_COMBINE);
    add("lm_head (norm)", {{V, H, 4}}, {0}, XM_NORM, 0, 1);

    // inputs and outputs
    float *x = dalloc<float>(K * 2 * 4096), *gain = dalloc<float>(4096);
    k_fill_f<<<64, 256>>>(x, K * 2 * 4096, 77, 2.0f);
    k_fill_f<<<64, 256>>>(gain, 4096, 78, 1.5f);
    float *y = dalloc<float>(K * V + 4 * 8192);
    CK(cudaMemset(y, 0, sizeof(float) * (size_t)(K * V + 4 * 8192)));
    int *topi = dalloc<int>(NL * K);
    // the tails' buffers: arrival counter, the router's top-k, the residual row the combine adds to
    int *done = dalloc<int>(1), *tk_i = dalloc<int>(K);
    float *tk_w = dalloc<float>(K), *xres = dalloc<float>(H), *rlog = dalloc<float>(NL * E);
    k_fill_f<<<64, 256>>>(rlog, NL * E, 80, 3.0f); // router logits, one row per launch
    CK(cudaMemset(done, 0, sizeof(int)));
    CK(cudaMemset(xres, 0, sizeof(float) * H));
    k_fill_f<<<1, 32>>>(tk_w, K, 79, 0.2f);
    {
        std::vector<int> t((size_t)(NL * K));
        for (int l = 0; l < NL; l++)
            for (int k = 0; k < K; k++) {
                int e;
                bool dup;
                do { // distinct experts per launch
                    e = rnd_int((int)E);
                    dup = false;
                    for (int q = 0; q < k; q++) dup |= t[(size_t)(l * K + q)] == e;
                } while (dup);
                t[(size_t)(l * K + k)] = e;
            }
        CK(cudaMemcpy(topi, t.data(), sizeof(int) * t.size(), cudaMemcpyHostToDevice));
    }
    // a read pool for k_read: 8 regions of the largest job's bytes
    int64_t maxb = 0;
    for (auto &j : jobs) maxb = std::max(maxb, j.bytes);
    const int64_t region = (maxb + 255) / 256 * 256;
    uint4 *pool = dalloc<uint4>(8 * region / 16);
    k_fill_bits<<<1024, 256>>>((uint32_t *)pool, 8 * region / 4, 5);
    CKL();

    // launch l of job jb at grid g (as the backend's gemv() does), with in-kernel timestamps into prof when given
    auto launch_job = [&](const bjob &jb, int l, int g, unsigned long long *prof) -> cudaError_t {
        const bool hot = g > 100000; // grid g - 100000 with the same weights every launch (L2-resident when they fit)
        if (hot) { g -= 100000; l = 0; }
        const std::vector<bmat> &ms = jb.copies[(size_t)l % jb.copies.size()];
        gemv_job j;
        memset(&j, 0, sizeof j);
        j.prof = prof;
        j.n = (int)ms.size();
        for (int i = 0; i < j.n; i++) {
            j.W[i] = ms[(size_t)i].W;
            j.y[i] = y + (int64_t)i * 8192;
            j.ldy[i] = jb.slots ? ms[(size_t)i].W.rows : 0;
            if (jb.slots && !jb.routed[(size_t)i]) { // the shared expert's down: its own input row
                j.plain[i] = 1;
                j.x[i] = x;
                j.ldx[i] = 2 * I;
                j.xoff[i] = I;
            }
        }
        if (jb.slots) { j.y[0] = y; j.y[1] = y + K * 4096; }
        j.accum[0] = jb.xm == XM_PLAIN && !jb.slots;
        j.gain = gain;
        j.eps = 1e-6f;
        j.tail.kind = jb.tail;
        j.tail.done = done;
        if (jb.tk) { // logits rotated with the launch, so the experts change as with topi
            j.tk_logits = rlog + (l % NL) * E;
            j.tk_E = (int)E;
            j.tk_K = (int)K;
            j.tk_norm = 1;
            j.tk_topi = tk_i;
            j.tk_topw = tk_w;
        }
        if (jb.tail == TAIL_COMBINE) {
            j.tail.x = xres;
            j.tail.ye = y;
            j.tail.shy = y + K * 4096;
            j.tail.sg = gain;
            j.tail.topw = tk_w;
            j.tail.K = (int)K;
            j.tail.H = H;
        }
        const int64_t cols = ms[0].W.cols;
        const int64_t ldx = jb.xm == XM_SWIGLU ? 2 * cols : cols;
        // g < 0: grid -g launched without programmatic dependent launch (plain stream order)
        return gemv_launch(st, g >= 0, j, jb.xm, x, ldx, cols, jb.slots ? topi + (l % NL) * K : nullptr, jb.x_div,
                           jb.slots, g < 0 ? -g : g);
    };
    const int grids[] = {0, sms, 2 * sms, -2 * sms, 100000 + 2 * sms};
    printf("\n%-36s %8s %16s", "job (one token)", "MB", "read floor");
    for (int g : grids) {
        if (g > 100000) printf("   %-15s", "264, L2-hot");
        else printf("   gemv grid %-4d", g);
    }
    printf("\n%-36s %8s %16s", "", "", "us (TB/s)");
    for (size_t i = 0; i < sizeof grids / sizeof grids[0]; i++) printf("   %-14s", "us (TB/s)");
    printf("\n");
    for (auto &jb : jobs) {
        if (only && strncmp(jb.name, only, strlen(only))) continue;
        const double mb = (double)jb.bytes / 1e6;
        const double rd = time_graph([&](int l) {
            return launch_ex(st, true, k_read, dim3(8 * sms), dim3(256), 0, (const uint4 *)((const char *)pool + (l % 8) * region),
                             jb.bytes / 16, rsink);
        });
        printf("%-36s %8.2f %7.2f (%5.2f)", jb.name, mb, rd, jb.bytes / rd / 1e6);
        std::vector<float> first;
        for (int g : grids) {
            if (only && g != 2 * sms) continue;
            const double us = time_graph([&](int l) { return launch_job(jb, l, g, nullptr); });
            printf("   %6.2f (%5.2f)", us, jb.bytes / us / 1e6);
            fflush(stdout);
            // every grid computes the same rows in the same order: compare with the first
            std::vector<float> out((size_t)(K * 4096 * 2));
            CK(cudaMemcpy(out.data(), y, sizeof(float) * out.size(), cudaMemcpyDeviceToHost));
            if (first.empty()) first = out;
            else if ((jb.xm != XM_PLAIN || jb.slots) && jb.tail != TAIL_COMBINE && g < 100000) { // accumulating jobs drift by design
                double md = 0;
                for (size_t i = 0; i < out.size(); i++) md = std::max(md, (double)fabsf(out[i] - first[i]));
                if (md > 0) printf(" [differs from grid 0 by %.1e]", md);
            }
        }
        printf("\n");
    }
    // Where a launch's time goes: timestamps in blocks 0 and last of the middle launch of a graph
    // (gemv_mark in cuda_gemv.cuh: 0 entry, 1 first copies issued, 2 predecessor done, 3 input
    // staged, 4+k set k reduced, 15 end), and the gap from the previous launch's end.
    if (!only) {
        unsigned long long *pb = dalloc<unsigned long long>(NL * 64);
        unsigned long long hp[NL * 64];
        for (auto &jb : jobs) {
            if (jb.tail != TAIL_NONE || (strncmp(jb.name, "gdn", 3) && strncmp(jb.name, "lm_head", 7) && strncmp(jb.name, "experts gate", 12)))
                continue;
            for (int g : {sms, 2 * sms}) {
                CK(cudaMemset(pb, 0, sizeof(unsigned long long) * NL * 64));
                time_graph([&](int l) { return launch_job(jb, l, g, pb + (size_t)l * 64); });
                CK(cudaMemcpy(hp, pb, sizeof hp, cudaMemcpyDeviceToHost));
                const int l = NL / 2;
                const unsigned long long *c = hp + l * 64, *pv = hp + (l - 1) * 64;
                const unsigned long long prev_end = std::max(pv[16 + 15], pv[32 + 16 + 15]);
                printf("profile %-30s grid %3d, launch %d:\n", jb.name, g, l);
                for (int b = 0; b < 2; b++) {
                    const unsigned long long *ck = c + b * 32, *gt = c + b * 32 + 16;
                    printf("  block %s: starts %+6.2f us after the previous launch's end;", b ? "last" : "0   ",
                           ((double)gt[0] - (double)prev_end) / 1e3);
                    unsigned long long last = ck[0];
                    const char *nm[4] = {"issue", "wait", "stage", ""};
                    for (int i = 1; i < 16; i++) {
                        if (!ck[i]) continue;
                        printf(" %s%s%d %.0f", i < 4 ? nm[i - 1] : "set", "", i < 4 ? 0 : i - 4, (double)(ck[i] - last));
                        last = ck[i];
                    }
                    const double mhz = gt[15] > gt[0] ? (double)(ck[15] - ck[0]) / ((double)(gt[15] - gt[0]) / 1e3) : 0;
                    printf(" cycles; total %.2f us (%.0f MHz)\n", (double)(gt[15] - gt[0]) / 1e3, mhz);
                }
            }
        }
    }
    // the fused MoE down + combine (k_moe_down) that replaces the last two rows above in decode
    if (!only || !strncmp(only, "k_moe", 5)) {
        const bjob *dj = nullptr;
        for (auto &j : jobs)
            if (j.tail == TAIL_COMBINE) dj = &j;
        const dmat Wd = dj->copies[0][0].W, Ws = dj->copies[0][1].W;
        const size_t sm = moe_down_smem(I, (int)K);
        const double us = time_graph([&](int l) {
            return launch_ex(st, true, k_moe_down<1>, dim3((unsigned)((H + 15) / 16)), dim3(256), sm, Wd, Ws, (const float *)x,
                             (const float *)x, I, (const int *)(topi + (l % NL) * K), (const float *)tk_w, (const float *)gain,
                             (int)K, xres);
        });
        const double hot = time_graph([&](int) {
            return launch_ex(st, true, k_moe_down<1>, dim3((unsigned)((H + 15) / 16)), dim3(256), sm, Wd, Ws, (const float *)x,
                             (const float *)x, I, (const int *)topi, (const float *)tk_w, (const float *)gain, (int)K, xres);
        });
        printf("%-36s %8.2f %16s   %6.2f (%5.2f), the same experts every launch (L2-hot) %6.2f\n",
               "k_moe_down: down 8 + shared + combine", (double)dj->bytes / 1e6, "", us, dj->bytes / us / 1e6, hot);
    }
    CK(cudaStreamSynchronize(st));
    for (void *p : allocs) CK(cudaFree(p));
    printf("done\n");
    return 0;
}
