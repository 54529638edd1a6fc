/* cpu_kernels.h — the fast path's matrix kernels: affine 4-bit and 8-bit
 * weights (group 64, w = s*q + b) times activations quantised to integers.
 *
 * Activations: each group of 64 values x gets one step d = max|x|/127 and
 * three int8 pieces, x ~= d*(h + m/256 + l/65536): h = round(x/d) in
 * [-127, 127], then m and l each the rounded remainder of the piece before,
 * times 256, in [-128, 127]. That is x to f32 precision (2^-24 of the group's
 * largest value): the products then agree with the f32 reference to its own
 * rounding, so the MLX-LM bars hold on the fast path too. The exact f32 sum
 * of each group is kept for the bias term:
 *   sum_i x_i (s q_i + b) = s * d/256 * sum_i q_i (256 h_i + m_i + l_i/256) + b * sum_i x_i,
 * with 256 sum q h + sum q m exact in int32 and sum q l another int32.
 * The weights stay as the checkpoint stores them (no repack, no copy): the
 * pieces are laid out to match the codes instead. A 4-bit byte holds element
 * 2i (low nibble) and 2i+1 (high nibble), so per pair of groups (A, B) the
 * pieces are stored [A even | B even | A odd | B odd] (32 bytes each): one
 * 64-byte load of codes, split into nibbles, meets two 64-byte loads of
 * pieces. A lone last group (odd group count) is stored [even | odd]. 8-bit
 * codes are bytes in element order; their pieces are stored in element order.
 *
 * Each kernel set (scalar, AVX2, AVX-VNNI, AVX-512 VNNI) computes the same
 * integer sums exactly; only the f32 order of the scale/bias folding differs.
 * cpu_kernels_best() picks the fastest the CPU runs, from cpuid at run time. */
#ifndef LILAC_CPU_KERNELS_H
#define LILAC_CPU_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "../../model/weights.h"

/* Quantised activations: T rows of `cols` values (cols a multiple of 64). */
typedef struct {
    int64_t cols, ng; /* ng = cols / 64 */
    int T, cap;       /* rows held, rows allocated */
    int64_t cols_cap; /* values allocated */
    int8_t *ph, *pm, *pl; /* [T][cols]: 4-bit order (see above), the pieces h, m, l */
    int8_t *nh, *nm, *nl; /* [T][cols]: element order, for 8-bit codes */
    float *dq;        /* [T][ng]: d/256 */
    float *xs;        /* [T][ng]: exact group sums */
} cpu_qact;

/* Size a for T rows of cols values (reusing its buffers when they fit). */
void cpu_qact_reserve(cpu_qact *a, int T, int64_t cols);
void cpu_qact_free(cpu_qact *a);
/* Quantise row t of a from x[cols]. */
void cpu_qact_row(cpu_qact *a, int t, const float *x);
/* Row td of dst = row ts of src (same cols). */
void cpu_qact_copy_row(cpu_qact *dst, int td, const cpu_qact *src, int ts);

/* y[t * ystride + r] = W[r] . x[t] for rows [r0, r1) and all a->T rows t.
 * W: MAT_AFFINE, group 64, cols == a->cols. */
typedef void (*cpu_gemv_fn)(const lilac_matrix *W, int64_t r0, int64_t r1, const cpu_qact *a, float *y,
                            int64_t ystride);

typedef struct {
    const char *name;
    cpu_gemv_fn gemv4, gemv8;
} cpu_kernels;

typedef enum { CPU_ISA_SCALAR, CPU_ISA_AVX2, CPU_ISA_AVXVNNI, CPU_ISA_AVX512VNNI, CPU_ISA_COUNT } cpu_isa;

/* The kernel set for one ISA; NULL when this CPU (or this compiler) cannot run it. */
const cpu_kernels *cpu_kernels_for(cpu_isa isa);
/* The fastest set this CPU runs. */
const cpu_kernels *cpu_kernels_best(void);

#define CPU_MAX_GROUPS 256 /* groups per row the kernels take (cols <= 16384) */

/* Whether the fast kernels take W (affine, group 64, 4 or 8 bits). */
static inline bool cpu_kernels_take(const lilac_matrix *W) {
    return W->type == MAT_AFFINE && W->group == 64 && (W->bits == 4 || W->bits == 8) && W->cols % 64 == 0 &&
           W->cols / 64 <= CPU_MAX_GROUPS;
}

/* Per-ISA sets (cpu_kernels_*.c); each is compiled for its ISA with function
 * target attributes, so the build flags do not decide which run. */
extern const cpu_kernels cpu_kernels_scalar;
#if defined(__x86_64__)
extern const cpu_kernels cpu_kernels_avx2, cpu_kernels_avxvnni, cpu_kernels_avx512vnni;
#endif

#endif
