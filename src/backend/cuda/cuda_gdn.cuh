// cuda_gdn.cuh — the Gated DeltaNet layer's kernels: the causal conv (with the q/k scaling and gates
// fused where dk = 128), k_gdn_prep, the serial recurrence k_gdn_recur, the one-token step k_gdn_step
// and the gated RMSNorm. (The chunked prefill form: cuda_gdn_chunk.cuh.) Each mirrors a step of
// src/backend/cpu/cpu_forward.c.
#pragma once
#include <cooperative_groups.h>
#include <mma.h>

#include "cuda_common.cuh"
#include "cuda_gemm4_tile.cuh" // g4_split: k_gated_norm writes its output split for out_proj

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
