// cuda_moe_dec.cuh — one token's MoE block after the router in one kernel, k_moe_split.
// Also built by the CUDA emulator (tests/cuda/emu/test_moe_split_emu.cc runs it on the CPU).
#pragma once
#include <stdio.h>

#include <algorithm>
#include <vector>

#include "cuda_matrix.cuh"
#include "cuda_packed_dot.cuh"
#include "cuda_topk.cuh"

#ifdef LILAC_CUEMU // a launch's dynamic shared memory
#define MOE_SMEM(name) uint4 *const name = reinterpret_cast<uint4 *>(cuemu::dyn_smem)
#else
#define MOE_SMEM(name) extern __shared__ __align__(16) uint4 name[]
#endif

#define MOE_KMAX 8 // routed experts a token, at most

// Phase A of k_moe_split, for the
// unit (expert e, intermediate dims 32c .. 32c+31) of NW warps: warp w takes
// row block w & 3 (gate lo, gate hi, up lo, up hi) and the groups G with
// G % (NW/4) == w >> 2 of the H-wide input, MOE_AG * 8 / NW of them.
#define MOE_AG 16 // groups of the gate/up input per warp at 8 warps (H = 2048: 32 groups over 2 warps)
template <int NW>
struct moe_a_regs {
    static constexpr int AG = MOE_AG * 8 / NW, NP = NW / 4; // groups a warp, group parities
    uint4 pa[AG];
    uint32_t sa[AG];
};
template <int NW>
__device__ __forceinline__ void moe_a_load(moe_a_regs<NW> &A, const dmat &Wg, const dmat &Wu, int e, int64_t c, int64_t ngu) {
    constexpr int AG = moe_a_regs<NW>::AG, NP = moe_a_regs<NW>::NP;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, rbl = warp & 3, gh = warp >> 2;
    const dmat W = dmat_expert(rbl < 2 ? Wg : Wu, e);
    const int64_t rb = c * 2 + (rbl & 1);
#pragma unroll
    for (int i = 0; i < AG; i++) {
        const int64_t G = gh + NP * i;
        if (G < ngu) {
            A.pa[i] = __ldg(W.pk + (rb * ngu + G) * 32 + lane);
            A.sa[i] = __ldg(W.psb + (rb * ngu + G) * 16 + g + 8 * (t & 1));
        }
    }
}
// xn (H columns) staged into xa as pk_group reads it, by threads t = 0 .. nt-1
// of the block (whole warps per round: nt a multiple of 32).
__device__ __forceinline__ void moe_stage_xn(const float *xn, int64_t H, uint4 *xa, int t, int nt) {
    for (int64_t i0 = 0; i0 < H / 4; i0 += nt) {
        const int64_t q = i0 + t;
        const bool in = q < H / 4;
        pk_stage4(in ? *(const float4 *)(xn + 4 * q) : make_float4(0, 0, 0, 0), q, in, xa, (float *)(xa + H / 4));
    }
}
// The unit's products over the staged input: warp w's rows into pw[w * ps + r]
// (r < 16), then, after a barrier, lane j < 32 of warp 0 (every thread may call
// it; only tid < 32 get a value) returns silu(gate_j) * up_j. Ends with a barrier.
template <int NW>
__device__ __forceinline__ float moe_a_swiglu(const moe_a_regs<NW> &A, const uint4 *xa, int64_t H, float *pw, int ps) {
    constexpr int AG = moe_a_regs<NW>::AG, NP = moe_a_regs<NW>::NP;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3, gh = warp >> 2;
    const int64_t ngu = H / 64;
    float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll
    for (int i = 0; i < AG; i++) {
        const int64_t G = gh + NP * i;
        if (G < ngu) pk_group(A.pa[i], A.sa[i], xa, ((const float2 *)(xa + H / 4))[G], G, g, t, acc0, acc1);
    }
    if (t == 0) {
        pw[warp * ps + g] = acc0;
        pw[warp * ps + g + 8] = acc1;
    }
    __syncthreads();
    float h = 0.0f;
    if (tid < 32) { // gate = row block tid/16 (warps hb + 4p hold its group parities p), up = 2 on
        const int hb = tid >> 4, r = tid & 15;
        float gt = pw[hb * ps + r], up = pw[(2 + hb) * ps + r];
#pragma unroll
        for (int p = 1; p < NP; p++) {
            gt += pw[(hb + 4 * p) * ps + r];
            up += pw[(2 + hb + 4 * p) * ps + r];
        }
        h = gt / (1.0f + expf(-gt)) * up;
    }
    __syncthreads();
    return h;
}

// One token's MoE after the router without a grid barrier (k_moe_split). Unit u < K*I/32 is
// routed slot k = u / (I/32) and its 32 intermediate dims d0 = 32 (u % (I/32)): the block makes
// the top-k, its 32 SwiGLU values (phase A) times topw[k], and their share of
// the down projection, Wd[e][:, d0 .. d0+31] · h over all H rows (half of one
// packed group: the other half's codes are zeroed, its staged inputs are 0).
// The last SI/(64 NSG) units take NSG groups of the shared expert's columns:
// sigmoid(sg) * Ws[:, cols] · swiglu(shgu[cols]), its weights loaded before the
// predecessor wait. Each unit adds its H outputs into acc as 64-bit fixed point
// (2^-32): integer sums, exact whatever order the units finish in, so the
// result is deterministic. The last unit to finish (an arrival count) adds acc
// into x and leaves acc and the count at zero for the next launch. No unit
// waits for another: one launch of K*I/32 + SI/(64 NSG) blocks (132 here), in
// any number of waves. (NaN or |sum| >= 2^31 does not survive the fixed point.)
#define MOE_FX 4294967296.0 // 2^32
// k_moe_split's warps: 16 (92 registers a thread, where 8 warps need 128), so the loads of phase A
// are spread over more warps (docs/perf.md)
#define MOE_SPLIT_WARPS 16
#define MOE_SPLIT_THREADS (32 * MOE_SPLIT_WARPS)
__host__ __device__ inline size_t moe_split_smem(int64_t H, int NSG) {
    const size_t nrb = (size_t)((H + 15) / 16);
    const size_t routed = 16 * (size_t)(H / 4 + (H / 32 + 3) / 4) + nrb * 32 * 8 + nrb * 16 * 4;
    const size_t shared = nrb * (size_t)NSG * (32 * 16 + 16 * 4);
    return routed > shared ? routed : shared;
}
__device__ __forceinline__ void moe_fx_add(unsigned long long *a, float v) {
    atomicAdd(a, (unsigned long long)__double2ll_rn((double)v * MOE_FX));
}
// pk_group's rows 16rb+g (y0 of lane t == 0) and 16rb+g+8 (its y1, handed to
// lane t == 1) into acc: one atomic instruction of 16 lanes. Warp-uniform.
__device__ __forceinline__ void moe_fx_rows(unsigned long long *acc, int64_t rb, int g, int t, float y0, float y1, int64_t H) {
    const float y1n = __shfl_up_sync(0xffffffffu, y1, 1);
    const int64_t r = rb * 16 + g + 8 * t;
    if (t < 2 && r < H) moe_fx_add(acc + r, t == 0 ? y0 : y1n);
}
template <int NSG>
__global__ void __launch_bounds__(MOE_SPLIT_THREADS, 1) k_moe_split(dmat Wg, dmat Wu, dmat Wd, dmat Ws, const float *xn, int64_t H,
                                                      const float *rlog, int E, int norm, const float *shgu, int64_t I,
                                                      int64_t SI, const float *sg, int K, unsigned long long *acc,
                                                      unsigned *count, float *x, unsigned long long *prof) {
    MOE_SMEM(msm);
    constexpr int NW = MOE_SPLIT_WARPS;
    __shared__ float part[NW][17];
    __shared__ int ti[MOE_KMAX];
    __shared__ float tw[MOE_KMAX];
    __shared__ uint4 hq[NSG * 16];  // the staged down input: int8 pieces of NSG groups
    __shared__ float2 hsg2[NSG];     // {Σ, σ} per group
    float *const hsg = reinterpret_cast<float *>(hsg2);
    __shared__ int last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int64_t ngu = H / 64, nrb = (H + 15) / 16, upk = I / 32, nA = (int64_t)K * upk, u = blockIdx.x;
    // prof (test_matmul's timing, and LILAC_MOE_PROF's one layer): global time at 7 points,
    // prof[i * gridDim.x + block] (6: the predecessor wait returned)
    auto mark = [&](int i) { if (prof && tid == 0) prof[i * gridDim.x + blockIdx.x] = gtimer(); };
    mark(0);
    if (u < nA) {
        pdl_wait(); // the router's logits and xn come from the previous kernel
        mark(6);
        // warp 0 makes the top-k while the others stage xn: its loads then do not queue behind the
        // weights' below (staged after them, xn lands ~5 us later)
        uint4 *xa = msm;
        if (tid < 32) topk_warp<8>(rlog, E, K, norm, ti, tw, nullptr, 0);
        else moe_stage_xn(xn, H, xa, tid - 32, blockDim.x - 32);
        __syncthreads();
        mark(1);
        const int k = (int)(u / upk), c = (int)(u % upk), half = c & 1, e = ti[k];
        moe_a_regs<NW> A; // gate/up rows of dims 32c .. 32c+31 into registers
        moe_a_load(A, Wg, Wu, e, c, ngu);
        // the down columns: half `half` of group c/2 of every row block, into shared memory
        uint2 *dw = (uint2 *)(msm + (H / 4 + (H / 32 + 3) / 4));
        uint32_t *dsb = (uint32_t *)(dw + nrb * 32);
        const dmat D = dmat_expert(Wd, e);
        const int64_t ngd = I / 64, Gd = c >> 1;
        for (int64_t rb = warp; rb < nrb; rb += NW) {
            cp_async8(dw + rb * 32 + lane, (const uint2 *)(D.pk + (rb * ngd + Gd) * 32 + lane) + half);
            if (lane < 16) cp_async4(dsb + rb * 16 + lane, D.psb + (rb * ngd + Gd) * 16 + lane, true);
        }
        cp_async_commit();
        // the successor may launch once this unit's loads are asked for (at the kernel's start, decode
        // at 4k is 0.9% slower: docs/perf.md)
        pdl_trigger();
        mark(2);
        const float hsw = moe_a_swiglu(A, xa, H, &part[0][0], 17);
        if (warp == 0) { // lane j: dim 32c + j (gate = row block j/16, warps j/16 and +4; up two on)
            const float hv = (int64_t)c * 32 + lane < I ? tw[k] * hsw : 0.0f;
            // staged as one 64-column group: quads 8 half .. 8 half + 7 hold the 32 values, the rest 0
            const int q = lane & 15, j0 = 4 * (q & 7);
            const float v0 = __shfl_sync(0xffffffffu, hv, j0), v1 = __shfl_sync(0xffffffffu, hv, j0 + 1),
                        v2 = __shfl_sync(0xffffffffu, hv, j0 + 2), v3 = __shfl_sync(0xffffffffu, hv, j0 + 3);
            const bool mine = (q >> 3) == half;
            pk_stage4(mine ? make_float4(v0, v1, v2, v3) : make_float4(0, 0, 0, 0), q, lane < 16, hq, hsg);
        }
        cp_async_wait<0>();
        __syncthreads();
        mark(3);
        const float2 hs = make_float2(hsg[0], hsg[1]);
        // unrolled: the row blocks' products are independent chains of MMAs and shuffles
#pragma unroll 4
        for (int64_t rb = warp; rb < nrb; rb += NW) {
            const uint2 w2 = dw[rb * 32 + lane];
            const uint4 pq = half ? make_uint4(0u, 0u, w2.x, w2.y) : make_uint4(w2.x, w2.y, 0u, 0u);
            const uint32_t psr = t < 2 ? dsb[rb * 16 + g + 8 * t] : 0u;
            float y0 = 0.0f, y1 = 0.0f;
            pk_group(pq, psr, hq, hs, 0, g, t, y0, y1);
            moe_fx_rows(acc, rb, g, t, y0, y1, H);
        }
    } else { // the shared expert: groups G0 .. G0 + NSG - 1 of its SI columns
        const int64_t ngs = SI / 64, G0 = (u - nA) * NSG;
        uint4 *sw = msm;
        uint32_t *ssb = (uint32_t *)(sw + nrb * NSG * 32);
        for (int64_t rb = warp; rb < nrb; rb += NW)
#pragma unroll
            for (int gi = 0; gi < NSG; gi++) {
                cp_async16(sw + (rb * NSG + gi) * 32 + lane, Ws.pk + (rb * ngs + G0 + gi) * 32 + lane, true);
                if (lane < 16) cp_async4(ssb + (rb * NSG + gi) * 16 + lane, Ws.psb + (rb * ngs + G0 + gi) * 16 + lane, true);
            }
        cp_async_commit();
        pdl_trigger();
        pdl_wait(); // shgu and sg come from the previous kernel
        mark(6);
        mark(1);
        if (warp < NSG) { // warp w stages group w: lanes < 16 one quad each
            const float gs = 1.0f / (1.0f + expf(-*sg));
            const int q = lane & 15;
            const int64_t col = (G0 + warp) * 64 + 4 * q;
            float4 v = make_float4(0, 0, 0, 0);
            if (lane < 16) {
                const float4 a = *(const float4 *)(shgu + col), b = *(const float4 *)(shgu + SI + col);
                v = make_float4(gs * (a.x / (1.0f + expf(-a.x)) * b.x), gs * (a.y / (1.0f + expf(-a.y)) * b.y),
                                gs * (a.z / (1.0f + expf(-a.z)) * b.z), gs * (a.w / (1.0f + expf(-a.w)) * b.w));
            }
            pk_stage4(v, (int64_t)warp * 16 + q, lane < 16, hq, hsg);
        }
        mark(2);
        cp_async_wait<0>();
        __syncthreads();
        mark(3);
        for (int64_t rb = warp; rb < nrb; rb += NW) {
            float y0 = 0.0f, y1 = 0.0f;
#pragma unroll
            for (int gi = 0; gi < NSG; gi++) {
                const uint32_t psr = t < 2 ? ssb[(rb * NSG + gi) * 16 + g + 8 * t] : 0u;
                pk_group(sw[(rb * NSG + gi) * 32 + lane], psr, hq, ((const float2 *)hsg)[gi], gi, g, t, y0, y1);
            }
            moe_fx_rows(acc, rb, g, t, y0, y1, H);
        }
    }
    // the last unit to finish folds acc into x
    __syncthreads();
    mark(4);
    if (tid == 0) {
        __threadfence(); // this block's additions before its arrival
        last = atomicAdd(count, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last) {
        __threadfence();
        for (int64_t h0 = tid; h0 < H; h0 += 8 * (int64_t)blockDim.x) { // 8 rows per thread in flight at once
            unsigned long long v[8];
            float xv[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int64_t h = h0 + (int64_t)i * blockDim.x;
                v[i] = h < H ? __ldcg(acc + h) : 0ull; // the L2, where the atomics were made
                xv[i] = h < H ? __ldcg(x + h) : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int64_t h = h0 + (int64_t)i * blockDim.x;
                if (h < H) {
                    x[h] = xv[i] + (float)((double)(long long)v[i] * (1.0 / MOE_FX));
                    acc[h] = 0ull;
                }
            }
        }
        if (tid == 0) *count = 0u;
    }
    mark(5);
}
// k_moe_split's marks (prof): 7 global times per block. Printed as us after
// the earliest routed unit's return from the predecessor wait (the router's
// logits visible), median / max over the routed units, then the shared ones.
#define MOE_SPLIT_MARKS 7
static inline void moe_split_timeline(FILE *f, const unsigned long long *tt, int grid, int nA) {
    static const int order[MOE_SPLIT_MARKS] = {0, 6, 1, 2, 3, 4, 5};
    static const char *nm[MOE_SPLIT_MARKS] = {"start", "wait", "top-k and xn staged", "loads issued", "h staged, down weights in",
                                              "sums added", "end"};
    unsigned long long t0 = ~0ull;
    for (int i = 0; i < nA; i++) t0 = tt[(size_t)6 * grid + i] < t0 ? tt[(size_t)6 * grid + i] : t0;
    std::vector<double> v;
    for (int part = 0; part < 2; part++) {
        fprintf(f, "    %s units:", part ? "shared" : "routed");
        for (int j = 0; j < MOE_SPLIT_MARKS; j++) {
            const int pt = order[j];
            v.clear();
            for (int i = part ? nA : 0; i < (part ? grid : nA); i++)
                v.push_back(((double)tt[(size_t)pt * grid + i] - (double)t0) * 1e-3);
            if (v.empty()) continue;
            std::sort(v.begin(), v.end());
            fprintf(f, " %s %.2f / %.2f%s", nm[j], v[v.size() / 2], v.back(), j < MOE_SPLIT_MARKS - 1 ? "," : "");
        }
        fprintf(f, "\n");
    }
}
// k_moe_split's grid: K*I/32 routed units, then the shared expert's SI/64 groups NSG a unit.
static inline int64_t moe_split_routed(int K, int64_t I) { return (int64_t)K * (I / 32); }
static inline int64_t moe_split_grid(int K, int64_t I, int64_t SI, int nsg) { return moe_split_routed(K, I) + SI / (64 * nsg); }
// Whether k_moe_split serves a layer (moe_split_ok, and a packed shared down
// of whole groups); its shared units take NSG = 2 groups when the grid then fits
// one block per SM, else 1.
static inline int moe_split_nsg(const dmat &Ws, int64_t H, int64_t I, int K, int n_sm) {
    if (!Ws.pk || Ws.rows != H || Ws.cols % 64) return 0;
    return Ws.cols % 128 == 0 && moe_split_grid(K, I, Ws.cols, 2) <= n_sm ? 2 : 1;
}
