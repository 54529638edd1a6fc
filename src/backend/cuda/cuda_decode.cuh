// cuda_decode.cuh — one decode step (a token through every layer, the head and,
// for greedy decoding, the pick) as a single persistent kernel, k_decode.
//
// Why: a decode step is ~250 small dependent steps. As separate kernels each
// one cost 5-9 us of fixed latency (launch, the previous grid draining, a DRAM
// round trip for weights nobody asked for early): 3 ms per token against
// 0.45 ms of weight streaming. Here every CTA of one grid stays resident (a
// cooperative launch), walks the phases of the step and meets the others at a
// grid barrier (about 1 us) only where a phase needs what another CTA wrote.
// Weights never depend on the token: at the start of each phase the CTAs ask
// the L2 to prefetch the weights of the phase after it (cp.async.bulk.prefetch),
// so the DRAM stream runs on across barriers; inside a GEMV phase each CTA
// prefetches its next unit while computing the current one.
//
// Phases of a layer (| = grid barrier):
//   P1 input projections (stage: residual + previous layer's MoE output or the
//      embedding row, RMSNorm; CTA 0 writes the new residual) |
//   P2 GDN step per (v-head, column chunk), or attention per (head, key split)
//      with the split merge done by the last CTA of each head |
//   P3 mixer output projection, accumulated into the residual |
//   P4 router logits + shared expert gate/up + its scalar gate |
//   P5 top-k (every CTA, same result), routed gate/up |
//   P6 routed down projections + shared down |
// then the head: final norm + lm_head, each CTA keeping the argmax of the rows
// it wrote; the last CTA to finish picks the token.
// The arithmetic of each step is that of the separate kernels (cuda_kernels.cuh,
// cuda_packed.cuh), so both paths agree with the CPU reference alike.
#pragma once
#include "cuda_packed.cuh"

struct dlayer {
    float *in_norm, *post_norm, *conv, *A_log, *dt_bias, *gdn_norm, *q_norm, *k_norm;
    dmat in_qkv, in_z, in_b, in_a, out_proj, q_proj, k_proj, v_proj, o_proj;
    dmat router, exp_gate, exp_up, exp_down, sh_gate, sh_up, sh_down, sh_expert_gate;
};

#define MK_THREADS 256
#define MK_MATS 4
#define MK_PH 5 // GEMV phases per layer: input, mixer out, router/shared, routed gate/up, down

// One matrix of a GEMV phase. Units: `ups` per routing slot (rbb row blocks of
// 16 rows when packed, 8 rows otherwise), slots = K when routed.
struct mk_mat {
    dmat W;
    float *y;
    int64_t ldy;   // output stride per routing slot
    int accum;     // y += W x (the residual stream)
    int routed;    // expert topi[slot]; output row slot
    int xper;      // staged input index advances with the slot (routed down); else xi
    int xi;        // staged input index
    int ns, rbb;   // column slices x row blocks per unit (packed)
    int ups;
};
struct mk_gemv {
    mk_mat m[MK_MATS];
    int n;
    int units[MK_MATS + 1];
};

struct mk_params {
    const dlayer *L;
    const unsigned char *is_full;
    float *const *conv, *const *ssm;                          // per layer
    __nv_bfloat16 *const *kc, *const *vc;                     // per layer: the KV cache
    const mk_gemv *ph;                                        // [layers * MK_PH], then the head
    dmat embed;
    const float *final_norm;
    int layers, H, E, K, norm_topk, I, SI;
    int Hk, Hv, dk, dv;
    int64_t CD, KD;
    int nh, nkv, hd, rot, S;
    double theta;
    float eps;
    float *x0, *x1, *qkv, *z, *bb, *ba, *o, *qg, *kx, *vx, *att, *part, *rlog, *shgu, *sg, *gu, *ye, *shy, *topw;
    int *topi;
    float *logits;
    int *d_ids, *d_pos, *ring, ring_size, *d_step;
    float *amax_v;
    int *amax_i;
    unsigned *bar; // [0] arrivals, [32] generation, [64] head arrivals, [96 + h] attention head h arrivals
    int64_t woff, wstride; // shared memory: weight buffers at float offset woff, two of wstride uint4
};

// ---------------------------------------------------------------- grid barrier, L2 prefetch

// (grid_sync and its helpers: cuda_common.cuh)

__device__ __forceinline__ void l2_prefetch(uintptr_t a, uint32_t n) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
}
// This CTA's share of [p, p + n) into the L2 (warp 0 calls it; 16-byte aligned pieces).
__device__ __noinline__ void prefetch_share(const void *p, int64_t n) {
    if (!p || n <= 0) return;
    const uintptr_t a = ((uintptr_t)p + 15) & ~(uintptr_t)15, e = ((uintptr_t)p + (uintptr_t)n) & ~(uintptr_t)15;
    if (e <= a) return;
    const uintptr_t share = (((e - a) / gridDim.x) + 4095) & ~(uintptr_t)4095;
    const uintptr_t lo = a + share * blockIdx.x, hi = lo + share < e ? lo + share : e;
    const uintptr_t piece = 16384;
    for (uintptr_t x = lo + (threadIdx.x & 31) * piece; x < hi; x += 32 * piece)
        l2_prefetch(x, (uint32_t)(hi - x < piece ? hi - x : piece));
}
// A matrix (or one expert of it), in the layout the GEMV reads.
__device__ __noinline__ void prefetch_mat(dmat W, int e) {
    if (e >= 0) W = dmat_expert(W, e);
    const int64_t rows = W.n_experts > 1 ? (int64_t)W.n_experts * W.stride : W.rows;
    if (W.pk) {
        const int64_t blocks = (W.n_experts > 1 ? W.n_experts : 1) * W.pk_rb * (W.cols / 64);
        prefetch_share(W.pk, blocks * 512);
        prefetch_share(W.psb, blocks * 64);
    } else if (W.type == 0) {
        prefetch_share(W.q, rows * W.cols * W.bits / 8);
        prefetch_share(W.s, rows * (W.cols / W.group) * 2);
        prefetch_share(W.b, rows * (W.cols / W.group) * 2);
    } else {
        prefetch_share(W.w, rows * W.cols * 2);
    }
}
__device__ __noinline__ void prefetch_gemv(const mk_gemv *J) {
    if (threadIdx.x >= 32) return;
    for (int i = 0; i < J->n; i++)
        if (!J->m[i].routed) prefetch_mat(J->m[i].W, -1);
}

// ---------------------------------------------------------------- staging (the GEMV input in shared memory)

// Staged inputs, `nin` of `cols` columns each, back to back: f32 (padded, row_dot
// reads it), bf16 hi/lo pairs (the tensor-core GEMV), f32 sums per 64 columns.
struct mk_stage {
    float *xs;
    uint32_t *xh2, *xl2;
    float *xsg;
    int cols, nin;
};
__host__ __device__ inline size_t mk_stage_bytes(int64_t total) {
    return sizeof(float) * (size_t)(total / 32 * 36) + 4 * (size_t)total + sizeof(float) * (size_t)(total / 64);
}
__device__ __forceinline__ mk_stage mk_stage_at(float *sm, int cols, int nin) {
    const int64_t total = (int64_t)cols * nin;
    mk_stage st;
    st.xs = sm;
    st.xh2 = (uint32_t *)(sm + total / 32 * 36);
    st.xl2 = st.xh2 + total / 2;
    st.xsg = (float *)(st.xl2 + total / 2);
    st.cols = cols;
    st.nin = nin;
    return st;
}

// Second half of every staging: xs (f32, complete) -> hi/lo pairs and group sums.
__device__ __forceinline__ void stage_split(const mk_stage st) {
    __syncthreads();
    const int64_t n4 = (int64_t)st.cols * st.nin / 4;
    for (int64_t base = 0; base < n4; base += MK_THREADS) {
        const int64_t q = base + threadIdx.x;
        const bool in = q < n4;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (in) {
            const float4 a = *(const float4 *)(st.xs + xs_idx(4 * q));
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        }
        float gs = (v[0] + v[1]) + (v[2] + v[3]);
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) gs += __shfl_xor_sync(0xffffffffu, gs, o);
        if (!in) continue;
        __nv_bfloat16 h[4], l[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            h[e] = __float2bfloat16(v[e]);
            l[e] = __float2bfloat16(v[e] - __bfloat162float(h[e]));
        }
        *(uint2 *)(st.xh2 + 2 * q) = *(const uint2 *)h;
        *(uint2 *)(st.xl2 + 2 * q) = *(const uint2 *)l;
        if ((threadIdx.x & 15) == 0) st.xsg[q / 16] = gs;
    }
    __syncthreads();
}

// The residual stream as a layer (or the head) reads it: x_in, plus the previous
// layer's MoE output when `combine` (the order of k_moe_combine), or embedding row
// `id` (id >= 0); CTA 0 stores that to x_out; then RMSNorm with `gain`.
__device__ __noinline__ void stage_resid(const mk_params &P, int id, const float *x_in, bool combine, float *x_out, const float *gain,
                            const mk_stage st, float *red) {
    const int H = P.H, K = P.K;
    float gs = 0.0f;
    if (combine) gs = 1.0f / (1.0f + expf(-__ldcg(P.sg)));
    __shared__ float tw[32];
    if (combine && threadIdx.x < K) tw[threadIdx.x] = __ldcg(P.topw + threadIdx.x);
    __syncthreads();
    float ss = 0.0f;
    for (int c4 = threadIdx.x; c4 < H / 4; c4 += MK_THREADS) {
        float v[4];
        if (id >= 0) {
            const dmat &E = P.embed;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t c = 4 * c4 + e;
                if (E.type == 1) {
                    v[e] = __bfloat162float(E.w[(int64_t)id * H + c]);
                } else {
                    const int per_word = 32 / E.bits;
                    const uint32_t mask = (1u << E.bits) - 1u;
                    const uint32_t w = E.q[(int64_t)id * (H / per_word) + c / per_word];
                    const float q = (float)((w >> ((c % per_word) * E.bits)) & mask);
                    const int64_t g = (int64_t)id * (H / E.group) + c / E.group;
                    v[e] = __bfloat162float(E.s[g]) * q + __bfloat162float(E.b[g]);
                }
            }
        } else {
            const float4 a = __ldcg((const float4 *)(x_in + 4 * c4));
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
            if (combine) {
                const float4 sh = __ldcg((const float4 *)(P.shy + 4 * c4));
                float a4[4] = {gs * sh.x, gs * sh.y, gs * sh.z, gs * sh.w};
                for (int k0 = 0; k0 < K; k0 += 8) { // eight expert rows' loads in flight at once
                    float4 y[8];
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        if (k0 + i < K) y[i] = __ldcg((const float4 *)(P.ye + (int64_t)(k0 + i) * H + 4 * c4));
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        if (k0 + i < K) {
                            const float w = tw[k0 + i];
                            a4[0] += w * y[i].x; a4[1] += w * y[i].y; a4[2] += w * y[i].z; a4[3] += w * y[i].w;
                        }
                }
#pragma unroll
                for (int e = 0; e < 4; e++) v[e] += a4[e];
            }
        }
        if (x_out && blockIdx.x == 0) *(float4 *)(x_out + 4 * c4) = make_float4(v[0], v[1], v[2], v[3]);
        ss += v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
        *(float4 *)(st.xs + xs_idx(4 * c4)) = make_float4(v[0], v[1], v[2], v[3]);
    }
    const float inv = rsqrtf(block_sum(ss, red) / (float)H + P.eps);
    for (int c4 = threadIdx.x; c4 < H / 4; c4 += MK_THREADS) {
        float4 *p = (float4 *)(st.xs + xs_idx(4 * c4));
        float4 v = *p;
        const float4 g = *(const float4 *)(gain + 4 * c4);
        v.x *= inv * g.x; v.y *= inv * g.y; v.z *= inv * g.z; v.w *= inv * g.w;
        *p = v;
    }
    stage_split(st);
}

// A plain input row (the attention output).
// Loads of the staging functions: up to MK_LD float4 per thread in flight at once.
#define MK_LD 6
__device__ __noinline__ void stage_plain(const float *x, const mk_stage st) {
    const int n4 = st.cols / 4;
    for (int base = 0; base < n4; base += MK_LD * MK_THREADS) {
        float4 v[MK_LD];
#pragma unroll
        for (int u = 0; u < MK_LD; u++) {
            const int q = base + u * MK_THREADS + threadIdx.x;
            if (q < n4) v[u] = __ldcg((const float4 *)(x + 4 * q));
        }
#pragma unroll
        for (int u = 0; u < MK_LD; u++) {
            const int q = base + u * MK_THREADS + threadIdx.x;
            if (q < n4) *(float4 *)(st.xs + xs_idx(4 * q)) = v[u];
        }
    }
    stage_split(st);
}

// The GDN output with its gated RMSNorm per v-head (the end of k_gdn_step).
__device__ __noinline__ void stage_gnorm(const mk_params &P, const float *nw, const mk_stage st, float *hs) {
    const int dv = P.dv, n = P.Hv * dv, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // n <= MK_LD * 4 * MK_THREADS (checked at set-up): o and z in one round trip; z waits in registers
    float4 zv[MK_LD], nv[MK_LD];
    {
        float4 ov[MK_LD];
#pragma unroll
        for (int u = 0; u < MK_LD; u++) {
            const int q = u * MK_THREADS + threadIdx.x;
            if (q < n / 4) {
                ov[u] = __ldcg((const float4 *)(P.o + 4 * q));
                zv[u] = __ldcg((const float4 *)(P.z + 4 * q));
                nv[u] = *(const float4 *)(nw + (4 * q) % dv);
            }
        }
#pragma unroll
        for (int u = 0; u < MK_LD; u++) {
            const int q = u * MK_THREADS + threadIdx.x;
            if (q < n / 4) *(float4 *)(st.xs + xs_idx(4 * q)) = ov[u];
        }
    }
    __syncthreads();
    for (int j = warp; j < P.Hv; j += MK_THREADS / 32) {
        float ss = 0.0f;
        for (int m = lane; m < dv; m += 32) {
            const float v = st.xs[xs_idx((int64_t)j * dv + m)];
            ss += v * v;
        }
        ss = warp_sum(ss);
        if (lane == 0) hs[j] = rsqrtf(ss / (float)dv + P.eps);
    }
    __syncthreads();
#pragma unroll 1
    for (int u = 0; u < MK_LD; u++) {
        const int q = u * MK_THREADS + threadIdx.x;
        if (q >= n / 4) continue;
        const float zz[4] = {zv[u].x, zv[u].y, zv[u].z, zv[u].w}, w4[4] = {nv[u].x, nv[u].y, nv[u].z, nv[u].w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int c = 4 * q + e, j = c / dv;
            float *p = st.xs + xs_idx(c);
            *p = *p * hs[j] * w4[e] * (zz[e] / (1.0f + expf(-zz[e])));
        }
    }
    stage_split(st);
}

// The down projections' inputs: SwiGLU of each routed slot's gate/up row, then
// the shared expert's.
__device__ __noinline__ void stage_swiglu(const mk_params &P, const mk_stage st) {
    const int I = st.cols, K = P.K, nq = (K + 1) * I / 4;
    for (int base = 0; base < nq; base += MK_LD * MK_THREADS) {
        float4 a[MK_LD], b[MK_LD];
#pragma unroll
        for (int u = 0; u < MK_LD; u++) {
            const int q = base + u * MK_THREADS + threadIdx.x;
            if (q < nq) {
                const int k = q / (I / 4), c = 4 * (q % (I / 4));
                const float *g = k < K ? P.gu + (int64_t)k * 2 * I + c : P.shgu + c;
                a[u] = __ldcg((const float4 *)g);
                b[u] = __ldcg((const float4 *)(g + (k < K ? I : P.SI)));
            }
        }
#pragma unroll 1
        for (int u = 0; u < MK_LD; u++) {
            const int q = base + u * MK_THREADS + threadIdx.x;
            if (q >= nq) continue;
            float4 v;
            v.x = a[u].x / (1.0f + expf(-a[u].x)) * b[u].x;
            v.y = a[u].y / (1.0f + expf(-a[u].y)) * b[u].y;
            v.z = a[u].z / (1.0f + expf(-a[u].z)) * b[u].z;
            v.w = a[u].w / (1.0f + expf(-a[u].w)) * b[u].w;
            *(float4 *)(st.xs + xs_idx(4 * (int64_t)q)) = v;
        }
    }
    stage_split(st);
}

// ---------------------------------------------------------------- GEMV phase

// Greedy pick bookkeeping: the best (value, row) a thread has written.
__device__ __forceinline__ void track_max(float v, int64_t r, float &bv, int &bi) {
    if (v > bv || (v == bv && r < bi)) { bv = v; bi = (int)r; }
}

// Unit u of J -> matrix, slot, unit within the slot.
__device__ __forceinline__ int mk_locate(const mk_gemv *J, int u, int &slot, int &ub) {
    int m = 0;
    while (m + 1 < J->n && u >= J->units[m + 1]) m++;
    const int lu = u - J->units[m], ups = J->m[m].ups;
    slot = lu / ups;
    ub = lu % ups;
    return m;
}

// Unit u's packed weights into the L2 (one thread).
__device__ __forceinline__ void unit_prefetch(const mk_gemv *J, int u, const int *topi) {
    if (u >= J->units[J->n]) return;
    int s2, u2;
    const mk_mat &M2 = J->m[mk_locate(J, u, s2, u2)];
    if (!M2.W.pk) return;
    dmat W2 = M2.W;
    if (M2.routed) W2 = dmat_expert(W2, topi[s2]);
    const int64_t ng2 = W2.cols / 64, rb0 = (int64_t)u2 * M2.rbb;
    const int64_t nrb = W2.pk_rb - rb0 < M2.rbb ? W2.pk_rb - rb0 : M2.rbb;
    if (nrb <= 0) return;
    l2_prefetch((uintptr_t)(W2.pk + rb0 * ng2 * 32), (uint32_t)(nrb * ng2 * 512));
    l2_prefetch((uintptr_t)(W2.psb + rb0 * ng2 * 16), (uint32_t)(nrb * ng2 * 64));
}

// Unit u's packed codes and scale/bias pairs into a shared-memory buffer
// (cp.async: every copy of the CTA in flight at once, rolled loops).
__device__ __forceinline__ void unit_issue(const mk_gemv *J, int u, const int *topi, uint4 *buf) {
    int slot, ub;
    const mk_mat &M = J->m[mk_locate(J, u, slot, ub)];
    if (!M.W.pk) return;
    const dmat W = M.routed ? dmat_expert(M.W, topi[slot]) : M.W;
    const int64_t ng = W.cols / 64, rb0 = (int64_t)ub * M.rbb;
    const int64_t nrb = W.pk_rb - rb0 < M.rbb ? W.pk_rb - rb0 : M.rbb;
    const uint4 *src = W.pk + rb0 * ng * 32, *ssrc = (const uint4 *)(W.psb + rb0 * ng * 16);
    for (int64_t i = threadIdx.x; i < nrb * ng * 32; i += MK_THREADS) cp_async16(buf + i, src + i, true);
    uint4 *sdst = buf + M.rbb * ng * 32;
    for (int64_t i = threadIdx.x; i < nrb * ng * 4; i += MK_THREADS) cp_async16(sdst + i, ssrc + i, true);
}

// row_dot once in the kernel's code (the unpacked matrices: router, shared-expert gate).
__device__ __noinline__ float row_dot_call(const dmat &W, int64_t r, const float *xs, int lane) { return row_dot(W, r, xs, lane); }

// Unit u, its weights in `buf` when packed.
__device__ __forceinline__ void unit_compute(const mk_gemv *J, int u, const mk_stage st, const int *topi, float (*pt)[17],
                                             bool track, float &bv, int &bi, const uint4 *buf) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    int slot, ub;
    const mk_mat &M = J->m[mk_locate(J, u, slot, ub)];
    const dmat W = M.routed ? dmat_expert(M.W, topi[slot]) : M.W;
    const int64_t off = (int64_t)(M.xper ? slot : M.xi) * st.cols;
    float *y = M.y + (M.routed ? (int64_t)slot * M.ldy : 0);
    if (!W.pk) { // one row per warp
        const int64_t r = (int64_t)ub * 8 + warp;
        float v = r < W.rows ? row_dot_call(W, r, st.xs + off / 32 * 36, lane) : 0.0f;
        v = warp_sum(v);
        if (lane == 0 && r < W.rows) {
            if (M.accum) y[r] += v;
            else y[r] = v;
            if (track) track_max(v, r, bv, bi);
        }
        return;
    }
    const uint32_t *xh2 = st.xh2 + off / 2, *xl2 = st.xl2 + off / 2;
    const float *xsg = st.xsg + off / 64;
    const int ns = M.ns, rbb = M.rbb, rl = warp % rbb, slice = warp / rbb;
    const int64_t ng = W.cols / 64, rb = (int64_t)ub * rbb + rl;
    const uint32_t *wsb = (const uint32_t *)(buf + rbb * ng * 32);
    float acc0 = 0.0f, acc1 = 0.0f; // rows 16rb+g and +8 (lanes with t == 0)
    if (rb < W.pk_rb) {
#pragma unroll 1
        for (int64_t G = slice; G < ng; G += ns) {
            const uint4 q = buf[(rl * ng + G) * 32 + lane];
            const uint32_t ps = wsb[(rl * ng + G) * 16 + g + 8 * (t & 1)];
            const uint32_t wq[4] = {q.x, q.y, q.z, q.w};
            float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                const int64_t kp = G * 32 + ks * 8 + t;
                const uint32_t *src = g == 0 ? xh2 : xl2;
                const uint32_t b0 = g < 2 ? src[kp] : 0u, b1 = g < 2 ? src[kp + 4] : 0u;
                const uint32_t a[4] = {pk_frag(wq[ks], 0), pk_frag(wq[ks], 1), pk_frag(wq[ks], 2), pk_frag(wq[ks], 3)};
                mma16816(p, a, b0, b1);
            }
            const uint32_t other = __shfl_down_sync(0xffffffffu, ps, 1);
            const float xg = xsg[G];
            acc0 += __uint_as_float(ps << 16) * (p[0] + p[1]) + __uint_as_float(ps & 0xFFFF0000u) * xg;
            acc1 += __uint_as_float(other << 16) * (p[2] + p[3]) + __uint_as_float(other & 0xFFFF0000u) * xg;
        }
    }
    if (t == 0) {
        pt[warp][g] = acc0;
        pt[warp][g + 8] = acc1;
    }
    __syncthreads();
    if (tid < 16 * rbb) {
        const int r0 = tid / 16, r = tid % 16;
        float v = 0.0f;
        for (int sl = 0; sl < ns; sl++) v += pt[sl * rbb + r0][r];
        const int64_t row = ((int64_t)ub * rbb + r0) * 16 + r;
        if (row < W.rows) {
            if (M.accum) y[row] += v;
            else y[row] = v;
            if (track) track_max(v, row, bv, bi);
        }
    }
}

// Every unit of J: CTA b takes units b, b + grid, ...  topi: the routed experts.
// Software-pipelined: the next unit's weights are copying into the other
// shared buffer (wb: two of wstride uint4) while this one computes, and the
// one after that is on its way into the L2.
__device__ __noinline__ void gemv_phase(const mk_gemv *J, const mk_stage st, const int *topi, float (*pt)[17], bool track,
                                        float &bv, int &bi, uint4 *wb, int64_t wstride) {
    const int total = J->units[J->n];
    int u = blockIdx.x;
    if (u >= total) return;
    unit_issue(J, u, topi, wb);
    cp_async_commit();
    for (int it = 0; u < total; u += gridDim.x, it++) {
        if (u + (int)gridDim.x < total) unit_issue(J, u + gridDim.x, topi, wb + ((it + 1) & 1) * wstride);
        cp_async_commit();
        if (threadIdx.x == 0) unit_prefetch(J, u + 2 * gridDim.x, topi);
        cp_async_wait<1>();
        __syncthreads();
        unit_compute(J, u, st, topi, pt, track, bv, bi, wb + (it & 1) * wstride);
        __syncthreads();
    }
    cp_async_wait<0>();
}

// ---------------------------------------------------------------- Gated DeltaNet step (k_gdn_step, split by columns)

// Task (v-head j, chunk of CW = 256/G state columns): the conv window of the
// head's q/k channels and its CW v channels, q/k L2 norms, gates, one
// recurrence step; writes the raw output (the gated norm is P3's staging).
template <int KPT, int G>
__device__ __noinline__ void mk_gdn(const mk_params &P, const dlayer &d, int l, int pos, float *sm, float *red) {
    constexpr int CW = MK_THREADS / G, dk = KPT * G, K = 4;
    float *qs = sm, *ks = qs + dk, *vsm = ks + dk, *pt = vsm + CW;
    const int dv = P.dv, nch = dv / CW, tasks = P.Hv * nch, rep = P.Hv / P.Hk;
    const int tid = threadIdx.x, m = tid % CW, g = tid / CW;
    const int64_t CD = P.CD, KD = P.KD;
    float *conv2 = P.conv[l], *ssm = P.ssm[l];
    const float *rd = conv2 + (int64_t)(pos & 1) * (K - 1) * CD;
    float *wr = conv2 + (int64_t)((pos + 1) & 1) * (K - 1) * CD;
    for (int task = blockIdx.x; task < tasks; task += gridDim.x) {
        const int j = task / nch, cc = task % nch, hk = j / rep, col = cc * CW + m;
        float *S = ssm + ((int64_t)j * dk + g * KPT) * dv + col;
        // every independent load first (one round trip): state, gates, conv windows and weights
        float sv[KPT];
#pragma unroll
        for (int i = 0; i < KPT; i++) sv[i] = S[(int64_t)i * dv];
        const float bbj = __ldcg(P.bb + j), baj = __ldcg(P.ba + j), dtb = d.dt_bias[j], alog = d.A_log[j];
        constexpr int NC = 2; // conv channels per thread: 2 dk + CW <= NC * MK_THREADS (checked at set-up)
        float win[NC][K], cw[NC][K];
        int64_t chs[NC];
#pragma unroll
        for (int u = 0; u < NC; u++) {
            const int i = tid + u * MK_THREADS;
            chs[u] = i < dk ? (int64_t)hk * dk + i
                   : i < 2 * dk ? KD + (int64_t)hk * dk + (i - dk)
                                : 2 * KD + (int64_t)j * dv + cc * CW + (i - 2 * dk);
            if (i < 2 * dk + CW) {
#pragma unroll
                for (int k = 0; k < K - 1; k++) win[u][k] = rd[k * CD + chs[u]];
                win[u][K - 1] = __ldcg(P.qkv + chs[u]);
#pragma unroll
                for (int k = 0; k < K; k++) cw[u][k] = d.conv[chs[u] * K + k];
            }
        }
        float sq = 0.0f, sk = 0.0f;
#pragma unroll
        for (int u = 0; u < NC; u++) {
            const int i = tid + u * MK_THREADS;
            if (i >= 2 * dk + CW) continue;
            gdn_conv_out<K>(i, dk, win[u], cw[u], i >= 2 * dk || (j % rep == 0 && cc == 0), wr, CD, chs[u], qs, ks, vsm, sq, sk);
        }
        sq = block_sum(sq, red);
        sk = block_sum(sk, red);
        const float qn = rsqrtf((float)dk) / sqrtf(sq + 1e-6f), kn = 1.0f / sqrtf(sk + 1e-6f);
        float beta, a;
        gdn_gates(bbj, baj, dtb, alog, beta, a);
        const float ot = gdn_column_step<KPT, G>(sv, S, dv, qs, ks, qn, kn, a, beta, vsm[m], pt, CW, m, g);
        if (g == 0) P.o[(int64_t)j * dv + col] = ot;
        __syncthreads();
    }
}

// ---------------------------------------------------------------- attention (k_attn_prep + k_attn + k_attn_combine)

// RMSNorm with `gain`, then RoPE on the first `rot` dims at position p (k_attn_prep).
__device__ __noinline__ void mk_norm_rope(const mk_params &P, const float *src, const float *gain, float *tmp, float *dst, int p,
                             float *red) {
    const int hd = P.hd, half = P.rot / 2;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hd; i += MK_THREADS) {
        const float v = __ldcg(src + i);
        tmp[i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, red) / (float)hd + P.eps);
    for (int i = threadIdx.x; i < hd; i += MK_THREADS) tmp[i] = tmp[i] * inv * gain[i];
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += MK_THREADS) {
        float v = tmp[i];
        if (i < P.rot) {
            const int fi = i < half ? i : i - half;
            const float inv_freq = (float)pow(P.theta, -2.0 * fi / P.rot);
            float sn, cs;
            sincosf((float)p * inv_freq, &sn, &cs);
            v = i < half ? tmp[i] * cs - tmp[i + half] * sn : tmp[i] * cs + tmp[i - half] * sn;
        }
        dst[i] = v;
    }
    __syncthreads();
}

// Task (query head h, key split s of S): q and, in the split holding the new
// position, its k/v rounded to bf16 as the cache holds them (the first query
// head of each group also stores them in the cache), so that the new key weighs
// as in later steps; 8 warps of online softmax; the last split of a head to
// finish merges the head's partials and applies the output gate.
template <int DPL>
__device__ __noinline__ void mk_attn(const mk_params &P, const dlayer &d, int l, int pos, float *sm, float *red) {
    constexpr int hd = DPL * 32, NW = MK_THREADS / 32;
    float *qs = sm, *kp = qs + hd, *vp = kp + hd, *tmp = vp + hd, *sacc = tmp + hd; // sacc [NW][hd]
    __shared__ float sm_m[NW], sm_l[NW], wsh[32], Lsh;
    __shared__ int last;
    const int nh = P.nh, S = P.S, grp = nh / P.nkv, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t kvw = (int64_t)P.nkv * hd, n = (int64_t)pos + 1;
    __nv_bfloat16 *kc = P.kc[l], *vc = P.vc[l];
    const float scale = rsqrtf((float)hd);
    for (int task = blockIdx.x; task < nh * S; task += gridDim.x) {
        const int h = task / S, s = task % S, kh = h / grp;
        const int64_t j0 = n * s / S, j1 = n * (s + 1) / S;
        mk_norm_rope(P, P.qg + (int64_t)h * 2 * hd, d.q_norm, tmp, qs, pos, red);
        if (s == S - 1) {
            mk_norm_rope(P, P.kx + (int64_t)kh * hd, d.k_norm, tmp, kp, pos, red);
            for (int i = threadIdx.x; i < hd; i += MK_THREADS) {
                const __nv_bfloat16 kb = __float2bfloat16_rn(kp[i]);
                const __nv_bfloat16 vb = __float2bfloat16_rn(__ldcg(P.vx + (int64_t)kh * hd + i));
                kp[i] = __bfloat162float(kb);
                vp[i] = __bfloat162float(vb);
                if (h % grp == 0) {
                    kc[(int64_t)pos * kvw + (int64_t)kh * hd + i] = kb;
                    vc[(int64_t)pos * kvw + (int64_t)kh * hd + i] = vb;
                }
            }
            __syncthreads();
        }
        float qr[DPL], acc[DPL];
#pragma unroll
        for (int e = 0; e < DPL; e++) {
            qr[e] = qs[lane * DPL + e] * scale;
            acc[e] = 0.0f;
        }
        float mx = -INFINITY, lsum = 0.0f;
        for (int64_t j = j0 + warp; j < j1; j += NW) {
            float kr[DPL], vr[DPL]; // key j: the new one from shared memory, the others from the cache
            if (j == pos) {
#pragma unroll
                for (int e = 0; e < DPL; e++) {
                    kr[e] = kp[lane * DPL + e];
                    vr[e] = vp[lane * DPL + e];
                }
            } else {
                const int64_t o = j * kvw + (int64_t)kh * hd + lane * DPL;
#pragma unroll
                for (int e = 0; e < DPL; e++) {
                    kr[e] = __bfloat162float(kc[o + e]);
                    vr[e] = __bfloat162float(vc[o + e]);
                }
            }
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < DPL; e++) dot += qr[e] * kr[e];
            dot = warp_sum(dot);
            const float mn = fmaxf(mx, dot), corr = expf(mx - mn), pj = expf(dot - mn);
            lsum = lsum * corr + pj;
#pragma unroll
            for (int e = 0; e < DPL; e++) acc[e] = acc[e] * corr + pj * vr[e];
            mx = mn;
        }
        if (lane == 0) { sm_m[warp] = mx; sm_l[warp] = lsum; }
#pragma unroll
        for (int e = 0; e < DPL; e++) sacc[warp * hd + lane * DPL + e] = acc[e];
        __syncthreads();
        float M = -INFINITY;
#pragma unroll
        for (int i = 0; i < NW; i++) M = fmaxf(M, sm_m[i]);
        float w[NW], L = 0.0f;
#pragma unroll
        for (int i = 0; i < NW; i++) {
            w[i] = sm_m[i] == -INFINITY ? 0.0f : expf(sm_m[i] - M);
            L += sm_l[i] * w[i];
        }
        float *pp = P.part + ((int64_t)h * S + s) * (hd + 2);
        for (int e = threadIdx.x; e < hd; e += MK_THREADS) {
            float a = 0.0f;
#pragma unroll
            for (int i = 0; i < NW; i++) a += sacc[i * hd + e] * w[i];
            pp[e] = a;
            if (e == 0) { pp[hd] = M; pp[hd + 1] = L; }
        }
        // the last split of head h merges the partials (k_attn_combine)
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            last = atomicAdd(P.bar + 96 + h, 1u) == (unsigned)S - 1;
        }
        __syncthreads();
        if (last) {
            __threadfence();
            const float *ph = P.part + (int64_t)h * S * (hd + 2);
            if (warp == 0) {
                const float m = lane < S ? __ldcg(ph + lane * (hd + 2) + hd) : -INFINITY;
                const float lv = lane < S ? __ldcg(ph + lane * (hd + 2) + hd + 1) : 0.0f;
                const float MM = warp_max(m);
                const float ww = m == -INFINITY ? 0.0f : expf(m - MM);
                wsh[lane] = ww;
                const float LL = warp_sum(lv * ww);
                if (lane == 0) Lsh = LL;
            }
            __syncthreads();
            const float invL = 1.0f / Lsh;
            const float *gate = P.qg + (int64_t)h * 2 * hd + hd;
            for (int e = threadIdx.x; e < hd; e += MK_THREADS) {
                float a = 0.0f;
                for (int q = 0; q < S; q++) a += __ldcg(ph + q * (hd + 2) + e) * wsh[q];
                P.att[(int64_t)h * hd + e] = a * invL / (1.0f + expf(-__ldcg(gate + e)));
            }
            if (threadIdx.x == 0) P.bar[96 + h] = 0;
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------- the step

// MINB: CTAs per SM the registers are budgeted for (1: up to 255 registers).
template <int KPT, int G, int DPL, int MINB>
__global__ void __launch_bounds__(MK_THREADS, MINB) k_decode(const mk_params *Pg, int argmax, unsigned long long *prof) {
    // The parameters live in global memory: device functions take them by
    // reference, which for a kernel parameter would copy them to every thread's stack.
    const mk_params &P = *Pg;
    extern __shared__ __align__(16) float mk_sm[];
    uint4 *wb = (uint4 *)(mk_sm + P.woff); // the GEMV weight buffers, after the staging area
    __shared__ float red[32], pt[8][17], hs[64];
    __shared__ int topi_s[32];
    __shared__ float topw_s[32];
    __shared__ int last;
    const int pos = *P.d_pos, id = P.d_ids[0], H = P.H, K = P.K;
    float bv = -INFINITY;
    int bi = 0x7fffffff, nb = 0;
    if (prof && threadIdx.x == 0) prof[gridDim.x + blockIdx.x] = gtimer(); // departure 0: the start
    nb = 1;
    // profile: the time a phase's staging ends (phases that stage), slot 2 * (6 layers + 2) + barrier
    const int mid0 = 2 * (6 * P.layers + 2);
#define MK_MID()                                                                                    \
    if (prof && threadIdx.x == 0) prof[(int64_t)(mid0 + nb) * gridDim.x + blockIdx.x] = gtimer();
    for (int l = 0; l < P.layers; l++) {
        const dlayer &d = P.L[l];
        const mk_gemv *ph = P.ph + (int64_t)l * MK_PH;
        const float *xin = (l & 1) ? P.x1 : P.x0;
        float *xout = (l & 1) ? P.x0 : P.x1;
        const bool full = P.is_full[l] != 0;
        // P1: input projections
        if (threadIdx.x < 32) {
            prefetch_gemv(ph + 1);
            if (full) {
                prefetch_share(P.kc[l], (int64_t)pos * P.nkv * P.hd * (int64_t)sizeof(__nv_bfloat16));
                prefetch_share(P.vc[l], (int64_t)pos * P.nkv * P.hd * (int64_t)sizeof(__nv_bfloat16));
            } else {
                prefetch_share(P.ssm[l], (int64_t)P.Hv * P.dk * P.dv * 4);
            }
        }
        mk_stage st = mk_stage_at(mk_sm, H, 1);
        stage_resid(P, l == 0 ? id : -1, xin, l > 0, xout, d.in_norm, st, red);
        MK_MID();
        gemv_phase(ph, st, topi_s, pt, false, bv, bi, wb, P.wstride);
        grid_sync(P.bar, prof, nb);
        // P2: the mixer's core
        prefetch_gemv(ph + 2);
        if (full) mk_attn<DPL>(P, d, l, pos, mk_sm, red);
        else mk_gdn<KPT, G>(P, d, l, pos, mk_sm, red);
        grid_sync(P.bar, prof, nb);
        // P3: output projection into the residual stream
        if (full) {
            st = mk_stage_at(mk_sm, P.nh * P.hd, 1);
            stage_plain(P.att, st);
        MK_MID();
        } else {
            st = mk_stage_at(mk_sm, P.Hv * P.dv, 1);
            stage_gnorm(P, d.gdn_norm, st, hs);
        MK_MID();
        }
        gemv_phase(ph + 1, st, topi_s, pt, false, bv, bi, wb, P.wstride);
        grid_sync(P.bar, prof, nb);
        // P4: router logits, shared expert gate/up and gate
        st = mk_stage_at(mk_sm, H, 1);
        stage_resid(P, -1, xout, false, nullptr, d.post_norm, st, red);
        MK_MID();
        gemv_phase(ph + 2, st, topi_s, pt, false, bv, bi, wb, P.wstride);
        grid_sync(P.bar, prof, nb);
        // P5: top-k, routed gate/up
        if (threadIdx.x < 32) {
            topk_warp<8>(P.rlog, P.E, K, P.norm_topk, topi_s, topw_s, nullptr, 0);
            __syncwarp();
            if (blockIdx.x == 0 && threadIdx.x < K) {
                P.topi[threadIdx.x] = topi_s[threadIdx.x];
                P.topw[threadIdx.x] = topw_s[threadIdx.x];
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            for (int k = 0; k < K; k++) prefetch_mat(d.exp_down, topi_s[k]);
            prefetch_mat(d.sh_down, -1);
        }
        // the input is P4's, still staged (nothing since wrote the staging area)
        MK_MID();
        gemv_phase(ph + 3, st, topi_s, pt, false, bv, bi, wb, P.wstride);
        grid_sync(P.bar, prof, nb);
        // P6: routed and shared down projections
        if (l + 1 < P.layers) prefetch_gemv(ph + MK_PH);
        st = mk_stage_at(mk_sm, P.I, K + 1);
        stage_swiglu(P, st);
        MK_MID();
        gemv_phase(ph + 4, st, topi_s, pt, false, bv, bi, wb, P.wstride);
        grid_sync(P.bar, prof, nb);
    }
    // head: final norm + lm_head (+ the greedy pick)
    const float *xl = (P.layers & 1) ? P.x1 : P.x0;
    mk_stage st = mk_stage_at(mk_sm, H, 1);
    stage_resid(P, -1, xl, P.layers > 0, nullptr, P.final_norm, st, red);
    const bool track = argmax != 0;
    gemv_phase(P.ph + (int64_t)P.layers * MK_PH, st, topi_s, pt, track, bv, bi, wb, P.wstride);
    if (prof && threadIdx.x == 0) prof[(2 * nb) * gridDim.x + blockIdx.x] = gtimer(); // arrival: the end
    if (!track) return;
    // block argmax -> partial; the last CTA reduces the partials
    {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        warp_argmax(bv, bi);
        __shared__ float wv[8];
        __shared__ int wi[8];
        if (lane == 0) { wv[warp] = bv; wi[warp] = bi; }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int i = 1; i < MK_THREADS / 32; i++)
                if (wv[i] > wv[0] || (wv[i] == wv[0] && wi[i] < wi[0])) { wv[0] = wv[i]; wi[0] = wi[i]; }
            P.amax_v[blockIdx.x] = wv[0];
            P.amax_i[blockIdx.x] = wi[0];
            __threadfence();
            last = atomicAdd(P.bar + 64, 1u) == gridDim.x - 1;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
        float v = -INFINITY;
        int i = 0x7fffffff;
        for (int b = threadIdx.x; b < (int)gridDim.x; b += MK_THREADS) {
            const float bvv = __ldcg(P.amax_v + b);
            const int bii = __ldcg(P.amax_i + b);
            if (bvv > v || (bvv == v && bii < i)) { v = bvv; i = bii; }
        }
        warp_argmax(v, i);
        if (lane == 0) { wv[warp] = v; wi[warp] = i; }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < MK_THREADS / 32; w++)
                if (wv[w] > wv[0] || (wv[w] == wv[0] && wi[w] < wi[0])) { wv[0] = wv[w]; wi[0] = wi[w]; }
            const int tok = wi[0] == 0x7fffffff ? 0 : wi[0]; // every logit NaN or -inf: token 0
            P.d_ids[0] = tok;
            if (P.ring) {
                const int s = *P.d_step;
                ((volatile int *)P.ring)[s % P.ring_size] = tok;
                *P.d_step = s + 1;
            }
            *P.d_pos = pos + 1;
            P.bar[64] = 0;
        }
    }
}
