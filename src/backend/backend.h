/* backend.h — the small C interface every compute backend implements.
 *
 * A backend runs the forward pass of a loaded model (weights.h) for one
 * sequence held in a session: the session owns all mutable state (KV cache of
 * the full-attention layers, the recurrent state and conv window of every
 * GDN layer, the current position), so decoding is incremental. */
#ifndef LILAC_BACKEND_H
#define LILAC_BACKEND_H

#include "../model/sampling.h"
#include "../model/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lilac_session lilac_session; /* backend-private */

/* A copy of a session's recurrent state at one position: the GDN state and
 * conv window of every linear-attention layer, and the position itself. KV
 * entries are not copied: entries below the position are never overwritten
 * by later tokens, so restoring the position truncates the KV cache. */
typedef struct lilac_snapshot lilac_snapshot; /* backend-private */

/* Which logits forward() writes. */
typedef enum {
    LOGITS_NONE = 0, /* just advance the state (prefill of a prefix) */
    LOGITS_LAST,     /* logits of the last token only: [vocab] */
    LOGITS_ALL,      /* teacher forcing: [n, vocab] */
} lilac_logits_mode;

/* The MTP head's operations (weights.h lilac_mtp says what one step computes). A
 * session's MTP state is the head's own one-layer KV cache and its position: the
 * rows committed so far. Row p pairs the target's final-normed hidden state at
 * position p with the token at p+1, sits at MTP position p and predicts the token
 * at p+2. */
typedef struct {
    /* From now on forward() writes every row's final-normed hidden state, [n][hidden]
     * f32, of a call of n <= cap tokens to hidden (NULL: off). */
    void (*hidden_record)(lilac_session *s, float *hidden, int cap);
    /* The shifted pass: rows (hidden[i], ids[i]) at MTP positions pos..pos+n-1, where
     * pos <= the MTP position (rows from pos on are rewritten: rejected drafts' entries
     * go that way). Logits per mode; the MTP position becomes pos+n and the last row
     * is kept for draft(). 0, or -1 + err. */
    int (*prefill)(lilac_session *s, int64_t pos, const float *hidden, const int32_t *ids, int n,
                   lilac_logits_mode mode, float *logits, lilac_err *err);
    /* k >= 1 greedy drafts from the last prefill row: drafts[0] is its argmax,
     * drafts[i] the argmax of a chained step on (step i-1's output y, drafts[i-1]) at
     * the next MTP position. logits (NULL: not wanted): [k][vocab]. Chained rows'
     * KV entries lie past the MTP position, which stays: the next prefill overwrites
     * them. 0, or -1 + err. */
    int (*draft)(lilac_session *s, int k, int32_t *drafts, float *logits, lilac_err *err);
    int64_t (*pos)(const lilac_session *s);
} lilac_mtp_ops;

typedef struct {
    const char *name;
    /* Create a session for up to max_seq positions (0: the config maximum). */
    lilac_session *(*session_new)(const lilac_model *m, int64_t max_seq, int threads, lilac_err *err);
    void (*session_free)(lilac_session *s);
    /* Back to position 0, all state zeroed. */
    void (*session_reset)(lilac_session *s);
    /* Tokens seen so far. */
    int64_t (*session_pos)(const lilac_session *s);
    /* Feed n tokens at the current position; write logits per `mode`.
     * Returns 0, or -1 + err (e.g. context full, id out of range). */
    int (*forward)(lilac_session *s, const int32_t *ids, int n, lilac_logits_mode mode, float *logits, lilac_err *err);
    /* Greedy decoding loop: feed `first`, take the argmax, hand it to
     * on_token, feed it, ... until on_token returns false or max_new tokens
     * were produced. Contract: on return the session has consumed `first` and
     * every token handed to on_token (the last one too), so a following turn
     * continues from exactly what the caller saw. Returns tokens produced, or
     * -1 + err. Backends may run ahead of on_token (the CUDA one does, by one
     * step) but never past this contract. */
    int (*decode_greedy)(lilac_session *s, int32_t first, int max_new, bool (*on_token)(void *ud, int32_t tok),
                         void *ud, lilac_err *err);
    /* Snapshots (prefix reuse across turns): take one at the current position;
     * restore rewinds the session to it (the session must be the one it was
     * taken from, and must not have been reset since); free. */
    lilac_snapshot *(*snapshot)(lilac_session *s, lilac_err *err);
    int (*restore)(lilac_session *s, const lilac_snapshot *snap, lilac_err *err);
    void (*snapshot_free)(lilac_snapshot *snap);
    int64_t (*snapshot_pos)(const lilac_snapshot *snap);
    size_t (*snapshot_bytes)(const lilac_snapshot *snap);
    /* One decode step for n sessions of the same model at once (one token each,
     * ids[i] for ss[i]): logits [n, vocab]. The weights are read once for all n
     * rows (CPU), or the sessions step one after another (CUDA, for now). */
    int (*forward_batch)(lilac_session **ss, const int32_t *ids, int n, float *logits, lilac_err *err);
    /* Sampling where the logits are (optional: NULL in the CPU backend, whose logits
     * are in host memory already; the engine then samples with lilac_sample, as it
     * does for requests that need the logits themselves, e.g. logprobs). A session
     * holds one request's sampler state. sample_begin starts it as
     * lilac_sampler_begin does: counts cleared, the prompt ids marked seen, the
     * generator seeded from lilac_sampling_seed(p). The two forward entries then
     * pick each next token exactly as lilac_sample would from the logits (same
     * algorithm and draws; only a different summation order may flip a near-tie),
     * record it for the penalties, and return just the ids. */
    int (*sample_begin)(lilac_session *s, const lilac_sampling *p, const int32_t *prompt, int n_prompt, lilac_err *err);
    /* forward(ids, n, LOGITS_LAST), the last token's logits sampled into *tok. */
    int (*forward_sample)(lilac_session *s, const int32_t *ids, int n, int32_t *tok, lilac_err *err);
    /* forward_batch, row i's logits sampled with ss[i]'s state into toks[i]. */
    int (*forward_batch_sample)(lilac_session **ss, const int32_t *ids, int n, int32_t *toks, lilac_err *err);
    /* Optional (NULL where unsupported): from now on, keep KV cache rows rounded
     * to bf16 (round to nearest even), as the CUDA backend stores them, so that
     * tests/cuda/test_cuda.c can hold the two backends to f32 agreement. */
    void (*set_kv_bf16)(lilac_session *s, bool on);
    /* Routing record and replay (optional, NULL where unsupported): tests/cuda/test_cuda.c replays the CUDA
     * backend's expert choices on the CPU reference, so that a near-tie between the k-th and (k+1)-th expert,
     * which the two backends' rounding may break differently, does not make their logits diverge. A table
     * holds, for a forward() call of n tokens, ids[(l * n + i) * top_k + k]: layer l, token i of the call
     * (all chunks, in order), k-th pick; cap bounds n (a longer call fails). NULL ids: off.
     * Record (CPU: every call; CUDA: tokens of multi-token passes only, not one-token calls or chunks, nor
     * graphs): forward() writes the top-k ids it chose; rows it does not record are left as they are. */
    void (*route_record)(lilac_session *s, int32_t *ids, int cap);
    /* Replay: forward() routes each row of the table that holds ids (-1 rows: its own top-k) to those
     * experts, weighted by this backend's own router probabilities there (same softmax and renormalisation),
     * and measures each replayed choice's regret: (p(own k-th best) - min p(replayed ids)) / p(own k-th best),
     * 0 where the sets agree. Setting a table clears the measurements. */
    void (*route_replay)(lilac_session *s, const int32_t *ids, int cap);
    /* The worst regret since route_replay, and (differ non-NULL) how many replayed rows differed from the
     * backend's own top-k as a set. */
    double (*route_regret)(const lilac_session *s, int64_t *differ);
    /* Bytes of one cached K or V element (f32 on the CPU, bf16 on the GPU): `lilac bench`'s decode roofline. */
    int kv_bytes;
    /* Optional (NULL where there is no choice: the CPU backend computes attention in f32): the
     * attention's precision for the session's later prefills, `--attn-precision`: false (f32, the
     * default) or true (bf16 pieces of the scores' and weights' operands, as FlashAttention). */
    void (*set_attn_bf16)(lilac_session *s, bool on);
    /* Optional (NULL: the engine samples rows with a constraint or logit_bias on the host): for the
     * session's following forward_sample / forward_batch_sample draws, until the next call or
     * sample_begin, add logit_bias (n_bias ids and values; 0: none) to the logits and set those of
     * ids whose bit in `mask` is clear to -inf (ceil(vocab/64) words, bit i%64 of word i/64 for id i;
     * NULL: no mask), before the penalties, exactly as the host path does. */
    int (*sample_constrain)(lilac_session *s, const uint64_t *mask, const int32_t *bias_ids, const float *bias_vals,
                            int n_bias, lilac_err *err);
    /* Optional (NULL where unsupported): the MTP head, for models that have one (m->mtp). */
    const lilac_mtp_ops *mtp;
} lilac_backend;

extern const lilac_backend lilac_backend_cpu;
#ifdef LILAC_CUDA
extern const lilac_backend lilac_backend_cuda;
/* True when a usable CUDA device (sm_90) is present; else false + err says why. */
bool lilac_cuda_available(lilac_err *err);
#endif

/* Shared by backends: the decode_greedy loop written with forward(). */
int lilac_decode_greedy_generic(const lilac_backend *be, lilac_session *s, int64_t vocab, int32_t first, int max_new,
                                bool (*on_token)(void *ud, int32_t tok), void *ud, lilac_err *err);

/* "cpu" (or NULL/"auto": the best available). NULL + err if unknown/unavailable. */
const lilac_backend *lilac_backend_get(const char *name, lilac_err *err);

#ifdef __cplusplus
}
#endif

#endif
