// cuda_kernels.cuh — every kernel of the CUDA forward pass. Each mirrors a step of
// src/backend/cpu/cpu_forward.c (the reference it is tested against); f32
// activations, weights read in their packed checkpoint form.
#pragma once
#include <cooperative_groups.h>
#include <mma.h>

#include "cuda_common.cuh"
#include "cuda_g4.cuh" // g4_split: the prefill norms write their output split for the GEMM after them
#include "cuda_topk.cuh"
#include "cuda_gemv.cuh" // the decode GEMV

// ---------------------------------------------------------------- embedding / norms

// x[t] = dequantised row ids[t] of the embedding. Grid (T, column blocks). The first
// kernel of every pass, and it never lets its successor launch early: k_gdn_step reads
// its state before its predecessor wait, relying on the previous pass having ended.
__global__ void k_embed(dmat E, const int *ids, float *x) {
    pdl_wait();
    const int t = blockIdx.x;
    const int64_t row = ids[t], H = E.cols, c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= H) return;
    float *xo = x + (int64_t)t * H;
    if (E.type == 1) {
        xo[c] = __bfloat162float(E.w[row * H + c]);
        return;
    }
    const int per_word = 32 / E.bits;
    const uint32_t mask = (1u << E.bits) - 1u;
    const int64_t wpr = H / per_word, ng = H / E.group;
    const uint32_t w = E.q[row * wpr + c / per_word];
    const float q = (float)((w >> ((c % per_word) * E.bits)) & mask);
    const int64_t g = row * ng + c / E.group;
    xo[c] = __bfloat162float(E.s[g]) * q + __bfloat162float(E.b[g]);
}

// Row y = x * inv * gain of H columns (a multiple of 64), four a thread, and into the split sp of row
// `row` when sp.xh: the same bits k_split_x would make from y (whose 120 launches of a 4k prefill,
// 3.0 ms, mostly re-read what a norm had just written); then yr may be null (only the split is read).
// After a barrier: xr may be another thread's writes.
__device__ __forceinline__ void norm_row_out(const float *xr, float inv, const float *gain, float *yr, int64_t H,
                                             const g4_split &sp, int64_t row) {
    if (!sp.xh) {
        for (int64_t i = threadIdx.x; i < H; i += blockDim.x) yr[i] = xr[i] * inv * gain[i];
        return;
    }
    g4_split_pad(sp, row, (int)(H / 64));
    for (int64_t c0 = 0; c0 < H; c0 += (int64_t)blockDim.x * 4) { // every thread every round (the group sums)
        const int64_t c = c0 + (int64_t)threadIdx.x * 4;
        const bool in = c < H;
        float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (in) {
            const float4 v = *(const float4 *)(xr + c), g = *(const float4 *)(gain + c);
            e[0] = v.x * inv * g.x, e[1] = v.y * inv * g.y, e[2] = v.z * inv * g.z, e[3] = v.w * inv * g.w;
            if (yr) *(float4 *)(yr + c) = make_float4(e[0], e[1], e[2], e[3]);
        }
        g4_split4(sp, e, in, row, c, H);
    }
}

// Optional residual add, then RMSNorm: x += r (r may be null); y = x * rsqrt(mean(x^2)+eps) * gain.
// Row t of x is row t of y; rows [row0, row0 + gridDim.x). sp.xh: y's rows also split (row t of y is
// row t of the split; H a multiple of 64), and y may be null (not written).
__global__ void k_add_rmsnorm(float *x, const float *r, const float *gain, float *y, int64_t H, float eps, int row0,
                              g4_split sp) {
    pdl_wait();
    __shared__ float sh[32];
    const int64_t t = row0 + blockIdx.x;
    float *xr = x + t * H;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
        float v = xr[i];
        if (r) xr[i] = v = v + r[t * H + i];
        ss += v * v;
    }
    ss = block_sum(ss, sh);
    const float inv = rsqrtf(ss / (float)H + eps);
    norm_row_out(xr, inv, gain, y ? y + (int64_t)blockIdx.x * H : nullptr, H, sp, blockIdx.x);
}

// ---------------------------------------------------------------- matrix-vector (decode)
// The one-token GEMV (the job, the row dots of unpacked matrices, k_gemv): cuda_gemv.cuh.


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

// ---------------------------------------------------------------- Gated DeltaNet

// Causal depthwise conv over [state | qkv] then SiLU; the state keeps the last
// K-1 raw inputs. Grid (channel blocks, token segments of CONV_TS): a thread
// computes one channel over one segment, its window in registers. The state is
// double-buffered ([2][K-1][CD]): a pass at position p reads buffer p&1 and
// writes buffer (p+T)&1, so the single-token kernel (k_gdn_step) can let two
// blocks read a shared q/k channel while one of them writes its update. Here
// only the segment-0 thread of a channel touches its state (reads first, writes
// last), so the two buffers may coincide (T even) without a race.
// The gates of a v-head: beta = sigmoid(b), decay = exp(g), g = -exp(A_log) softplus(a + dt_bias);
// returns g (the chunked prefill, cuda_gdn_chunk.cuh, sums it).
__device__ __forceinline__ float gdn_gates(float b, float a, float dt_bias, float A_log, float &beta, float &decay) {
    beta = 1.0f / (1.0f + expf(-b));
    const float xa = a + dt_bias, g = -expf(A_log) * (xa > 20.0f ? xa : log1pf(expf(xa)));
    decay = expf(g);
    return g;
}

// The L2 scale of one q or k head's dk values at v (a q head's with 1/sqrt(dk) too), by one warp: k_gdn_prep
// and k_conv's fused prep share it (the same loop, so the same bits; dk a run-time value in both: a constant
// 128 folds rsqrtf(dk) to another last bit than the instruction computes).
__device__ __forceinline__ float gdn_qk_scale(const float *v, int dk, bool is_q) {
    const int lane = threadIdx.x & 31;
    float ss = 0.0f;
    for (int i = lane; i < dk; i += 32) ss += v[i] * v[i];
    ss = warp_sum(ss);
    return (is_q ? rsqrtf((float)dk) : 1.0f) / sqrtf(ss + 1e-6f);
}

// k_gdn_prep's work, when k_conv does it (qk_heads > 0): the q/k heads' L2 scales and the gates.
struct gdn_prep_args {
    int qk_heads, Hk, Hv, dk; // q and k heads (the first qk_heads * 128 channels), of them q, v heads; dk = 128
    const float *bb, *ba, *A_log, *dt_bias;
    float *beta, *decay, *lgd; // lgd may be null
};

#define CONV_TS 32
template <int K>
// (qkv and out never alias. Marking them __restrict__ and unrolling the token loop leaves a 4k layer at 90 us,
// ~3 TB/s.)
// pp.qk_heads > 0 (blocks of 128 threads, dk = 128: a block of the first qk_heads is one head): k_gdn_prep
// fused, so that its pass over the q/k rows goes (37 us a 4k layer): a q/k block scales its
// segment's outputs by their heads' L2 scales before it stores them, and block x = 0 computes the
// segment's gates; the same bits as k_conv then k_gdn_prep.
__global__ void k_conv(const float *__restrict__ qkv, float *state2, const float *w, float *__restrict__ out, int T, int64_t CD,
                       const int *d_pos, gdn_prep_args pp) {
    // segments past the first take their window from qkv alone, never from the state
    static_assert(K - 1 <= CONV_TS, "a conv window longer than a token segment would read the state buffer");
    __shared__ float ys[CONV_TS][128], sc[CONV_TS]; // a q/k block's outputs, their scales
    pdl_wait();
    const int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int t0 = blockIdx.y * CONV_TS, t1 = min(T, t0 + CONV_TS);
    const bool qk = (int)blockIdx.x < pp.qk_heads; // (the whole block)
    if (pp.qk_heads > 0 && blockIdx.x == 0) // the gates of the segment's tokens
        for (int i = threadIdx.x; i < (t1 - t0) * pp.Hv; i += blockDim.x) {
            const int64_t at = (int64_t)t0 * pp.Hv + i;
            const int j = i % pp.Hv;
            const float g = gdn_gates(pp.bb[at], pp.ba[at], pp.dt_bias[j], pp.A_log[j], pp.beta[at], pp.decay[at]);
            if (pp.lgd) pp.lgd[at] = g;
        }
    if (ch >= CD) return;
    const int p = *d_pos;
    const float *rd = state2 + (int64_t)(p & 1) * (K - 1) * CD;
    float win[K], wc[K];
#pragma unroll
    for (int k = 0; k < K; k++) wc[k] = w[ch * K + k];
#pragma unroll
    for (int k = 0; k < K - 1; k++) { // inputs at tokens t0-(K-1) .. t0-1 (negative: from the state)
        const int tt = t0 - (K - 1) + k;
        win[k] = tt >= 0 ? qkv[(int64_t)tt * CD + ch] : rd[(int64_t)(K - 1 + tt) * CD + ch];
    }
    float saved[K - 1];
#pragma unroll
    for (int k = 0; k < K - 1; k++) saved[k] = win[k];
#pragma unroll 4
    for (int t = t0; t < t1; t++) {
        win[K - 1] = qkv[(int64_t)t * CD + ch];
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) acc += wc[k] * win[k];
        const float y = acc / (1.0f + expf(-acc));
        if (qk) ys[t - t0][threadIdx.x] = y;
        else out[(int64_t)t * CD + ch] = y;
#pragma unroll
        for (int k = 0; k < K - 1; k++) win[k] = win[k + 1];
    }
    if (qk) { // (a q/k block has every thread: qk_heads * 128 <= CD)
        __syncthreads();
        for (int i = threadIdx.x >> 5; i < t1 - t0; i += blockDim.x >> 5) {
            const float f = gdn_qk_scale(ys[i], pp.dk, (int)blockIdx.x < pp.Hk);
            if ((threadIdx.x & 31) == 0) sc[i] = f;
        }
        __syncthreads();
        for (int t = t0; t < t1; t++) {
            float y = ys[t - t0][threadIdx.x];
            y *= sc[t - t0];
            out[(int64_t)t * CD + ch] = y;
        }
    }
    if (blockIdx.y == 0) { // new state: the raw inputs at tokens T-(K-1) .. T-1
        float *wr = state2 + (int64_t)((p + T) & 1) * (K - 1) * CD;
#pragma unroll
        for (int k = 0; k < K - 1; k++) {
            const int tt = T - (K - 1) + k;
            float v = 0.0f;
#pragma unroll
            for (int i = 0; i < K - 1; i++) // saved[K - 1 + tt] with a compile-time index
                if (i == K - 1 + tt) v = saved[i];
            wr[(int64_t)k * CD + ch] = tt >= 0 ? qkv[(int64_t)tt * CD + ch] : v;
        }
    }
}

// The end of one conv channel of a GDN decode step (k_gdn_step, mk_gdn): channel i of the
// block's q (i < dk), k (i < 2 dk) or v columns, with its window win (the new input last) and weights
// w: SiLU of their dot into qs / ks / vsm and its square added to sq or sk; with `store`, the window's
// last K - 1 inputs to the conv state wr (stride CD) at channel ch.
template <int K>
__device__ __forceinline__ void gdn_conv_out(int i, int dk, const float (&win)[K], const float (&w)[K], bool store, float *wr,
                                             int64_t CD, int64_t ch, float *qs, float *ks, float *vsm, float &sq, float &sk) {
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) acc += w[k] * win[k];
    const float y = acc / (1.0f + expf(-acc));
    if (store)
#pragma unroll
        for (int k = 0; k < K - 1; k++) wr[k * CD + ch] = win[k + 1];
    if (i < dk) { qs[i] = y; sq += y * y; }
    else if (i < 2 * dk) { ks[i - dk] = y; sk += y * y; }
    else vsm[i - 2 * dk] = y;
}

// One decode step of the delta rule for state column m: the thread holds keys
// [g*KPT, (g+1)*KPT) of the column in sv (stored back to S, stride ld); q and k
// (shared memory) come with their L2 factors qn (1/sqrt(dk) included) and kn; v
// is the column's value. part: [G][width] shared scratch, width >= the threads'
// columns. Returns q . S_new for the column in every thread of it.
template <int KPT, int G>
__device__ __forceinline__ float gdn_column_step(float (&sv)[KPT], float *S, int64_t ld, const float *qs, const float *ks,
                                                 float qn, float kn, float decay, float beta, float v, float *part,
                                                 int width, int m, int g) {
    float r = 0.0f;
#pragma unroll
    for (int i = 0; i < KPT; i++) r += sv[i] * ks[g * KPT + i];
    part[g * width + m] = r * kn;
    __syncthreads();
    float rt = 0.0f;
#pragma unroll
    for (int gg = 0; gg < G; gg++) rt += part[gg * width + m];
    const float d = (v - decay * rt) * beta;
    float ov = 0.0f;
#pragma unroll
    for (int i = 0; i < KPT; i++) {
        sv[i] = decay * sv[i] + ks[g * KPT + i] * kn * d;
        S[(int64_t)i * ld] = sv[i];
        ov += sv[i] * qs[g * KPT + i];
    }
    __syncthreads();
    part[g * width + m] = ov * qn;
    __syncthreads();
    float ot = 0.0f;
#pragma unroll
    for (int gg = 0; gg < G; gg++) ot += part[gg * width + m];
    return ot;
}

// Per token: L2-normalise the q and k heads in place (q also scaled by
// 1/sqrt(dk)), and the gates (gdn_gates); lgd non-null: the log decays too.
__global__ void k_gdn_prep(float *conv_out, int64_t CD, int n_qk_heads, int Hk, int dk, const float *bb,
                           const float *ba, const float *A_log, const float *dt_bias, int Hv, float *beta,
                           float *decay, float *lgd = nullptr) {
    pdl_wait();
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *row = conv_out + (int64_t)t * CD;
    for (int h = warp; h < n_qk_heads; h += nw) {
        float *v = row + (int64_t)h * dk;
        const float sc = gdn_qk_scale(v, dk, h < Hk);
        for (int i = lane; i < dk; i += 32) v[i] *= sc;
    }
    for (int j = threadIdx.x; j < Hv; j += blockDim.x) {
        const int64_t i = (int64_t)t * Hv + j;
        const float g = gdn_gates(bb[i], ba[i], dt_bias[j], A_log[j], beta[i], decay[i]);
        if (lgd) lgd[i] = g;
    }
}

// The f32 delta-rule recurrence over a prefill chunk. Block = 4 warps = 128/RG
// value columns of one v-head (grid: v-heads x dv*RG/128). Warp lane = column *
// RG + g: the thread keeps keys [g*KPT, (g+1)*KPT) (KPT = DK/RG) of its column
// of the state S[dk][dv] in registers. The chain is serial in the tokens, so
// the kernel's time is T times one token's dependent latency, whatever the
// number of warps (docs/perf.md): a token is one pass over S (update, o_t, and the next
// token's S.k) and one set of shuffle rounds for two values. q and k are read
// as float4 from shared memory, each key group padded by 4 floats so that the
// groups a warp reads at once sit in different banks. q, k, v, decay and beta
// of TS tokens at a time are staged with cp.async, double-buffered.
template <int DK, int RG, int C> struct gdn_recur_geom {
    static const int KPT = DK / RG, CW = 128 / RG * C, KLD = DK + 4 * RG; // CW: value columns per block
    static const int TS = KLD > 160 ? 8 : 16; // tokens per staging buffer (static shared memory < 48 KB)
    static_assert(KPT >= 4 && KPT % 4 == 0 && 32 % RG == 0, "k_gdn_recur shape");
};
template <int DK, int RG, int C>
__global__ void __launch_bounds__(128) k_gdn_recur(const float *conv_out, int64_t CD, int64_t KD, int Hk, int Hv, int dv,
                                                   const float *beta, const float *decay, float *ssm, float *o, int T) {
    typedef gdn_recur_geom<DK, RG, C> GM;
    constexpr int KPT = GM::KPT, TS = GM::TS, KLD = GM::KLD, CW = GM::CW, CS = 128 / RG; // group g at g*(KPT+4)
    __shared__ __align__(16) float qs[2][TS][KLD], ks[2][TS][KLD], vs[2][TS][CW], as[2][TS], bs[2][TS];
    pdl_wait();
    const int j = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane % RG;
    const int col = warp * (32 / RG) + lane / RG, m = blockIdx.y * CW + col; // columns m + c*CS, c < C
    const int hk = j / (Hv / Hk);
    const int64_t VD = (int64_t)Hv * dv;
    float S[C][KPT];
    float *Sg = ssm + (int64_t)j * DK * dv + m;
#pragma unroll
    for (int c = 0; c < C; c++)
#pragma unroll
        for (int i = 0; i < KPT; i++) S[c][i] = Sg[(int64_t)(g * KPT + i) * dv + c * CS];
    auto stage = [&](int t0, int b) {
        const int n = min(TS, T - t0);
        // q and k rows: DK/4 16-byte chunks each; v: CW/4 chunks
        const int per_tok = DK / 2 + CW / 4;
        for (int cc = tid; cc < n * per_tok; cc += 128) {
            const int tt = cc / per_tok, r = cc % per_tok;
            const float *row = conv_out + (int64_t)(t0 + tt) * CD;
            float *dst;
            const float *src;
            if (r < DK / 2) { // q (r < DK/4) or k: float4 number e of the row, at its padded place
                const int e = r % (DK / 4), pad = (4 * e / KPT) * 4;
                dst = (r < DK / 4 ? qs[b][tt] : ks[b][tt]) + 4 * e + pad;
                src = row + (r < DK / 4 ? 0 : KD) + (int64_t)hk * DK + 4 * e;
            }
            else { dst = &vs[b][tt][4 * (r - DK / 2)]; src = row + 2 * KD + (int64_t)j * dv + blockIdx.y * CW + 4 * (r - DK / 2); }
            cp_async16(dst, src, true);
        }
        for (int cc = tid; cc < 2 * n; cc += 128) {
            const int tt = cc >> 1;
            if (cc & 1) cp_async4(&bs[b][tt], beta + (int64_t)(t0 + tt) * Hv + j, true);
            else cp_async4(&as[b][tt], decay + (int64_t)(t0 + tt) * Hv + j, true);
        }
        cp_async_commit();
    };
    // Token t's steps, per column: r = S.k_t (reduced over the column's RG threads), d = (v - a r)
    // beta, S = a S + k_t d, o_t = S.q_t. The next token's r = S.k_{t+1} is accumulated in the same
    // pass over S as o_t and reduced beside it; the next token's operands are loaded into registers
    // a token ahead, and each k/q load serves the thread's C columns. A staging buffer's first r is
    // computed on its own.
    auto reduce = [&](float (&x)[2 * C]) {
#pragma unroll
        for (int off = 1; off < RG; off <<= 1)
#pragma unroll
            for (int c = 0; c < 2 * C; c++) x[c] += __shfl_xor_sync(0xffffffffu, x[c], off);
    };
    if (T > 0) stage(0, 0);
    for (int t0 = 0, b = 0; t0 < T; t0 += TS, b ^= 1) {
        if (t0 + TS < T) {
            stage(t0 + TS, b ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int n = min(TS, T - t0);
        float4 kc[KPT / 4], qc[KPT / 4];
#pragma unroll
        for (int i = 0; i < KPT / 4; i++) {
            kc[i] = ((const float4 *)(ks[b][0] + g * (KPT + 4)))[i];
            qc[i] = ((const float4 *)(qs[b][0] + g * (KPT + 4)))[i];
        }
        float a = as[b][0], bt = bs[b][0], v[C], r[C];
#pragma unroll
        for (int c = 0; c < C; c++) v[c] = vs[b][0][col + c * CS];
        {
            float x[2 * C];
#pragma unroll
            for (int c = 0; c < C; c++) {
                float r4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int i = 0; i < KPT / 4; i++) {
                    r4[0] += S[c][4 * i] * kc[i].x;
                    r4[1] += S[c][4 * i + 1] * kc[i].y;
                    r4[2] += S[c][4 * i + 2] * kc[i].z;
                    r4[3] += S[c][4 * i + 3] * kc[i].w;
                }
                x[c] = (r4[0] + r4[1]) + (r4[2] + r4[3]);
                x[C + c] = 0.f;
            }
            reduce(x);
#pragma unroll
            for (int c = 0; c < C; c++) r[c] = x[c];
        }
#pragma unroll 2
        for (int tt = 0; tt < n; tt++) {
            const int tn = min(tt + 1, n - 1); // past the buffer's end: loaded, used for nothing
            float4 kn[KPT / 4], qn[KPT / 4];
#pragma unroll
            for (int i = 0; i < KPT / 4; i++) {
                kn[i] = ((const float4 *)(ks[b][tn] + g * (KPT + 4)))[i];
                qn[i] = ((const float4 *)(qs[b][tn] + g * (KPT + 4)))[i];
            }
            const float an = as[b][tn], btn = bs[b][tn];
            float vn[C], x[2 * C];
#pragma unroll
            for (int c = 0; c < C; c++) {
                vn[c] = vs[b][tn][col + c * CS];
                const float d = (v[c] - a * r[c]) * bt;
                float o4[4] = {0.f, 0.f, 0.f, 0.f}, r4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int i = 0; i < KPT / 4; i++) {
                    float *Sc = &S[c][4 * i];
                    Sc[0] = a * Sc[0] + kc[i].x * d;
                    Sc[1] = a * Sc[1] + kc[i].y * d;
                    Sc[2] = a * Sc[2] + kc[i].z * d;
                    Sc[3] = a * Sc[3] + kc[i].w * d;
                    o4[0] += Sc[0] * qc[i].x;
                    o4[1] += Sc[1] * qc[i].y;
                    o4[2] += Sc[2] * qc[i].z;
                    o4[3] += Sc[3] * qc[i].w;
                    r4[0] += Sc[0] * kn[i].x;
                    r4[1] += Sc[1] * kn[i].y;
                    r4[2] += Sc[2] * kn[i].z;
                    r4[3] += Sc[3] * kn[i].w;
                }
                x[c] = (o4[0] + o4[1]) + (o4[2] + o4[3]);
                x[C + c] = (r4[0] + r4[1]) + (r4[2] + r4[3]);
            }
            reduce(x);
            if (g == 0)
#pragma unroll
                for (int c = 0; c < C; c++) o[(int64_t)(t0 + tt) * VD + (int64_t)j * dv + m + c * CS] = x[c];
#pragma unroll
            for (int i = 0; i < KPT / 4; i++) {
                kc[i] = kn[i];
                qc[i] = qn[i];
            }
#pragma unroll
            for (int c = 0; c < C; c++) {
                r[c] = x[C + c];
                v[c] = vn[c];
            }
            a = an;
            bt = btn;
        }
        __syncthreads(); // buffer b is restaged next round
    }
#pragma unroll
    for (int c = 0; c < C; c++)
#pragma unroll
        for (int i = 0; i < KPT; i++) Sg[(int64_t)(g * KPT + i) * dv + c * CS] = S[c][i];
}
typedef void (*gdn_recur_fn)(const float *, int64_t, int64_t, int, int, int, const float *, const float *, float *, float *,
                             int);
// The instance for key dim dk, rg threads per column (4, 8 or 16; others: 4) and c columns per
// thread (1 or 2; others: 1), and its grid; rg and c come back as used. rg is lowered while dk/rg <
// 4; c = 2 only where a thread's state stays within 32 registers (dk/rg <= 16: <256, 4, 2> spills);
// where the block's 128/rg*c columns do not divide dv, the (4, 1) shape (dv % 32 == 0, which the
// backend requires). nullptr for an unbuilt dk.
static inline gdn_recur_fn gdn_recur_kernel(int dk, int &rg, int &c, int Hv, int dv, dim3 *grid) {
    if (rg != 4 && rg != 8 && rg != 16) rg = 4;
    c = c == 2 ? 2 : 1;
    while (rg > 4 && dk / rg < 4) rg /= 2;
    if (dk / rg > 16) c = 1;
    if (dv % (128 / rg * c) != 0) rg = 4, c = 1;
    *grid = dim3((unsigned)Hv, (unsigned)(dv / (128 / rg * c)));
#define GDN_RECUR_C(DK, RG) (c == 2 ? (gdn_recur_fn)k_gdn_recur<DK, RG, 2> : (gdn_recur_fn)k_gdn_recur<DK, RG, 1>)
#define GDN_RECUR_RG(DK) (rg == 16 ? GDN_RECUR_C(DK, 16) : rg == 8 ? GDN_RECUR_C(DK, 8) : GDN_RECUR_C(DK, 4))
    switch (dk) {
    case 32: return rg == 8 ? GDN_RECUR_C(32, 8) : GDN_RECUR_C(32, 4);
    case 64: return GDN_RECUR_RG(64);
    case 128: return GDN_RECUR_RG(128);
    case 256: return GDN_RECUR_RG(256);
    default: return nullptr;
    }
#undef GDN_RECUR_RG
#undef GDN_RECUR_C
}

// Decode (one token): v-head j's state columns split over a cluster of
// GDN_SPLIT blocks (block rank r: columns [r*cw, (r+1)*cw), cw = dv/GDN_SPLIT),
// so the 2 x 64 KB of state a head reads and writes spread over 4 SMs instead
// of one. Each block: the causal conv of the q/k head and of its v channels
// (from the raw projections and the double-buffered conv state, see k_conv;
// the q/k state is written by rank 0 of the even v-head of each pair only),
// q/k L2 normalisation, the gates, one recurrence step for its columns; the
// gated RMSNorm's sum of squares over the head is gathered through
// distributed shared memory. Block = cw x G threads: thread (m, g) keeps keys
// [g*KPT, (g+1)*KPT) of state column m in registers, so the state slice is
// loaded in one round trip.
#define GDN_G 8 // key groups a state column: 8 (93 registers; 4 need 128 and spill)
#define GDN_SPLIT 4
// The one-token kernel's shape for dv: threads per block, 0 when it has none
// (the layer then runs the prefill chain for its token).
__host__ __device__ inline int gdn_step_threads(int dv) {
    const int t = dv / GDN_SPLIT * GDN_G;
    return dv % GDN_SPLIT == 0 && t % 32 == 0 && t <= 512 ? t : 0;
}
__host__ __device__ inline size_t gdn_step_smem(int dv) { return sizeof(float) * (GDN_G + 1) * (size_t)(dv / GDN_SPLIT); }
template <int KPT, int K>
__global__ void __cluster_dims__(GDN_SPLIT, 1, 1) __launch_bounds__(512)
    k_gdn_step(const float *qkv, float *conv2, const float *convw, int64_t CD, int64_t KD, int Hk, int Hv, int dv,
               const float *bb, const float *ba, const float *A_log, const float *dt_bias, float *ssm, const float *z,
               const float *nw, float eps, float *o, const int *d_pos) {
    constexpr int dk = KPT * GDN_G;
    __shared__ float qs[dk], ks[dk], red[32], ss_blk;
    extern __shared__ float part[]; // [GDN_G][cw], then v[cw]
    pdl_trigger_early();
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    const int rank = (int)cl.block_rank(), cw = dv / GDN_SPLIT, c0 = rank * cw;
    float *vsm = part + GDN_G * cw;
    const int j = blockIdx.x / GDN_SPLIT, rep = Hv / Hk, hk = j / rep, tid = threadIdx.x, mm = tid % cw, g = tid / cw;
    const int m = c0 + mm;
    float *S = ssm + ((int64_t)j * dk + g * KPT) * dv + m;
    float sv[KPT];
    // weights first (they don't depend on the previous kernel), then everything
    // this thread will read, so that one round trip serves them all: the gates'
    // and the gated norm's inputs would be two more after the conv's
    const float a_log = A_log[j], dtb = dt_bias[j], nwm = nw[m];
    // The state too: only this layer's step of the previous token writes it, and every
    // step starts with k_embed, which never lets its successor launch before it ends
    // (so nothing of this step runs before the previous step has ended).
#pragma unroll
    for (int i = 0; i < KPT; i++) sv[i] = S[(int64_t)i * dv];
    pdl_wait(); // every read below may depend on earlier kernels
    const float bj = bb[j], aj = ba[j], zz = z[(int64_t)j * dv + m];
    const int p = *d_pos;
    const float *rd = conv2 + (int64_t)(p & 1) * (K - 1) * CD;
    float *wr = conv2 + (int64_t)((p + 1) & 1) * (K - 1) * CD;
    // conv channels of this block: q head (dk), k head (dk), its v columns (cw)
    float sq = 0.0f, sk = 0.0f;
    for (int i = tid; i < 2 * dk + cw; i += blockDim.x) {
        const int64_t ch = i < dk ? (int64_t)hk * dk + i : i < 2 * dk ? KD + (int64_t)hk * dk + (i - dk) : 2 * KD + (int64_t)j * dv + c0 + (i - 2 * dk);
        float win[K], w[K];
#pragma unroll
        for (int k = 0; k < K - 1; k++) win[k] = rd[k * CD + ch];
        win[K - 1] = qkv[ch];
#pragma unroll
        for (int k = 0; k < K; k++) w[k] = convw[ch * K + k];
        gdn_conv_out<K>(i, dk, win, w, i >= 2 * dk || (j % rep == 0 && rank == 0), wr, CD, ch, qs, ks, vsm, sq, sk);
    }
    sq = block_sum(sq, red);
    sk = block_sum(sk, red);
    const float qn = rsqrtf((float)dk) / sqrtf(sq + 1e-6f), kn = 1.0f / sqrtf(sk + 1e-6f);
    float beta, a;
    gdn_gates(bj, aj, dtb, a_log, beta, a);
    const float ot = gdn_column_step<KPT, GDN_G>(sv, S, dv, qs, ks, qn, kn, a, beta, vsm[mm], part, cw, mm, g);
    const float ss = block_sum(g == 0 ? ot * ot : 0.0f, red);
    if (tid == 0) ss_blk = ss;
    cl.sync(); // every block's sum is in its shared memory
    float tot = 0.0f;
#pragma unroll
    for (int r = 0; r < GDN_SPLIT; r++) tot += *cl.map_shared_rank(&ss_blk, r);
    if (g == 0) {
        const float inv = rsqrtf(tot / (float)dv + eps);
        o[(int64_t)j * dv + m] = ot * inv * nwm * (zz / (1.0f + expf(-zz)));
    }
    cl.sync(); // no block leaves while another may still read its ss_blk
}

// Gated RMSNorm per (token, v-head): o = w * rmsnorm(o) * silu(z). One warp each,
// eight to a block (grid: rows * Hv / 8), four values a load where dv allows (run
// 110: one warp a block, one float a load, 96 us a 4k layer, ~2 TB/s). sp.xh (dv = 128 only:
// a warp's lanes then hold two whole groups): o also split, row t of width Hv * dv (the out_proj input), and
// with split_only the split alone (o keeps its input).
__global__ void __launch_bounds__(256) k_gated_norm(float *o, const float *z, const float *w, int64_t rows, int Hv, int dv,
                                                    float eps, g4_split sp, bool split_only) {
    pdl_wait();
    const int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5); // (token, head) = (r / Hv, r % Hv)
    const int lane = threadIdx.x & 31;
    if (r >= rows * Hv) return;
    const int64_t off = r * dv;
    float ss = 0.0f;
    if ((dv & 3) == 0) {
        float4 *o4 = (float4 *)(o + off);
        const float4 *z4 = (const float4 *)(z + off), *w4 = (const float4 *)w;
        for (int m = lane; m < dv / 4; m += 32) {
            const float4 v = o4[m];
            ss += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
        }
        ss = warp_sum(ss);
        const float inv = rsqrtf(ss / (float)dv + eps);
        for (int m = lane; m < dv / 4; m += 32) {
            const float4 v = o4[m], zz = z4[m], g = w4[m];
            const float e[4] = {v.x * inv * g.x * (zz.x / (1.0f + expf(-zz.x))), v.y * inv * g.y * (zz.y / (1.0f + expf(-zz.y))),
                                v.z * inv * g.z * (zz.z / (1.0f + expf(-zz.z))), v.w * inv * g.w * (zz.w / (1.0f + expf(-zz.w)))};
            const bool split = dv == 128 && sp.xh;
            if (!(split && split_only)) o4[m] = make_float4(e[0], e[1], e[2], e[3]);
            if (split) g4_split4(sp, e, true, r / Hv, (r % Hv) * 128 + 4 * m, (int64_t)Hv * 128);
        }
        return;
    }
    for (int m = lane; m < dv; m += 32) ss += o[off + m] * o[off + m];
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss / (float)dv + eps);
    for (int m = lane; m < dv; m += 32) {
        const float zz = z[off + m];
        o[off + m] = o[off + m] * inv * w[m] * (zz / (1.0f + expf(-zz)));
    }
}

// ---------------------------------------------------------------- gated attention

// A value into f32, or into the bf16 of the KV cache (round to nearest even).
__device__ __forceinline__ void put_val(float *d, float v) { *d = v; }
__device__ __forceinline__ void put_val(__nv_bfloat16 *d, float v) { *d = __float2bfloat16_rn(v); }

// One head row through RMSNorm (gain g) and NeoX RoPE on its first rd dims at
// position pos, times mul, by one warp, into dst (f32, or a bf16 cache row):
// an f32 dst may be src (each lane writes only the pair (i, i + rd/2) or the
// element it read). inv_freq[i] = theta^(-2i/rd) in f32, as the CPU reference
// computes it once per session.
template <typename T>
__device__ __forceinline__ void warp_norm_rope(const float *src, const float *g, int hd, int rd, int64_t pos,
                                               const float *inv_freq, float eps, float mul, T *dst) {
    const int lane = threadIdx.x & 31, half = rd / 2;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) ss += src[i] * src[i];
    const float inv = rsqrtf(warp_sum(ss) / (float)hd + eps);
    for (int i = lane; i < hd; i += 32) {
        if (i < half) {
            const float a = src[i] * inv * g[i], b = src[i + half] * inv * g[i + half];
            float sn, cs;
            sincosf((float)pos * inv_freq[i], &sn, &cs);
            put_val(dst + i, (a * cs - b * sn) * mul);
            put_val(dst + i + half, (b * cs + a * sn) * mul);
        } else if (i >= rd) {
            put_val(dst + i, src[i] * inv * g[i] * mul);
        }
    }
}

// q_norm + RoPE on query head h of token t (in place), or k_norm + RoPE on key
// head h - nh and both k and v into the bf16 cache (rounded to nearest even) at
// position pos + t. Grid (T, nh + nkv), one warp each. (One decode token:
// k_attn_dec_mma does this itself.)
__global__ void k_attn_prep(float *qg, const float *kx, const float *vx, const float *qn, const float *kn,
                            __nv_bfloat16 *kc, __nv_bfloat16 *vc, const int *d_pos, int nh, int nkv, int hd, int rd,
                            const float *inv_freq, float eps) {
    pdl_wait();
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int64_t p = (int64_t)*d_pos + t, kvw = (int64_t)nkv * hd;
    if (h < nh) {
        float *q = qg + (int64_t)t * 2 * nh * hd + (int64_t)h * 2 * hd;
        warp_norm_rope(q, qn, hd, rd, p, inv_freq, eps, 1.0f, q);
        return;
    }
    const int64_t o = (int64_t)(h - nh) * hd;
    warp_norm_rope(kx + t * kvw + o, kn, hd, rd, p, inv_freq, eps, 1.0f, kc + p * kvw + o);
    for (int i = lane; i < hd; i += 32) vc[p * kvw + o + i] = __float2bfloat16_rn(vx[t * kvw + o + i]);
}

// Causal attention of token t, head h over keys [0, pos + t] of the bf16 cache,
// split over gridDim.z key ranges. 4 warps, each an online softmax over its
// keys; lane holds DPL = hd/32 dims. One split: writes o * sigmoid(gate);
// several: partials.
template <int DPL>
__global__ void __launch_bounds__(128) k_attn(const float *qg, const __nv_bfloat16 *kc, const __nv_bfloat16 *vc,
                                              const int *d_pos, int nh, int nkv, float *out, float *part) {
    pdl_wait();
    const int h = blockIdx.x, t = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    const int hd = DPL * 32, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kh = h / (nh / nkv);
    const int64_t n = (int64_t)*d_pos + t + 1, kvw = (int64_t)nkv * hd;
    const int64_t j0 = n * s / S, j1 = n * (s + 1) / S;
    const float *q = qg + (int64_t)t * 2 * nh * hd + (int64_t)h * 2 * hd;
    const float scale = rsqrtf((float)hd);
    float qr[DPL], acc[DPL];
#pragma unroll
    for (int d = 0; d < DPL; d++) {
        qr[d] = q[lane * DPL + d] * scale;
        acc[d] = 0.0f;
    }
    float mx = -INFINITY, l = 0.0f;
#pragma unroll 4
    for (int64_t j = j0 + warp; j < j1; j += 4) {
        const __nv_bfloat16 *kr = kc + j * kvw + (int64_t)kh * hd + lane * DPL;
        float dot = 0.0f;
#pragma unroll
        for (int d = 0; d < DPL; d++) dot += qr[d] * __bfloat162float(kr[d]);
        dot = warp_sum(dot);
        const float mn = fmaxf(mx, dot), corr = expf(mx - mn), pj = expf(dot - mn);
        l = l * corr + pj;
        const __nv_bfloat16 *vr = vc + j * kvw + (int64_t)kh * hd + lane * DPL;
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[d] = acc[d] * corr + pj * __bfloat162float(vr[d]);
        mx = mn;
    }
    __shared__ float sm[4], sl[4];
    __shared__ float sacc[4][DPL * 32];
    if (lane == 0) { sm[warp] = mx; sl[warp] = l; }
#pragma unroll
    for (int d = 0; d < DPL; d++) sacc[warp][lane * DPL + d] = acc[d];
    __syncthreads();
    float M = fmaxf(fmaxf(sm[0], sm[1]), fmaxf(sm[2], sm[3]));
    float w[4], L = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        w[i] = sm[i] == -INFINITY ? 0.0f : expf(sm[i] - M);
        L += sl[i] * w[i];
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) a += sacc[i][d] * w[i];
        if (S == 1) {
            const float g = q[hd + d];
            out[(int64_t)t * nh * hd + (int64_t)h * hd + d] = a / L / (1.0f + expf(-g));
        } else {
            float *pp = part + (((int64_t)t * nh + h) * S + s) * (hd + 2);
            pp[d] = a;
            if (d == 0) { pp[hd] = M; pp[hd + 1] = L; }
        }
    }
}

#include "cuda_attn_dec.cuh" // k_attn_dec_mma: the decode attention

// Merge the split partials of k_attn / k_attn_dec_mma and apply the output gate
// (hd a multiple of 32; S <= 128). Grid (nh, T, hd/32): block z takes dims
// [32z, 32z + 32), lane = dim; warp w sums the splits w, w + 8, ... (at most
// 16, their partials all loaded at once, before the global max M is known);
// every warp finds M and the normaliser itself; the 8 warps' sums meet in
// shared memory. Every load is issued at once (one L2 round trip): the splits'
// maxima and sums sit four per lane, and a warp's split weights come by shuffle.
// (One block per head looping over its splits, 16 blocks, takes 9-17 us at 64
// splits; this grid 9.0 us alone in test_attn with three dependent rounds of
// loads: docs/perf.md.)
__host__ __device__ inline dim3 attn_combine_grid(int nh, int T, int hd) {
    return dim3((unsigned)nh, (unsigned)T, (unsigned)(hd / 32));
}
__global__ void __launch_bounds__(256) k_attn_combine(const float *qg, const float *part, int S, int nh, int hd, float *out) {
    pdl_trigger_early();
    pdl_wait();
    __shared__ float red[8][32];
    const int h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int d = 32 * blockIdx.z + lane, nj = (S - warp + 7) / 8; // this warp's splits: warp + 8j, j < nj (<= 16)
    const float *pp = part + ((int64_t)t * nh + h) * S * (hd + 2);
    // every load in one round trip: the gate, this warp's partials, and each split's max and sum
    // (split lane in m0/l0, split lane + 32 in m1/l1, lane + 64 in m2/l2, lane + 96 in m3/l3)
    const float g = qg[(int64_t)t * 2 * nh * hd + (int64_t)h * 2 * hd + hd + d];
    float v[16];
#pragma unroll
    for (int j = 0; j < 16; j++)
        if (j < nj) v[j] = pp[(warp + 8 * j) * (hd + 2) + d];
    float m[4], l[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int sp = lane + 32 * i;
        m[i] = sp < S ? pp[sp * (hd + 2) + hd] : -INFINITY;
        l[i] = sp < S ? pp[sp * (hd + 2) + hd + 1] : 0.0f;
    }
    const float M = warp_max(fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3])));
    float e[4], L = 0.0f; // e[i]: split lane + 32 i's weight exp(m - M) (0 for an empty split)
#pragma unroll
    for (int i = 0; i < 4; i++) {
        e[i] = m[i] == -INFINITY ? 0.0f : expf(m[i] - M);
        L += l[i] * e[i];
    }
    L = warp_sum(L);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; j++) { // split warp + 8j is held by lane (warp + 8j) % 32, in e[(warp + 8j) / 32]
        const int sp = warp + 8 * j, q = sp >> 5; // warp-uniform
        const float w = __shfl_sync(0xffffffffu, q == 0 ? e[0] : q == 1 ? e[1] : q == 2 ? e[2] : e[3], sp & 31);
        if (j < nj) acc += w * v[j];
    }
    red[warp][lane] = acc;
    __syncthreads();
    if (warp == 0) {
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < 8; w++) a += red[w][lane];
        out[(int64_t)t * nh * hd + (int64_t)h * hd + d] = a / L / (1.0f + expf(-g));
    }
}

// ---------------------------------------------------------------- mixture of experts

// Router, one warp per token: softmax over all E logits (f32), top-K by
// repeated warp argmax (ties: lowest index, as the CPU reference), renormalise.
// counts[e] += 1 per pick when counts is given.
__global__ void k_topk(const float *logits, int E, int K, int norm, int *topi, float *topw, int *counts) {
    pdl_wait();
    extern __shared__ float p[]; // [E]
    const int t = blockIdx.x, lane = threadIdx.x;
    const float *lg = logits + (int64_t)t * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, lg[e]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) sum += (p[e] = expf(lg[e] - mx));
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    __syncwarp();
    float tot = 0.0f;
    for (int k = 0; k < K; k++) {
        float v = -1.0f;
        int idx = 0x7fffffff;
        for (int e = lane; e < E; e += 32)
            if (p[e] > v) { v = p[e]; idx = e; }
        warp_argmax(v, idx);
        const float w = v * inv;
        tot += w;
        if (lane == 0) {
            topi[t * K + k] = idx;
            topw[t * K + k] = w;
            p[idx] = -1.0f;
            if (counts) atomicAdd(&counts[idx], 1);
        }
        __syncwarp();
    }
    if (norm && lane < K) topw[t * K + lane] /= tot;
}

template <int PL>
__global__ void k_topk_reg(const float *logits, int E, int K, int norm, int *topi, float *topw, int *counts) {
    pdl_wait();
    topk_warp<PL>(logits + (int64_t)blockIdx.x * E, E, K, norm, topi, topw, counts, blockIdx.x);
}

// Exclusive scan of the per-expert counts into offs[0..E]; resets counts and
// cursor. With `tiles`: the GEMM tile map, one entry (expert, first token) per
// 64 tokens of each expert (empty experts get none), count in *n_tiles.
// One block of MOE_SCAN_THREADS, a thread per expert (the experts in chunks of
// that many): one thread walking 256 experts takes 65 us of a 4k prefill layer,
// a block-wide scan a few.
#define MOE_SCAN_THREADS 256
__global__ void __launch_bounds__(MOE_SCAN_THREADS) k_moe_scan(int *counts, int E, int *offs, int *cursor, int2 *tiles, int *n_tiles) {
    pdl_wait();
    __shared__ int wc[MOE_SCAN_THREADS / 32], wt[MOE_SCAN_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int acc = 0, nt = 0; // the slots and tiles of the chunks before this one (every thread the same)
    for (int e0 = 0; e0 < E; e0 += MOE_SCAN_THREADS) {
        const int e = e0 + (int)threadIdx.x;
        const int c = e < E ? counts[e] : 0, ct = (c + 63) / 64;
        int ic = c, it = ct; // inclusive scans: within the warp, then the warps' totals
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
            const int a = __shfl_up_sync(0xffffffffu, ic, d), b = __shfl_up_sync(0xffffffffu, it, d);
            if (lane >= d) ic += a, it += b;
        }
        if (lane == 31) wc[warp] = ic, wt[warp] = it;
        __syncthreads();
        int bc = 0, bt = 0, sc = 0, st = 0; // the warps before this one; the whole chunk
        for (int w = 0; w < MOE_SCAN_THREADS / 32; w++) {
            if (w < warp) bc += wc[w], bt += wt[w];
            sc += wc[w], st += wt[w];
        }
        if (e < E) {
            const int o = acc + bc + ic - c, t0 = nt + bt + it - ct;
            offs[e] = o;
            counts[e] = 0;
            cursor[e] = 0;
            if (tiles)
                for (int i = 0; i < ct; i++) tiles[t0 + i] = make_int2(e, 64 * i);
        }
        acc += sc, nt += st;
        __syncthreads(); // wc/wt are read before the next chunk writes them
    }
    if (threadIdx.x == 0) {
        offs[E] = acc;
        if (n_tiles) *n_tiles = nt;
    }
}

// Each routing slot (t*K + k) takes its place in its expert's run.
__global__ void k_moe_scatter(const int *topi, int n_slots, const int *offs, int *cursor, int *sorted) {
    pdl_wait();
    const int slot = blockIdx.x * blockDim.x + threadIdx.x;
    if (slot >= n_slots) return;
    const int e = topi[slot];
    sorted[offs[e] + atomicAdd(&cursor[e], 1)] = slot;
}

// x[t] += sum_k w[t][k] * ye[t*K + k] + sigmoid(sg[t]) * shy[t]   (the MoE output and the residual).
// With `gain` (one block per row): then the next layer's input RMSNorm into
// xn[t]. Without: grid (T, blocks of 1024 columns), elementwise. Four columns
// a thread (H is a multiple of 64: up_mat's rule for every matrix, the router's
// columns among them): the K rows of ye are ~2/3 of a 4k prefill's bytes here,
// and four-wide loads keep 4x the bytes in flight (108 us a layer, against 146 us,
// ~2.7 TB/s, with one float a load).
__global__ void k_moe_combine(float *x, const float *ye, const float *topw, int K, const float *shy, const float *sg,
                              int64_t H, const float *gain, float *xn, float eps, g4_split sp) {
    pdl_wait();
    __shared__ float red[32];
    const int t = blockIdx.x;
    const float gs = 1.0f / (1.0f + expf(-sg[t]));
    float ss = 0.0f;
    const int64_t h_first = (int64_t)blockIdx.y * blockDim.x + threadIdx.x, h_step = (int64_t)gridDim.y * blockDim.x;
    const float4 *ye4 = (const float4 *)ye, *shy4 = (const float4 *)shy;
    float4 *x4 = (float4 *)x;
    const int64_t H4 = H / 4;
    for (int64_t h = h_first; h < H4; h += h_step) {
        const float4 sh = shy4[(int64_t)t * H4 + h];
        float4 a = make_float4(gs * sh.x, gs * sh.y, gs * sh.z, gs * sh.w);
#pragma unroll 8
        for (int k = 0; k < K; k++) {
            const float w = topw[t * K + k];
            const float4 y = ye4[((int64_t)t * K + k) * H4 + h];
            a.x += w * y.x, a.y += w * y.y, a.z += w * y.z, a.w += w * y.w;
        }
        float4 v = x4[(int64_t)t * H4 + h];
        v.x += a.x, v.y += a.y, v.z += a.z, v.w += a.w;
        x4[(int64_t)t * H4 + h] = v;
        ss += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
    }
    if (!gain) return;
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)H + eps);
    norm_row_out(x + (int64_t)t * H, inv, gain, xn ? xn + (int64_t)t * H : nullptr, H, sp, t);
}

// ---------------------------------------------------------------- head

// Greedy pick over the vocabulary (ties: lowest id). Writes the token as the
// next step's input, into the host-visible ring, and advances the position.
// Many blocks (one block took 22 us for 248k logits): each folds its best
// (value, id) into *best as one 64-bit key, order-preserving float bits over
// the complement of the id, so atomicMax keeps the largest value and, among
// equals, the lowest id; the last block to arrive (*arrived) writes the token
// and resets both words for the next launch. NaN and -inf are never picked;
// with nothing else the pick is token 0, as the CPU reference.
#define ARGMAX_THREADS 256
__global__ void __launch_bounds__(ARGMAX_THREADS) k_argmax(const float *logits, int64_t V, int *next_id, int *ring,
                                                          int ring_size, int *d_step, int *d_pos,
                                                          unsigned long long *best, unsigned *arrived) {
    pdl_wait();
    __shared__ float bv[ARGMAX_THREADS / 32];
    __shared__ int64_t bi[ARGMAX_THREADS / 32];
    __shared__ bool last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float v = -INFINITY;
    int64_t idx = 0x7fffffffffffll;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + tid; i < V; i += (int64_t)gridDim.x * blockDim.x)
        if (logits[i] > v) { v = logits[i]; idx = i; }
    warp_argmax(v, idx);
    if (lane == 0) { bv[warp] = v; bi[warp] = idx; }
    __syncthreads();
    if (tid == 0) {
        for (int i = 1; i < ARGMAX_THREADS / 32; i++)
            if (bv[i] > bv[0] || (bv[i] == bv[0] && bi[i] < bi[0])) { bv[0] = bv[i]; bi[0] = bi[i]; }
        if (bi[0] < V) {
            const unsigned u = __float_as_uint(bv[0]), o = (u & 0x80000000u) ? ~u : u | 0x80000000u;
            atomicMax(best, (unsigned long long)o << 32 | (0xffffffffu - (unsigned)bi[0]));
        }
        __threadfence();
        last = atomicAdd(arrived, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last || tid) return;
    __threadfence();
    const unsigned long long k = atomicExch(best, 0ull);
    *arrived = 0;
    const int tok = k ? (int)(0xffffffffu - (unsigned)(k & 0xffffffffu)) : 0;
    *next_id = tok;
    if (ring) {
        const int s = *d_step;
        ((volatile int *)ring)[s % ring_size] = tok;
        *d_step = s + 1;
    }
    if (d_pos) *d_pos += 1;
}
// The grid for V logits: about 8 per thread, at most 512 blocks.
static inline unsigned argmax_blocks(int64_t V) {
    const int64_t b = (V + 8 * ARGMAX_THREADS - 1) / (8 * ARGMAX_THREADS);
    return (unsigned)(b < 1 ? 1 : b > 512 ? 512 : b);
}

