/* test_cpu_kernels.c — the CPU fast path against independent references:
 *  - activation quantisation: every group rebuilt from its pieces, d*(h + l/256), to 2^-9 of its step;
 *  - the scalar kernel set against a double-precision product of the dequantised weights (MLX layout read
 *    byte by byte) and the rebuilt activations, and against the exact f32 inputs within the pieces' error;
 *  - every SIMD set this CPU runs (AVX-512 VNNI, AVX-VNNI, AVX2) against the scalar set, 4-bit and 8-bit,
 *    one token and tiles of several, odd group counts (a lone last group), row sub-ranges;
 *  - the thread pool: every item once, jobs back to back, the pool rebuilt with another thread count;
 *  - cpu_mm_run: several products of unequal sizes in one job against each one alone. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_mm.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_pool.h"
#include "check.h"

static uint32_t rng = 777;
static uint32_t rnd_u32(void) { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; return rng; }
static float rnd_f(void) { return (float)(rnd_u32() % 20001) / 10000.0f - 1.0f; }

typedef struct {
    lilac_matrix m;
    uint32_t *q;
    uint16_t *s, *b;
} qmat;

static qmat make_affine(int64_t rows, int64_t cols, int bits) {
    qmat Q;
    const int64_t words = rows * cols * bits / 32, ng = rows * cols / 64;
    Q.q = malloc(sizeof(uint32_t) * (size_t)words);
    Q.s = malloc(2 * (size_t)ng);
    Q.b = malloc(2 * (size_t)ng);
    for (int64_t i = 0; i < words; i++) Q.q[i] = rnd_u32();
    for (int64_t i = 0; i < ng; i++) {
        Q.s[i] = f32_to_bf16(rnd_f() * 0.1f);
        Q.b[i] = f32_to_bf16(rnd_f());
    }
    Q.m = (lilac_matrix){.type = MAT_AFFINE, .rows = rows, .cols = cols, .bits = bits, .group = 64, .q = Q.q,
                         .scales = Q.s, .biases = Q.b, .n_experts = 1, .expert_rows_stride = rows};
    return Q;
}
static void free_q(qmat *Q) { free(Q->q); free(Q->s); free(Q->b); }

/* W[r][c] from the MLX byte stream: 4-bit values two per byte, low nibble first. */
static double ref_w(const qmat *Q, int64_t r, int64_t c) {
    const lilac_matrix *m = &Q->m;
    const uint8_t *row = (const uint8_t *)(Q->q + r * (m->cols * m->bits / 32));
    const unsigned q = m->bits == 8 ? row[c] : (row[c / 2] >> (4 * (c % 2))) & 0xf;
    const int64_t g = r * (m->cols / 64) + c / 64;
    return (double)bf16_to_f32(Q->s[g]) * q + (double)bf16_to_f32(Q->b[g]);
}

/* Input rows with a spread of magnitudes per group (some all-zero groups, some tiny). */
static float *make_x(int T, int64_t cols) {
    float *x = malloc(sizeof(float) * (size_t)(T * cols));
    for (int64_t i = 0; i < T * cols; i++) {
        const int64_t g = i / 64;
        x[i] = g % 7 == 3 ? 0.0f : rnd_f() * (g % 5 == 1 ? 1e-3f : g % 5 == 2 ? 30.0f : 1.0f);
    }
    return x;
}

static cpu_qact quantise(const float *x, int T, int64_t cols) {
    cpu_qact a = {0};
    cpu_qact_reserve(&a, T, cols);
    for (int t = 0; t < T; t++) cpu_qact_row(&a, t, x + (int64_t)t * cols);
    return a;
}

/* Element c of row t as the pieces hold it, read from the element-order copy. */
static double rebuilt(const cpu_qact *a, int t, int64_t c) {
    const int64_t i = (int64_t)t * a->cols + c;
    return (double)a->dq[(int64_t)t * a->ng + c / 64] * (256.0 * a->nh[i] + a->nm[i] + a->nl[i] / 256.0);
}

static void test_quantise(void) {
    const int T = 3;
    const int64_t cols = 320; /* 5 groups: two pairs and a lone group */
    float *x = make_x(T, cols);
    cpu_qact a = quantise(x, T, cols);
    double worst = 0;
    bool layout_ok = true;
    for (int t = 0; t < T; t++)
        for (int64_t g = 0; g < a.ng; g++) {
            double amax = 0, sum = 0;
            for (int i = 0; i < 64; i++) {
                amax = fmax(amax, fabs(x[t * cols + g * 64 + i]));
                sum += x[t * cols + g * 64 + i];
            }
            CHECK(fabs(a.xs[t * a.ng + g] - sum) <= 1e-5 * (amax * 64 + 1e-30));
            const double step = amax / 127.0;
            for (int i = 0; i < 64; i++) {
                const double err = fabs(rebuilt(&a, t, g * 64 + i) - x[t * cols + g * 64 + i]);
                if (step > 0) worst = fmax(worst, err / step);
                else CHECK(err == 0);
                /* the 4-bit order: pairs [A even | B even | A odd | B odd], a lone last group [even | odd] */
                const int64_t base = (g / 2) * 128, lone = (a.ng & 1) && g == a.ng - 1;
                const int64_t at = lone ? g * 64 + (i & 1) * 32 + i / 2 : base + (g & 1) * 32 + (i & 1) * 64 + i / 2;
                layout_ok &= a.ph[t * cols + at] == a.nh[t * cols + g * 64 + i];
                layout_ok &= a.pm[t * cols + at] == a.nm[t * cols + g * 64 + i];
                layout_ok &= a.pl[t * cols + at] == a.nl[t * cols + g * 64 + i];
            }
        }
    /* the pieces hold x/d to 2^-17; x/d itself is rounded in f32 (2^-24 relative, |x/d| <= 127) */
    CHECKF(worst <= 1.0 / 131072 + 127.0 / (1 << 23), "worst error %g of a step", worst);
    CHECK(layout_ok);
    cpu_qact_free(&a);
    free(x);
    /* step exactly 1 and values on half steps: remainders of exactly 1/2 carry into the piece before */
    float hx[64];
    hx[0] = 127.0f;
    for (int i = 1; i < 64; i++) hx[i] = (float)(i - 32) + (i % 2 ? 0.5f : -0.5f) + (i % 3 ? 0.0f : 1.0f / 512);
    cpu_qact b = quantise(hx, 1, 64);
    bool exact = true;
    for (int i = 0; i < 64; i++) exact &= rebuilt(&b, 0, i) == (double)hx[i];
    CHECK(exact);
    cpu_qact_free(&b);
}

/* The scalar set against a double product of the dequantised weights and (a) the rebuilt
 * activations: only f32 rounding apart; (b) the f32 inputs: within the pieces' error. */
static void check_scalar(int bits, int64_t rows, int64_t cols, int T) {
    qmat Q = make_affine(rows, cols, bits);
    float *x = make_x(T, cols), *y = malloc(sizeof(float) * (size_t)(T * rows));
    cpu_qact a = quantise(x, T, cols);
    (bits == 4 ? cpu_kernels_scalar.gemv4 : cpu_kernels_scalar.gemv8)(&Q.m, 0, rows, &a, y, rows);
    double w_rebuilt = 0, w_exact = 0;
    for (int t = 0; t < T; t++)
        for (int64_t r = 0; r < rows; r++) {
            double acc_q = 0, acc_x = 0, mag = 0;
            for (int64_t c = 0; c < cols; c++) {
                const double w = ref_w(&Q, r, c);
                const double b = bf16_to_f32(Q.b[r * (cols / 64) + c / 64]); /* the bias meets the exact sum */
                acc_q += (w - b) * rebuilt(&a, t, c) + b * x[t * cols + c];
                acc_x += w * x[t * cols + c];
                mag += fabs(w * x[t * cols + c]);
            }
            w_rebuilt = fmax(w_rebuilt, fabs(y[t * rows + r] - acc_q) / (mag + 1e-30));
            w_exact = fmax(w_exact, fabs(y[t * rows + r] - acc_x) / (mag + 1e-30));
        }
    CHECKF(w_rebuilt < 2e-6, "bits %d %lldx%lld T=%d: %g from the rebuilt product", bits, (long long)rows,
           (long long)cols, T, w_rebuilt);
    CHECKF(w_exact < 1e-4, "bits %d %lldx%lld T=%d: %g from the exact product", bits, (long long)rows,
           (long long)cols, T, w_exact);
    cpu_qact_free(&a);
    free(x); free(y); free_q(&Q);
}

static void test_scalar_set(void) {
    check_scalar(4, 37, 512, 1);
    check_scalar(4, 21, 192, 3); /* odd group count */
    check_scalar(8, 19, 256, 2);
    check_scalar(8, 5, 64, 1);
}

/* A SIMD set against the scalar one on the same pieces: equal but for f32 summation order. */
static void check_isa(const cpu_kernels *k, int bits, int64_t rows, int64_t cols, int T, int64_t r0, int64_t r1) {
    qmat Q = make_affine(rows, cols, bits);
    float *x = make_x(T, cols);
    float *y = calloc((size_t)(T * rows), sizeof(float)), *z = calloc((size_t)(T * rows), sizeof(float));
    cpu_qact a = quantise(x, T, cols);
    (bits == 4 ? cpu_kernels_scalar.gemv4 : cpu_kernels_scalar.gemv8)(&Q.m, r0, r1, &a, z, rows);
    (bits == 4 ? k->gemv4 : k->gemv8)(&Q.m, r0, r1, &a, y, rows);
    double worst = 0;
    bool outside_ok = true;
    for (int t = 0; t < T; t++)
        for (int64_t r = 0; r < rows; r++) {
            if (r < r0 || r >= r1) { outside_ok &= y[t * rows + r] == 0.0f; continue; }
            double mag = 0;
            for (int64_t c = 0; c < cols; c++) mag += fabs(ref_w(&Q, r, c) * x[t * cols + c]);
            worst = fmax(worst, fabs((double)y[t * rows + r] - z[t * rows + r]) / (mag + 1e-30));
        }
    CHECKF(worst < 1e-6, "%s bits %d %lldx%lld T=%d: %g from scalar", k->name, bits, (long long)rows,
           (long long)cols, T, worst);
    CHECKF(outside_ok, "%s wrote rows outside [%lld, %lld)", k->name, (long long)r0, (long long)r1);
    cpu_qact_free(&a);
    free(x); free(y); free(z); free_q(&Q);
}

static void test_simd_sets(void) {
    const cpu_isa isas[] = {CPU_ISA_AVX2, CPU_ISA_AVXVNNI, CPU_ISA_AVX512VNNI};
    int ran = 0;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        const cpu_kernels *k = cpu_kernels_for(isas[i]);
        if (!k) {
            printf("     (this CPU has no %d set: skipped)\n", (int)isas[i]);
            continue;
        }
        ran++;
        for (int T = 1; T <= 6; T++) check_isa(k, 4, 24, 2048, T, 0, 24);
        check_isa(k, 4, 40, 192, 1, 3, 37); /* lone last group, sub-range of rows */
        check_isa(k, 4, 9, 64, 5, 0, 9);    /* one group only */
        check_isa(k, 4, 16, 4096, 2, 5, 6);
        check_isa(k, 8, 33, 2048, 1, 0, 33);
        check_isa(k, 8, 12, 192, 3, 2, 11);
    }
#if defined(__x86_64__)
    /* the ISA this test is meant to cover where the CI machine has it */
    if (__builtin_cpu_supports("avx2")) CHECK(ran >= 1);
#endif
    CHECK(cpu_kernels_best() != NULL);
}

static atomic_int hits[1000];
static void mark(void *ctx, int64_t i) {
    (void)ctx;
    atomic_fetch_add(&hits[i], 1);
}

static void test_pool(void) {
    const int counts[] = {2, 3, 1, 4};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        cpu_pool_use(counts[c]);
        CHECK(cpu_pool_threads() == counts[c]);
        for (int rep = 0; rep < 200; rep++) {
            for (int i = 0; i < 1000; i++) atomic_store(&hits[i], 0);
            const int64_t n = rep % 2 ? 1000 : 1 + rep;
            if (rep % 3) cpu_pool_for(n, mark, NULL);
            else cpu_pool_for_dynamic(n, mark, NULL);
            bool ok = true;
            for (int i = 0; i < 1000; i++) ok &= atomic_load(&hits[i]) == (i < n);
            CHECKF(ok, "threads %d rep %d: items not each run once", counts[c], rep);
        }
    }
    cpu_pool_use(2);
}

/* cpu_mm_run over several products at once equals each product alone, on either path. */
static void test_mm_batch(void) {
    qmat A = make_affine(300, 512, 4), B = make_affine(7, 512, 8), C = make_affine(1000, 512, 4);
    const int T = 2;
    float *x = make_x(T, 512);
    cpu_qact a = quantise(x, T, 512);
    float *y[3], *z[3];
    qmat *Qs[3] = {&A, &B, &C};
    for (int i = 0; i < 3; i++) {
        y[i] = calloc((size_t)(T * Qs[i]->m.rows), sizeof(float));
        z[i] = calloc((size_t)(T * Qs[i]->m.rows), sizeof(float));
    }
    for (int fast = 0; fast < 2; fast++) {
        cpu_mm items[3];
        for (int i = 0; i < 3; i++)
            items[i] = (cpu_mm){.W = Qs[i]->m, .x = x, .a = fast ? &a : NULL, .T = T, .y = y[i], .ystride = Qs[i]->m.rows};
        cpu_mm_run(items, 3);
        for (int i = 0; i < 3; i++) {
            cpu_mm one = items[i];
            one.y = z[i];
            cpu_mm_run(&one, 1);
            CHECKF(!memcmp(y[i], z[i], sizeof(float) * (size_t)(T * Qs[i]->m.rows)), "fast %d item %d", fast, i);
        }
        if (!fast) { /* the reference path is cpu_matmul's */
            float *r = calloc((size_t)(T * A.m.rows), sizeof(float));
            cpu_matmul(&A.m, x, T, r);
            CHECK(!memcmp(r, y[0], sizeof(float) * (size_t)(T * A.m.rows)));
            free(r);
        }
    }
    for (int i = 0; i < 3; i++) { free(y[i]); free(z[i]); }
    cpu_qact_free(&a);
    free(x); free_q(&A); free_q(&B); free_q(&C);
}

int main(void) {
    TEST(test_quantise);
    TEST(test_scalar_set);
    TEST(test_simd_sets);
    TEST(test_pool);
    TEST(test_mm_batch);
    return check_summary();
}
