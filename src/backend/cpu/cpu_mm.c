/* cpu_mm.c — see cpu_mm.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../util/diag.h"
#include "../../util/common.h"
#include "cpu_mm.h"
#include "cpu_ops.h"
#include "cpu_pool.h"

static const cpu_kernels *g_kernels;
static bool g_kernels_set;

const cpu_kernels *cpu_mm_kernels(void) {
    if (g_kernels_set) return g_kernels;
    const char *e = lilac_diag()->cpu_kernels;
    static const char *const names[CPU_ISA_COUNT] = {"scalar", "avx2", "avxvnni", "avx512vnni"};
    g_kernels = cpu_kernels_best();
    if (e && *e) {
        if (!strcmp(e, "ref")) g_kernels = NULL;
        else {
            int isa = -1;
            for (int i = 0; i < CPU_ISA_COUNT; i++)
                if (!strcmp(e, names[i])) isa = i;
            if (isa < 0) lilac_die("LILAC_CPU_KERNELS=%s: not one of ref, scalar, avx2, avxvnni, avx512vnni", e);
            g_kernels = cpu_kernels_for((cpu_isa)isa);
            if (!g_kernels) lilac_die("LILAC_CPU_KERNELS=%s: this CPU cannot run it", e);
        }
    }
    g_kernels_set = true;
    return g_kernels;
}

void cpu_mm_use(const cpu_kernels *k) {
    g_kernels = k;
    g_kernels_set = true;
}

static bool is_fast(const cpu_mm *m) { return m->a && cpu_kernels_take(&m->W) && cpu_mm_kernels(); }

/* Weight bytes of one row, and a row's cost: its bytes read once plus its
 * products with T tokens (a token's products weigh like a quarter read). */
static int64_t row_bytes(const lilac_matrix *W) {
    return W->type == MAT_AFFINE ? W->cols * W->bits / 8 + 4 * (W->cols / W->group) : W->cols * 2;
}
static int64_t row_cost(const cpu_mm *m) { return row_bytes(&m->W) * (4 + (int64_t)m->T) / 5; }

typedef struct {
    const cpu_mm *items;
    int n;
    int64_t total;
} mm_job;

static void mm_rows(const cpu_mm *m, int64_t r0, int64_t r1) {
    if (r0 >= r1) return;
    if (is_fast(m)) {
        const cpu_kernels *k = cpu_mm_kernels();
        (m->W.bits == 4 ? k->gemv4 : k->gemv8)(&m->W, r0, r1, m->a, m->y, m->ystride);
    } else {
        cpu_matmul_rows(&m->W, m->x, m->T, m->y, m->ystride, r0, r1);
    }
}

static void mm_part(void *c, int tid, int nth) {
    const mm_job *j = c;
    /* this thread's share [lo, hi) of the summed costs; a row belongs to the share its first byte falls in */
    const int64_t lo = (int64_t)((__int128)j->total * tid / nth), hi = (int64_t)((__int128)j->total * (tid + 1) / nth);
    int64_t off = 0;
    for (int i = 0; i < j->n && off < hi; i++) {
        const cpu_mm *m = &j->items[i];
        const int64_t rc = row_cost(m), end = off + rc * m->W.rows;
        if (end > lo) {
            int64_t r0 = lo > off ? (lo - off + rc - 1) / rc : 0, r1 = (hi - off + rc - 1) / rc;
            if (r1 > m->W.rows) r1 = m->W.rows;
            mm_rows(m, r0, r1);
        }
        off = end;
    }
}

void cpu_mm_run(const cpu_mm *items, int n) {
    mm_job j = {.items = items, .n = n};
    for (int i = 0; i < n; i++) j.total += row_cost(&items[i]) * items[i].W.rows;
    if (j.total < 16384) mm_part(&j, 0, 1);
    else cpu_pool_run(mm_part, &j);
}
