/* cpu_kernels.c — activation quantisation, the scalar kernel set (the fast
 * path's own reference: the same integer sums, written plainly) and the run-time
 * choice of kernel set. See cpu_kernels.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../util/common.h"
#include "cpu_kernels.h"
#include "cpu_kernels_impl.h"

void cpu_qact_reserve(cpu_qact *a, int T, int64_t cols) {
    a->cols = cols;
    a->ng = cols / 64;
    a->T = T;
    if (T <= a->cap && cols * T <= a->cols_cap) return;
    cpu_qact_free(a);
    a->cols = cols;
    a->ng = cols / 64;
    a->T = T;
    a->cap = T;
    a->cols_cap = cols * T;
    const size_t n = (size_t)(cols * T);
    /* 64-byte aligned rows: cols is a multiple of 64 */
    a->ph = aligned_alloc(64, n);
    a->pm = aligned_alloc(64, n);
    a->pl = aligned_alloc(64, n);
    a->nh = aligned_alloc(64, n);
    a->nm = aligned_alloc(64, n);
    a->nl = aligned_alloc(64, n);
    a->dq = malloc(sizeof(float) * (size_t)(a->ng * T));
    a->xs = malloc(sizeof(float) * (size_t)(a->ng * T));
    if (!a->ph || !a->pm || !a->pl || !a->nh || !a->nm || !a->nl || !a->dq || !a->xs) lilac_die("out of memory (activation buffers)");
}

void cpu_qact_free(cpu_qact *a) {
    free(a->ph); free(a->pm); free(a->pl); free(a->nh); free(a->nm); free(a->nl); free(a->dq); free(a->xs);
    memset(a, 0, sizeof *a);
}

/* The pieces of v = x/d (|v| <= 127): v ~= h + m/256 + l/65536, each rounded to
 * nearest; a piece that rounds to 128 carries one into the piece before. */
static inline void pieces(float v, int *h, int *m, int *l) {
    const float hf = nearbyintf(v), r1 = (v - hf) * 256.0f; /* exact: v and hf are close */
    const float mf = nearbyintf(r1), r2 = (r1 - mf) * 256.0f;
    int H = (int)hf, M = (int)mf, L = (int)nearbyintf(r2);
    if (M == 128) { H += 1; M = -128; }
    if (L == 128) {
        if (M < 127) { M += 1; L = -128; }
        else L = 127; /* M = 127 and L = 128: off by 2^-16 of a step */
    }
    *h = H; *m = M; *l = L;
}

void cpu_qact_row(cpu_qact *a, int t, const float *x) {
    const int64_t ng = a->ng, cols = a->cols;
    const int64_t o = (int64_t)t * cols;
    for (int64_t g = 0; g < ng; g++) {
        const float *xg = x + g * 64;
        float amax = 0.0f, sum = 0.0f;
        for (int i = 0; i < 64; i++) {
            amax = fmaxf(amax, fabsf(xg[i]));
            sum += xg[i];
        }
        const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        a->dq[(int64_t)t * ng + g] = d * (1.0f / 256.0f);
        a->xs[(int64_t)t * ng + g] = sum;
        int64_t ev, od;
        cpu_pair_offsets(ng, g, &ev, &od);
        for (int i = 0; i < 64; i++) {
            int h, m, l;
            pieces(xg[i] * inv, &h, &m, &l);
            const int64_t at = o + (i & 1 ? od : ev) + i / 2, nat = o + g * 64 + i;
            a->nh[nat] = a->ph[at] = (int8_t)h;
            a->nm[nat] = a->pm[at] = (int8_t)m;
            a->nl[nat] = a->pl[at] = (int8_t)l;
        }
    }
}

void cpu_qact_copy_row(cpu_qact *dst, int td, const cpu_qact *src, int ts) {
    const int64_t c = src->cols, ng = src->ng;
    int8_t *const d8[6] = {dst->ph, dst->pm, dst->pl, dst->nh, dst->nm, dst->nl};
    const int8_t *const s8[6] = {src->ph, src->pm, src->pl, src->nh, src->nm, src->nl};
    for (int k = 0; k < 6; k++) memcpy(d8[k] + (int64_t)td * c, s8[k] + (int64_t)ts * c, (size_t)c);
    memcpy(dst->dq + (int64_t)td * ng, src->dq + (int64_t)ts * ng, sizeof(float) * (size_t)ng);
    memcpy(dst->xs + (int64_t)td * ng, src->xs + (int64_t)ts * ng, sizeof(float) * (size_t)ng);
}

/* ---- scalar set ---------------------------------------------------------- */

static void gemv4_scalar(const lilac_matrix *W, int64_t r0, int64_t r1, const cpu_qact *a, float *y, int64_t ystride) {
    const int64_t ng = a->ng, cols = a->cols;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *codes = (const uint8_t *)(W->q + r * (cols / 8));
        const uint16_t *sc = W->scales + r * ng, *bi = W->biases + r * ng;
        for (int t = 0; t < a->T; t++) {
            const int64_t o = (int64_t)t * cols;
            const float *dq = a->dq + (int64_t)t * ng, *xs = a->xs + (int64_t)t * ng;
            float acc = 0.0f;
            for (int64_t g = 0; g < ng; g++) {
                int32_t hm, l;
                cpu_group4_sums(ng, g, codes + g * 32, a->ph + o, a->pm + o, a->pl + o, &hm, &l);
                acc += bf16_to_f32(sc[g]) * dq[g] * cpu_sums_value(hm, l) + bf16_to_f32(bi[g]) * xs[g];
            }
            y[(int64_t)t * ystride + r] = acc;
        }
    }
}

static void gemv8_scalar(const lilac_matrix *W, int64_t r0, int64_t r1, const cpu_qact *a, float *y, int64_t ystride) {
    const int64_t ng = a->ng, cols = a->cols;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *codes = (const uint8_t *)(W->q + r * (cols / 4));
        const uint16_t *sc = W->scales + r * ng, *bi = W->biases + r * ng;
        for (int t = 0; t < a->T; t++) {
            const int64_t o = (int64_t)t * cols;
            const float *dq = a->dq + (int64_t)t * ng, *xs = a->xs + (int64_t)t * ng;
            float acc = 0.0f;
            for (int64_t g = 0; g < ng; g++) {
                int32_t hm, l;
                const int64_t at = o + g * 64;
                cpu_group8_sums(codes + g * 64, a->nh + at, a->nm + at, a->nl + at, &hm, &l);
                acc += bf16_to_f32(sc[g]) * dq[g] * cpu_sums_value(hm, l) + bf16_to_f32(bi[g]) * xs[g];
            }
            y[(int64_t)t * ystride + r] = acc;
        }
    }
}

const cpu_kernels cpu_kernels_scalar = {.name = "scalar", .gemv4 = gemv4_scalar, .gemv8 = gemv8_scalar};

/* ---- choice -------------------------------------------------------------- */

const cpu_kernels *cpu_kernels_for(cpu_isa isa) {
    switch (isa) {
    case CPU_ISA_SCALAR: return &cpu_kernels_scalar;
#if defined(__x86_64__)
    case CPU_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &cpu_kernels_avx2 : NULL;
    case CPU_ISA_AVXVNNI:
        return cpu_has_avxvnni() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &cpu_kernels_avxvnni
                                                                                                     : NULL;
    case CPU_ISA_AVX512VNNI:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vnni")
                   ? &cpu_kernels_avx512vnni
                   : NULL;
#endif
    default: return NULL;
    }
}

const cpu_kernels *cpu_kernels_best(void) {
    for (int isa = CPU_ISA_COUNT - 1; isa > CPU_ISA_SCALAR; isa--) {
        const cpu_kernels *k = cpu_kernels_for((cpu_isa)isa);
        if (k) return k;
    }
    return &cpu_kernels_scalar;
}
