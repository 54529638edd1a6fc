/* quantize.h — MLX affine quantization (spec/model.md §4), used by `lilac convert` and
 * by lilac_model_quantize (an HF bf16 checkpoint quantized in memory at load).
 * This is MLX's CPU `fast::Quantize` for affine mode: per group min/max in f32, the
 * signed-scale rule, zero exactly representable, rint (round half to even), codes
 * packed LSB first. */
#ifndef LILAC_QUANTIZE_H
#define LILAC_QUANTIZE_H

#include "../util/common.h"

/* Quantize `rows` rows of `cols` bf16 values (row-major) exactly as MLX's affine
 * quantize does: codes [rows, cols*bits/32] u32, scales/biases [rows, cols/group]
 * bf16. cols must be a multiple of group, group a multiple of 32/bits.
 * Returns -1 when every value is finite, else the index of the first non-finite
 * value (nothing meaningful is written for its group). */
int64_t lilac_affine_quantize_bf16(const uint16_t *w, int64_t rows, int64_t cols, int bits, int group,
                                   uint32_t *q, uint16_t *scales, uint16_t *biases);

#endif
