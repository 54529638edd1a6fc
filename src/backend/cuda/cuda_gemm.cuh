// cuda_gemm.cuh — prefill matrix products on the tensor cores for 4-bit MLX
// weights (affine, group 64), dequantised inside the GEMM, never to memory.
//
// Why "q-space": an affine group is w = s*q + b with q an integer, so
//   sum_k w[m][k] x[n][k] = s[m] * sum_k q[m][k] x[n][k] + b[m] * sum_k x[n][k]
// within a group of 64 columns: the tensor cores multiply the codes themselves,
// and per group the partial is scaled by s in f32 and the bias term b * xs (xs =
// f32 group sum of x) is added.
//
// 4-bit matrices (every matrix but the router gates), k_gemm_q<4>: the integer tensor
// cores (mma m16n8k32 s8), as the decode GEMV computes them: the portable path (on
// sm_90 the backend takes k_gemm_wg, cuda_gemm_wg.cuh: wgmma on the bf16 split below).
// The input comes as three
// int8 pieces per 64-column group,
//   x ~ sigma_G (a + b/128 + c/16384),  sigma_G = max|x| / 127  (i8_pieces),
// the codes (0..15) as they are, and per group one exact s32 sum D = (Sqa*128 +
// Sqb)*128 + Sqc (at most 2.01e9), so Sqx = sigma D / 16384: 48 MMAs per group and
// warp, one mask per four codes. Each value within 2^-21 of its group's largest:
// the full-size synth stays ~1e-3 off the f32 reference, as the bf16 split below
// did (+6.5% prefill). Two pieces (2^-14) measured +21% but failed the tiny oracle
// model (2-6e-2) and flipped near-tied logits of the full-size synth (docs/perf.md).
//
// 8-bit matrices (codes to 255 would overflow the s32 sum): the codes are exact in
// bf16; the activations are split x = xh + xl (two bf16 parts, ~16 significant
// bits) and multiplied in two MMAs (mma.sync m16n8k16), within ~1e-5 of f32 math.
//
// Tiles: 128 weight rows x 64 tokens x 64 columns (one group), 8 warps (4 x 2,
// each 32 x 32); codes, the input tiles and group sums flow through a 3-stage
// cp.async pipeline. 4-bit codes come in the fragment order of cuda_packed.cuh
// (one conflict-free 16-byte read per lane and row block; masked, a word is an s8
// A fragment); 8-bit codes in the MLX layout. B fragments come from ldmatrix.
#pragma once
#include "cuda_common.cuh"
#include "cuda_gemm4_tile.cuh"
#include "cuda_packed_dot.cuh" // i8_pieces, imma_s8

#define G4_STAGES 3
#define G4_XLD 72     // bf16 per activation row in shared memory (64 used; 72 keeps ldmatrix conflict-free)
#define G4_NP 3     // int8 pieces of a 4-bit GEMM's input
#define G4_QLDW 20 // 4-byte words per token row of one piece in shared memory (16 used; 20: conflict-free)
// Where column c (0..63) of a group goes in the piece layout: within each block of
// 16 columns, thread t's fragment word holds columns 2t, 2t+8, 2t+1, 2t+9 (see
// cuda_packed.cuh: the order of the codes in a packed word).
__host__ __device__ inline int g4_qpos(int c) {
    const int b = c & 15;
    return (c & ~15) + 4 * ((b & 7) >> 1) + 2 * (b & 1) + (b >> 3);
}

// u32 words per code row in shared memory: 8 (4-bit) or 16 (8-bit) used, padded
// so that the 8 rows a fragment load touches fall in distinct banks.
template <int BITS> struct g4_geom { static const int QW = 2 * BITS, QLD = BITS == 4 ? 12 : 20; };
template <int BITS> struct g4_i8 { static const bool on = BITS == 4; }; // the int8 path
template <int BITS>
struct g4_stage {
    uint32_t q[G4_BM * g4_geom<BITS>::QLD];
    __nv_bfloat16 xh[g4_i8<BITS>::on ? 8 : G4_BN * G4_XLD], xl[g4_i8<BITS>::on ? 8 : G4_BN * G4_XLD];
    uint32_t xq[g4_i8<BITS>::on ? G4_NP : 1][g4_i8<BITS>::on ? G4_BN * G4_QLDW : 4]; // 4-bit: the pieces
    float xs[G4_BN];
    float sg[G4_BN]; // 4-bit: sigma of each token's group
};
template <int BITS> constexpr size_t g4_smem() { return sizeof(g4_stage<BITS>) * G4_STAGES; }

// Fragment register a_j (two codes) of a packed word as an exact bf16x2.
__device__ __forceinline__ uint32_t pk_frag(uint32_t w, int j) { return pk_frag2(w >> (4 * j)); }

// Codes 2h and 2h+1 (bytes) of a word of 8-bit codes as an exact bf16x2 pair
// (integers up to 255 have 8 significant bits, as bf16).
__device__ __forceinline__ uint32_t byte2_bf16(uint32_t w, int h) {
    const uint32_t u = w >> (16 * h);
    const float lo = __uint_as_float(0x4B000000u | (u & 0xFFu)) - 8388608.0f,
                hi = __uint_as_float(0x4B000000u | ((u >> 8) & 0xFFu)) - 8388608.0f;
    __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *)&r;
}

// Split the GEMM input rows into bf16 hi/lo parts and f32 sums per group of 64.
// Row r of the input is x + r*ldx (XM_SWIGLU: silu(x[c]) * x[xoff + c]); output
// row r of xh/xl has `cols` entries, xs has cols/64. Grid: rows; block 256.
// xq non-null: also the int8 pieces of each group (the 4-bit GEMM's input), at g4_qpos, and sigma.
// xsw non-null: also the group sums as k_gemm_wg's bias product reads them (wg_xsw_pos: windows of
// 16 groups, three bf16 pieces each, the empty slots of a partial last window zero).
template <int XM>
__global__ void __launch_bounds__(256) k_split_x(const float *x, int64_t ldx, int64_t xoff, int64_t cols,
                                                 __nv_bfloat16 *xh, __nv_bfloat16 *xl, float *xs, int8_t *xq = nullptr,
                                                 float *xsig = nullptr, int64_t xq_plane = 0, __nv_bfloat16 *xsw = nullptr) {
    pdl_wait();
    const int64_t r = blockIdx.x;
    const float *xr = x + r * ldx;
    const g4_split sp = {xh, xl, xsw, xs};
    g4_split_pad(sp, r, (int)(cols / 64));
    // every thread runs every round (the group sum is a 16-lane shuffle); cols % 64 == 0
    for (int64_t c0 = 0; c0 < cols; c0 += (int64_t)blockDim.x * 4) {
        const int64_t c = c0 + (int64_t)threadIdx.x * 4;
        const bool in = c < cols;
        float4 v = in ? *(const float4 *)(xr + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        if (XM == 1) {
            const float4 u = in ? *(const float4 *)(xr + xoff + c) : make_float4(0.f, 0.f, 0.f, 0.f);
            v.x = g4_swiglu(v.x, u.x);
            v.y = g4_swiglu(v.y, u.y);
            v.z = g4_swiglu(v.z, u.z);
            v.w = g4_swiglu(v.w, u.w);
        }
        if (!in) v = make_float4(0.f, 0.f, 0.f, 0.f);
        const float e[4] = {v.x, v.y, v.z, v.w};
        g4_split4(sp, e, in, r, c, cols); // 16 consecutive threads cover one group of 64 columns
        if (xq) { // the pieces: x = sigma (a + b/128 + c/16384), sigma = max|x| / 127 over the group
            float m = fmaxf(fmaxf(fabsf(e[0]), fabsf(e[1])), fmaxf(fabsf(e[2]), fabsf(e[3])));
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            const float inv = m > 0.0f ? 127.0f / m : 0.0f;
            if (in) {
                if ((threadIdx.x & 15) == 0) xsig[r * (cols / 64) + c / 64] = m * (1.0f / 127.0f);
                const int64_t g0 = c & ~(int64_t)63, pl = xq_plane;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float a, b, cc;
                    i8_pieces(e[i] * inv, a, b, cc);
                    const int64_t at = r * cols + g0 + g4_qpos((int)(c - g0) + i);
                    xq[at] = (int8_t)a;
                    xq[pl + at] = (int8_t)b;
                    xq[2 * pl + at] = (int8_t)cc;
                }
            }
        }
    }
}

// y[yrow(n)][m] = sum_k W[m][k] x(n, k) for affine W (4 or 8 bits, group 64),
// for the matrices of a job, plain or grouped over the expert tile map (g4_tile).
template <int BITS>
__global__ void __launch_bounds__(256, 2) k_gemm_q(g4_job job, const __nv_bfloat16 *xh, const __nv_bfloat16 *xl,
                                                const float *xs, int T, const int *offs, const int *sorted,
                                                const int2 *tiles, const int *n_tiles, int x_div) {
    constexpr int QW = g4_geom<BITS>::QW, QLD = g4_geom<BITS>::QLD;
    constexpr bool I8 = g4_i8<BITS>::on;
    extern __shared__ __align__(16) unsigned char g4_smem_raw[];
    g4_stage<BITS> *st = (g4_stage<BITS> *)g4_smem_raw;
    __shared__ int xrow[G4_BN], yrow[G4_BN];
    pdl_wait();
    dmat W;
    float *y;
    int64_t ldy, m0;
    if (!g4_tile(job, T, offs, sorted, tiles, n_tiles, x_div, W, y, ldy, m0, xrow, yrow)) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int64_t K = W.cols, wpr = K * BITS / 32, ng = K / 64;
    const int nk = (int)(K / G4_BK);

    // One stage: 128 rows x 32 B of codes (a 16-byte chunk per thread); the input's
    // 64 rows as G4_NP int8 pieces of 64 B (one chunk per thread each) and 64 sigmas
    // (4-bit), or as xh and xl of 128 B each (4 chunks per thread; 8-bit);
    // 64 group sums.
    auto load_stage = [&](int kt, int sidx) {
        g4_stage<BITS> &S = st[sidx];
        if (BITS == 4) { // packed (cuda_packed.cuh): 8 row blocks x 512 B, one 16-byte chunk per thread
            const int64_t rb = m0 / 16 + (tid >> 5);
            const bool ok = rb < W.pk_rb;
            cp_async16(&S.q[tid * 4], W.pk + (ok ? (rb * ng + kt) * 32 + (tid & 31) : 0), ok);
        } else {
#pragma unroll
            for (int c = tid; c < G4_BM * QW / 4; c += 256) {
                const int r = c / (QW / 4), h = c % (QW / 4);
                const bool ok = m0 + r < W.rows;
                const uint32_t *src = W.q + (ok ? (m0 + r) * wpr + (int64_t)kt * QW + h * 4 : 0);
                cp_async16(&S.q[r * QLD + h * 4], src, ok);
            }
        }
        if constexpr (I8) { // each piece: 64 tokens x 64 bytes, one 16-byte chunk per thread
            const int n = tid >> 2, ch = tid & 3, xr = xrow[n];
#pragma unroll
            for (int pc = 0; pc < G4_NP; pc++) {
                const int8_t *src = job.xq + (xr >= 0 ? (int64_t)pc * job.xq_plane + (int64_t)xr * K + (int64_t)kt * 64 + ch * 16 : 0);
                cp_async16(&S.xq[pc][n * G4_QLDW + ch * 4], src, xr >= 0);
            }
            if (tid < G4_BN) {
                const int xr2 = xrow[tid];
                cp_async4(&S.sg[tid], job.xsig + (xr2 >= 0 ? (int64_t)xr2 * ng + kt : 0), xr2 >= 0);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int c = tid + i * 256, part = c >> 9, cc = c & 511, n = cc >> 3, ch = cc & 7;
                const int xr = xrow[n];
                const __nv_bfloat16 *base_p = part ? xl : xh;
                const __nv_bfloat16 *src = base_p + (xr >= 0 ? (int64_t)xr * K + (int64_t)kt * 64 + ch * 8 : 0);
                cp_async16((part ? S.xl : S.xh) + n * G4_XLD + ch * 8, src, xr >= 0);
            }
        }
        if (tid < G4_BN) {
            const int xr = xrow[tid];
            cp_async4(&S.xs[tid], xs + (xr >= 0 ? (int64_t)xr * ng + kt : 0), xr >= 0);
        }
    };

    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    // I8: this lane's ldmatrix row (token wn + 8 (lane/16) + lane%8, half (lane/8)%2 of 8 words) in stage 0's pieces
    const uint32_t xq_lane = smem_u32(&st[0].xq[0][0]) + 4u * (uint32_t)((wn + (lane >> 4) * 8 + (lane & 7)) * G4_QLDW + ((lane >> 3) & 1) * 4);
    float acc[2][4][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[a][b][c] = 0.0f;

    // scales and biases of this thread's 4 rows, one group ahead
    int64_t rows_g[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t r = m0 + wm + (i >> 1) * 16 + (i & 1) * 8 + g;
        rows_g[i] = r < W.rows ? r : W.rows - 1;
    }
    // scale and bias of row r, group G: packed pairs (4-bit) or the MLX arrays (8-bit)
    auto scale_bias = [&](int64_t r, int64_t G, float &sv, float &bv) {
        if (BITS == 4) {
            const uint32_t u = __ldg(W.psb + ((r >> 4) * ng + G) * 16 + (r & 15));
            sv = __uint_as_float(u << 16);
            bv = __uint_as_float(u & 0xFFFF0000u);
        } else {
            sv = __bfloat162float(W.s[r * ng + G]);
            bv = __bfloat162float(W.b[r * ng + G]);
        }
    };
    float sc[4], bi[4];
#pragma unroll
    for (int i = 0; i < 4; i++) scale_bias(rows_g[i], 0, sc[i], bi[i]);

#pragma unroll
    for (int s = 0; s < G4_STAGES - 1; s++) {
        if (s < nk) load_stage(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<G4_STAGES - 2>();
        __syncthreads();
        {
            const int kn = kt + G4_STAGES - 1;
            if (kn < nk) load_stage(kn, kn % G4_STAGES);
            cp_async_commit();
        }
        float nsc[4], nbi[4];
        if (kt + 1 < nk) {
#pragma unroll
            for (int i = 0; i < 4; i++) scale_bias(rows_g[i], kt + 1, nsc[i], nbi[i]);
        }
        const g4_stage<BITS> &S = st[kt % G4_STAGES];
        if constexpr (I8) {
            // D = ((Sqa * 128 + Sqb) * 128 + Sqc) per (row, token): exact s32 (see the header)
            int d[2][4][4]; // written by the first piece's first MMAs (C = 0)
            const uint32_t xq_st = xq_lane + (uint32_t)((kt % G4_STAGES) * sizeof(g4_stage<BITS>));
            uint4 pw[2];
            pw[0] = *(const uint4 *)&S.q[((wm / 16) * 32 + lane) * 4];
            pw[1] = *(const uint4 *)&S.q[((wm / 16 + 1) * 32 + lane) * 4];
            const uint32_t M = 0x0F0F0F0Fu;
#pragma unroll
            for (int pc = 0; pc < G4_NP; pc++) {
                if (pc > 0) {
#pragma unroll
                    for (int a = 0; a < 2; a++)
#pragma unroll
                        for (int b = 0; b < 4; b++)
#pragma unroll
                            for (int c = 0; c < 4; c++) d[a][b][c] *= 128;
                }
#pragma unroll
                for (int h = 0; h < 2; h++) { // columns 32h .. 32h + 31: packed words 2h, 2h + 1
                    // B fragments by ldmatrix: token rows are 16-byte matrix rows (words 8h + t,
                    // 8h + 4 + t of token g); one x4 serves two 8-token tiles
                    uint32_t bq[4][2];
#pragma unroll
                    for (int p = 0; p < 2; p++) {
                        uint32_t r4[4];
                        ldsm_x4(r4, xq_st + 4u * (uint32_t)(pc * G4_BN * G4_QLDW + p * 16 * G4_QLDW + 8 * h));
                        bq[2 * p][0] = r4[0];
                        bq[2 * p][1] = r4[1];
                        bq[2 * p + 1][0] = r4[2];
                        bq[2 * p + 1][1] = r4[3];
                    }
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        const uint32_t w0 = h ? pw[mt].z : pw[mt].x, w1 = h ? pw[mt].w : pw[mt].y;
#pragma unroll
                        for (int nt = 0; nt < 4; nt++)
                            if (pc == 0 && h == 0) imma_s8_z(d[mt][nt], w0 & M, (w0 >> 4) & M, w1 & M, (w1 >> 4) & M, bq[nt][0], bq[nt][1]);
                            else imma_s8(d[mt][nt], w0 & M, (w0 >> 4) & M, w1 & M, (w1 >> 4) & M, bq[nt][0], bq[nt][1]);
                    }
                }
            }
            // fold the group: acc += (s sigma / 16384) D + b xs, two FMAs per element
            constexpr float DN = 1.0f / 16384.0f;
            float sd[4];
#pragma unroll
            for (int i = 0; i < 4; i++) sd[i] = sc[i] * DN;
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int n0 = wn + nt * 8 + 2 * t;
                const float2 xx = *(const float2 *)&S.xs[n0], gg = *(const float2 *)&S.sg[n0];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const float s0 = sd[mt * 2], b0 = bi[mt * 2], s1 = sd[mt * 2 + 1], b1 = bi[mt * 2 + 1];
                    acc[mt][nt][0] = fmaf((float)d[mt][nt][0], s0 * gg.x, fmaf(b0, xx.x, acc[mt][nt][0]));
                    acc[mt][nt][1] = fmaf((float)d[mt][nt][1], s0 * gg.y, fmaf(b0, xx.y, acc[mt][nt][1]));
                    acc[mt][nt][2] = fmaf((float)d[mt][nt][2], s1 * gg.x, fmaf(b1, xx.x, acc[mt][nt][2]));
                    acc[mt][nt][3] = fmaf((float)d[mt][nt][3], s1 * gg.y, fmaf(b1, xx.y, acc[mt][nt][3]));
                }
            }
        } else {
            static_assert(BITS == 8, "the bf16 split serves the 8-bit matrices");
            float p[2][4][4];
#pragma unroll
            for (int a = 0; a < 2; a++)
#pragma unroll
                for (int b = 0; b < 4; b++)
#pragma unroll
                    for (int c = 0; c < 4; c++) p[a][b][c] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                uint32_t af[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) { // column 16ks + 2t is byte 2(t&1) of word 4ks + t/2
                    const int r0 = wm + mt * 16 + g;
                    const uint32_t *q0 = &S.q[r0 * QLD + 4 * ks + (t >> 1)], *q1 = q0 + 8 * QLD;
                    af[mt][0] = byte2_bf16(q0[0], t & 1);
                    af[mt][1] = byte2_bf16(q1[0], t & 1);
                    af[mt][2] = byte2_bf16(q0[2], t & 1);
                    af[mt][3] = byte2_bf16(q1[2], t & 1);
                }
                uint32_t bh[4][2], bl[4][2];
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    const int n = wn + np * 16 + (lane & 7) + ((lane >> 4) << 3), k = ks * 16 + (((lane >> 3) & 1) << 3);
                    uint32_t bh4[4], bl4[4];
                    ldsm_x4(bh4, smem_u32(&S.xh[n * G4_XLD + k]));
                    ldsm_x4(bl4, smem_u32(&S.xl[n * G4_XLD + k]));
                    bh[2 * np][0] = bh4[0], bh[2 * np][1] = bh4[1], bh[2 * np + 1][0] = bh4[2], bh[2 * np + 1][1] = bh4[3];
                    bl[2 * np][0] = bl4[0], bl[2 * np][1] = bl4[1], bl[2 * np + 1][0] = bl4[2], bl[2 * np + 1][1] = bl4[3];
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        mma16816(p[mt][nt], af[mt], bl[nt][0], bl[nt][1]);
                        mma16816(p[mt][nt], af[mt], bh[nt][0], bh[nt][1]);
                    }
            }
            // fold the group: acc += s * p + b * xs
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const float x0 = S.xs[wn + nt * 8 + 2 * t], x1 = S.xs[wn + nt * 8 + 2 * t + 1];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const float s0 = sc[mt * 2], b0 = bi[mt * 2], s1 = sc[mt * 2 + 1], b1 = bi[mt * 2 + 1];
                    acc[mt][nt][0] += s0 * p[mt][nt][0] + b0 * x0;
                    acc[mt][nt][1] += s0 * p[mt][nt][1] + b0 * x1;
                    acc[mt][nt][2] += s1 * p[mt][nt][2] + b1 * x0;
                    acc[mt][nt][3] += s1 * p[mt][nt][3] + b1 * x1;
                }
            }
        }
        if (kt + 1 < nk) {
#pragma unroll
            for (int i = 0; i < 4; i++) { sc[i] = nsc[i]; bi[i] = nbi[i]; }
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int64_t m = m0 + wm + mt * 16 + g + (c >> 1) * 8;
                const int n = wn + nt * 8 + 2 * t + (c & 1);
                if (m < W.rows && yrow[n] >= 0) y[(int64_t)yrow[n] * ldy + m] = acc[mt][nt][c];
            }
}

// Usable for a matrix: 4- or 8-bit affine, group 64, a whole number of 64-column groups.
__host__ __device__ inline bool g4_ok(const dmat &W) {
    return W.type == 0 && (W.bits == 4 || W.bits == 8) && W.group == 64 && W.cols % 64 == 0;
}
