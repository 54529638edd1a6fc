/* cpu_mm.h — several matrix products as one job of the thread pool.
 *
 * The forward pass hands over every product that can run at once (the four
 * projections of a GDN layer, the routed experts of a token, ...) and the
 * pool splits their rows over the threads in equal shares of weight bytes
 * (times tokens), so one wake-up and one join cover them all.
 *
 * Each product runs on the fast kernels (cpu_kernels.h: quantised
 * activations) where they take the matrix and a quantised input is given,
 * else on the f32 reference (cpu_ops.h). */
#ifndef LILAC_CPU_MM_H
#define LILAC_CPU_MM_H

#include "cpu_kernels.h"

typedef struct {
    lilac_matrix W;    /* by value: expert views are temporaries */
    const float *x;    /* [T][cols] f32 input (the reference path) */
    const cpu_qact *a; /* the same input quantised (the fast path), or NULL */
    int T;
    float *y;          /* y[t * ystride + r] */
    int64_t ystride;
} cpu_mm;

/* Run n products as one job. */
void cpu_mm_run(const cpu_mm *items, int n);

/* The kernels the fast path runs: NULL for the f32 reference throughout.
 * Chosen once: LILAC_CPU_KERNELS=ref|scalar|avx2|avxvnni|avx512vnni, else the
 * fastest set the CPU runs (see docs/ARCHITECTURE.md: which path is the default). */
const cpu_kernels *cpu_mm_kernels(void);
/* Test hook: run k from now on (NULL: the f32 reference). Not while a forward pass runs. */
void cpu_mm_use(const cpu_kernels *k);

#endif
