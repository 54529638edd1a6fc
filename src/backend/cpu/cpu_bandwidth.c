/* cpu_bandwidth.c — the memory read bandwidth the CPU backend's threads reach:
 * the ceiling `lilac bench` holds the CPU decode against. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../util/common.h"
#include "cpu_pool.h"

typedef struct {
    const uint64_t *buf;
    int64_t n; /* words */
    uint64_t sink[64];
} read_job;

/* Each thread reads its share, eight independent streams of xors per 64-byte line. */
static void read_part(void *c, int tid, int nth) {
    read_job *j = c;
    int64_t lo, hi;
    cpu_pool_share(j->n / 8, tid, nth, &lo, &hi);
    uint64_t a[8] = {0};
    for (int64_t i = lo * 8; i < hi * 8; i += 8)
        for (int k = 0; k < 8; k++) a[k] ^= j->buf[i + k];
    j->sink[tid & 63] = a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}

/* Bytes per second read by the pool's threads from a 512 MiB buffer: the best of 5 passes. */
double lilac_cpu_read_bandwidth(void) {
    const size_t bytes = (size_t)512 << 20;
    uint64_t *buf = malloc(bytes);
    if (!buf) return 0;
    memset(buf, 1, bytes); /* fault every page in before timing */
    read_job j = {.buf = buf, .n = (int64_t)(bytes / 8)};
    double best = 0;
    for (int pass = 0; pass < 5; pass++) {
        const double t0 = lilac_now();
        cpu_pool_run(read_part, &j);
        const double dt = lilac_now() - t0;
        if (dt > 0 && bytes / dt > best) best = bytes / dt;
    }
    free(buf);
    return best;
}
