/* sampling.h — how a request wants its tokens chosen: the parameters of
 * generation_config.json and of the OpenAI API. A plain description shared by
 * the server, the engine (through the host sampler, sampler.h) and the
 * backends (backend.h: device sampling), so none of them depends on another. */
#ifndef LILAC_SAMPLING_H
#define LILAC_SAMPLING_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    float temperature;        /* <= 0: greedy (argmax) */
    float top_p;              /* 1: off */
    int top_k;                /* <= 0: off */
    float min_p;              /* 0: off */
    float presence_penalty;   /* OpenAI: subtracted once per token seen in the output */
    float frequency_penalty;  /* OpenAI: subtracted per occurrence in the output */
    float repetition_penalty; /* vLLM/HF: 1 = off; divides positive logits of tokens in prompt or output */
    uint64_t seed;
    bool has_seed;
} lilac_sampling;

#endif
