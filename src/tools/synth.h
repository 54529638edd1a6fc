/* synth.h — write a random-weight checkpoint of any consistent geometry of this
 * architecture in the mlx-community 4-bit format (the MLX layout, shards with an
 * index, config.json with the quantization block). Deterministic by seed;
 * tensors are generated in parallel. Used by `lilac synth` (the real geometry)
 * and by `lilac demo` (a tiny one). */
#ifndef LILAC_SYNTH_H
#define LILAC_SYNTH_H

#include "../model/config.h"

typedef struct {
    uint64_t seed;
    size_t shard_bytes;     /* split into shards of at most this size (0: one file) */
    const char *config_note; /* optional: a "lilac_note" string in config.json */
    bool quiet;
} lilac_synth_opts;

/* Writes DIR/config.json and the safetensors (one file, or shards + index).
 * `c` needs the geometry fields, eos_id and max_pos. 0, or -1 + err. */
int lilac_synth_write(const char *dir, const lilac_config *c, const lilac_synth_opts *o, lilac_err *err);

#endif
