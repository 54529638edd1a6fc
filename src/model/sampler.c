/* sampler.c — see sampler.h. */
#include "sampler.h"

#include <math.h>
#include <stdbool.h>
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

/* Candidates are ordered by weight, descending, ties by lower id first: a strict
 * total order, so every selection below is deterministic. */
static inline bool before(const float *w, int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); }

static void sort_small(const float *w, int32_t *idx, int n) {
    for (int i = 1; i < n; i++) {
        int32_t x = idx[i];
        int j = i;
        for (; j > 0 && before(w, x, idx[j - 1]); j--) idx[j] = idx[j - 1];
        idx[j] = x;
    }
}

/* Reorder idx[0..n) so that its first m entries are the m first in the order
 * above, with idx[m - 1] the m-th, and return m: for count > 0 the given count
 * (at most n); else the smallest m whose weights sum to at least `mass` (more
 * than it when `strict`), n when none does (rounding). Quickselect: expected
 * linear time whatever m is, where a sort would cost n log n and an insertion
 * top-k n k (n is the whole vocabulary at temperature >= 1 without top-k). */
static int select_prefix(const float *w, int32_t *idx, int n, int count, double mass, bool strict) {
    if (count > 0 && count >= n) count = n;
    int lo = 0, hi = n;
    double acc = 0; /* weight of idx[0..lo) */
    uint64_t r = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    while (hi - lo > 24) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17; /* pivot: median of three pseudo-random picks */
        int32_t a = idx[lo + (int)(r % (uint64_t)(hi - lo))], b = idx[lo + (int)((r >> 21) % (uint64_t)(hi - lo))],
                c = idx[lo + (int)((r >> 42) % (uint64_t)(hi - lo))];
        int32_t piv = before(w, a, b) ? (before(w, b, c) ? b : before(w, a, c) ? c : a)
                                      : (before(w, a, c) ? a : before(w, b, c) ? c : b);
        /* partition idx[lo..hi): those before the pivot, then the pivot, then the rest */
        int g = lo;
        double mg = 0;
        for (int i = lo; i < hi; i++)
            if (before(w, idx[i], piv)) {
                int32_t t = idx[i];
                idx[i] = idx[g], idx[g] = t;
                mg += w[t];
                g++;
            }
        for (int i = g; i < hi; i++)
            if (idx[i] == piv) {
                idx[i] = idx[g], idx[g] = piv;
                break;
            }
        if (count > 0) {
            if (count <= g) hi = g;
            else if (count == g + 1) return count;
            else lo = g + 1;
            continue;
        }
        double with_g = acc + mg, with_p = with_g + w[piv];
        if (strict ? with_g > mass : with_g >= mass) hi = g;
        else if (strict ? with_p > mass : with_p >= mass) return g + 1;
        else acc = with_p, lo = g + 1;
    }
    sort_small(w, idx + lo, hi - lo);
    if (count > 0) return count;
    for (int i = lo; i < hi; i++) {
        acc += w[idx[i]];
        if (strict ? acc > mass : acc >= mass) return i + 1;
    }
    /* none: the whole set; its last entry in the order is the draw of the
     * sequential walk, so put it at n - 1 */
    if (hi < n) {
        int last = hi;
        for (int i = hi + 1; i < n; i++)
            if (before(w, idx[last], idx[i])) last = i;
        int32_t t = idx[last];
        idx[last] = idx[n - 1], idx[n - 1] = t;
    }
    return n;
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
    if (p->top_k > 0 && p->top_k < n) n = select_prefix(w, s->idx, n, p->top_k, 0, false);
    /* softmax weights over the candidates, in place of w (unnormalised; the best is 1) */
    double sum = 0;
    for (int i = 0; i < n; i++) {
        float e = expf((w[s->idx[i]] - mx) / T);
        w[s->idx[i]] = e;
        sum += e;
    }
    int keep = n;
    /* top-p: the fewest most likely candidates holding top_p of the probability */
    if (p->top_p > 0 && p->top_p < 1) keep = select_prefix(w, s->idx, n, 0, p->top_p * sum, false);
    /* min-p: those at least min_p times as likely as the best (whose weight is 1);
     * the kept set is a prefix of the order, so filtering it keeps a prefix */
    if (p->min_p > 0) {
        int k2 = 0;
        int32_t top = s->idx[0];
        for (int i = 0; i < keep; i++) {
            int32_t id = s->idx[i];
            if (before(w, id, top)) top = id;
            if (w[id] >= p->min_p) s->idx[i] = s->idx[k2], s->idx[k2++] = id;
        }
        if (k2 < 1) { /* rounding: keep the best */
            for (int i = 0; i < keep; i++)
                if (s->idx[i] == top) s->idx[i] = s->idx[0], s->idx[0] = top;
            k2 = 1;
        }
        keep = k2;
    }
    double tot = 0;
    for (int i = 0; i < keep; i++) tot += w[s->idx[i]];
    /* the draw: walking the kept candidates in order, the first whose running
     * weight passes u */
    double u = lilac_rng_uniform(&s->rng) * tot;
    int m = select_prefix(w, s->idx, keep, 0, u, true);
    return s->idx[m - 1];
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
