/* test_cpu_ops.c — the CPU building blocks against independent derivations:
 * MLX affine dequantisation read byte by byte (spec/model.md §4 packing), the
 * matmul paths (fused decode GEMV, row-dequant GEMM, bf16) against a double-precision
 * naive product, RMSNorm against its definition. */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_ops.h"
#include "check.h"

static uint32_t rng = 12345;
static uint32_t rnd_u32(void) { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; return rng; }
static float rnd_f(void) { return (float)(rnd_u32() % 20001) / 10000.0f - 1.0f; }

/* Element j of a row, read from the little-endian byte stream: 4-bit values
 * sit two per byte (low nibble first), 8-bit values one per byte. */
static unsigned code_at(const uint32_t *row_words, int bits, int64_t j) {
    const uint8_t *b = (const uint8_t *)row_words;
    if (bits == 8) return b[j];
    return (b[j / 2] >> (4 * (j % 2))) & 0xf;
}

typedef struct {
    lilac_matrix m;
    uint32_t *q;
    uint16_t *s, *b;
} qmat;

static qmat make_affine(int64_t rows, int64_t cols, int bits, int group) {
    qmat Q;
    int64_t words = rows * cols * bits / 32, ng = rows * cols / group;
    Q.q = malloc(sizeof(uint32_t) * (size_t)words);
    Q.s = malloc(2 * (size_t)ng);
    Q.b = malloc(2 * (size_t)ng);
    for (int64_t i = 0; i < words; i++) Q.q[i] = rnd_u32();
    for (int64_t i = 0; i < ng; i++) {
        Q.s[i] = f32_to_bf16(rnd_f() * 0.1f); /* scales may be negative in MLX */
        Q.b[i] = f32_to_bf16(rnd_f());
    }
    Q.m = (lilac_matrix){.type = MAT_AFFINE, .rows = rows, .cols = cols, .bits = bits, .group = group,
                         .q = Q.q, .scales = Q.s, .biases = Q.b, .n_experts = 1, .expert_rows_stride = rows};
    return Q;
}

static double ref_w(const qmat *Q, int64_t r, int64_t c) {
    const lilac_matrix *m = &Q->m;
    int64_t g = r * (m->cols / m->group) + c / m->group;
    unsigned q = code_at(Q->q + r * (m->cols * m->bits / 32), m->bits, c);
    return (double)bf16_to_f32(Q->s[g]) * q + (double)bf16_to_f32(Q->b[g]);
}

static void test_dequant_rows(void) {
    for (int bits = 4; bits <= 8; bits += 4) {
        qmat Q = make_affine(5, 192, bits, 64);
        float row[192];
        double worst = 0;
        for (int r = 0; r < 5; r++) {
            lilac_mat_row(&Q.m, r, row);
            for (int c = 0; c < 192; c++) worst = fmax(worst, fabs(row[c] - ref_w(&Q, r, c)));
        }
        CHECKF(worst < 1e-6, "bits %d worst %g", bits, worst);
        free(Q.q); free(Q.s); free(Q.b);
    }
}

static void check_matmul(const qmat *Q, int T) {
    const lilac_matrix *m = &Q->m;
    float *x = calloc((size_t)(T * m->cols), sizeof(float)), *y = calloc((size_t)(T * m->rows), sizeof(float));
    for (int64_t i = 0; i < T * m->cols; i++) x[i] = rnd_f();
    cpu_matmul(m, x, T, y);
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int64_t r = 0; r < m->rows; r++) {
            double acc = 0, mag = 0;
            for (int64_t c = 0; c < m->cols; c++) {
                double w = m->type == MAT_AFFINE ? ref_w(Q, r, c) : bf16_to_f32(m->w[r * m->cols + c]);
                acc += w * x[t * m->cols + c];
                mag += fabs(w * x[t * m->cols + c]);
            }
            worst = fmax(worst, fabs(y[t * m->rows + r] - acc) / (mag + 1e-30));
        }
    CHECKF(worst < 1e-5, "T=%d type %d bits %d: worst relative error %g", T, m->type, m->bits, worst);
    free(x); free(y);
}

static void test_matmul_paths(void) {
    qmat Q4 = make_affine(300, 512, 4, 64), Q8 = make_affine(33, 256, 8, 64);
    check_matmul(&Q4, 1); /* fused decode path */
    check_matmul(&Q4, 3); /* row-dequant path */
    check_matmul(&Q8, 1);
    check_matmul(&Q8, 2);
    uint16_t *w = malloc(2 * 40 * 128);
    for (int i = 0; i < 40 * 128; i++) w[i] = f32_to_bf16(rnd_f());
    qmat B = {.m = {.type = MAT_BF16, .rows = 40, .cols = 128, .w = w, .n_experts = 1, .expert_rows_stride = 40}};
    check_matmul(&B, 1);
    check_matmul(&B, 4);
    free(w); free(Q4.q); free(Q4.s); free(Q4.b); free(Q8.q); free(Q8.s); free(Q8.b);
}

static void test_expert_view(void) {
    /* 3 stacked experts of [4, 64]: expert e's row r is stacked row e*4+r. */
    qmat Q = make_affine(12, 64, 4, 64);
    lilac_matrix st = Q.m;
    st.rows = 4; st.n_experts = 3; st.expert_rows_stride = 4;
    float a[64];
    lilac_matrix e2 = lilac_mat_expert(&st, 2);
    lilac_mat_row(&e2, 1, a);
    double worst = 0;
    for (int c = 0; c < 64; c++) worst = fmax(worst, fabs(a[c] - ref_w(&Q, 9, c)));
    CHECK(worst < 1e-6);
    free(Q.q); free(Q.s); free(Q.b);
}

static void test_rmsnorm(void) {
    float x[8] = {1, -2, 3, -4, 5, -6, 7, -8}, g[8] = {1, 2, 1, 2, 1, 2, 1, 2}, y[8];
    cpu_rmsnorm(y, x, g, 8, 1e-6f);
    double ms = 0;
    for (int i = 0; i < 8; i++) ms += x[i] * x[i] / 8.0;
    for (int i = 0; i < 8; i++) CHECK(fabs(y[i] - x[i] / sqrt(ms + 1e-6) * g[i]) < 1e-5);
}

static void test_bf16_rounding(void) {
    CHECK(f32_to_bf16(1.0f) == 0x3f80);
    CHECK(bf16_to_f32(0x3f80) == 1.0f);
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even -> 1. */
    CHECK(f32_to_bf16(1.00390625f) == 0x3f80);
    CHECK(f32_to_bf16(1.01171875f) == 0x3f82); /* 1 + 3*2^-8 -> 1 + 4*2^-8 (even) */
    CHECK(isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

int main(void) {
    TEST(test_dequant_rows);
    TEST(test_matmul_paths);
    TEST(test_expert_view);
    TEST(test_rmsnorm);
    TEST(test_bf16_rounding);
    return check_summary();
}
