/* check.h — a tiny test harness (the llama2.c / ds4 way): CHECK counts, TEST
 * runs a function, check_summary() prints "N passed, N failed" for tests/run.sh. */
#ifndef LILAC_CHECK_H
#define LILAC_CHECK_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int check_pass_, check_fail_, check_cur_failed_;

#define CHECK(cond) do { if (!(cond)) { check_cur_failed_ = 1; \
    fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECKF(cond, ...) do { if (!(cond)) { check_cur_failed_ = 1; \
    fprintf(stderr, "  %s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* Expect a refusal (rc != 0) with a one-line message containing every fragment. */
#define CHECK_FAIL_MSG(rc, err, ...) do { \
    const char *frags_[] = {__VA_ARGS__}; \
    CHECKF((rc) != 0, "expected failure"); \
    for (size_t i_ = 0; i_ < sizeof frags_ / sizeof frags_[0]; i_++) \
        CHECKF(strstr((err).msg, frags_[i_]) != NULL, "message \"%s\" lacks \"%s\"", (err).msg, frags_[i_]); \
    CHECKF(strchr((err).msg, '\n') == NULL, "message is not one line: %s", (err).msg); \
} while (0)

#define TEST(fn) do { check_cur_failed_ = 0; fn(); \
    if (check_cur_failed_) { check_fail_++; printf("FAIL %s\n", #fn); } \
    else { check_pass_++; printf("ok   %s\n", #fn); } fflush(stdout); } while (0)

/* Deterministic token ids for whole-model tests: n ids below vocab, one sequence per seed. */
static inline void check_ids(int32_t *ids, int n, int seed, uint32_t vocab) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(((uint32_t)(i + 7 * seed) * 2654435761u >> 9) % vocab);
}

/* max|a - b| / max|b| over n values. */
static inline double check_max_rel(const float *a, const float *b, int64_t n) {
    double mx = 0, md = 0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(b[i]));
        md = fmax(md, fabs((double)a[i] - b[i]));
    }
    return md / (mx + 1e-30);
}

static inline int check_summary(void) {
    printf("%d passed, %d failed\n", check_pass_, check_fail_);
    return check_fail_ ? 1 : 0;
}
#endif
