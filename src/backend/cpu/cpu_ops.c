/* cpu_ops.c — see cpu_ops.h. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "cpu_ops.h"

float cpu_dot(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* Affine GEMV for one token without materialising the row:
 * sum_i x_i (s q_i + b) = s * sum_i x_i q_i + b * sum_i x_i, per group.
 * BITS is a compile-time constant (4 or 8) so the unpacking unrolls. */
static inline float affine_row_dot_bits(const lilac_matrix *m, int64_t r, const float *x, const float *xsum, int bits) {
    const int per_word = 32 / bits, group = m->group;
    const uint32_t mask = (1u << bits) - 1u;
    const int64_t ngroups = m->cols / group, wpg = group / per_word;
    const uint32_t *q = m->q + r * (m->cols / per_word);
    const uint16_t *sc = m->scales + r * ngroups, *bi = m->biases + r * ngroups;
    float acc = 0.0f;
    for (int64_t g = 0; g < ngroups; g++) {
        float dq[8] = {0};
        const float *xg = x + g * group;
        const uint32_t *qg = q + g * wpg;
        for (int64_t w = 0; w < wpg; w++) {
            const uint32_t word = qg[w];
            const float *xw = xg + w * per_word;
            for (int j = 0; j < per_word; j++) dq[j & 7] += xw[j] * (float)((word >> (j * bits)) & mask);
        }
        const float d = ((dq[0] + dq[1]) + (dq[2] + dq[3])) + ((dq[4] + dq[5]) + (dq[6] + dq[7]));
        acc += bf16_to_f32(sc[g]) * d + bf16_to_f32(bi[g]) * xsum[g];
    }
    return acc;
}

static float affine_row_dot(const lilac_matrix *m, int64_t r, const float *x, const float *xsum) {
    return m->bits == 4 ? affine_row_dot_bits(m, r, x, xsum, 4) : affine_row_dot_bits(m, r, x, xsum, 8);
}

void cpu_matmul(const lilac_matrix *W, const float *x, int T, float *y) {
    const int64_t rows = W->rows, cols = W->cols;
    if (T == 1 && W->type == MAT_AFFINE) {
        /* Decode: fused dequant-dot, with the per-group sums of x computed once. */
        const int64_t ng = cols / W->group;
        float *xsum = malloc(sizeof(float) * (size_t)ng);
        for (int64_t g = 0; g < ng; g++) {
            float s = 0.0f;
            for (int i = 0; i < W->group; i++) s += x[g * W->group + i];
            xsum[g] = s;
        }
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
        for (int64_t r = 0; r < rows; r++) y[r] = affine_row_dot(W, r, x, xsum);
        free(xsum);
        return;
    }
#pragma omp parallel if (rows * cols * T > 32768)
    {
        float *row = malloc(sizeof(float) * (size_t)cols);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            lilac_mat_row(W, r, row);
            for (int t = 0; t < T; t++) y[(int64_t)t * rows + r] = cpu_dot(row, x + (int64_t)t * cols, cols);
        }
        free(row);
    }
}

void cpu_rmsnorm(float *out, const float *x, const float *gain, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * (gain ? gain[i] : 1.0f);
}
