/* diag.c — reads the diagnostics of diag.h from the environment, once. */
#include "diag.h"

#include <pthread.h>
#include <stdlib.h>

static lilac_diag_opts g_diag;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static const char *set(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static void read_env(void) {
    const char *v;
    g_diag.verbose = set("LILAC_VERBOSE") != NULL;
    g_diag.profile = set("LILAC_PROFILE") != NULL;
    g_diag.ablate = set("LILAC_ABLATE");
    g_diag.moe_prof_layer = (v = set("LILAC_MOE_PROF")) ? atoi(v) : -1;
    g_diag.bench_two = set("LILAC_BENCH_TWO") != NULL;
    g_diag.cpu_kernels = set("LILAC_CPU_KERNELS");
    g_diag.convert_free_bytes = set("LILAC_CONVERT_FREE_BYTES");
    g_diag.convert_die_after = (v = set("LILAC_CONVERT_DIE_AFTER")) ? atol(v) : -1;
}

const lilac_diag_opts *lilac_diag(void) {
    pthread_once(&g_once, read_env);
    return &g_diag;
}
