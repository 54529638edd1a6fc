/* cpu_kernels_avx2.c — the kernel sets for 32-byte vectors: AVX2 (maddubs +
 * madd) and AVX-VNNI (VEX vpdpbusd). One group of 4-bit codes per load. Each
 * is compiled for its ISA by function attributes and called only where cpuid
 * reports it. The 8-bit kernel (small matrices: the router) is the AVX2 one
 * for both. */
#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu_kernels.h"
#include "cpu_kernels_impl.h"

#define NT_MAX 4

/* The int32 lane sums of u8 codes (0..15) times s8 pieces: AVX2 widens pairs
 * to int16 (at most 2*15*127, no saturation) then to int32. */
#define TGT_AVX2 __attribute__((target("avx2,fma")))
TGT_AVX2 static inline __attribute__((always_inline)) __m256i dot_avx2(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#define TGT_VNNI __attribute__((target("avx2,fma,avxvnni")))
TGT_VNNI static inline __attribute__((always_inline)) __m256i dot_vnni(__m256i acc, __m256i u, __m256i s) {
    return _mm256_dpbusd_avx_epi32(acc, u, s);
}

TGT_AVX2 static void row_affine_f32(const uint16_t *sc, const uint16_t *bi, int64_t ng, float *sf, float *bf) {
    for (int64_t g = 0; g < ng; g++) {
        sf[g] = bf16_to_f32(sc[g]);
        bf[g] = bf16_to_f32(bi[g]);
    }
}

TGT_AVX2 static float token_factors(const float *sf, const float *bf, const float *dq, const float *xs, int64_t ng,
                                    float *fs) {
    float r = 0.0f;
    for (int64_t g = 0; g < ng; g++) {
        fs[g] = sf[g] * dq[g];
        r += bf[g] * xs[g];
    }
    return r;
}

/* One kernel body per ISA: DOT is the lane-sum step, TGT its target. */
#define DEFINE_GEMV4(NAME, TGT, DOT)                                                                                 \
    TGT static inline __attribute__((always_inline)) void NAME##_row(const uint8_t *codes, int64_t np,              \
                                                                     const int8_t *const *ph, const int8_t *const *pm, \
                                                                     const int8_t *const *pl, const float *const *fs, \
                                                                     int NT, float *out) {                            \
        const __m256i m4 = _mm256_set1_epi8(0x0f);                                                                   \
        __m256 acc[NT_MAX];                                                                                          \
        for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();                                                   \
        for (int64_t g = 0; g < 2 * np; g++) {                                                                       \
            const __m256i c = _mm256_loadu_si256((const void *)(codes + 32 * g));                                   \
            const __m256i lo = _mm256_and_si256(c, m4), hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), m4);       \
            const int64_t ev = (g >> 1) * 128 + (g & 1) * 32;                                                        \
            for (int t = 0; t < NT; t++) {                                                                           \
                const int8_t *h = ph[t] + ev, *m = pm[t] + ev, *l = pl[t] + ev;                                      \
                __m256i s = DOT(_mm256_setzero_si256(), lo, _mm256_load_si256((const void *)h));                     \
                s = DOT(s, hi, _mm256_load_si256((const void *)(h + 64)));                                          \
                s = _mm256_slli_epi32(s, 8);                                                                         \
                s = DOT(s, lo, _mm256_load_si256((const void *)m));                                                  \
                s = DOT(s, hi, _mm256_load_si256((const void *)(m + 64)));                                          \
                __m256i u = DOT(_mm256_setzero_si256(), lo, _mm256_load_si256((const void *)l));                     \
                u = DOT(u, hi, _mm256_load_si256((const void *)(l + 64)));                                          \
                const __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), _mm256_set1_ps(1.0f / 256.0f),              \
                                                 _mm256_cvtepi32_ps(s));                                             \
                acc[t] = _mm256_fmadd_ps(v, _mm256_set1_ps(fs[t][g]), acc[t]);                                       \
            }                                                                                                        \
        }                                                                                                            \
        for (int t = 0; t < NT; t++) {                                                                               \
            const __m128 q = _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1));          \
            const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));                                                     \
            out[t] = _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));                                          \
        }                                                                                                            \
    }                                                                                                                \
    TGT static void NAME(const lilac_matrix *W, int64_t r0, int64_t r1, const cpu_qact *a, float *y,                \
                         int64_t ystride) {                                                                          \
        const int64_t ng = a->ng, cols = a->cols, np = ng / 2;                                                       \
        float sf[CPU_MAX_GROUPS], bf[CPU_MAX_GROUPS], fs[NT_MAX][CPU_MAX_GROUPS], bsum[NT_MAX], out[NT_MAX];         \
        for (int64_t r = r0; r < r1; r++) {                                                                          \
            const uint8_t *codes = (const uint8_t *)(W->q + r * (cols / 8));                                        \
            row_affine_f32(W->scales + r * ng, W->biases + r * ng, ng, sf, bf);                                      \
            for (int t0 = 0; t0 < a->T; t0 += NT_MAX) {                                                              \
                const int nt = a->T - t0 < NT_MAX ? a->T - t0 : NT_MAX;                                              \
                const int8_t *ph[NT_MAX], *pm[NT_MAX], *pl[NT_MAX];                                                  \
                const float *fp[NT_MAX];                                                                             \
                for (int k = 0; k < nt; k++) {                                                                       \
                    const int t = t0 + k;                                                                            \
                    ph[k] = a->ph + (int64_t)t * cols;                                                               \
                    pm[k] = a->pm + (int64_t)t * cols;                                                               \
                    pl[k] = a->pl + (int64_t)t * cols;                                                               \
                    bsum[k] = token_factors(sf, bf, a->dq + (int64_t)t * ng, a->xs + (int64_t)t * ng, ng, fs[k]);   \
                    fp[k] = fs[k];                                                                                   \
                }                                                                                                    \
                switch (nt) {                                                                                        \
                case 1: NAME##_row(codes, np, ph, pm, pl, fp, 1, out); break;                                            \
                case 2: NAME##_row(codes, np, ph, pm, pl, fp, 2, out); break;                                            \
                case 3: NAME##_row(codes, np, ph, pm, pl, fp, 3, out); break;                                            \
                default: NAME##_row(codes, np, ph, pm, pl, fp, 4, out); break;                                           \
                }                                                                                                    \
                for (int k = 0; k < nt; k++) {                                                                       \
                    float v = out[k] + bsum[k];                                                                      \
                    if (ng & 1) {                                                                                    \
                        int32_t hm, l;                                                                               \
                        cpu_group4_sums(ng, ng - 1, codes + (ng - 1) * 32, ph[k], pm[k], pl[k], &hm, &l);            \
                        v += fs[k][ng - 1] * cpu_sums_value(hm, l);                                                  \
                    }                                                                                                \
                    y[(int64_t)(t0 + k) * ystride + r] = v;                                                          \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
    }

DEFINE_GEMV4(gemv4_avx2, TGT_AVX2, dot_avx2)
DEFINE_GEMV4(gemv4_vnni, TGT_VNNI, dot_vnni)

TGT_AVX2 static void gemv8_avx2(const lilac_matrix *W, int64_t r0, int64_t r1, const cpu_qact *a, float *y,
                                int64_t ystride) {
    const int64_t ng = a->ng, cols = a->cols;
    float sf[CPU_MAX_GROUPS], bf[CPU_MAX_GROUPS], fs[CPU_MAX_GROUPS];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *codes = (const uint8_t *)(W->q + r * (cols / 4));
        row_affine_f32(W->scales + r * ng, W->biases + r * ng, ng, sf, bf);
        for (int t = 0; t < a->T; t++) {
            const int8_t *nh = a->nh + (int64_t)t * cols, *nm = a->nm + (int64_t)t * cols, *nl = a->nl + (int64_t)t * cols;
            const float bsum = token_factors(sf, bf, a->dq + (int64_t)t * ng, a->xs + (int64_t)t * ng, ng, fs);
            __m256 acc = _mm256_setzero_ps();
            for (int64_t g = 0; g < ng; g++) {
                __m256i sh = _mm256_setzero_si256(), sm = _mm256_setzero_si256(), sl = _mm256_setzero_si256();
                for (int k = 0; k < 64; k += 16) {
                    const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)(codes + 64 * g + k)));
                    sh = _mm256_add_epi32(sh, _mm256_madd_epi16(c, _mm256_cvtepi8_epi16(_mm_load_si128((const void *)(nh + 64 * g + k)))));
                    sm = _mm256_add_epi32(sm, _mm256_madd_epi16(c, _mm256_cvtepi8_epi16(_mm_load_si128((const void *)(nm + 64 * g + k)))));
                    sl = _mm256_add_epi32(sl, _mm256_madd_epi16(c, _mm256_cvtepi8_epi16(_mm_load_si128((const void *)(nl + 64 * g + k)))));
                }
                const __m256i s = _mm256_add_epi32(_mm256_slli_epi32(sh, 8), sm);
                const __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sl), _mm256_set1_ps(1.0f / 256.0f), _mm256_cvtepi32_ps(s));
                acc = _mm256_fmadd_ps(v, _mm256_set1_ps(fs[g]), acc);
            }
            const __m128 q = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
            const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
            y[(int64_t)t * ystride + r] = _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1))) + bsum;
        }
    }
}

const cpu_kernels cpu_kernels_avx2 = {.name = "avx2", .gemv4 = gemv4_avx2, .gemv8 = gemv8_avx2};
const cpu_kernels cpu_kernels_avxvnni = {.name = "avxvnni", .gemv4 = gemv4_vnni, .gemv8 = gemv8_avx2};
#endif
