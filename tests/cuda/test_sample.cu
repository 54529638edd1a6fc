// test_sample.cu — the device sampler (src/backend/cuda/cuda_sample.cu) against the
// host lilac_sample, draw for draw: random logits of several shapes (peaked,
// LLM-like, flat, exact ties incl. signed zeros, all tied, -inf masks, NaN, +inf,
// a far outlier that piles the rest into one bucket), vocabularies from 1 to
// 248,320, every sampling feature, penalties accumulating over each episode, the
// same seed on both sides. Requires identical tokens on >= 99.5% of the random
// draws (on flat logits over 248,320 ids the order a cumulative sum runs in decides
// which of many nearly equal tokens a draw lands on; the host selects where the
// device sorts, so their orders differ; it prints how many differing draws were not
// near-ties, logits more than 1e-5 apart) and on every greedy draw, which must also
// be the argmax; device results must be deterministic and
// free of internal errors. Episodes with structured output add a logit_bias and a
// per-step mask of allowed ids (dense, sparse, a few ids) on both sides: the
// device's cuda_sampler_constrain against the bias added and disallowed ids set to
// -inf on the host, then lilac_sample.
// Also prints the device time per token at 248,320.
//
//   build/cuda-tests/test_sample [--quick] [--vocab N]...   (on a GPU; exit 0 = PASS)
// Without a GPU: tests/cuda/emu/cuda_runtime.h runs it on the CPU (see there).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "backend/cuda/cuda_sample.cuh"

#define CK(call)                                                                                     \
    do {                                                                                             \
        cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess) {                                                                     \
            fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(2);                                                                                 \
        }                                                                                            \
    } while (0)

struct rnd {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    double uni() { return (double)(next() >> 11) * (1.0 / 9007199254740992.0); }
    int below(int n) { return (int)(uni() * n); }
    double normal() {
        double u = uni(), v = uni();
        if (u < 1e-300) u = 1e-300;
        return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
    }
};

enum { D_PEAKED, D_LLM, D_FLAT, D_TIES, D_ALLTIE, D_MASKED, D_NAN, D_PINF, D_OUTLIER, D_ALLNEG, D_N };
static const char *dname[D_N] = {"peaked", "llm", "flat", "ties", "alltie", "masked", "nan", "+inf", "outlier", "all-inf"};

static void gen(int d, int V, rnd &r, float *x) {
    switch (d) {
    case D_PEAKED:
        for (int i = 0; i < V; i++) x[i] = (float)r.normal();
        for (int k = 0, n = 1 + r.below(5); k < n; k++) x[r.below(V)] = (float)(8 + 7 * r.uni());
        break;
    case D_LLM:
        for (int i = 0; i < V; i++) x[i] = (float)(2.5 * r.normal());
        for (int k = 0, n = r.below(4); k < n; k++) x[r.below(V)] += (float)(6 + 6 * r.uni());
        if (r.below(4) == 0) { // an exact tie at the top
            int a = 0;
            for (int i = 1; i < V; i++)
                if (x[i] > x[a]) a = i;
            x[r.below(V)] = x[a];
        }
        break;
    case D_FLAT:
        for (int i = 0; i < V; i++) x[i] = (float)(1e-3 * r.uni());
        break;
    case D_TIES: // few levels; level 0 as +0 or -0
        for (int i = 0; i < V; i++) {
            const int l = r.below(4);
            x[i] = l ? (float)l * 0.75f : (r.below(2) ? 0.0f : -0.0f);
        }
        break;
    case D_ALLTIE:
        for (int i = 0; i < V; i++) x[i] = 0.5f;
        break;
    case D_MASKED: { // most entries -inf, sometimes all but a few
        const double keep = r.below(3) ? 0.5 : 0.001;
        for (int i = 0; i < V; i++) x[i] = r.uni() < keep ? (float)(2 * r.normal()) : -INFINITY;
        break;
    }
    case D_NAN:
        for (int i = 0; i < V; i++) x[i] = r.uni() < 0.01 ? NAN : (float)(1.5 * r.normal());
        break;
    case D_PINF:
        for (int i = 0; i < V; i++) x[i] = (float)r.normal();
        x[r.below(V)] = INFINITY;
        break;
    case D_OUTLIER: // one far ahead, the rest within a hair of each other, a few far below
        for (int i = 0; i < V; i++) x[i] = (float)(1e-3 * r.normal());
        x[r.below(V)] = 29.0f;
        for (int k = 0; k < 3; k++) x[r.below(V)] = -1e4f;
        break;
    case D_ALLNEG:
        for (int i = 0; i < V; i++) x[i] = -INFINITY;
        break;
    }
}

struct pset {
    const char *name;
    float T, top_p, min_p, pres, freq, rep;
    int top_k;
};
static const pset PS[] = {
    {"sample", 1.0f, 1.0f, 0, 0, 0, 1.0f, 0},
    {"k20-p95", 0.7f, 0.95f, 0, 0, 0, 1.0f, 20},
    {"p95", 1.0f, 0.95f, 0, 0, 0, 1.0f, 0},
    {"qwen+pen", 0.6f, 0.95f, 0.05f, 0.5f, 0.3f, 1.1f, 20},
    {"k100-minp", 1.3f, 1.0f, 0.1f, 0, 0, 1.0f, 100},
    {"hot-p90", 5.0f, 0.9f, 0, 0, 0, 1.0f, 0},
    {"pen", 1.0f, 1.0f, 0, 1.5f, -0.5f, 1.3f, 0},
    {"k2", 1.0f, 1.0f, 0, 0, 0, 1.0f, 2},
    {"k5000-p99-minp", 0.8f, 0.99f, 0.001f, 0, 0, 1.0f, 5000},
    {"p50-minp", 1.0f, 0.5f, 0.2f, 0.2f, 0.2f, 0.9f, 0},
    {"greedy", 0, 1.0f, 0, 0, 0, 1.0f, 0},
    {"greedy+pen", 0, 1.0f, 0, 1.0f, 0.5f, 1.2f, 0},
    {"top_k=1", 1.0f, 0.9f, 0, 0, 0, 1.0f, 1},
};
enum { NPS = sizeof PS / sizeof PS[0] };
static bool is_greedy(const pset &p) { return p.T <= 0 || p.top_k == 1; }

static long draws, agree, gdraws, gagree, argmax_bad, errors, nondet, masked_out, cdraws, cagree, far_mismatch;

static int32_t first_argmax(const float *x, int V) { // NaN as -inf, as the sampler
    int b = 0;
    float bv = isnan(x[0]) ? -INFINITY : x[0];
    for (int i = 1; i < V; i++) {
        const float v = isnan(x[i]) ? -INFINITY : x[i];
        if (v > bv) { bv = v; b = i; }
    }
    return b;
}

// One episode: begin both samplers, then `steps` draws from fresh logits each.
// Returns the device tokens (for the determinism check).
static std::vector<int32_t> episode(cuda_sampler *ds, lilac_sampler *hs, int V, int d, const pset &ps, int cap,
                                    uint64_t seed, int steps, float *h, float *dl, cudaStream_t st, bool compare,
                                    bool cons = false) {
    lilac_err err = {{0}};
    lilac_sampling p;
    lilac_sampling_default(&p);
    p.temperature = ps.T;
    p.top_p = ps.top_p;
    p.min_p = ps.min_p;
    p.presence_penalty = ps.pres;
    p.frequency_penalty = ps.freq;
    p.repetition_penalty = ps.rep;
    p.top_k = ps.top_k;
    p.seed = seed;
    p.has_seed = true;
    rnd r{seed * 7919 + 13};
    std::vector<int32_t> prompt((size_t)(1 + r.below(V < 2000 ? V : 2000)));
    for (auto &t : prompt) t = r.below(V);
    lilac_sampler_begin(hs, &p, prompt.data(), (int)prompt.size());
    cuda_sampler_set_cap(ds, cap);
    if (cuda_sampler_begin(ds, &p, prompt.data(), (int)prompt.size(), st, &err) < 0) {
        fprintf(stderr, "  begin: %s\n", err.msg);
        errors++;
        return {};
    }
    std::vector<int32_t> out;
    // structured output: a bias on a few ids for the episode, a fresh mask each step
    const size_t words = ((size_t)V + 63) / 64;
    std::vector<uint64_t> mask(words);
    std::vector<int32_t> bids;
    std::vector<float> bvals;
    std::vector<float> hb(cons ? (size_t)V : 0);
    for (int k = 0; cons && k < 4; k++) {
        bids.push_back((int32_t)r.below(V));
        bvals.push_back(k == 0 && r.below(4) == 0 ? 100.0f : (float)((int)r.below(17) - 8));
    }
    for (int s = 0; s < steps; s++) {
        gen(d, V, r, h);
        CK(cudaMemcpy(dl, h, sizeof(float) * (size_t)V, cudaMemcpyHostToDevice));
        if (cons) {
            const int kind = s % 3; // ~half the ids, ~2%, or 1..3 ids
            std::fill(mask.begin(), mask.end(), 0);
            for (int i = 0; i < V; i++)
                if (kind == 0 ? r.below(2) == 0 : kind == 1 ? r.below(50) == 0 : false) mask[i >> 6] |= 1ull << (i & 63);
            for (int k = 0, n = kind == 2 ? 1 + (int)r.below(3) : 1; k < n; k++) {
                const int32_t i = (int32_t)r.below(V);
                mask[i >> 6] |= 1ull << (i & 63);
            }
            if (cuda_sampler_constrain(ds, mask.data(), bids.data(), bvals.data(), (int)bids.size(), st, &err) < 0) {
                fprintf(stderr, "  constrain: %s\n", err.msg);
                errors++;
                break;
            }
            // the host side, as the engine's host path: bias, then the mask
            memcpy(hb.data(), h, sizeof(float) * (size_t)V);
            for (size_t k = 0; k < bids.size(); k++) hb[bids[k]] += bvals[k];
            for (int i = 0; i < V; i++)
                if (!(mask[i >> 6] >> (i & 63) & 1)) hb[i] = -INFINITY;
        }
        if (cuda_sampler_launch(ds, dl, st, &err) < 0) {
            fprintf(stderr, "  launch: %s\n", err.msg);
            errors++;
            break;
        }
        CK(cudaStreamSynchronize(st));
        const int32_t td = cuda_sampler_result(ds, &err);
        if (td < 0) {
            fprintf(stderr, "  V=%d %s %s cap=%d step %d: %s\n", V, dname[d], ps.name, cap, s, err.msg);
            errors++;
            break;
        }
        out.push_back(td);
        if (!compare) continue;
        const float *hl = cons ? hb.data() : h; // the logits the host samples from
        const int32_t th = lilac_sample(hs, &p, hl);
        lilac_sampler_accept(hs, th);
        bool any = false; // an allowed id with a logit above -inf (else there is nothing to draw from)
        for (int i = 0; cons && i < V && !any; i++) any = (mask[i >> 6] >> (i & 63) & 1) && hl[i] > -INFINITY;
        if (cons && any && !(mask[td >> 6] >> (td & 63) & 1)) {
            masked_out++;
            fprintf(stderr, "  V=%d %s %s: device drew %d, outside the mask\n", V, dname[d], ps.name, td);
        }
        const bool g = is_greedy(ps);
        (g ? gdraws : draws)++;
        if (td == th) (g ? gagree : agree)++;
        if (cons) cdraws++, cagree += td == th;
        if (g && ps.pres == 0 && ps.freq == 0 && ps.rep == 1.0f && td != first_argmax(hl, V)) argmax_bad++;
        if (td != th) {
            if (!(fabsf(hl[td] - hl[th]) <= 1e-5f)) far_mismatch++; // not a near-tie (NaN included)
            static int shown;
            if (shown++ < 12)
                fprintf(stderr, "  mismatch: V=%d %s %s cap=%d seed %llu step %d: device %d (logit %g) host %d (logit %g)\n",
                        V, dname[d], ps.name, cap, (unsigned long long)seed, s, td, hl[td], th, hl[th]);
            break; // the penalty states differ from here on
        }
    }
    return out;
}

int main(int argc, char **argv) {
    bool quick = false;
    int vocabs[8] = {248320, 50000, 5003, 1003, 37, 2, 1}, NV = 7, nsel = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc && nsel < 8) vocabs[nsel++] = atoi(argv[++i]), NV = nsel;
        else {
            fprintf(stderr, "usage: test_sample [--quick] [--vocab N]...\n");
            return 2;
        }
    }
    lilac_err err = {{0}};
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    const int caps[] = {2048, 64, 8, 1};
    rnd pick{12345};
    double t0 = lilac_now();
    for (int vi = 0; vi < NV; vi++) {
        const int V = vocabs[vi];
        cuda_sampler *ds = cuda_sampler_new(V, &err);
        if (!ds) {
            fprintf(stderr, "cuda_sampler_new: %s\n", err.msg);
            return 2;
        }
        lilac_sampler hs;
        lilac_sampler_init(&hs, V);
        float *h = (float *)malloc(sizeof(float) * (size_t)V), *dl;
        CK(cudaMalloc((void **)&dl, sizeof(float) * (size_t)V));
        // Episodes x steps per (distribution, parameter set): fewer for the large vocabularies.
        const int eps = V >= 200000 ? 1 : V >= 50000 ? 1 : V >= 1000 ? 3 : 4;
        int steps = V >= 200000 ? 6 : V >= 50000 ? 10 : 40;
        if (quick) steps = V >= 50000 ? 2 : 8;
        const long d0 = draws + gdraws;
        for (int d = 0; d < D_N; d++)
            for (int pi = 0; pi < NPS; pi++) {
                if (quick && V >= 50000 && (pick.below(3) != 0)) continue;
                for (int e = 0; e < eps; e++) {
                    // the default capacity mostly; small ones force the radix fallback
                    const int cap = e == 0 ? caps[0] : caps[pick.below(4)];
                    episode(ds, &hs, V, d, PS[pi], cap, pick.next(), steps, h, dl, st, true);
                }
                // with a mask and a logit_bias
                if (!quick || pick.below(2) == 0) {
                    episode(ds, &hs, V, d, PS[pi], caps[pick.below(4)], pick.next(), steps < 9 ? steps : 9, h, dl, st,
                            true, true);
                }
            }
        // Determinism: the same episode twice on the device.
        for (int d = 0; d < D_N; d++) {
            const uint64_t seed = pick.next();
            const int pi = pick.below(NPS), cap = caps[pick.below(4)], n = quick ? 3 : 8;
            auto a = episode(ds, &hs, V, d, PS[pi], cap, seed, n, h, dl, st, false);
            auto b = episode(ds, &hs, V, d, PS[pi], cap, seed, n, h, dl, st, false);
            if (a != b) {
                nondet++;
                fprintf(stderr, "  nondeterministic: V=%d %s %s cap=%d\n", V, dname[d], PS[pi].name, cap);
            }
        }
        printf("V=%-6d %6ld draws  (%.1f s so far)\n", V, draws + gdraws - d0, lilac_now() - t0);
        fflush(stdout);
        // Device time per token at the real vocabulary size.
        if (V == 248320) {
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            const int pis[] = {0, 1, 2, 3, 10};
            const int ds_[] = {D_LLM, D_FLAT, D_OUTLIER};
            for (int d : ds_) {
                rnd r{99};
                gen(d, V, r, h);
                CK(cudaMemcpy(dl, h, sizeof(float) * (size_t)V, cudaMemcpyHostToDevice));
                printf("  time per token, %-8s", dname[d]);
                for (int pi : pis) {
                    episode(ds, &hs, V, d, PS[pi], 2048, 1, 0, h, dl, st, false); // begin only
                    const int reps = quick ? 1 : 50;
                    if (cuda_sampler_launch(ds, dl, st, &err) < 0) return 2; // warm up
                    CK(cudaEventRecord(e0, st));
                    for (int i = 0; i < reps; i++)
                        if (cuda_sampler_launch(ds, dl, st, &err) < 0) return 2;
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    float ms = 0;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    printf("  %s %.1f us", PS[pi].name, 1e3 * ms / reps);
                }
                printf("\n");
            }
            CK(cudaEventDestroy(e0));
            CK(cudaEventDestroy(e1));
        }
        CK(cudaFree(dl));
        free(h);
        lilac_sampler_free(&hs);
        cuda_sampler_free(ds);
    }
    const double rate = draws ? (double)agree / draws : 1.0;
    const bool ok = rate >= 0.995 && gagree == gdraws && argmax_bad == 0 && errors == 0 && nondet == 0 && draws > 0 &&
                    masked_out == 0 && cdraws > 0;
    printf("random draws: %ld/%ld identical (%.4f%%), %ld differing beyond a near-tie; greedy: %ld/%ld identical, %ld not the argmax; "
           "%ld internal errors; %ld nondeterministic episodes; %ld/%ld draws with a mask and bias identical, %ld outside the mask\n",
           agree, draws, 100.0 * rate, far_mismatch, gagree, gdraws, argmax_bad, errors, nondet, cagree, cdraws, masked_out);
    printf("%s\n", ok ? "PASS" : "FAIL");
    printf("%d passed, %d failed\n", ok ? 1 : 0, ok ? 0 : 1);
    return ok ? 0 : 1;
}
