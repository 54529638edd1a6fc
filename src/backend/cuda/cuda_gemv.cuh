// cuda_gemv.cuh — the one-token GEMV of decode: the job (up to GEMV_MATS matrices that
// read one input), the row dots of matrices that are not packed, k_gemv over the packed
// layout of cuda_packed.cuh, and its launcher. Also built by the CUDA emulator
// (tests/cuda/emu/test_gemv_emu.cc runs k_gemv on the CPU, in CI).
#pragma once
#ifdef LILAC_CUEMU
#include "cuda_runtime.h"
#include "cuda_bf16.h"
#define GEMV_SMEM(name) float *const name = reinterpret_cast<float *>(cuemu::dyn_smem)
#else
#include "cuda_common.cuh"
#define GEMV_SMEM(name) extern __shared__ __align__(16) float name[]
#endif
#include "cuda_matrix.cuh"
#include "cuda_packed_dot.cuh"
#include "cuda_topk.cuh"

enum { XM_PLAIN = 0, XM_SWIGLU = 1, XM_NORM = 2 };

#define GEMV_MATS 4

// Up to GEMV_MATS matrices that read the same input, in one launch: blocks
// [start[i], start[i+1]) compute matrix i. Output row r goes to y[i][ldy[i]*slot + r],
// added to what is there when accum[i] (the residual stream: one warp owns a row,
// so no two writers meet). XM_NORM: the input is rmsnorm(x) * gain, computed by
// every block while staging; block (0,0) also writes it to xn_out when given.
// One-token work that needs every output of a GEMV launch, done by the block
// that finishes last (it sees the arrival counter reach the grid size): the
// MoE combine after the down GEMV, where k_moe_down cannot serve (unpacked
// experts, or a shared expert of another width).
enum { TAIL_NONE = 0, TAIL_COMBINE = 1 };
struct gemv_tail {
    int kind;
    int *done; // arrival counter, zero between launches (the last block resets it)
    // combine: x[h] += sigmoid(sg[0]) shy[h] + sum_k topw[k] ye[k*H + h]
    int K;
    const float *topw;
    float *x;
    const float *ye, *shy, *sg;
    int64_t H;
};

struct gemv_job {
    dmat W[GEMV_MATS];
    float *y[GEMV_MATS];
    int64_t ldy[GEMV_MATS];
    int accum[GEMV_MATS];
    const float *x[GEMV_MATS]; // input row (slot 0); null: the kernel's x argument
    int64_t ldx[GEMV_MATS], xoff[GEMV_MATS];
    int plain[GEMV_MATS];      // expert launches: this matrix is not routed (computed by slot 0 only)
    int start[GEMV_MATS + 1]; // first block of each matrix (set by gemv_launch)
    int n;
    int upb;                  // row-block sets per block (set by gemv_launch)
    int stages;               // weight stages in shared memory (set by gemv_launch)
    unsigned long long *prof; // tests/cuda/bench_gemv.cu's in-kernel timestamps (null: off)
    // Expert mode: with tk_logits, every block computes the router's top-k itself
    // (topk_warp, E <= 256, K <= 8) and block (0,0) writes it to tk_topi/tk_topw;
    // the expert ids then come from there instead of topi.
    const float *tk_logits;
    int tk_E, tk_K, tk_norm;
    int *tk_topi;
    float *tk_topw;
    const float *gain;
    float *xn_out;
    float eps;
    gemv_tail tail;
};

// The staged input lives in shared memory padded to 36 floats per 32, so that
// the float4 reads of a warp (each lane a different 32/16/8-column run) hit
// distinct banks.
__device__ __forceinline__ int xs_idx(int64_t c) { return (int)((c >> 5) * 36 + (c & 31)); }

// The 8 codes of a packed word (code j: 4 bits at bit 4j) as floats 1 + q/128:
// the low and high nibbles of each byte are masked once per word and topped
// with 0x80, then one byte permute per code builds 0x3F8q0000-style bits
// (exponent of 1.0, q in the mantissa). Exact, and ~1.4 integer instructions
// per code instead of a shift, a mask and a quarter-rate I2F.
__device__ __forceinline__ void nib8_1p(uint32_t w, float f[8]) {
    const uint32_t lo = (w & 0x0F0F0F0Fu) | 0x80808080u, hi = ((w >> 4) & 0x0F0F0F0Fu) | 0x80808080u;
    const uint32_t one = 0x3F000000u; // byte 7 of the permute source: 0x3F; byte 4: 0x00
    f[0] = __uint_as_float(__byte_perm(lo, one, 0x7044));
    f[1] = __uint_as_float(__byte_perm(hi, one, 0x7044));
    f[2] = __uint_as_float(__byte_perm(lo, one, 0x7144));
    f[3] = __uint_as_float(__byte_perm(hi, one, 0x7144));
    f[4] = __uint_as_float(__byte_perm(lo, one, 0x7244));
    f[5] = __uint_as_float(__byte_perm(hi, one, 0x7244));
    f[6] = __uint_as_float(__byte_perm(lo, one, 0x7344));
    f[7] = __uint_as_float(__byte_perm(hi, one, 0x7344));
}

// 32 staged inputs times one 16-byte chunk of 4-bit codes (32 weights), with the
// group's scale and bias: s * sum(x q) + b * sum(x). With f = 1 + q/128,
// sum(x q) = 128 (sum(x f) - sum(x)); f32 keeps that within ~1e-6 relative.
__device__ __forceinline__ float chunk_dot4(uint4 raw, const float *xs, int64_t c0, float s, float b) {
    const uint32_t wd[4] = {raw.x, raw.y, raw.z, raw.w};
    float dq = 0.0f, xsum = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const float4 xa = *(const float4 *)(xs + xs_idx(c0 + 8 * w)), xb = *(const float4 *)(xs + xs_idx(c0 + 8 * w + 4));
        float f[8];
        nib8_1p(wd[w], f);
        dq += xa.x * f[0] + xa.y * f[1] + xa.z * f[2] + xa.w * f[3] + xb.x * f[4] + xb.y * f[5] + xb.z * f[6] + xb.w * f[7];
        xsum += (xa.x + xa.y) + (xa.z + xa.w) + (xb.x + xb.y) + (xb.z + xb.w);
    }
    return s * 128.0f * (dq - xsum) + b * xsum;
}

// Dot of one weight row that is not packed (bf16, 8-bit, or 4-bit in the MLX
// layout) with the staged input: one warp, lanes over 16-byte chunks of the row
// (coalesced), f32 accumulation; the lanes' partial sums are the caller's to add.
__device__ __forceinline__ float row_dot(const dmat &W, int64_t r, const float *xs, int lane) {
    const int64_t cols = W.cols;
    float acc = 0.0f;
    if (W.type == 0 && W.bits == 4) { // 32 columns per 16 bytes; a group spans whole chunks (group % 32 == 0)
        const int64_t ng = cols / W.group;
        const uint4 *qr = (const uint4 *)(W.q + r * (cols / 8));
        for (int64_t i = lane; i < cols / 32; i += 32) {
            const int64_t g = r * ng + i * 32 / W.group;
            acc += chunk_dot4(__ldg(qr + i), xs, i * 32, __bfloat162float(W.s[g]), __bfloat162float(W.b[g]));
        }
        return acc;
    }
    if (W.type == 1) { // bf16: 8 columns per 16 bytes
        const uint4 *wr = (const uint4 *)(W.w + r * cols);
        for (int64_t i = lane; i < cols / 8; i += 32) {
            const uint4 raw = __ldg(wr + i);
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&raw;
            const float4 x0 = *(const float4 *)(xs + xs_idx(i * 8)), x1 = *(const float4 *)(xs + xs_idx(i * 8 + 4));
            float2 w0 = __bfloat1622float2(h[0]), w1 = __bfloat1622float2(h[1]), w2 = __bfloat1622float2(h[2]),
                   w3 = __bfloat1622float2(h[3]);
            acc += w0.x * x0.x + w0.y * x0.y + w1.x * x0.z + w1.y * x0.w + w2.x * x1.x + w2.y * x1.y + w3.x * x1.z + w3.y * x1.w;
        }
        return acc;
    }
    const int64_t ng = cols / W.group;
    const __nv_bfloat16 *sr = W.s + r * ng, *br = W.b + r * ng;
    // 8-bit: 16 columns per 16 bytes
    const uint4 *qr = (const uint4 *)(W.q + r * (cols / 4));
    for (int64_t i = lane; i < cols / 16; i += 32) {
        const uint4 raw = __ldg(qr + i);
        const int64_t c0 = i * 16;
        const float s = __bfloat162float(sr[c0 / W.group]), b = __bfloat162float(br[c0 / W.group]);
        const uint32_t wd[4] = {raw.x, raw.y, raw.z, raw.w};
        float dq = 0.0f, xsum = 0.0f; // codes as 1 + q/256 (see nib_1p)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 xa = *(const float4 *)(xs + xs_idx(c0 + 4 * k));
            const uint32_t w = wd[k];
            const float f0 = __uint_as_float(((w << 15) & 0x007F8000u) | 0x3F800000u),
                        f1 = __uint_as_float(((w << 7) & 0x007F8000u) | 0x3F800000u),
                        f2 = __uint_as_float(((w >> 1) & 0x007F8000u) | 0x3F800000u),
                        f3 = __uint_as_float(((w >> 9) & 0x007F8000u) | 0x3F800000u);
            dq += xa.x * f0 + xa.y * f1 + xa.z * f2 + xa.w * f3;
            xsum += (xa.x + xa.y) + (xa.z + xa.w);
        }
        acc += s * 256.0f * (dq - xsum) + b * xsum;
    }
    return acc;
}

#define GEMV_STAGE 4 // staged GEMV input: up to 4 float4 per thread, 4096 columns
__host__ __device__ inline size_t gemv_smem(int64_t cols) { return sizeof(float) * (size_t)(((cols + 31) / 32) * 36); }

// The tail of a GEMV launch (see gemv_tail): every block arrives; the last one runs it.
__device__ __forceinline__ void gemv_tail_run(const gemv_tail &tl) {
    if (tl.kind == TAIL_NONE) return;
    __shared__ int last;
    __syncthreads(); // this block's outputs are written
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(tl.done, 1) == (int)(gridDim.x * gridDim.y) - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float gs = 1.0f / (1.0f + expf(-__ldcg(tl.sg)));
    for (int64_t h = threadIdx.x; h < tl.H; h += blockDim.x) {
        float a = gs * __ldcg(tl.shy + h);
        for (int k = 0; k < tl.K; k++) a += tl.topw[k] * __ldcg(tl.ye + (int64_t)k * tl.H + h);
        tl.x[h] += a;
    }
    if (threadIdx.x == 0) *tl.done = 0;
}

// Warp slices per row block for inputs of ng groups: each warp takes at least 4
// groups when it can (enough work per set), 8 warps per block.
static inline int gemv_ns(int64_t ng) {
    int ns = 8;
    while (ns > 1 && (ng % ns || ng / ns < 4)) ns >>= 1;
    return ns;
}
__host__ __device__ inline int gemv_rows_per_block(const dmat &W, int ns) { return W.pk ? 16 * (8 / ns) : 8; }

// Shared memory of k_gemv: the staged input of `cols` columns (f32 padded for
// row_dot, the int8 pieces of pk_stage4, {Σx, σ} per group), then `stages`
// weight stages, each one set of the packed layout (8/ns row blocks: codes,
// then scale/bias pairs).
static inline size_t gemv_stage_u4(int64_t cols, int ns) { return (size_t)(8 / ns) * (size_t)(cols / 64) * 36; }
__host__ __device__ inline size_t gemv_xsmem(int64_t cols) {
    return (gemv_smem(cols) + (size_t)cols * 4 + (size_t)cols / 64 * 8 + 15) / 16 * 16;
}
// Blocks of k_gemv per SM the compiler budgets registers for (launch bounds): two blocks of
// 256 threads a SM, 107-114 registers, 4 weight stages.
#define GEMV_MINB 2
#define GEMV_THREADS 256
// The weight stages' shared memory a block.
#define GEMV_SMEM_STAGES (110u << 10)
static inline int gemv_stages(int64_t cols, int ns) {
    const size_t per = gemv_stage_u4(cols, ns) * 16;
    const size_t n = GEMV_SMEM_STAGES / per;
    return n < 2 ? 2 : n > 4 ? 4 : (int)n;
}

#define TCG_MAX 8

// A timestamp (SM clock, global timer) at point i of blocks 0 and last of
// grid row 0, into prof[b*32 + i] and prof[b*32 + 16 + i]: bench_gemv.cu's
// view of where a launch's time goes. prof null (always, outside the bench): nothing.
__device__ __forceinline__ void gemv_mark(unsigned long long *prof, int i) {
    if (!prof || threadIdx.x != 0 || blockIdx.y != 0 || (blockIdx.x != 0 && blockIdx.x != gridDim.x - 1) || i > 15) return;
    const int b = blockIdx.x == 0 ? 0 : 1;
    prof[b * 32 + i] = clock64();
    prof[b * 32 + 16 + i] = gtimer();
}

// An output row: written, or added to y (the residual stream: one adder per row and
// launch) as a reduction the L2 makes, so that no load round trip comes before the block
// may leave (the same f32 sum, rounded to nearest).
__device__ __forceinline__ void gemv_store(float *y, float v, int accum) {
    if (accum) atomicAdd(y, v);
    else *y = v;
}

// The one-token GEMV (decode) for a job (see gemv_job). Packed matrices: a
// "set" is 8/NS row blocks of 16 rows; warp w takes row block w % (8/NS) of
// the set and groups w / (8/NS) + NS*i, partial sums meeting in shared memory.
// A block stages its input once and loops over job.upb consecutive sets; the
// sets stream through job.stages shared-memory stages by bulk copies, the first
// ones issued before the block waits for its predecessor kernel (weights do
// not depend on it), and then the next kernel may launch (its blocks start as
// this one's leave: two per SM fill the register file). Where the time goes:
// docs/perf.md (per-launch issue and staging latency; the bf16
// products this replaced issued 146 warp instructions per 16 x 64 group).
// Other matrices (8-bit router and shared-expert gate, bf16 checkpoints, 4-bit
// with other group sizes) take one row per warp with row_dot (a set of 8 rows).
// Expert mode (topi != null): blockIdx.y is a routing slot (input row slot /
// x_div, expert topi[slot], or the block's own top-k of job.tk_logits); the
// output row is the slot. The last block runs
// the job's tail (gemv_tail).
template <int XM, int NS>
__global__ void __launch_bounds__(GEMV_THREADS, GEMV_MINB)
    k_gemv(gemv_job job, const float *x, int64_t ldx, int64_t xoff, const int *topi, int x_div) {
    constexpr int RBB = 8 / NS;
    GEMV_SMEM(xs);
    __shared__ float red[32];
    __shared__ float part[2][8][17];
    gemv_mark(job.prof, 0);
    // this block's matrix: the start[] compares are independent loads (a search loop would chain them)
    int mi = 0;
#pragma unroll
    for (int i = 1; i < GEMV_MATS; i++) mi += i < job.n && (int)blockIdx.x >= job.start[i];
    dmat W = job.W[mi];
    if (job.x[mi]) { x = job.x[mi]; ldx = job.ldx[mi]; xoff = job.xoff[mi]; }
    int64_t yrow = 0;
    const bool routed = topi && !job.plain[mi];
    if (topi && !routed && blockIdx.y > 0) {
        pdl_trigger();
        pdl_wait();
        gemv_tail_run(job.tail);
        return;
    }
    if (routed) {
        pdl_wait(); // the expert ids come from the previous kernel
        const int slot = blockIdx.y;
        int e;
        if (job.tk_logits) { // the router's top-k, made by every block from the logits (no tail, no launch)
            __shared__ int tki[8];
            __shared__ float tkw[8];
            if (threadIdx.x < 32) topk_warp<8>(job.tk_logits, job.tk_E, job.tk_K, job.tk_norm, tki, tkw, nullptr, 0);
            __syncthreads();
            if (blockIdx.x == 0 && blockIdx.y == 0 && (int)threadIdx.x < job.tk_K) { // for the down projections
                job.tk_topi[threadIdx.x] = tki[threadIdx.x];
                job.tk_topw[threadIdx.x] = tkw[threadIdx.x];
            }
            e = tki[slot];
        } else {
            e = topi[slot];
        }
        W = dmat_expert(W, e);
        x += (int64_t)(slot / x_div) * ldx;
        yrow = slot;
    }
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
    // (The masks change nothing at 256 threads, but without them ptxas gives the common instances
    // 116 registers instead of 107-110.)
    const int warp = (tid >> 5) & 7, ltid = tid & 255;
    const int64_t cols = W.cols, ng = cols / 64, blk = blockIdx.x - job.start[mi];
    const bool tc = W.pk != nullptr;
    const int64_t nrb = (W.rows + 15) / 16;
    const int slice = warp / RBB, ngw = (int)(ng / NS);
    const int upb = job.upb > 1 ? job.upb : 1, S = job.stages;
    const int64_t set0 = blk * upb, nset = tc ? (nrb + RBB - 1) / RBB : (W.rows + 7) / 8;
    const int nk = (int)(nset - set0 < upb ? nset - set0 : upb); // >= 1: the grid has no empty blocks
    const int64_t su4 = (int64_t)RBB * ng * 36; // one stage: RBB*ng*32 code uint4, then RBB*ng*4 of scale/bias
    uint4 *stg = (uint4 *)(xs + gemv_xsmem(cols) / sizeof(float)); // the weight stages
    // Copies the block's set k into stage k % S: its thread 0 moves the set's codes and
    // scale/bias pairs (contiguous in the packed layout) by two bulk copies that complete on
    // the stage's mbarrier. (Every lane's own cp.async: the same step time, kernels alone
    // 5-19% slower.)
    const int rbl = warp % RBB; // the row block of the set this warp multiplies
    __shared__ uint64_t sbar[4]; // stage s's copies (S <= 4)
    if (tc) {
        if (tid == 0) {
            for (int s = 0; s < S; s++) mbar_init(&sbar[s], 1);
            mbar_fence_init();
        }
        __syncthreads();
    }
    auto issue = [&](int k) {
        if (ltid == 0 && tc && k < nk) {
            const int64_t rb0 = (set0 + k) * RBB, nr = nrb - rb0 < RBB ? nrb - rb0 : RBB; // >= 1
            uint4 *d = stg + (int64_t)(k % S) * su4;
            const unsigned cb = (unsigned)(nr * ng * 512), sb = (unsigned)(nr * ng * 64);
            mbar_expect(&sbar[k % S], cb + sb);
            bulk_g2s(d, W.pk + rb0 * ng * 32, cb, &sbar[k % S]);
            bulk_g2s(d + (int64_t)RBB * ng * 32, W.psb + rb0 * ng * 16, sb, &sbar[k % S]);
        }
    };
    for (int k = 0; k < S - 1; k++) issue(k);
    gemv_mark(job.prof, 1);
    // x, and the second half (SwiGLU) or the gain (RMSNorm), all loaded in one round trip
    float4 xr[GEMV_STAGE], xu[GEMV_STAGE];
    const int64_t n4 = cols / 4;
    if (XM == XM_NORM) // the gain is a weight: loaded before the wait, off the chain after it
#pragma unroll
        for (int u = 0; u < GEMV_STAGE; u++) {
            const int64_t q = tid + (int64_t)u * blockDim.x;
            xu[u] = q < n4 ? __ldg((const float4 *)(job.gain + 4 * q)) : make_float4(0, 0, 0, 0);
        }
    if (!routed) {
        pdl_trigger(); // every block's first copies are in flight: the next kernel may start its own
        pdl_wait();
    } else {
        pdl_trigger();
    }
    gemv_mark(job.prof, 2);
    float *y = job.y[mi] + yrow * job.ldy[mi];

    // Stage the input: f32 (padded, for row_dot), the packed products' int8 pieces, group sums and scales.
    uint4 *xb = (uint4 *)(xs + gemv_smem(cols) / sizeof(float));
    float *xsg = (float *)(xb + cols / 4);
#pragma unroll
    for (int u = 0; u < GEMV_STAGE; u++) {
        const int64_t q = tid + (int64_t)u * blockDim.x;
        xr[u] = q < n4 ? *(const float4 *)(x + 4 * q) : make_float4(0, 0, 0, 0);
        if (XM == XM_SWIGLU) xu[u] = q < n4 ? *(const float4 *)(x + xoff + 4 * q) : make_float4(0, 0, 0, 0);
    }
    float inv = 1.0f;
    if (XM == XM_NORM) {
        float ss = 0.0f;
#pragma unroll
        for (int u = 0; u < GEMV_STAGE; u++) ss += xr[u].x * xr[u].x + xr[u].y * xr[u].y + xr[u].z * xr[u].z + xr[u].w * xr[u].w;
        inv = rsqrtf(block_sum_first(ss, red) / (float)cols + job.eps); // red's only use
    }
#pragma unroll
    for (int u = 0; u < GEMV_STAGE; u++) {
        const int64_t q = tid + (int64_t)u * blockDim.x;
        const bool in = q < n4;
        float v[4] = {xr[u].x, xr[u].y, xr[u].z, xr[u].w};
        if (XM == XM_SWIGLU) {
            const float uu[4] = {xu[u].x, xu[u].y, xu[u].z, xu[u].w};
#pragma unroll
            for (int e = 0; e < 4; e++) v[e] = v[e] / (1.0f + expf(-v[e])) * uu[e];
        }
        if (XM == XM_NORM && in) {
            const float4 g4 = xu[u];
            v[0] *= inv * g4.x; v[1] *= inv * g4.y; v[2] *= inv * g4.z; v[3] *= inv * g4.w;
            if (job.xn_out && blockIdx.x == 0 && blockIdx.y == 0) *(float4 *)(job.xn_out + 4 * q) = make_float4(v[0], v[1], v[2], v[3]);
        }
        const float4 v4 = make_float4(v[0], v[1], v[2], v[3]);
        if (in) *(float4 *)(xs + xs_idx(4 * q)) = v4;
        if (tc) pk_stage4(v4, q, in, xb, xsg); // block-uniform: whole warps
    }
    __syncthreads();
    gemv_mark(job.prof, 3);

    const int accum = job.accum[mi];
    if (!tc) { // one row per warp, 8 rows per set
        for (int k = 0; k < nk; k++) {
            const int64_t r = (set0 + k) * 8 + warp;
            float v = r < W.rows ? row_dot(W, r, xs, lane) : 0.0f;
            v = warp_sum(v);
            if (lane == 0 && r < W.rows) gemv_store(y + r, v, accum);
        }
        gemv_tail_run(job.tail);
        return;
    }
    for (int k = 0; k < nk; k++) {
        issue(k + S - 1); // into the stage every warp read for set k-1 (before that set's barrier)
        mbar_wait(&sbar[k % S], (unsigned)(k / S) & 1u); // the set's copies have landed
        const uint4 *sw = stg + (int64_t)(k % S) * su4;
        const uint32_t *ssb = (const uint32_t *)(sw + (int64_t)RBB * ng * 32);
        const int64_t rb = (set0 + k) * RBB + rbl;
        float acc0 = 0.0f, acc1 = 0.0f; // rows 16rb+g and +8 (lanes with t == 0)
        if (rb < nrb) {
#pragma unroll
            for (int i = 0; i < TCG_MAX; i++)
                if (i < ngw) {
                    const int64_t G = slice + (int64_t)NS * i;
                    const uint32_t psr = t < 2 ? ssb[(rbl * ng + G) * 16 + g + 8 * t] : 0u; // lanes t < 2: their own copies
                    pk_group(sw[(rbl * ng + G) * 32 + lane], psr, xb, ((const float2 *)xsg)[G], G, g, t, acc0, acc1);
                }
        }
        float (*pt)[17] = part[k & 1]; // double-buffered: one barrier per set
        if (t == 0) {
            pt[warp][g] = acc0;
            pt[warp][g + 8] = acc1;
        }
        __syncthreads();
        if (ltid < 16 * RBB) {
            const int rl = ltid / 16, r = ltid % 16;
            float v = 0.0f;
#pragma unroll
            for (int sl = 0; sl < NS; sl++) v += pt[sl * RBB + rl][r];
            const int64_t row = ((set0 + k) * RBB + rl) * 16 + r;
            if (row < W.rows) gemv_store(y + row, v, accum);
        }
        // pt is rewritten two sets on, after the next barrier, which every reader above passes first
        gemv_mark(job.prof, 4 + k);
    }
    gemv_mark(job.prof, 15);
    gemv_tail_run(job.tail);
}

// Launches k_gemv for a job (the backend's gemv() and the kernel tests). slots
// > 0: expert mode over topi. blocks: the grid to aim for (the backend: two
// blocks per SM, as many as fit at once); each block then loops over job.upb
// sets. 0: one set per block.
template <int XM, int NS>
static cudaError_t gemv_go(cudaStream_t st, bool pdl, dim3 g, size_t sm, gemv_job &j, const float *x, int64_t ldx,
                           int64_t xoff, const int *topi, int x_div) {
    static size_t sm_set = 0; // the dynamic shared memory this instance is allowed (set once per size)
    if (sm > 48u * 1024 && sm > sm_set) {
        const cudaError_t e = cudaFuncSetAttribute(k_gemv<XM, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        if (e != cudaSuccess) return e;
        sm_set = sm;
    }
    return launch_ex(st, pdl, k_gemv<XM, NS>, g, dim3(GEMV_THREADS), sm, j, x, ldx, xoff, topi, x_div);
}
static inline cudaError_t gemv_launch(cudaStream_t st, bool pdl, gemv_job &j, int xm, const float *x, int64_t ldx,
                                      int64_t xoff, const int *topi, int x_div, int slots, int blocks) {
    const int ns = gemv_ns(j.W[0].cols / 64), ys = slots > 0 ? slots : 1;
    int64_t sets = 0;
    for (int i = 0; i < j.n; i++) {
        const int rpb = gemv_rows_per_block(j.W[i], ns);
        sets += (j.W[i].rows + rpb - 1) / rpb * (topi && !j.plain[i] ? ys : 1);
    }
    j.upb = blocks > 0 ? (int)((sets + blocks - 1) / blocks) : 1;
    if (j.upb < 1) j.upb = 1;
    j.start[0] = 0;
    for (int i = 0; i < j.n; i++) {
        const int rpb = gemv_rows_per_block(j.W[i], ns);
        const int64_t si = (j.W[i].rows + rpb - 1) / rpb;
        j.start[i + 1] = j.start[i] + (int)((si + j.upb - 1) / j.upb);
    }
    const int64_t cols = j.W[0].cols;
    j.stages = gemv_stages(cols, ns);
    const dim3 g((unsigned)j.start[j.n], (unsigned)ys);
    bool packed = false; // weight stages only for jobs with a packed matrix (bf16 checkpoints have none)
    for (int i = 0; i < j.n; i++) packed |= j.W[i].pk != nullptr;
    const size_t sm = gemv_xsmem(cols) + (packed ? (size_t)j.stages * gemv_stage_u4(cols, ns) * 16 : 0);
#define GEMV_GO(XM, NS) return gemv_go<XM, NS>(st, pdl, g, sm, j, x, ldx, xoff, topi, x_div)
#define GEMV_NS_SWITCH(XM)                 \
    switch (ns) {                          \
    case 8: GEMV_GO(XM, 8);                \
    case 4: GEMV_GO(XM, 4);                \
    case 2: GEMV_GO(XM, 2);                \
    default: GEMV_GO(XM, 1);               \
    }
    if (xm == XM_SWIGLU) { GEMV_NS_SWITCH(XM_SWIGLU) }
    else if (xm == XM_NORM) { GEMV_NS_SWITCH(XM_NORM) }
    else { GEMV_NS_SWITCH(XM_PLAIN) }
#undef GEMV_NS_SWITCH
#undef GEMV_GO
}
