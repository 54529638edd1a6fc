/* cpu_ops.c — see cpu_ops.h. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

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

void cpu_gdn_serial(const cpu_gdn_args *g) {
    const int dk = g->dk, dv = g->dv;
    float *S = g->S, r[512];
    for (int t = 0; t < g->T; t++) {
        const float *q = g->q + t * g->ldq, *k = g->k + t * g->ldk, *v = g->v + t * g->ldv;
        const float decay = g->a[t * g->ldab], beta = g->b[t * g->ldab];
        for (int m = 0; m < dv; m++) r[m] = 0.0f;
        for (int i = 0; i < dk; i++) {
            float *Si = S + (int64_t)i * dv;
            for (int m = 0; m < dv; m++) { Si[m] *= decay; r[m] += Si[m] * k[i]; }
        }
        for (int m = 0; m < dv; m++) r[m] = (v[m] - r[m]) * beta; /* delta */
        float *o = g->o + t * g->ldo;
        for (int m = 0; m < dv; m++) o[m] = 0.0f;
        for (int i = 0; i < dk; i++) {
            float *Si = S + (int64_t)i * dv;
            for (int m = 0; m < dv; m++) { Si[m] += k[i] * r[m]; o[m] += Si[m] * q[i]; }
        }
    }
}

void cpu_gdn_chunked(const cpu_gdn_args *g, int C) {
    const int dk = g->dk, dv = g->dv;
    if (C > 64) C = 64;
    float *S = g->S;
    float *U = xmalloc(sizeof(float) * 64 * (size_t)dv), *W = xmalloc(sizeof(float) * (size_t)dk * dv);
    double lg[64]; /* log gamma_t within the chunk */
    for (int c0 = 0; c0 < g->T; c0 += C) {
        const int n = g->T - c0 < C ? g->T - c0 : C;
        const float *q = g->q + c0 * g->ldq, *k = g->k + c0 * g->ldk, *v = g->v + c0 * g->ldv;
        double acc = 0;
        for (int t = 0; t < n; t++) { /* log a >= -200: exp(-200) is 0 in f32 anyway, and differences stay finite */
            const float a = g->a[(c0 + t) * g->ldab];
            acc += a > 0.0f ? fmax(log((double)a), -200.0) : -200.0;
            lg[t] = acc;
        }
        /* B_t = b_t (v_t - gamma_t S0^T k_t), then forward substitution: u_t = B_t - sum_{s<t} A[t][s] u_s */
        for (int t = 0; t < n; t++) {
            const float *kt = k + t * g->ldk, beta = g->b[(c0 + t) * g->ldab];
            const float gt = (float)exp(lg[t]);
            float *u = U + (int64_t)t * dv;
            for (int m = 0; m < dv; m++) u[m] = 0.0f;
            for (int i = 0; i < dk; i++) {
                const float *Si = S + (int64_t)i * dv;
                for (int m = 0; m < dv; m++) u[m] += Si[m] * kt[i];
            }
            for (int m = 0; m < dv; m++) u[m] = beta * (v[t * g->ldv + m] - gt * u[m]);
            for (int s = 0; s < t; s++) {
                const float A = beta * (float)exp(lg[t] - lg[s]) * cpu_dot(kt, k + s * g->ldk, dk);
                const float *us = U + (int64_t)s * dv;
                for (int m = 0; m < dv; m++) u[m] -= A * us[m];
            }
        }
        /* o_t = gamma_t S0^T q_t + sum_{s<=t} gamma_t/gamma_s (q_t.k_s) u_s */
        for (int t = 0; t < n; t++) {
            const float *qt = q + t * g->ldq;
            const float gt = (float)exp(lg[t]);
            float *o = g->o + (c0 + t) * g->ldo;
            for (int m = 0; m < dv; m++) o[m] = 0.0f;
            for (int i = 0; i < dk; i++) {
                const float *Si = S + (int64_t)i * dv;
                for (int m = 0; m < dv; m++) o[m] += Si[m] * qt[i];
            }
            for (int m = 0; m < dv; m++) o[m] *= gt;
            for (int s = 0; s <= t; s++) {
                const float P = (float)exp(lg[t] - lg[s]) * cpu_dot(qt, k + s * g->ldk, dk);
                const float *us = U + (int64_t)s * dv;
                for (int m = 0; m < dv; m++) o[m] += P * us[m];
            }
        }
        /* S = gamma_n S0 + sum_s gamma_n/gamma_s k_s u_s^T */
        const float gn = (float)exp(lg[n - 1]);
        for (int64_t i = 0; i < (int64_t)dk * dv; i++) W[i] = S[i] * gn;
        for (int s = 0; s < n; s++) {
            const float f = (float)exp(lg[n - 1] - lg[s]);
            const float *ks = k + s * g->ldk, *us = U + (int64_t)s * dv;
            for (int i = 0; i < dk; i++) {
                const float ki = f * ks[i];
                float *Wi = W + (int64_t)i * dv;
                for (int m = 0; m < dv; m++) Wi[m] += ki * us[m];
            }
        }
        memcpy(S, W, sizeof(float) * (size_t)dk * dv);
    }
    free(U);
    free(W);
}
