// cuda_attn.cuh — tensor-core flash attention for prefill (causal, GQA, gated).
//
// Semantics (as k_attn with one split): for token t of the chunk and query head h,
//   out[t][h][:] = softmax_j(q·k_j / sqrt(hd)) · V  over keys j <= pos + t,
//                  times sigmoid(gate[t][h][:]) elementwise,
// with qg [T][nh][2][hd] (query, then gate; after k_attn_prep), kc/vc [max_seq][nkv][hd]
// (rows [0, pos + T) valid), KV head of h = h / (nh / nkv), pos = *d_pos (read on the
// device: the kernel is also captured in CUDA graphs).
//
// Precision: K and V come from the cache in bf16, exact as bf16 MMA operands. Q (f32,
// scaled into the log2 domain) is split as q = hi + lo, two bf16 (bf16 rounds to 2^-8
// relative, so |q - hi - lo| <= 2^-16 |q|; f32's exponent range, so no scaling and no
// underflow), and S = lo K^T + hi K^T (two m16n8k16 MMAs, f32 accumulation): a score
// moves by at most 2^-16 sum_i |q_i k_i| (~2e-4 in log2 units for unit-RMS q and k at
// hd 256, ~1e-5 typically, the pieces' errors cancelling), 256x below what the cache's
// own rounding of K (up to 2^-8 per element: the model's, HF and MLX keep bf16 K/V) does.
// P (f32, in [0, 1]) is split the same way and P V = P_lo V + P_hi V (two MMAs). Softmax
// is online, in f32. Emulated on the CPU (exact fragment semantics, the reference on the
// same bf16 K/V in double), max|err| / max|ref| is 3.0e-6 .. 5.6e-6 up to 4,096 keys and
// 6.1e-6 at 40,064 (up to 5.9e-6 with the MMA sums rounded term by term). The f32-cache
// kernel emulated 3-5e-6 and measured 3-7e-6 up to 2,048 keys, 1-2e-5 at 4,096 and
// 1.5e-4 at 40,064 on the H200, whose MMA accumulation over long key ranges the
// emulation does not model. --attn-precision bf16 selects one bf16 piece each of Q and P
// (FlashAttention's precision; QP = 1 below): half the MMAs and Q's shared reads.
//
// Design (one block = 64 queries x one query head, 4 warps, each warp 16 query rows):
//  - Q tile: scaled by log2(e)/sqrt(hd), split into hi/lo bf16, kept in shared memory
//    (rows padded by 16 B so ldmatrix is bank-conflict free).
//  - K/V tiles of BN = 64 keys: cp.async of the bf16 cache rows (16 B chunks,
//    zero-filled past the last key the block needs) straight into the padded tiles
//    ldmatrix reads; NB = 2 buffers, so tile j+1 is in flight while tile j is computed;
//    one barrier per tile. (Against 32 keys and 3 buffers: each Q fragment read from
//    shared memory serves 64 keys, -6% kernel time, 128k prefill +4.4%.)
//  - S = Q K^T: ldmatrix (Q as A, K rows as B "col"), 2 MMAs per fragment pair; at 32
//    keys, two accumulator sets (by k-step parity) for more independent MMA chains.
//  - online softmax on the S fragments (exp2, quad shuffles), P re-used as the A
//    operand of P V straight from registers (split hi/lo), V via ldmatrix.trans;
//    O accumulator 16 x hd per warp in registers (128 f32 for hd 256).
//  - causal: a block visits only key tiles [0, ceil((pos + last query + 1) / BN));
//    the mask is applied only on tiles that cross the diagonal.
//  - blocks are issued heaviest (latest queries) first; heads sharing a KV head run
//    side by side and share the K/V tiles through L2 (8 MB of K/V at 4096 keys).
//  hd 256: 202,752 B of shared memory (1 block / SM; 135,168 with one piece), 255
//  registers and a 32-byte spill (none with one piece).
//
// Measured (test_attn, T = 2048, pos = 2048): 0.821 ms with 32-key tiles, 0.773
// with 64, 0.605 with 64 and one piece.
// Expected time (written for 32-key tiles; real case T = 2048, pos = 2048, nh 16, nkv 2, hd 256; 103 GFLOP of
// useful work, 206 GFLOP of 16-bit MMAs): per block and 32-key tile the SM moves
// ~224 KB through shared memory (ldmatrix 192 KB + cp.async 32 KB), ~1,750 cycles,
// while its 1,024 MMAs need ~1,400-1,700; ~376 tiles per SM. The kernel with f32 K/V
// (512 KB and 1,536 MMAs per tile: three MMAs per product, a conversion pass) measured
// 1.61 ms against ~4,000 cycles modelled per tile; scaled alike, this one
// should take ~0.8-1.1 ms.
//
// Long contexts with few query tiles (T small, pos large) launch only
// ceil(T/64) * nh blocks; correct but not spread over all SMs (no split over keys).
#pragma once
#include <stdint.h>

#include <atomic>

#include "cuda_common.cuh"
#include "cuda_attn_wg.cuh" // the wgmma kernel for hd 256 (and lilac_fa::q_scale)

namespace lilac_fa {

// Keys per tile and tile buffers: 64 keys read each Q fragment half as often per key as 32
// (128k prefill +4.4%).
#define FA_BN 64
#define FA_NB 2
constexpr int BM = 64;     // queries per block
constexpr int BN = FA_BN;  // keys per tile
constexpr int NT = 128;    // threads per block (4 warps x 16 query rows)
constexpr int NB = FA_NB;  // K/V tile buffers: NB - 1 tiles in flight while one is computed
constexpr int SP = BN >= 64 ? 1 : 2; // S accumulator sets (by k-step parity: independent MMA chains)
static_assert(NB >= 2 && BN % 16 == 0, "attention variant");

// QP: bf16 pieces of Q and of P (a template argument of the kernel): 2, hi + lo, the
// f32-faithful default; 1, one bf16 each, as FlashAttention does on the bf16 model
// (--attn-precision bf16: 128k prefill +16% over two pieces, max rel err 2.5-2.8e-3 at
// full size against the f32 reference, 9.5e-4 with two).
template <int HD, int QP = 2>
struct geom {
    static constexpr int LDS = HD + 8;                      // bf16 per smem row (pad 16 B)
    static constexpr size_t q_bytes = (size_t)BM * LDS * 2; // one of Qh, Ql
    static constexpr size_t t_bytes = (size_t)BN * LDS * 2; // one K or V tile buffer
    static constexpr size_t smem = QP * q_bytes + 2 * NB * t_bytes;
    static constexpr int QCPR = HD / 4;                     // Q: 16-byte chunks (4 f32) per row
    static constexpr int KCPR = HD / 8;                     // K/V: 16-byte chunks (8 bf16) per row
    static constexpr int KV_CPT = BN * KCPR / NT;           // K/V chunks per thread and tile
    static constexpr int Q_CPT = BM * QCPR / NT;            // Q chunks per thread
    static_assert(HD % 64 == 0, "head_dim must be a multiple of 64");
    static_assert((BN * KCPR) % NT == 0 && (BM * QCPR) % NT == 0, "chunking");
};


__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most N of this thread's newest commit groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }




// Split A times an exact B: c += (ah + al) b, the small term first (one piece: ah b).
template <int QP>
__device__ __forceinline__ void mma2(float (&c)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], uint32_t b0,
                                     uint32_t b1) {
    if (QP == 2) mma16816(c, al, b0, b1);
    mma16816(c, ah, b0, b1);
}

} // namespace lilac_fa

// Grid: ceil(T / 64) * nh blocks (1-D; heaviest query tiles first), 128 threads,
// lilac_fa::geom<HD, QP>::smem bytes of dynamic shared memory.
template <int HD, int QP>
__global__ void __launch_bounds__(lilac_fa::NT, 1)
    k_attn_prefill(const float *qg, const __nv_bfloat16 *kc, const __nv_bfloat16 *vc, const int *d_pos, int T, int nh,
                   int nkv, float *out) {
    namespace fa = lilac_fa;
    using G = fa::geom<HD, QP>;
    constexpr int BM = fa::BM, BN = fa::BN, NT = fa::NT, NB = fa::NB, SP = fa::SP;
    constexpr int LDS = G::LDS, QCPR = G::QCPR, KCPR = G::KCPR;
    pdl_wait();

    extern __shared__ __align__(16) unsigned char fa_smem[];
    uint16_t *const Qh = reinterpret_cast<uint16_t *>(fa_smem);
    uint16_t *const Ql = reinterpret_cast<uint16_t *>(fa_smem + (QP - 1) * G::q_bytes); // (QP 1: unused)
    // K tile buffers [NB][BN][LDS], then V tile buffers [NB][BN][LDS] (bf16, as cached)
    const uint32_t sKt = smem_u32(fa_smem + QP * G::q_bytes), sVt = sKt + (uint32_t)(NB * G::t_bytes);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nqt = (T + BM - 1) / BM;
    const int qt = nqt - 1 - (int)(blockIdx.x / (unsigned)nh), h = (int)(blockIdx.x % (unsigned)nh);
    const int kh = h / (nh / nkv);
    const int q0 = qt * BM;
    const int pos = *d_pos;
    // Keys this block needs: [0, kv_end); rows past it are zero-filled in the tiles.
    const int kv_end = pos + min(q0 + BM, T);
    const int ntiles = (kv_end + BN - 1) / BN;
    const int64_t kvw = (int64_t)nkv * HD;
    const __nv_bfloat16 *const kbase = kc + (int64_t)kh * HD;
    const __nv_bfloat16 *const vbase = vc + (int64_t)kh * HD;

    // Tile j of K and V into buffer b with cp.async, one commit group: thread tid copies
    // chunks tid + i*NT (chunk c: dims [8 (c % KCPR), +8) of key c / KCPR).
    auto issue_tile = [&](int j, int b) {
#pragma unroll
        for (int i = 0; i < G::KV_CPT; i++) {
            const int c = tid + i * NT, key = c / KCPR, col = (c % KCPR) * 8;
            const int kg = j * BN + key;
            const bool ok = kg < kv_end;
            const int64_t off = ok ? (int64_t)kg * kvw + col : 0;
            const uint32_t so = 2u * (uint32_t)((b * BN + key) * LDS + col);
            fa::cp_async16(sKt + so, kbase + off, ok ? 16 : 0);
            fa::cp_async16(sVt + so, vbase + off, ok ? 16 : 0);
        }
        fa::cp_async_commit();
    };

    // NB - 1 commit groups here and one per tile below, so that tile j's group is
    // complete when at most the NB - 2 newest are pending.
#pragma unroll
    for (int j = 0; j < NB - 1; j++) {
        if (j < ntiles) issue_tile(j, j);
        else fa::cp_async_commit();
    }

    // Q tile: scaled into the log2 domain, split, into shared memory (rows past T: zero).
    {
        const float qscale = fa::q_scale(HD);
#pragma unroll 8
        for (int i = 0; i < G::Q_CPT; i++) {
            const int c = tid + i * NT, row = c / QCPR, col = (c % QCPR) * 4;
            const int t = q0 + row;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (t < T) v = *reinterpret_cast<const float4 *>(qg + ((int64_t)t * nh + h) * 2 * HD + col);
            uint2 hi, lo;
            attn_wg::split(v.x * qscale, v.y * qscale, hi.x, lo.x);
            attn_wg::split(v.z * qscale, v.w * qscale, hi.y, lo.y);
            *reinterpret_cast<uint2 *>(Qh + row * LDS + col) = hi;
            if (QP == 2) *reinterpret_cast<uint2 *>(Ql + row * LDS + col) = lo;
        }
    }

    // Per-lane ldmatrix offsets (elements).
    const int wr = warp * 16;                                                      // warp's first row
    const int q_off = (wr + (lane & 15)) * LDS + (lane >> 4) * 8;                  // A: rows, k
    const int k_off = ((lane & 7) + ((lane >> 4) << 3)) * LDS + ((lane >> 3) & 1) * 8; // B from K rows
    const int v_off = (lane & 15) * LDS + (lane >> 4) * 8;                         // B from V (trans)
    const uint32_t sQh = smem_u32(Qh) + 2u * q_off, sQl = smem_u32(Ql) + 2u * q_off;
    const uint32_t sK = sKt + 2u * k_off, sV = sVt + 2u * v_off;

    const int g = lane >> 2, tq = lane & 3;
    const int lim0 = pos + q0 + wr + g, lim1 = lim0 + 8; // last key of rows g, g + 8
    const int diag = pos + q0;                           // smallest limit in the block

    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    for (int j = 0; j < ntiles; j++) {
        fa::cp_async_wait<NB - 2>(); // this thread's chunks of tile j have landed
        __syncthreads();             // everyone's (and the Q tile); every warp is done with tile j - 1
        if (j + NB - 1 < ntiles) issue_tile(j + NB - 1, (j + NB - 1) % NB); // into the buffer tile j - 1 left
        else fa::cp_async_commit();                                         // (an empty group keeps the count)
        const uint32_t tb = (uint32_t)((j % NB) * G::t_bytes), sKj = sK + tb, sVj = sV + tb;

        // ---- S = Q K^T (log2 domain)
        float sa[SP][BN / 8][4];
#pragma unroll
        for (int p = 0; p < SP; p++)
#pragma unroll
            for (int n = 0; n < BN / 8; n++) sa[p][n][0] = sa[p][n][1] = sa[p][n][2] = sa[p][n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t qh[4], ql[4] = {0u, 0u, 0u, 0u};
            ldsm_x4(qh, sQh + 2u * (kk * 16));
            if (QP == 2) ldsm_x4(ql, sQl + 2u * (kk * 16));
#pragma unroll
            for (int np = 0; np < BN / 16; np++) {
                uint32_t kf[4];
                ldsm_x4(kf, sKj + 2u * (np * 16 * LDS + kk * 16));
                fa::mma2<QP>(sa[kk % SP][2 * np], qh, ql, kf[0], kf[1]);
                fa::mma2<QP>(sa[kk % SP][2 * np + 1], qh, ql, kf[2], kf[3]);
            }
        }
        float s[BN / 2]; // s[4n + e]: the m16n8 accumulator n, element e
#pragma unroll
        for (int n = 0; n < BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[4 * n + e] = SP == 2 ? sa[0][n][e] + sa[SP - 1][n][e] : sa[0][n][e];

        // ---- causal mask (only on tiles crossing the diagonal), online softmax
        float c0, c1;
        fa::tile_softmax(s, j * BN, tq, lim0, lim1, j * BN + BN - 1 > diag, m0, m1, l0, l1, c0, c1);
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            o[n][0] *= c0;
            o[n][1] *= c0;
            o[n][2] *= c1;
            o[n][3] *= c1;
        }

        // ---- O += P V
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) {
            uint32_t ph[4], pl[4];
            attn_wg::split(s[8 * ks], s[8 * ks + 1], ph[0], pl[0]);
            attn_wg::split(s[8 * ks + 2], s[8 * ks + 3], ph[1], pl[1]);
            attn_wg::split(s[8 * ks + 4], s[8 * ks + 5], ph[2], pl[2]);
            attn_wg::split(s[8 * ks + 6], s[8 * ks + 7], ph[3], pl[3]);
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t vf[4];
                ldsm_x4_t(vf, sVj + 2u * (ks * 16 * LDS + dp * 16));
                fa::mma2<QP>(o[2 * dp], ph, pl, vf[0], vf[1]);
                fa::mma2<QP>(o[2 * dp + 1], ph, pl, vf[2], vf[3]);
            }
        }
    }

    // ---- normalise, gate, store
    fa::store_gated<HD>(reinterpret_cast<const float(&)[HD / 2]>(o), l0, l1, qg, out, q0 + wr, T, nh, h, g, tq);
}

// The opt-in above 48 KB of dynamic shared memory for kernel k, once per device (bit d of done).
static inline cudaError_t fa_smem_optin(const void *k, size_t sm, std::atomic<unsigned long long> &done) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    const unsigned long long bit = dev < 64 ? 1ull << dev : 0ull;
    if (!bit || !(done.load(std::memory_order_relaxed) & bit)) {
        e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        if (e != cudaSuccess) return e;
        done.fetch_or(bit, std::memory_order_relaxed);
    }
    return cudaSuccess;
}

template <int HD, int QP>
static inline cudaError_t attn_prefill_go(const float *qg, const __nv_bfloat16 *kc, const __nv_bfloat16 *vc,
                                          const int *d_pos, int T, int nh, int nkv, float *out, cudaStream_t st) {
    constexpr size_t sm = lilac_fa::geom<HD, QP>::smem;
    static std::atomic<unsigned long long> done{0};
    cudaError_t e = fa_smem_optin((const void *)k_attn_prefill<HD, QP>, sm, done);
    if (e != cudaSuccess) return e;
    const unsigned blocks = (unsigned)((T + lilac_fa::BM - 1) / lilac_fa::BM) * (unsigned)nh;
    k_attn_prefill<HD, QP><<<blocks, lilac_fa::NT, sm, st>>>(qg, kc, vc, d_pos, T, nh, nkv, out);
    return cudaGetLastError();
}
template <int QP>
static inline cudaError_t attn_wg_go(const float *qg, const __nv_bfloat16 *kc, const __nv_bfloat16 *vc, const int *d_pos,
                                     int T, int nh, int nkv, float *out, cudaStream_t st) {
    constexpr size_t sm = attn_wg::smem(QP);
    static std::atomic<unsigned long long> done{0};
    cudaError_t e = fa_smem_optin((const void *)k_attn_wg<QP>, sm, done);
    if (e != cudaSuccess) return e;
    const unsigned blocks = (unsigned)((T + attn_wg::BM - 1) / attn_wg::BM) * (unsigned)nh;
    k_attn_wg<QP><<<blocks, attn_wg::NT, sm, st>>>(qg, kc, vc, d_pos, T, nh, nkv, out);
    return cudaGetLastError();
}

// Causal gated attention of a prefill chunk of T tokens at position *d_pos (see the
// top of this file). hd 64, 128 or 256; nh a multiple of nkv; qp: pieces of Q and P (2,
// or 1 for FlashAttention's bf16 precision); wg: hd 256 on the wgmma kernel (cuda_attn_wg.cuh;
// only where k_wg_probe reports its sm_90a build). No host synchronisation.
static inline cudaError_t attn_prefill_launch(const float *qg, const __nv_bfloat16 *kc, const __nv_bfloat16 *vc,
                                              const int *d_pos, int T, int nh, int nkv, int hd, float *out, cudaStream_t st,
                                              int qp = 2, bool wg = false) {
    if (T <= 0) return cudaSuccess;
    if (nh <= 0 || nkv <= 0 || nh % nkv || (qp != 1 && qp != 2)) return cudaErrorInvalidValue;
    if (wg && hd == attn_wg::HD)
        return qp == 1 ? attn_wg_go<1>(qg, kc, vc, d_pos, T, nh, nkv, out, st)
                       : attn_wg_go<2>(qg, kc, vc, d_pos, T, nh, nkv, out, st);
#define LILAC_FA_GO(HD)                                                                                                 \
    return qp == 1 ? attn_prefill_go<HD, 1>(qg, kc, vc, d_pos, T, nh, nkv, out, st)                                    \
                   : attn_prefill_go<HD, 2>(qg, kc, vc, d_pos, T, nh, nkv, out, st)
    switch (hd) {
    case 64: LILAC_FA_GO(64);
    case 128: LILAC_FA_GO(128);
    case 256: LILAC_FA_GO(256);
    default: return cudaErrorInvalidValue;
    }
#undef LILAC_FA_GO
}
