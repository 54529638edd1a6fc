// Every kernel's start and end on the GPU, as CUPTI's activity records report
// them, for a program run unchanged: the CUDA driver loads this library when
// CUDA_INJECTION64_PATH names it (as Nsight Systems does), and at exit it writes
// one line per kernel to $KTRACE_OUT (default ktrace.tsv):
//   start_ns  end_ns  graph_node  grid(x*y*z)  block(x)  name
// Kernels inside CUDA graphs, and kernels that overlap under programmatic
// dependent launch, are reported each with their own times. tools/device/
// step_trace.py turns the records into a decode step's timeline. A device tool
// (tools/device/run.sh trace); not part of lilac.
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KT_BUF (8u << 20)
static FILE *kt_out;
static unsigned long long kt_n, kt_dropped;

static void CUPTIAPI kt_request(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, KT_BUF);
    *size = *buf ? KT_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI kt_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        if (kt_out)
            fprintf(kt_out, "%llu\t%llu\t%llu\t%d\t%d\t%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                    (unsigned long long)k->graphNodeId, k->gridX * k->gridY * k->gridZ, k->blockX,
                    k->name ? k->name : "?");
        kt_n++;
    }
    size_t d = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &d) == CUPTI_SUCCESS) kt_dropped += d;
    free(buf);
}

static void kt_finish(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (kt_out) fclose(kt_out);
    fprintf(stderr, "kernel_trace: %llu kernels recorded, %llu dropped\n", kt_n, kt_dropped);
}

int InitializeInjection(void) {
    const char *path = getenv("KTRACE_OUT");
    kt_out = fopen(path && *path ? path : "ktrace.tsv", "w");
    if (!kt_out) {
        fprintf(stderr, "kernel_trace: cannot write %s\n", path && *path ? path : "ktrace.tsv");
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(kt_request, kt_complete) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI refused the kernel activity\n");
        return 0;
    }
    atexit(kt_finish);
    return 1;
}
