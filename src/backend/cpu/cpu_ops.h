/* cpu_ops.h — the plain-C building blocks of the CPU forward pass. All f32;
 * these are the numerical reference the CUDA kernels are tested against. */
#ifndef LILAC_CPU_OPS_H
#define LILAC_CPU_OPS_H

#include "../../model/weights.h"

/* y[t][r] = sum_c W[r][c] x[t][c] for t < T; x is [T][W->cols], y is [T][W->rows].
 * Weights are dequantised row by row (w = s*q + b) and reused across the T rows.
 * Parallel over rows (OpenMP). */
void cpu_matmul(const lilac_matrix *W, const float *x, int T, float *y);

/* out[i] = x[i] * rsqrt(mean(x^2) + eps) * gain[i]  (gain NULL: 1). In place ok. */
void cpu_rmsnorm(float *out, const float *x, const float *gain, int64_t n, float eps);

float cpu_dot(const float *a, const float *b, int64_t n);

/* One v-head of the gated delta rule (Gated DeltaNet's recurrence) over T tokens, from the state
 * S[dk][dv] (key i, value m; updated in place). Token t: S = a_t S; u = b_t (v_t - S^T k_t);
 * S += k_t u^T; o_t = S^T q_t. q and k are token rows of dk (already L2-normalised, q scaled),
 * v and o rows of dv, a (decay) and b (beta) one value per token; ld* are the row strides. */
typedef struct {
    int T, dk, dv;
    const float *q, *k, *v, *a, *b;
    int64_t ldq, ldk, ldv, ldab, ldo;
    float *S, *o;
} cpu_gdn_args;
void cpu_gdn_serial(const cpu_gdn_args *g);
/* The same in chunks of C tokens (<= 64), the chunked ("WY"/UT) form of the gated delta rule: per chunk
 * a C x C unit lower-triangular solve and matrix products (what a tensor-core kernel computes). Within
 * a chunk, with gamma_t = a_1..a_t: U (I + A) = B, A[t][s] = b_t gamma_t/gamma_s k_t.k_s (s < t),
 * B_t = b_t (v_t - gamma_t S0^T k_t); o_t = gamma_t S0^T q_t + sum_{s<=t} gamma_t/gamma_s (q_t.k_s) u_s;
 * S = gamma_C S0 + sum_s gamma_C/gamma_s k_s u_s^T. Ratios are taken in log space (decays can underflow). */
void cpu_gdn_chunked(const cpu_gdn_args *g, int C);

static inline float cpu_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float cpu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

#endif
