/* test_convert.c — the MLX affine quantizer of `lilac convert` on hand-checked groups
 * (byte identity against MLX itself is tests/convert/test_convert.py). */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "model/quantize.h"
#include "tools/convert.h"

static void fill(uint16_t *h, const float *f, int n) {
    for (int i = 0; i < n; i++) h[i] = f32_to_bf16(f[i]);
}

static int code(const uint32_t *q, int bits, int j) {
    const int per = 32 / bits;
    return (int)((q[j / per] >> ((j % per) * bits)) & ((1u << bits) - 1));
}

static void test_all_zero(void) {
    uint16_t w[64] = {0}, s, b;
    uint32_t q[8];
    CHECK(lilac_affine_quantize_bf16(w, 1, 64, 4, 64, q, &s, &b) == -1);
    CHECK(s == f32_to_bf16(-1e-7f)); /* scale stays -eps, bias 0 */
    CHECK(b == 0);
    for (int j = 0; j < 8; j++) CHECK(q[j] == 0);
}

static void test_all_equal(void) {
    float f[64];
    uint16_t w[64], s, b;
    uint32_t q[8];
    for (int i = 0; i < 64; i++) f[i] = 0.3721f;
    fill(w, f, 64);
    CHECK(lilac_affine_quantize_bf16(w, 1, 64, 4, 64, q, &s, &b) == -1);
    CHECK(b == w[0]);                  /* bias = the value */
    CHECK(bf16_to_f32(s) < 0 && bf16_to_f32(s) > -2e-7f); /* ~ -1e-7: negative scale */
    for (int j = 0; j < 8; j++) CHECK(q[j] == 0);
    CHECK(bf16_to_f32(s) * 0 + bf16_to_f32(b) == bf16_to_f32(w[0])); /* dequantizes exactly */
}

/* 0..15 with half-way points: scale -1, bias 15, code = 15 - w, ties to even. */
static void test_grid_ties(void) {
    float f[64];
    uint16_t w[64], s, b;
    uint32_t q[8];
    for (int i = 0; i < 64; i++) f[i] = (float)(i % 16);
    f[1] = 7.5f;  /* (7.5 - 15) / -1 = 7.5 -> 8 */
    f[2] = 6.5f;  /* 8.5 -> 8 */
    f[3] = 0.5f;  /* 14.5 -> 14 */
    fill(w, f, 64);
    CHECK(lilac_affine_quantize_bf16(w, 1, 64, 4, 64, q, &s, &b) == -1);
    CHECK(bf16_to_f32(s) == -1.0f && bf16_to_f32(b) == 15.0f);
    CHECK(code(q, 4, 0) == 15 && code(q, 4, 15) == 0 && code(q, 4, 4) == 11);
    CHECK(code(q, 4, 1) == 8 && code(q, 4, 2) == 8 && code(q, 4, 3) == 14);
}

/* |w_min| > |w_max|: positive scale, bias = w_min, zero representable. */
static void test_negative_and_error_bound(void) {
    float f[128];
    uint16_t w[128], s[2], b[2];
    uint32_t q[32];
    srand(3);
    for (int i = 0; i < 128; i++) f[i] = -(float)((double)rand() / RAND_MAX) - 0.01f;
    fill(w, f, 128);
    CHECK(lilac_affine_quantize_bf16(w, 1, 128, 8, 64, q, s, b) == -1);
    for (int g = 0; g < 2; g++) {
        const float sc = bf16_to_f32(s[g]), bi = bf16_to_f32(b[g]);
        CHECK(sc > 0 && bi < 0);
        for (int j = 0; j < 64; j++) {
            float d = sc * (float)code(q, 8, g * 64 + j) + bi;
            CHECKF(fabsf(d - bf16_to_f32(w[g * 64 + j])) <= 0.51f * sc + 1e-2f * sc + 4e-3f, "g%d j%d", g, j);
        }
    }
}

static void test_nonfinite(void) {
    uint16_t w[128] = {0}, s[2], b[2];
    uint32_t q[16];
    w[70] = 0x7fc0; /* NaN */
    CHECK(lilac_affine_quantize_bf16(w, 2, 64, 4, 64, q, s, b) == 70);
    w[70] = 0;
    w[5] = 0xff80; /* -inf */
    CHECK(lilac_affine_quantize_bf16(w, 1, 128, 2, 128, q, s, b) == 5);
}

int main(void) {
    TEST(test_all_zero);
    TEST(test_all_equal);
    TEST(test_grid_ties);
    TEST(test_negative_and_error_bound);
    TEST(test_nonfinite);
    return check_summary();
}
