// cuda_gemm_ws.cuh — the 4-bit prefill GEMM of cuda_gemm_wg.cuh with its warps specialised:
// one producer warp copies the stages, two warpgroups only compute, each with two accumulators.
//
// Why: in k_gemm_wg every warp issues its share of each stage's copies, waits for its own
// copies, and all 8 warps meet at a block barrier per group; a warpgroup waits for its group's
// MMAs before it folds them, so its tensor-core work and its fold never overlap (two blocks per SM
// overlap each other instead). Of its ~175 instructions per group and warp ~90 are addresses,
// copies and that barrier: ~48% of the bf16 MMA peak (run 90: wgmma itself sustains the peak at
// this shape). Two accumulators per warpgroup need more registers than two blocks per SM leave
// (k_gemm_wg's run 86), so here one block per SM of 384 threads:
//  - a ring of S stages with two mbarriers each replaces the block barrier: full[s] completes when
//    the producer's copies of stage s have landed (each of its 32 lanes arrives through
//    cp.async.mbarrier.arrive), empty[s] when all 8 consumer warps have folded the group it held;
//    the warpgroups wait only for their data and drift apart by up to the ring's depth;
//  - a warpgroup issues group kt's 8 MMAs into one accumulator, then waits only for group kt - 1's
//    (wgmma.wait_group 1) and folds those from the other accumulator while kt's run.
//
// The same tile, layout, product and fold as k_gemm_wg (its header): 128 weight rows x 64 tokens
// per block; a stage of wg_lay holds one 64-column group (the input's two bf16 parts, swizzled; 8
// row blocks of packed codes; 128 scale/bias pairs). Window w (16 groups) has its group sums (XB,
// three bf16 pieces) and its scale/bias pairs (BB: the b values are the bias product's A
// operand) in buffers w & 1, copied with the window's first stage; its bias product runs with the
// next window's first MMAs, into its own accumulator (accb: no other instruction writes a register
// a wgmma in flight accumulates into, or ptxas serialises the MMAs), added at the end.
//
// Warps 0-7 are the two warpgroups (warp w: row block w, rows 16w .. 16w + 15 of the tile), warps
// 8-11 the producer (its registers given to the consumers: setmaxnreg 56 / 224, 56 + 2 x 224 = 3 x
// 168, the count at entry; one block of 12 warps would otherwise cap every thread at 168; at 40 the
// producer spilled its addresses, run 104). Copies by cp.async, 16 bytes a lane (the input rows are gathered through xrow,
// which the tensor copy engine cannot do on sm_90); a consumer makes them visible to its MMAs with
// a proxy fence after its wait (wgmma reads shared memory through the async proxy).
// sm_90a only, as k_gemm_wg; the CUDA emulator (tests/cuda/emu: mbarriers, wgmma) runs it in CI
// (test_gemm_wg_emu.cc).
#pragma once
#include "cuda_gemm_wg.cuh"

#define WS_THREADS 640 // four consumer warpgroups + the producer warpgroup
// Dynamic shared memory (from a 1,024-byte boundary): S stages of wg_lay's size, XB[2] and BB[2]
// (8 KB each), the 2 S mbarriers.
struct ws_lay {
    static const int S = 9;
    static const int XB = S * wg_lay::SIZE, BB = XB + 2 * wg_lay::XB_W, BAR = BB + 2 * 8192;
};
constexpr size_t ws_smem() { return (size_t)ws_lay::BAR + 16 * ws_lay::S + 1024; }

__global__ void __launch_bounds__(WS_THREADS, 1)
    k_gemm_ws(g4_job job, const __nv_bfloat16 *xh, const __nv_bfloat16 *xl, const __nv_bfloat16 *xsw, int T, const int *offs,
              const int *sorted, const int2 *tiles, const int *n_tiles, int x_div) {
#if WG_ON
    using C = wg_lay;
    constexpr int BN = G4_BN, S = ws_lay::S;
    WG_SMEM(wg_smem_raw);
    __shared__ int xrow[BN], yrow[BN];
    unsigned char *const sm = wg_smem_raw + ((1024u - (smem_u32(wg_smem_raw) & 1023u)) & 1023u);
    const uint32_t sm_a = smem_u32(sm), bar_a = sm_a + (uint32_t)ws_lay::BAR;
    auto full = [&](int s) { return bar_a + 8u * (uint32_t)s; };
    auto empty = [&](int s) { return bar_a + 8u * (uint32_t)(S + s); };
    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0); // (known warp-uniform: the roles' branch is not divergent)
    if (tid == 0)
        for (int s = 0; s < S; s++) {
            mbar_init(full(s), 128); // the producer's threads, as their copies land
            mbar_init(empty(s), 16); // the consumer warps, as they finish a group
        }
    pdl_wait();
    dmat W;
    float *y;
    int64_t ldy, m0;
    // (its barrier also publishes the mbarriers' initialisation)
    if (!g4_tile(job, T, offs, sorted, tiles, n_tiles, x_div, W, y, ldy, m0, xrow, yrow)) return;
    const int64_t K = W.cols, ng = K / 64;
    const int nk = (int)ng;

    if (warp >= 16) { // the producer warpgroup: group kt into stage kt % S once the consumers have released it
        wg_setmaxnreg_dec<56>();
        // thread pt's copies of a stage: codes, 16 bytes of row blocks pt / 32 and 4 + pt / 32 (lane pt % 32);
        // pt < 32: scale/bias pairs of rows 4 pt .. +3; input parts: token pt / 2, chunks 4 (pt & 1) .. +3
        // of both. Of a window: group-sum chunks pt + 128 j; the window's pairs, chunks pt + 128 j.
        const int pt = tid - 512, lq = pt & 31;
        const int64_t rb0 = m0 / 16;
        const int nrb = (int)(W.pk_rb - rb0 < 8 ? W.pk_rb - rb0 : 8); // row blocks present
        const bool q0_ok = pt / 32 < nrb, q1_ok = 4 + pt / 32 < nrb, sb_ok = pt < 32 && pt / 4 < nrb, bb_ok = lq / 4 < nrb;
        const uint4 *q_p = W.pk + (rb0 + pt / 32) * ng * 32 + lq;
        const uint32_t *sb_p = W.psb + (sb_ok ? (rb0 + pt / 4) * ng * 16 + (pt & 3) * 4 : 0);
        const uint32_t *bb_p = W.psb + (bb_ok ? (rb0 + lq / 4) * ng * 16 + (lq & 3) * 4 : 0);
        const int xn = pt >> 1, xc = 4 * (pt & 1), xr = xrow[xn];
        const int64_t xo = xr >= 0 ? (int64_t)xr * K + 8 * xc : 0;
        for (int kt = 0; kt < nk; kt++) {
            const int s = kt % S;
            if (kt >= S) mbar_wait(empty(s), (unsigned)(kt / S + 1) & 1u);
            if ((kt & 15) == 0) {
                // window w's group sums and scale/bias pairs into buffers w & 1 (their last readers,
                // window w - 2's bias product with group 16w - 16, released that group: the wait above)
                const int w = kt >> 4;
                const uint32_t xa = sm_a + (uint32_t)(ws_lay::XB + (w & 1) * C::XB_W), ba = sm_a + (uint32_t)(ws_lay::BB + (w & 1) * 8192);
#pragma unroll
                for (int j = 0; j < 3; j++) { // group sums: 64 tokens x 6 chunks (three pieces of 16 groups)
                    const int i = pt + 128 * j, n = i / 6, c = i % 6, r = xrow[n];
                    cp_async16_s(xa + n * 128 + ((c ^ (n & 7)) << 4), xsw + (r >= 0 ? wg_xsw_win(r, nk, w) + 8 * c : 0), r >= 0);
                }
#pragma unroll
                for (int j = 0; j < 4; j++) { // pairs: word (group jj, row) at 4 (128 jj + row); chunk pt + 128 j has jj = pt / 32 + 4 j
                    const int jj = pt / 32 + 4 * j;
                    const bool ok = bb_ok && kt + jj < nk;
                    cp_async16_s(ba + 16 * (pt + 128 * j), bb_p + (ok ? 16 * (kt + jj) : 0), ok);
                }
            }
            const uint32_t sa = sm_a + (uint32_t)(s * C::SIZE);
            cp_async16_s(sa + C::Q + 16 * pt, q_p + (q0_ok ? 32 * kt : 0), q0_ok);
            cp_async16_s(sa + C::Q + 16 * (128 + pt), q_p + (q1_ok ? 4 * ng * 32 + 32 * kt : 0), q1_ok);
            if (pt < 32) cp_async16_s(sa + C::SB + 16 * pt, sb_p + (sb_ok ? 16 * kt : 0), sb_ok);
            const int64_t o = xo + (xr >= 0 ? 64 * kt : 0);
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const uint32_t d = (uint32_t)(xn * 128 + (((xc + c) ^ (xn & 7)) << 4));
                cp_async16_s(sa + C::XH + d, xh + o + 8 * c, xr >= 0);
                cp_async16_s(sa + C::XL + d, xl + o + 8 * c, xr >= 0);
            }
            cp_async_mbar_arrive(full(s));
        }
        return;
    }
    wg_setmaxnreg_inc<104>();

    // The consumers: warpgroup cw takes rows 64 (cw & 1) .. +63 and tokens 32 (cw >> 1) .. +31 of the
    // tile; its warp w & 3 row block rb = 4 (cw & 1) + (w & 3) (rows 16 rb .. 16 rb + 15).
    const int g = lane >> 2, t = lane & 3, cw = warp >> 2, rb = 4 * (cw & 1) + (warp & 3), th = cw >> 1;
    constexpr int NA = 16; // accumulator registers: 64 rows x 32 tokens
    // acc: the folded sums (only the fold writes it); accb: the bias products (only wgmma writes it)
    float acc[NA], accb[NA], p0[NA], p1[NA];
#pragma unroll
    for (int i = 0; i < NA; i++) acc[i] = 0.0f, accb[i] = 0.0f, p0[i] = 0.0f, p1[i] = 0.0f;
    // Window w's bias product sum_G b[m][G] xs[n][G] (accb += b (64 x 16) x XB[w & 1]): A = the b values
    // (the pairs' high halves, exact in bf16) in the m16n8k16 A map, rows g, g + 8 of the warp's 16,
    // groups 2t, 2t + 1 (registers 0, 1) and 2t + 8, 2t + 9 (2, 3) of the window; B = the group sums'
    // three pieces, the small ones first
    auto load_ab = [&](int w, uint32_t (&ab)[4]) {
        const uint32_t *bb = (const uint32_t *)(sm + ws_lay::BB + (w & 1) * 8192) + 16 * rb + g;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int j0 = 2 * t + 8 * (r >> 1), row = 8 * (r & 1);
            ab[r] = bb[128 * j0 + row] >> 16 | (bb[128 * (j0 + 1) + row] & 0xFFFF0000u);
        }
    };
    auto mma_bias = [&](int w, const uint32_t (&ab)[4]) {
        const uint64_t dxb = wg_desc_k(sm_a + (uint32_t)(ws_lay::XB + (w & 1) * C::XB_W + 4096 * th)); // (tokens 32 th ..)
#pragma unroll
        for (int pc = 2; pc >= 0; pc--) wg_mma_64x32(accb, ab, dxb + (uint32_t)(32 * pc) / 16, 1);
    };
    // issue group kt's eight MMAs into pc (A: the codes, unpacked; B: the stage's two parts) and, at
    // a window's first group, the previous window's bias product: one commit group
    auto mma_group = [&](int kt, float (&pc)[NA]) {
        const int s = kt % S;
        mbar_wait(full(s), (unsigned)(kt / S) & 1u);
        wg_proxy_fence(); // the producer's copies, visible to wgmma
        const uint4 wq = *(const uint4 *)(sm + s * C::SIZE + C::Q + 16 * (rb * 32 + lane));
        const uint32_t wk[4] = {wq.x, wq.y, wq.z, wq.w};
        uint32_t a[4][4], ab[4];
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
#pragma unroll
            for (int j = 0; j < 4; j++) a[ks][j] = pk_frag2(wk[ks] >> (4 * j));
        const bool bias = kt > 0 && (kt & 15) == 0;
        if (bias) load_ab((kt >> 4) - 1, ab);
        const uint64_t dh = wg_desc_k(sm_a + (uint32_t)(s * C::SIZE + C::XH + 4096 * th)), dl = dh + (C::XL - C::XH) / 16;
        wg_pin(pc);
        wg_pin(accb);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            wg_mma_64x32(pc, a[ks], dl + 2 * ks, ks > 0);
            wg_mma_64x32(pc, a[ks], dh + 2 * ks, 1);
        }
        if (bias) mma_bias((kt >> 4) - 1, ab);
        wg_commit();
    };
    // fold group kt: acc += s pc (pc[4j + c]: row g + 8 (c >> 1), token 8j + 2t + (c & 1)); then release its stage
    auto fold = [&](int kt, float (&pc)[NA]) {
        const unsigned char *const st = sm + (kt % S) * C::SIZE;
        const uint32_t u0 = *(const uint32_t *)(st + C::SB + 4 * (16 * rb + g)),
                       u1 = *(const uint32_t *)(st + C::SB + 4 * (16 * rb + g + 8));
        const float s0 = __uint_as_float(u0 << 16), s1 = __uint_as_float(u1 << 16);
        wg_pin(pc);
        wg_pin(acc);
#pragma unroll
        for (int j = 0; j < NA / 4; j++) {
            acc[4 * j + 0] = fmaf(s0, pc[4 * j + 0], acc[4 * j + 0]);
            acc[4 * j + 1] = fmaf(s0, pc[4 * j + 1], acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(s1, pc[4 * j + 2], acc[4 * j + 2]);
            acc[4 * j + 3] = fmaf(s1, pc[4 * j + 3], acc[4 * j + 3]);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty(kt % S));
    };
#ifdef WS_DP
    // Group kt's MMAs run while group kt - 1 is folded. ptxas cannot follow a wgmma group in flight
    // across a loop's back edge (it then serialises every MMA: C7514), so the loop is unrolled by
    // U and the first group of each turn waits for the one before it (first: wait_group 0). U = 2:
    // 4 gave C7514 again, 8 ran out of registers (C7511, 528 bytes of spills; ptxas, CUDA 13).
    auto step = [&](int kt, float (&pc)[NA], float (&pp)[NA], bool first) {
        mma_group(kt, pc);
        if (kt > 0) {
            if (first) wg_wait<0>();
            else wg_wait<1>(); // group kt - 1's commit group is done
            fold(kt - 1, pp);
        }
    };
    constexpr int U = 2;
    int kt = 0;
    for (; kt + U <= nk; kt += U)
#pragma unroll
        for (int r = 0; r < U; r += 2) {
            step(kt + r, p0, p1, r == 0);
            step(kt + r + 1, p1, p0, false);
        }
#pragma unroll
    for (int r = 0; r < U - 1; r++) // (kt is even)
        if (kt + r < nk) {
            if (r & 1) step(kt + r, p1, p0, false);
            else step(kt + r, p0, p1, r == 0);
        }
#else
    // Group kt's MMAs, then their fold: the four warpgroups overlap each other's.
    for (int kt = 0; kt < nk; kt++) {
        mma_group(kt, p0);
        wg_wait<0>();
        fold(kt, p0);
    }
    (void)p1;
#endif
    { // the last window's bias product (its buffers are not reused)
        uint32_t ab[4];
        load_ab((nk - 1) >> 4, ab);
        wg_pin(accb);
        wg_fence();
        mma_bias((nk - 1) >> 4, ab);
        wg_commit();
    }
    wg_wait<0>();
#ifdef WS_DP
    if ((nk - 1) & 1) fold(nk - 1, p1);
    else fold(nk - 1, p0);
#endif
    wg_pin(accb);
#pragma unroll
    for (int j = 0; j < NA / 4; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int64_t m = m0 + 16 * rb + g + (c >> 1) * 8;
            const int n = 32 * th + 8 * j + 2 * t + (c & 1);
            if (m < W.rows && yrow[n] >= 0) y[(int64_t)yrow[n] * ldy + m] = acc[4 * j + c] + accb[4 * j + c];
        }
#else
    (void)job, (void)xh, (void)xl, (void)xsw, (void)T, (void)offs, (void)sorted, (void)tiles, (void)n_tiles, (void)x_div;
#ifdef __CUDA_ARCH__
    __trap(); // not the sm_90a image: the host never launches this (k_wg_probe)
#endif
#endif
}
