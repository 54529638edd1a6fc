// cuda_forward.cuh — the forward pass, kernel by kernel, in the order of src/backend/cpu/cpu_forward.c
// (the launch helpers and the projections, then gdn_layer, attn_layer, moe_layer, run_layers and
// the head), so that the two read side by side.
// Part of cuda_backend.cu, which includes it once (one translation unit: every kernel is
// registered once, and the attributes set on a kernel are those of the one that is launched).
#pragma once

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
    if (rows * cols > s->xq_plane || (s->xsum_wg && wg_xsw_win(rows, (int)(cols / 64), 0) > s->xsum_wg_n)) {
        return lilac_fail(err, "internal: prefill split of %lld x %lld exceeds its buffers", (long long)rows,
                          (long long)cols);
    }
    if (xm == XM_SWIGLU)
        pdl_launch(s, k_split_x<1>, (unsigned)rows, 256, 0, x, ldx, xoff, cols, s->xh, s->xl, s->xsum, s->xq, s->xsig, s->xq_plane,
                   s->xsum_wg);
    else pdl_launch(s, k_split_x<0>, (unsigned)rows, 256, 0, x, ldx, xoff, cols, s->xh, s->xl, s->xsum, s->xq, s->xsig, s->xq_plane,
                    s->xsum_wg);
    CKL();
    return 0;
}

// Where a prefill norm that writes `rows` x `cols` of a GEMM's input puts the input's split (g4_split:
// none, xh null, where k_split_x must make it: with k_gemm_q<4>'s int8 pieces, which the norms do not
// write, or where it would not fit). The caller marks what the split then holds (xn_split).
static g4_split norm_split(const lilac_session *s, int64_t rows, int64_t cols) {
    g4_split sp = {nullptr, nullptr, nullptr, nullptr};
    if (s->xq || cols % 64 || rows * cols > s->xq_plane ||
        (s->xsum_wg && wg_xsw_win(rows, (int)(cols / 64), 0) > s->xsum_wg_n))
        return sp;
    sp.xh = s->xh, sp.xl = s->xl, sp.xsw = s->xsum_wg, sp.xs = s->xsum;
    return sp;
}

// y = W x for T tokens: GEMV for one token, tensor-core GEMM otherwise.
// accum (one token only): y += W x.
// The quantized tensor-core GEMM (cuda_gemm.cuh) for n matrices of the same bit
// width reading the split input now in xh/xl. Grouped (max_tiles > 0): over the
// expert tile map, at most max_tiles entries.
// in: the split input (hi, lo, group sums) when not s->xh/xl/xsum_wg. pair (n = 2, gemm_wg): W[0] and W[1] a gate and
// an up matrix, whose SwiGLU goes split into pair[0..2] (oh, ol, osw) instead of y (a swiglu job, cuda_gemm4_tile.cuh).
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
    const __nv_bfloat16 *xsw = in ? in[2] : (const __nv_bfloat16 *)s->xsum_wg;
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
    float *const Yd[2] = {s->moe_y, s->sh_y};
    const int64_t LDd[2] = {H, H};
    gemv_job jd = job_of(2, Wd, Yd, LDd);
    jd.x[1] = s->sh_gate_up;
    jd.ldx[1] = 2 * SI;
    jd.xoff[1] = SI;
    jd.plain[1] = 1;
    if (d.sh_down.cols != I || T > 1) jd.n = 1; // one token only; same widths to share the staging
    if (jd.n == 2) { // the MoE combine in the down GEMV's last block
        jd.tail.kind = TAIL_COMBINE;
        jd.tail.done = s->tail_done + l;
        jd.tail.x = s->x;
        jd.tail.ye = s->moe_y;
        jd.tail.shy = s->sh_y;
        jd.tail.sg = s->sh_gate_logit;
        jd.tail.topw = s->topw;
        jd.tail.K = K;
        jd.tail.H = H;
    }
    if (gemv(s, jd, XM_SWIGLU, s->moe_gate_up, 2 * I, I, s->topi, 1, slots, err) < 0) return -1;
    done = jd.n == 2;
    return 0;
}

// A prefill's shared expert on s->st2 (the router, one wave of 192 slow blocks, and the
// top-k/scan/scatter leave most of the GPU idle for ~130 us a layer; the shared expert's GEMMs, ~135 us in
// line, fill it): xn's split (which the router and the routed experts read too, and nothing rewrites
// before the combine), then on st2 the gate/up pair (SwiGLU's split into sh_down_hi/lo/sums) and the down
// into sh_y; ev_join marks the end. Where it applies (moe_side_ok) only.
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
    float *const Y[2] = {s->sh_gate_up, s->sh_gate_up + SI}; // (not written: the pair's epilogue writes sh_d*)
    const int64_t L[2] = {2 * SI, 2 * SI};
    float *const Yd[1] = {s->sh_y};
    const int64_t Ld[1] = {H};
    __nv_bfloat16 *const dx[3] = {s->sh_down_hi, s->sh_down_lo, s->sh_down_sums};
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
    float *const Y[4] = {s->router_logits, s->sh_gate_up, s->sh_gate_up + SI, s->sh_gate_logit};
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
        float *const Yr[2] = {s->router_logits, s->sh_gate_logit};
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
        pdl_launch(s, k_topk_reg<1>, T, 32, 0, s->router_logits, E, K, c->norm_topk, s->topi, s->topw, grouped ? s->counts : nullptr);
    else if (E <= 64)
        pdl_launch(s, k_topk_reg<2>, T, 32, 0, s->router_logits, E, K, c->norm_topk, s->topi, s->topw, grouped ? s->counts : nullptr);
    else if (E <= 128)
        pdl_launch(s, k_topk_reg<4>, T, 32, 0, s->router_logits, E, K, c->norm_topk, s->topi, s->topw, grouped ? s->counts : nullptr);
    else if (E <= 256)
        pdl_launch(s, k_topk_reg<8>, T, 32, 0, s->router_logits, E, K, c->norm_topk, s->topi, s->topw, grouped ? s->counts : nullptr);
    else
        pdl_launch(s, k_topk, T, 32, sizeof(float) * (size_t)E, s->router_logits, E, K, c->norm_topk, s->topi, s->topw,
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
        float *const Yg[2] = {s->moe_gate_up, s->moe_gate_up + I};
        const int64_t LDg[2] = {2 * I, 2 * I};
        const int down_groups = T == 1 ? moe_down_mg(d.exp_down, d.sh_down, K) : 0;
        if (tk_pro && down_groups && s->moe_split_groups && moe_split_ok(d.exp_gate, d.exp_up, H, I, K, E)) {
            // top-k, gate/up, SwiGLU, down and the combine in one kernel without a grid barrier (k_moe_split)
            const int split_groups = s->moe_split_groups;
            const unsigned grid = (unsigned)moe_split_grid(K, I, d.sh_down.cols, split_groups);
#define SPLIT(N) pdl_launch(s, k_moe_split<N>, grid, MOE_SPLIT_THREADS, moe_split_smem(H, N), d.exp_gate, d.exp_up, d.exp_down, d.sh_down,   \
                            (const float *)s->xn, H, (const float *)s->router_logits, E, c->norm_topk, (const float *)s->sh_gate_up, I,       \
                            d.sh_down.cols, (const float *)s->sh_gate_logit, K, s->moe_acc, s->moe_count, s->x,  \
                            l == s->moe_prof_layer ? s->moe_prof : (unsigned long long *)nullptr)
            if (split_groups == 2) SPLIT(2);
            else SPLIT(1);
#undef SPLIT
            CKL();
            prof_mark(s, PH_MOE_EXPERTS);
            return 0;
        }
        gemv_job j = job_of(2, Wg, Yg, LDg);
        if (tk_pro) { // block (0,0) leaves the top-k in topi/topw for the down projections
            j.tk_logits = s->router_logits;
            j.tk_E = E;
            j.tk_K = K;
            j.tk_norm = c->norm_topk;
            j.tk_topi = s->topi;
            j.tk_topw = s->topw;
        }
        if (gemv(s, j, XM_PLAIN, s->xn, H, 0, s->topi, K, slots, err) < 0) return -1;
        if (down_groups) {
            // Routed and shared down projections and the combine into x, one kernel (k_moe_down).
            const unsigned nb = (unsigned)((H + 15) / 16);
            const size_t sm = moe_down_smem(I, K);
            if (down_groups == 1) pdl_launch(s, k_moe_down<1>, nb, 256, sm, d.exp_down, d.sh_down, (const float *)s->moe_gate_up,
                                    (const float *)s->sh_gate_up, I, (const int *)s->topi, (const float *)s->topw, (const float *)s->sh_gate_logit, K, s->x);
            else pdl_launch(s, k_moe_down<2>, nb, 256, sm, d.exp_down, d.sh_down, (const float *)s->moe_gate_up,
                            (const float *)s->sh_gate_up, I, (const int *)s->topi, (const float *)s->topw, (const float *)s->sh_gate_logit, K, s->x);
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
            float *const Ygu[2] = {s->moe_gate_up, s->moe_gate_up + I};
            const int64_t Lgu[2] = {2 * I, 2 * I};
            float *const Yd[1] = {s->moe_y};
            const int64_t Ld[1] = {H};
            if (s->gemm_pair && d.exp_gate.bits == 4) { // gate and up in one block, the down's input split in its epilogue (k_split_x<1> is 3.3 ms at 4k)
                __nv_bfloat16 *const dx[3] = {s->down_hi, s->down_lo, s->down_sums};
                if (gemm_q(s, 2, Wgu, Ygu, Lgu, T, s->offs, max_tiles, K, err, nullptr, dx) < 0 ||
                    gemm_q(s, 1, &d.exp_down, Yd, Ld, T, s->offs, max_tiles, 1, err, dx) < 0)
                    return -1;
            } else {
                if (gemm_q(s, 2, Wgu, Ygu, Lgu, T, s->offs, max_tiles, K, err) < 0) return -1;
                // down: its input is SwiGLU of each slot's gate/up row
                if (split_x(s, s->moe_gate_up, 2 * I, I, XM_SWIGLU, slots, I, err) < 0) return -1;
                if (gemm_q(s, 1, &d.exp_down, Yd, Ld, T, s->offs, max_tiles, 1, err) < 0) return -1;
            }
        } else {
            dim3 g((unsigned)((I + TC_BM - 1) / TC_BM), (unsigned)((T + TC_BN - 1) / TC_BN), (unsigned)E);
            pdl_launch(s, k_gemm_tc<XM_PLAIN>, g, 128, 0, d.exp_gate, s->xn, H, 0, s->moe_gate_up, 2 * I, T, s->offs, s->sorted, K);
            CKL();
            pdl_launch(s, k_gemm_tc<XM_PLAIN>, g, 128, 0, d.exp_up, s->xn, H, 0, s->moe_gate_up + I, 2 * I, T, s->offs, s->sorted, K);
            CKL();
            dim3 gd((unsigned)((H + TC_BM - 1) / TC_BM), (unsigned)((T + TC_BN - 1) / TC_BN), (unsigned)E);
            pdl_launch(s, k_gemm_tc<XM_SWIGLU>, gd, 128, 0, d.exp_down, s->moe_gate_up, 2 * I, I, s->moe_y, H, T, s->offs, s->sorted, 1);
            CKL();
        }
    }
    prof_mark(s, PH_MOE_EXPERTS);
    if (!shared_done && matmul(s, d.sh_down, s->sh_gate_up, 2 * SI, s->sh_y, H, T, XM_SWIGLU, SI, err) < 0) return -1;
    if (combined) return 0;
    if (side) CK(cudaStreamWaitEvent(s->st, s->ev_join, 0)); // the shared expert's sh_y
    const dim3 gc((unsigned)T, next_gain ? 1u : (unsigned)((H / 4 + 255) / 256)); // (four columns a thread)
    const g4_split sp = next_gain ? norm_split(s, T, H) : g4_split{nullptr, nullptr, nullptr, nullptr};
    pdl_launch(s, k_moe_combine, gc, 256, 0, s->x, s->moe_y, s->topw, K, s->sh_y, s->sh_gate_logit, H, next_gain,
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
