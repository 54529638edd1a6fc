/* check.h — a tiny test harness (the llama2.c / ds4 way): CHECK counts, TEST
 * runs a function, check_summary() prints "N passed, N failed" for tests/run.sh. */
#ifndef LILAC_CHECK_H
#define LILAC_CHECK_H
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

static inline int check_summary(void) {
    printf("%d passed, %d failed\n", check_pass_, check_fail_);
    return check_fail_ ? 1 : 0;
}
#endif
