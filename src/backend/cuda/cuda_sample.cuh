// cuda_sample.cuh — token sampling on the device (cuda_sample.cu): the host
// sampler's algorithm (src/model/sampler.c, lilac_sample) run on device logits,
// with the per-sequence state (penalty counts, seen flags, xoshiro state) kept
// on the device and updated there when a token is picked. Given the same logits
// and seed it picks the same token as lilac_sample, except where a different
// summation order flips a near-tie. Only the token id crosses to the host.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../../model/sampler.h"
#include "../../util/common.h"
}

struct cuda_sampler; // one sequence's sampler state and scratch on the device

// Buffers for a vocabulary of `vocab` (about 10 bytes per entry). NULL + err on failure.
cuda_sampler *cuda_sampler_new(int64_t vocab, lilac_err *err);
void cuda_sampler_free(cuda_sampler *c);
// Start a request as lilac_sampler_begin does (counts cleared, prompt ids marked
// seen, the generator seeded from lilac_sampling_seed(p)). Runs on `st` and
// waits for it. 0, or -1 + err.
int cuda_sampler_begin(cuda_sampler *c, const lilac_sampling *p, const int32_t *prompt, int n_prompt, cudaStream_t st,
                       lilac_err *err);
// Enqueue the pick of one token from device logits [vocab] on `st`: three kernel
// launches, no host synchronisation, capturable into a CUDA graph (the logits
// pointer is baked in; parameters and state are read from device memory). The
// token is recorded in the state (for the penalties) and written to host-mapped
// memory: read it with cuda_sampler_result once `st` has completed.
int cuda_sampler_launch(cuda_sampler *c, const float *d_logits, cudaStream_t st, lilac_err *err);
// The token of the last completed launch, or -1 + err (an internal inconsistency).
int32_t cuda_sampler_result(cuda_sampler *c, lilac_err *err);
// Test hook: how many elements the selection kernel sorts in shared memory at
// once (1..2048, default 2048); smaller values force its radix fallback. Takes
// effect at the next cuda_sampler_begin.
void cuda_sampler_set_cap(cuda_sampler *c, int cap);
