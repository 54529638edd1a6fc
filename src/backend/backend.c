/* backend.c — pick a backend by name; the generic greedy decode loop. */
#include <stdlib.h>

#include "backend.h"

const lilac_backend *lilac_backend_get(const char *name, lilac_err *err) {
    if (!name || !strcmp(name, "auto")) {
#ifdef LILAC_CUDA
        if (lilac_cuda_available(NULL)) return &lilac_backend_cuda;
#endif
        return &lilac_backend_cpu;
    }
    if (!strcmp(name, "cpu")) return &lilac_backend_cpu;
    if (!strcmp(name, "cuda")) {
#ifdef LILAC_CUDA
        if (!lilac_cuda_available(err)) return NULL;
        return &lilac_backend_cuda;
#else
        lilac_fail(err, "backend \"cuda\": this lilac was built without CUDA (no nvcc at build time)");
        return NULL;
#endif
    }
    lilac_fail(err, "unknown backend \"%s\" (available: cpu, cuda)", name);
    return NULL;
}

static int32_t argmax_f32(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

int lilac_decode_greedy_generic(const lilac_backend *be, lilac_session *s, int64_t vocab, int32_t first, int max_new,
                                bool (*on_token)(void *ud, int32_t tok), void *ud, lilac_err *err) {
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    if (!logits) return lilac_fail(err, "out of memory (logits)");
    int32_t tok = first;
    int produced = 0;
    while (produced < max_new) {
        if (be->forward(s, &tok, 1, LOGITS_LAST, logits, err) < 0) { produced = -1; break; }
        tok = argmax_f32(logits, vocab);
        produced++;
        bool more = on_token(ud, tok);
        if (!more || produced == max_new) {
            /* Consume the last token handed out too (the contract in backend.h). */
            if (be->forward(s, &tok, 1, LOGITS_NONE, NULL, err) < 0) produced = -1;
            break;
        }
    }
    free(logits);
    return produced;
}
