// cuda_attn_wg.cuh — the prefill flash attention on Hopper's warpgroup MMA (wgmma), head_dim 256.
//
// The same computation as k_attn_prefill (cuda_attn.cuh, whose header gives the semantics and
// the precision argument): causal GQA attention of a chunk of T queries at position *d_pos, Q
// (f32, scaled into the log2 domain) split into QP bf16 pieces, K and V exact from the bf16
// cache, online softmax in f32, P split into QP pieces, f32 accumulation, the sigmoid gate.
// The sums run in the same order (per 16-dim step the lo piece, then the hi piece, into one
// f32 accumulator), so the two kernels differ only in the tensor cores' summation inside a step.
//
// Why: k_attn_prefill feeds mma.sync one m16n8k16 at a time, loading every K and V fragment
// through ldmatrix; it ran at ~27% of the bf16 peak (test_attn) and made a 128k
// prefill attention-bound. Here wgmma.m64n64k16 reads K, V and Q from shared memory itself:
//  - S = Q K^T: A = the Q tile (K-major), B = the K tile (K-major); 16 dim steps x QP pieces.
//  - O += P V: A = P from registers (the S accumulator's map is the A fragment map), B = the V
//    tile read MN-major (the transpose flag: V is stored [key][dim], dims along the row);
//    4 key steps x 4 blocks of 64 dims x QP pieces, into four 64 x 64 accumulators (O is
//    64 x 256 per warpgroup: 128 f32 per thread).
// A block is one head's 64 queries (the grid of k_attn_prefill) and two warpgroups, which take
// the key tiles in turn (0, 2, 4, ... and 1, 3, 5, ...), each with its own online softmax, K
// tile and V tile, and meet once at the end, where warpgroup 1 hands its O, maxima and sums to
// warpgroup 0 (the flash-decoding merge). So one warpgroup's softmax and copies run while the
// other's MMAs do. K(j + 2) is copied as soon as S(j) is done, V(j + 2) once P V(j) is.
// Q, K and V tiles share one shared-memory layout (cuda_wgmma.cuh): 64 rows of 256 bf16 as 4
// blocks of 64 dims, 8 KB each, 128-byte swizzled; the copies write it directly.
// Shared memory: Q (QP x 32 KB) + 2 x (K, V) (128 KB): 192 KB at QP 2.
// Measured (test_attn, T = 2048, pos = 2048; docs/perf.md): k_attn_prefill 0.78 ms;
// one warpgroup per block 0.564; two 0.565; two with the copies' addresses hoisted (a whole tile
// copies without bounds checks) and the descriptors precomputed 0.505 (204 TFLOP/s useful).
//
// The CPU emulator (tests/cuda/emu: wgmma.h decodes both descriptor kinds) runs this kernel in
// CI (test_attn_wg_emu.cc); test_attn runs it on the device against the same reference as
// k_attn_prefill.
#pragma once
#include "cuda_wgmma.cuh"

namespace lilac_fa {
// Q's scale into the log2 domain of the scores: log2(e) / sqrt(hd) (both kernels round q times
// this to bf16; test_attn's one-piece reference takes the same product).
__host__ __device__ inline float q_scale(int hd) { return 1.4426950408889634f / sqrtf((float)hd); }
} // namespace lilac_fa

namespace attn_wg {
constexpr int HD = 256, BM = 64, BN = 64, NT = 256;
constexpr uint32_t TILE = 64 * HD * 2; // one 64-row operand: 4 blocks of 64 dims x 64 rows x 128 B
constexpr size_t smem(int qp) { return (size_t)(qp + 4) * TILE + 1024; } // Q, 2 x (K, V), alignment slack
// Byte offset in a tile of 16-byte chunk ch (dims 8 ch .. 8 ch + 7) of row r.
__device__ __forceinline__ uint32_t sw(int r, int ch) {
    return (uint32_t)((ch >> 3) * 8192 + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}
// 2^x (the MUFU's ex2, max relative error ~2^-22 as exp2f's, without its denormal-input scaling;
// 2^-inf = 0).
__device__ __forceinline__ float ex2(float x) {
#ifdef LILAC_CUEMU
    return exp2f(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#endif
}
// (a, b) rounded to a bf16x2 (a in the low half), to nearest even.
__device__ __forceinline__ uint32_t bf16x2_rn(float a, float b) {
#ifdef LILAC_CUEMU // finite values only, as here
    return wg_bf16_rn(a) | wg_bf16_rn(b) << 16;
#else
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&h);
#endif
}
// (a, b) = hi + lo, two bf16x2 (a in the low halves); both prefill attention kernels split Q and P so.
__device__ __forceinline__ void split(float a, float b, uint32_t &hi, uint32_t &lo) {
    hi = bf16x2_rn(a, b);
    lo = bf16x2_rn(a - __uint_as_float(hi << 16), b - __uint_as_float(hi & 0xFFFF0000u));
}
} // namespace attn_wg

namespace lilac_fa {
// One key tile's causal mask and online softmax, shared by both prefill attention kernels. s[4n + e]:
// the score (log2 domain) of key k0 + 8n + 2 tq + (e & 1) for row g + 8 (e >> 1) of the warp (a quad
// holds a row: the m16n8 accumulator map); keys past lim0 / lim1 (rows g / g + 8) are masked when
// `mask` (the tile crosses the diagonal). On return s holds the unnormalised probabilities, m the
// running maxima, l this thread's partial row sums, and c the factors the running output is scaled by.
template <int N>
__device__ __forceinline__ void tile_softmax(float (&s)[N], int k0, int tq, int lim0, int lim1, bool mask, float &m0,
                                             float &m1, float &l0, float &l1, float &c0, float &c1) {
    if (mask) {
#pragma unroll
        for (int n = 0; n < N / 4; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = k0 + n * 8 + 2 * tq + e;
                if (key > lim0) s[4 * n + e] = -INFINITY;
                if (key > lim1) s[4 * n + 2 + e] = -INFINITY;
            }
    }
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int n = 0; n < N / 4; n++) {
        mx0 = fmaxf(mx0, fmaxf(s[4 * n], s[4 * n + 1]));
        mx1 = fmaxf(mx1, fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float b0 = mx0 == -INFINITY ? 0.0f : mx0, b1 = mx1 == -INFINITY ? 0.0f : mx1;
    c0 = attn_wg::ex2(m0 - b0);
    c1 = attn_wg::ex2(m1 - b1);
    m0 = mx0;
    m1 = mx1;
    float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
    for (int n = 0; n < N / 4; n++) {
        s[4 * n] = attn_wg::ex2(s[4 * n] - b0);
        s[4 * n + 1] = attn_wg::ex2(s[4 * n + 1] - b0);
        s[4 * n + 2] = attn_wg::ex2(s[4 * n + 2] - b1);
        s[4 * n + 3] = attn_wg::ex2(s[4 * n + 3] - b1);
        rs0 += s[4 * n] + s[4 * n + 1];
        rs1 += s[4 * n + 2] + s[4 * n + 3];
    }
    l0 = l0 * c0 + rs0; // per-thread partial row sums; the quad is summed at the end
    l1 = l1 * c1 + rs1;
}
// The end of both kernels: a warp's 16 query rows of O (o[4n + e]: the m16n8 accumulator map, HD / 8
// accumulators), divided by the row sums (this thread's partial l, summed over the quad here), times
// sigmoid(gate), stored for tokens q0 + row < T of head h.
template <int HD>
__device__ __forceinline__ void store_gated(const float (&o)[HD / 2], float l0, float l1, const float *qg, float *out, int q0,
                                            int T, int nh, int h, int g, int tq) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int t = q0 + g + half * 8;
        if (t >= T) continue;
        const float inv = 1.0f / (half ? l1 : l0);
        const float *gate = qg + ((int64_t)t * nh + h) * 2 * HD + HD;
        float *dst = out + ((int64_t)t * nh + h) * HD;
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            const int d = n * 8 + 2 * tq;
            const float2 gv = *reinterpret_cast<const float2 *>(gate + d);
            float2 r;
            r.x = o[4 * n + 2 * half] * inv / (1.0f + expf(-gv.x));
            r.y = o[4 * n + 2 * half + 1] * inv / (1.0f + expf(-gv.y));
            *reinterpret_cast<float2 *>(dst + d) = r;
        }
    }
}
} // namespace lilac_fa

// Grid: ceil(T / 64) * nh blocks (heaviest query tiles first), 256 threads (two warpgroups),
// attn_wg::smem(QP) bytes of dynamic shared memory. hd 256.
template <int QP>
__global__ void __launch_bounds__(attn_wg::NT, 1)
    k_attn_wg(const float *qg, const __nv_bfloat16 *kc, const __nv_bfloat16 *vc, const int *d_pos, int T, int nh, int nkv,
              float *out) {
#if WG_ON
    using namespace attn_wg;
    pdl_wait();
    WG_SMEM(wg_smem_raw);
    unsigned char *const sm = wg_smem_raw + ((1024u - (smem_u32(wg_smem_raw) & 1023u)) & 1023u);
    const int tid = threadIdx.x, wgi = tid >> 7, lt = tid & 127, lane = tid & 31, warp = (tid >> 5) & 3;
    // Q (QP tiles), then each warpgroup's K and V tile
    const uint32_t sQh = smem_u32(sm), sQl = sQh + (QP - 1) * TILE, sK = sQh + (uint32_t)(QP + 2 * wgi) * TILE,
                   sV = sK + TILE;

    const int nqt = (T + BM - 1) / BM;
    const int qt = nqt - 1 - (int)(blockIdx.x / (unsigned)nh), h = (int)(blockIdx.x % (unsigned)nh);
    const int kh = h / (nh / nkv);
    const int q0 = qt * BM;
    const int pos = *d_pos;
    // Keys this block needs: [0, kv_end); rows past it are zero-filled in the tiles.
    const int kv_end = pos + (q0 + BM < T ? q0 + BM : T);
    const int ntiles = (kv_end + BN - 1) / BN;
    const int64_t kvw = (int64_t)nkv * HD;
    const __nv_bfloat16 *const kbase = kc + (int64_t)kh * HD, *const vbase = vc + (int64_t)kh * HD;

    // Key tile j of the cache (K or V) into this warpgroup's tile at dst, one commit group: chunk
    // i of this thread is dims 8 ch .. of key key0 + 4 i (a warp copies one key's 512 contiguous
    // bytes). Its swizzled place is dA or dB (by the parity of i) + 512 i: (key0 + 4 i) & 7 is
    // key0 + 4 (i & 1). Whole tiles copy without per-chunk bounds; the last one zero-fills past kv_end.
    const int key0 = lt >> 5, ch = lt & 31;
    const uint32_t xa = (uint32_t)(((ch & 7) ^ key0) << 4), dA = (uint32_t)((ch >> 3) * 8192 + key0 * 128) + xa,
                   dB = dA - xa + (xa ^ 64u);
    auto issue = [&](const __nv_bfloat16 *base, uint32_t dst, int j) {
        const __nv_bfloat16 *src = base + (int64_t)(j * BN + key0) * kvw + ch * 8;
        if (j * BN + BN <= kv_end) {
#pragma unroll
            for (int i = 0; i < BN / 4; i++) cp_async16_s(dst + ((i & 1) ? dB : dA) + 512u * i, src + i * 4 * kvw, true);
        } else {
#pragma unroll
            for (int i = 0; i < BN / 4; i++) {
                const bool ok = j * BN + key0 + 4 * i < kv_end;
                cp_async16_s(dst + ((i & 1) ? dB : dA) + 512u * i, ok ? src + i * 4 * kvw : base, ok);
            }
        }
        cp_async_commit();
    };
    // The warpgroups take the key tiles in turn: wgi, wgi + 2, ... Each has its K and V tile and
    // two commit groups in flight: K(j) and V(j), then V(j) and K(j + 2), then K(j + 2) and V(j + 2).
    if (wgi < ntiles) issue(kbase, sK, wgi), issue(vbase, sV, wgi);
    else cp_async_commit(), cp_async_commit();

    // Q tile: scaled into the log2 domain, split, into its swizzled places (rows past T: zero).
    {
        const float qs = lilac_fa::q_scale(HD);
#pragma unroll 4
        for (int i = 0; i < BM * 32 / NT; i++) {
            const int c = tid + i * NT, row = c >> 5, ch = c & 31, t = q0 + row;
            float4 v0 = make_float4(0.f, 0.f, 0.f, 0.f), v1 = v0;
            if (t < T) {
                const float4 *src = reinterpret_cast<const float4 *>(qg + ((int64_t)t * nh + h) * 2 * HD + ch * 8);
                v0 = src[0];
                v1 = src[1];
            }
            uint4 hi, lo;
            split(v0.x * qs, v0.y * qs, hi.x, lo.x);
            split(v0.z * qs, v0.w * qs, hi.y, lo.y);
            split(v1.x * qs, v1.y * qs, hi.z, lo.z);
            split(v1.z * qs, v1.w * qs, hi.w, lo.w);
            *reinterpret_cast<uint4 *>(sm + sw(row, ch)) = hi;
            if (QP == 2) *reinterpret_cast<uint4 *>(sm + TILE + sw(row, ch)) = lo;
        }
    }
    wg_proxy_fence(); // the Q tile's stores, visible to wgmma
    __syncthreads();

    const int g = lane >> 2, tq = lane & 3;
    const int lim0 = pos + q0 + warp * 16 + g, lim1 = lim0 + 8; // last key of rows g, g + 8
    const int diag = pos + q0;                                   // smallest limit in the block
    float o[4][32], s[32];                                       // O: 4 blocks of 64 dims
#pragma unroll
    for (int i = 0; i < 32; i++) o[0][i] = o[1][i] = o[2][i] = o[3][i] = s[i] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int bar = 1 + wgi; // this warpgroup's named barrier
    // the operands' descriptors (cuda_wgmma.cuh); a step's is the tile's plus its offset / 16
    const uint64_t dQh = wg_desc_k(sQh), dQl = wg_desc_k(sQl), dK = wg_desc_k(sK), dV = wg_desc_mn(sV, 8192);

    for (int j = wgi; j < ntiles; j += 2) {
        cp_async_wait<1>(); // this thread's chunks of K(j) have landed (V(j) may not have)
        wg_proxy_fence();
        bar_sync(bar, 128); // the warpgroup's

        // ---- S = Q K^T (log2 domain): dim step kk is block kk / 4, 32 bytes per step inside it
        wg_pin(s);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            const uint32_t ko = (uint32_t)((kk >> 2) * 8192 + (kk & 3) * 32) >> 4; // in the descriptors' 16-byte units
            if (QP == 2) wg_mma_64x64_ss(s, dQl + ko, dK + ko, kk > 0);
            wg_mma_64x64_ss(s, dQh + ko, dK + ko, QP == 2 || kk > 0);
        }
        wg_commit();
        wg_wait<0>();
        wg_pin(s);
        bar_sync(bar, 128); // every warp's S is complete: K(j + 2) may overwrite the tile
        if (j + 2 < ntiles) issue(kbase, sK, j + 2);
        else cp_async_commit();

        // ---- causal mask (only on tiles crossing the diagonal), online softmax
        float c0, c1;
        lilac_fa::tile_softmax(s, j * BN, tq, lim0, lim1, j * BN + BN - 1 > diag, m0, m1, l0, l1, c0, c1);
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int n = 0; n < 8; n++) {
                o[b][4 * n] *= c0;
                o[b][4 * n + 1] *= c0;
                o[b][4 * n + 2] *= c1;
                o[b][4 * n + 3] *= c1;
            }

        // ---- O += P V: P's key step ks is the A fragment (keys 16 ks + 2 tq (+8), rows g, g + 8)
        uint32_t ph[4][4], pl[4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            split(s[8 * ks], s[8 * ks + 1], ph[ks][0], pl[ks][0]);
            split(s[8 * ks + 2], s[8 * ks + 3], ph[ks][1], pl[ks][1]);
            split(s[8 * ks + 4], s[8 * ks + 5], ph[ks][2], pl[ks][2]);
            split(s[8 * ks + 6], s[8 * ks + 7], ph[ks][3], pl[ks][3]);
        }
        cp_async_wait<1>(); // this thread's chunks of V(j) have landed (K(j + 2) may not have)
        wg_proxy_fence();
        bar_sync(bar, 128);
#pragma unroll
        for (int b = 0; b < 4; b++) wg_pin(o[b]);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
#pragma unroll
            for (int b = 0; b < 4; b++) { // keys 16 ks .. (2 KB per step), dims 64 b .. (8 KB per block)
                const uint64_t dv = dV + (uint32_t)(ks * 2048 + b * 8192) / 16;
                if (QP == 2) wg_mma_64x64<1>(o[b], pl[ks], dv, 1);
                wg_mma_64x64<1>(o[b], ph[ks], dv, 1);
            }
        wg_commit();
        wg_wait<0>();
#pragma unroll
        for (int b = 0; b < 4; b++) wg_pin(o[b]);
        bar_sync(bar, 128); // every warp's P V is complete: V(j + 2) may overwrite the tile
        if (j + 2 < ntiles) issue(vbase, sV, j + 2);
        else cp_async_commit();
    }

    // ---- merge the warpgroups' partial results (as flash-decoding merges splits): warpgroup 1
    // hands its O, maxima and partial sums to warpgroup 0 through the (now free) K/V tiles,
    // thread lt to thread lt (the same rows and columns), element i of all threads contiguous.
    cp_async_wait<0>(); // (only empty groups are left)
    __syncthreads();
    float *const xb = reinterpret_cast<float *>(sm + QP * TILE);
    if (wgi == 1) {
#pragma unroll
        for (int i = 0; i < 32; i++)
#pragma unroll
            for (int b = 0; b < 4; b++) xb[(32 * b + i) * 128 + lt] = o[b][i];
        xb[128 * 128 + lt] = m0, xb[129 * 128 + lt] = m1, xb[130 * 128 + lt] = l0, xb[131 * 128 + lt] = l1;
    }
    __syncthreads();
    if (wgi == 1) return;
    {
        const float n0 = xb[128 * 128 + lt], n1 = xb[129 * 128 + lt];
        const float mm0 = fmaxf(m0, n0), mm1 = fmaxf(m1, n1); // finite: warpgroup 0 saw key 0
        const float a0 = ex2(m0 - mm0), a1 = ex2(m1 - mm1), e0 = ex2(n0 - mm0), e1 = ex2(n1 - mm1);
        l0 = l0 * a0 + xb[130 * 128 + lt] * e0;
        l1 = l1 * a1 + xb[131 * 128 + lt] * e1;
#pragma unroll
        for (int i = 0; i < 32; i++)
#pragma unroll
            for (int b = 0; b < 4; b++) o[b][i] = o[b][i] * ((i & 2) ? a1 : a0) + xb[(32 * b + i) * 128 + lt] * ((i & 2) ? e1 : e0);
    }

    // ---- normalise, gate, store (o's blocks of 64 dims in order are the m16n8 accumulators in order)
    lilac_fa::store_gated<HD>(reinterpret_cast<const float(&)[HD / 2]>(o), l0, l1, qg, out, q0 + warp * 16, T, nh, h, g, tq);
#else
    (void)qg, (void)kc, (void)vc, (void)d_pos, (void)T, (void)nh, (void)nkv, (void)out;
#ifdef __CUDA_ARCH__
    __trap(); // not the sm_90a image: the host never launches this (k_wg_probe)
#endif
#endif
}
