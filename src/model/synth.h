/* synth.h — write a random-weight checkpoint of any consistent geometry of this
 * architecture in the mlx-community 4-bit format (the MLX layout, shards with an
 * index, config.json with the quantization block). Deterministic by seed;
 * tensors are generated in parallel. Used by `lilac synth` (the real geometry)
 * and by `lilac demo` (a tiny one). */
#ifndef LILAC_SYNTH_H
#define LILAC_SYNTH_H

#include "config.h"

/* Router weights (`lilac synth --router`): how tokens spread over the experts.
 * RANDOM is the default (every router row random: tokens spread evenly, near-ties
 * only by chance). The others exist to test routing under skew; each is built
 * from what the 8-bit affine router format holds (codes, and a bf16 scale and
 * bias per group of 64):
 *  TIES  every router row is a copy of row 0, so every token's logits tie exactly
 *        and the lowest-index rule routes every token to experts 0..top_k-1 (all
 *        others empty), with weights 1/top_k after renormalisation.
 *  ONE   expert lilac_synth_one_expert(E) dominates: nearly every token picks it
 *        first; the other rows stay random.
 *  SKEW  a few hot experts (spread over the index range) take most picks, most
 *        experts are (nearly) never picked, the rest stay random.
 * ONE and SKEW need a direction that every token's hidden state shares (the
 * router has no bias term): every embedding group's bias is raised by
 * LILAC_SYNTH_EMBED_OFFSET (the entries have sd 1), so the hidden states share a
 * component along the all-ones vector, and an expert is made hot (cold) by
 * raising (lowering) all of its router row's group biases, which adds
 * lilac_synth_router_shift(...) to its logit. The layers' outputs dilute that
 * direction (by their share of the residual stream); the bias shifts grow with
 * depth to match, so the skew holds through all 40 layers (synth.c). */
typedef enum { LILAC_ROUTER_RANDOM = 0, LILAC_ROUTER_TIES, LILAC_ROUTER_ONE, LILAC_ROUTER_SKEW } lilac_synth_router;

#define LILAC_SYNTH_EMBED_OFFSET 0.5f

typedef struct {
    uint64_t seed;
    size_t shard_bytes;     /* split into shards of at most this size (0: one file) */
    const char *config_note; /* optional: a "lilac_note" string in config.json */
    bool quiet;
    lilac_synth_router router; /* 0: random (the default) */
} lilac_synth_opts;

/* "random", "ties", "one", "skew" -> the mode; -1 for anything else. */
int lilac_synth_router_parse(const char *name);
const char *lilac_synth_router_name(lilac_synth_router r);
/* The expert that mode ONE favours among E. */
int lilac_synth_one_expert(int E);
/* The logit shift mode r gives expert e of E (0 for RANDOM and TIES; for SKEW:
 * > 0 hot, < 0 cold, 0 random), for a hidden state that carries the embedding's
 * offset undiluted. */
float lilac_synth_router_shift(lilac_synth_router r, int E, int e);

/* Makes the last of c's n_layers a full-attention layer when the every-4th
 * pattern gives none among them (n_layers 2 and 3): every synth checkpoint of
 * two or more layers runs attention. Other layer counts are left as they are. */
void lilac_synth_ensure_attention(lilac_config *c);

/* Writes DIR/config.json and the safetensors (one file, or shards + index).
 * `c` needs the geometry fields, eos_id and max_pos. 0, or -1 + err. */
int lilac_synth_write(const char *dir, const lilac_config *c, const lilac_synth_opts *o, lilac_err *err);

#endif
