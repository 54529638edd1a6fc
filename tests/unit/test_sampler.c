/* test_sampler.c — the host sampler (lilac_sample), which the CUDA sampler
 * reproduces draw for draw (tests/cuda/test_sample.cu): greedy ties, logits with
 * nothing to draw from (all -inf/NaN, +inf), the cuts (top-k ties by id, top-p,
 * min-p), penalties, seeding. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* The sampler against a reference written from the definition: sort every
 * candidate (weight descending, ties by id), cut top-k, softmax, top-p as the
 * shortest prefix holding top_p, min-p against the best, then walk the prefix
 * in order with the same uniform draw. The sampler selects instead of sorting
 * (linear in the vocabulary); the draws must be the same. */
static const float *ref_w;
static int ref_cmp(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (ref_w[i] != ref_w[j]) return ref_w[i] > ref_w[j] ? -1 : 1;
    return (i > j) - (i < j);
}

static int32_t ref_sample(const lilac_sampling *p, const float *x, int V, lilac_rng *rng) {
    float *w = malloc(sizeof(float) * (size_t)V);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)V);
    memcpy(w, x, sizeof(float) * (size_t)V);
    int best = 0;
    for (int i = 1; i < V; i++)
        if (w[i] > w[best]) best = i;
    float mx = w[best], T = p->temperature;
    int n = 0;
    for (int i = 0; i < V; i++)
        if ((w[i] - mx) / T > -30.0f) idx[n++] = i;
    ref_w = w;
    qsort(idx, (size_t)n, sizeof(int32_t), ref_cmp);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (w[idx[i]] = expf((w[idx[i]] - mx) / T));
    int keep = n;
    if (p->top_p > 0 && p->top_p < 1) {
        double c = 0;
        for (int i = 0; i < n; i++)
            if ((c += w[idx[i]]) >= p->top_p * sum) {
                keep = i + 1;
                break;
            }
    }
    if (p->min_p > 0) {
        int k2 = 0;
        while (k2 < keep && w[idx[k2]] >= p->min_p) k2++;
        keep = k2 < 1 ? 1 : k2;
    }
    double tot = 0;
    for (int i = 0; i < keep; i++) tot += w[idx[i]];
    double u = lilac_rng_uniform(rng) * tot, c = 0;
    int32_t out = idx[keep - 1];
    for (int i = 0; i < keep; i++)
        if (u < (c += w[idx[i]])) {
            out = idx[i];
            break;
        }
    free(w);
    free(idx);
    return out;
}

static void test_matches_sorted_reference(void) {
    enum { V = 6000 };
    float *x = malloc(sizeof(float) * V);
    uint64_t r = 12345;
    static const float temps[] = {0.6f, 1.0f, 2.0f, 5.0f};
    static const int topks[] = {0, 3, 50, 4000};
    static const float topps[] = {1.0f, 0.95f, 0.3f};
    static const float minps[] = {0.0f, 0.02f};
    int draws = 0, differ = 0;
    for (int trial = 0; trial < 3; trial++) {
        for (int i = 0; i < V; i++) { /* logits with ties and a long flat tail */
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            x[i] = trial == 2 ? (float)(r % 5) : (float)((double)(r >> 11) / 9007199254740992.0 * 8.0);
        }
        for (size_t a = 0; a < sizeof temps / sizeof *temps; a++)
            for (size_t b = 0; b < sizeof topks / sizeof *topks; b++)
                for (size_t c = 0; c < sizeof topps / sizeof *topps; c++)
                    for (size_t d = 0; d < sizeof minps / sizeof *minps; d++) {
                        lilac_sampling p = params(temps[a]);
                        p.top_k = topks[b];
                        p.top_p = topps[c];
                        p.min_p = minps[d];
                        p.seed = 1000 + a * 97 + b * 31 + c * 7 + d;
                        lilac_sampler smp;
                        lilac_sampler_init(&smp, V);
                        lilac_sampler_begin(&smp, &p, NULL, 0);
                        lilac_rng rng;
                        lilac_rng_seed(&rng, p.seed);
                        for (int k = 0; k < 8; k++, draws++) {
                            int32_t got = lilac_sample(&smp, &p, x), want = ref_sample(&p, x, V, &rng);
                            if (got != want && differ++ < 5)
                                fprintf(stderr, "  T %g top_k %d top_p %g min_p %g draw %d: %d, reference %d\n",
                                        temps[a], topks[b], topps[c], minps[d], k, got, want);
                        }
                        lilac_sampler_free(&smp);
                    }
    }
    CHECKF(differ == 0, "%d of %d draws differ", differ, draws);
    free(x);
}

int main(void) {
    TEST(test_greedy_ties_lowest_id);
    TEST(test_no_candidates);
    TEST(test_top_k_ties_by_id);
    TEST(test_top_p_min_p);
    TEST(test_penalties);
    TEST(test_seeding);
    TEST(test_matches_sorted_reference);
    return check_summary();
}
