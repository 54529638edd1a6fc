/* convert.h — `lilac convert`: the official Qwen bf16 release (HF layout, spec §2.1) to
 * the mlx-community affine-quantized layout (spec §2.2), producing the tensors mlx-lm's
 * own conversion (`mlx_lm.convert -q`) writes, byte for byte: same names, shapes,
 * dtypes, codes, scales, biases, norms (bf16(1+w)), conv taps, shard split, index and
 * config.json. Streams tensor by tensor (fused experts expert by expert), multi-threaded,
 * into a temporary directory renamed at the end.
 *
 * The quantizer (lilac_affine_quantize_bf16) is MLX's CPU `fast::Quantize` for affine
 * mode (spec §4): per group min/max in f32, the signed-scale rule, zero exactly
 * representable, rint (round half to even), codes packed LSB first. */
#ifndef LILAC_CONVERT_H
#define LILAC_CONVERT_H

#include "../util/common.h"

typedef struct {
    int bits;            /* 2, 4 or 8 (default 4) */
    int group;           /* 32, 64 or 128 (default 64) */
    bool no_mtp;         /* drop the MTP head (by default it goes to OUT_DIR/mtp.safetensors, quantized
                          * like the layers, outside the index, so the shards stay mlx-lm's) */
    bool mtp_only;       /* write only mtp.safetensors, into OUT_DIR: an existing converted checkpoint
                          * of the same geometry (e.g. an mlx-community download, which lacks the head) */
    bool quiet;          /* no progress lines */
    int threads;         /* 0: all cores */
    size_t shard_bytes;  /* shard limit; 0: mlx-lm's 5 GiB */
} lilac_convert_opts;

/* Convert HF_DIR -> OUT_DIR. OUT_DIR must not exist (or be an empty directory).
 * Work happens in OUT_DIR.lilac-partial (removed first if a previous run left
 * one), renamed to OUT_DIR only when everything is written and synced.
 * Returns 0, or -1 + err (one line naming the file/tensor). */
int lilac_convert(const char *from, const char *to, const lilac_convert_opts *o, lilac_err *err);

/* The quantizer itself is lilac_affine_quantize_bf16 in ../model/quantize.h. */

#endif
