// cuda_gemm4_tile.cuh — what the two 4-bit prefill GEMMs share (k_gemm_q in cuda_gemm.cuh,
// k_gemm_wg in cuda_gemm_wg.cuh): the tile, the job of up to G4_MATS matrices, which tile a
// block computes, and the codes' unpacking. Free of device assembly where the CUDA emulator
// (tests/cuda/emu) builds it.
#pragma once
#include <stdint.h>

#include "cuda_matrix.cuh"

#define G4_BM 128
#define G4_BN 64
#define G4_BK 64      // = the quantisation group
#define G4_MATS 4

// Up to G4_MATS matrices that read the same input rows, in one launch: x-tiles
// [start[i], start[i+1]) compute matrix i into y[i] (row stride ldy[i]).
struct g4_job {
    dmat W[G4_MATS];
    float *y[G4_MATS];
    int64_t ldy[G4_MATS];
    int start[G4_MATS + 1];
    int n;
    const int8_t *xq;   // 4-bit: the pieces, [piece][row][cols] in the K order of the packed codes (k_split_x)
    const float *xsig;  // 4-bit: sigma per row and group, [row][cols/64]
    int64_t xq_plane;   // bytes from one piece's plane to the next
    // k_gemm_wg only, swiglu = 1: W[0] and W[1] are a gate and an up matrix of the same rows (a multiple
    // of 64). Block x computes rows [64 x, 64 x + 64) of both and, instead of y, writes
    // h = silu(gate) * up for its tokens as the input of the GEMM after it, split as k_split_x<1> would
    // (bf16 parts oh/ol [row][rows], group sums osw; the row: the token's output row, e.g. its slot).
    int swiglu;
    __nv_bfloat16 *oh, *ol, *osw;
};

// SwiGLU of one element, the one expression k_split_x<1> and k_gemm_wg's swiglu epilogue share (the
// same bits from both).
__host__ __device__ __forceinline__ float g4_swiglu(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// k_gemm_wg's group sums (k_split_x writes them): per input row, windows of 16 groups of 48 bf16,
// the sum of group 16 w + k as three pieces (hi, mid, lo: 2^-24) at k, 16 + k and 32 + k. Where
// window w of row r starts, in a matrix of ng groups:
__host__ __device__ inline int64_t wg_xsw_win(int64_t r, int ng, int w) { return (r * ((ng + 15) / 16) + w) * 48; }

// The split of a GEMM input as k_split_x writes it, one thread's four consecutive values e of a row at
// a time; k_gemm_wg's swiglu epilogue writes its output through the same three functions (so the same
// bits). The bf16 parts: xh = bf16(e), xl = bf16(e - xh), at xh/xl + at.
struct alignas(8) g4_bf16x4 {
    __nv_bfloat16 v[4];
};
__device__ __forceinline__ void g4_put_parts(const float (&e)[4], __nv_bfloat16 *xh, __nv_bfloat16 *xl, int64_t at) {
    g4_bf16x4 h, l;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        h.v[i] = __float2bfloat16(e[i]);
        l.v[i] = __float2bfloat16(e[i] - __bfloat162float(h.v[i]));
    }
    *(g4_bf16x4 *)(xh + at) = h;
    *(g4_bf16x4 *)(xl + at) = l;
}
// The sum of a group of 64 columns that 16 consecutive lanes hold, four each (all 32 lanes call it).
__device__ __forceinline__ float g4_group_sum(const float (&e)[4]) {
    float s = (e[0] + e[1]) + (e[2] + e[3]);
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}
// Group G's sum s of row r (of ng groups) into xsw as three pieces, s = hi + mid + lo (2^-24).
__device__ __forceinline__ void g4_put_xsw(__nv_bfloat16 *xsw, int64_t r, int ng, int G, float s) {
    const int64_t at = wg_xsw_win(r, ng, G / 16) + G % 16;
    const __nv_bfloat16 h = __float2bfloat16(s), m = __float2bfloat16(s - __bfloat162float(h));
    xsw[at] = h;
    xsw[at + 16] = m;
    xsw[at + 32] = __float2bfloat16(s - __bfloat162float(h) - __bfloat162float(m));
}

// Where a split goes (k_split_x's outputs but the int8 pieces): the bf16 parts xh/xl [row][cols], the
// f32 group sums xs [row][cols/64] and, for k_gemm_wg, the same sums in its windows (xsw: may be null).
// The prefill norms that make a GEMM's input (k_add_rmsnorm, k_moe_combine, k_gated_norm) write it too
// when given one (xh not null), so that k_split_x need not read their output again.
struct g4_split {
    __nv_bfloat16 *xh, *xl, *xsw;
    float *xs;
};
// One thread's four values e at column c of row r (cols a multiple of 64) into the split: every lane of
// the warp calls it (16 consecutive lanes, threadIdx.x & 15 = 0 first, hold a group of 64 columns);
// in: c < cols (a whole group's lanes agree).
__device__ __forceinline__ void g4_split4(const g4_split &o, const float (&e)[4], bool in, int64_t r, int64_t c,
                                          int64_t cols) {
    if (in) g4_put_parts(e, o.xh, o.xl, r * cols + c);
    const float s = g4_group_sum(e);
    if (in && (threadIdx.x & 15) == 0) {
        o.xs[r * (cols / 64) + c / 64] = s;
        if (o.xsw) g4_put_xsw(o.xsw, r, (int)(cols / 64), (int)(c / 64), s);
    }
}
// A partial last window's empty slots of row r (zero: k_gemm_wg's bias product reads them); threads
// 0 .. 47 of the row's block.
__device__ __forceinline__ void g4_split_pad(const g4_split &o, int64_t r, int ng) {
    if (o.xsw && (ng & 15) && threadIdx.x < 48 && (int)(threadIdx.x & 15) >= (ng & 15))
        o.xsw[wg_xsw_win(r, ng, (ng - 1) / 16) + threadIdx.x] = __float2bfloat16(0.0f);
}

// The two codes at bits 0-3 and 16-19 of w as an exact bf16x2: (128 + q) - 128, the first step one lop3.
__device__ __forceinline__ uint32_t pk_frag2(uint32_t w) {
#ifdef LILAC_CUEMU // the same bits: q exact in bf16 (its top 16 bits as f32)
    const uint32_t lo = __float_as_uint((float)(w & 15u)) >> 16, hi = __float_as_uint((float)((w >> 16) & 15u)) >> 16;
    return lo | hi << 16;
#else
    uint32_t v;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(w), "r"(0x000F000Fu), "r"(0x43004300u)); // (w & m) | c
    __nv_bfloat162 h = *(const __nv_bfloat162 *)&v;
    h = __hsub2(h, __floats2bfloat162_rn(128.0f, 128.0f));
    return *(const uint32_t *)&h;
#endif
}
// The tile block (blockIdx.x, blockIdx.y) of a g4 launch computes (k_gemm_q, k_gemm_wg): its matrix W
// (the expert's, grouped), output y with row stride ldy, first weight row m0, and the input row
// (xrow) and output row (yrow) of each of its G4_BN tokens (-1: none). Grouped mode (tiles != null):
// blockIdx.y is an entry (expert, first token) of the device-built tile map (k_moe_scan); the
// expert's tokens are the routing slots sorted[offs[e] .. offs[e+1]), the input row is slot / x_div
// and the output row the slot. Plain mode: token n is row n of the input and of y. False: nothing
// to do (the whole block returns; the caller has not synchronised yet). *nn: the tile's tokens
// (1 .. G4_BN, the first nn of xrow/yrow), where the caller asks. A swiglu job: 64 rows of matrix 0 a
// block (m0 a multiple of 64), and matrix 1 (the same expert's) in *W2 (untouched otherwise).
__device__ __forceinline__ bool g4_tile(const g4_job &job, int T, const int *offs, const int *sorted, const int2 *tiles,
                                        const int *n_tiles, int x_div, dmat &W, float *&y, int64_t &ldy, int64_t &m0,
                                        int *xrow, int *yrow, int *nn = nullptr, dmat *W2 = nullptr) {
    int mi = 0;
    while (mi + 1 < job.n && (int)blockIdx.x >= job.start[mi + 1]) mi++;
    W = job.W[mi];
    y = job.y[mi];
    ldy = job.ldy[mi];
    int count = T, base = 0, n0 = blockIdx.y * G4_BN;
    if (tiles) {
        if ((int)blockIdx.y >= *n_tiles) return false;
        const int2 tl = tiles[blockIdx.y];
        base = offs[tl.x];
        count = offs[tl.x + 1] - base;
        n0 = tl.y;
        W = dmat_expert(W, tl.x);
        if (W2 && job.swiglu) *W2 = dmat_expert(job.W[1], tl.x);
    } else if (W2 && job.swiglu) {
        *W2 = job.W[1];
    }
    m0 = (int64_t)(blockIdx.x - job.start[mi]) * (job.swiglu ? G4_BM / 2 : G4_BM);
    if (n0 >= count || m0 >= W.rows) return false;
    if (nn) *nn = count - n0 < G4_BN ? count - n0 : G4_BN;
    const int tid = threadIdx.x;
    if (tid < G4_BN) {
        const int n = n0 + tid;
        const int slot = n < count ? (tiles ? sorted[base + n] : n) : -1;
        xrow[tid] = slot >= 0 ? (tiles ? slot / x_div : n) : -1;
        yrow[tid] = slot;
    }
    __syncthreads();
    return true;
}
