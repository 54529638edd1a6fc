/* bench.h — `lilac bench`'s measurement (bench.c): prefill and decode throughput
 * of one checkpoint on one backend, printed as a table and optionally as JSON. */
#ifndef LILAC_BENCH_H
#define LILAC_BENCH_H

typedef struct {
    const char *model;       /* checkpoint directory */
    const char *backend;     /* NULL: the default backend */
    const char *prompt_lens; /* comma-separated prompt lengths */
    const char *json;        /* NULL, or a file for the JSON results */
    long decode_steps, rounds, threads;
} lilac_bench_opts;

/* Runs the benchmark; dies with a message on any error. Returns the exit code. */
int lilac_bench(const lilac_bench_opts *o);

#endif
