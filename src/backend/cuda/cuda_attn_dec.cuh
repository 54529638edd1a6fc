// cuda_attn_dec.cuh — decode attention: one query token against the bf16 KV cache,
// GQA-packed (block = one KV head and one split of its keys, serving the G <= 8 query
// heads that share the head, so each K and V element is read once), its splits merged by
// k_attn_combine (cuda_attn_split.cuh).
//
// k_attn_dec_mma: both products on the tensor cores (mma.sync m16n8k16, bf16 in, f32
// accumulate). Per warp and 16 keys: S^T = K Q^T (M = the keys, N = the 8 heads, K = the
// head dims; K straight from the swizzled tile by ldmatrix, Q^T in registers) and
// O^T += V^T P^T (M = the head dims, V^T by ldmatrix.trans, P^T from the scores'
// accumulator by movmatrix.trans). Q and P are split into two bf16 pieces (hi + lo, ~16
// bits, as the prefill attention), K and V are exact (the cache is bf16): f32-faithful.
// Why the tensor cores: on the CUDA cores a 32-key tile (32 KB of K/V) is ~1.5 us of
// arithmetic, so the cache is read at ~1.9 TB/s at 32k (docs/perf.md); here a 64-key tile
// is ~200 instructions a warp, and the kernel reads at the copy bandwidth.
// It also does k_attn_prep's work for its token: every block norms and ropes its G
// query heads, and the last split (the one holding key p) makes p's K/V row, stores it to
// the cache for later steps and scores it from shared memory: key p weighs now exactly
// as it will in later steps.
//
// The CUDA emulator (tests/cuda/emu, whose mma.h carries ldmatrix, movmatrix and the
// m16n8k16 MMA in their fragment maps) runs k_attn_dec_mma in CI: built with -DLILAC_CUEMU
// (test_attn_dec_emu.cc). tests/cuda/test_attn.cu runs it on the GPU.
#pragma once
#ifdef LILAC_CUEMU
#include "mma.h" // ldmatrix, movmatrix, mma.sync m16n8k16 bf16; pdl_*, cp.async (the emulator's cuda_runtime.h)
#else
#include "cuda_common.cuh"
#endif
#include "cuda_attn_wg.cuh" // attn_wg::split: a value pair as two bf16 pieces, as the prefill attention splits P

// warp_norm_rope's math (cuda_attn_split.cuh) on one head whose values, gains and RoPE
// frequencies a warp already holds (element lane + 32 k in r[k], g[k], f[k]; f only below
// rd/2), so that their loads could be issued before anything else: dst (shared
// memory, this warp's alone) gets the result. The same operations in the same
// order as warp_norm_rope, so the same bits.
template <int DPL>
__device__ __forceinline__ void warp_norm_rope_regs(const float (&r)[DPL], const float (&g)[DPL], const float (&f)[DPL],
                                                    int rd, int64_t pos, float eps, float mul, float *dst) {
    constexpr int HD = DPL * 32;
    const int lane = threadIdx.x & 31, half = rd / 2;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < DPL; k++) ss += r[k] * r[k];
    const float inv = rsqrtf(warp_sum(ss) / (float)HD + eps);
#pragma unroll
    for (int k = 0; k < DPL; k++) dst[lane + 32 * k] = r[k] * inv * g[k];
    __syncwarp();
    float ra[DPL], rb[DPL]; // the rotated pair (i, i + half) of each i = lane + 32 k < half
#pragma unroll
    for (int k = 0; k < DPL; k++) {
        const int i = lane + 32 * k;
        if (i < half) {
            const float a = dst[i], b = dst[i + half];
            float sn, cs;
            sincosf((float)pos * f[k], &sn, &cs);
            ra[k] = (a * cs - b * sn) * mul;
            rb[k] = (b * cs + a * sn) * mul;
        }
    }
    __syncwarp(); // every pair read before any is written
#pragma unroll
    for (int k = 0; k < DPL; k++) {
        const int i = lane + 32 * k;
        if (i < half) {
            dst[i] = ra[k];
            dst[i + half] = rb[k];
        } else if (i >= rd) {
            dst[i] *= mul;
        }
    }
}

#define ADEC_S 64 // splits: 2 KV heads x 64 = 128 blocks, one per SM (the shared memory below)
static_assert(ADEC_S <= 128, "k_attn_combine merges up to 128 splits");

// Split s of S over the n = p + 1 keys of the token at position p
// (*d_pos): the cached keys [j0, j1) it reads; the last split (never empty) holds key p too.
struct adec_range {
    int64_t p, j0, j1;
    bool last;
};
__device__ __forceinline__ adec_range adec_range_of(const int *d_pos, int s, int S) {
    adec_range r;
    r.p = *d_pos;
    const int64_t n = r.p + 1;
    r.last = s == S - 1;
    r.j0 = n * s / S;
    r.j1 = r.last ? r.p : n * (s + 1) / S;
    return r;
}
// The last split's key p: warp 0 norms and ropes its k (kr, kw, fr: as warp_norm_rope_regs takes
// them) through kpf, and the block's threads (NT, VPT values each in vr) take its v; both rounded to
// bf16 into the cache rows kd, vd and into shared memory (kp, vp), so that it is scored exactly as
// later steps will read it.
template <int DPL, int NT, int VPT>
__device__ __forceinline__ void adec_key_p(const float (&kr)[DPL], const float (&kw)[DPL], const float (&fr)[DPL], int rd,
                                           int64_t p, float eps, const float (&vr)[VPT], __nv_bfloat16 *kd,
                                           __nv_bfloat16 *vd, __nv_bfloat16 *kp, __nv_bfloat16 *vp, float *kpf) {
    constexpr int HD = DPL * 32;
    const int tid = threadIdx.x, lane = tid & 31;
    if (tid < 32) {
        warp_norm_rope_regs<DPL>(kr, kw, fr, rd, p, eps, 1.0f, kpf);
        __syncwarp();
        for (int i = lane; i < HD; i += 32) kd[i] = kp[i] = __float2bfloat16_rn(kpf[i]);
    }
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        const int i = tid + u * NT;
        if (i < HD) vd[i] = vp[i] = __float2bfloat16_rn(vr[u]);
    }
}
// The warps' merge, once each warp w has left its weighted output of head h in red[(w * 8 + h) * HD ..]
// and its max and sum in mls[w][h], lls[w][h]: split s's partials of the G heads, part[(h*S + s)*(HD+2)]
// = acc, max, sum (k_attn_combine merges them). NW warps, NT threads.
template <int HD, int NW, int NT>
__device__ __forceinline__ void adec_store(const float *red, const float (*mls)[8], const float (*lls)[8], int G, int kh,
                                           int s, int S, float *part) {
    const int tid = threadIdx.x;
    for (int i = tid; i < G * HD; i += NT) {
        const int h = i / HD, d = i % HD;
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) a += red[((size_t)w * 8 + h) * HD + d];
        part[((int64_t)(kh * G + h) * S + s) * (HD + 2) + d] = a;
    }
    if (tid < G) {
        float M = -INFINITY, L = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) M = fmaxf(M, mls[w][tid]);
#pragma unroll
        for (int w = 0; w < NW; w++) {
            const float mw = mls[w][tid];
            L += mw == -INFINITY ? 0.0f : lls[w][tid] * expf(mw - M);
        }
        float *pp = part + ((int64_t)(kh * G + tid) * S + s) * (HD + 2);
        pp[HD] = M;
        pp[HD + 1] = L;
    }
}

// ---------------------------------------------------------------- k_attn_dec_mma

namespace adec {
constexpr int NW = 4, NT = 32 * NW; // warps, threads
constexpr int TK = 16 * NW;         // keys per tile: 16 a warp
constexpr int ST = 3;               // tile buffers: two tiles in flight while one is scored
// Dynamic shared memory: the normed and roped queries (f32 [8][HD]), then ST x (K tile, V tile)
// (bf16, TK rows of HD, the 16-byte chunk c of row r at chunk c ^ (r & 7): ldmatrix reads 8
// rows of one chunk column without bank conflicts), then key p's k and v rows (bf16). After
// the last tile, the tiles' memory holds the warps' merge (f32 [NW][8][HD]).
template <int HD>
struct lay {
    static constexpr int ROW = 2 * HD, TILE = TK * ROW;
    static constexpr int KV = 8 * HD * 4, KP = KV + ST * 2 * TILE, SIZE = KP + 2 * ROW;
    static_assert(NW * 8 * HD * 4 <= ST * 2 * TILE, "the merge fits in the tiles' memory");
    static_assert(HD % 64 == 0, "16-byte chunks swizzled in groups of 8");
};
__device__ __forceinline__ uint32_t swz(int r, int c) { return (uint32_t)((c ^ (r & 7)) << 4); }
} // namespace adec
__host__ __device__ inline size_t attn_dec_mma_smem(int hd) {
    return hd == 128 ? (size_t)adec::lay<128>::SIZE : (size_t)adec::lay<256>::SIZE;
}

#ifdef LILAC_CUEMU
#define ADEC_SMEM(name) unsigned char *const name = cuemu::dyn_smem
#else
#define ADEC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif

// Grid (nkv, S), adec::NT threads, attn_dec_mma_smem(HD) bytes; arguments:
// (qg: the q/k/v GEMV's raw query halves; kx, vx: this token's raw k and v; part: the
// splits' partials, part[(h*S + s)*(HD+2)] = acc, max, sum; prof: test_attn's timeline).
template <int HD>
__global__ void __launch_bounds__(adec::NT, 1)
    k_attn_dec_mma(const float *qg, const float *kx, const float *vx, const float *qn, const float *kn, const float *inv_freq,
                   int rd, float eps, __nv_bfloat16 *kc, __nv_bfloat16 *vc, const int *d_pos, int nh, int nkv, float *part,
                   int S, unsigned long long *prof) {
    using namespace adec;
    using Ly = lay<HD>;
    constexpr int DPL = HD / 32, KS = HD / 16, CPR = HD / 8; // dims per lane, k16 steps, 16-byte chunks per row
    ADEC_SMEM(sm);
    __shared__ float kpf[HD];               // key p's k row in f32, before its rounding
    __shared__ float mls[NW][8], lls[NW][8]; // every warp's max and sum per head, for the merge
    float *const qs = reinterpret_cast<float *>(sm);
    __nv_bfloat16 *const kp = reinterpret_cast<__nv_bfloat16 *>(sm + Ly::KP), *const vp = kp + HD;
    float *const red = reinterpret_cast<float *>(sm + Ly::KV); // after the last tile: [warp][head][HD]
    const uint32_t s_kv = smem_u32(sm) + Ly::KV;
    const int kh = blockIdx.x, s = blockIdx.y, G = nh / nkv;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int nb = gridDim.x * gridDim.y, bi = blockIdx.y * gridDim.x + blockIdx.x;
    auto mark = [&](int i) { if (prof && tid == 0) prof[i * nb + bi] = gtimer(); };
    mark(0);
    pdl_trigger_early();
    pdl_wait(); // q, k and v of this token come from the q/k/v GEMV
    const adec_range R = adec_range_of(d_pos, s, S);
    const int64_t p = R.p, j0 = R.j0, j1 = R.j1, kvw = (int64_t)nkv * HD; // cached keys [j0, j1)
    const bool last = R.last;
    const int ntile = (int)((j1 - j0 + TK - 1) / TK);
    // This token's q (heads warp and warp + NW), and in the last split its k (warp 0) and v, with
    // their gains and RoPE frequencies, loaded before the tiles' copies (behind them they would
    // wait for every block's DRAM traffic: docs/perf.md).
    float qr[2][DPL], qw[DPL], fr[DPL], kr[DPL], kw[DPL];
#pragma unroll
    for (int k = 0; k < DPL; k++) {
        const int i = lane + 32 * k;
        qw[k] = qn[i];
        fr[k] = i < rd / 2 ? inv_freq[i] : 0.0f;
        kr[k] = last && warp == 0 ? kx[(int64_t)kh * HD + i] : 0.0f;
        kw[k] = last && warp == 0 ? kn[i] : 0.0f;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int h = warp + NW * u;
            qr[u][k] = h < G ? qg[(int64_t)(kh * G + h) * 2 * HD + i] : 0.0f;
        }
    }
    constexpr int VPT = (HD + NT - 1) / NT;
    float vr[VPT];
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        const int i = tid + u * NT;
        vr[u] = last && i < HD ? vx[(int64_t)kh * HD + i] : 0.0f;
    }
    // Tile it into buffer b: K and V rows j0 + it TK .., rows past j1 zero-filled (their scores are
    // masked, and a zero V row keeps P V finite).
    auto load = [&](int it, int b) {
        const int64_t t0 = j0 + (int64_t)it * TK;
        const uint32_t dk = s_kv + (uint32_t)(2 * b * Ly::TILE), dv = dk + Ly::TILE;
        for (int i = tid; i < TK * CPR; i += NT) {
            const int r = i / CPR, c = i % CPR;
            const bool ok = t0 + r < j1;
            const int64_t src = ok ? (t0 + r) * kvw + (int64_t)kh * HD + 8 * c : 0;
            const uint32_t o = (uint32_t)(r * Ly::ROW) + swz(r, c);
            cp_async16_s(dk + o, kc + src, ok);
            cp_async16_s(dv + o, vc + src, ok);
        }
        cp_async_commit();
    };
    // always ST - 1 commit groups here and one per tile below (issued after the tile's barrier), so
    // that the wait for tile it is "all but the newest ST - 2 groups"
    static_assert(ST == 3, "the prologue issues two tiles");
    if (ntile > 0) load(0, 0);
    else cp_async_commit();
    if (ntile > 1) load(1, 1);
    else cp_async_commit();
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int h = warp + NW * u;
        if (h < G) warp_norm_rope_regs<DPL>(qr[u], qw, fr, rd, p, eps, rsqrtf((float)HD), qs + h * HD);
    }
    if (last) adec_key_p<DPL, NT, VPT>(kr, kw, fr, rd, p, eps, vr, kc + p * kvw + (int64_t)kh * HD, vc + p * kvw + (int64_t)kh * HD, kp, vp, kpf);
    __syncthreads(); // qs, kp and vp visible to every warp
    mark(1);
    // Q^T as the B operand of S^T = K Q^T (k = head dim, n = head): lane (g, t) holds head g's dims
    // 16 ks + 2t, +1 (register 0) and 16 ks + 2t + 8, +9 (register 1), as hi and lo bf16 pieces;
    // heads >= G are zero (their scores are computed and never stored).
    uint32_t qh[KS][2], ql[KS][2];
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float *q = qs + g * HD + 16 * ks + 2 * t + 8 * r;
            if (g < G) attn_wg::split(q[0], q[1], qh[ks][r], ql[ks][r]);
            else qh[ks][r] = ql[ks][r] = 0u;
        }
    // O^T (head dim x head): o[mt][c] holds dim 16 mt + g + 8 (c >> 1), head 2t + (c & 1). The online
    // softmax of heads 2t and 2t + 1: their running max (the same in every lane of a t) and this
    // lane's share of their sums (its keys g and g + 8; summed over the lanes at the end).
    float o[KS][4];
#pragma unroll
    for (int mt = 0; mt < KS; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    // 16 keys (rows r0 .. r0 + 15 of the K and V tiles at shared addresses ka, va, cnt of them valid)
    auto keys16 = [&](uint32_t ka, uint32_t va, int r0, int cnt) {
        float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f}; // S^T: key r0 + g + 8 (c >> 1), head 2t + (c & 1)
        // A = K: ldmatrix's matrices (keys 0-7 | 8-15) x (dims 0-7 | 8-15 of the step), lane l giving row l & 7
        // of matrix l >> 3
        const int kr_ = r0 + (lane & 7) + ((lane >> 3) & 1) * 8, kc_ = lane >> 4;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            uint32_t a[4];
            ldsm_x4(a, ka + (uint32_t)(kr_ * Ly::ROW) + swz(kr_, 2 * ks + kc_));
            mma16816(sc, a, ql[ks][0], ql[ks][1]); // the small piece first
            mma16816(sc, a, qh[ks][0], qh[ks][1]);
        }
        if (g >= cnt) sc[0] = sc[1] = -INFINITY;
        if (g + 8 >= cnt) sc[2] = sc[3] = -INFINITY;
        float x0 = fmaxf(sc[0], sc[2]), x1 = fmaxf(sc[1], sc[3]);
#pragma unroll
        for (int o_ = 4; o_ < 32; o_ <<= 1) {
            x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, o_));
            x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, o_));
        }
        const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
        const float c0 = n0 == -INFINITY ? 1.0f : expf(m0 - n0), c1 = n1 == -INFINITY ? 1.0f : expf(m1 - n1);
        float pe[4];
#pragma unroll
        for (int c = 0; c < 4; c++) pe[c] = sc[c] == -INFINITY ? 0.0f : expf(sc[c] - (c & 1 ? n1 : n0));
        l0 = l0 * c0 + pe[0] + pe[2];
        l1 = l1 * c1 + pe[1] + pe[3];
        m0 = n0;
        m1 = n1;
#pragma unroll
        for (int mt = 0; mt < KS; mt++) {
            o[mt][0] *= c0;
            o[mt][2] *= c0;
            o[mt][1] *= c1;
            o[mt][3] *= c1;
        }
        // P^T as the B operand (k = key, n = head): the lane's pair (key g | g + 8, heads 2t, 2t + 1) is
        // row g of an 8 x 8 matrix (keys 0-7 | 8-15 x heads) in ldmatrix's map; transposed, lane (g, t)
        // holds keys 2t, 2t + 1 of head g, which is register 0 (1) of the B fragment
        uint32_t ph[2], pl[2];
        attn_wg::split(pe[0], pe[1], ph[0], pl[0]);
        attn_wg::split(pe[2], pe[3], ph[1], pl[1]);
        const uint32_t bh0 = movmatrix_t(ph[0]), bh1 = movmatrix_t(ph[1]), bl0 = movmatrix_t(pl[0]), bl1 = movmatrix_t(pl[1]);
        // A = V^T (head dim x key): ldmatrix.trans of the matrices (keys 0-7 | 8-15) x (dims 0-7 | 8-15 of
        // the m tile), in the order a0 (keys 0-7, dims 0-7), a1 (keys 0-7, dims 8-15), a2, a3 (keys 8-15)
        const int vr_ = r0 + (lane & 7) + (lane >> 4) * 8, vc_ = (lane >> 3) & 1;
#pragma unroll
        for (int mt = 0; mt < KS; mt++) {
            uint32_t a[4];
            ldsm_x4_t(a, va + (uint32_t)(vr_ * Ly::ROW) + swz(vr_, 2 * mt + vc_));
            mma16816(o[mt], a, bl0, bl1);
            mma16816(o[mt], a, bh0, bh1);
        }
    };
    for (int it = 0; it < ntile; it++) {
        const int b = it % ST;
        cp_async_wait<ST - 2>(); // all but the newest group: tile it has landed
        __syncthreads();         // tile it visible to every warp, and every warp is done with tile it - 1
        if (it == 0) mark(2);
        if (it + 2 < ntile) load(it + 2, (it + 2) % ST); // into the buffer tile it - 1 left
        else cp_async_commit();
        const int64_t t0 = j0 + (int64_t)it * TK;
        const int cnt = (int)(j1 - t0 < TK ? j1 - t0 : TK), r0 = 16 * warp;
        const uint32_t ka = s_kv + (uint32_t)(2 * b * Ly::TILE);
        if (r0 < cnt) keys16(ka, ka + Ly::TILE, r0, cnt - r0); // (warp-uniform)
    }
    cp_async_wait<0>();
    mark(3);
    if (last) { // key p, from shared memory: row 0 of buffer 0's first 16 rows, the others zero (warp 0's)
        __syncthreads(); // every warp is done with the tiles
        if (warp == 0) {
            const uint32_t ka = s_kv, va = ka + Ly::TILE;
            unsigned char *const kb = sm + Ly::KV, *const vb = kb + Ly::TILE;
            for (int i = lane; i < 16 * CPR; i += 32) {
                const int r = i / CPR, c = i % CPR;
                const uint32_t off = (uint32_t)(r * Ly::ROW) + swz(r, c);
                const uint4 z = make_uint4(0u, 0u, 0u, 0u);
                *reinterpret_cast<uint4 *>(kb + off) = r == 0 ? reinterpret_cast<const uint4 *>(kp)[c] : z;
                *reinterpret_cast<uint4 *>(vb + off) = r == 0 ? reinterpret_cast<const uint4 *>(vp)[c] : z;
            }
            __syncwarp();
            keys16(ka, va, 0, 1);
        }
    }
    // merge the warps: weights exp(m_w - M) per head, the weighted accumulators summed through shared memory
#pragma unroll
    for (int o_ = 4; o_ < 32; o_ <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o_);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o_);
    }
    __syncthreads(); // every warp is done with the tiles: their memory becomes red
    if (g == 0) {
        mls[warp][2 * t] = m0;
        mls[warp][2 * t + 1] = m1;
        lls[warp][2 * t] = l0;
        lls[warp][2 * t + 1] = l1;
    }
    __syncthreads();
    float M0 = -INFINITY, M1 = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; w++) {
        M0 = fmaxf(M0, mls[w][2 * t]);
        M1 = fmaxf(M1, mls[w][2 * t + 1]);
    }
    const float w0 = m0 == -INFINITY ? 0.0f : expf(m0 - M0), w1 = m1 == -INFINITY ? 0.0f : expf(m1 - M1);
    float *const rw = red + (size_t)warp * 8 * HD;
#pragma unroll
    for (int mt = 0; mt < KS; mt++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            rw[(2 * t + (c & 1)) * HD + 16 * mt + g + 8 * (c >> 1)] = o[mt][c] * (c & 1 ? w1 : w0);
    __syncthreads();
    adec_store<HD, NW, NT>(red, mls, lls, G, kh, s, S, part);
    mark(4);
}
