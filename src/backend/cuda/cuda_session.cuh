// cuda_session.cuh — a session's device state and its set-up: the KV cache, GDN state and conv
// windows, one prefill chunk's scratch, the decode ring and graphs; the kernel choices the
// device makes (wgmma or mma.sync, k_moe_split); the diagnostics (LILAC_PROFILE, LILAC_ABLATE,
// LILAC_MOE_PROF, through lilac_diag()).
// Part of cuda_backend.cu, which includes it once (one translation unit: every kernel is
// registered once, and the attributes set on a kernel are those of the one that is launched).
#pragma once

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
    // the MoE: router logits, top-k weights, the routed experts' gate|up rows and outputs (T*K rows),
    // the shared expert's gate|up rows, output and scalar gate logit
    float *router_logits, *topw, *moe_gate_up, *moe_y, *sh_gate_up, *sh_y, *sh_gate_logit;
    int *topi, *counts, *offs, *cursor, *sorted;
    float *logits;                      // one row: every one-token pass writes here
    float *logits_all; int64_t logits_rows; // LOGITS_ALL prefill: a chunk's rows
    // a prefill GEMM's input split into bf16 hi/lo parts + f32 group sums (cuda_gemm.cuh)
    __nv_bfloat16 *xh, *xl;
    float *xsum;
    __nv_bfloat16 *xsum_wg;   // the group sums as k_gemm_wg reads them (k_split_x, wg_xsw_win; gemm_wg only)
    int64_t xsum_wg_n;        // its size in elements (split_x checks each split fits)
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
    int moe_split_groups; // k_moe_split's shared units' groups (0: it does not fit; the gate/up GEMV and k_moe_down instead)
    unsigned long long *moe_acc; // k_moe_split's fixed-point sums (H, zero between launches)
    unsigned *moe_count;         // and its arrival count
    unsigned long long *moe_prof; // LILAC_MOE_PROF=l: layer l's k_moe_split marks in decode steps, printed at the end
    int moe_prof_layer, moe_prof_grid, moe_prof_nA;
    int attn_qp;       // prefill attention's bf16 pieces of Q and P: 2, or 1 with --attn-precision bf16 (cuda_attn.cuh)
    float *lgd, *gdn_scratch; // the chunked GDN prefill (cuda_gdn_chunk.cuh): log decays, scratch; null when off
    bool gemm_wg;             // 4-bit prefill GEMMs on wgmma (k_gemm_wg; sm_90a only; elsewhere k_gemm_q<4> on mma.sync)
    bool gemm_pair;           // with gemm_wg: the routed gate/up GEMM writes the down projection's split input itself
                              // (a swiglu job, cuda_gemm4_tile.cuh) into down_hi/down_lo/down_sums
    __nv_bfloat16 *down_hi, *down_lo, *down_sums; // the routed down projection's split input (gemm_pair)
    // with gemm_pair, a prefill's shared expert runs on st2 beside the router and the routed experts
    // (moe_shared_side): its gate/up a swiglu job into sh_down_hi/lo/sums, then its down; forked from st at
    // ev_fork, joined before the combine at ev_join.
    cudaStream_t st2;
    cudaEvent_t ev_fork, ev_join;
    __nv_bfloat16 *sh_down_hi, *sh_down_lo, *sh_down_sums;
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
         dalloc(s, &s->router_logits, C * c->n_experts, err) == 0 && dalloc(s, &s->topw, C * K, err) == 0 &&
         dalloc(s, &s->topi, C * K, err) == 0 && dalloc(s, &s->moe_gate_up, C * K * 2 * c->moe_inter, err) == 0 &&
         dalloc(s, &s->moe_y, C * K * H, err) == 0 && dalloc(s, &s->sh_gate_up, C * 2 * c->shared_inter, err) == 0 &&
         dalloc(s, &s->sh_y, C * H, err) == 0 && dalloc(s, &s->sh_gate_logit, C, err) == 0 &&
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
        s->xsum_wg_n = std::max(wg_xsw_win(C, (int)(w / 64), 0), wg_xsw_win(C * K, (int)(c->moe_inter / 64), 0));
        ok = ok && dalloc(s, &s->xh, (size_t)(C * w), err) == 0 && dalloc(s, &s->xl, (size_t)(C * w), err) == 0 &&
             dalloc(s, &s->xsum, (size_t)(C * w / 64), err) == 0 &&
             (!s->gemm_wg || dalloc(s, &s->xsum_wg, (size_t)s->xsum_wg_n, err) == 0) &&
             (!s->gemm_pair || (dalloc(s, &s->down_hi, (size_t)(C * K * c->moe_inter), err) == 0 &&
                                dalloc(s, &s->down_lo, (size_t)(C * K * c->moe_inter), err) == 0 &&
                                dalloc(s, &s->down_sums, (size_t)wg_xsw_win(C * K, (int)(c->moe_inter / 64), 0), err) == 0)) &&
             (!s->gemm_pair || c->shared_inter % 64 ||
              (dalloc(s, &s->sh_down_hi, (size_t)(C * c->shared_inter), err) == 0 &&
               dalloc(s, &s->sh_down_lo, (size_t)(C * c->shared_inter), err) == 0 &&
               dalloc(s, &s->sh_down_sums, (size_t)wg_xsw_win(C, (int)(c->shared_inter / 64), 0), err) == 0 &&
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
        const int down_groups = moe_down_mg(d0.exp_down, d0.sh_down, (int)K);
        const int split_groups = down_groups && moe_split_ok(d0.exp_gate, d0.exp_up, H, c->moe_inter, (int)K, c->n_experts)
                            ? moe_split_nsg(d0.sh_down, H, c->moe_inter, (int)K, s->n_sm)
                            : 0;
        if (split_groups) {
            ok = dalloc(s, &s->moe_acc, (size_t)H, err) == 0 && dalloc(s, &s->moe_count, 1, err) == 0 &&
                 cudaFuncSetAttribute(split_groups == 2 ? k_moe_split<2> : k_moe_split<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)moe_split_smem(H, split_groups)) == cudaSuccess;
            s->moe_split_groups = split_groups;
            s->moe_prof_layer = lilac_diag()->moe_prof_layer;
            if (s->moe_prof_layer >= 0) { // LILAC_MOE_PROF
                s->moe_prof_nA = (int)moe_split_routed((int)K, c->moe_inter);
                s->moe_prof_grid = (int)moe_split_grid((int)K, c->moe_inter, d0.sh_down.cols, split_groups);
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

// --attn-precision: the prefill attention's pieces of Q and P, two (f32-faithful, the default) or
// one (bf16, as FlashAttention; cuda_attn.cuh). Read by every later prefill.
static void cuda_set_attn_bf16(lilac_session *s, bool on) { s->attn_qp = on ? 1 : 2; }

// Tests only (tests/cuda/test_cuda.c): moe_layer copies each multi-token pass's top-k to the table; the
// copies are ordered on the session stream, which cuda_forward synchronises after every chunk.
static void cuda_route_record(lilac_session *s, int32_t *ids, int cap) {
    s->rec = ids;
    s->rec_cap = ids ? cap : 0;
}
