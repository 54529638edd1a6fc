/* test_cpu_fast.c — the CPU backend's fast path against its f32 reference, whole model (the demo
 * checkpoint: every layer type, routed and shared experts, 4-bit and 8-bit matrices, odd group
 * counts): for each kernel set this CPU runs (forced, so AVX2 and scalar run here too), teacher-forced
 * logits over a prompt (the prefill path) and single-token steps (the decode path) within 3e-5 of the
 * largest reference logit at every position, and the same argmax wherever the reference's top two
 * are more than 1e-3 apart. The reference itself is held to MLX-LM by tests/oracle. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_mm.h"
#include "check.h"
#include "server/demo_model.h"

#define N_PROMPT 70
#define N_STEPS 6
#define TOL 3e-5

static lilac_model M;
static const lilac_backend *B;

/* Logits of the prompt (all positions), then of N_STEPS single-token steps: [(N_PROMPT + N_STEPS)][V]. */
static float *run(void) {
    const int64_t V = M.cfg.vocab;
    lilac_err err = {{0}};
    int32_t ids[N_PROMPT + N_STEPS];
    check_ids(ids, N_PROMPT + N_STEPS, 3, (uint32_t)V);
    float *lg = malloc(sizeof(float) * (size_t)((N_PROMPT + N_STEPS) * V));
    lilac_session *s = B->session_new(&M, 256, 2, &err);
    CHECK(s && B->forward(s, ids, N_PROMPT, LOGITS_ALL, lg, &err) == 0);
    for (int i = 0; i < N_STEPS; i++)
        CHECK(B->forward(s, ids + N_PROMPT + i, 1, LOGITS_LAST, lg + (int64_t)(N_PROMPT + i) * V, &err) == 0);
    B->session_free(s);
    return lg;
}

static int argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
    return (int)b;
}

static void test_sets_vs_reference(void) {
    const int64_t V = M.cfg.vocab;
    cpu_mm_use(NULL);
    float *ref = run();
    const cpu_isa isas[] = {CPU_ISA_SCALAR, CPU_ISA_AVX2, CPU_ISA_AVXVNNI, CPU_ISA_AVX512VNNI};
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        const cpu_kernels *ks = cpu_kernels_for(isas[k]);
        if (!ks) continue;
        cpu_mm_use(ks);
        float *got = run();
        double worst = 0;
        int flips = 0;
        for (int p = 0; p < N_PROMPT + N_STEPS; p++) {
            const float *r = ref + (int64_t)p * V, *g = got + (int64_t)p * V;
            worst = fmax(worst, check_max_rel(g, r, V));
            const int a = argmax(r, V);
            float second = -INFINITY, mx = 0;
            for (int64_t i = 0; i < V; i++) {
                mx = fmaxf(mx, fabsf(r[i]));
                if (i != a) second = fmaxf(second, r[i]);
            }
            if ((r[a] - second) > 1e-3 * mx && argmax(g, V) != a) flips++;
        }
        printf("     %-10s max rel %.2e over %d positions\n", ks->name, worst, N_PROMPT + N_STEPS);
        CHECKF(worst <= TOL, "%s: max rel %g (bar %g)", ks->name, worst, TOL);
        CHECKF(flips == 0, "%s: argmax differs at %d clear positions", ks->name, flips);
        free(got);
    }
    cpu_mm_use(cpu_kernels_best());
    free(ref);
}

int main(void) {
    char dir[] = "/tmp/lilac-test-cpu-fast-XXXXXX";
    lilac_err err = {{0}};
    if (!mkdtemp(dir)) return 2;
    if (lilac_demo_build(dir, &err) < 0 || lilac_model_load(&M, dir, &err) < 0) {
        fprintf(stderr, "demo model: %s\n", err.msg);
        return 2;
    }
    B = &lilac_backend_cpu;
    TEST(test_sets_vs_reference);
    lilac_model_free(&M);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary();
}
