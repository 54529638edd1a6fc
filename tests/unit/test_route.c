/* test_route.c — routing record and replay of the CPU backend (the reference
 * side of tests/cuda/test_cuda.c's replayed comparison), on the demo model:
 * recording leaves the logits alone; replaying the backend's own choices gives
 * bit-identical logits and no regret, across prefill chunks; replaying a worse
 * expert set changes the logits and reports a large regret; malformed tables
 * and calls longer than a table are refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "server/demo_model.h"

static lilac_model M;
static const lilac_backend *B;

enum { N = 600 }; /* more than the CPU backend's 512-row chunk: the table's rows continue across chunks */

static int64_t table_len(int n) { return (int64_t)M.cfg.n_layers * n * M.cfg.top_k; }

/* Plain forward of ids (fresh session) into logits [n, V]. */
static void run_plain(lilac_session *s, const int32_t *ids, int n, float *logits) {
    lilac_err err = {{0}};
    B->session_reset(s);
    CHECKF(B->forward(s, ids, n, LOGITS_ALL, logits, &err) == 0, "%s", err.msg);
}

static void test_record_then_replay_own(void) {
    lilac_err err = {{0}};
    const int64_t V = M.cfg.vocab, L = table_len(N);
    int32_t ids[N];
    check_ids(ids, N, 1, (uint32_t)M.cfg.vocab);
    int32_t *rec = malloc(sizeof(int32_t) * (size_t)L);
    for (int64_t i = 0; i < L; i++) rec[i] = -1;
    float *la = malloc(sizeof(float) * (size_t)(N * V)), *lb = malloc(sizeof(float) * (size_t)(N * V)),
          *lc = malloc(sizeof(float) * (size_t)(N * V));
    lilac_session *s = B->session_new(&M, 1024, 1, &err);
    run_plain(s, ids, N, la);
    /* Recording: every row written with K distinct experts, the logits untouched. */
    B->route_record(s, rec, N);
    run_plain(s, ids, N, lb);
    B->route_record(s, NULL, 0);
    CHECK(memcmp(la, lb, sizeof(float) * (size_t)(N * V)) == 0);
    const int K = M.cfg.top_k;
    int bad = 0;
    for (int64_t r = 0; r < L / K; r++)
        for (int k = 0; k < K; k++) {
            bad += rec[r * K + k] < 0 || rec[r * K + k] >= M.cfg.n_experts;
            for (int j = 0; j < k; j++) bad += rec[r * K + j] == rec[r * K + k];
        }
    CHECKF(bad == 0, "%d malformed entries in the record", bad);
    /* Replaying the own choices: bit-identical, nothing differs, no regret. */
    B->route_replay(s, rec, N);
    run_plain(s, ids, N, lc);
    int64_t differ = -1;
    const double regret = B->route_regret(s, &differ);
    B->route_replay(s, NULL, 0);
    CHECKF(memcmp(la, lc, sizeof(float) * (size_t)(N * V)) == 0, "replayed own choices: max rel %g", check_max_rel(lc, la, N * V));
    CHECKF(differ == 0 && regret == 0.0, "differ %lld regret %g", (long long)differ, regret);
    /* All -1: every row routed by the backend itself. */
    for (int64_t i = 0; i < L; i++) rec[i] = -1;
    B->route_replay(s, rec, N);
    run_plain(s, ids, N, lc);
    B->route_replay(s, NULL, 0);
    CHECK(memcmp(la, lc, sizeof(float) * (size_t)(N * V)) == 0);
    B->session_free(s);
    free(rec); free(la); free(lb); free(lc);
}

/* Replace each row of layer `l`, tokens [t0, t1), by the K lowest-numbered experts outside it. */
static int swap_rows(int32_t *tab, int n, int l, int t0, int t1) {
    const int K = M.cfg.top_k, E = M.cfg.n_experts;
    int rows = 0;
    for (int t = t0; t < t1; t++, rows++) {
        int32_t *r = tab + ((int64_t)l * n + t) * K, out[64];
        int m = 0;
        for (int e = 0; e < E && m < K; e++) {
            bool in = false;
            for (int k = 0; k < K; k++) in |= r[k] == e;
            if (!in) out[m++] = e;
        }
        memcpy(r, out, sizeof(int32_t) * (size_t)K);
    }
    return rows;
}

static void test_replay_worse(void) {
    lilac_err err = {{0}};
    const int64_t V = M.cfg.vocab, L = table_len(N);
    const int K = M.cfg.top_k;
    CHECK(M.cfg.n_experts >= 2 * K);
    int32_t ids[N];
    check_ids(ids, N, 2, (uint32_t)M.cfg.vocab);
    int32_t *tab = malloc(sizeof(int32_t) * (size_t)L);
    float *la = malloc(sizeof(float) * (size_t)(N * V)), *lb = malloc(sizeof(float) * (size_t)(N * V));
    lilac_session *s = B->session_new(&M, 1024, 1, &err);
    B->route_record(s, tab, N);
    run_plain(s, ids, N, la);
    B->route_record(s, NULL, 0);
    /* Layer 1, tokens 500..539 (straddling the chunk boundary at 512): disjoint expert sets. */
    const int l = 1, t0 = 500, t1 = 540;
    const int rows = swap_rows(tab, N, l, t0, t1);
    B->route_replay(s, tab, N);
    run_plain(s, ids, N, lb);
    int64_t differ = -1;
    const double regret = B->route_regret(s, &differ);
    B->route_replay(s, NULL, 0);
    printf("  worse experts at %d rows: regret %.3f, %lld rows differ, logits max rel %.3g\n", rows, regret,
           (long long)differ, check_max_rel(lb + (int64_t)t0 * V, la + (int64_t)t0 * V, (int64_t)(N - t0) * V));
    CHECK(differ >= rows); /* later layers of the changed tokens route differently too */
    CHECKF(regret > 0.1, "regret %g", regret);
    /* Positions before the replaced rows are untouched; from them on the logits move. */
    CHECK(memcmp(la, lb, sizeof(float) * (size_t)t0 * (size_t)V) == 0);
    CHECK(check_max_rel(lb + (int64_t)t0 * V, la + (int64_t)t0 * V, V) > 1e-3);
    B->session_free(s);
    free(tab); free(la); free(lb);
}

static void test_refusals(void) {
    lilac_err err = {{0}};
    const int64_t L = table_len(8);
    const int K = M.cfg.top_k;
    int32_t ids[9];
    check_ids(ids, 9, 3, (uint32_t)M.cfg.vocab);
    int32_t *tab = malloc(sizeof(int32_t) * (size_t)table_len(9));
    lilac_session *s = B->session_new(&M, 64, 1, &err);
    B->route_record(s, tab, 8);
    CHECK_FAIL_MSG(B->forward(s, ids, 9, LOGITS_NONE, NULL, &err), err, "9 tokens", "routing record");
    CHECK(B->forward(s, ids, 8, LOGITS_NONE, NULL, &err) == 0);
    B->route_record(s, NULL, 0);
    B->route_replay(s, tab, 8);
    B->session_reset(s);
    CHECK_FAIL_MSG(B->forward(s, ids, 9, LOGITS_NONE, NULL, &err), err, "9 tokens", "routing replay");
    tab[L - 1] = tab[L - 2]; /* a repeated expert in the last row */
    CHECK_FAIL_MSG(B->forward(s, ids, 8, LOGITS_NONE, NULL, &err), err, "layer 3, token 7", "distinct");
    for (int k = 0; k < K; k++) tab[L - K + k] = -1;
    tab[L - 1] = M.cfg.n_experts; /* a partly -1 row with an id out of range */
    CHECK_FAIL_MSG(B->forward(s, ids, 8, LOGITS_NONE, NULL, &err), err, "layer 3, token 7");
    tab[L - 1] = -1;
    CHECKF(B->forward(s, ids, 8, LOGITS_NONE, NULL, &err) == 0, "%s", err.msg);
    CHECK(B->session_pos(s) == 8);
    B->route_replay(s, NULL, 0);
    B->session_free(s);
    free(tab);
}

int main(void) {
    char dir[] = "/tmp/lilac-test-route-XXXXXX";
    if (!mkdtemp(dir)) return 2;
    lilac_err err = {{0}};
    if (lilac_demo_build(dir, &err) < 0 || lilac_model_load(&M, dir, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    B = lilac_backend_get("cpu", &err);
    if (!B || !B->route_record || !B->route_replay || !B->route_regret) {
        fprintf(stderr, "the CPU backend lacks routing record/replay\n");
        return 2;
    }
    TEST(test_record_then_replay_own);
    TEST(test_replay_worse);
    TEST(test_refusals);
    lilac_model_free(&M);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}
