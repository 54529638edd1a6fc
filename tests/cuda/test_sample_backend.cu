// test_sample_backend.cu — the CUDA backend's sampling entries end to end on a
// model (run on a GPU): sessions sampled on the device (sample_begin,
// forward_sample, forward_batch_sample: the graph-captured decode step) against
// twin CUDA sessions whose logits come to the host (forward, forward_batch) and
// are sampled there by lilac_sample with the same seeds. Same model, same device
// kernels: the token streams must agree (>= 99% of the compared tokens, each
// stream compared up to its first difference, after which the inputs differ),
// positions must match, misuse must be refused.
//
//   build/cuda-tests/test_sample_backend [MODEL_DIR]
// Without MODEL_DIR it synthesizes one in a temporary directory: the real
// geometry cut to 4 layers (GDN and attention), the real vocabulary of 248,320.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "backend/backend.h"
#include "model/sampler.h"
#include "model/synth.h"
}

enum { NS = 3, STEPS = 40 };

int main(int argc, char **argv) {
    lilac_err err = {{0}};
    char tmp[] = "/tmp/lilac-test-sample-backend-XXXXXX";
    const char *dir = argc > 1 ? argv[1] : nullptr;
    if (!dir) {
        if (!mkdtemp(tmp)) return 2;
        lilac_config c;
        lilac_config_real(&c);
        c.n_layers = 4;
        lilac_synth_opts o = {};
        o.seed = 5;
        o.quiet = true;
        const int rc = lilac_synth_write(tmp, &c, &o, &err);
        lilac_config_free(&c);
        if (rc < 0) {
            fprintf(stderr, "synth: %s\n", err.msg);
            return 2;
        }
        dir = tmp;
    }
    lilac_model M;
    if (lilac_model_load(&M, dir, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    const lilac_backend *B = lilac_backend_get("cuda", &err);
    if (!B || !B->sample_begin || !B->forward_sample || !B->forward_batch_sample) {
        fprintf(stderr, "no CUDA backend with sampling: %s\n", err.msg);
        return 2;
    }
    const int64_t V = M.cfg.vocab;
    lilac_session *A[NS], *H[NS];
    for (int i = 0; i < NS; i++) {
        A[i] = B->session_new(&M, 512, 0, &err);
        H[i] = B->session_new(&M, 512, 0, &err);
        if (!A[i] || !H[i]) {
            fprintf(stderr, "session_new: %s\n", err.msg);
            return 2;
        }
    }
    int fails = 0;
    // Misuse: sampling without sample_begin is refused, not crashed on.
    {
        int32_t id = 1, tok = -1;
        if (B->forward_batch_sample(&A[0], &id, 1, &tok, &err) == 0) {
            fprintf(stderr, "FAIL: forward_batch_sample without sample_begin succeeded\n");
            fails++;
        }
        B->session_reset(A[0]);
    }
    struct pset {
        const char *name;
        float T, top_p, min_p, pres, freq, rep;
        int top_k;
    } ps[] = {{"sample", 1.0f, 1.0f, 0, 0, 0, 1.0f, 0},
              {"qwen+pen", 0.6f, 0.95f, 0.05f, 0.5f, 0.3f, 1.1f, 20},
              {"hot", 1.5f, 0.9f, 0, 0, 0, 1.0f, 0},
              {"greedy+pen", 0, 1.0f, 0, 1.0f, 0, 1.2f, 0}};
    std::vector<float> logits((size_t)(NS * V));
    lilac_sampler hs[NS];
    for (int i = 0; i < NS; i++) lilac_sampler_init(&hs[i], V);
    long compared = 0, agreed = 0;
    double t_dev = 0, t_host = 0;
    for (const pset &q : ps) {
        int32_t ta[NS], th[NS];
        bool same[NS];
        for (int i = 0; i < NS; i++) {
            B->session_reset(A[i]);
            B->session_reset(H[i]);
            lilac_sampling p;
            lilac_sampling_default(&p);
            p.temperature = q.T, p.top_p = q.top_p, p.min_p = q.min_p, p.top_k = q.top_k;
            p.presence_penalty = q.pres, p.frequency_penalty = q.freq, p.repetition_penalty = q.rep;
            p.seed = 1000 + (uint64_t)i, p.has_seed = true;
            std::vector<int32_t> prompt((size_t)(17 + 9 * i));
            for (size_t k = 0; k < prompt.size(); k++) prompt[k] = (int32_t)((k * 2654435761u + (unsigned)i * 97u) % (uint64_t)V);
            if (B->sample_begin(A[i], &p, prompt.data(), (int)prompt.size(), &err) < 0 ||
                B->forward_sample(A[i], prompt.data(), (int)prompt.size(), &ta[i], &err) < 0 ||
                B->forward(H[i], prompt.data(), (int)prompt.size(), LOGITS_LAST, logits.data(), &err) < 0) {
                fprintf(stderr, "FAIL: %s prefill: %s\n", q.name, err.msg);
                return 1;
            }
            lilac_sampler_begin(&hs[i], &p, prompt.data(), (int)prompt.size());
            th[i] = lilac_sample(&hs[i], &p, logits.data());
            lilac_sampler_accept(&hs[i], th[i]);
            same[i] = ta[i] == th[i];
            compared++, agreed += same[i];
        }
        for (int s = 0; s < STEPS; s++) {
            int32_t na[NS], nh[NS];
            double t0 = lilac_now();
            if (B->forward_batch_sample(A, ta, NS, na, &err) < 0) {
                fprintf(stderr, "FAIL: %s step %d: forward_batch_sample: %s\n", q.name, s, err.msg);
                return 1;
            }
            double t1 = lilac_now();
            if (B->forward_batch(H, th, NS, logits.data(), &err) < 0) {
                fprintf(stderr, "FAIL: %s step %d: forward_batch: %s\n", q.name, s, err.msg);
                return 1;
            }
            for (int i = 0; i < NS; i++) {
                lilac_sampling p;
                lilac_sampling_default(&p);
                p.temperature = q.T, p.top_p = q.top_p, p.min_p = q.min_p, p.top_k = q.top_k;
                p.presence_penalty = q.pres, p.frequency_penalty = q.freq, p.repetition_penalty = q.rep;
                nh[i] = lilac_sample(&hs[i], &p, logits.data() + (int64_t)i * V);
                lilac_sampler_accept(&hs[i], nh[i]);
            }
            double t2 = lilac_now();
            t_dev += t1 - t0, t_host += t2 - t1;
            for (int i = 0; i < NS; i++) {
                if (na[i] < 0 || na[i] >= V) {
                    fprintf(stderr, "FAIL: %s step %d: token %d out of range\n", q.name, s, na[i]);
                    return 1;
                }
                if (same[i]) {
                    compared++;
                    if (na[i] == nh[i]) agreed++;
                    else {
                        same[i] = false;
                        fprintf(stderr, "  %s session %d step %d: device %d, host %d\n", q.name, i, s, na[i], nh[i]);
                    }
                }
                ta[i] = na[i], th[i] = nh[i];
                if (B->session_pos(A[i]) != B->session_pos(H[i])) {
                    fprintf(stderr, "FAIL: %s: positions %lld vs %lld\n", q.name, (long long)B->session_pos(A[i]),
                            (long long)B->session_pos(H[i]));
                    fails++;
                }
            }
        }
        printf("%-11s first tokens %d %d %d ... streams identical: %d %d %d\n", q.name, ta[0], ta[1], ta[2], same[0],
               same[1], same[2]);
    }
    const double rate = compared ? (double)agreed / compared : 0;
    printf("%ld/%ld compared tokens identical (%.2f%%); per batched step of %d: device-sampled %.2f ms, "
           "logits to host + lilac_sample %.2f ms\n",
           agreed, compared, 100 * rate, NS, 1e3 * t_dev / (STEPS * 4), 1e3 * t_host / (STEPS * 4));
    const bool ok = fails == 0 && rate >= 0.99;
    printf("%s\n%d passed, %d failed\n", ok ? "PASS" : "FAIL", ok, !ok);
    for (int i = 0; i < NS; i++) {
        lilac_sampler_free(&hs[i]);
        B->session_free(A[i]);
        B->session_free(H[i]);
    }
    lilac_model_free(&M);
    if (dir == tmp) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    }
    return ok ? 0 : 1;
}
