/* sampler.c — see sampler.h. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../util/common.h"

void lilac_sampling_default(lilac_sampling *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void lilac_rng_seed(lilac_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** */
static uint64_t rng_next(lilac_rng *r) {
    uint64_t *s = r->s;
    const uint64_t res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

double lilac_rng_uniform(lilac_rng *r) { return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

uint64_t lilac_sampling_seed(const lilac_sampling *p) {
    if (p->has_seed) return p->seed;
    static uint64_t counter;
    return (uint64_t)(lilac_now() * 1e9) ^ (__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9e3779b97f4a7c15ull);
}

void lilac_sampler_init(lilac_sampler *s, int64_t vocab) {
    memset(s, 0, sizeof *s);
    s->vocab = vocab;
    s->out_count = xcalloc((size_t)vocab, sizeof(int32_t));
    s->seen = xcalloc((size_t)vocab, 1);
    s->work = xcalloc((size_t)vocab, sizeof(float));
    s->idx = xcalloc((size_t)vocab, sizeof(int32_t));
}

void lilac_sampler_free(lilac_sampler *s) {
    free(s->out_count);
    free(s->seen);
    free(s->work);
    free(s->idx);
    memset(s, 0, sizeof *s);
}

void lilac_sampler_begin(lilac_sampler *s, const lilac_sampling *p, const int32_t *prompt, int n_prompt) {
    memset(s->out_count, 0, sizeof(int32_t) * (size_t)s->vocab);
    memset(s->seen, 0, (size_t)s->vocab);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= 0 && prompt[i] < s->vocab) s->seen[prompt[i]] = 1;
    lilac_rng_seed(&s->rng, lilac_sampling_seed(p));
}

void lilac_sampler_accept(lilac_sampler *s, int32_t tok) {
    if (tok < 0 || tok >= s->vocab) return;
    s->out_count[tok]++;
    s->seen[tok] = 1;
}

static int cmp_desc(const void *a, const void *b, void *ctx) {
    const float *w = ctx;
    float x = w[*(const int32_t *)a], y = w[*(const int32_t *)b];
    if (x > y) return -1;
    if (x < y) return 1;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    return (i > j) - (i < j); /* ties: lower id first (deterministic) */
}

/* The k largest of w[idx[0..n)] moved to the front, sorted (k small: a heap-free
 * insertion pass over a bounded window, O(n k) worst case, O(n) typical). */
static int top_k_select(const float *w, int32_t *idx, int n, int k) {
    if (k >= n) k = n;
    int m = 0; /* idx[0..m) holds the current top, sorted descending */
    for (int i = 0; i < n; i++) {
        int32_t id = idx[i];
        float v = w[id];
        if (m == k && !(v > w[idx[m - 1]])) continue;
        int j = m < k ? m++ : m - 1;
        while (j > 0 && (w[idx[j - 1]] < v || (w[idx[j - 1]] == v && idx[j - 1] > id))) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = id;
    }
    return k;
}

int32_t lilac_sample(lilac_sampler *s, const lilac_sampling *p, const float *logits) {
    const int64_t V = s->vocab;
    float *w = s->work;
    memcpy(w, logits, sizeof(float) * (size_t)V);
    const bool rep = p->repetition_penalty > 0 && p->repetition_penalty != 1.0f;
    const bool pf = p->presence_penalty != 0 || p->frequency_penalty != 0;
    if (rep || pf)
        for (int64_t i = 0; i < V; i++) {
            if (rep && s->seen[i]) w[i] = w[i] > 0 ? w[i] / p->repetition_penalty : w[i] * p->repetition_penalty;
            if (pf && s->out_count[i]) {
                /* two statements: no compiler may fuse them into an fma (the CUDA sampler
                 * rounds the product and the sum separately too) */
                const float f = p->frequency_penalty * (float)s->out_count[i];
                w[i] -= p->presence_penalty + f;
            }
        }
    for (int64_t i = 0; i < V; i++)
        if (isnan(w[i])) w[i] = -INFINITY;
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (w[i] > w[best]) best = i;
    if (p->temperature <= 0 || p->top_k == 1) return (int32_t)best;
    const float T = p->temperature, mx = w[best];
    /* Candidates: within 30 nats (after temperature) of the best; the rest
     * carry less than e^-30 of the mass each. */
    int n = 0;
    for (int64_t i = 0; i < V; i++)
        if ((w[i] - mx) / T > -30.0f) s->idx[n++] = (int32_t)i;
    if (n == 0) return (int32_t)best; /* every logit -inf/NaN, or +inf: nothing to draw from */
    if (p->top_k > 0 && p->top_k < n) n = top_k_select(w, s->idx, n, p->top_k);
    else qsort_r(s->idx, (size_t)n, sizeof(int32_t), cmp_desc, w);
    /* softmax over the candidates, in place of w (probabilities) */
    double sum = 0;
    for (int i = 0; i < n; i++) {
        float e = expf((w[s->idx[i]] - mx) / T);
        w[s->idx[i]] = e;
        sum += e;
    }
    double pmax = w[s->idx[0]] / sum;
    int keep = n;
    if (p->top_p > 0 && p->top_p < 1) {
        double c = 0;
        for (int i = 0; i < n; i++) {
            c += w[s->idx[i]] / sum;
            if (c >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0) {
        int k2 = 0;
        while (k2 < keep && w[s->idx[k2]] / sum >= p->min_p * pmax) k2++;
        if (k2 < 1) k2 = 1;
        keep = k2;
    }
    double tot = 0;
    for (int i = 0; i < keep; i++) tot += w[s->idx[i]];
    double u = lilac_rng_uniform(&s->rng) * tot, c = 0;
    for (int i = 0; i < keep; i++) {
        c += w[s->idx[i]];
        if (u < c) return s->idx[i];
    }
    return s->idx[keep - 1];
}

void lilac_logprobs(const float *logits, int64_t vocab, int32_t tok, int k, float *lp_tok, int32_t *top_ids,
                    float *top_lps) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int64_t i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    *lp_tok = (tok >= 0 && tok < vocab) ? (float)(logits[tok] - lse) : -INFINITY;
    if (k <= 0) return;
    if (k > 20) k = 20;
    int m = 0;
    for (int64_t i = 0; i < vocab; i++) {
        float v = logits[i];
        if (m == k && !(v > logits[top_ids[m - 1]])) continue;
        int j = m < k ? m++ : m - 1;
        while (j > 0 && logits[top_ids[j - 1]] < v) {
            top_ids[j] = top_ids[j - 1];
            j--;
        }
        top_ids[j] = (int32_t)i;
    }
    for (int i = 0; i < m; i++) top_lps[i] = (float)(logits[top_ids[i]] - lse);
    for (int i = m; i < k; i++) top_ids[i] = -1, top_lps[i] = -INFINITY;
}
