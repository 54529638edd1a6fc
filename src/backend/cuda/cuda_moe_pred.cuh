// cuda_moe_pred.cuh — a decode step's routed experts, fetched into the L2 before the
// router has chosen them: the composite matrix made at load (k_pred_c) and the
// predictor that runs beside the mixer's output projection (k_moe_predict). Also built
// by the CUDA emulator (tests/cuda/emu/test_moe_pred_emu.cc runs both on the CPU, in CI).
//
// Why: k_moe_split can ask for its experts' 12.6 MB only once it has the top-k, and
// then waits ~6.5 us for the DRAM to deliver them (docs/perf.md, run 144), on every
// layer's chain. The router's logits are Wr (g ⊙ x') / rms(x'), x' = x + Wo o: the
// residual before the mixer's output plus its output projection. Their order (all the
// top-k ids need) does not depend on the RMS, so
//   l = Wr diag(g) x + C o,   C = Wr diag(g) Wo  (E x O, made once at load)
// orders the experts as the router will, from x and o alone: available when the mixer
// ends, one out_proj and one router GEMV before k_moe_split. The predictor computes l on
// a second stream, picks the top-k, and k_moe_fetch asks the L2 for those experts' packed
// rows; the MoE kernel then finds them there. It is a hint only: k_moe_split still takes the
// router's own top-k, so a wrong or late prediction costs time, never a different token.
// Opt-in (LILAC_MOE_PREDICT=1) until a device run shows it faster: docs/perf.md, session 29.
// (C is kept in bf16, so near-ties may be ordered differently: a miss, nothing more.)
#pragma once
#include "cuda_gemv.cuh"    // row_dot and its staged-input layout (xs_idx, gemv_smem); topk_warp
#include "cuda_moe_dec.cuh" // MOE_KMAX

// An element of a matrix in its checkpoint form (MLX affine, 4 or 8 bits, or bf16).
__device__ __forceinline__ float dmat_elem(const dmat &W, int64_t r, int64_t c) {
    if (W.type == 1) return __bfloat162float(W.w[r * W.cols + c]);
    const int per = 32 / W.bits;
    const uint32_t code = (W.q[r * (W.cols / per) + c / per] >> (W.bits * (int)(c % per))) & ((1u << W.bits) - 1u);
    const int64_t gi = r * (W.cols / W.group) + c / W.group;
    return __bfloat162float(W.s[gi]) * (float)code + __bfloat162float(W.b[gi]);
}

// C = Wr diag(g) Wo in bf16 (Wr: E x H, Wo: H x O, both in the checkpoint's layout, read
// before the packed copies replace it): a plain f32 tiled product, once per layer at load.
// Grid (O / PC_C, E / PC_R), 256 threads; each thread 2 rows x 4 columns of the tile.
#define PC_R 32
#define PC_C 64
#define PC_K 32
__global__ void __launch_bounds__(256) k_pred_c(dmat Wr, const float *g, dmat Wo, __nv_bfloat16 *C) {
    __shared__ float A[PC_K][PC_R + 1]; // Wr(r, h) g[h] of the tile's rows
    __shared__ float B[PC_K][PC_C + 1]; // Wo(h, c) of its columns
    const int tid = threadIdx.x, tr = tid / 16, tc = tid % 16;
    const int64_t E = Wr.rows, H = Wr.cols, O = Wo.cols, r0 = (int64_t)blockIdx.y * PC_R, c0 = (int64_t)blockIdx.x * PC_C;
    float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    for (int64_t h0 = 0; h0 < H; h0 += PC_K) {
        for (int i = tid; i < PC_K * PC_R; i += 256) {
            const int h = i % PC_K, r = i / PC_K;
            A[h][r] = r0 + r < E && h0 + h < H ? dmat_elem(Wr, r0 + r, h0 + h) * g[h0 + h] : 0.0f;
        }
        for (int i = tid; i < PC_K * PC_C; i += 256) {
            const int c = i % PC_C, h = i / PC_C;
            B[h][c] = h0 + h < H && c0 + c < O ? dmat_elem(Wo, h0 + h, c0 + c) : 0.0f;
        }
        __syncthreads();
        for (int h = 0; h < PC_K; h++) {
            const float a0 = A[h][2 * tr], a1 = A[h][2 * tr + 1];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float b = B[h][tc + 16 * j];
                acc[0][j] += a0 * b;
                acc[1][j] += a1 * b;
            }
        }
        __syncthreads();
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            const int64_t r = r0 + 2 * tr + i, c = c0 + tc + 16 * j;
            if (r < E && c < O) C[r * O + c] = __float2bfloat16_rn(acc[i][j]);
        }
}

// What k_moe_predict reads and where its guess goes.
struct moe_pred_args {
    dmat Wr, C;           // the router (8-bit or bf16, not packed) and C (bf16, E x O)
    const float *g;       // the post-mixer RMSNorm's gain (H)
    const float *x;       // the residual stream before the mixer output was added (H)
    const float *o;       // the mixer output, out_proj's input (O)
    float *lp;            // E predicted logits (times the RMS: only their order counts)
    unsigned *count;      // arrival count, zero between launches (the last block leaves it so)
    int K;
    int *ids;             // the predicted top-k (K), from k_moe_predict to k_moe_fetch
    dmat Wg, Wu, Wd;      // the routed experts (packed): the predicted ones go to the L2
    int *stat;            // null, or [K ids][hits][routed]: k_moe_split counts how many of its
                          // experts were predicted (LILAC_MOE_PRED_STATS)
};
#define MOE_PRED_ROWS 8 // logits a block: one a warp
#define MOE_PRED_PIECE 16384u // bytes an L2 prefetch asks for
__host__ __device__ inline size_t moe_pred_smem(int64_t H, int64_t O) { return gemv_smem(H) + gemv_smem(O); }

// E / MOE_PRED_ROWS blocks of 256 threads, moe_pred_smem(H, O) bytes: every block stages
// g ⊙ x and o (row_dot's layout), its warps make one logit each (the router's row against
// g ⊙ x plus C's against o), and the last block to arrive takes the top-k of all E into
// a.ids, for k_moe_fetch. E <= 256, K <= MOE_KMAX.
__global__ void __launch_bounds__(256) k_moe_predict(moe_pred_args a) {
    GEMV_SMEM(xs);
    pdl_trigger(); // k_moe_fetch's blocks may take their places
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t H = a.Wr.cols, O = a.C.cols, E = a.Wr.rows;
    float *const xo = xs + gemv_smem(H) / sizeof(float);
    for (int64_t q = tid; q < H / 4; q += blockDim.x) {
        const float4 v = ((const float4 *)a.x)[q], gg = ((const float4 *)a.g)[q];
        *(float4 *)(xs + xs_idx(4 * q)) = make_float4(v.x * gg.x, v.y * gg.y, v.z * gg.z, v.w * gg.w);
    }
    for (int64_t q = tid; q < O / 4; q += blockDim.x) *(float4 *)(xo + xs_idx(4 * q)) = ((const float4 *)a.o)[q];
    __syncthreads();
    const int64_t r = (int64_t)blockIdx.x * MOE_PRED_ROWS + warp;
    if (warp < MOE_PRED_ROWS && r < E) {
        const float v = warp_sum(row_dot(a.Wr, r, xs, lane) + row_dot(a.C, r, xo, lane));
        if (lane == 0) a.lp[r] = v;
    }
    __shared__ int last;
    __shared__ int ti[MOE_KMAX];
    __shared__ float tw[MOE_KMAX];
    __syncthreads();
    if (tid == 0) {
        __threadfence(); // this block's logits before its arrival
        last = atomicAdd(a.count, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (tid < 32) topk_warp<8>(a.lp, (int)E, a.K, 0, ti, tw, nullptr, 0);
    __syncthreads();
    if (tid == 0) *a.count = 0u;
    if (tid < a.K) a.ids[tid] = ti[tid];
    if (a.stat && tid < a.K) a.stat[tid] = ti[tid];
}

// The predicted experts' packed weights into the L2 (each expert's gate, up and down codes and
// scale/bias pairs: 6 K ranges), one 16 KB piece a thread over MOE_FETCH_BLOCKS blocks of 32:
// a SM asks the L2 for ~250 GB/s of prefetches at most (run 146: the last predictor block
// asking for all 13.8 MB alone took ~80 us), so the pieces are spread over many SMs.
// LINES: line by line through the load/store unit (l2_prefetch_lines) instead of bulk prefetches.
#define MOE_FETCH_BLOCKS 96
template <bool LINES> __global__ void __launch_bounds__(32) k_moe_fetch(moe_pred_args a) {
    pdl_wait(); // the ids come from k_moe_predict
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t nt = (int64_t)gridDim.x * blockDim.x;
    for (int r = 0; r < 6 * a.K; r++) {
        const int k = r / 6, m = (r % 6) >> 1;
        const dmat W = dmat_expert(m == 0 ? a.Wg : m == 1 ? a.Wu : a.Wd, __ldcg(a.ids + k));
        const uintptr_t p = r & 1 ? (uintptr_t)W.psb : (uintptr_t)W.pk;
        const uint64_t n = (uint64_t)(W.pk_rb * (W.cols / 64)) * (r & 1 ? 64u : 512u);
        const int64_t pieces = (int64_t)((n + MOE_PRED_PIECE - 1) / MOE_PRED_PIECE);
        for (; i < pieces; i += nt) {
            const uint64_t off = (uint64_t)i * MOE_PRED_PIECE;
            const uint32_t len = (uint32_t)(n - off < MOE_PRED_PIECE ? n - off : MOE_PRED_PIECE);
            if (LINES) l2_prefetch_lines(p + off, len);
            else l2_prefetch(p + off, len);
        }
        i -= pieces; // this thread's next piece, counted from the next range
    }
}
