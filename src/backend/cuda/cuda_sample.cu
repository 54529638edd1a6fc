// cuda_sample.cu — lilac_sample (src/model/sampler.c) on the device; see cuda_sample.cuh.
//
// The host algorithm, restated in terms of positions: after the penalties (w =
// penalised logits, NaN -> -inf), sort every token by (w descending, id
// ascending); the candidates are the prefix with x = (w - max)/T > -30, each with
// e = expf(x). top-k, top-p, min-p and the draw each cut or pick a prefix of that
// order: the sum over the first L1 = min(top_k, n) candidates, the first position
// whose cumulative mass reaches top_p * sum, the count with e/sum >= min_p * pmax,
// the first position whose cumulative mass exceeds u * tot. So the device never
// sorts the vocabulary; it answers "which element sits at position j" and "where
// does the cumulative mass first reach M":
//
//  k1 (vocabulary-wide, many blocks): penalties -> w, per-block argmax/min.
//  k2 (vocabulary-wide): e and a 2048-bucket histogram of the candidates over
//     x in [x_lo, 0] (count and mass per bucket; the bucket is monotone in w, so
//     buckets are contiguous runs of the sorted order).
//  k3 (one block): each query scans the histogram to its bucket, then gathers
//     that bucket (or every bucket up to it, when few) into shared memory, sorts
//     it by the 64-bit key (w's order bits, ~id) and reads the answer off prefix
//     sums; a bucket too large to sort is narrowed first by a radix descent over
//     the same 64-bit key (11 bits per level). Loaded runs are reused by the
//     next query when they hold its answer: a top-k request reads the vocabulary
//     once in k3.
//
// Masses are fixed-point integers (e * 2^F with V * 2^F <= 2^63): integer atomics
// make every sum exact and the result deterministic; the host sums doubles in
// sorted order, so the two differ by rounding only, i.e. only on near-ties.
// Float steps that decide membership use the same IEEE operations as the host
// (the _rn intrinsics keep nvcc from fusing them), and e is exp() in double
// rounded to float: correctly rounded like glibc's expf for all practical inputs.
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_sample.cuh"

typedef unsigned long long u64;

#define SMP_NB 2048   // buckets of k2's histogram; digits per radix level (11 bits)
#define SMP_CAP 2048  // elements k3 sorts in shared memory at once (power of two)
#define SMP_T12 256   // threads of k1 and k2
#define SMP_T3 1024   // threads of k3
#define SMP_GMAX 256  // blocks of k1 and k2
#define SMP_FULL 0xffffffffu

// Sampling parameters, in device memory so that a captured graph follows new requests.
struct smp_params {
    float temperature, top_p, min_p, presence, frequency, repetition;
    int top_k;
    int cap;        // elements sorted at once (<= SMP_CAP)
    double fscale;  // 2^F: fixed-point scale of the masses
};

struct smp_part {
    float vmax;  // largest w of the block, at imax (lowest index on ties)
    int imax;
    float vmin;  // smallest finite w of the block (+inf if none)
};

struct smp_args {
    const float *logits;
    int V, G, chunk;  // vocabulary; k1/k2 blocks and the vocabulary slice of each
    const smp_params *par;
    u64 *rng;               // xoshiro256** state [4]
    int *counts;            // [V] occurrences in the output
    unsigned char *seen;    // [V] in the prompt or the output
    float *w, *e;           // [V] penalised logits; e of candidates
    unsigned short *bkt;    // [V] bucket of candidates, 0xffff otherwise
    smp_part *part;         // [G]
    unsigned *hcnt;         // [SMP_NB]
    u64 *hmass;             // [SMP_NB]
    unsigned *misc;         // [0]: candidates with e > min_p, [1]: e == min_p
    int *res;               // host-mapped: [0] token, [1] error code (0: none)
};

// ---------------------------------------------------------------- small helpers

__device__ __forceinline__ int smp_imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ unsigned smp_umin(unsigned a, unsigned b) { return a < b ? a : b; }

// Order-preserving bits of a float (w is never NaN and never -0 here).
__device__ __forceinline__ unsigned smp_key(float w) {
    const unsigned u = __float_as_uint(w);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
// The sort key: descending order of it is the host's order (w descending, id ascending).
__device__ __forceinline__ u64 smp_k64(float w, int i) {
    return ((u64)smp_key(w) << 32) | (u64)(0xffffffffu - (unsigned)i);
}
__device__ __forceinline__ int smp_id(u64 k) { return (int)(0xffffffffu - (unsigned)(k & 0xffffffffu)); }
// Fixed-point mass; at least 1 so that every candidate advances the cumulative sums.
__device__ __forceinline__ u64 smp_fixed(float e, double fscale) {
    const u64 m = __double2ull_rn(__dmul_rn((double)e, fscale));
    return m ? m : 1;
}

// Buckets of entries 8g .. 8g+7 (fewer in the last group) into b[8] (0xffff past V):
// one 16-byte load. k3 reads the vocabulary with a single block, where loads in
// flight, not instructions, set the pace.
__device__ __forceinline__ void smp_bkt8(const unsigned short *bkt, int V, int g, unsigned *b) {
    if (8 * g + 8 <= V) {
        const uint4 q = reinterpret_cast<const uint4 *>(bkt)[g];
        const unsigned wd[4] = {q.x, q.y, q.z, q.w};
        for (int k = 0; k < 8; k++) b[k] = (wd[k >> 1] >> (k & 1 ? 16 : 0)) & 0xffffu;
    } else {
        for (int k = 0; k < 8; k++) b[k] = 8 * g + k < V ? bkt[8 * g + k] : 0xffffu;
    }
}

__device__ __forceinline__ u64 smp_warp_sum64(u64 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(SMP_FULL, v, o);
    return v;
}

// Histogram update by a whole warp (every lane calls it; `ok` says whether the
// lane has an element). A warp whose elements share one digit adds once: the
// flat and tied distributions put nearly everything into one bucket.
__device__ __forceinline__ void smp_hist_add(unsigned *cnt, u64 *mass, bool ok, unsigned d, u64 m) {
    const unsigned act = __ballot_sync(SMP_FULL, ok);
    if (!act) return;
    const int lane = threadIdx.x & 31, lead = __ffs(act) - 1;
    const unsigned d0 = __shfl_sync(SMP_FULL, d, lead);
    if (__all_sync(SMP_FULL, !ok || d == d0)) {
        const u64 s = smp_warp_sum64(ok ? m : 0);
        if (lane == lead) {
            atomicAdd(&cnt[d0], (unsigned)__popc(act));
            atomicAdd(&mass[d0], s);
        }
    } else if (ok) {
        atomicAdd(&cnt[d], 1u);
        atomicAdd(&mass[d], m);
    }
}

// Block-wide (max w, lowest index) and min; the result in rv[0], ri[0], rmin[0].
__device__ void smp_block_argmax(float v, int idx, float mn, float *rv, int *ri, float *rmin) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(SMP_FULL, v, o);
        const int oi = __shfl_xor_sync(SMP_FULL, idx, o);
        const float om = __shfl_xor_sync(SMP_FULL, mn, o);
        if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
        mn = fminf(mn, om);
    }
    if (lane == 0) { rv[wid] = v; ri[wid] = idx; rmin[wid] = mn; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < nw; i++) {
            if (rv[i] > rv[0] || (rv[i] == rv[0] && ri[i] < ri[0])) { rv[0] = rv[i]; ri[0] = ri[i]; }
            rmin[0] = fminf(rmin[0], rmin[i]);
        }
    }
    __syncthreads();
}

// The argmax of the penalised logits (the host's `best`) and the smallest finite w,
// from k1's per-block partials; every block computing it gets the same values.
__device__ void smp_reduce_parts(const smp_args &a, float *rv, int *ri, float *rmin, float &mx, int &best, float &wmin) {
    float v = -INFINITY, mn = INFINITY;
    int idx = INT_MAX;
    for (int g = threadIdx.x; g < a.G; g += blockDim.x) {
        const smp_part p = a.part[g];
        if (p.vmax > v || (p.vmax == v && p.imax < idx)) { v = p.vmax; idx = p.imax; }
        mn = fminf(mn, p.vmin);
    }
    smp_block_argmax(v, idx, mn, rv, ri, rmin);
    mx = rv[0];
    best = ri[0];
    wmin = rmin[0];
}

__device__ __forceinline__ bool smp_greedy(const smp_params &p) { return p.temperature <= 0 || p.top_k == 1; }

// ---------------------------------------------------------------- k1: penalties, argmax

__global__ void __launch_bounds__(SMP_T12) smp_k1(smp_args a) {
    __shared__ float rv[32], rmin[32];
    __shared__ int ri[32];
    const smp_params p = *a.par;
    const int t = threadIdx.x, b = blockIdx.x;
    // k2 accumulates into these; k2 starts after k1 has completed
    for (int i = b * blockDim.x + t; i < SMP_NB; i += gridDim.x * blockDim.x) {
        a.hcnt[i] = 0;
        a.hmass[i] = 0;
    }
    if (b == 0 && t < 2) a.misc[t] = 0;
    const bool rep = p.repetition > 0 && p.repetition != 1.0f;
    const bool pf = p.presence != 0 || p.frequency != 0;
    const int lo = b * a.chunk, hi = smp_imin(a.V, lo + a.chunk);
    float vmax = -INFINITY, vmin = INFINITY;
    int imax = INT_MAX;
    for (int i = lo + t; i < hi; i += blockDim.x) {
        float v = a.logits[i];
        if (rep && a.seen[i]) v = v > 0 ? __fdiv_rn(v, p.repetition) : __fmul_rn(v, p.repetition);
        if (pf && a.counts[i]) v = __fsub_rn(v, __fadd_rn(p.presence, __fmul_rn(p.frequency, (float)a.counts[i])));
        if (isnan(v)) v = -INFINITY;
        if (v == 0.0f) v = 0.0f;  // -0 == +0 on the host (a tie): one key for both
        a.w[i] = v;
        if (v > vmax || (v == vmax && i < imax)) { vmax = v; imax = i; }
        if (v < vmin && isfinite(v)) vmin = v;
    }
    smp_block_argmax(vmax, imax, vmin, rv, ri, rmin);
    if (t == 0) a.part[b] = smp_part{rv[0], ri[0], rmin[0]};
}

// ---------------------------------------------------------------- k2: e and the bucket histogram

__global__ void __launch_bounds__(SMP_T12) smp_k2(smp_args a) {
    __shared__ unsigned hc[SMP_NB];
    __shared__ u64 hm[SMP_NB];
    __shared__ float rv[32], rmin[32];
    __shared__ int ri[32];
    __shared__ unsigned cgt[32], ceq[32];
    const smp_params p = *a.par;
    const int t = threadIdx.x, b = blockIdx.x, lane = t & 31, wid = t >> 5;
    float mx, wmin;
    int best;
    smp_reduce_parts(a, rv, ri, rmin, mx, best, wmin);
    // Greedy, or no candidate at all (max w infinite): k3 needs nothing from here.
    if (smp_greedy(p) || !isfinite(mx)) return;
    const float T = p.temperature;
    // Buckets split x in [x_lo, 0] evenly; bucket(x) never decreases as x does.
    float xlo = __fdiv_rn(__fsub_rn(wmin, mx), T);
    if (!(xlo > -30.0f)) xlo = -30.0f;
    float bs = xlo < 0.0f ? __fdiv_rn((float)SMP_NB, -xlo) : 0.0f;
    if (!isfinite(bs)) bs = 0.0f;
    for (int i = t; i < SMP_NB; i += blockDim.x) {
        hc[i] = 0;
        hm[i] = 0;
    }
    __syncthreads();
    unsigned gt = 0, eq = 0;
    const int lo = b * a.chunk, hi = smp_imin(a.V, lo + a.chunk);
    for (int base = lo; base < hi; base += blockDim.x) {  // uniform trip count: smp_hist_add needs whole warps
        const int i = base + t;
        bool ok = false;
        unsigned d = 0;
        u64 m = 0;
        if (i < hi) {
            const float x = __fdiv_rn(__fsub_rn(a.w[i], mx), T);
            ok = x > -30.0f;
            if (ok) {
                const float e = __double2float_rn(exp((double)x));
                a.e[i] = e;
                m = smp_fixed(e, p.fscale);
                const float f = __fmul_rn(-x, bs);
                d = f < (float)(SMP_NB - 1) ? (unsigned)f : SMP_NB - 1;
                gt += e > p.min_p;
                eq += e == p.min_p;
            }
            a.bkt[i] = ok ? (unsigned short)d : (unsigned short)0xffff;
        }
        smp_hist_add(hc, hm, ok, d, m);
    }
    for (int o = 16; o > 0; o >>= 1) {
        gt += __shfl_xor_sync(SMP_FULL, gt, o);
        eq += __shfl_xor_sync(SMP_FULL, eq, o);
    }
    if (lane == 0) { cgt[wid] = gt; ceq[wid] = eq; }
    __syncthreads();
    if (t == 0) {
        unsigned g = 0, q = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) { g += cgt[i]; q += ceq[i]; }
        if (g) atomicAdd(&a.misc[0], g);
        if (q) atomicAdd(&a.misc[1], q);
    }
    for (int i = t; i < SMP_NB; i += blockDim.x)
        if (hc[i]) {
            atomicAdd(&a.hcnt[i], hc[i]);
            atomicAdd(&a.hmass[i], hm[i]);
        }
}

// ---------------------------------------------------------------- k3: the queries

struct smp_sh {
    union {
        struct {
            unsigned cnt[SMP_NB];
            u64 mass[SMP_NB];
        } h;               // a radix level's histogram
        u64 cm[SMP_CAP];   // inclusive prefix masses of buf (relative to bm)
    } u;
    u64 buf[SMP_CAP];      // loaded run of the sorted order: keys, descending
    unsigned wc[32];       // scan scratch
    u64 wm[32];
    float rv[32], rmin[32];
    int ri[32];
    // The loaded run: sorted positions [bc, bc + m), mass bm before it.
    int loaded;
    unsigned m, bc;
    u64 bm;
    // smp_find's answer
    int fd_found;
    unsigned fd_d, fd_bc, fd_cnt;
    u64 fd_bm;
    unsigned nbuf;
    int res_idx, err;
    double draw;  // the uniform draw in [0, 1)
};

// Block-wide exclusive scan of (count, mass) pairs in place; *tc, *tm: totals.
__device__ void smp_scan2(unsigned &c, u64 &m, smp_sh &sh, unsigned *tc, u64 *tm) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned ic = c;
    u64 im = m;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned yc = __shfl_up_sync(SMP_FULL, ic, o);
        const u64 ym = __shfl_up_sync(SMP_FULL, im, o);
        if (lane >= o) { ic += yc; im += ym; }
    }
    if (lane == 31) { sh.wc[wid] = ic; sh.wm[wid] = im; }
    __syncthreads();
    if (wid == 0) {
        unsigned xc = lane < nw ? sh.wc[lane] : 0;
        u64 xm = lane < nw ? sh.wm[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned yc = __shfl_up_sync(SMP_FULL, xc, o);
            const u64 ym = __shfl_up_sync(SMP_FULL, xm, o);
            if (lane >= o) { xc += yc; xm += ym; }
        }
        if (lane < nw) { sh.wc[lane] = xc; sh.wm[lane] = xm; }
    }
    __syncthreads();
    const unsigned oc = wid ? sh.wc[wid - 1] : 0;
    const u64 om = wid ? sh.wm[wid - 1] : 0;
    if (tc) *tc = sh.wc[nw - 1];
    if (tm) *tm = sh.wm[nw - 1];
    c = oc + ic - c;
    m = om + im - m;
    __syncthreads();
}

// Whether the cumulative (count c, mass m) up to and including an element has
// reached the target: position `target` (counts) or mass `target`.
__device__ __forceinline__ bool smp_reached(bool mass, u64 target, unsigned c, u64 m) {
    return mass ? m >= target : c > target;
}

// Scan nd histogram digits (descending digit order when `desc`: larger keys come
// first) from the cumulative (bc0, bm0) to the digit where the target is reached.
// Answer in sh.fd_*; sh.fd_found = 0 if it is never reached.
__device__ void smp_find(const unsigned *cnt, const u64 *mass, int nd, bool desc, bool bymass, u64 target, unsigned bc0,
                         u64 bm0, smp_sh &sh) {
    const int bd = blockDim.x, per = (nd + bd - 1) / bd;
    const int s0 = smp_imin(nd, threadIdx.x * per), s1 = smp_imin(nd, s0 + per);
    unsigned c = 0;
    u64 m = 0;
    for (int s = s0; s < s1; s++) {
        const int d = desc ? nd - 1 - s : s;
        c += cnt[d];
        m += mass[d];
    }
    if (threadIdx.x == 0) sh.fd_found = 0;
    smp_scan2(c, m, sh, nullptr, nullptr);
    unsigned cc = bc0 + c;
    u64 cm = bm0 + m;
    for (int s = s0; s < s1; s++) {
        const int d = desc ? nd - 1 - s : s;
        const unsigned nc = cc + cnt[d];
        const u64 nm = cm + mass[d];
        if (smp_reached(bymass, target, nc, nm) && !smp_reached(bymass, target, cc, cm)) {
            sh.fd_d = (unsigned)d;
            sh.fd_bc = cc;
            sh.fd_bm = cm;
            sh.fd_cnt = cnt[d];
            sh.fd_found = 1;
        }
        cc = nc;
        cm = nm;
    }
    __syncthreads();
}

__device__ void smp_sort_desc(u64 *buf, unsigned P) {  // bitonic, P a power of two
    for (unsigned k = 2; k <= P; k <<= 1)
        for (unsigned j = k >> 1; j > 0; j >>= 1) {
            for (unsigned i = threadIdx.x; i < P; i += blockDim.x) {
                const unsigned l = i ^ j;
                if (l > i) {
                    const u64 x = buf[i], y = buf[l];
                    if ((i & k) == 0 ? x < y : x > y) { buf[i] = y; buf[l] = x; }
                }
            }
            __syncthreads();
        }
}

// Load the candidates with bucket in [blo, bhi] and (unless shift == 64) key >> shift
// == pfx: `expect` of them, a contiguous run of the sorted order starting at
// position bc with mass bm before it. Sort them and compute their prefix masses.
__device__ void smp_load(const smp_args &a, const smp_params &p, smp_sh &sh, unsigned blo, unsigned bhi, int shift,
                         u64 pfx, unsigned expect, unsigned bc, u64 bm) {
    const int t = threadIdx.x, bd = blockDim.x, lane = t & 31;
    if (t == 0) { sh.nbuf = 0; sh.loaded = 0; }
    __syncthreads();
    const int ng = (a.V + 7) / 8;
    const unsigned range = bhi - blo;
    for (int base = 0; base < ng; base += bd) {  // uniform trip count: warp votes below
        const int g = base + t;
        unsigned b[8], hit = 0;
        if (g < ng) {
            smp_bkt8(a.bkt, a.V, g, b);
            for (int k = 0; k < 8; k++) hit |= (unsigned)(b[k] - blo <= range) << k;  // blo <= b <= bhi
            if (hit && shift < 64)
                for (int k = 0; k < 8; k++)
                    if ((hit >> k & 1) && (smp_k64(a.w[8 * g + k], 8 * g + k) >> shift) != pfx) hit &= ~(1u << k);
        }
        if (!__any_sync(SMP_FULL, hit != 0)) continue;
        // the warp's matches go to consecutive slots: exclusive prefix of the counts
        const unsigned c = (unsigned)__popc(hit);
        unsigned incl = c;
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned y = __shfl_up_sync(SMP_FULL, incl, o);
            if (lane >= o) incl += y;
        }
        const unsigned wtot = __shfl_sync(SMP_FULL, incl, 31);
        unsigned wbase = 0;
        if (lane == 0) wbase = atomicAdd(&sh.nbuf, wtot);
        unsigned pos = __shfl_sync(SMP_FULL, wbase, 0) + incl - c;
        for (int k = 0; k < 8; k++)
            if (hit >> k & 1) {
                if (pos < SMP_CAP) sh.buf[pos] = smp_k64(a.w[8 * g + k], 8 * g + k);
                pos++;
            }
    }
    __syncthreads();
    const unsigned m = sh.nbuf;
    if (m != expect || m == 0 || m > SMP_CAP) {
        if (t == 0) sh.err = 1;
        __syncthreads();
        return;
    }
    unsigned P = 1;
    while (P < m) P <<= 1;
    for (unsigned i = m + t; i < P; i += bd) sh.buf[i] = 0;  // 0 sorts last
    __syncthreads();
    smp_sort_desc(sh.buf, P);
    const unsigned per = (m + bd - 1) / bd, s0 = smp_umin(m, t * per), s1 = smp_umin(m, s0 + per);
    u64 loc = 0;
    for (unsigned s = s0; s < s1; s++) loc += smp_fixed(a.e[smp_id(sh.buf[s])], p.fscale);
    unsigned dummy = 0;
    smp_scan2(dummy, loc, sh, nullptr, nullptr);
    for (unsigned s = s0; s < s1; s++) {
        loc += smp_fixed(a.e[smp_id(sh.buf[s])], p.fscale);
        sh.u.cm[s] = loc;
    }
    if (t == 0) { sh.m = m; sh.bc = bc; sh.bm = bm; sh.loaded = 1; }
    __syncthreads();
}

// Bucket d0 holds the target but more than `cap` elements: narrow it 11 bits of
// the key at a time (the key is unique, so this ends by the sixth level), then load.
__device__ void smp_radix(const smp_args &a, const smp_params &p, smp_sh &sh, unsigned d0, bool bymass, u64 target,
                          unsigned bc, u64 bm, unsigned cap) {
    const int t = threadIdx.x, bd = blockDim.x;
    if (t == 0) sh.loaded = 0;  // the histogram overwrites the prefix masses
    int prev = 64;
    u64 pfx = 0;
    for (int level = 1; level <= 6; level++) {
        const int shift = 64 - 11 * level > 0 ? 64 - 11 * level : 0, bits = prev - shift;
        const unsigned nd = 1u << bits;
        for (unsigned i = t; i < nd; i += bd) {
            sh.u.h.cnt[i] = 0;
            sh.u.h.mass[i] = 0;
        }
        __syncthreads();
        const int ng = (a.V + 7) / 8;
        for (int base = 0; base < ng; base += bd) {  // uniform trip count: smp_hist_add needs whole warps
            const int g = base + t;
            unsigned b[8];
            if (g < ng) smp_bkt8(a.bkt, a.V, g, b);
            for (int j = 0; j < 8; j++) {
                const int i = 8 * g + j;
                bool ok = g < ng && b[j] == d0;
                u64 k = 0, m = 0;
                if (ok) {
                    k = smp_k64(a.w[i], i);
                    if (prev < 64) ok = (k >> prev) == pfx;
                    m = smp_fixed(a.e[i], p.fscale);
                }
                smp_hist_add(sh.u.h.cnt, sh.u.h.mass, ok, ok ? (unsigned)((k >> shift) & (nd - 1)) : 0u, m);
            }
        }
        __syncthreads();
        smp_find(sh.u.h.cnt, sh.u.h.mass, (int)nd, true, bymass, target, bc, bm, sh);
        const int found = sh.fd_found;
        const unsigned dd = sh.fd_d, cd = sh.fd_cnt;
        bc = sh.fd_bc;
        bm = sh.fd_bm;
        __syncthreads();  // everyone has read sh.fd_* before they are written again
        if (!found) break;
        pfx = (prev < 64 ? pfx << bits : 0) | dd;
        prev = shift;
        if (cd <= cap) {
            smp_load(a, p, sh, d0, d0, shift, pfx, cd, bc, bm);
            return;
        }
    }
    if (t == 0) sh.err = 2;
    __syncthreads();
}

struct smp_sel {
    bool found;
    unsigned pos;  // sorted position
    int id;
    u64 before, incl;  // cumulative mass before it / including it
};

// The element at sorted position `target` (bymass false), or the first whose
// cumulative mass reaches `target` (bymass true; not found beyond the total).
__device__ smp_sel smp_select(const smp_args &a, const smp_params &p, smp_sh &sh, bool bymass, u64 target,
                              unsigned n, u64 total, unsigned cap) {
    smp_sel r = {false, 0, -1, 0, 0};
    if (bymass ? (target == 0 || target > total) : target >= n) return r;
    const bool hit = sh.loaded && (bymass ? sh.bm < target && target <= sh.bm + sh.u.cm[sh.m - 1]
                                          : sh.bc <= target && target < (u64)sh.bc + sh.m);
    if (!hit) {
        smp_find(a.hcnt, a.hmass, SMP_NB, false, bymass, target, 0, 0, sh);
        const int found = sh.fd_found;
        const unsigned d = sh.fd_d, bc = sh.fd_bc, cd = sh.fd_cnt;
        const u64 bm = sh.fd_bm;
        __syncthreads();
        if (!found) {
            if (threadIdx.x == 0) sh.err = 3;
            __syncthreads();
            return r;
        }
        if (bc + cd <= cap) smp_load(a, p, sh, 0, d, 64, 0, bc + cd, 0, 0);  // every bucket up to d
        else if (cd <= cap) smp_load(a, p, sh, d, d, 64, 0, cd, bc, bm);
        else smp_radix(a, p, sh, d, bymass, target, bc, bm, cap);
        if (sh.err) return r;
    }
    int idx;
    if (!bymass) {
        idx = (int)(target - sh.bc);
    } else {
        if (threadIdx.x == 0) sh.res_idx = -1;
        __syncthreads();
        for (unsigned i = threadIdx.x; i < sh.m; i += blockDim.x) {
            const u64 lo = sh.bm + (i ? sh.u.cm[i - 1] : 0), hi = sh.bm + sh.u.cm[i];
            if (lo < target && target <= hi) sh.res_idx = (int)i;
        }
        __syncthreads();
        idx = sh.res_idx;
    }
    if (idx < 0 || idx >= (int)sh.m) {
        __syncthreads();
        if (threadIdx.x == 0) sh.err = 4;
        __syncthreads();
        return r;
    }
    r.found = true;
    r.pos = sh.bc + (unsigned)idx;
    r.id = smp_id(sh.buf[idx]);
    r.before = sh.bm + (idx ? sh.u.cm[idx - 1] : 0);
    r.incl = sh.bm + sh.u.cm[idx];
    __syncthreads();  // all have read sh before the next query writes it
    return r;
}

// lilac_sample's steps after the argmax, for a finite maximum and T > 0.
__device__ int smp_pick(const smp_args &a, const smp_params &p, smp_sh &sh, int best) {
    unsigned c = 0;
    u64 m = 0;
    for (int d = threadIdx.x; d < SMP_NB; d += blockDim.x) {
        c += a.hcnt[d];
        m += a.hmass[d];
    }
    unsigned n;
    u64 total;
    smp_scan2(c, m, sh, &n, &total);
    if (n == 0) return best;
    const unsigned cap = (unsigned)(p.cap < 1 ? 1 : p.cap > SMP_CAP ? SMP_CAP : p.cap);
    // top-k: the first L1 candidates, their mass `sum`
    const unsigned L1 = p.top_k > 0 && (unsigned)p.top_k < n ? (unsigned)p.top_k : n;
    u64 sum = total;
    if (L1 < n) sum = smp_select(a, p, sh, false, L1 - 1, n, total, cap).incl;
    if (sh.err) return best;
    unsigned keep = L1;
    u64 tot = sum;
    // top-p: the first position whose cumulative probability reaches top_p
    if (p.top_p > 0 && p.top_p < 1) {
        u64 target = __double2ull_ru(__dmul_rn((double)p.top_p, (double)sum));
        if (target == 0) target = 1;
        const smp_sel r = smp_select(a, p, sh, true, target, n, total, cap);
        if (sh.err) return best;
        if (r.found && r.pos + 1 < keep) { keep = r.pos + 1; tot = r.incl; }
    }
    // min-p: e/sum >= min_p * pmax holds exactly for e > min_p; for e == min_p it is
    // the host's double comparison (pmax = 1/sum: the best candidate has e = 1).
    if (p.min_p > 0) {
        const double sd = __dmul_rn((double)sum, 1.0 / p.fscale), pmax = __ddiv_rn(1.0, sd);
        const bool eq_in = __ddiv_rn((double)p.min_p, sd) >= __dmul_rn((double)p.min_p, pmax);
        unsigned cm = a.misc[0] + (eq_in ? a.misc[1] : 0u);
        if (cm < 1) cm = 1;
        if (cm < keep) {
            keep = cm;
            tot = smp_select(a, p, sh, false, keep - 1, n, total, cap).incl;
            if (sh.err) return best;
        }
    }
    // the draw: the first position whose cumulative mass exceeds u * tot
    if (threadIdx.x == 0) {
        u64 *s = a.rng;
        u64 s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3];
        const u64 x = s1 * 5, res = ((x << 7) | (x >> 57)) * 9, t = s1 << 17;
        s2 ^= s0;
        s3 ^= s1;
        s1 ^= s2;
        s0 ^= s3;
        s2 ^= t;
        s3 = (s3 << 45) | (s3 >> 19);
        s[0] = s0;
        s[1] = s1;
        s[2] = s2;
        s[3] = s3;
        sh.draw = __dmul_rn((double)(res >> 11), 1.0 / 9007199254740992.0);
    }
    __syncthreads();
    const u64 target = __double2ull_rd(__dmul_rn(sh.draw, (double)tot)) + 1;
    const smp_sel r = smp_select(a, p, sh, true, target, n, total, cap);
    if (sh.err) return best;
    if (r.found && r.pos < keep) return r.id;
    const smp_sel l = smp_select(a, p, sh, false, keep - 1, n, total, cap);
    return sh.err ? best : l.id;
}

__global__ void __launch_bounds__(SMP_T3) smp_k3(smp_args a) {
    __shared__ smp_sh sh;
    const smp_params p = *a.par;
    if (threadIdx.x == 0) { sh.err = 0; sh.loaded = 0; }
    float mx, wmin;
    int best;
    smp_reduce_parts(a, sh.rv, sh.ri, sh.rmin, mx, best, wmin);
    int tok = best;
    if (!smp_greedy(p) && isfinite(mx)) tok = smp_pick(a, p, sh, best);
    if (threadIdx.x == 0) {
        const int err = sh.err;
        if (err) tok = best;
        ((volatile int *)a.res)[0] = tok;
        ((volatile int *)a.res)[1] = err;
        if (tok >= 0 && tok < a.V) {
            a.counts[tok]++;
            a.seen[tok] = 1;
        }
    }
}

// ---------------------------------------------------------------- host side

struct cuda_sampler {
    int64_t V;
    int G, chunk;
    smp_params hp;  // host copy of the parameters
    smp_params *par;
    u64 *rng;
    int *counts;
    unsigned char *seen;
    float *w, *e;
    unsigned short *bkt;
    smp_part *part;
    unsigned *hcnt, *misc;
    u64 *hmass;
    int *res_h, *res_d;     // host-mapped result
    unsigned char *h_seen;  // staging for the prompt's seen flags
};

#define SCK(call)                                                                                              \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess)                                                                                 \
            return lilac_fail(err, "CUDA sampler: %s at %s:%d (%s)", cudaGetErrorName(e_), __FILE__, __LINE__, \
                              cudaGetErrorString(e_));                                                         \
    } while (0)

void cuda_sampler_free(cuda_sampler *c) {
    if (!c) return;
    void *dev[] = {c->par, c->rng, c->counts, c->seen, c->w, c->e, c->bkt, c->part, c->hcnt, c->misc, c->hmass};
    for (void *q : dev)
        if (q) cudaFree(q);
    if (c->res_h) cudaFreeHost(c->res_h);
    free(c->h_seen);
    delete c;
}

template <typename T>
static int smp_alloc(T **p, size_t n, lilac_err *err) {
    SCK(cudaMalloc((void **)p, sizeof(T) * (n ? n : 1)));
    SCK(cudaMemset(*p, 0, sizeof(T) * (n ? n : 1)));
    return 0;
}

static int smp_init(cuda_sampler *c, lilac_err *err) {
    const size_t V = (size_t)c->V;
    if (smp_alloc(&c->par, 1, err) || smp_alloc(&c->rng, 4, err) || smp_alloc(&c->counts, V, err) ||
        smp_alloc(&c->seen, V, err) || smp_alloc(&c->w, V, err) || smp_alloc(&c->e, V, err) ||
        smp_alloc(&c->bkt, V, err) || smp_alloc(&c->part, (size_t)c->G, err) || smp_alloc(&c->hcnt, SMP_NB, err) ||
        smp_alloc(&c->misc, 2, err) || smp_alloc(&c->hmass, SMP_NB, err))
        return -1;
    SCK(cudaHostAlloc((void **)&c->res_h, 2 * sizeof(int), cudaHostAllocMapped));
    SCK(cudaHostGetDevicePointer((void **)&c->res_d, c->res_h, 0));
    c->res_h[0] = c->res_h[1] = 0;
    c->h_seen = (unsigned char *)malloc(V);
    if (!c->h_seen) return lilac_fail(err, "CUDA sampler: out of host memory");
    return 0;
}

cuda_sampler *cuda_sampler_new(int64_t vocab, lilac_err *err) {
    if (vocab < 1 || vocab > (int64_t)INT_MAX - 1) {
        lilac_fail(err, "CUDA sampler: vocabulary of %lld entries", (long long)vocab);
        return nullptr;
    }
    cuda_sampler *c = new cuda_sampler();  // value-initialised: null pointers
    c->V = vocab;
    // k1/k2: slices of at least 2048 entries, at most SMP_GMAX blocks
    c->G = (int)((vocab + 2047) / 2048);
    if (c->G > SMP_GMAX) c->G = SMP_GMAX;
    c->chunk = (int)((vocab + c->G - 1) / c->G);
    // F: the largest with V * 2^F <= 2^63, so no sum of masses (each <= 2^F) overflows
    int lg = 0;
    while (((int64_t)1 << lg) < vocab) lg++;
    const int F = 63 - lg > 62 ? 62 : 63 - lg;
    lilac_sampling d;
    lilac_sampling_default(&d);
    c->hp = smp_params{d.temperature, d.top_p, d.min_p, d.presence_penalty, d.frequency_penalty,
                       d.repetition_penalty, d.top_k, SMP_CAP, ldexp(1.0, F)};
    if (smp_init(c, err) < 0) {
        cudaGetLastError();
        cuda_sampler_free(c);
        return nullptr;
    }
    return c;
}

void cuda_sampler_set_cap(cuda_sampler *c, int cap) { c->hp.cap = cap < 1 ? 1 : cap > SMP_CAP ? SMP_CAP : cap; }

int cuda_sampler_begin(cuda_sampler *c, const lilac_sampling *p, const int32_t *prompt, int n_prompt, cudaStream_t st,
                       lilac_err *err) {
    c->hp.temperature = p->temperature;
    c->hp.top_p = p->top_p;
    c->hp.min_p = p->min_p;
    c->hp.presence = p->presence_penalty;
    c->hp.frequency = p->frequency_penalty;
    c->hp.repetition = p->repetition_penalty;
    c->hp.top_k = p->top_k;
    lilac_rng r;
    lilac_rng_seed(&r, lilac_sampling_seed(p));
    memset(c->h_seen, 0, (size_t)c->V);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= 0 && prompt[i] < c->V) c->h_seen[prompt[i]] = 1;
    SCK(cudaMemcpyAsync(c->par, &c->hp, sizeof c->hp, cudaMemcpyHostToDevice, st));
    SCK(cudaMemcpyAsync(c->rng, r.s, sizeof r.s, cudaMemcpyHostToDevice, st));
    SCK(cudaMemsetAsync(c->counts, 0, sizeof(int) * (size_t)c->V, st));
    SCK(cudaMemcpyAsync(c->seen, c->h_seen, (size_t)c->V, cudaMemcpyHostToDevice, st));
    SCK(cudaStreamSynchronize(st));  // the sources above are host memory we reuse
    return 0;
}

int cuda_sampler_launch(cuda_sampler *c, const float *d_logits, cudaStream_t st, lilac_err *err) {
    smp_args a = {d_logits, (int)c->V, c->G, c->chunk, c->par, c->rng, c->counts, c->seen, c->w, c->e, c->bkt,
                  c->part, c->hcnt, c->hmass, c->misc, c->res_d};
    void *args[] = {&a};
    SCK(cudaLaunchKernel(smp_k1, dim3((unsigned)c->G), dim3(SMP_T12), args, 0, st));
    SCK(cudaLaunchKernel(smp_k2, dim3((unsigned)c->G), dim3(SMP_T12), args, 0, st));
    SCK(cudaLaunchKernel(smp_k3, dim3(1), dim3(SMP_T3), args, 0, st));
    return 0;
}

int32_t cuda_sampler_result(cuda_sampler *c, lilac_err *err) {
    const int tok = ((volatile int *)c->res_h)[0], code = ((volatile int *)c->res_h)[1];
    if (code) return lilac_fail(err, "CUDA sampler: internal inconsistency %d (token %d)", code, tok);
    return tok;
}
