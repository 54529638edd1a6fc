// cuda_gemm_tc.cuh — the prefill GEMM for matrices the quantized GEMMs do not take (bf16 checkpoints,
// other group sizes): dequantised tiles on the bf16 tensor cores, hi + lo splits.
#pragma once
#include <mma.h>

#include "cuda_common.cuh"
#include "cuda_gemv.cuh" // XM_*: the input modes

// ---------------------------------------------------------------- matrix-matrix (prefill), tensor cores

// y[row(n)][m] = sum_k W[m][k] X(n, k): 64 weight rows x 64 tokens per block.
// Weights are dequantised in shared memory; both operands are split into
// bf16 hi + lo parts and multiplied as Wh*Xh + Wh*Xl + Wl*Xh on the tensor
// cores (f32 accumulation), which keeps the result within ~1e-5 of an f32
// product: prefill agrees with the CPU reference and with decode.
// Grouped mode (offs != null): blockIdx.z is the expert; its tokens are the
// routing slots sorted[offs[e] .. offs[e+1]); the input row is slot / x_div and
// the output row is the slot. Plain mode: token n is row n of x and y.
#define TC_BM 64
#define TC_BN 64
#define TC_BK 64
#define TC_LD (TC_BK + 8)
__device__ __forceinline__ void split_bf16(float v, __nv_bfloat16 *hi, __nv_bfloat16 *lo) {
    const __nv_bfloat16 h = __float2bfloat16(v);
    *hi = h;
    *lo = __float2bfloat16(v - __bfloat162float(h));
}

template <int XM>
__global__ void __launch_bounds__(128) k_gemm_tc(dmat W, const float *x, int64_t ldx, int64_t xoff, float *y,
                                                 int64_t ldy, int T, const int *offs, const int *sorted, int x_div) {
    pdl_wait();
    using namespace nvcuda;
    int count = T, base = 0;
    if (offs) {
        base = offs[blockIdx.z];
        count = offs[blockIdx.z + 1] - base;
        W = dmat_expert(W, blockIdx.z);
    }
    const int n0 = blockIdx.y * TC_BN;
    const int64_t m0 = (int64_t)blockIdx.x * TC_BM;
    if (n0 >= count || m0 >= W.rows) return;

    // 4 bf16 tiles during the k loop; the f32 result tile reuses the space after it.
    __shared__ __align__(128) unsigned char smem[4 * TC_BM * TC_LD * 2];
    typedef __nv_bfloat16 tile[TC_LD];
    tile *Wh = (tile *)smem, *Wl = Wh + TC_BM, *Xh = Wl + TC_BM, *Xl = Xh + TC_BN;
    float(*Cs)[TC_BN + 4] = (float(*)[TC_BN + 4])smem;
    __shared__ int64_t xrow[TC_BN], yrow[TC_BN];
    const int tid = threadIdx.x, warp = tid >> 5;
    if (tid < TC_BN) {
        const int n = n0 + tid;
        if (n < count) {
            const int slot = offs ? sorted[base + n] : n;
            xrow[tid] = offs ? slot / x_div : n;
            yrow[tid] = slot;
        } else {
            xrow[tid] = -1;
            yrow[tid] = -1;
        }
    }
    __syncthreads();

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const int64_t cols = W.cols;

    for (int64_t k0 = 0; k0 < cols; k0 += TC_BK) {
        if (W.type == 1) {
            for (int idx = tid; idx < TC_BM * TC_BK; idx += 128) {
                const int row = idx / TC_BK, c = idx % TC_BK;
                __nv_bfloat16 v = __float2bfloat16(0.0f);
                if (m0 + row < W.rows) v = W.w[(m0 + row) * cols + k0 + c];
                Wh[row][c] = v;
                Wl[row][c] = __float2bfloat16(0.0f); // bf16 weights are exact
            }
        } else {
            const int bits = W.bits, per_word = 32 / bits, wpt = TC_BK / per_word;
            const uint32_t mask = (1u << bits) - 1u;
            const int64_t wpr = cols / per_word, ng = cols / W.group;
            for (int idx = tid; idx < TC_BM * wpt; idx += 128) {
                const int row = idx / wpt, wi = idx % wpt, c = wi * per_word;
                const int64_t gr = m0 + row;
                if (gr < W.rows) {
                    const uint32_t word = W.q[gr * wpr + k0 / per_word + wi];
                    const int64_t g = gr * ng + (k0 + c) / W.group;
                    const float s = __bfloat162float(W.s[g]), b = __bfloat162float(W.b[g]);
                    for (int j = 0; j < per_word; j++)
                        split_bf16(s * (float)((word >> (j * bits)) & mask) + b, &Wh[row][c + j], &Wl[row][c + j]);
                } else {
                    for (int j = 0; j < per_word; j++) Wh[row][c + j] = Wl[row][c + j] = __float2bfloat16(0.0f);
                }
            }
        }
        for (int idx = tid; idx < TC_BN * TC_BK / 4; idx += 128) {
            const int n = idx / (TC_BK / 4), c4 = (idx % (TC_BK / 4)) * 4;
            float v[4] = {0, 0, 0, 0};
            if (xrow[n] >= 0) {
                const float *xr = x + xrow[n] * ldx + k0 + c4;
                float4 a = *(const float4 *)xr;
                v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
                if (XM == XM_SWIGLU) {
                    float4 u = *(const float4 *)(xr + xoff);
                    v[0] = v[0] / (1.0f + expf(-v[0])) * u.x;
                    v[1] = v[1] / (1.0f + expf(-v[1])) * u.y;
                    v[2] = v[2] / (1.0f + expf(-v[2])) * u.z;
                    v[3] = v[3] / (1.0f + expf(-v[3])) * u.w;
                }
            }
#pragma unroll
            for (int j = 0; j < 4; j++) split_bf16(v[j], &Xh[n][c4 + j], &Xl[n][c4 + j]);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TC_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> ah[2], al[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bh[2], bl[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                wmma::load_matrix_sync(ah[i], &Wh[wm + i * 16][kk], TC_LD);
                wmma::load_matrix_sync(al[i], &Wl[wm + i * 16][kk], TC_LD);
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                wmma::load_matrix_sync(bh[j], &Xh[wn + j * 16][kk], TC_LD);
                wmma::load_matrix_sync(bl[j], &Xl[wn + j * 16][kk], TC_LD);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    wmma::mma_sync(acc[i][j], al[i], bh[j], acc[i][j]);
                    wmma::mma_sync(acc[i][j], ah[i], bl[j], acc[i][j]);
                    wmma::mma_sync(acc[i][j], ah[i], bh[j], acc[i][j]);
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&Cs[wm + i * 16][wn + j * 16], acc[i][j], TC_BN + 4, wmma::mem_row_major);
    __syncthreads();
    for (int idx = tid; idx < TC_BM * TC_BN; idx += 128) {
        const int n = idx / TC_BM, m = idx % TC_BM;
        if (yrow[n] >= 0 && m0 + m < W.rows) y[yrow[n] * ldy + m0 + m] = Cs[m][n];
    }
}
