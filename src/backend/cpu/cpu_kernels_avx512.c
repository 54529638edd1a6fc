/* cpu_kernels_avx512.c — the kernel set for AVX-512 with VNNI: vpdpbusd on
 * 64-byte vectors (two groups of 4-bit codes per load). Compiled for that ISA
 * by function attributes; called only where cpuid reports it. */
#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu_kernels.h"
#include "cpu_kernels_impl.h"

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))
#define NT_MAX 4 /* tokens per tile: each load of codes serves this many tokens */
#define TB 64 /* tokens per block: their pieces (64 x 3 x cols bytes) stay in L2 while the rows pass */
#define PF_AHEAD 4096 /* software prefetch distance of the one-token kernels, bytes */

/* One pair of groups p of 4-bit codes (nibbles lo, hi) times token t's pieces, folded into acc with
 * the pair's factors (scale * d/256 of each group). */
#define PAIR4(t)                                                                                                  \
    do {                                                                                                          \
        const int8_t *h_ = ph##t + 128 * p, *m_ = pm##t + 128 * p, *l_ = pl##t + 128 * p;                         \
        __m512i s_ = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512((const void *)h_));       \
        s_ = _mm512_dpbusd_epi32(s_, hi, _mm512_load_si512((const void *)(h_ + 64)));                             \
        s_ = _mm512_slli_epi32(s_, 8);                                                                            \
        s_ = _mm512_dpbusd_epi32(s_, lo, _mm512_load_si512((const void *)m_));                                    \
        s_ = _mm512_dpbusd_epi32(s_, hi, _mm512_load_si512((const void *)(m_ + 64)));                             \
        __m512i u_ = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512((const void *)l_));       \
        u_ = _mm512_dpbusd_epi32(u_, hi, _mm512_load_si512((const void *)(l_ + 64)));                             \
        const __m512 v_ = _mm512_fmadd_ps(_mm512_cvtepi32_ps(u_), r256, _mm512_cvtepi32_ps(s_));                  \
        const __m512 f_ = _mm512_mask_mov_ps(_mm512_set1_ps(fs##t[2 * p]), 0xff00, _mm512_set1_ps(fs##t[2 * p + 1])); \
        acc##t = _mm512_fmadd_ps(v_, f_, acc##t);                                                                 \
    } while (0)

#define CODES4()                                                                                                  \
    const __m512i c_ = _mm512_loadu_si512((const void *)(codes + 64 * p));                                        \
    const __m512i lo = _mm512_and_si512(c_, m4), hi = _mm512_and_si512(_mm512_srli_epi16(c_, 4), m4)

/* Row r times one token: the pairs of groups. */
TGT static float row4_x1(const uint8_t *codes, int64_t np, const int8_t *ph0, const int8_t *pm0, const int8_t *pl0,
                         const float *fs0) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512 r256 = _mm512_set1_ps(1.0f / 256.0f);
    __m512 acc0 = _mm512_setzero_ps();
    for (int64_t p = 0; p < np; p++) {
        /* one token: memory-bound; ask for the codes PF_AHEAD bytes on (the rows after this one) */
        _mm_prefetch((const char *)(codes + 64 * p + PF_AHEAD), _MM_HINT_T0);
        CODES4();
        PAIR4(0);
    }
    return _mm512_reduce_add_ps(acc0);
}

/* Row r times four tokens: each load of codes serves all four. */
TGT static void row4_x4(const uint8_t *codes, int64_t np, const int8_t *const *ph, const int8_t *const *pm,
                        const int8_t *const *pl, const float *const *fs, float *out) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512 r256 = _mm512_set1_ps(1.0f / 256.0f);
    const int8_t *ph0 = ph[0], *ph1 = ph[1], *ph2 = ph[2], *ph3 = ph[3];
    const int8_t *pm0 = pm[0], *pm1 = pm[1], *pm2 = pm[2], *pm3 = pm[3];
    const int8_t *pl0 = pl[0], *pl1 = pl[1], *pl2 = pl[2], *pl3 = pl[3];
    const float *fs0 = fs[0], *fs1 = fs[1], *fs2 = fs[2], *fs3 = fs[3];
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int64_t p = 0; p < np; p++) {
        CODES4();
        PAIR4(0);
        PAIR4(1);
        PAIR4(2);
        PAIR4(3);
    }
    out[0] = _mm512_reduce_add_ps(acc0);
    out[1] = _mm512_reduce_add_ps(acc1);
    out[2] = _mm512_reduce_add_ps(acc2);
    out[3] = _mm512_reduce_add_ps(acc3);
}

/* Scales and biases of a row as f32. */
TGT static void row_affine_f32(const uint16_t *sc, const uint16_t *bi, int64_t ng, float *sf, float *bf) {
    int64_t g = 0;
    for (; g + 16 <= ng; g += 16) {
        const __m512i s = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(sc + g)));
        const __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(bi + g)));
        _mm512_storeu_ps(sf + g, _mm512_castsi512_ps(_mm512_slli_epi32(s, 16)));
        _mm512_storeu_ps(bf + g, _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)));
    }
    for (; g < ng; g++) {
        sf[g] = bf16_to_f32(sc[g]);
        bf[g] = bf16_to_f32(bi[g]);
    }
}

/* fs[g] = sf[g] * dq[g]; returns sum_g bf[g] * xs[g]. */
TGT static float token_factors(const float *sf, const float *bf, const float *dq, const float *xs, int64_t ng, float *fs) {
    __m512 b = _mm512_setzero_ps();
    int64_t g = 0;
    for (; g + 16 <= ng; g += 16) {
        _mm512_storeu_ps(fs + g, _mm512_mul_ps(_mm512_loadu_ps(sf + g), _mm512_loadu_ps(dq + g)));
        b = _mm512_fmadd_ps(_mm512_loadu_ps(bf + g), _mm512_loadu_ps(xs + g), b);
    }
    float r = _mm512_reduce_add_ps(b);
    for (; g < ng; g++) {
        fs[g] = sf[g] * dq[g];
        r += bf[g] * xs[g];
    }
    return r;
}

TGT static void gemv4_avx512(const lilac_matrix *W, int64_t r0, int64_t r1, const cpu_qact *a, float *y, int64_t ystride) {
    const int64_t ng = a->ng, cols = a->cols, np = ng / 2;
    float sf[CPU_MAX_GROUPS], bf[CPU_MAX_GROUPS], fs[NT_MAX][CPU_MAX_GROUPS], bsum[NT_MAX], out[NT_MAX];
    for (int tb = 0; tb < a->T; tb += TB)
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *codes = (const uint8_t *)(W->q + r * (cols / 8));
        row_affine_f32(W->scales + r * ng, W->biases + r * ng, ng, sf, bf);
        const int te = a->T - tb < TB ? a->T : tb + TB;
        for (int t0 = tb; t0 < te; t0 += NT_MAX) {
            const int nt = te - t0 < NT_MAX ? te - t0 : NT_MAX;
            const int8_t *ph[NT_MAX], *pm[NT_MAX], *pl[NT_MAX];
            const float *fp[NT_MAX];
            for (int k = 0; k < nt; k++) {
                const int t = t0 + k;
                ph[k] = a->ph + (int64_t)t * cols;
                pm[k] = a->pm + (int64_t)t * cols;
                pl[k] = a->pl + (int64_t)t * cols;
                bsum[k] = token_factors(sf, bf, a->dq + (int64_t)t * ng, a->xs + (int64_t)t * ng, ng, fs[k]);
                fp[k] = fs[k];
            }
            if (nt == NT_MAX) row4_x4(codes, np, ph, pm, pl, fp, out);
            else
                for (int k = 0; k < nt; k++) out[k] = row4_x1(codes, np, ph[k], pm[k], pl[k], fp[k]);
            for (int k = 0; k < nt; k++) {
                float v = out[k] + bsum[k];
                if (ng & 1) {
                    int32_t hm, l;
                    cpu_group4_sums(ng, ng - 1, codes + (ng - 1) * 32, ph[k], pm[k], pl[k], &hm, &l);
                    v += fs[k][ng - 1] * cpu_sums_value(hm, l);
                }
                y[(int64_t)(t0 + k) * ystride + r] = v;
            }
        }
    }
}

/* Lane sums of 64 8-bit codes (widened to int16 in c0, c1) times 64 int8 pieces. */
TGT static inline __attribute__((always_inline)) __m512i dot8(__m512i c0, __m512i c1, const int8_t *x) {
    return _mm512_add_epi32(_mm512_madd_epi16(c0, _mm512_cvtepi8_epi16(_mm256_load_si256((const void *)x))),
                            _mm512_madd_epi16(c1, _mm512_cvtepi8_epi16(_mm256_load_si256((const void *)(x + 32)))));
}

TGT static void gemv8_avx512(const lilac_matrix *W, int64_t r0, int64_t r1, const cpu_qact *a, float *y, int64_t ystride) {
    const int64_t ng = a->ng, cols = a->cols;
    float sf[CPU_MAX_GROUPS], bf[CPU_MAX_GROUPS], fs[CPU_MAX_GROUPS];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *codes = (const uint8_t *)(W->q + r * (cols / 4));
        row_affine_f32(W->scales + r * ng, W->biases + r * ng, ng, sf, bf);
        for (int t = 0; t < a->T; t++) {
            const int8_t *nh = a->nh + (int64_t)t * cols, *nm = a->nm + (int64_t)t * cols, *nl = a->nl + (int64_t)t * cols;
            const float bsum = token_factors(sf, bf, a->dq + (int64_t)t * ng, a->xs + (int64_t)t * ng, ng, fs);
            __m512 acc = _mm512_setzero_ps();
            for (int64_t g = 0; g < ng; g++) {
                const uint8_t *c = codes + 64 * g;
                const __m512i c0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const void *)c));
                const __m512i c1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const void *)(c + 32)));
                const __m512i sh = dot8(c0, c1, nh + 64 * g), sm = dot8(c0, c1, nm + 64 * g), sl = dot8(c0, c1, nl + 64 * g);
                const __m512i s = _mm512_add_epi32(_mm512_slli_epi32(sh, 8), sm);
                const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sl), _mm512_set1_ps(1.0f / 256.0f), _mm512_cvtepi32_ps(s));
                acc = _mm512_fmadd_ps(v, _mm512_set1_ps(fs[g]), acc);
            }
            y[(int64_t)t * ystride + r] = _mm512_reduce_add_ps(acc) + bsum;
        }
    }
}

const cpu_kernels cpu_kernels_avx512vnni = {.name = "avx512vnni", .gemv4 = gemv4_avx512, .gemv8 = gemv8_avx512};
#endif
