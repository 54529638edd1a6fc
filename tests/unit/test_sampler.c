/* test_sampler.c — the host sampler (lilac_sample), which the CUDA sampler
 * reproduces draw for draw (tests/cuda/test_sample.cu): greedy ties, logits with
 * nothing to draw from (all -inf/NaN, +inf), the cuts (top-k ties by id, top-p,
 * min-p), penalties, seeding. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "model/sampler.h"

static lilac_sampling params(float T) {
    lilac_sampling p;
    lilac_sampling_default(&p);
    p.temperature = T;
    p.seed = 42;
    p.has_seed = true;
    return p;
}

static void test_greedy_ties_lowest_id(void) {
    lilac_sampler s;
    lilac_sampler_init(&s, 6);
    lilac_sampling p = params(0);
    const float x[6] = {1, 3, -0.0f, 3, NAN, 2};
    lilac_sampler_begin(&s, &p, NULL, 0);
    CHECK(lilac_sample(&s, &p, x) == 1);
    p.temperature = 1, p.top_k = 1;
    CHECK(lilac_sample(&s, &p, x) == 1);
    lilac_sampler_free(&s);
}

/* Nothing within reach of the maximum: the argmax, no draw, no out-of-bounds read. */
static void test_no_candidates(void) {
    lilac_sampler s;
    lilac_sampler_init(&s, 5);
    lilac_sampling p = params(1);
    lilac_sampler_begin(&s, &p, NULL, 0);
    const float ninf[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    const float nans[5] = {NAN, NAN, NAN, NAN, NAN};
    const float pinf[5] = {0, 1, INFINITY, 2, INFINITY};
    for (int i = 0; i < 20; i++) {
        CHECK(lilac_sample(&s, &p, ninf) == 0);
        CHECK(lilac_sample(&s, &p, nans) == 0);
        CHECK(lilac_sample(&s, &p, pinf) == 2);
    }
    p.min_p = 0.5f, p.top_p = 0.5f, p.top_k = 3;
    CHECK(lilac_sample(&s, &p, ninf) == 0);
    lilac_sampler_free(&s);
}

/* top_k = 2 over four tied logits: only the two lowest ids; masked ones never. */
static void test_top_k_ties_by_id(void) {
    lilac_sampler s;
    lilac_sampler_init(&s, 6);
    lilac_sampling p = params(1);
    p.top_k = 2;
    lilac_sampler_begin(&s, &p, NULL, 0);
    const float x[6] = {-INFINITY, 0.5f, 0.5f, 0.5f, 0.5f, -INFINITY};
    int seen[6] = {0};
    for (int i = 0; i < 400; i++) seen[lilac_sample(&s, &p, x)]++;
    CHECK(seen[1] > 100 && seen[2] > 100 && seen[0] + seen[3] + seen[4] + seen[5] == 0);
    lilac_sampler_free(&s);
}

/* top-p keeps the smallest prefix reaching p; min-p drops those under min_p * pmax. */
static void test_top_p_min_p(void) {
    lilac_sampler s;
    lilac_sampler_init(&s, 4);
    lilac_sampling p = params(1);
    const float x[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    lilac_sampler_begin(&s, &p, NULL, 0);
    int c[4] = {0};
    p.top_p = 0.7f; /* 0.5 + 0.3 reaches it */
    for (int i = 0; i < 600; i++) c[lilac_sample(&s, &p, x)]++;
    CHECK(c[0] > 0 && c[1] > 0 && c[2] == 0 && c[3] == 0);
    p.top_p = 1, p.min_p = 0.35f; /* 0.15 < 0.35 * 0.5 */
    int d[4] = {0};
    for (int i = 0; i < 600; i++) d[lilac_sample(&s, &p, x)]++;
    CHECK(d[0] > 0 && d[1] > 0 && d[2] == 0 && d[3] == 0);
    lilac_sampler_free(&s);
}

/* Penalties: a token already in the output loses against its equal. */
static void test_penalties(void) {
    lilac_sampler s;
    lilac_sampler_init(&s, 3);
    lilac_sampling p = params(1);
    p.presence_penalty = 2, p.frequency_penalty = 1.5f;
    const float x[3] = {4, 4, -INFINITY};
    const int32_t prompt[1] = {1};
    lilac_sampler_begin(&s, &p, prompt, 1);
    lilac_sampler_accept(&s, 0);
    int c[3] = {0};
    for (int i = 0; i < 300; i++) c[lilac_sample(&s, &p, x)]++;
    CHECK(c[1] > 250 && c[2] == 0); /* e^-3.5 odds for token 0 */
    p.presence_penalty = p.frequency_penalty = 0, p.repetition_penalty = 100, p.temperature = 0;
    lilac_sampler_begin(&s, &p, prompt, 1); /* token 1 is in the prompt: divided by 100 */
    CHECK(lilac_sample(&s, &p, x) == 0);
    lilac_sampler_free(&s);
}

static void test_seeding(void) {
    lilac_sampling p = params(1);
    CHECK(lilac_sampling_seed(&p) == 42);
    p.has_seed = false;
    CHECK(lilac_sampling_seed(&p) != lilac_sampling_seed(&p)); /* fresh each time */
    p.has_seed = true;
    enum { V = 50 };
    float x[V];
    for (int i = 0; i < V; i++) x[i] = (float)(i % 7) * 0.3f;
    lilac_sampler a, b;
    lilac_sampler_init(&a, V);
    lilac_sampler_init(&b, V);
    lilac_sampler_begin(&a, &p, NULL, 0);
    lilac_sampler_begin(&b, &p, NULL, 0);
    int same = 1;
    for (int i = 0; i < 100; i++) same &= lilac_sample(&a, &p, x) == lilac_sample(&b, &p, x);
    CHECK(same);
    lilac_sampler_free(&a);
    lilac_sampler_free(&b);
}

int main(void) {
    TEST(test_greedy_ties_lowest_id);
    TEST(test_no_candidates);
    TEST(test_top_k_ties_by_id);
    TEST(test_top_p_min_p);
    TEST(test_penalties);
    TEST(test_seeding);
    return check_summary();
}
