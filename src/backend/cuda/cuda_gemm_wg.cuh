// cuda_gemm_wg.cuh — the 4-bit prefill GEMM on Hopper's warpgroup MMA (wgmma).
//
// Why: k_gemm_q<4> (cuda_gemm.cuh) feeds mma.sync one m16n8k32 at a time and
// spends ~500 issued instructions per 48 MMAs of a group on fragments, address
// arithmetic and the three-piece fold: it ran at ~14% of the int8 peak, bound by
// issue. One wgmma m64n64k16 does the work of 32 mma.sync m16n8k16 from a single
// instruction, reading the activations from shared memory itself.
//
// The same q-space product as k_gemm_q (cuda_gemm.cuh's header), in bf16:
//   y[n][m] = sum_G ( s[m][G] * sum_{k in G} q[m][k] (xh[n][k] + xl[n][k]) + b[m][G] * xs[n][G] )
// the codes q (0..15) exact in bf16, the input as two bf16 parts (xh + xl, ~16
// significant bits: k_split_x, as the 8-bit path), f32 accumulation; per group the
// product is scaled in f32 (one FMA per output and group). The bias term is a product of
// its own, on the tensor cores once per 16 groups: b (exact in bf16) against the group
// sums xs in three bf16 pieces (2^-24), which keeps the loop at ~175 instructions per group
// and warp where a second FMA per output and group needs ~208 (docs/perf.md).
//
// Tiles as k_gemm_q's (so the same grids and expert tile map, g4_tile): 128 weight rows x 64
// tokens, one 64-column group per pipeline stage, two blocks per SM. Two warpgroups
// of 64 rows: the A operand (codes) from registers, unpacked from the
// packed fragment order (cuda_packed.cuh: a lane's 16-byte word is exactly its A
// fragments for the group's four k16 steps); B (the input parts) from shared memory
// in the 128-byte swizzled K-major layout: token n's 128 bytes of a group at n*128,
// its 16-byte chunk c at chunk c ^ (n & 7). Per group and warpgroup: eight wgmma
// (4 k-steps x 2 parts) into a fresh accumulator, wait, fold. Stages arrive by
// cp.async; a cross-proxy fence makes them visible to wgmma (which reads shared
// memory through the async proxy). (Other tilings and overlaps that are slower:
// docs/perf.md, "Retired variants".)
//
// sm_90a only (wgmma): other targets compile a kernel that traps. The host runs it
// only where k_wg_probe, compiled the same way, reports the wgmma build. The CUDA
// emulator (tests/cuda/emu, whose wgmma.h carries the instruction's fragment map and
// descriptor decoding) runs it in CI: built with -DLILAC_CUEMU (test_gemm_wg_emu.cc).
#pragma once
#include "cuda_wgmma.cuh"
#include "cuda_gemm4_tile.cuh"

// Shared memory: S stages, each 1024-byte aligned (the swizzle pattern's period): the input's
// two parts (64 tokens x 128 B each, swizzled), the packed codes of 8 row blocks (512 B each), the
// 128 rows' scale/bias pairs. Then XB: two windows of the bias product's B operand (64 tokens x
// 128 B, swizzled: a row of k_split_x's xsw window, 96 B, wg_xsw_win).
struct wg_lay {
    static const int S = 4; // stages
    static const int XH = 0, XL = G4_BN * 128, Q = 2 * G4_BN * 128, SB = Q + 8 * 512;
    static const int SIZE = (SB + G4_BM * 4 + 1023) / 1024 * 1024;
    static const int XB = S * SIZE, XB_W = G4_BN * 128; // XB and one window's bytes
};
constexpr size_t wg_smem() { return (size_t)wg_lay::XB + 2 * wg_lay::XB_W + 1024; } // + alignment slack

#if WG_ON
// One tile of k_gemm_wg (g4_tile placed it: W, y, ldy, m0, xrow, yrow) whose tokens the MMAs cover
// NB wide (64, or 32 / 16 for a tile of at most that many: an expert's last, partial tile; its
// absent tokens cost copies of zeros, not multiply-adds). sm: the stages (1024-byte aligned).
// PAIR (a swiglu job, cuda_gemm4_tile.cuh): warpgroup 0 computes 64 rows of W (the gate), warpgroup 1 the
// same rows of W2 (the up), and the epilogue writes SwiGLU's split instead of y.
template <int NB, bool PAIR>
__device__ __forceinline__ void wg_tile(const g4_job &job, const dmat &W, const dmat &W2, float *y, int64_t ldy, int64_t m0,
                                        const int *xrow, const int *yrow, const __nv_bfloat16 *xh, const __nv_bfloat16 *xl,
                                        const __nv_bfloat16 *xsw, unsigned char *const sm) {
    using C = wg_lay;
    constexpr int BN = G4_BN;
    const uint32_t sm_a = smem_u32(sm);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int64_t K = W.cols, ng = K / 64;
    const int nk = (int)ng;

    // This thread's copies of a stage, from sources that advance by a group per stage (absent rows:
    // a valid address, never advanced, zero-filled): a 16-byte chunk of codes (row block `warp`: of
    // W, or with PAIR row block warp % 4 of W or W2 by warpgroup); XC chunks of each input part (token
    // ln, chunks lc ..; to their swizzled places); tid < 32: 4 rows' scale/bias pairs (row block tid / 4).
    constexpr int XC = BN * 8 / 256;
    const int ln = (tid * XC) >> 3, lc = (tid * XC) & 7;
    const int xr_l = xrow[ln];
    const int sbi = (tid >> 2) & 7;
    // (fields picked one by one: a reference picked between W and W2 would put both on the stack)
    const bool q2 = PAIR && warp >= 4, s2 = PAIR && sbi >= 4;
    const uint4 *const q_pk = q2 ? W2.pk : W.pk;
    const uint32_t *const q_psb = q2 ? W2.psb : W.psb, *const s_psb = s2 ? W2.psb : W.psb;
    const int64_t rbq = m0 / 16 + (PAIR ? warp & 3 : warp), rbs = m0 / 16 + (PAIR ? sbi & 3 : sbi);
    const bool q_ok = rbq < (q2 ? W2.pk_rb : W.pk_rb), x_ok = xr_l >= 0;
    const bool sb_on = tid < 32, sb_ok = sb_on && rbs < (s2 ? W2.pk_rb : W.pk_rb);
    const uint4 *q_p = q_pk + (q_ok ? rbq * ng * 32 + lane : 0);
    const __nv_bfloat16 *xh_p = xh + (x_ok ? (int64_t)xr_l * K + lc * 8 : 0), *xl_p = xl + (xh_p - xh);
    const uint32_t *sb_p = s_psb + (sb_ok ? rbs * ng * 16 + (tid & 3) * 4 : 0);
    uint32_t x_dst[XC];
#pragma unroll
    for (int h = 0; h < XC; h++) x_dst[h] = (uint32_t)(ln * 128 + (((lc + h) ^ (ln & 7)) << 4));
    const uint32_t q_dst = C::Q + 16 * tid, sb_dst = C::SB + 16 * tid;
    auto load_stage = [&](int sidx) { // stages load in order, a group after the other
        const uint32_t sa = sm_a + (uint32_t)(sidx * C::SIZE);
        cp_async16_s(sa + q_dst, q_p, q_ok);
#pragma unroll
        for (int h = 0; h < XC; h++) {
            cp_async16_s(sa + C::XH + x_dst[h], xh_p + 8 * h, x_ok);
            cp_async16_s(sa + C::XL + x_dst[h], xl_p + 8 * h, x_ok);
        }
        if (sb_on) cp_async16_s(sa + sb_dst, sb_p, sb_ok);
        if (q_ok) q_p += 32;
        if (x_ok) xh_p += 64, xl_p += 64;
        if (sb_ok) sb_p += 16;
    };
    // Window w's group sums into XB buffer w & 1: 64 tokens x 6 chunks (hi, mid, lo: 16 groups
    // each); chunks tid and tid + 256 (< 384) of this thread (token i / 6, chunk i % 6).
    const int xb_n0 = tid / 6, xb_c0 = tid % 6, xb_n1 = (tid + 256) / 6, xb_c1 = (tid + 256) % 6;
    auto load_xb = [&](int w) {
        const uint32_t sa = sm_a + (uint32_t)(C::XB + (w & 1) * C::XB_W);
        const int r0 = xrow[xb_n0];
        cp_async16_s(sa + xb_n0 * 128 + ((xb_c0 ^ (xb_n0 & 7)) << 4), xsw + (r0 >= 0 ? wg_xsw_win(r0, nk, w) + 8 * xb_c0 : 0),
                     r0 >= 0);
        if (tid < 128) {
            const int r1 = xrow[xb_n1];
            cp_async16_s(sa + xb_n1 * 128 + ((xb_c1 ^ (xb_n1 & 7)) << 4),
                         xsw + (r1 >= 0 ? wg_xsw_win(r1, nk, w) + 8 * xb_c1 : 0), r1 >= 0);
        }
    };

    float acc[32], p[32];
#pragma unroll
    for (int i = 0; i < 32; i++) acc[i] = 0.0f, p[i] = 0.0f;
    // The bias term sum_G b[m][G] xs[n][G] is a product too, run on the tensor cores once per 16
    // groups (a window) instead of an FMA per output and group in the fold. A = the window's b
    // values (bf16, exact) in this thread's A fragment map: rows g, g + 8 of the warp's 16, groups
    // 2t, 2t + 1, 2t + 8, 2t + 9 of the window, loaded from the scale/bias pairs (their high halves)
    // a window ahead (bw) and paired into ab when the product is issued. B = the window's group
    // sums as three bf16 pieces (2^-24, an f32's precision) from k_split_x, copied into XB as the
    // window starts (a partial last window's empty slots are zero there).
    uint32_t ab[4], bw[8];
    const uint32_t *const bsrc = q_ok ? q_psb + rbq * ng * 16 + g : nullptr;
    auto load_b = [&](int w) { // bw[2r + h]: register r's half h
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int r = i >> 1, G = 16 * w + 2 * t + (i & 1) + 8 * (r >> 1);
            bw[i] = bsrc && G < nk ? bsrc[G * 16 + 8 * (r & 1)] : 0u;
        }
    };
    const uint64_t dxb = wg_desc_k(sm_a + C::XB);
    auto make_ab = [&]() { // (before the wgmma fence: ab is an MMA's register operand)
#pragma unroll
        for (int r = 0; r < 4; r++) ab[r] = bw[2 * r] >> 16 | (bw[2 * r + 1] & 0xFFFF0000u);
    };
    auto mma_bias = [&](int w) { // acc += b (64 x 16) x XB window w; the small pieces first
#pragma unroll
        for (int pc = 2; pc >= 0; pc--) wg_mma_64xN<NB>(acc, ab, dxb + (uint32_t)((w & 1) * C::XB_W + 32 * pc) / 16, 1);
    };
    load_b(0);

    // issue group kt's eight MMAs into p (A: the codes, unpacked; B: the stage's two parts), and at
    // a window's end (kt a multiple of 16) the previous window's bias product into acc
    auto mma_group = [&](int kt) {
        const int sidx = kt % wg_lay::S;
        const uint4 w = *(const uint4 *)(sm + sidx * C::SIZE + C::Q + 16 * (warp * 32 + lane));
        const uint32_t wk[4] = {w.x, w.y, w.z, w.w};
        uint32_t a[4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
#pragma unroll
            for (int j = 0; j < 4; j++) a[ks][j] = pk_frag2(wk[ks] >> (4 * j));
        // the parts' descriptors (K-major, cuda_wgmma.cuh); k-step ks 32 bytes further
        const uint64_t dh = wg_desc_k(sm_a + (uint32_t)(sidx * C::SIZE + C::XH)), dl = dh + (C::XL - C::XH) / 16;
        const bool bias = kt > 0 && (kt & 15) == 0;
        if (bias) make_ab();
        wg_pin(p);
        wg_pin(acc);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            wg_mma_64xN<NB>(p, a[ks], dl + 2 * ks, ks > 0);
            wg_mma_64xN<NB>(p, a[ks], dh + 2 * ks, 1);
        }
        if (bias) {
            mma_bias((kt >> 4) - 1);
            load_b(kt >> 4);
        }
        wg_commit();
    };
    // fold group kt: acc += s p; p[4j + c]: row g + 8 (c >> 1), token 8j + 2t + (c & 1)
    auto fold = [&](int kt) {
        const unsigned char *S = sm + (kt % wg_lay::S) * C::SIZE;
        const uint32_t u0 = *(const uint32_t *)(S + C::SB + 4 * (16 * warp + g)),
                       u1 = *(const uint32_t *)(S + C::SB + 4 * (16 * warp + g + 8));
        const float s0 = __uint_as_float(u0 << 16), s1 = __uint_as_float(u1 << 16); // (the scales: low halves)
        wg_pin(p);
        wg_pin(acc);
#pragma unroll
        for (int j = 0; j < NB / 8; j++) {
            acc[4 * j + 0] = fmaf(s0, p[4 * j + 0], acc[4 * j + 0]);
            acc[4 * j + 1] = fmaf(s0, p[4 * j + 1], acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(s1, p[4 * j + 2], acc[4 * j + 2]);
            acc[4 * j + 3] = fmaf(s1, p[4 * j + 3], acc[4 * j + 3]);
        }
    };
    // The copies run S - 1 groups ahead: group kt + S - 1 goes to the stage group kt - 1 left, whose
    // MMAs both warpgroups waited for (and folded) before the barrier.
#pragma unroll
    for (int s = 0; s < wg_lay::S - 1; s++) {
        if (s < nk) load_stage(s);
        if (s == 0) load_xb(0);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<wg_lay::S - 2>();
        wg_proxy_fence(); // the copies, visible to wgmma
        __syncthreads();
        if (kt + wg_lay::S - 1 < nk) load_stage((kt + wg_lay::S - 1) % wg_lay::S);
        if (kt > 0 && (kt & 15) == 0) load_xb(kt >> 4); // (its buffer's last reader, window w - 2's product, is done)
        cp_async_commit();
        mma_group(kt);
        wg_wait<0>();
        fold(kt);
    }
    // the last window's bias product
    cp_async_wait<0>();
    wg_proxy_fence();
    __syncthreads();
    make_ab();
    wg_pin(acc);
    wg_fence();
    mma_bias((nk - 1) >> 4);
    wg_commit();
    wg_wait<0>();
    wg_pin(acc);
    if constexpr (!PAIR) {
#pragma unroll
        for (int j = 0; j < NB / 8; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int64_t m = m0 + 16 * warp + g + (c >> 1) * 8;
                const int n = 8 * j + 2 * t + (c & 1);
                if (m < W.rows && yrow[n] >= 0) y[(int64_t)yrow[n] * ldy + m] = acc[4 * j + c];
            }
    } else {
        // SwiGLU's split, as k_split_x<1> makes it (the same expressions, so the same bits): the gate's
        // and the up's outputs through shared memory (the stages, free once every warp's MMAs are done;
        // [warpgroup][token][row], rows padded to 68 floats: the fragment stores and the float4 loads
        // conflict-free), then per token 16 threads of 4 columns each, which are one group of 64 columns
        // of the next GEMM's input (its group sum a 16-lane shuffle, as in k_split_x).
        (void)y, (void)ldy;
        constexpr int LD = 68;
        float *const E = (float *)sm;
        __syncthreads();
        const int wg = warp >> 2, r0 = 16 * (warp & 3) + g;
#pragma unroll
        for (int j = 0; j < NB / 8; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) E[(wg * 64 + 8 * j + 2 * t + (c & 1)) * LD + r0 + 8 * (c >> 1)] = acc[4 * j + c];
        __syncthreads();
        const int64_t I = W.rows;
        const int ngd = (int)(I / 64), G = (int)(m0 / 64), c4 = 4 * (tid & 15);
#pragma unroll
        for (int q = 0; q < NB / 16; q++) {
            const int n = 16 * q + (tid >> 4), row = yrow[n];
            const float4 gv = *(const float4 *)&E[n * LD + c4], uv = *(const float4 *)&E[(64 + n) * LD + c4];
            const float e[4] = {g4_swiglu(gv.x, uv.x), g4_swiglu(gv.y, uv.y), g4_swiglu(gv.z, uv.z), g4_swiglu(gv.w, uv.w)};
            if (row >= 0) g4_put_parts(e, job.oh, job.ol, (int64_t)row * I + m0 + c4);
            const float sum = g4_group_sum(e);
            if (row >= 0 && (tid & 15) == 0) g4_put_xsw(job.osw, row, ngd, G, sum);
        }
        if ((ngd & 15) && G == ngd - 1) // a partial last window's empty slots (k_split_x's zeros)
            for (int i = tid; i < NB * 48; i += 256) {
                const int n = i / 48, k = i % 48, row = yrow[n];
                if (row >= 0 && (k & 15) >= (ngd & 15)) job.osw[wg_xsw_win(row, ngd, (ngd - 1) / 16) + k] = __float2bfloat16(0.0f);
            }
    }
}
#endif

// The 4-bit GEMM: arguments and modes (plain / grouped over the expert tile map) as k_gemm_q<4>,
// reading the input's bf16 parts xh/xl and group sums xsw (k_split_x).
__global__ void __launch_bounds__(256, 2)
    k_gemm_wg(g4_job job, const __nv_bfloat16 *xh, const __nv_bfloat16 *xl, const __nv_bfloat16 *xsw, int T, const int *offs,
              const int *sorted, const int2 *tiles, const int *n_tiles, int x_div) {
#if WG_ON
    WG_SMEM(wg_smem_raw);
    __shared__ int xrow[G4_BN], yrow[G4_BN];
    // the stages from the first 1024-byte boundary (pointer arithmetic on the shared array keeps
    // loads from it shared-memory loads)
    unsigned char *const sm = wg_smem_raw + ((1024u - (smem_u32(wg_smem_raw) & 1023u)) & 1023u);
    pdl_wait();
    dmat W;
    float *y;
    int64_t ldy, m0;
    int nn;
    dmat W2{};
    if (!g4_tile(job, T, offs, sorted, tiles, n_tiles, x_div, W, y, ldy, m0, xrow, yrow, &nn, &W2)) return;
    // (an expert's tiles of a 4k prefill are 81% full, its last one mostly empty)
#define WG_TILE(NB, PAIR) wg_tile<NB, PAIR>(job, W, W2, y, ldy, m0, xrow, yrow, xh, xl, xsw, sm)
    if (job.swiglu) {
        if (nn > 32) WG_TILE(64, true);
        else if (nn > 16) WG_TILE(32, true);
        else WG_TILE(16, true);
    } else {
        if (nn > 32) WG_TILE(64, false);
        else if (nn > 16) WG_TILE(32, false);
        else WG_TILE(16, false);
    }
#undef WG_TILE
#else
    (void)job, (void)xh, (void)xl, (void)xsw, (void)T, (void)offs, (void)sorted, (void)tiles, (void)n_tiles, (void)x_div;
#ifdef __CUDA_ARCH__
    __trap(); // not the sm_90a image: the host never launches this (k_wg_probe)
#endif
#endif
}
