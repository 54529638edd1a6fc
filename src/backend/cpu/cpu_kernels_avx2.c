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
#define TB 64 /* tokens per block: their pieces (64 x 3 x cols bytes) stay in L2 while the rows pass */
#define PF_AHEAD 4096 /* software prefetch distance of the one-token kernels, bytes */

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

TGT_AVX2 static inline float hsum8(__m256 v) {
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
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

/* One group g of 4-bit codes (nibbles lo, hi) times token t's pieces, folded into acc##t. */
#define GROUP4(DOT, t)                                                                                            \
    do {                                                                                                          \
        const int8_t *h_ = ph##t + ev, *m_ = pm##t + ev, *l_ = pl##t + ev;                                        \
        __m256i s_ = DOT(_mm256_setzero_si256(), lo, _mm256_load_si256((const void *)h_));                       \
        s_ = DOT(s_, hi, _mm256_load_si256((const void *)(h_ + 64)));                                             \
        s_ = _mm256_slli_epi32(s_, 8);                                                                            \
        s_ = DOT(s_, lo, _mm256_load_si256((const void *)m_));                                                    \
        s_ = DOT(s_, hi, _mm256_load_si256((const void *)(m_ + 64)));                                             \
        __m256i u_ = DOT(_mm256_setzero_si256(), lo, _mm256_load_si256((const void *)l_));                       \
        u_ = DOT(u_, hi, _mm256_load_si256((const void *)(l_ + 64)));                                             \
        const __m256 v_ = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u_), r256, _mm256_cvtepi32_ps(s_));                  \
        acc##t = _mm256_fmadd_ps(v_, _mm256_set1_ps(fs##t[g]), acc##t);                                           \
    } while (0)

#define CODES_GROUP()                                                                                             \
    const __m256i c_ = _mm256_loadu_si256((const void *)(codes + 32 * g));                                        \
    const __m256i lo = _mm256_and_si256(c_, m4), hi = _mm256_and_si256(_mm256_srli_epi16(c_, 4), m4);            \
    const int64_t ev = (g >> 1) * 128 + (g & 1) * 32

/* One kernel set per ISA: DOT is the lane-sum step, TGT its target. NAME_x1: a row times one token;
 * NAME_x4: times four, each load of codes serving all four. */
#define DEFINE_GEMV4(NAME, TGT, DOT)                                                                                 \
    TGT static float NAME##_x1(const uint8_t *codes, int64_t np, const int8_t *ph0, const int8_t *pm0,              \
                               const int8_t *pl0, const float *fs0) {                                               \
        const __m256i m4 = _mm256_set1_epi8(0x0f);                                                                   \
        const __m256 r256 = _mm256_set1_ps(1.0f / 256.0f);                                                           \
        __m256 acc0 = _mm256_setzero_ps();                                                                           \
        for (int64_t g = 0; g < 2 * np; g++) {                                                                       \
            _mm_prefetch((const char *)(codes + 32 * g + PF_AHEAD), _MM_HINT_T0); /* memory-bound: rows ahead */     \
            CODES_GROUP();                                                                                           \
            GROUP4(DOT, 0);                                                                                          \
        }                                                                                                            \
        return hsum8(acc0);                                                                                          \
    }                                                                                                                \
    TGT static void NAME##_x4(const uint8_t *codes, int64_t np, const int8_t *const *ph, const int8_t *const *pm,   \
                              const int8_t *const *pl, const float *const *fs, float *out) {                        \
        const __m256i m4 = _mm256_set1_epi8(0x0f);                                                                   \
        const __m256 r256 = _mm256_set1_ps(1.0f / 256.0f);                                                           \
        const int8_t *ph0 = ph[0], *ph1 = ph[1], *ph2 = ph[2], *ph3 = ph[3];                                         \
        const int8_t *pm0 = pm[0], *pm1 = pm[1], *pm2 = pm[2], *pm3 = pm[3];                                         \
        const int8_t *pl0 = pl[0], *pl1 = pl[1], *pl2 = pl[2], *pl3 = pl[3];                                         \
        const float *fs0 = fs[0], *fs1 = fs[1], *fs2 = fs[2], *fs3 = fs[3];                                          \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;                                    \
        for (int64_t g = 0; g < 2 * np; g++) {                                                                       \
            CODES_GROUP();                                                                                           \
            GROUP4(DOT, 0);                                                                                          \
            GROUP4(DOT, 1);                                                                                          \
            GROUP4(DOT, 2);                                                                                          \
            GROUP4(DOT, 3);                                                                                          \
        }                                                                                                            \
        out[0] = hsum8(acc0);                                                                                        \
        out[1] = hsum8(acc1);                                                                                        \
        out[2] = hsum8(acc2);                                                                                        \
        out[3] = hsum8(acc3);                                                                                        \
    }                                                                                                                \
    TGT static void NAME(const lilac_matrix *W, int64_t r0, int64_t r1, const cpu_qact *a, float *y,                \
                         int64_t ystride) {                                                                          \
        const int64_t ng = a->ng, cols = a->cols, np = ng / 2;                                                       \
        float sf[CPU_MAX_GROUPS], bf[CPU_MAX_GROUPS], fs[NT_MAX][CPU_MAX_GROUPS], bsum[NT_MAX], out[NT_MAX];         \
        for (int tb = 0; tb < a->T; tb += TB)                                                                        \
        for (int64_t r = r0; r < r1; r++) {                                                                          \
            const uint8_t *codes = (const uint8_t *)(W->q + r * (cols / 8));                                        \
            row_affine_f32(W->scales + r * ng, W->biases + r * ng, ng, sf, bf);                                      \
            const int te = a->T - tb < TB ? a->T : tb + TB;                                                          \
            for (int t0 = tb; t0 < te; t0 += NT_MAX) {                                                               \
                const int nt = te - t0 < NT_MAX ? te - t0 : NT_MAX;                                                  \
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
                if (nt == NT_MAX) NAME##_x4(codes, np, ph, pm, pl, fp, out);                                         \
                else                                                                                                 \
                    for (int k = 0; k < nt; k++) out[k] = NAME##_x1(codes, np, ph[k], pm[k], pl[k], fp[k]);          \
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
