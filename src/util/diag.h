/* diag.h — the diagnostics and test hooks lilac reads from the environment, in one place.
 *
 * These are for developers measuring or testing lilac, never for users (a user-facing setting
 * is a CLI flag). Each is read once, on first use, into one struct:
 *
 *   LILAC_VERBOSE=1            the CUDA backend reports its uploads and repacks
 *   LILAC_PROFILE=1            the CUDA decode step is timed per phase (bench prints the table)
 *   LILAC_ABLATE=gdn,attn,...  the CUDA decode leaves kernels out (timing only: tokens are wrong)
 *   LILAC_MOE_PROF=L           the decode MoE of layer L records its in-kernel timeline
 *   LILAC_BENCH_TWO=1          lilac bench also times forward() of one and of two tokens
 *   LILAC_CPU_KERNELS=K        the CPU backend's matrix kernels: ref (the f32 reference path), or one
 *                              set forced: scalar, avx2, avxvnni, avx512vnni (default: the best this
 *                              CPU runs)
 *   LILAC_CONVERT_FREE_BYTES=N lilac convert's disk-space check sees N free bytes (test hook)
 *   LILAC_CONVERT_DIE_AFTER=N  lilac convert exits after N tensors, as a crash would (test hook)
 */
#ifndef LILAC_DIAG_H
#define LILAC_DIAG_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    bool verbose;
    bool profile;
    const char *ablate;           /* NULL: off */
    int moe_prof_layer;           /* -1: off */
    bool bench_two;
    const char *cpu_kernels;      /* NULL: the best set this CPU runs */
    const char *convert_free_bytes; /* NULL: the real free space */
    long convert_die_after;       /* -1: off */
} lilac_diag_opts;

/* The diagnostics, read from the environment on the first call. */
const lilac_diag_opts *lilac_diag(void);

#ifdef __cplusplus
}
#endif
#endif
