// cuda_backend.cu — the CUDA backend behind the C interface of backend.h.
//
// Weights go to the GPU in their checkpoint form (4-bit/8-bit codes + bf16
// scales and biases, or bf16), each safetensors tensor uploaded once through
// pinned staging buffers with overlapped copies. A session owns the device
// state (KV cache, GDN state and conv windows) and scratch for one prefill
// chunk. forward() runs the same steps as cpu_forward.c, kernel by kernel; the
// greedy decode loop replays one CUDA graph per token: the argmax kernel writes
// the next input id on the device and into a host-mapped ring the host reads
// one step behind, so the host never waits inside a step.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <utility>
#include <vector>

extern "C" {
#include "../backend.h"
#include "../../util/diag.h"
}
#include "cuda_kernels.cuh"
#include "cuda_sample.cuh"
#include "cuda_gemm.cuh"
#include "cuda_gemm_wg.cuh"
#include "cuda_packed.cuh"
#include "cuda_attn.cuh"
#include "cuda_gdn_chunk.cuh"

#define CK(call)                                                                                        \
    do {                                                                                                \
        cudaError_t e_ = (call);                                                                        \
        if (e_ != cudaSuccess)                                                                          \
            return lilac_fail(err, "CUDA error %s at %s:%d (%s)", cudaGetErrorName(e_), __FILE__, __LINE__, \
                              cudaGetErrorString(e_));                                                  \
    } while (0)
#define CKL() CK(cudaGetLastError())

// Prefill tokens per pass: bounds activation memory (~0.6 GB per 2048 rows at
// the model's size). 4096 rather than 2048: each expert's tile of tokens is
// fuller and its weights are read half as often (prefill +9% at 4k, +6% at
// 32k; docs/perf.md).
static const int CHUNK = 4096;
// Prefill calls of this many tokens or more take the chunked GDN form (cuda_gdn_chunk.cuh): serial
// and chunked are even at 128 tokens, chunked 1.4x at 256 (test_gdn --time).
static const int GDN_CHUNK_MIN = 128;
// k_gdn_recur's threads per state column and columns per thread (gdn_recur_kernel adapts them
// to the shape): 8 and 2 (docs/perf.md).
static const int GDN_RECUR_RG = 8, GDN_RECUR_COLS = 2;
static const int RING = 1024;   // decoded ids visible to the host
static const int ATT_SPLITS = 32;
static_assert(ATT_SPLITS <= 128, "k_attn_combine merges up to 128 splits");

extern "C" bool lilac_cuda_available(lilac_err *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        lilac_fail(err, "no CUDA GPU available (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        cudaGetLastError();
        return false;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return false;
    if (p.major < 9) {
        lilac_fail(err, "GPU %s is compute capability %d.%d; lilac's CUDA backend needs Hopper (9.0)", p.name, p.major,
                   p.minor);
        return false;
    }
    return true;
}

// ---------------------------------------------------------------- weights on the device

// One layer's weights on the device (the fields of lilac_layer the forward pass reads).
struct dlayer {
    float *in_norm, *post_norm, *conv, *A_log, *dt_bias, *gdn_norm, *q_norm, *k_norm;
    dmat in_qkv, in_z, in_b, in_a, out_proj, q_proj, k_proj, v_proj, o_proj;
    dmat router, exp_gate, exp_up, exp_down, sh_gate, sh_up, sh_down, sh_expert_gate;
};

struct dmodel {
    const lilac_model *m;
    int refs;          // sessions using these device weights (one upload per model)
    std::vector<void *> allocs;
    // Host regions weights can point into, sorted by address: every checkpoint
    // tensor, and the buffers the model owns (matrices quantized at load). Each
    // is uploaded whole, once, on first use.
    struct region {
        const char *h;
        size_t n;
        const char *name;
        void *d;
        bool packed, keep; // read by a packed matrix / by a kernel that needs the MLX layout
    };
    std::vector<region> regions;
    void *pinned[2];
    cudaEvent_t ev[2];
    cudaStream_t stream;
    int flip;
    size_t uploaded, packed; // bytes copied from the host; bytes of packed copies made on the device
    dmat embed, lm_head;
    float *final_norm;
    float *inv_freq; // RoPE frequencies [rotary_dim / 2], as the CPU reference computes them
    std::vector<dlayer> layers;
};

// Copy n bytes host->device through the two pinned staging buffers.
static const size_t STAGE = 64u << 20;
static int staged_copy(dmodel *D, void *dst, const void *src, size_t n, lilac_err *err) {
    for (size_t off = 0; off < n; off += STAGE) {
        size_t len = std::min(STAGE, n - off);
        int b = D->flip;
        D->flip ^= 1;
        CK(cudaEventSynchronize(D->ev[b]));
        memcpy(D->pinned[b], (const char *)src + off, len);
        CK(cudaMemcpyAsync((char *)dst + off, D->pinned[b], len, cudaMemcpyHostToDevice, D->stream));
        CK(cudaEventRecord(D->ev[b], D->stream));
    }
    D->uploaded += n;
    return 0;
}

static dmodel::region *region_of(dmodel *D, const void *p) {
    const char *c = (const char *)p;
    auto it = std::upper_bound(D->regions.begin(), D->regions.end(), c,
                               [](const char *a, const dmodel::region &b) { return a < b.h; });
    if (!p || it == D->regions.begin()) return nullptr;
    --it;
    return c < it->h + it->n ? &*it : nullptr;
}

// Device address of host pointer p, which points into some region (a tensor of
// the checkpoint, or a buffer the model owns): uploaded whole, once, on first use.
static const void *dev_ptr(dmodel *D, const void *p, lilac_err *err, int *rc) {
    if (!p) return nullptr;
    const char *c = (const char *)p;
    auto it = std::upper_bound(D->regions.begin(), D->regions.end(), c,
                               [](const char *a, const dmodel::region &b) { return a < b.h; });
    if (it == D->regions.begin()) { *rc = lilac_fail(err, "internal: weight pointer outside the checkpoint"); return nullptr; }
    --it;
    if (c >= it->h + it->n) { *rc = lilac_fail(err, "internal: weight pointer outside its tensor"); return nullptr; }
    if (!it->d) {
        void *d = nullptr;
        cudaError_t e = cudaMalloc(&d, it->n ? it->n : 1);
        if (e != cudaSuccess) {
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            *rc = lilac_fail(err, "GPU out of memory loading tensor \"%s\" (%zu bytes; %.1f of %.1f GB free)", it->name,
                             it->n, fr / 1e9, tot / 1e9);
            return nullptr;
        }
        D->allocs.push_back(d);
        it->d = d;
        if (staged_copy(D, d, it->h, it->n, err) < 0) { *rc = -1; return nullptr; }
    }
    return (const char *)it->d + (c - it->h);
}

// pack: also keep the codes in tensor-core fragment order (cuda_packed.cuh) for
// the decode GEMV (every 4-bit matrix but the embedding, which is gathered).
static int up_mat(dmodel *D, const lilac_matrix *h, dmat *d, lilac_err *err, bool pack = true) {
    int rc = 0;
    memset(d, 0, sizeof *d);
    d->type = h->type == MAT_AFFINE ? 0 : 1;
    d->bits = h->bits;
    d->group = h->group;
    d->rows = h->rows;
    d->cols = h->cols;
    d->stride = h->expert_rows_stride;
    d->n_experts = h->n_experts;
    if (h->cols % 64 || h->cols > 4 * 4 * 256)
        return lilac_fail(err, "CUDA backend: matrix with %lld columns (needs a multiple of 64, at most 4096)",
                          (long long)h->cols);
    d->q = (const uint32_t *)dev_ptr(D, h->q, err, &rc);
    d->s = (const __nv_bfloat16 *)dev_ptr(D, h->scales, err, &rc);
    d->b = (const __nv_bfloat16 *)dev_ptr(D, h->biases, err, &rc);
    d->w = (const __nv_bfloat16 *)dev_ptr(D, h->w, err, &rc);
    if (rc < 0) return rc;
    const bool packs = pack && pk_ok(*d) && d->rows;
    for (const void *hp : {(const void *)h->q, (const void *)h->scales, (const void *)h->biases, (const void *)h->w})
        if (dmodel::region *r = region_of(D, hp)) (packs ? r->packed : r->keep) = true;
    if (!packs) return 0;
    const int64_t rb = (d->rows + 15) / 16, n = (int64_t)d->n_experts * rb * (d->cols / 64) * 32;
    uint4 *pk = nullptr;
    uint32_t *psb = nullptr;
    if (cudaMalloc((void **)&pk, sizeof(uint4) * (size_t)n) != cudaSuccess ||
        cudaMalloc((void **)&psb, sizeof(uint32_t) * (size_t)(n / 2)) != cudaSuccess) {
        cudaFree(pk);
        cudaGetLastError();
        return lilac_fail(err, "GPU out of memory for the packed copy of a %lld x %lld matrix", (long long)d->rows,
                          (long long)d->cols);
    }
    D->allocs.push_back(pk);
    D->allocs.push_back(psb);
    k_repack4<<<(unsigned)std::min<int64_t>((n + 255) / 256, 1 << 16), 256, 0, D->stream>>>(*d, rb, pk, psb);
    CKL();
    d->pk = pk;
    d->psb = psb;
    d->pk_rb = rb;
    d->q = nullptr; // the MLX-layout codes are freed after the upload (dmodel_upload)
    d->s = d->b = nullptr;
    D->packed += sizeof(uint4) * (size_t)n + sizeof(uint32_t) * (size_t)(n / 2);
    return 0;
}

static int up_vec(dmodel *D, const float *h, int64_t n, float **d, lilac_err *err) {
    *d = nullptr;
    if (!h) return 0;
    CK(cudaMalloc((void **)d, sizeof(float) * (size_t)n));
    D->allocs.push_back(*d);
    CK(cudaMemcpy(*d, h, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    return 0;
}

// Device weights are shared by every session of the same loaded model.
static std::vector<dmodel *> g_models;

static void dmodel_free(dmodel *D) {
    if (!D) return;
    for (void *p : D->allocs) cudaFree(p);
    for (int i = 0; i < 2; i++) {
        if (D->pinned[i]) cudaFreeHost(D->pinned[i]);
        if (D->ev[i]) cudaEventDestroy(D->ev[i]);
    }
    if (D->stream) cudaStreamDestroy(D->stream);
    delete D;
}

static int dmodel_upload(dmodel *D, const lilac_model *m, lilac_err *err) {
    const lilac_config *c = &m->cfg;
    D->m = m;
    for (int i = 0; i < m->st.n_tensors; i++)
        D->regions.push_back({(const char *)m->st.tensors[i].data, m->st.tensors[i].nbytes, m->st.tensors[i].name, nullptr,
                              false, false});
    for (int i = 0; i < m->n_owned; i++)
        D->regions.push_back({(const char *)m->owned[i], m->owned_bytes[i], "(quantized at load)", nullptr, false, false});
    std::sort(D->regions.begin(), D->regions.end(),
              [](const dmodel::region &a, const dmodel::region &b) { return a.h < b.h; });
    CK(cudaStreamCreateWithFlags(&D->stream, cudaStreamNonBlocking));
    for (int i = 0; i < 2; i++) {
        CK(cudaMallocHost(&D->pinned[i], STAGE));
        CK(cudaEventCreateWithFlags(&D->ev[i], cudaEventDisableTiming));
        CK(cudaEventRecord(D->ev[i], D->stream));
    }
    double t0 = lilac_now();
    std::vector<float> inv_freq((size_t)c->rotary_dim / 2 + 1); // + 1: never empty (rotary_dim 0), up_vec needs bytes
    for (int i = 0; i < c->rotary_dim / 2; i++) inv_freq[(size_t)i] = (float)pow(c->rope_theta, -2.0 * i / c->rotary_dim);
    if (up_mat(D, &m->embed, &D->embed, err, false) < 0 || up_mat(D, &m->lm_head, &D->lm_head, err) < 0 ||
        up_vec(D, m->final_norm, c->hidden, &D->final_norm, err) < 0 ||
        up_vec(D, inv_freq.data(), (int64_t)inv_freq.size(), &D->inv_freq, err) < 0)
        return -1;
    D->layers.resize((size_t)c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
        const lilac_layer *h = &m->layers[l];
        dlayer *d = &D->layers[(size_t)l];
        const int64_t H = c->hidden;
        if (up_vec(D, h->in_norm, H, &d->in_norm, err) < 0 || up_vec(D, h->post_norm, H, &d->post_norm, err) < 0) return -1;
        if (!h->is_full) {
            if (up_mat(D, &h->in_qkv, &d->in_qkv, err) < 0 || up_mat(D, &h->in_z, &d->in_z, err) < 0 ||
                up_mat(D, &h->in_b, &d->in_b, err) < 0 || up_mat(D, &h->in_a, &d->in_a, err) < 0 ||
                up_mat(D, &h->out_proj, &d->out_proj, err) < 0 ||
                up_vec(D, h->conv, cfg_conv_dim(c) * c->conv_kernel, &d->conv, err) < 0 ||
                up_vec(D, h->A_log, c->lin_v_heads, &d->A_log, err) < 0 ||
                up_vec(D, h->dt_bias, c->lin_v_heads, &d->dt_bias, err) < 0 ||
                up_vec(D, h->gdn_norm, c->lin_v_dim, &d->gdn_norm, err) < 0)
                return -1;
        } else {
            if (up_mat(D, &h->q_proj, &d->q_proj, err) < 0 || up_mat(D, &h->k_proj, &d->k_proj, err) < 0 ||
                up_mat(D, &h->v_proj, &d->v_proj, err) < 0 || up_mat(D, &h->o_proj, &d->o_proj, err) < 0 ||
                up_vec(D, h->q_norm, c->head_dim, &d->q_norm, err) < 0 ||
                up_vec(D, h->k_norm, c->head_dim, &d->k_norm, err) < 0)
                return -1;
        }
        if (up_mat(D, &h->router, &d->router, err) < 0 || up_mat(D, &h->exp_gate, &d->exp_gate, err) < 0 ||
            up_mat(D, &h->exp_up, &d->exp_up, err) < 0 || up_mat(D, &h->exp_down, &d->exp_down, err) < 0 ||
            up_mat(D, &h->sh_gate, &d->sh_gate, err) < 0 || up_mat(D, &h->sh_up, &d->sh_up, err) < 0 ||
            up_mat(D, &h->sh_down, &d->sh_down, err) < 0 || up_mat(D, &h->sh_expert_gate, &d->sh_expert_gate, err) < 0)
            return -1;
    }
    CK(cudaStreamSynchronize(D->stream));
    // Tensors only packed matrices read are needed no more in the MLX layout.
    size_t freed = 0;
    for (dmodel::region &r : D->regions)
        if (r.d && r.packed && !r.keep) {
            D->allocs.erase(std::remove(D->allocs.begin(), D->allocs.end(), r.d), D->allocs.end());
            CK(cudaFree(r.d));
            r.d = nullptr;
            freed += r.n;
        }
    double t1 = lilac_now();
    if (lilac_diag()->verbose || D->uploaded > (1u << 30))
        fprintf(stderr, "lilac: uploaded %.2f GB of weights to the GPU in %.2f s (%.2f GB/s); %.2f GB resident after packing\n",
                D->uploaded / 1e9, t1 - t0, D->uploaded / 1e9 / (t1 - t0), (D->uploaded + D->packed - freed) / 1e9);
    return 0;
}

// ---------------------------------------------------------------- session

// LILAC_ABLATE: which of a decode step's kernels to leave out, to time what
// each contributes inside the step (the ablation table of docs/perf.md): the
// GDN step kernel, the attention (k_attn_dec_mma + combine, or the combine alone),
// the MoE (router, experts, down and combine).
static const unsigned ABL_GDN = 1, ABL_ATTN = 2, ABL_MOE = 4;
// and single GEMVs: comb (k_attn_combine alone), inproj (GDN in_proj and attention
// q/k/v), outproj (the mixers' output projections), router (router + shared gate/up)
static const unsigned ABL_COMB = 8, ABL_INPROJ = 16, ABL_OUTPROJ = 32, ABL_ROUTER = 64;

struct lilac_session {
    const lilac_model *m;
    dmodel *D;
    int64_t pos, max_seq;
    cudaStream_t st;
    // state
    std::vector<float *> conv_state, ssm;
    // K (normed, roped) and V cache per attention layer, [max_seq][n_kv_heads][head_dim], in
    // bf16 as the model keeps it (half the bytes decode attention reads, half the memory)
    std::vector<__nv_bfloat16 *> kc, vc;
    // scratch (CHUNK rows)
    float *x, *xn, *r, *qkv, *conv_out, *z, *bb, *ba, *beta, *decay, *o;
    float *qg, *kx, *vx, *att, *part;
    float *rlog, *topw, *gu, *ye, *shgu, *shy, *sg;
    int *topi, *counts, *offs, *cursor, *sorted;
    float *logits;                      // one row: every one-token pass writes here
    float *logits_all; int64_t logits_rows; // LOGITS_ALL prefill: a chunk's rows
    // a prefill GEMM's input split into bf16 hi/lo parts + f32 group sums (cuda_gemm.cuh)
    __nv_bfloat16 *xh, *xl;
    float *xsum;
    __nv_bfloat16 *xsw;       // the group sums as k_gemm_wg reads them (k_split_x, wg_xsw_win; gemm_wg only)
    int64_t xsw_n;            // its size in elements (split_x checks each split fits)
    int8_t *xq;        // k_gemm_q<4>'s input as int8 pieces (G4_NP planes of xq_plane bytes), and sigma per group
                       // (both null with gemm_wg: k_split_x then writes no pieces)
    float *xsig;
    int64_t xq_plane; // bytes from one piece plane to the next (C x the widest input)
    bool xn_split; // xh/xl/xsum hold the split of s->xn's T rows (set by whatever writes xn or the split)
    int2 *tiles; // expert tile map of a prefill chunk: (expert, first token), *n_tiles entries
    int *n_tiles;
    int *tail_done; // arrival counters of the GEMV tails (gemv_tail), one per layer
    // decode
    int *d_ids, *d_pos, *d_step;
    unsigned long long *amax_best; // k_argmax's running best key and arrival count (zero between launches)
    unsigned *amax_arrived;
    bool pdl;        // launch with programmatic dependent launch (every pass; off on st2, moe_shared_side)
    int n_sm;        // multiprocessors, to size GEMV grids
    int gemv_blocks; // the decode GEMV grid to aim for (gemv_launch)
    int moe_nsg;       // k_moe_split's shared units' groups (0: it does not fit; the gate/up GEMV and k_moe_down instead)
    unsigned long long *moe_acc; // k_moe_split's fixed-point sums (H, zero between launches)
    unsigned *moe_count;         // and its arrival count
    unsigned long long *moe_prof; // LILAC_MOE_PROF=l: layer l's k_moe_split marks in decode steps, printed at the end
    int moe_prof_layer, moe_prof_grid, moe_prof_nA;
    int attn_qp;       // prefill attention's bf16 pieces of Q and P: 2, or 1 with --attn-precision bf16 (cuda_attn.cuh)
    float *lgd, *gdn_scratch; // the chunked GDN prefill (cuda_gdn_chunk.cuh): log decays, scratch; null when off
    bool gemm_wg;             // 4-bit prefill GEMMs on wgmma (k_gemm_wg; sm_90a only; elsewhere k_gemm_q<4> on mma.sync)
    bool gemm_pair;           // with gemm_wg: the routed gate/up GEMM writes the down projection's split input itself
                              // (a swiglu job, cuda_g4.cuh) into dh/dl/dsw
    __nv_bfloat16 *dh, *dl, *dsw;
    // with gemm_pair, a prefill's shared expert runs on st2 beside the router and the routed experts
    // (moe_shared_side): its gate/up a swiglu job into sh_dh/sh_dl/sh_dsw, then its down; forked from st at
    // ev_fork, joined before the combine at ev_join.
    cudaStream_t st2;
    cudaEvent_t ev_fork, ev_join;
    __nv_bfloat16 *sh_dh, *sh_dl, *sh_dsw;
    bool attn_wg;             // prefill attention on wgmma (k_attn_wg; sm_90a, hd 256; elsewhere k_attn_prefill on mma.sync)
    unsigned ablate; // LILAC_ABLATE (timing only: the output is wrong): decode kernels left out, ABL_* bits
    int *h_pinned;   // [0]: pos, [1..CHUNK]: ids
    int *ring;       // host-mapped
    int *ring_dev;
    cudaGraphExec_t graph;
    cudaEvent_t step_ev[2];
    std::vector<void *> allocs;
    cuda_sampler *smp;       // sampler state on the device (cuda_sample.cu), from sample_begin
    cudaGraphExec_t sgraph;  // a decode step ending in the sampler
    // route_record: the host table [n_layers][rec_n][top_k] the multi-token passes of a forward() call copy
    // their top-k into (null: off), its capacity in tokens, and the call's tokens and the chunk's first
    int32_t *rec;
    int rec_cap, rec_n, rec_t0;
};

// Optional per-phase timing (LILAC_PROFILE=1): events around each phase of
// run_layers outside graph capture, summed and printed per forward call.
enum { PH_EMBED, PH_GDN_PROJ, PH_GDN_CONV, PH_GDN_RECUR, PH_GDN_CORE, PH_ATTN_PROJ, PH_ATTN_CORE, PH_MOE_ROUTE,
       PH_MOE_EXPERTS, PH_MOE_SHARED, PH_HEAD, PH_N };
// gdn-norm|step: the prefill's gated norm, or the whole one-token GDN step
static const char *ph_name[PH_N] = {"embed+norms", "gdn-proj", "gdn-conv+prep", "gdn-recur", "gdn-norm|step", "attn-proj",
                                    "attn-core", "moe-route", "moe-experts", "moe-shared+combine", "head"};
struct profiler {
    bool on;
    std::vector<cudaEvent_t> ev;
    std::vector<int> phase;
};
static profiler prof;
static void prof_mark(lilac_session *s, int phase) {
    if (!prof.on) return;
    cudaStreamCaptureStatus cs;
    if (cudaStreamIsCapturing(s->st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return;
    cudaEvent_t e;
    if (cudaEventCreate(&e) != cudaSuccess) return;
    cudaEventRecord(e, s->st);
    prof.ev.push_back(e);
    prof.phase.push_back(phase);
}
static void prof_report(lilac_session *s, int T) {
    if (!prof.on || prof.ev.size() < 2) return;
    cudaStreamSynchronize(s->st);
    double tot[PH_N] = {0}, all = 0;
    for (size_t i = 1; i < prof.ev.size(); i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, prof.ev[i - 1], prof.ev[i]);
        tot[prof.phase[i]] += ms;
        all += ms;
    }
    fprintf(stderr, "profile T=%d: %.3f ms:", T, all);
    for (int p = 0; p < PH_N; p++) fprintf(stderr, " %s %.3f", ph_name[p], tot[p]);
    fprintf(stderr, "\n");
    for (cudaEvent_t e : prof.ev) cudaEventDestroy(e);
    prof.ev.clear();
    prof.phase.clear();
}

template <typename T>
static int dalloc(lilac_session *s, T **p, size_t n, lilac_err *err) {
    CK(cudaMalloc((void **)p, sizeof(T) * (n ? n : 1)));
    s->allocs.push_back(*p);
    CK(cudaMemset(*p, 0, sizeof(T) * (n ? n : 1)));
    return 0;
}

static void cuda_session_free(lilac_session *s) {
    if (!s) return;
    if (s->moe_prof) { // LILAC_MOE_PROF: the last decode step's marks of that layer
        std::vector<unsigned long long> t((size_t)MOE_SPLIT_MARKS * (size_t)s->moe_prof_grid);
        if (cudaMemcpy(t.data(), s->moe_prof, t.size() * sizeof(t[0]), cudaMemcpyDeviceToHost) == cudaSuccess && t[0]) {
            fprintf(stderr, "k_moe_split, layer %d, the session's last one-token pass (us):\n", s->moe_prof_layer);
            moe_split_timeline(stderr, t.data(), s->moe_prof_grid, s->moe_prof_nA);
        }
    }
    if (s->graph) cudaGraphExecDestroy(s->graph);
    if (s->sgraph) cudaGraphExecDestroy(s->sgraph);
    cuda_sampler_free(s->smp);
    for (void *p : s->allocs) cudaFree(p);
    if (s->h_pinned) cudaFreeHost(s->h_pinned);
    if (s->ring) cudaFreeHost(s->ring);
    for (int i = 0; i < 2; i++)
        if (s->step_ev[i]) cudaEventDestroy(s->step_ev[i]);
    if (s->st) cudaStreamDestroy(s->st);
    if (s->st2) cudaStreamDestroy(s->st2);
    if (s->ev_fork) cudaEventDestroy(s->ev_fork);
    if (s->ev_join) cudaEventDestroy(s->ev_join);
    if (s->D && --s->D->refs <= 0) {
        g_models.erase(std::remove(g_models.begin(), g_models.end(), s->D), g_models.end());
        dmodel_free(s->D);
    }
    delete s;
}

static lilac_session *cuda_session_new(const lilac_model *m, int64_t max_seq, int threads, lilac_err *err) {
    (void)threads;
    const lilac_config *c = &m->cfg;
    if (!lilac_cuda_available(err)) return nullptr;
    if (max_seq <= 0 || max_seq > c->max_pos) max_seq = c->max_pos;
    if (c->lin_k_dim != 32 && c->lin_k_dim != 64 && c->lin_k_dim != 128 && c->lin_k_dim != 256) {
        lilac_fail(err, "CUDA backend: linear_key_head_dim %d unsupported (32, 64, 128, 256)", c->lin_k_dim);
        return nullptr;
    }
    if (c->lin_v_dim % 32 || (c->head_dim != 64 && c->head_dim != 128 && c->head_dim != 256) || c->conv_kernel < 2 ||
        c->conv_kernel > 8) { // k_conv is instantiated for windows of 2..8
        lilac_fail(err, "CUDA backend: unsupported geometry (linear_value_head_dim %% 32, head_dim 64/128/256, conv 2..8)");
        return nullptr;
    }
    lilac_session *s = new lilac_session();
    prof.on = lilac_diag()->profile;
    s->m = m;
    s->max_seq = max_seq;
    for (dmodel *D : g_models)
        if (D->m == m) s->D = D;
    if (s->D) {
        s->D->refs++;
    } else {
        s->D = new dmodel(); // value-initialised: every pointer and handle starts null
        s->D->refs = 1;
        g_models.push_back(s->D);
        if (dmodel_upload(s->D, m, err) < 0) { cuda_session_free(s); return nullptr; }
    }
    const int64_t H = c->hidden, C = CHUNK, CD = cfg_conv_dim(c), VD = cfg_lin_val_dim(c), K = c->top_k;
    const int64_t kvw = (int64_t)c->n_kv_heads * c->head_dim;
    bool ok = cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking) == cudaSuccess &&
              cudaDeviceGetAttribute(&s->n_sm, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess;
    s->gemv_blocks = 2 * s->n_sm; // two blocks per SM: 369 tok/s at 4k against 323 for one (docs/perf.md)
    s->attn_qp = 2; // f32-faithful scores and weights; 1 (set_attn_bf16) is FlashAttention's bf16 (docs/perf.md)
    // Hopper's warpgroup MMA (cuda_wgmma.cuh) where the sm_90a image runs (k_wg_probe): the 4-bit
    // prefill GEMMs (cuda_gemm_wg.cuh) and the prefill attention at hd 256 (cuda_attn_wg.cuh). Elsewhere
    // the portable mma.sync kernels: k_gemm_q<4> with three int8 pieces, and k_attn_prefill.
    bool wg_on = false;
    if (ok) {
        int *d_on = nullptr, on = 0;
        if (cudaMalloc((void **)&d_on, sizeof(int)) == cudaSuccess) {
            k_wg_probe<<<1, 1, 0, s->st>>>(d_on);
            wg_on = cudaGetLastError() == cudaSuccess &&
                    cudaMemcpyAsync(&on, d_on, sizeof(int), cudaMemcpyDeviceToHost, s->st) == cudaSuccess &&
                    cudaStreamSynchronize(s->st) == cudaSuccess && on == 1;
            cudaFree(d_on);
        }
        cudaGetLastError();
    }
    s->gemm_wg = wg_on;
    s->gemm_pair = s->gemm_wg && c->moe_inter % 64 == 0;
    s->attn_wg = wg_on;
    const bool gdn_chunk = gdn_chunk_ok(c->lin_k_dim, c->lin_v_dim, c->lin_k_heads, c->lin_v_heads);
    if (const char *e = lilac_diag()->ablate) {
        s->ablate = (strstr(e, "gdn") ? ABL_GDN : 0u) | (strstr(e, "attn") ? ABL_ATTN : 0u) | (strstr(e, "moe") ? ABL_MOE : 0u) |
                    (strstr(e, "comb") ? ABL_COMB : 0u) | (strstr(e, "inproj") ? ABL_INPROJ : 0u) |
                    (strstr(e, "outproj") ? ABL_OUTPROJ : 0u) | (strstr(e, "router") ? ABL_ROUTER : 0u);
        if (s->ablate) fprintf(stderr, "lilac: LILAC_ABLATE=%s: decode leaves kernels out; its tokens are wrong (timing only)\n", e);
    }
    s->conv_state.assign((size_t)c->n_layers, nullptr);
    s->ssm.assign((size_t)c->n_layers, nullptr);
    s->kc.assign((size_t)c->n_layers, nullptr);
    s->vc.assign((size_t)c->n_layers, nullptr);
    for (int l = 0; ok && l < c->n_layers; l++) {
        if (c->is_full[l])
            ok = dalloc(s, &s->kc[(size_t)l], (size_t)(max_seq * kvw), err) == 0 &&
                 dalloc(s, &s->vc[(size_t)l], (size_t)(max_seq * kvw), err) == 0;
        else
            ok = dalloc(s, &s->conv_state[(size_t)l], (size_t)(2 * (c->conv_kernel - 1) * CD), err) == 0 &&
                 dalloc(s, &s->ssm[(size_t)l], (size_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim, err) == 0;
    }
    ok = ok && dalloc(s, &s->x, C * H, err) == 0 && dalloc(s, &s->xn, C * H, err) == 0 &&
         dalloc(s, &s->r, C * H, err) == 0 && dalloc(s, &s->qkv, C * CD, err) == 0 &&
         dalloc(s, &s->conv_out, C * CD, err) == 0 && dalloc(s, &s->z, C * VD, err) == 0 &&
         dalloc(s, &s->bb, C * c->lin_v_heads, err) == 0 && dalloc(s, &s->ba, C * c->lin_v_heads, err) == 0 &&
         dalloc(s, &s->beta, C * c->lin_v_heads, err) == 0 && dalloc(s, &s->decay, C * c->lin_v_heads, err) == 0 &&
         (!gdn_chunk || (dalloc(s, &s->lgd, C * c->lin_v_heads, err) == 0 &&
                         dalloc(s, &s->gdn_scratch, gdn_chunk_scratch((int)C, c->lin_v_heads), err) == 0)) &&
         dalloc(s, &s->o, C * VD, err) == 0 && dalloc(s, &s->qg, C * 2 * c->n_heads * c->head_dim, err) == 0 &&
         dalloc(s, &s->kx, C * kvw, err) == 0 && dalloc(s, &s->vx, C * kvw, err) == 0 &&
         dalloc(s, &s->att, C * c->n_heads * c->head_dim, err) == 0 &&
         dalloc(s, &s->part, (size_t)c->n_heads * std::max(ATT_SPLITS, ADEC_S) * (c->head_dim + 2), err) == 0 &&
         dalloc(s, &s->rlog, C * c->n_experts, err) == 0 && dalloc(s, &s->topw, C * K, err) == 0 &&
         dalloc(s, &s->topi, C * K, err) == 0 && dalloc(s, &s->gu, C * K * 2 * c->moe_inter, err) == 0 &&
         dalloc(s, &s->ye, C * K * H, err) == 0 && dalloc(s, &s->shgu, C * 2 * c->shared_inter, err) == 0 &&
         dalloc(s, &s->shy, C * H, err) == 0 && dalloc(s, &s->sg, C, err) == 0 &&
         dalloc(s, &s->counts, (size_t)c->n_experts, err) == 0 && dalloc(s, &s->offs, (size_t)c->n_experts + 1, err) == 0 &&
         dalloc(s, &s->cursor, (size_t)c->n_experts, err) == 0 && dalloc(s, &s->sorted, C * K, err) == 0 &&
         dalloc(s, &s->logits, (size_t)c->vocab, err) == 0 && dalloc(s, &s->d_ids, C, err) == 0 &&
         dalloc(s, &s->d_pos, 1, err) == 0 && dalloc(s, &s->d_step, 1, err) == 0 &&
         dalloc(s, &s->amax_best, 1, err) == 0 && dalloc(s, &s->amax_arrived, 1, err) == 0;
    s->logits_rows = 0;
    {
        // largest prefill GEMM input: hidden, value or attention width per token, or the routed experts' rows
        int64_t w = std::max(std::max(H, VD), std::max((int64_t)c->n_heads * c->head_dim, (int64_t)c->shared_inter));
        w = std::max(w, K * c->moe_inter);
        s->xq_plane = C * w;
        // k_gemm_wg's group sums take whole 16-group windows per row: the routed experts' down
        // projection (C*K rows of moe_inter) needs more than the widest row does.
        s->xsw_n = std::max(wg_xsw_win(C, (int)(w / 64), 0), wg_xsw_win(C * K, (int)(c->moe_inter / 64), 0));
        ok = ok && dalloc(s, &s->xh, (size_t)(C * w), err) == 0 && dalloc(s, &s->xl, (size_t)(C * w), err) == 0 &&
             dalloc(s, &s->xsum, (size_t)(C * w / 64), err) == 0 &&
             (!s->gemm_wg || dalloc(s, &s->xsw, (size_t)s->xsw_n, err) == 0) &&
             (!s->gemm_pair || (dalloc(s, &s->dh, (size_t)(C * K * c->moe_inter), err) == 0 &&
                                dalloc(s, &s->dl, (size_t)(C * K * c->moe_inter), err) == 0 &&
                                dalloc(s, &s->dsw, (size_t)wg_xsw_win(C * K, (int)(c->moe_inter / 64), 0), err) == 0)) &&
             (!s->gemm_pair || c->shared_inter % 64 ||
              (dalloc(s, &s->sh_dh, (size_t)(C * c->shared_inter), err) == 0 &&
               dalloc(s, &s->sh_dl, (size_t)(C * c->shared_inter), err) == 0 &&
               dalloc(s, &s->sh_dsw, (size_t)wg_xsw_win(C, (int)(c->shared_inter / 64), 0), err) == 0 &&
               cudaStreamCreateWithFlags(&s->st2, cudaStreamNonBlocking) == cudaSuccess &&
               cudaEventCreateWithFlags(&s->ev_fork, cudaEventDisableTiming) == cudaSuccess &&
               cudaEventCreateWithFlags(&s->ev_join, cudaEventDisableTiming) == cudaSuccess)) &&
             (s->gemm_wg || (dalloc(s, &s->xq, (size_t)(G4_NP * C * w), err) == 0 &&
                             dalloc(s, &s->xsig, (size_t)(C * w / 64), err) == 0)) &&
             dalloc(s, &s->tiles, (size_t)(C * K / G4_BN + c->n_experts + 1), err) == 0 && dalloc(s, &s->n_tiles, 1, err) == 0 &&
             dalloc(s, &s->tail_done, (size_t)c->n_layers, err) == 0 &&
             cudaFuncSetAttribute(k_gemm_q<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g4_smem<4>()) == cudaSuccess &&
             cudaFuncSetAttribute(k_gemm_q<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g4_smem<8>()) == cudaSuccess &&
             (!s->gemm_wg ||
              cudaFuncSetAttribute(k_gemm_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wg_smem()) == cudaSuccess) &&
             cudaFuncSetAttribute(k_attn_dec_mma<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)attn_dec_mma_smem(128)) == cudaSuccess &&
             cudaFuncSetAttribute(k_attn_dec_mma<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)attn_dec_mma_smem(256)) == cudaSuccess;
    }
    ok = ok && cudaMallocHost((void **)&s->h_pinned, sizeof(int) * (C + 1)) == cudaSuccess &&
         cudaHostAlloc((void **)&s->ring, sizeof(int) * RING, cudaHostAllocMapped) == cudaSuccess &&
         cudaHostGetDevicePointer((void **)&s->ring_dev, s->ring, 0) == cudaSuccess &&
         cudaEventCreateWithFlags(&s->step_ev[0], cudaEventDisableTiming) == cudaSuccess &&
         cudaEventCreateWithFlags(&s->step_ev[1], cudaEventDisableTiming) == cudaSuccess;
    if (ok) { // k_moe_split, where the layers' shapes take it
        const dlayer &d0 = s->D->layers[0];
        const int mg = moe_down_mg(d0.exp_down, d0.sh_down, (int)K);
        const int nsg = mg && moe_split_ok(d0.exp_gate, d0.exp_up, H, c->moe_inter, (int)K, c->n_experts)
                            ? moe_split_nsg(d0.sh_down, H, c->moe_inter, (int)K, s->n_sm)
                            : 0;
        if (nsg) {
            ok = dalloc(s, &s->moe_acc, (size_t)H, err) == 0 && dalloc(s, &s->moe_count, 1, err) == 0 &&
                 cudaFuncSetAttribute(nsg == 2 ? k_moe_split<2> : k_moe_split<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)moe_split_smem(H, nsg)) == cudaSuccess;
            s->moe_nsg = nsg;
            s->moe_prof_layer = lilac_diag()->moe_prof_layer;
            if (s->moe_prof_layer >= 0) { // LILAC_MOE_PROF
                s->moe_prof_nA = (int)moe_split_routed((int)K, c->moe_inter);
                s->moe_prof_grid = (int)moe_split_grid((int)K, c->moe_inter, d0.sh_down.cols, nsg);
                ok = ok && dalloc(s, &s->moe_prof, (size_t)MOE_SPLIT_MARKS * (size_t)s->moe_prof_grid, err) == 0;
            }
        }
    }
    // dalloc's zeroing runs on the default stream, which s->st (non-blocking) does not wait for:
    // finish it before any kernel that needs zeros (moe_acc, moe_count) can run
    if (!ok || cudaStreamSynchronize(0) != cudaSuccess) {
        if (!err || !err->msg[0]) lilac_fail(err, "CUDA backend: could not allocate the session (%s)", cudaGetErrorString(cudaGetLastError()));
        cuda_session_free(s);
        return nullptr;
    }
    return s;
}

static void cuda_session_reset(lilac_session *s) {
    const lilac_config *c = &s->m->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        if (s->conv_state[(size_t)l])
            cudaMemsetAsync(s->conv_state[(size_t)l], 0, sizeof(float) * (size_t)(2 * (c->conv_kernel - 1) * cfg_conv_dim(c)), s->st);
        if (s->ssm[(size_t)l])
            cudaMemsetAsync(s->ssm[(size_t)l], 0, sizeof(float) * (size_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim, s->st);
    }
    cudaStreamSynchronize(s->st);
    s->pos = 0;
}

static int64_t cuda_session_pos(const lilac_session *s) { return s->pos; }

// ---------------------------------------------------------------- the forward pass

// Every kernel is launched with programmatic stream serialization (Hopper PDL):
// it may start while its predecessor drains, issue what does not depend on it
// (weight loads), and wait in pdl_wait() for the rest. Graph capture keeps it.
template <typename... P, typename... A>
static cudaError_t pdl_launch(lilac_session *s, void (*k)(P...), dim3 g, dim3 b, size_t sm, A &&...a) {
    return launch_ex(s->st, s->pdl, k, g, b, sm, std::forward<A>(a)...);
}

// One GEMV launch for a job (k_gemv, gemv_launch in cuda_gemv.cuh); `slots`
// > 0: expert mode over topi.
static int gemv(lilac_session *s, gemv_job &j, int xm, const float *x, int64_t ldx, int64_t xoff, const int *topi,
                int x_div, int slots, lilac_err *err) {
    CK(gemv_launch(s->st, s->pdl, j, xm, x, ldx, xoff, topi, x_div, slots, s->gemv_blocks));
    return 0;
}

static gemv_job job_of(int n, const dmat *W, float *const *y, const int64_t *ldy) {
    gemv_job j;
    memset(&j, 0, sizeof j);
    j.n = n;
    for (int i = 0; i < n; i++) { j.W[i] = W[i]; j.y[i] = y[i]; j.ldy[i] = ldy[i]; }
    return j;
}

// The split of `rows` input rows for the prefill GEMMs (k_split_x): bf16 hi/lo and group sums (k_gemm_wg
// and the 8-bit path), and the int8 pieces and sigma per group for k_gemm_q<4> (s->xq: null with gemm_wg).
static int split_x(lilac_session *s, const float *x, int64_t ldx, int64_t xoff, int xm, int64_t rows, int64_t cols,
                   lilac_err *err) {
    s->xn_split = false; // xh/xl now hold this input (input_mats marks when it is s->xn's rows)
    if (rows * cols > s->xq_plane || (s->xsw && wg_xsw_win(rows, (int)(cols / 64), 0) > s->xsw_n)) {
        return lilac_fail(err, "internal: prefill split of %lld x %lld exceeds its buffers", (long long)rows,
                          (long long)cols);
    }
    if (xm == XM_SWIGLU)
        pdl_launch(s, k_split_x<1>, (unsigned)rows, 256, 0, x, ldx, xoff, cols, s->xh, s->xl, s->xsum, s->xq, s->xsig, s->xq_plane,
                   s->xsw);
    else pdl_launch(s, k_split_x<0>, (unsigned)rows, 256, 0, x, ldx, xoff, cols, s->xh, s->xl, s->xsum, s->xq, s->xsig, s->xq_plane,
                    s->xsw);
    CKL();
    return 0;
}

// Where a prefill norm that writes `rows` x `cols` of a GEMM's input puts the input's split (g4_split:
// none, xh null, where k_split_x must make it: with k_gemm_q<4>'s int8 pieces, which the norms do not
// write, or where it would not fit). The caller marks what the split then holds (xn_split).
static g4_split norm_split(const lilac_session *s, int64_t rows, int64_t cols) {
    g4_split sp = {nullptr, nullptr, nullptr, nullptr};
    if (s->xq || cols % 64 || rows * cols > s->xq_plane ||
        (s->xsw && wg_xsw_win(rows, (int)(cols / 64), 0) > s->xsw_n))
        return sp;
    sp.xh = s->xh, sp.xl = s->xl, sp.xsw = s->xsw, sp.xs = s->xsum;
    return sp;
}

// y = W x for T tokens: GEMV for one token, tensor-core GEMM otherwise.
// accum (one token only): y += W x.
// The quantized tensor-core GEMM (cuda_gemm.cuh) for n matrices of the same bit
// width reading the split input now in xh/xl. Grouped (max_tiles > 0): over the
// expert tile map, at most max_tiles entries.
// in: the split input (xh, xl, xsw) when not s->xh/xl/xsw. pair (n = 2, gemm_wg): W[0] and W[1] a gate and
// an up matrix, whose SwiGLU goes split into pair[0..2] (oh, ol, osw) instead of y (a swiglu job, cuda_g4.cuh).
static int gemm_q(lilac_session *s, int n, const dmat *W, float *const *y, const int64_t *ldy, int T, const int *offs,
                  int max_tiles, int x_div, lilac_err *err, __nv_bfloat16 *const *in = nullptr, __nv_bfloat16 *const *pair = nullptr) {
    g4_job j;
    memset(&j, 0, sizeof j);
    j.n = n;
    j.xq = s->xq;
    j.xsig = s->xsig;
    j.xq_plane = s->xq_plane;
    for (int i = 0; i < n; i++) {
        j.W[i] = W[i];
        j.y[i] = y[i];
        j.ldy[i] = ldy[i];
        j.start[i + 1] = j.start[i] + (int)((W[i].rows + G4_BM - 1) / G4_BM);
    }
    if (pair) {
        if (n != 2 || !s->gemm_wg || W[0].bits != 4 || W[0].rows != W[1].rows || W[0].rows % 64)
            return lilac_fail(err, "internal: a SwiGLU pair GEMM of %lld and %lld rows", (long long)W[0].rows, (long long)W[1].rows);
        j.swiglu = 1;
        j.start[1] = j.start[2] = (int)(W[0].rows / 64);
        j.oh = pair[0], j.ol = pair[1], j.osw = pair[2];
    }
    const dim3 g((unsigned)j.start[n], max_tiles > 0 ? (unsigned)max_tiles : (unsigned)((T + G4_BN - 1) / G4_BN));
    const int2 *tiles = max_tiles > 0 ? s->tiles : nullptr;
    const int *nt = max_tiles > 0 ? s->n_tiles : nullptr;
    const __nv_bfloat16 *xh = in ? in[0] : (const __nv_bfloat16 *)s->xh, *xl = in ? in[1] : (const __nv_bfloat16 *)s->xl;
    const __nv_bfloat16 *xsw = in ? in[2] : (const __nv_bfloat16 *)s->xsw;
    if (in && (!s->gemm_wg || W[0].bits != 4)) return lilac_fail(err, "internal: a GEMM input other than xh/xl off k_gemm_wg");
    if (W[0].bits == 8)
        pdl_launch(s, k_gemm_q<8>, g, 256, g4_smem<8>(), j, xh, xl, (const float *)s->xsum, T, offs, (const int *)s->sorted,
                   tiles, nt, x_div);
    else if (s->gemm_wg)
        pdl_launch(s, k_gemm_wg, g, 256, wg_smem(), j, xh, xl, xsw, T, offs, (const int *)s->sorted, tiles, nt, x_div);
    else
        pdl_launch(s, k_gemm_q<4>, g, 256, g4_smem<4>(), j, xh, xl, (const float *)s->xsum, T, offs, (const int *)s->sorted,
                   tiles, nt, x_div);
    CKL();
    return 0;
}

// split_ready: xh/xl already hold the split of x (several matrices read one input).
static int matmul(lilac_session *s, const dmat &W, const float *x, int64_t ldx, float *y, int64_t ldy, int T,
                  int xm, int64_t xoff, lilac_err *err, int accum = 0, bool split_ready = false) {
    if (T == 1) {
        gemv_job j = job_of(1, &W, &y, &ldy);
        j.accum[0] = accum;
        return gemv(s, j, xm, x, ldx, xoff, nullptr, 1, 0, err);
    }
    if (g4_ok(W)) {
        if (!split_ready && split_x(s, x, ldx, xoff, xm, T, W.cols, err) < 0) return -1;
        return gemm_q(s, 1, &W, &y, &ldy, T, nullptr, 0, 1, err);
    }
    dim3 g((unsigned)((W.rows + TC_BM - 1) / TC_BM), (unsigned)((T + TC_BN - 1) / TC_BN), 1);
    if (xm == XM_SWIGLU) pdl_launch(s, k_gemm_tc<XM_SWIGLU>, g, 128, 0, W, x, ldx, xoff, y, ldy, T, nullptr, nullptr, 1);
    else pdl_launch(s, k_gemm_tc<XM_PLAIN>, g, 128, 0, W, x, ldx, xoff, y, ldy, T, nullptr, nullptr, 1);
    CKL();
    return 0;
}

// The matrices that read a layer's normalised input. One token: a single GEMV
// launch that normalises the residual stream s->x itself (gain; xn_out receives
// the normalised row when later kernels need it). Several tokens: s->xn holds
// the normalised rows already, one GEMM per matrix.
static int input_mats(lilac_session *s, int n, const dmat *W, float *const *y, const int64_t *ldy, int T,
                      const float *gain, float *xn_out, lilac_err *err) {
    const int64_t H = s->m->cfg.hidden;
    if (T > 1) {
        // one split of xn (none when the norm that wrote xn split it); one GEMM launch per bit width for the
        // quantized matrices
        bool split = s->xn_split;
        for (int bits = 4; bits <= 8; bits += 4) {
            dmat Wq[G4_MATS];
            float *yq[G4_MATS];
            int64_t lq[G4_MATS];
            int nq = 0;
            for (int i = 0; i < n; i++)
                if (g4_ok(W[i]) && W[i].bits == bits) { Wq[nq] = W[i]; yq[nq] = y[i]; lq[nq++] = ldy[i]; }
            if (!nq) continue;
            if (!split && split_x(s, s->xn, H, 0, XM_PLAIN, T, H, err) < 0) return -1;
            split = true;
            s->xn_split = true;
            if (gemm_q(s, nq, Wq, yq, lq, T, nullptr, 0, 1, err) < 0) return -1;
        }
        for (int i = 0; i < n; i++)
            if (!g4_ok(W[i]) && matmul(s, W[i], s->xn, H, y[i], ldy[i], T, XM_PLAIN, 0, err) < 0) return -1;
        return 0;
    }
    gemv_job j = job_of(n, W, y, ldy);
    j.gain = gain;
    j.xn_out = xn_out;
    j.eps = s->m->cfg.rms_eps;
    return gemv(s, j, XM_NORM, s->x, H, 0, nullptr, 1, 0, err);
}

// Mixer output: one token adds it to the residual stream in the GEMV itself;
// several tokens write s->r (added by the following k_add_rmsnorm). split_ready: xh/xl hold x's split.
static int mixer_out(lilac_session *s, const dmat &W, const float *x, int64_t ldx, int T, lilac_err *err,
                     bool split_ready = false) {
    const int64_t H = s->m->cfg.hidden;
    if (T == 1 && (s->ablate & ABL_OUTPROJ)) return 0; // LILAC_ABLATE
    return T == 1 ? matmul(s, W, x, ldx, s->x, H, 1, XM_PLAIN, 0, err, 1)
                  : matmul(s, W, x, ldx, s->r, H, T, XM_PLAIN, 0, err, 0, split_ready);
}

// pp.qk_heads > 0: k_gdn_prep's work too (gdn_prep_args)
static int conv_launch(lilac_session *s, const float *w, float *state, int T, const gdn_prep_args &pp, lilac_err *err) {
    const lilac_config *c = &s->m->cfg;
    const int64_t CD = cfg_conv_dim(c);
    const dim3 g((unsigned)((CD + 127) / 128), (unsigned)((T + CONV_TS - 1) / CONV_TS));
    switch (c->conv_kernel) {
    case 2: pdl_launch(s, k_conv<2>, g, 128, 0, s->qkv, state, w, s->conv_out, T, CD, s->d_pos, pp); break;
    case 3: pdl_launch(s, k_conv<3>, g, 128, 0, s->qkv, state, w, s->conv_out, T, CD, s->d_pos, pp); break;
    case 4: pdl_launch(s, k_conv<4>, g, 128, 0, s->qkv, state, w, s->conv_out, T, CD, s->d_pos, pp); break;
    case 5: pdl_launch(s, k_conv<5>, g, 128, 0, s->qkv, state, w, s->conv_out, T, CD, s->d_pos, pp); break;
    case 6: pdl_launch(s, k_conv<6>, g, 128, 0, s->qkv, state, w, s->conv_out, T, CD, s->d_pos, pp); break;
    case 7: pdl_launch(s, k_conv<7>, g, 128, 0, s->qkv, state, w, s->conv_out, T, CD, s->d_pos, pp); break;
    default: pdl_launch(s, k_conv<8>, g, 128, 0, s->qkv, state, w, s->conv_out, T, CD, s->d_pos, pp); break;
    }
    CKL();
    return 0;
}

static int gdn_layer(lilac_session *s, const dlayer &d, int l, int T, lilac_err *err) {
    const lilac_config *c = &s->m->cfg;
    const int64_t CD = cfg_conv_dim(c), KD = cfg_lin_key_dim(c), VD = cfg_lin_val_dim(c);
    const int Hv = c->lin_v_heads;
    g4_split o_split = {nullptr, nullptr, nullptr, nullptr}; // (k_gated_norm's, below)
    const dmat W[4] = {d.in_qkv, d.in_z, d.in_b, d.in_a};
    float *const Y[4] = {s->qkv, s->z, s->bb, s->ba};
    const int64_t LD[4] = {CD, VD, Hv, Hv};
    if (!(T == 1 && (s->ablate & ABL_INPROJ)) && input_mats(s, 4, W, Y, LD, T, d.in_norm, nullptr, err) < 0) return -1;
    prof_mark(s, PH_GDN_PROJ);
    if (T == 1 && (s->ablate & ABL_GDN)) {
        // left out (LILAC_ABLATE)
    } else if (T == 1 && gdn_step_threads(c->lin_v_dim) && c->conv_kernel == 4) {
        // One token: conv, normalisation, gates, recurrence and gated norm in one kernel.
        const unsigned threads = (unsigned)gdn_step_threads(c->lin_v_dim);
        const size_t sm = gdn_step_smem(c->lin_v_dim);
#define STEP(KPT) pdl_launch(s, k_gdn_step<KPT, 4>, Hv * GDN_SPLIT, threads, sm, s->qkv, s->conv_state[(size_t)l], d.conv, CD, KD,   \
                             c->lin_k_heads, Hv, c->lin_v_dim, s->bb, s->ba, d.A_log, d.dt_bias, s->ssm[(size_t)l],  \
                             s->z, d.gdn_norm, c->rms_eps, s->o, s->d_pos)
        switch (c->lin_k_dim) {
        case 32: STEP(32 / GDN_G); break;
        case 64: STEP(64 / GDN_G); break;
        case 128: STEP(128 / GDN_G); break;
        default: STEP(256 / GDN_G); break;
        }
#undef STEP
        CKL();
    } else {
        // dk = 128: a conv block is one q/k head, and the conv normalises the heads and makes the gates itself
        gdn_prep_args pp = {0, 0, 0, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
        if (c->lin_k_dim == 128)
            pp = {2 * c->lin_k_heads, c->lin_k_heads, Hv, 128, s->bb, s->ba, d.A_log, d.dt_bias, s->beta, s->decay, s->lgd};
        if (conv_launch(s, d.conv, s->conv_state[(size_t)l], T, pp, err) < 0) return -1;
        if (!pp.qk_heads) {
            pdl_launch(s, k_gdn_prep, T, 256, 0, s->conv_out, CD, 2 * c->lin_k_heads, c->lin_k_heads, c->lin_k_dim, s->bb,
                       s->ba, d.A_log, d.dt_bias, Hv, s->beta, s->decay, s->lgd);
            CKL();
        }
        prof_mark(s, PH_GDN_CONV);
        if (s->gdn_scratch && T >= GDN_CHUNK_MIN) { // the chunked form
            CK(gdn_chunk_launch(s->conv_out, CD, KD, c->lin_k_heads, Hv, s->beta, s->lgd, s->ssm[(size_t)l], s->o, T,
                                s->gdn_scratch, s->st));
        } else {
            dim3 g;
            int rg = GDN_RECUR_RG, cc = GDN_RECUR_COLS;
            const gdn_recur_fn recur = gdn_recur_kernel(c->lin_k_dim, rg, cc, Hv, c->lin_v_dim, &g);
            pdl_launch(s, recur, g, 128, 0, s->conv_out, CD, KD, c->lin_k_heads, Hv, c->lin_v_dim, s->beta, s->decay,
                       s->ssm[(size_t)l], s->o, T);
            CKL();
        }
        prof_mark(s, PH_GDN_RECUR);
        // o's split for out_proj too, where a warp's 128 values are two whole groups and the windows whole
        o_split = c->lin_v_dim == 128 && Hv % 8 == 0 ? norm_split(s, T, VD) : o_split;
        // (out_proj quantized: it reads the split alone, and o need not be written)
        pdl_launch(s, k_gated_norm, (unsigned)(((int64_t)T * Hv + 7) / 8), 256, 0, s->o, s->z, d.gdn_norm, (int64_t)T, Hv,
                   c->lin_v_dim, c->rms_eps, o_split, o_split.xh && g4_ok(d.out_proj));
        CKL();
        if (o_split.xh) s->xn_split = false; // the split is o's now
    }
    prof_mark(s, PH_GDN_CORE);
    return mixer_out(s, d.out_proj, s->o, VD, T, err, o_split.xh != nullptr);
}

static int attn_layer(lilac_session *s, const dlayer &d, int l, int T, lilac_err *err) {
    const lilac_config *c = &s->m->cfg;
    const int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    const int64_t kvw = (int64_t)nkv * hd;
    const dmat W[3] = {d.q_proj, d.k_proj, d.v_proj};
    float *const Y[3] = {s->qg, s->kx, s->vx};
    const int64_t LD[3] = {2 * (int64_t)nh * hd, kvw, kvw};
    if (!(T == 1 && (s->ablate & ABL_INPROJ)) && input_mats(s, 3, W, Y, LD, T, d.in_norm, nullptr, err) < 0) return -1;
    prof_mark(s, PH_ATTN_PROJ);
    const int G = nkv > 0 && nh % nkv == 0 ? nh / nkv : 0;
    const bool dec = T == 1 && (hd == 128 || hd == 256) && G >= 1 && G <= 8;
    if (!dec) { // (k_attn_dec_mma norms and ropes its own token)
        pdl_launch(s, k_attn_prep, dim3((unsigned)T, (unsigned)(nh + nkv)), 32, 0, s->qg, (const float *)s->kx,
                   (const float *)s->vx, d.q_norm, d.k_norm, s->kc[(size_t)l], s->vc[(size_t)l], (const int *)s->d_pos, nh, nkv,
                   hd, c->rotary_dim, (const float *)s->D->inv_freq, c->rms_eps);
        CKL();
    }
    if (T > 1) { // prefill: tensor-core flash attention (cuda_attn.cuh)
        CK(attn_prefill_launch(s->qg, s->kc[(size_t)l], s->vc[(size_t)l], s->d_pos, T, nh, nkv, hd, s->att, s->st,
                               s->attn_qp, s->attn_wg));
        prof_mark(s, PH_ATTN_CORE);
        return mixer_out(s, d.o_proj, s->att, (int64_t)nh * hd, T, err);
    }
    const int S = dec ? ADEC_S : ATT_SPLITS;
    if (T == 1 && (s->ablate & ABL_ATTN)) return mixer_out(s, d.o_proj, s->att, (int64_t)nh * hd, T, err); // LILAC_ABLATE
    if (dec) { // GQA-packed: each K/V row read once for the G query heads that share it
        const dim3 g((unsigned)nkv, (unsigned)S);
#define DEC(K, NT, SM) pdl_launch(s, K, g, NT, SM, (const float *)s->qg, (const float *)s->kx, (const float *)s->vx, d.q_norm,     \
                                  d.k_norm, (const float *)s->D->inv_freq, c->rotary_dim, c->rms_eps, s->kc[(size_t)l],         \
                                  s->vc[(size_t)l], (const int *)s->d_pos, nh, nkv, s->part, S, (unsigned long long *)nullptr)
        // both products on the tensor cores (cuda_attn_dec.cuh)
        if (hd == 128) DEC(k_attn_dec_mma<128>, adec::NT, attn_dec_mma_smem(128));
        else DEC(k_attn_dec_mma<256>, adec::NT, attn_dec_mma_smem(256));
#undef DEC
        CKL();
    } else {
        dim3 g((unsigned)nh, (unsigned)T, (unsigned)S);
#define ATT(DPL) pdl_launch(s, k_attn<DPL>, g, 128, 0, s->qg, s->kc[(size_t)l], s->vc[(size_t)l], s->d_pos, nh, nkv, s->att, s->part)
        switch (hd) {
        case 64: ATT(2); break;
        case 128: ATT(4); break;
        default: ATT(8); break;
        }
#undef ATT
        CKL();
    }
    if (S > 1 && !(T == 1 && (s->ablate & ABL_COMB))) {
        pdl_launch(s, k_attn_combine, attn_combine_grid(nh, T, hd), 256, 0, s->qg, s->part, S, nh, hd, s->att);
        CKL();
    }
    prof_mark(s, PH_ATTN_CORE);
    return mixer_out(s, d.o_proj, s->att, (int64_t)nh * hd, T, err);
}

// One token's routed down projections through the expert GEMV, with the
// shared expert's beside them and the combine in the last block when their
// widths match (`done`: both happened); k_moe_down replaces this when it can.
static int moe_down_gemv(lilac_session *s, const dlayer &d, int l, int T, bool &done, lilac_err *err) {
    const lilac_config *c = &s->m->cfg;
    const int64_t H = c->hidden, I = c->moe_inter, SI = c->shared_inter;
    const int K = c->top_k, slots = T * K;
    const dmat Wd[2] = {d.exp_down, d.sh_down};
    float *const Yd[2] = {s->ye, s->shy};
    const int64_t LDd[2] = {H, H};
    gemv_job jd = job_of(2, Wd, Yd, LDd);
    jd.x[1] = s->shgu;
    jd.ldx[1] = 2 * SI;
    jd.xoff[1] = SI;
    jd.plain[1] = 1;
    if (d.sh_down.cols != I || T > 1) jd.n = 1; // one token only; same widths to share the staging
    if (jd.n == 2) { // the MoE combine in the down GEMV's last block
        jd.tail.kind = TAIL_COMBINE;
        jd.tail.done = s->tail_done + l;
        jd.tail.x = s->x;
        jd.tail.ye = s->ye;
        jd.tail.shy = s->shy;
        jd.tail.sg = s->sg;
        jd.tail.topw = s->topw;
        jd.tail.K = K;
        jd.tail.H = H;
    }
    if (gemv(s, jd, XM_SWIGLU, s->gu, 2 * I, I, s->topi, 1, slots, err) < 0) return -1;
    done = jd.n == 2;
    return 0;
}

// A prefill's shared expert on s->st2 (the router, one wave of 192 slow blocks, and the
// top-k/scan/scatter leave most of the GPU idle for ~130 us a layer; the shared expert's GEMMs, ~135 us in
// line, fill it): xn's split (which the router and the routed experts read too, and nothing rewrites
// before the combine), then on st2 the gate/up pair (SwiGLU's split into sh_dh/sh_dl/sh_dsw) and the down
// into shy; ev_join marks the end. Where it applies (moe_side_ok) only.
static bool moe_side_ok(const lilac_session *s, const dlayer &d, int64_t SI) {
    return s->st2 && SI % 64 == 0 && g4_ok(d.sh_gate) && g4_ok(d.sh_up) && g4_ok(d.sh_down) && d.sh_gate.bits == 4 &&
           d.sh_up.bits == 4 && d.sh_down.bits == 4 && d.sh_gate.rows == SI && d.sh_up.rows == SI && g4_ok(d.router) &&
           g4_ok(d.sh_expert_gate) && d.router.bits == d.sh_expert_gate.bits;
}
static int moe_shared_side(lilac_session *s, const dlayer &d, int T, lilac_err *err) {
    const int64_t H = s->m->cfg.hidden, SI = s->m->cfg.shared_inter;
    if (!s->xn_split && split_x(s, s->xn, H, 0, XM_PLAIN, T, H, err) < 0) return -1;
    s->xn_split = true;
    CK(cudaEventRecord(s->ev_fork, s->st));
    CK(cudaStreamWaitEvent(s->st2, s->ev_fork, 0));
    const cudaStream_t main = s->st;
    const bool pdl = s->pdl;
    s->st = s->st2, s->pdl = false; // (gemm_q launches on s->st)
    const dmat Wgu[2] = {d.sh_gate, d.sh_up};
    float *const Y[2] = {s->shgu, s->shgu + SI}; // (not written: the pair's epilogue writes sh_d*)
    const int64_t L[2] = {2 * SI, 2 * SI};
    float *const Yd[1] = {s->shy};
    const int64_t Ld[1] = {H};
    __nv_bfloat16 *const dx[3] = {s->sh_dh, s->sh_dl, s->sh_dsw};
    const int rc = gemm_q(s, 2, Wgu, Y, L, T, nullptr, 0, 1, err, nullptr, dx) < 0 ||
                           gemm_q(s, 1, &d.sh_down, Yd, Ld, T, nullptr, 0, 1, err, dx) < 0
                       ? -1
                       : 0;
    s->st = main, s->pdl = pdl;
    CK(cudaEventRecord(s->ev_join, s->st2)); // (also on failure: st2 is joined whatever it holds)
    return rc;
}

// next_gain (several tokens): the following layer's input-norm gain, fused into
// the combine; null after the last layer and for one token (whose next GEMV
// normalises the residual stream itself).
// next_xn: the following layer reads s->xn itself, not only its split (xn_split_only).
static int moe_layer(lilac_session *s, const dlayer &d, int l, int T, const float *next_gain, bool next_xn, lilac_err *err) {
    const lilac_config *c = &s->m->cfg;
    const int64_t H = c->hidden, I = c->moe_inter, SI = c->shared_inter;
    const int E = c->n_experts, K = c->top_k, slots = T * K;
    // Router logits, shared expert gate/up and its scalar gate: all read the
    // post-attention-normalised input (one token: normalised here, kept in xn).
    const dmat W[4] = {d.router, d.sh_gate, d.sh_up, d.sh_expert_gate};
    float *const Y[4] = {s->rlog, s->shgu, s->shgu + SI, s->sg};
    const int64_t LD[4] = {E, 2 * SI, 2 * SI, 1};
    const bool grouped = slots > 64;
    // One token: the routed gate/up GEMV's blocks make the top-k themselves from
    // the logits (tk_pro); otherwise a top-k kernel.
    const bool tk_pro = T == 1 && E <= 256 && K <= 8;
    if (T == 1 && (s->ablate & ABL_MOE)) return 0; // LILAC_ABLATE
    const bool side = T > 1 && grouped && moe_side_ok(s, d, SI);
    bool shared_done = false, combined = false;
    if (side) { // the shared expert beside the rest; here the router and the shared expert's scalar gate
        const dmat Wr[2] = {d.router, d.sh_expert_gate};
        float *const Yr[2] = {s->rlog, s->sg};
        const int64_t Lr[2] = {E, 1};
        if (moe_shared_side(s, d, T, err) < 0 || gemm_q(s, 2, Wr, Yr, Lr, T, nullptr, 0, 1, err) < 0) return -1;
        shared_done = true;
    } else if (!(T == 1 && (s->ablate & ABL_ROUTER)) && input_mats(s, 4, W, Y, LD, T, d.post_norm, s->xn, err) < 0) {
        return -1;
    }
    prof_mark(s, PH_MOE_ROUTE);
    if (tk_pro) {
        // in the gate/up GEMV below
    } else if (E <= 32)
        pdl_launch(s, k_topk_reg<1>, T, 32, 0, s->rlog, E, K, c->norm_topk, s->topi, s->topw, grouped ? s->counts : nullptr);
    else if (E <= 64)
        pdl_launch(s, k_topk_reg<2>, T, 32, 0, s->rlog, E, K, c->norm_topk, s->topi, s->topw, grouped ? s->counts : nullptr);
    else if (E <= 128)
        pdl_launch(s, k_topk_reg<4>, T, 32, 0, s->rlog, E, K, c->norm_topk, s->topi, s->topw, grouped ? s->counts : nullptr);
    else if (E <= 256)
        pdl_launch(s, k_topk_reg<8>, T, 32, 0, s->rlog, E, K, c->norm_topk, s->topi, s->topw, grouped ? s->counts : nullptr);
    else
        pdl_launch(s, k_topk, T, 32, sizeof(float) * (size_t)E, s->rlog, E, K, c->norm_topk, s->topi, s->topw,
                   grouped ? s->counts : nullptr);
    CKL();
    if (s->rec && T > 1) { // route_record (tests): this layer's [T][K] ids into the chunk's rows of the table
        static_assert(sizeof(int) == sizeof(int32_t), "topi is copied into an int32_t table");
        CK(cudaMemcpyAsync(s->rec + ((int64_t)l * s->rec_n + s->rec_t0) * K, s->topi, sizeof(int) * (size_t)slots,
                           cudaMemcpyDeviceToHost, s->st));
    }
    if (!grouped) {
        // Few tokens: gather-GEMV over the routed slots, expert ids read on the device.
        const dmat Wg[2] = {d.exp_gate, d.exp_up};
        float *const Yg[2] = {s->gu, s->gu + I};
        const int64_t LDg[2] = {2 * I, 2 * I};
        const int mg = T == 1 ? moe_down_mg(d.exp_down, d.sh_down, K) : 0;
        if (tk_pro && mg && s->moe_nsg && moe_split_ok(d.exp_gate, d.exp_up, H, I, K, E)) {
            // top-k, gate/up, SwiGLU, down and the combine in one kernel without a grid barrier (k_moe_split)
            const int nsg = s->moe_nsg;
            const unsigned grid = (unsigned)moe_split_grid(K, I, d.sh_down.cols, nsg);
#define SPLIT(N) pdl_launch(s, k_moe_split<N>, grid, MOE_SPLIT_THREADS, moe_split_smem(H, N), d.exp_gate, d.exp_up, d.exp_down, d.sh_down,   \
                            (const float *)s->xn, H, (const float *)s->rlog, E, c->norm_topk, (const float *)s->shgu, I,       \
                            d.sh_down.cols, (const float *)s->sg, K, s->moe_acc, s->moe_count, s->x,  \
                            l == s->moe_prof_layer ? s->moe_prof : (unsigned long long *)nullptr)
            if (nsg == 2) SPLIT(2);
            else SPLIT(1);
#undef SPLIT
            CKL();
            prof_mark(s, PH_MOE_EXPERTS);
            return 0;
        }
        gemv_job j = job_of(2, Wg, Yg, LDg);
        if (tk_pro) { // block (0,0) leaves the top-k in topi/topw for the down projections
            j.tk_logits = s->rlog;
            j.tk_E = E;
            j.tk_K = K;
            j.tk_norm = c->norm_topk;
            j.tk_topi = s->topi;
            j.tk_topw = s->topw;
        }
        if (gemv(s, j, XM_PLAIN, s->xn, H, 0, s->topi, K, slots, err) < 0) return -1;
        if (mg) {
            // Routed and shared down projections and the combine into x, one kernel (k_moe_down).
            const unsigned nb = (unsigned)((H + 15) / 16);
            const size_t sm = moe_down_smem(I, K);
            if (mg == 1) pdl_launch(s, k_moe_down<1>, nb, 256, sm, d.exp_down, d.sh_down, (const float *)s->gu,
                                    (const float *)s->shgu, I, (const int *)s->topi, (const float *)s->topw, (const float *)s->sg, K, s->x);
            else pdl_launch(s, k_moe_down<2>, nb, 256, sm, d.exp_down, d.sh_down, (const float *)s->gu,
                            (const float *)s->shgu, I, (const int *)s->topi, (const float *)s->topw, (const float *)s->sg, K, s->x);
            CKL();
            shared_done = combined = true;
        } else if (moe_down_gemv(s, d, l, T, shared_done, err) < 0) {
            return -1;
        }
        combined = shared_done;
    } else {
        // Prefill: count -> scan -> scatter, then grouped tensor-core GEMMs per expert.
        pdl_launch(s, k_moe_scan, 1, MOE_SCAN_THREADS, 0, s->counts, E, s->offs, s->cursor, s->tiles, s->n_tiles);
        CKL();
        pdl_launch(s, k_moe_scatter, (slots + 255) / 256, 256, 0, s->topi, slots, s->offs, s->cursor, s->sorted);
        CKL();
        if (g4_ok(d.exp_gate) && g4_ok(d.exp_up) && g4_ok(d.exp_down) && d.exp_gate.bits == d.exp_up.bits) {
            // over the tile map: each (expert, 64 tokens) at most once; gate and up in one launch from xn's split
            const int max_tiles = (slots + G4_BN - 1) / G4_BN + std::min(E, slots);
            // xn's split is still in xh/xl when the router's GEMM made it (input_mats)
            if (!s->xn_split && split_x(s, s->xn, H, 0, XM_PLAIN, T, H, err) < 0) return -1;
            const dmat Wgu[2] = {d.exp_gate, d.exp_up};
            float *const Ygu[2] = {s->gu, s->gu + I};
            const int64_t Lgu[2] = {2 * I, 2 * I};
            float *const Yd[1] = {s->ye};
            const int64_t Ld[1] = {H};
            if (s->gemm_pair && d.exp_gate.bits == 4) { // gate and up in one block, the down's input split in its epilogue (k_split_x<1> is 3.3 ms at 4k)
                __nv_bfloat16 *const dx[3] = {s->dh, s->dl, s->dsw};
                if (gemm_q(s, 2, Wgu, Ygu, Lgu, T, s->offs, max_tiles, K, err, nullptr, dx) < 0 ||
                    gemm_q(s, 1, &d.exp_down, Yd, Ld, T, s->offs, max_tiles, 1, err, dx) < 0)
                    return -1;
            } else {
                if (gemm_q(s, 2, Wgu, Ygu, Lgu, T, s->offs, max_tiles, K, err) < 0) return -1;
                // down: its input is SwiGLU of each slot's gate/up row
                if (split_x(s, s->gu, 2 * I, I, XM_SWIGLU, slots, I, err) < 0) return -1;
                if (gemm_q(s, 1, &d.exp_down, Yd, Ld, T, s->offs, max_tiles, 1, err) < 0) return -1;
            }
        } else {
            dim3 g((unsigned)((I + TC_BM - 1) / TC_BM), (unsigned)((T + TC_BN - 1) / TC_BN), (unsigned)E);
            pdl_launch(s, k_gemm_tc<XM_PLAIN>, g, 128, 0, d.exp_gate, s->xn, H, 0, s->gu, 2 * I, T, s->offs, s->sorted, K);
            CKL();
            pdl_launch(s, k_gemm_tc<XM_PLAIN>, g, 128, 0, d.exp_up, s->xn, H, 0, s->gu + I, 2 * I, T, s->offs, s->sorted, K);
            CKL();
            dim3 gd((unsigned)((H + TC_BM - 1) / TC_BM), (unsigned)((T + TC_BN - 1) / TC_BN), (unsigned)E);
            pdl_launch(s, k_gemm_tc<XM_SWIGLU>, gd, 128, 0, d.exp_down, s->gu, 2 * I, I, s->ye, H, T, s->offs, s->sorted, 1);
            CKL();
        }
    }
    prof_mark(s, PH_MOE_EXPERTS);
    if (!shared_done && matmul(s, d.sh_down, s->shgu, 2 * SI, s->shy, H, T, XM_SWIGLU, SI, err) < 0) return -1;
    if (combined) return 0;
    if (side) CK(cudaStreamWaitEvent(s->st, s->ev_join, 0)); // the shared expert's shy
    const dim3 gc((unsigned)T, next_gain ? 1u : (unsigned)((H / 4 + 255) / 256)); // (four columns a thread)
    const g4_split sp = next_gain ? norm_split(s, T, H) : g4_split{nullptr, nullptr, nullptr, nullptr};
    pdl_launch(s, k_moe_combine, gc, 256, 0, s->x, s->ye, s->topw, K, s->shy, s->sg, H, next_gain,
               sp.xh && !next_xn ? nullptr : s->xn, c->rms_eps, sp);
    CKL();
    if (next_gain) s->xn_split = sp.xh != nullptr;
    return 0;
}

// Whether what reads a layer's normalised input (its mixer's, or with moe its MoE's) for T > 1 tokens
// reads only the split the norm wrote (every matrix quantized for the prefill GEMMs, the routed experts
// grouped), so that the norm need not write s->xn as well.
static bool xn_split_only(const lilac_session *s, const dlayer &d, int l, bool moe, int T) {
    const lilac_config *c = &s->m->cfg;
    if (moe)
        return (int64_t)T * c->top_k > 64 && g4_ok(d.router) && g4_ok(d.sh_gate) && g4_ok(d.sh_up) && g4_ok(d.sh_expert_gate) &&
               g4_ok(d.exp_gate) && g4_ok(d.exp_up) && g4_ok(d.exp_down) && d.exp_gate.bits == d.exp_up.bits;
    if (c->is_full[l]) return g4_ok(d.q_proj) && g4_ok(d.k_proj) && g4_ok(d.v_proj);
    return g4_ok(d.in_qkv) && g4_ok(d.in_z) && g4_ok(d.in_b) && g4_ok(d.in_a);
}

// The layers for T tokens whose ids are in d_ids and whose first position is *d_pos.
// Several tokens: explicit RMSNorm kernels (the first, and the post-mixer ones
// that also add the mixer output) and norms fused into the MoE combine. One
// token: every norm is computed by the GEMV that consumes it, and mixer outputs
// are accumulated straight into the residual stream.
static int run_layers(lilac_session *s, int T, lilac_err *err) {
    const lilac_model *m = s->m;
    const lilac_config *c = &m->cfg;
    const int64_t H = c->hidden;
    dmodel *D = s->D;
    s->pdl = true;
    prof_mark(s, PH_EMBED);
    pdl_launch(s, k_embed, dim3((unsigned)T, (unsigned)((H + 255) / 256)), 256, 0, D->embed, s->d_ids, s->x);
    CKL();
    for (int l = 0; l < c->n_layers; l++) {
        const dlayer &d = D->layers[(size_t)l];
        if (l == 0 && T > 1) {
            const g4_split sp = norm_split(s, T, H);
            float *const xn = sp.xh && xn_split_only(s, d, l, false, T) ? nullptr : s->xn;
            pdl_launch(s, k_add_rmsnorm, T, 256, 0, s->x, nullptr, d.in_norm, xn, H, c->rms_eps, 0, sp);
            CKL();
            s->xn_split = sp.xh != nullptr;
        }
        prof_mark(s, PH_EMBED);
        if (c->is_full[l] ? attn_layer(s, d, l, T, err) : gdn_layer(s, d, l, T, err)) return -1;
        prof_mark(s, c->is_full[l] ? PH_ATTN_PROJ : PH_GDN_PROJ);
        if (T > 1) {
            const g4_split sp = norm_split(s, T, H);
            float *const xn = sp.xh && xn_split_only(s, d, l, true, T) ? nullptr : s->xn;
            pdl_launch(s, k_add_rmsnorm, T, 256, 0, s->x, s->r, d.post_norm, xn, H, c->rms_eps, 0, sp);
            CKL();
            s->xn_split = sp.xh != nullptr;
        }
        prof_mark(s, PH_EMBED);
        const float *next = T > 1 && l + 1 < c->n_layers ? D->layers[(size_t)l + 1].in_norm : nullptr;
        const bool next_xn = next && !xn_split_only(s, D->layers[(size_t)l + 1], l + 1, false, T);
        if (moe_layer(s, d, l, T, next, next_xn, err) < 0) return -1;
        prof_mark(s, PH_MOE_SHARED);
    }
    return 0;
}

// Final norm + lm_head for rows [row0, row0+n) of x into s->logits (one row)
// or s->logits_all.
static int head(lilac_session *s, int row0, int n, lilac_err *err) {
    const lilac_config *c = &s->m->cfg;
    if (n == 1) {
        float *y = s->logits;
        const int64_t ld = c->vocab;
        gemv_job j = job_of(1, &s->D->lm_head, &y, &ld);
        j.gain = s->D->final_norm;
        j.eps = c->rms_eps;
        return gemv(s, j, XM_NORM, s->x + (int64_t)row0 * c->hidden, c->hidden, 0, nullptr, 1, 0, err);
    }
    pdl_launch(s, k_add_rmsnorm, n, 256, 0, s->x, nullptr, s->D->final_norm, s->xn, c->hidden, c->rms_eps, row0,
               g4_split{nullptr, nullptr, nullptr, nullptr});
    CKL();
    s->xn_split = false;
    return matmul(s, s->D->lm_head, s->xn, c->hidden, s->logits_all, c->vocab, n, XM_PLAIN, 0, err);
}

static int ensure_logits_rows(lilac_session *s, int64_t rows, lilac_err *err) {
    if (rows <= s->logits_rows) return 0;
    float *p;
    CK(cudaMalloc((void **)&p, sizeof(float) * (size_t)rows * (size_t)s->m->cfg.vocab));
    s->allocs.push_back(p);
    s->logits_all = p;
    s->logits_rows = rows;
    return 0;
}

// One token's pass (input d_ids[0] at *d_pos) to the logits in s->logits; with
// `pick`, also the greedy token: the next input, the ring, *d_pos + 1.
static int decode_pass(lilac_session *s, bool pick, lilac_err *err) {
    if (run_layers(s, 1, err) < 0 || head(s, 0, 1, err) < 0) return -1;
    if (pick) {
        pdl_launch(s, k_argmax, argmax_blocks(s->m->cfg.vocab), ARGMAX_THREADS, 0, (const float *)s->logits,
                   (int64_t)s->m->cfg.vocab, s->d_ids, s->ring_dev, RING, s->d_step, s->d_pos, s->amax_best, s->amax_arrived);
        CKL();
    }
    return 0;
}

static int cuda_forward(lilac_session *s, const int32_t *ids, int n, lilac_logits_mode mode, float *logits, lilac_err *err) {
    const lilac_config *c = &s->m->cfg;
    if (n <= 0) return lilac_fail(err, "forward: no tokens");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return lilac_fail(err, "token id %d at index %d is outside the vocabulary [0, %lld)", ids[i], i, (long long)c->vocab);
    if (s->pos + n > s->max_seq)
        return lilac_fail(err, "context full: %lld + %d tokens exceed the maximum of %lld", (long long)s->pos, n,
                          (long long)s->max_seq);
    if (s->rec && n > s->rec_cap) return lilac_fail(err, "forward: %d tokens exceed the routing record's %d", n, s->rec_cap);
    s->rec_n = n;
    for (int done = 0; done < n;) {
        const int T = std::min(n - done, CHUNK);
        const bool last = done + T == n;
        s->rec_t0 = done;
        s->h_pinned[0] = (int)(s->pos + done);
        memcpy(s->h_pinned + 1, ids + done, sizeof(int) * (size_t)T);
        CK(cudaMemcpyAsync(s->d_pos, s->h_pinned, sizeof(int), cudaMemcpyHostToDevice, s->st));
        CK(cudaMemcpyAsync(s->d_ids, s->h_pinned + 1, sizeof(int) * (size_t)T, cudaMemcpyHostToDevice, s->st));
        if (run_layers(s, T, err) < 0) {
            return -1;
        } else if (mode == LOGITS_ALL) {
            if (T > 1 && ensure_logits_rows(s, T, err) < 0) return -1;
            if (head(s, 0, T, err) < 0) return -1;
            CK(cudaMemcpyAsync(logits + (int64_t)done * c->vocab, T > 1 ? s->logits_all : s->logits,
                               sizeof(float) * (size_t)T * (size_t)c->vocab, cudaMemcpyDeviceToHost, s->st));
        } else if (mode == LOGITS_LAST && last) {
            if (head(s, T - 1, 1, err) < 0) return -1;
            prof_mark(s, PH_HEAD);
            if (logits) CK(cudaMemcpyAsync(logits, s->logits, sizeof(float) * (size_t)c->vocab, cudaMemcpyDeviceToHost, s->st));
        }
        // The host staging buffer is reused by the next chunk: wait here.
        CK(cudaStreamSynchronize(s->st));
        prof_report(s, T);
        done += T;
    }
    s->pos += n;
    return 0;
}

// One decode step, captured once as a graph: input id d_ids[0] at *d_pos; the
// argmax becomes the next input, lands in the ring, and *d_pos advances.
static int capture_step(lilac_session *s, lilac_err *err) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s->st, cudaStreamCaptureModeThreadLocal));
    int rc = decode_pass(s, true, err);
    cudaError_t e = cudaStreamEndCapture(s->st, &g);
    if (rc < 0) return -1;
    CK(e);
    CK(cudaGraphInstantiate(&s->graph, g, 0));
    CK(cudaGraphDestroy(g));
    return 0;
}

static int cuda_decode_greedy(lilac_session *s, int32_t first, int max_new, bool (*on_token)(void *, int32_t), void *ud,
                              lilac_err *err) {
    if (max_new <= 0) return 0;
    if (first < 0 || first >= s->m->cfg.vocab) return lilac_fail(err, "token id %d outside the vocabulary", first);
    if (s->pos + max_new + 1 > s->max_seq)
        return lilac_fail(err, "context full: %lld + %d tokens exceed the maximum of %lld", (long long)s->pos, max_new + 1,
                          (long long)s->max_seq);
    if (!s->graph && capture_step(s, err) < 0) return -1;
    s->h_pinned[0] = (int)s->pos;
    s->h_pinned[1] = first;
    s->h_pinned[2] = 0;
    CK(cudaMemcpyAsync(s->d_pos, s->h_pinned, sizeof(int), cudaMemcpyHostToDevice, s->st));
    CK(cudaMemcpyAsync(s->d_ids, s->h_pinned + 1, sizeof(int), cudaMemcpyHostToDevice, s->st));
    CK(cudaMemcpyAsync(s->d_step, s->h_pinned + 2, sizeof(int), cudaMemcpyHostToDevice, s->st));
    CK(cudaGraphLaunch(s->graph, s->st));
    CK(cudaEventRecord(s->step_ev[0], s->st));
    int produced = 0;
    for (int i = 0;; i++) {
        // Step i+1 (which consumes token i) is queued before token i is read:
        // the GPU never idles waiting for the host.
        CK(cudaGraphLaunch(s->graph, s->st));
        CK(cudaEventRecord(s->step_ev[(i + 1) & 1], s->st));
        CK(cudaEventSynchronize(s->step_ev[i & 1]));
        const int tok = ((volatile int *)s->ring)[i % RING];
        produced++;
        const bool more = on_token(ud, tok);
        if (!more || produced == max_new) break;
    }
    CK(cudaStreamSynchronize(s->st));
    s->pos += produced + 1;
    return produced;
}

// ---------------------------------------------------------------- snapshots, batched step

struct lilac_snapshot {
    int64_t pos;
    size_t bytes;
    std::vector<void *> bufs; // per GDN layer: both conv buffers, then the recurrent state (device)
};

static void cuda_snapshot_free(lilac_snapshot *snap) {
    if (!snap) return;
    for (void *p : snap->bufs) cudaFree(p);
    delete snap;
}

static lilac_snapshot *cuda_snapshot(lilac_session *s, lilac_err *err) {
    const lilac_config *c = &s->m->cfg;
    const size_t conv = sizeof(float) * 2 * (size_t)(c->conv_kernel - 1) * (size_t)cfg_conv_dim(c);
    const size_t ssm = sizeof(float) * (size_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
    lilac_snapshot *snap = new lilac_snapshot();
    snap->pos = s->pos;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->is_full[l]) continue;
        void *p = nullptr;
        if (cudaMalloc(&p, conv + ssm) != cudaSuccess ||
            cudaMemcpyAsync(p, s->conv_state[(size_t)l], conv, cudaMemcpyDeviceToDevice, s->st) != cudaSuccess ||
            cudaMemcpyAsync((char *)p + conv, s->ssm[(size_t)l], ssm, cudaMemcpyDeviceToDevice, s->st) != cudaSuccess) {
            if (p) cudaFree(p);
            cudaGetLastError();
            cuda_snapshot_free(snap);
            lilac_fail(err, "snapshot: out of GPU memory");
            return nullptr;
        }
        snap->bufs.push_back(p);
        snap->bytes += conv + ssm;
    }
    if (cudaStreamSynchronize(s->st) != cudaSuccess) {
        cuda_snapshot_free(snap);
        lilac_fail(err, "snapshot: CUDA error %s", cudaGetErrorString(cudaGetLastError()));
        return nullptr;
    }
    return snap;
}

static int cuda_restore(lilac_session *s, const lilac_snapshot *snap, lilac_err *err) {
    const lilac_config *c = &s->m->cfg;
    if (snap->pos > s->pos) return lilac_fail(err, "restore: snapshot at %lld is ahead of the session (%lld)",
                                              (long long)snap->pos, (long long)s->pos);
    const size_t conv = sizeof(float) * 2 * (size_t)(c->conv_kernel - 1) * (size_t)cfg_conv_dim(c);
    const size_t ssm = sizeof(float) * (size_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
    size_t i = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->is_full[l]) continue;
        CK(cudaMemcpyAsync(s->conv_state[(size_t)l], snap->bufs[i], conv, cudaMemcpyDeviceToDevice, s->st));
        CK(cudaMemcpyAsync(s->ssm[(size_t)l], (char *)snap->bufs[i] + conv, ssm, cudaMemcpyDeviceToDevice, s->st));
        i++;
    }
    CK(cudaStreamSynchronize(s->st));
    s->pos = snap->pos;
    return 0;
}

static int64_t cuda_snapshot_pos(const lilac_snapshot *snap) { return snap->pos; }
static size_t cuda_snapshot_bytes(const lilac_snapshot *snap) { return snap->bytes; }

// Sessions step one after another (each with its own graph-free forward).
static int cuda_forward_batch(lilac_session **ss, const int32_t *ids, int n, float *logits, lilac_err *err) {
    for (int i = 0; i < n; i++)
        if (cuda_forward(ss[i], ids + i, 1, LOGITS_LAST, logits + (int64_t)i * ss[i]->m->cfg.vocab, err) < 0) return -1;
    return 0;
}

// ---------------------------------------------------------------- sampling on the device (cuda_sample.cu)

static int cuda_sample_begin(lilac_session *s, const lilac_sampling *p, const int32_t *prompt, int n_prompt,
                             lilac_err *err) {
    if (!s->smp && !(s->smp = cuda_sampler_new(s->m->cfg.vocab, err))) return -1;
    return cuda_sampler_begin(s->smp, p, prompt, n_prompt, s->st, err);
}

// The prompt through forward() (its last logits stay on the device: no host
// buffer given), then the sampler on them.
static int cuda_forward_sample(lilac_session *s, const int32_t *ids, int n, int32_t *tok, lilac_err *err) {
    if (!s->smp) return lilac_fail(err, "forward_sample: no sample_begin on this session");
    if (cuda_forward(s, ids, n, LOGITS_LAST, nullptr, err) < 0) return -1;
    if (cuda_sampler_launch(s->smp, s->logits, s->st, err) < 0) return -1;
    CK(cudaStreamSynchronize(s->st));
    *tok = cuda_sampler_result(s->smp, err);
    return *tok < 0 ? -1 : 0;
}

// One decode step ending in the sampler, captured once per session as a graph:
// input d_ids[0] at *d_pos (the host sets both per step); the token lands in the
// sampler's host-mapped result.
static int capture_sample_step(lilac_session *s, lilac_err *err) {
    cudaGraph_t g = nullptr;
    CK(cudaStreamBeginCapture(s->st, cudaStreamCaptureModeThreadLocal));
    int rc = decode_pass(s, false, err);
    if (rc == 0) rc = cuda_sampler_launch(s->smp, s->logits, s->st, err);
    const cudaError_t e = cudaStreamEndCapture(s->st, &g);
    if (rc < 0 || e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        return rc < 0 ? -1 : lilac_fail(err, "CUDA: sampled decode step capture failed (%s)", cudaGetErrorString(e));
    }
    const cudaError_t ei = cudaGraphInstantiate(&s->sgraph, g, 0);
    cudaGraphDestroy(g);
    CK(ei);
    return 0;
}

// The sessions step concurrently, each on its own stream; only ids cross the bus.
static int cuda_forward_batch_sample(lilac_session **ss, const int32_t *ids, int n, int32_t *toks, lilac_err *err) {
    for (int i = 0; i < n; i++) {
        const lilac_session *s = ss[i];
        if (!s->smp) return lilac_fail(err, "forward_batch_sample: no sample_begin on session %d", i);
        if (ids[i] < 0 || ids[i] >= s->m->cfg.vocab)
            return lilac_fail(err, "token id %d at index %d is outside the vocabulary [0, %lld)", ids[i], i,
                              (long long)s->m->cfg.vocab);
        if (s->pos + 1 > s->max_seq)
            return lilac_fail(err, "context full: %lld + 1 tokens exceed the maximum of %lld", (long long)s->pos,
                              (long long)s->max_seq);
        for (int j = 0; j < i; j++)
            if (ss[j] == s) return lilac_fail(err, "forward_batch_sample: session %d appears twice", i);
    }
    for (int i = 0; i < n; i++) {
        lilac_session *s = ss[i];
        if (!s->sgraph && capture_sample_step(s, err) < 0) return -1;
        s->h_pinned[0] = (int)s->pos;
        s->h_pinned[1] = ids[i];
        CK(cudaMemcpyAsync(s->d_pos, s->h_pinned, sizeof(int), cudaMemcpyHostToDevice, s->st));
        CK(cudaMemcpyAsync(s->d_ids, s->h_pinned + 1, sizeof(int), cudaMemcpyHostToDevice, s->st));
        CK(cudaGraphLaunch(s->sgraph, s->st));
    }
    for (int i = 0; i < n; i++) {
        CK(cudaStreamSynchronize(ss[i]->st));
        ss[i]->pos++;
        if ((toks[i] = cuda_sampler_result(ss[i]->smp, err)) < 0) return -1;
    }
    return 0;
}

// --attn-precision: the prefill attention's pieces of Q and P, two (f32-faithful, the default) or
// one (bf16, as FlashAttention; cuda_attn.cuh). Read by every later prefill.
static void cuda_set_attn_bf16(lilac_session *s, bool on) { s->attn_qp = on ? 1 : 2; }

// Tests only (tests/cuda/test_cuda.c): moe_layer copies each multi-token pass's top-k to the table; the
// copies are ordered on the session stream, which cuda_forward synchronises after every chunk.
static void cuda_route_record(lilac_session *s, int32_t *ids, int cap) {
    s->rec = ids;
    s->rec_cap = ids ? cap : 0;
}

extern "C" const lilac_backend lilac_backend_cuda = {
    "cuda", cuda_session_new, cuda_session_free, cuda_session_reset, cuda_session_pos, cuda_forward, cuda_decode_greedy,
    cuda_snapshot, cuda_restore, cuda_snapshot_free, cuda_snapshot_pos, cuda_snapshot_bytes, cuda_forward_batch,
    cuda_sample_begin, cuda_forward_sample, cuda_forward_batch_sample,
    nullptr, // set_kv_bf16: this backend's cache is always bf16
    cuda_route_record,
    nullptr, // route_replay: the CPU reference replays, this backend records
    nullptr, // route_regret
    2,       // kv_bytes: bf16
    cuda_set_attn_bf16,
};

// ---------------------------------------------------------------- measurements for bench

// Device-to-device copy bandwidth (bytes read + written per second), 2 GB buffers.
extern "C" double lilac_cuda_copy_bandwidth(void) {
    const size_t n = 1ull << 30;
    void *a = nullptr, *b = nullptr;
    cudaEvent_t e0, e1;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) {
        cudaFree(a);
        cudaGetLastError();
        return 0;
    }
    cudaMemset(a, 1, n);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int i = 0; i < 6; i++) {
        cudaEventRecord(e0);
        cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i > 0 && ms < best) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return cudaGetLastError() == cudaSuccess ? 2.0 * n / (best / 1e3) : 0;
}

extern "C" double lilac_cuda_mem_used(void) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return 0;
    return (double)(tot - fr);
}
