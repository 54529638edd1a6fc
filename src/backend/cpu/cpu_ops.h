/* cpu_ops.h — the plain-C building blocks of the CPU forward pass. All f32;
 * these are the numerical reference the CUDA kernels are tested against. */
#ifndef LILAC_CPU_OPS_H
#define LILAC_CPU_OPS_H

#include <math.h>

#include "../../model/weights.h"

/* y[t][r] = sum_c W[r][c] x[t][c] for t < T; x is [T][W->cols], y is [T][W->rows].
 * Weights are dequantised row by row (w = s*q + b) and reused across the T rows.
 * Parallel over rows (the CPU thread pool, cpu_pool.h). */
void cpu_matmul(const lilac_matrix *W, const float *x, int T, float *y);

/* The same for rows [r0, r1) only, on the calling thread: y[t * ystride + r]. */
void cpu_matmul_rows(const lilac_matrix *W, const float *x, int T, float *y, int64_t ystride, int64_t r0, int64_t r1);

/* out[i] = x[i] * rsqrt(mean(x^2) + eps) * gain[i]  (gain NULL: 1). In place ok. */
void cpu_rmsnorm(float *out, const float *x, const float *gain, int64_t n, float eps);

float cpu_dot(const float *a, const float *b, int64_t n);

static inline float cpu_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float cpu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

#endif
