/* cpu_pool.h — one persistent set of worker threads for the CPU forward pass.
 *
 * cpu_pool_run hands one job to every thread (the caller is thread 0) and
 * returns when all have finished: one wake-up and one join per job, no thread
 * creation. Idle workers spin briefly, then sleep on a futex, so a pool left
 * alone costs nothing and a pool in use wakes in microseconds. Jobs from
 * different callers are serialised. */
#ifndef LILAC_CPU_POOL_H
#define LILAC_CPU_POOL_H

#include <stdint.h>

typedef void (*cpu_pool_fn)(void *ctx, int tid, int nth);

/* The process's pool: created on the first call with `threads` threads (<= 0:
 * the CPUs this process may run on); a later call with a different positive
 * count rebuilds it. Not to be called while a job runs. */
void cpu_pool_use(int threads);

/* Threads of the pool (creating it with the default count if needed). */
int cpu_pool_threads(void);

/* Run fn(ctx, tid, nth) on every thread tid < nth; returns when all are done. */
void cpu_pool_run(cpu_pool_fn fn, void *ctx);

/* [lo, hi) of n items for thread tid of nth: equal contiguous shares. */
static inline void cpu_pool_share(int64_t n, int tid, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * tid / nth;
    *hi = n * (tid + 1) / nth;
}

/* Parallel loop over [0, n): fn(ctx, i) for every i, in contiguous shares. */
typedef void (*cpu_pool_item_fn)(void *ctx, int64_t i);
void cpu_pool_for(int64_t n, cpu_pool_item_fn fn, void *ctx);
/* The same, items handed out one at a time (for items of unequal cost). */
void cpu_pool_for_dynamic(int64_t n, cpu_pool_item_fn fn, void *ctx);

#endif
