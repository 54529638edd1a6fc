/* cpu_ops.c — see cpu_ops.h. */
#include <math.h>
#include <stdlib.h>

#include "../../util/common.h"
#include "cpu_ops.h"
#include "cpu_pool.h"

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

void cpu_matmul_rows(const lilac_matrix *W, const float *x, int T, float *y, int64_t ystride, int64_t r0, int64_t r1) {
    const int64_t cols = W->cols;
    if (r0 >= r1) return;
    if (T == 1 && W->type == MAT_AFFINE) {
        /* Decode: fused dequant-dot, with the per-group sums of x computed once. */
        const int64_t ng = cols / W->group;
        float *xsum = xmalloc(sizeof(float) * (size_t)ng);
        for (int64_t g = 0; g < ng; g++) {
            float s = 0.0f;
            for (int i = 0; i < W->group; i++) s += x[g * W->group + i];
            xsum[g] = s;
        }
        for (int64_t r = r0; r < r1; r++) y[r] = affine_row_dot(W, r, x, xsum);
        free(xsum);
        return;
    }
    float *row = xmalloc(sizeof(float) * (size_t)cols);
    for (int64_t r = r0; r < r1; r++) {
        lilac_mat_row(W, r, row);
        for (int t = 0; t < T; t++) y[(int64_t)t * ystride + r] = cpu_dot(row, x + (int64_t)t * cols, cols);
    }
    free(row);
}

typedef struct {
    const lilac_matrix *W;
    const float *x;
    float *y;
    int T;
} matmul_job;

static void matmul_part(void *c, int tid, int nth) {
    const matmul_job *j = c;
    int64_t lo, hi;
    cpu_pool_share(j->W->rows, tid, nth, &lo, &hi);
    cpu_matmul_rows(j->W, j->x, j->T, j->y, j->W->rows, lo, hi);
}

void cpu_matmul(const lilac_matrix *W, const float *x, int T, float *y) {
    matmul_job j = {W, x, y, T};
    if (W->rows * W->cols * T > 32768) cpu_pool_run(matmul_part, &j);
    else matmul_part(&j, 0, 1);
}

void cpu_rmsnorm(float *out, const float *x, const float *gain, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * (gain ? gain[i] : 1.0f);
}
