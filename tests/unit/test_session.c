/* test_session.c — session invariants of the CPU backend on the demo model
 * (built in a temp dir): a batched step equals the sessions stepping alone;
 * restoring a snapshot and continuing equals a fresh session fed the same
 * tokens; decode_greedy consumes every token it hands out. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "server/demo_model.h"

static lilac_model M;
static const lilac_backend *B;

static void test_batch_equals_alone(void) {
    lilac_err err = {{0}};
    const int64_t V = M.cfg.vocab;
    enum { N = 3 };
    lilac_session *bs[N], *as[N];
    int32_t step[N];
    for (int i = 0; i < N; i++) {
        int32_t p[40];
        const int len = 10 + 9 * i; /* different positions per session */
        check_ids(p, len, i, (uint32_t)M.cfg.vocab);
        bs[i] = B->session_new(&M, 256, 0, &err);
        as[i] = B->session_new(&M, 256, 0, &err);
        CHECK(B->forward(bs[i], p, len, LOGITS_NONE, NULL, &err) == 0);
        CHECK(B->forward(as[i], p, len, LOGITS_NONE, NULL, &err) == 0);
        step[i] = p[0];
    }
    float *lb = malloc(sizeof(float) * N * V), *la = malloc(sizeof(float) * N * V);
    for (int round = 0; round < 3; round++) {
        CHECKF(B->forward_batch(bs, step, N, lb, &err) == 0, "%s", err.msg);
        for (int i = 0; i < N; i++) CHECK(B->forward(as[i], &step[i], 1, LOGITS_LAST, la + i * V, &err) == 0);
        const double e = check_max_rel(lb, la, N * V);
        CHECKF(e < 1e-5, "round %d: batched vs alone max rel %g", round, e);
        for (int i = 0; i < N; i++) {
            CHECK(B->session_pos(bs[i]) == B->session_pos(as[i]));
            step[i] = (int32_t)((step[i] * 31 + 7 + i) % V);
        }
    }
    int32_t dup[2] = {1, 2};
    lilac_session *same[2] = {bs[0], bs[0]};
    CHECK(B->forward_batch(same, dup, 2, lb, &err) < 0); /* one session twice is refused */
    for (int i = 0; i < N; i++) {
        B->session_free(bs[i]);
        B->session_free(as[i]);
    }
    free(lb);
    free(la);
}

static void test_snapshot_restore(void) {
    lilac_err err = {{0}};
    const int64_t V = M.cfg.vocab;
    int32_t p[64], a[12], b[12];
    check_ids(p, 64, 1, (uint32_t)M.cfg.vocab);
    check_ids(a, 12, 2, (uint32_t)M.cfg.vocab);
    check_ids(b, 12, 3, (uint32_t)M.cfg.vocab);
    lilac_session *s = B->session_new(&M, 256, 0, &err), *f = B->session_new(&M, 256, 0, &err);
    CHECK(B->forward(s, p, 64, LOGITS_NONE, NULL, &err) == 0);
    lilac_snapshot *snap = B->snapshot(s, &err);
    CHECK(snap && B->snapshot_pos(snap) == 64 && B->snapshot_bytes(snap) > 0);
    CHECK(B->forward(s, a, 12, LOGITS_NONE, NULL, &err) == 0); /* diverge */
    CHECK(B->restore(s, snap, &err) == 0);
    CHECK(B->session_pos(s) == 64);
    float *ls = malloc(sizeof(float) * 12 * V), *lf = malloc(sizeof(float) * 12 * V);
    CHECK(B->forward(s, b, 12, LOGITS_ALL, ls, &err) == 0);
    CHECK(B->forward(f, p, 64, LOGITS_NONE, NULL, &err) == 0);
    CHECK(B->forward(f, b, 12, LOGITS_ALL, lf, &err) == 0);
    CHECKF(check_max_rel(ls, lf, 12 * V) == 0.0, "restored vs fresh: max rel %g", check_max_rel(ls, lf, 12 * V));
    /* A snapshot from the future is refused. */
    B->session_reset(f);
    CHECK(B->restore(f, snap, &err) < 0);
    B->snapshot_free(snap);
    B->session_free(s);
    B->session_free(f);
    free(ls);
    free(lf);
}

typedef struct { int n; } counter;
static bool stop_after_5(void *ud, int32_t tok) {
    (void)tok;
    return ++((counter *)ud)->n < 5;
}

static void test_decode_contract(void) {
    lilac_err err = {{0}};
    int32_t p[20];
    check_ids(p, 20, 4, (uint32_t)M.cfg.vocab);
    lilac_session *s = B->session_new(&M, 256, 0, &err);
    CHECK(B->forward(s, p, 20, LOGITS_NONE, NULL, &err) == 0);
    counter c = {0};
    CHECK(B->decode_greedy(s, p[0], 50, stop_after_5, &c, &err) == 5);
    CHECK(B->session_pos(s) == 20 + 1 + 5); /* first + the five handed out */
    B->session_free(s);
}

int main(void) {
    char dir[] = "/tmp/lilac-test-session-XXXXXX";
    if (!mkdtemp(dir)) return 2;
    lilac_err err = {{0}};
    if (lilac_demo_build(dir, &err) < 0 || lilac_model_load(&M, dir, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    B = lilac_backend_get("cpu", &err);
    TEST(test_batch_equals_alone);
    TEST(test_snapshot_restore);
    TEST(test_decode_contract);
    lilac_model_free(&M);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}
