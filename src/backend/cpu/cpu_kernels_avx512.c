/* cpu_kernels_avx512.c — the kernel set for AVX-512 with VNNI: vpdpbusd on
 * 64-byte vectors (two groups of 4-bit codes per load). Compiled for that ISA
 * by function attributes; called only where cpuid reports it. */
#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu_kernels.h"
#include "cpu_kernels_impl.h"

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))
#define NT_MAX 4 /* tokens per tile: each load of codes serves this many tokens */

/* Row r times NT tokens (NT a constant after inlining): 4-bit codes, the pairs
 * of groups; fs[t][g] = scale * d/256 of token t. */
TGT static inline __attribute__((always_inline)) void row4_pairs(const uint8_t *codes, int64_t np, const int8_t *const *ph,
                                                               const int8_t *const *pm, const int8_t *const *pl,
                                                               const float *const *fs, int NT, float *out) {
    const __m512 r256 = _mm512_set1_ps(1.0f / 256.0f);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 acc[NT_MAX];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t p = 0; p < np; p++) {
        const __m512i c = _mm512_loadu_si512((const void *)(codes + 64 * p));
        const __m512i lo = _mm512_and_si512(c, m4), hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
        for (int t = 0; t < NT; t++) {
            const int8_t *h = ph[t] + 128 * p, *m = pm[t] + 128 * p, *l = pl[t] + 128 * p;
            __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512((const void *)h));
            s = _mm512_dpbusd_epi32(s, hi, _mm512_load_si512((const void *)(h + 64)));
            s = _mm512_slli_epi32(s, 8);
            s = _mm512_dpbusd_epi32(s, lo, _mm512_load_si512((const void *)m));
            s = _mm512_dpbusd_epi32(s, hi, _mm512_load_si512((const void *)(m + 64)));
            __m512i u = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512((const void *)l));
            u = _mm512_dpbusd_epi32(u, hi, _mm512_load_si512((const void *)(l + 64)));
            const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(u), r256, _mm512_cvtepi32_ps(s));
            const __m512 f = _mm512_mask_mov_ps(_mm512_set1_ps(fs[t][2 * p]), 0xff00, _mm512_set1_ps(fs[t][2 * p + 1]));
            acc[t] = _mm512_fmadd_ps(v, f, acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
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
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *codes = (const uint8_t *)(W->q + r * (cols / 8));
        row_affine_f32(W->scales + r * ng, W->biases + r * ng, ng, sf, bf);
        for (int t0 = 0; t0 < a->T; t0 += NT_MAX) {
            const int nt = a->T - t0 < NT_MAX ? a->T - t0 : NT_MAX;
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
            switch (nt) {
            case 1: row4_pairs(codes, np, ph, pm, pl, fp, 1, out); break;
            case 2: row4_pairs(codes, np, ph, pm, pl, fp, 2, out); break;
            case 3: row4_pairs(codes, np, ph, pm, pl, fp, 3, out); break;
            default: row4_pairs(codes, np, ph, pm, pl, fp, 4, out); break;
            }
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
