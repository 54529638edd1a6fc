/* cpu_pool.c — see cpu_pool.h. Linux futexes on two counters: `gen` (a new
 * job: workers wait for it to change) and `left` (threads still running the
 * job: the caller waits for it to reach 0). */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cpu_pool.h"

#define SPIN_NS 200000 /* how long an idle thread polls before it sleeps */

typedef struct {
    int nth;
    pthread_t *tid;
    atomic_uint gen;      /* bumped per job; UINT_MAX-ish wrap is fine */
    atomic_int left;      /* threads of the current job not yet done */
    atomic_int sleepers;  /* workers blocked in futex_wait on gen */
    atomic_int caller_sleeping;
    atomic_bool quit;
    cpu_pool_fn fn;
    void *ctx;
} pool;

static pool *g_pool;
static pthread_mutex_t g_run_lock = PTHREAD_MUTEX_INITIALIZER;

static long futex(atomic_uint *addr, int op, unsigned val) {
    return syscall(SYS_futex, (unsigned *)addr, op, val, NULL, NULL, 0);
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Wait until *addr != old: poll for SPIN_NS, then sleep on the futex. */
static void wait_change(atomic_uint *addr, unsigned old, atomic_int *sleepers) {
    const uint64_t t0 = now_ns();
    for (int i = 0; atomic_load_explicit(addr, memory_order_acquire) == old; i++) {
        if ((i & 63) == 63 && now_ns() - t0 > SPIN_NS) {
            atomic_fetch_add(sleepers, 1);
            while (atomic_load(addr) == old) futex(addr, FUTEX_WAIT_PRIVATE, old);
            atomic_fetch_sub(sleepers, 1);
            return;
        }
        cpu_relax();
    }
}

static void job_done(pool *p) {
    if (atomic_fetch_sub(&p->left, 1) == 1 && atomic_load(&p->caller_sleeping))
        futex((atomic_uint *)&p->left, FUTEX_WAKE_PRIVATE, 1);
}

typedef struct {
    pool *p;
    int id;
} worker_arg;

static void *worker(void *arg) {
    worker_arg a = *(worker_arg *)arg;
    free(arg);
    pool *p = a.p;
    unsigned seen = 0; /* gen at creation: a job posted before this thread ran is not missed */
    for (;;) {
        wait_change(&p->gen, seen, &p->sleepers);
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (atomic_load(&p->quit)) return NULL;
        p->fn(p->ctx, a.id, p->nth);
        job_done(p);
    }
}

static int default_threads(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void pool_free(pool *p) {
    if (!p) return;
    atomic_store(&p->quit, true);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    futex(&p->gen, FUTEX_WAKE_PRIVATE, (unsigned)p->nth);
    for (int i = 1; i < p->nth; i++) pthread_join(p->tid[i], NULL);
    free(p->tid);
    free(p);
}

static pool *pool_new(int n) {
    pool *p = calloc(1, sizeof *p);
    if (!p) abort();
    p->nth = n;
    p->tid = calloc((size_t)n, sizeof(pthread_t));
    if (!p->tid) abort();
    for (int i = 1; i < n; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) abort();
        *a = (worker_arg){p, i};
        if (pthread_create(&p->tid[i], NULL, worker, a) != 0) {
            /* fewer threads than asked: run with those that started */
            free(a);
            fprintf(stderr, "lilac: could only start %d of %d CPU threads\n", i, n);
            p->nth = i;
            break;
        }
    }
    return p;
}

void cpu_pool_use(int threads) {
    pthread_mutex_lock(&g_run_lock);
    if (threads <= 0) threads = g_pool ? g_pool->nth : default_threads();
    if (threads > 1024) threads = 1024;
    if (!g_pool || g_pool->nth != threads) {
        pool_free(g_pool);
        g_pool = pool_new(threads);
    }
    pthread_mutex_unlock(&g_run_lock);
}

int cpu_pool_threads(void) {
    if (!g_pool) cpu_pool_use(0);
    return g_pool->nth;
}

void cpu_pool_run(cpu_pool_fn fn, void *ctx) {
    if (!g_pool) cpu_pool_use(0);
    pthread_mutex_lock(&g_run_lock);
    pool *p = g_pool;
    if (p->nth == 1) {
        fn(ctx, 0, 1);
        pthread_mutex_unlock(&g_run_lock);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->left, p->nth - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers)) futex(&p->gen, FUTEX_WAKE_PRIVATE, (unsigned)p->nth);
    fn(ctx, 0, p->nth);
    /* join: poll, then sleep until the last worker wakes us */
    const uint64_t t0 = now_ns();
    for (int i = 0; atomic_load_explicit(&p->left, memory_order_acquire) > 0; i++) {
        if ((i & 63) == 63 && now_ns() - t0 > SPIN_NS) {
            atomic_store(&p->caller_sleeping, 1);
            int v;
            while ((v = atomic_load(&p->left)) > 0)
                futex((atomic_uint *)&p->left, FUTEX_WAIT_PRIVATE, (unsigned)v);
            atomic_store(&p->caller_sleeping, 0);
            break;
        }
        cpu_relax();
    }
    pthread_mutex_unlock(&g_run_lock);
}

typedef struct {
    cpu_pool_item_fn fn;
    void *ctx;
    int64_t n;
    atomic_llong next;
} for_job;

static void for_static(void *c, int tid, int nth) {
    for_job *j = c;
    int64_t lo, hi;
    cpu_pool_share(j->n, tid, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) j->fn(j->ctx, i);
}

static void for_dynamic(void *c, int tid, int nth) {
    (void)tid, (void)nth;
    for_job *j = c;
    for (int64_t i; (i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n;) j->fn(j->ctx, i);
}

void cpu_pool_for(int64_t n, cpu_pool_item_fn fn, void *ctx) {
    for_job j = {.fn = fn, .ctx = ctx, .n = n};
    if (n <= 1) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    cpu_pool_run(for_static, &j);
}

void cpu_pool_for_dynamic(int64_t n, cpu_pool_item_fn fn, void *ctx) {
    for_job j = {.fn = fn, .ctx = ctx, .n = n};
    atomic_init(&j.next, 0);
    if (n <= 1) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    cpu_pool_run(for_dynamic, &j);
}
