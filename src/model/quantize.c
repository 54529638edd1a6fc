/* quantize.c — see quantize.h. */
#include <math.h>

#include "quantize.h"

/* ------------------------------------------------------------------------- */
/* The quantizer: MLX mlx/backend/cpu/quantized.cpp `quantize`, affine mode. */

static inline int64_t quantize_group(const uint16_t *w, int group, int bits, uint32_t *q, uint16_t *s_out,
                                     uint16_t *b_out) {
    const float n_bins = (float)((1 << bits) - 1);
    const float eps = 1e-7f;
    float v[128];
    float w_min = INFINITY, w_max = -INFINITY;
    for (int j = 0; j < group; j++) {
        v[j] = bf16_to_f32(w[j]);
        if (!isfinite(v[j])) return j;
        w_max = w_max < v[j] ? v[j] : w_max; /* std::max(w_max, x) */
        w_min = v[j] < w_min ? v[j] : w_min; /* std::min(w_min, x) */
    }
    const bool mask = fabsf(w_min) > fabsf(w_max);
    float scale = (w_max - w_min) / n_bins;
    scale = scale < eps ? eps : scale;
    scale = mask ? scale : -scale;
    const float edge = mask ? w_min : w_max;
    const float q0 = rintf(edge / scale);
    float bias = 0;
    if (q0 != 0) {
        scale = edge / q0;
        bias = edge;
    }
    const int per_word = 32 / bits;
    for (int j = 0; j < group / per_word; j++) {
        uint32_t word = 0;
        for (int k = 0; k < per_word; k++) {
            float x = rintf((v[j * per_word + k] - bias) / scale);
            x = x < 0.0f ? 0.0f : x;
            x = n_bins < x ? n_bins : x;
            word |= (uint32_t)x << (k * bits);
        }
        q[j] = word;
    }
    *s_out = f32_to_bf16(scale);
    *b_out = f32_to_bf16(bias);
    return -1;
}

int64_t lilac_affine_quantize_bf16(const uint16_t *w, int64_t rows, int64_t cols, int bits, int group,
                                   uint32_t *q, uint16_t *scales, uint16_t *biases) {
    const int64_t groups = rows * (cols / group);
    const int64_t words_per_group = group * bits / 32;
    for (int64_t g = 0; g < groups; g++) {
        int64_t bad = quantize_group(w + g * group, group, bits, q + g * words_per_group, scales + g, biases + g);
        if (bad >= 0) return g * group + bad;
    }
    return -1;
}
