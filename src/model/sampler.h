/* sampler.h — token selection on the host from a logits vector: repetition,
 * presence and frequency penalties, temperature, top-k, top-p, min-p, and a
 * seeded generator; plus log-probabilities for the OpenAI `logprobs` fields. */
#ifndef LILAC_SAMPLER_H
#define LILAC_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "sampling.h"

void lilac_sampling_default(lilac_sampling *p);
/* The generator seed of a request: p->seed, or a fresh one when !has_seed. */
uint64_t lilac_sampling_seed(const lilac_sampling *p);

typedef struct {
    uint64_t s[4];
} lilac_rng;

void lilac_rng_seed(lilac_rng *r, uint64_t seed);
double lilac_rng_uniform(lilac_rng *r); /* [0, 1) */

/* Per-sequence sampler state: penalty counts and scratch space. */
typedef struct {
    int64_t vocab;
    int32_t *out_count;  /* [vocab] occurrences in the output */
    uint8_t *seen;       /* [vocab] 1 if in the prompt or output */
    float *work;         /* [vocab] penalised logits */
    int32_t *idx;        /* [vocab] candidate ids */
    lilac_rng rng;
} lilac_sampler;

void lilac_sampler_init(lilac_sampler *s, int64_t vocab);
void lilac_sampler_free(lilac_sampler *s);
/* Start a request: clear the counts, mark the prompt tokens, seed the rng. */
void lilac_sampler_begin(lilac_sampler *s, const lilac_sampling *p, const int32_t *prompt, int n_prompt);
/* Record a generated token (for the penalties). */
void lilac_sampler_accept(lilac_sampler *s, int32_t tok);
/* Pick the next token. `logits` is not modified. */
int32_t lilac_sample(lilac_sampler *s, const lilac_sampling *p, const float *logits);

/* log-softmax of the raw logits at `tok`, and the k most likely tokens with
 * their log-probabilities (k <= 20), most likely first. */
void lilac_logprobs(const float *logits, int64_t vocab, int32_t tok, int k, float *lp_tok, int32_t *top_ids,
                    float *top_lps);

#endif
