// test_matmul.cu — the quantized matrix products of the CUDA backend against
// plain CPU loops written here (run on the device: build/cuda-tests/test_matmul;
// no model needed).
//
// Matrices are random MLX affine tensors (codes in u32 words, bf16 scale and bias
// per group of 64 or 32 columns), uploaded and repacked by k_repack4 exactly as
// up_mat does, at the model's shapes (in_proj 8192 x 2048, out_proj 2048 x 4096,
// experts 512 x 2048 and 2048 x 512, router 256 x 2048 at 8 bits, rows that are
// not a multiple of 16). The reference is the dequantised product in double.
//   - k_gemv (decode): the tensor-core path over the packed layout and row_dot
//     (8-bit, 4-bit MLX layout with group 64 and 32), input modes plain / RMSNorm
//     with gain (and the normalised row written out) / SwiGLU, several matrices in
//     one launch, accumulation into y, expert mode over routed slots (one shared
//     input row, or one row per slot), launched as gemv() in cuda_backend.cu does.
//   - k_moe_down (decode): routed + shared down projections and the MoE combine.
//   - k_split_x + k_gemm_q<4|8> (prefill): 1 .. 200 tokens, tile edges (64, 65),
//     several matrices per launch, a SwiGLU input split, and rows of 1e5x different
//     size in one launch (each token's error against its own largest value).
// Bar: max|gpu - ref| / max|ref| <= 1e-4 (the products are f32-faithful: codes
// exact; the input as three int8 pieces per group (4-bit: 2^-21 of the group's
// largest value) or two bf16 parts (8-bit); measured ~1e-7 .. 1e-5). Outputs are
// NaN-poisoned first; a NaN or an infinity fails.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "../unit/check.h"
#include "cuda_test.h"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_gemm_tc.cuh"
#include "backend/cuda/cuda_gdn.cuh"
#include "backend/cuda/cuda_attn_split.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_argmax.cuh"
#include "backend/cuda/cuda_packed.cuh"
#include "backend/cuda/cuda_gemm_wg.cuh"

static const double BAR = 1e-4;
static bool quick, time_gemm;
static bool have_wg; // sm_90: k_gemm_wg (wgmma) runs too

// ---------------------------------------------------------------- a random affine matrix, host and device

struct qmat {
    int bits, group;
    int64_t rows, cols; // per expert
    int experts;
    std::vector<uint32_t> q;
    std::vector<__nv_bfloat16> s, b;
    dbuf<uint32_t> *dq = nullptr;
    dbuf<__nv_bfloat16> *ds = nullptr, *db = nullptr;
    dbuf<uint4> *dpk = nullptr;
    dbuf<uint32_t> *dpsb = nullptr;
    dmat W;   // the packed view when 4-bit group 64, else the MLX layout
    dmat mlx; // always the MLX layout (row_dot)
    ~qmat() { delete dq; delete ds; delete db; delete dpk; delete dpsb; }
    std::vector<float> deq; // every weight, dequantised once (s * q + b, from the MLX layout)
    float w(int e, int64_t r, int64_t c) const { return deq[(size_t)(((int64_t)e * rows + r) * cols + c)]; }
};

// deq = false: no dequantised copy (timing only: the model's 256 experts would take GBs of host memory)
static qmat *make_qmat(int64_t rows, int64_t cols, int bits, int group, int experts = 1, bool deq = true) {
    qmat *m = new qmat();
    m->bits = bits;
    m->group = group;
    m->rows = rows;
    m->cols = cols;
    m->experts = experts;
    const int64_t R = rows * experts, ng = cols / group;
    m->q.resize((size_t)(R * cols * bits / 32));
    for (auto &w : m->q) w = (uint32_t)rnd();
    m->s.resize((size_t)(R * ng));
    m->b.resize((size_t)(R * ng));
    const float qmax = (float)((1 << bits) - 1);
    for (size_t i = 0; i < m->s.size(); i++) { // w in about [-0.05, 0.05], as trained weights
        m->s[i] = __float2bfloat16((0.02f + 0.08f * rnd_unit()) / qmax);
        m->b[i] = __float2bfloat16(rnd_sym(0.05f));
    }
    if (deq) m->deq.resize((size_t)(R * cols));
    for (int64_t row = 0; row < (deq ? R : 0); row++)
        for (int64_t c = 0; c < cols; c++) {
            const uint32_t word = m->q[(size_t)(row * (cols * bits / 32) + c * bits / 32)];
            const uint32_t code = (word >> ((c % (32 / bits)) * bits)) & ((1u << bits) - 1u);
            const int64_t g = row * ng + c / group;
            m->deq[(size_t)(row * cols + c)] = __bfloat162float(m->s[(size_t)g]) * (float)code + __bfloat162float(m->b[(size_t)g]);
        }
    m->dq = new dbuf<uint32_t>(m->q.size());
    m->ds = new dbuf<__nv_bfloat16>(m->s.size());
    m->db = new dbuf<__nv_bfloat16>(m->b.size());
    m->dq->put(m->q);
    m->ds->put(m->s);
    m->db->put(m->b);
    dmat &d = m->mlx;
    memset(&d, 0, sizeof d);
    d.type = 0;
    d.bits = bits;
    d.group = group;
    d.rows = rows;
    d.cols = cols;
    d.stride = rows;
    d.n_experts = experts;
    d.q = m->dq->p;
    d.s = m->ds->p;
    d.b = m->db->p;
    m->W = d;
    if (pk_ok(d)) { // as up_mat: repack, the packed view drops the MLX pointers
        const int64_t rb = (rows + 15) / 16, n = (int64_t)experts * rb * (cols / 64) * 32;
        m->dpk = new dbuf<uint4>((size_t)n);
        m->dpsb = new dbuf<uint32_t>((size_t)(n / 2));
        k_repack4<<<(unsigned)std::min<int64_t>((n + 255) / 256, 1 << 16), 256>>>(d, rb, m->dpk->p, m->dpsb->p);
        CKL();
        m->W.pk = m->dpk->p;
        m->W.psb = m->dpsb->p;
        m->W.pk_rb = rb;
        m->W.q = nullptr;
        m->W.s = m->W.b = nullptr;
    }
    return m;
}

// max|a - ref| / max|ref|; infinite where a holds a NaN or an infinity (std::max would skip a NaN)
static double rel_err(const std::vector<float> &a, const std::vector<double> &ref) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!std::isfinite(a[i])) return INFINITY;
        num = std::max(num, fabs((double)a[i] - ref[i]));
        den = std::max(den, fabs(ref[i]));
    }
    return den > 0 ? num / den : num;
}

static std::vector<float> rand_vec(size_t n, float a) {
    std::vector<float> v(n);
    for (auto &x : v) x = rnd_sym(a);
    return v;
}
static float silu_h(float v) { return v / (1.0f + expf(-v)); }

// ---------------------------------------------------------------- k_gemv, launched as gemv() does

// The grid gemv_launch aims for: every GEMV case runs at several (main), so a
// block's loop over row-block sets is tested with one set per block (0), the
// backend's choice (two blocks per SM) and a few blocks with long, ragged loops (7).
static int g_blocks;

static void launch_gemv(gemv_job &j, int xm, const float *x, int64_t ldx, int64_t xoff, const int *topi, int x_div,
                        int slots) {
    CK(gemv_launch(0, false, j, xm, x, ldx, xoff, topi, x_div, slots, g_blocks));
    CKL();
}

static gemv_job new_job() {
    gemv_job j;
    memset(&j, 0, sizeof j);
    return j;
}

// One matrix, one input row: plain, accumulate, RMSNorm (+ the normalised row out), SwiGLU.
static void gemv_case(const char *what, qmat *m, bool packed_view, int xm, bool accum) {
    const int64_t R = m->rows, C = m->cols;
    const int64_t xw = xm == XM_SWIGLU ? 2 * C : C;
    std::vector<float> x = rand_vec((size_t)xw, 2.0f), gain = rand_vec((size_t)C, 1.5f), y0 = rand_vec((size_t)R, 1.0f);
    // the input the matrix sees
    std::vector<double> xin((size_t)C);
    double ss = 0.0;
    for (int64_t c = 0; c < C; c++) ss += (double)x[(size_t)c] * x[(size_t)c];
    const double inv = 1.0 / sqrt(ss / (double)C + 1e-6);
    for (int64_t c = 0; c < C; c++) {
        if (xm == XM_SWIGLU) xin[(size_t)c] = (double)silu_h(x[(size_t)c]) * x[(size_t)(C + c)];
        else if (xm == XM_NORM) xin[(size_t)c] = x[(size_t)c] * inv * gain[(size_t)c];
        else xin[(size_t)c] = x[(size_t)c];
    }
    std::vector<double> ref((size_t)R);
    for (int64_t r = 0; r < R; r++) {
        double a = accum ? y0[(size_t)r] : 0.0;
        for (int64_t c = 0; c < C; c++) a += (double)m->w(0, r, c) * xin[(size_t)c];
        ref[(size_t)r] = a;
    }
    dbuf<float> dx((size_t)xw), dy((size_t)R), dg((size_t)C), dxn((size_t)C);
    dx.put(x);
    dy.put(y0);
    dg.put(gain);
    gemv_job j = new_job();
    j.n = 1;
    j.W[0] = packed_view ? m->W : m->mlx;
    j.y[0] = dy.p;
    j.ldy[0] = R;
    j.accum[0] = accum;
    j.gain = dg.p;
    j.xn_out = xm == XM_NORM ? dxn.p : nullptr;
    j.eps = 1e-6f;
    launch_gemv(j, xm, dx.p, xw, C, nullptr, 1, 0);
    const double e = rel_err(dy.get(), ref);
    printf("  gemv %-40s %6lld x %-5lld rel err %.2e\n", what, (long long)R, (long long)C, e);
    CHECKF(e <= BAR, "gemv %s: rel err %.3e", what, e);
    if (xm == XM_NORM) { // the normalised row the GEMV wrote for later kernels
        std::vector<double> xr(xin.begin(), xin.end());
        const double en = rel_err(dxn.get(), xr);
        CHECKF(en <= 1e-6, "gemv %s: xn_out rel err %.3e", what, en);
    }
}

static void test_gemv_shapes(void) {
    struct { int64_t r, c; int bits, group; } S[] = {
        {8192, 2048, 4, 64}, {2048, 4096, 4, 64}, {512, 2048, 4, 64}, {2048, 512, 4, 64},
        {40, 2048, 4, 64},   {100, 512, 4, 64},   {256, 2048, 8, 64}, {1, 2048, 8, 64},
        {96, 1024, 4, 32},   {37, 256, 8, 32},
    };
    for (auto &s : S) {
        qmat *m = make_qmat(s.r, s.c, s.bits, s.group);
        char what[96];
        const bool pk = m->W.pk != nullptr;
        snprintf(what, sizeof what, "%d-bit g%d %s, plain", s.bits, s.group, pk ? "packed" : "row_dot");
        gemv_case(what, m, true, XM_PLAIN, false);
        if (pk) { // the same matrix through row_dot's 4-bit MLX branch
            snprintf(what, sizeof what, "4-bit g64 row_dot (MLX layout), plain");
            gemv_case(what, m, false, XM_PLAIN, false);
        }
        snprintf(what, sizeof what, "%d-bit g%d %s, rmsnorm+gain, accum", s.bits, s.group, pk ? "packed" : "row_dot");
        gemv_case(what, m, true, XM_NORM, true);
        snprintf(what, sizeof what, "%d-bit g%d %s, swiglu", s.bits, s.group, pk ? "packed" : "row_dot");
        gemv_case(what, m, true, XM_SWIGLU, false);
        delete m;
        if (quick && s.r == 2048 && s.c == 4096) break;
    }
}

// Several matrices of one input in one launch (the layer's input projections).
static void test_gemv_multi(void) {
    const int64_t C = 2048;
    qmat *a = make_qmat(1024, C, 4, 64), *b = make_qmat(32, C, 4, 64), *r = make_qmat(64, C, 8, 64);
    qmat *ms[3] = {a, b, r};
    std::vector<float> x = rand_vec((size_t)C, 2.0f), gain = rand_vec((size_t)C, 1.5f);
    double ss = 0.0;
    for (float v : x) ss += (double)v * v;
    const double inv = 1.0 / sqrt(ss / (double)C + 1e-6);
    dbuf<float> dx((size_t)C), dg((size_t)C);
    dx.put(x);
    dg.put(gain);
    std::vector<dbuf<float> *> dy;
    gemv_job j = new_job();
    j.n = 3;
    for (int i = 0; i < 3; i++) {
        dy.push_back(new dbuf<float>((size_t)ms[i]->rows));
        j.W[i] = ms[i]->W;
        j.y[i] = dy[(size_t)i]->p;
        j.ldy[i] = ms[i]->rows;
    }
    j.gain = dg.p;
    j.eps = 1e-6f;
    launch_gemv(j, XM_NORM, dx.p, C, 0, nullptr, 1, 0);
    for (int i = 0; i < 3; i++) {
        std::vector<double> ref((size_t)ms[i]->rows);
        for (int64_t rr = 0; rr < ms[i]->rows; rr++) {
            double acc = 0.0;
            for (int64_t c = 0; c < C; c++) acc += (double)ms[i]->w(0, rr, c) * (x[(size_t)c] * inv * gain[(size_t)c]);
            ref[(size_t)rr] = acc;
        }
        const double e = rel_err(dy[(size_t)i]->get(), ref);
        printf("  gemv job of 3 matrices: matrix %d (%lld rows, %d-bit) rel err %.2e\n", i, (long long)ms[i]->rows,
               ms[i]->bits, e);
        CHECKF(e <= BAR, "multi-matrix job, matrix %d: rel err %.3e", i, e);
        delete dy[(size_t)i];
        delete ms[i];
    }
}

// Slot k's output rows: expert ids[k] of g times the shared input row x, in double.
static std::vector<double> experts_ref(const qmat *g, const std::vector<int> &ids, const std::vector<float> &x) {
    std::vector<double> ref(ids.size() * (size_t)g->rows);
    for (size_t k = 0; k < ids.size(); k++)
        for (int64_t r = 0; r < g->rows; r++) {
            double a = 0.0;
            for (int64_t c = 0; c < g->cols; c++) a += (double)g->w(ids[k], r, c) * x[(size_t)c];
            ref[k * (size_t)g->rows + (size_t)r] = a;
        }
    return ref;
}

// Expert mode with the router's top-k made in the GEMV's blocks from the
// logits (tk_logits): the ids and weights block (0,0) leaves for the down
// projections against a CPU top-k (softmax over all E, the K largest, ties to
// the lowest index, renormalised when norm), with ties at the top and across
// the K-th place, and the gate outputs of the experts it picked.
static void topk_gemv_case(int E, int64_t I, int64_t H, int norm) {
    const int K = 8;
    qmat *g = make_qmat(I, H, 4, 64, E);
    std::vector<float> x = rand_vec((size_t)H, 2.0f), lg = rand_vec((size_t)E, 3.0f);
    std::vector<int> order((size_t)E);
    for (int e = 0; e < E; e++) order[(size_t)e] = e;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return lg[(size_t)a] > lg[(size_t)b]; });
    lg[(size_t)order[1]] = lg[(size_t)order[0]];         // a tie at the top
    lg[(size_t)order[K]] = lg[(size_t)order[K - 1]];     // a tie across the K-th place
    double mx = -1e300, sum = 0.0;
    for (float v : lg) mx = std::max(mx, (double)v);
    std::vector<double> p((size_t)E);
    for (int e = 0; e < E; e++) sum += (p[(size_t)e] = exp((double)lg[(size_t)e] - mx));
    std::vector<int> want;
    std::vector<bool> used((size_t)E, false);
    double tot = 0.0;
    for (int k = 0; k < K; k++) {
        int b = -1;
        for (int e = 0; e < E; e++)
            if (!used[(size_t)e] && (b < 0 || p[(size_t)e] > p[(size_t)b])) b = e;
        used[(size_t)b] = true;
        want.push_back(b);
        tot += p[(size_t)b] / sum;
    }
    const std::vector<int> decoy = {0, 1, 2, 3, 4, 5, 6, 7}; // ids the kernel must not use
    dbuf<float> dx((size_t)H), dy((size_t)(K * I)), dlg((size_t)E), dtw((size_t)K);
    dbuf<int> dti((size_t)K), dt((size_t)K);
    dx.put(x);
    dlg.put(lg);
    dt.put(decoy);
    gemv_job j = new_job();
    j.n = 1;
    j.W[0] = g->W;
    j.y[0] = dy.p;
    j.ldy[0] = I;
    j.tk_logits = dlg.p;
    j.tk_E = E;
    j.tk_K = K;
    j.tk_norm = norm;
    j.tk_topi = dti.p;
    j.tk_topw = dtw.p;
    launch_gemv(j, XM_PLAIN, dx.p, H, 0, dt.p, K, K);
    const std::vector<int> got = dti.get();
    const std::vector<float> gw = dtw.get();
    double werr = 0.0;
    bool same = true;
    for (int k = 0; k < K; k++) {
        same &= got[(size_t)k] == want[(size_t)k];
        const double w = p[(size_t)want[(size_t)k]] / sum / (norm ? tot : 1.0);
        werr = std::max(werr, fabs(gw[(size_t)k] - w));
    }
    const double e = rel_err(dy.get(), experts_ref(g, want, x));
    printf("  gemv experts, top-k made in-kernel (E=%d, norm %d): ids %s, weights max err %.1e, rel err %.2e\n", E, norm,
           same ? "identical" : "DIFFER", werr, e);
    CHECKF(same, "in-kernel top-k (E=%d): expert ids differ from the reference", E);
    CHECKF(werr <= 1e-6, "in-kernel top-k (E=%d): weights off by %.3e", E, werr);
    CHECKF(e <= BAR, "expert gate, in-kernel top-k (E=%d): rel err %.3e", E, e);
    delete g;
}

// Expert mode: gate/up (one input row for every slot, x_div = K) and down
// (slot k reads row k of a SwiGLU input; with the shared expert's down as a
// plain matrix computed by slot 0 only, as moe_layer launches it).
static void test_gemv_experts(void) {
    const int E = 16, K = 8;
    const int64_t H = 2048, I = 512;
    std::vector<int> topi = {3, 15, 0, 7, 8, 2, 11, 5};
    dbuf<int> dt((size_t)K);
    dt.put(topi);
    { // gate: slots share the input row
        qmat *g = make_qmat(I, H, 4, 64, E);
        std::vector<float> x = rand_vec((size_t)H, 2.0f);
        dbuf<float> dx((size_t)H), dy((size_t)(K * I));
        dx.put(x);
        gemv_job j = new_job();
        j.n = 1;
        j.W[0] = g->W;
        j.y[0] = dy.p;
        j.ldy[0] = I;
        launch_gemv(j, XM_PLAIN, dx.p, H, 0, dt.p, K, K);
        const double e = rel_err(dy.get(), experts_ref(g, topi, x));
        printf("  gemv experts: gate 8 of 16 experts (512 x 2048), shared input   rel err %.2e\n", e);
        CHECKF(e <= BAR, "expert gate: rel err %.3e", e);
        delete g;
    }
    topk_gemv_case(16, 512, 2048, 1); // the gate's shape
    topk_gemv_case(256, 16, 64, 1);   // the router's width: every register of topk_warp<8> holds logits
    topk_gemv_case(256, 16, 64, 0);   // weights not renormalised
    { // down: slot k's input is silu(gu[k][c]) * gu[k][I + c]; the shared expert's down beside it
        qmat *dn = make_qmat(H, I, 4, 64, E), *sh = make_qmat(H, I, 4, 64);
        std::vector<float> gu = rand_vec((size_t)(K * 2 * I), 2.0f), shgu = rand_vec((size_t)(2 * I), 2.0f);
        dbuf<float> dgu(gu.size()), dsh(shgu.size()), dy((size_t)(K * H)), dys((size_t)H);
        dgu.put(gu);
        dsh.put(shgu);
        gemv_job j = new_job();
        j.n = 2;
        j.W[0] = dn->W;
        j.y[0] = dy.p;
        j.ldy[0] = H;
        j.W[1] = sh->W;
        j.y[1] = dys.p;
        j.ldy[1] = H;
        j.x[1] = dsh.p;
        j.ldx[1] = 2 * I;
        j.xoff[1] = I;
        j.plain[1] = 1;
        launch_gemv(j, XM_SWIGLU, dgu.p, 2 * I, I, dt.p, 1, K);
        std::vector<double> ref((size_t)(K * H)), refs((size_t)H);
        for (int k = 0; k < K; k++)
            for (int64_t r = 0; r < H; r++) {
                double a = 0.0;
                for (int64_t c = 0; c < I; c++)
                    a += (double)dn->w(topi[(size_t)k], r, c) * ((double)silu_h(gu[(size_t)(k * 2 * I + c)]) *
                                                                gu[(size_t)(k * 2 * I + I + c)]);
                ref[(size_t)(k * H + r)] = a;
            }
        for (int64_t r = 0; r < H; r++) {
            double a = 0.0;
            for (int64_t c = 0; c < I; c++) a += (double)sh->w(0, r, c) * ((double)silu_h(shgu[(size_t)c]) * shgu[(size_t)(I + c)]);
            refs[(size_t)r] = a;
        }
        const double e = rel_err(dy.get(), ref), es = rel_err(dys.get(), refs);
        printf("  gemv experts: down 8 of 16 experts (2048 x 512), row per slot rel err %.2e; shared down %.2e\n", e, es);
        CHECKF(e <= BAR, "expert down: rel err %.3e", e);
        CHECKF(es <= BAR, "shared down beside the routed ones: rel err %.3e", es);
        delete dn;
        delete sh;
    }
}

// ---------------------------------------------------------------- k_gemm_q (prefill)

// k_moe_down: the routed down projections of K slots, the shared expert's and
// the combine into the residual row, against x0 + sigmoid(sg) Ws·swiglu(shgu) +
// Σ_k topw[k] Wd[topi[k]]·swiglu(gu_k) in double. Widths of 1, 8 and 16 groups
// (the kernel's two instances), K = 8 and fewer, rows not a multiple of 16.
static void moe_down_case(int64_t H, int64_t I, int K, int E) {
    qmat *dn = make_qmat(H, I, 4, 64, E), *sh = make_qmat(H, I, 4, 64);
    std::vector<int> topi((size_t)K);
    for (int k = 0; k < K; k++) topi[(size_t)k] = (k * 7 + 3) % E; // distinct for E >= 8 (7 is prime to E here)
    std::vector<float> gu = rand_vec((size_t)(K * 2 * I), 2.0f), shgu = rand_vec((size_t)(2 * I), 2.0f),
                       x0 = rand_vec((size_t)H, 1.0f), topw((size_t)K), sg = {0.7f};
    for (auto &w : topw) w = 0.05f + 0.2f * rnd_unit();
    dbuf<float> dgu(gu.size()), dsh(shgu.size()), dx((size_t)H), dw((size_t)K), dsg(1);
    dbuf<int> dt((size_t)K);
    dgu.put(gu);
    dsh.put(shgu);
    dx.put(x0);
    dw.put(topw);
    dsg.put(sg);
    dt.put(topi);
    const int mg = moe_down_mg(dn->W, sh->W, K);
    CHECKF(mg > 0, "k_moe_down refused %lld x %lld", (long long)H, (long long)I);
    if (mg == 0) return;
    const unsigned nb = (unsigned)((H + 15) / 16);
    const size_t sm = moe_down_smem(I, K);
    if (mg == 1) k_moe_down<1><<<nb, 256, sm>>>(dn->W, sh->W, dgu.p, dsh.p, I, dt.p, dw.p, dsg.p, K, dx.p);
    else k_moe_down<2><<<nb, 256, sm>>>(dn->W, sh->W, dgu.p, dsh.p, I, dt.p, dw.p, dsg.p, K, dx.p);
    CKL();
    std::vector<double> ref((size_t)H);
    const double gs = 1.0 / (1.0 + exp(-(double)sg[0]));
    for (int64_t r = 0; r < H; r++) {
        double a = 0.0;
        for (int64_t c = 0; c < I; c++) a += (double)sh->w(0, r, c) * ((double)silu_h(shgu[(size_t)c]) * shgu[(size_t)(I + c)]);
        a *= gs;
        for (int k = 0; k < K; k++) {
            double e = 0.0;
            for (int64_t c = 0; c < I; c++)
                e += (double)dn->w(topi[(size_t)k], r, c) *
                     ((double)silu_h(gu[(size_t)(k * 2 * I + c)]) * gu[(size_t)(k * 2 * I + I + c)]);
            a += topw[(size_t)k] * e;
        }
        ref[(size_t)r] = x0[(size_t)r] + a;
    }
    const double e = rel_err(dx.get(), ref);
    printf("  moe_down %5lld x %-5lld K=%d of %d experts (+ shared, combined into x) rel err %.2e\n", (long long)H,
           (long long)I, K, E, e);
    CHECKF(e <= BAR, "k_moe_down %lld x %lld K=%d: rel err %.3e", (long long)H, (long long)I, K, e);
    delete dn;
    delete sh;
}

static void test_moe_down(void) {
    moe_down_case(2048, 512, 8, 16); // the model's shape
    moe_down_case(2048, 512, 3, 16);
    moe_down_case(100, 1024, 8, 9);  // 16 groups; rows not a multiple of 16
    moe_down_case(40, 64, 1, 2);     // one group: warp 0 alone
}

// k_moe_split: the router's top-k from the logits, gate/up and SwiGLU of the K routed experts on
// xn, their down projections and the shared expert's (shared units of nsg groups), against
//   x0 + sigmoid(sg) Ws·swiglu(shgu) + Σ_k w_k Wd[e_k]·(silu(Wg[e_k] xn) * (Wu[e_k] xn))
// in double, with e_k / w_k the top-K of softmax(logits) (ties: lowest id; renormalised when
// norm). Every unit a block, as the backend launches it; the fixed-point sums and the arrival
// count must be left at zero for the next launch.
static void moe_split_case(int64_t H, int64_t I, int K, int E, int norm, int nsg) {
    qmat *gt = make_qmat(I, H, 4, 64, E), *up = make_qmat(I, H, 4, 64, E), *dn = make_qmat(H, I, 4, 64, E),
         *sh = make_qmat(H, I, 4, 64);
    std::vector<float> xn = rand_vec((size_t)H, 2.0f), shgu = rand_vec((size_t)(2 * I), 2.0f), x0 = rand_vec((size_t)H, 1.0f),
                       lg = rand_vec((size_t)E, 3.0f), sg = {-0.4f};
    if (E > 5) lg[3] = lg[5] = 9.0f; // a tie at the top: id 3 first
    // the reference top-k
    std::vector<double> p((size_t)E);
    double mx = -1e300, z = 0.0;
    for (int e = 0; e < E; e++) mx = std::max(mx, (double)lg[(size_t)e]);
    for (int e = 0; e < E; e++) z += p[(size_t)e] = exp((double)lg[(size_t)e] - mx);
    std::vector<int> ids((size_t)E);
    for (int e = 0; e < E; e++) ids[(size_t)e] = e;
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return lg[(size_t)a] > lg[(size_t)b]; });
    double tot = 0.0;
    for (int k = 0; k < K; k++) tot += p[(size_t)ids[(size_t)k]] / z;
    dbuf<float> dxn(xn.size()), dsh(shgu.size()), dx((size_t)H), dlg(lg.size()), dsg(1);
    dxn.put(xn);
    dsh.put(shgu);
    dx.put(x0);
    dlg.put(lg);
    dsg.put(sg);
    const int mg = moe_down_mg(dn->W, sh->W, K);
    const bool ok = mg > 0 && moe_split_ok(gt->W, up->W, H, I, K, E);
    CHECKF(ok, "k_moe_split refused %lld x %lld", (long long)H, (long long)I);
    if (!ok) return;
    std::vector<float> got;
    int grid = 0;
    {
        const size_t smx = moe_split_smem(H, nsg);
        CK(cudaFuncSetAttribute(nsg == 2 ? k_moe_split<2> : k_moe_split<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smx));
        grid = (int)moe_split_grid(K, I, I, nsg);
        dbuf<unsigned long long> acc((size_t)H);
        dbuf<unsigned> cnt(1);
        acc.fill_bytes(0);
        cnt.fill_bytes(0);
        auto go = [&](unsigned long long *P) {
            if (nsg == 2) k_moe_split<2><<<(unsigned)grid, MOE_SPLIT_THREADS, smx>>>(gt->W, up->W, dn->W, sh->W, dxn.p, H, dlg.p, E, norm, dsh.p, I, I, dsg.p, K, acc.p, cnt.p, dx.p, P);
            else k_moe_split<1><<<(unsigned)grid, MOE_SPLIT_THREADS, smx>>>(gt->W, up->W, dn->W, sh->W, dxn.p, H, dlg.p, E, norm, dsh.p, I, I, dsg.p, K, acc.p, cnt.p, dx.p, P);
        };
        go(nullptr);
        CKL();
        got = dx.get();
        const std::vector<unsigned long long> left = acc.get();
        size_t nz = 0;
        for (unsigned long long v : left) nz += v != 0;
        CHECKF(nz == 0 && cnt.get()[0] == 0, "k_moe_split left %zu sums and count %u behind", nz, cnt.get()[0]);
        if (H == 2048 && I == 512 && E == 256) {
            cudaEvent_t a, b;
            CK(cudaEventCreate(&a));
            CK(cudaEventCreate(&b));
            for (int i = 0; i < 3; i++) go(nullptr);
            CK(cudaEventRecord(a));
            for (int i = 0; i < 20; i++) go(nullptr);
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float ms = 0.0f;
            CK(cudaEventElapsedTime(&ms, a, b));
            dbuf<unsigned long long> prof((size_t)MOE_SPLIT_MARKS * grid);
            go(prof.p);
            CKL();
            const std::vector<unsigned long long> tt = prof.get();
            printf("  moe_split timing: %.2f us per launch (20 in a row); us after the first routed unit's wait, median / max\n", 1000.0f * ms / 20);
            moe_split_timeline(stdout, tt.data(), grid, (int)moe_split_routed(K, I));
            CK(cudaEventDestroy(a));
            CK(cudaEventDestroy(b));
        }
    }
    std::vector<double> ref((size_t)H), act((size_t)(K * I));
    for (int k = 0; k < K; k++) {
        const int e = ids[(size_t)k];
        for (int64_t d = 0; d < I; d++) {
            double a = 0.0, b = 0.0;
            for (int64_t c = 0; c < H; c++) {
                a += (double)gt->w(e, d, c) * xn[(size_t)c];
                b += (double)up->w(e, d, c) * xn[(size_t)c];
            }
            act[(size_t)(k * I + d)] = a / (1.0 + exp(-a)) * b;
        }
    }
    const double gs = 1.0 / (1.0 + exp(-(double)sg[0]));
    for (int64_t r = 0; r < H; r++) {
        double a = 0.0;
        for (int64_t c = 0; c < I; c++) a += (double)sh->w(0, r, c) * ((double)silu_h(shgu[(size_t)c]) * shgu[(size_t)(I + c)]);
        a *= gs;
        for (int k = 0; k < K; k++) {
            double y = 0.0;
            for (int64_t c = 0; c < I; c++) y += (double)dn->w(ids[(size_t)k], r, c) * act[(size_t)(k * I + c)];
            const double w = p[(size_t)ids[(size_t)k]] / z;
            a += (norm ? w / tot : w) * y;
        }
        ref[(size_t)r] = x0[(size_t)r] + a;
    }
    const double e = rel_err(got, ref);
    printf("  moe_split %5lld x %-5lld K=%d of %3d experts, norm %d, grid %3d: x rel err %.2e\n", (long long)H, (long long)I, K,
           E, norm, grid, e);
    CHECKF(e <= BAR, "k_moe_split %lld x %lld K=%d grid %d: rel err %.3e", (long long)H, (long long)I, K, grid, e);
    delete gt;
    delete up;
    delete dn;
    delete sh;
}

static void test_moe_split(void) {
    moe_split_case(2048, 512, 8, 256, 1, 2); // the model's shape: 128 routed + 4 shared units
    moe_split_case(2048, 512, 8, 256, 0, 1);
    moe_split_case(2048, 512, 8, 64, 1, 2);
    moe_split_case(256, 1024, 3, 16, 1, 2);  // 16 down groups
    moe_split_case(128, 64, 2, 4, 1, 1);     // 4 routed units (2 slots x 64 dims / 32), one shared
}


// The 4-bit prefill GEMMs: 0 k_gemm_q<4>, 1 k_gemm_wg (the same tiles).
#define G4_VARIANTS 2
static const char *g4_name(int v) { return v ? "wg" : "q"; }
static void g4_attrs(void) {
    CK(cudaFuncSetAttribute(k_gemm_q<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g4_smem<4>()));
    CK(cudaFuncSetAttribute(k_gemm_q<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g4_smem<8>()));
    if (!have_wg) return;
    CK(cudaFuncSetAttribute(k_gemm_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wg_smem()));
}
static void g4_launch(int v, const g4_job &j, int64_t T, const __nv_bfloat16 *xh, const __nv_bfloat16 *xl, const float *xs,
                      const __nv_bfloat16 *xsw) {
    const dim3 g((unsigned)j.start[j.n], (unsigned)((T + G4_BN - 1) / G4_BN));
    if (v) k_gemm_wg<<<g, 256, wg_smem()>>>(j, xh, xl, xsw, (int)T, nullptr, nullptr, nullptr, nullptr, 1);
    else k_gemm_q<4><<<g, 256, g4_smem<4>()>>>(j, xh, xl, xs, (int)T, nullptr, nullptr, nullptr, nullptr, 1);
}

// amp > 0: every third input row scaled by amp (rows of very different size in one launch).
// v: which 4-bit GEMM (g4_launch); 8-bit matrices always take k_gemm_q<8>.
static void gemm_case(int64_t T, int n, qmat **ms, int xm, float amp = 0.0f, int v = 0) {
    const int64_t C = ms[0]->cols, xw = xm == 1 ? 2 * C : C;
    std::vector<float> x = rand_vec((size_t)(T * xw), 2.0f);
    if (amp > 0.0f)
        for (int64_t t = 0; t < T; t += 3)
            for (int64_t c = 0; c < xw; c++) x[(size_t)(t * xw + c)] *= (xm == 1 && c < C) ? 1.0f : amp;
    dbuf<float> dx(x.size());
    dx.put(x);
    dbuf<__nv_bfloat16> xh((size_t)(T * C)), xl((size_t)(T * C));
    dbuf<float> xs((size_t)(T * C / 64)), xsig((size_t)(T * C / 64));
    dbuf<int8_t> xq((size_t)(G4_NP * T * C)); // the pieces (read by the 4-bit GEMM)
    dbuf<__nv_bfloat16> xsw((size_t)wg_xsw_win(T, (int)(C / 64), 0)); // the group sums as k_gemm_wg reads them
    int8_t *xqp = xq.p;
    if (xm == 1) k_split_x<1><<<(unsigned)T, 256>>>(dx.p, xw, C, C, xh.p, xl.p, xs.p, xqp, xsig.p, T * C, xsw.p);
    else k_split_x<0><<<(unsigned)T, 256>>>(dx.p, xw, 0, C, xh.p, xl.p, xs.p, xqp, xsig.p, T * C, xsw.p);
    CKL();
    g4_job j;
    memset(&j, 0, sizeof j);
    j.n = n;
    j.xq = xqp;
    j.xsig = xsig.p;
    j.xq_plane = T * C;
    std::vector<dbuf<float> *> dy;
    for (int i = 0; i < n; i++) {
        dy.push_back(new dbuf<float>((size_t)(T * ms[i]->rows)));
        j.W[i] = ms[i]->W;
        j.y[i] = dy[(size_t)i]->p;
        CK(cudaMemset(dy[(size_t)i]->p, 0xFF, sizeof(float) * (size_t)(T * ms[i]->rows))); // NaN: every output must be written
        j.ldy[i] = ms[i]->rows;
        j.start[i + 1] = j.start[i] + (int)((ms[i]->rows + G4_BM - 1) / G4_BM);
    }
    const dim3 g((unsigned)j.start[n], (unsigned)((T + G4_BN - 1) / G4_BN));
    if (ms[0]->bits == 8) k_gemm_q<8><<<g, 256, g4_smem<8>()>>>(j, xh.p, xl.p, xs.p, (int)T, nullptr, nullptr, nullptr, nullptr, 1);
    else g4_launch(v, j, T, xh.p, xl.p, xs.p, xsw.p);
    CKL();
    for (int i = 0; i < n; i++) {
        const int64_t R = ms[i]->rows;
        std::vector<double> ref((size_t)(T * R)), size((size_t)T, 0.0);
        std::vector<double> xin((size_t)C);
        for (int64_t t = 0; t < T; t++) {
            for (int64_t c = 0; c < C; c++)
                xin[(size_t)c] = xm == 1 ? (double)silu_h(x[(size_t)(t * xw + c)]) * x[(size_t)(t * xw + C + c)]
                                         : (double)x[(size_t)(t * xw + c)];
            for (int64_t r = 0; r < R; r++) {
                double a = 0.0, aa = 0.0;
                for (int64_t c = 0; c < C; c++) {
                    a += (double)ms[i]->w(0, r, c) * xin[(size_t)c];
                    aa += fabs((double)ms[i]->w(0, r, c) * xin[(size_t)c]);
                }
                ref[(size_t)(t * R + r)] = a;
                // the size an output of these inputs has (sum |w x| / sqrt C: a random-signed sum's), so that a
                // token whose only row cancels to ~0 (the 1-row shared-expert gate) is not judged against ~0
                size[(size_t)t] = std::max(size[(size_t)t], std::max(fabs(a), aa / sqrt((double)C)));
            }
        }
        // per token: its rows' largest error against the token's own size (the x1e5 rows would hide the
        // others' errors in one global max), infinite on a NaN or an unwritten (NaN-poisoned) output
        const std::vector<float> got = dy[(size_t)i]->get();
        double e = 0.0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < R; r++) {
                const float g = got[(size_t)(t * R + r)];
                if (!std::isfinite(g)) e = INFINITY;
                else e = std::max(e, fabs((double)g - ref[(size_t)(t * R + r)]) / (size[(size_t)t] > 0 ? size[(size_t)t] : 1.0));
            }
        printf("  gemm_%s<%d> T=%-4lld matrix %d of %d (%5lld x %-5lld)%s%s rel err %.2e\n", ms[i]->bits == 8 ? "q" : g4_name(v),
               ms[i]->bits, (long long)T, i, n, (long long)R, (long long)C, xm == 1 ? " swiglu" : "       ",
               amp > 0.0f ? " x1e5 rows" : "", e);
        CHECKF(e <= BAR, "gemm_%s<%d> T=%lld matrix %d: rel err %.3e", ms[i]->bits == 8 ? "q" : g4_name(v), ms[i]->bits,
               (long long)T, i, e);
        delete dy[(size_t)i];
    }
}

// A job of one 4-bit matrix writing y (row stride: its rows), with k_split_x's pieces.
static g4_job one_job(const qmat *m, float *y, const int8_t *xq, const float *xsig, int64_t plane) {
    g4_job j;
    memset(&j, 0, sizeof j);
    j.n = 1;
    j.xq = xq;
    j.xsig = xsig;
    j.xq_plane = plane;
    j.W[0] = m->W;
    j.y[0] = y;
    j.ldy[0] = m->rows;
    j.start[1] = (int)((m->rows + G4_BM - 1) / G4_BM);
    return j;
}

// The routing of S slots (slot s to expert ex[s] of E) as the prefill MoE hands it to the grouped GEMM,
// built here as k_moe_scan / k_moe_scatter do: the slots sorted by expert (offs, sorted) and the (expert,
// 64 tokens) tile map, on the host and on the device.
struct tile_map {
    std::vector<int> sorted; // (before offs: build fills it, and tl, while offs is made)
    std::vector<int2> tl;
    std::vector<int> offs;
    int nt;
    dbuf<int> doffs, dsorted, dnt;
    dbuf<int2> dtiles;
    tile_map(const std::vector<int> &ex, int E) : offs(build(ex, E)), nt((int)tl.size()), doffs(offs.size()),
                                                  dsorted(sorted.size()), dnt(1), dtiles(tl.size()) {
        doffs.put(offs);
        dsorted.put(sorted);
        dtiles.put(tl);
        dnt.put(&nt);
    }
    std::vector<int> build(const std::vector<int> &ex, int E) {
        std::vector<int> o((size_t)E + 1, 0);
        std::vector<std::vector<int>> by((size_t)E);
        for (size_t sl = 0; sl < ex.size(); sl++) by[(size_t)ex[sl]].push_back((int)sl);
        for (int e = 0; e < E; e++) {
            o[(size_t)e] = (int)sorted.size();
            sorted.insert(sorted.end(), by[(size_t)e].begin(), by[(size_t)e].end());
            for (int n0 = 0; n0 < (int)by[(size_t)e].size(); n0 += G4_BN) tl.push_back(make_int2(e, n0));
        }
        o[(size_t)E] = (int)sorted.size();
        return o;
    }
};

// Grouped mode, as the prefill MoE launches it: T tokens x KS routing slots, slot s to expert
// (7s + s/5) % E; slots sorted by expert (offs, sorted) and the (expert, 64 tokens) tile map built
// here as k_moe_scan does, with two spare grid rows past n_tiles; input row slot / KS, output row
// slot. Against W_e x in double, each slot against its own size.
static void gemm_grouped_case(int64_t T, int KS, qmat *m, int v) {
    const int64_t C = m->cols, R = m->rows, S = T * KS;
    const int E = m->experts;
    std::vector<float> x = rand_vec((size_t)(T * C), 2.0f);
    std::vector<int> ex((size_t)S);
    for (int64_t sl = 0; sl < S; sl++) ex[(size_t)sl] = (int)((7 * sl + sl / 5) % E);
    tile_map tm(ex, E);
    const int nt = tm.nt;
    dbuf<float> dx(x.size());
    dx.put(x);
    dbuf<__nv_bfloat16> xh((size_t)(T * C)), xl((size_t)(T * C));
    dbuf<float> xs((size_t)(T * C / 64)), xsig((size_t)(T * C / 64)), dy((size_t)(S * R));
    dbuf<int8_t> xq((size_t)(G4_NP * T * C));
    dbuf<__nv_bfloat16> xsw((size_t)wg_xsw_win(T, (int)(C / 64), 0));
    k_split_x<0><<<(unsigned)T, 256>>>(dx.p, C, 0, C, xh.p, xl.p, xs.p, xq.p, xsig.p, T * C, xsw.p);
    CKL();
    dy.fill_bytes(0xFF); // NaN: every output must be written
    const g4_job j = one_job(m, dy.p, xq.p, xsig.p, T * C);
    const dim3 g((unsigned)j.start[1], (unsigned)nt + 2);
    if (v) k_gemm_wg<<<g, 256, wg_smem()>>>(j, xh.p, xl.p, xsw.p, (int)T, tm.doffs.p, tm.dsorted.p, tm.dtiles.p, tm.dnt.p, KS);
    else k_gemm_q<4><<<g, 256, g4_smem<4>()>>>(j, xh.p, xl.p, xs.p, (int)T, tm.doffs.p, tm.dsorted.p, tm.dtiles.p, tm.dnt.p, KS);
    CKL();
    const std::vector<float> got = dy.get();
    double e = 0.0;
    for (int64_t sl = 0; sl < S; sl++) {
        const float *xr = &x[(size_t)(sl / KS * C)];
        std::vector<double> ref((size_t)R);
        double size = 0.0;
        for (int64_t r = 0; r < R; r++) {
            double a = 0.0, aa = 0.0;
            for (int64_t c = 0; c < C; c++) {
                a += (double)m->w(ex[(size_t)sl], r, c) * xr[c];
                aa += fabs((double)m->w(ex[(size_t)sl], r, c) * xr[c]);
            }
            ref[(size_t)r] = a;
            size = std::max(size, std::max(fabs(a), aa / sqrt((double)C)));
        }
        for (int64_t r = 0; r < R; r++) {
            const float gv = got[(size_t)(sl * R + r)];
            e = std::isfinite(gv) ? std::max(e, fabs((double)gv - ref[(size_t)r]) / (size > 0 ? size : 1.0)) : INFINITY;
        }
    }
    printf("  gemm_%s<4> grouped: %lld tokens x %d slots over %d experts (%lld x %lld), %d tiles: rel err %.2e\n", g4_name(v),
           (long long)T, KS, E, (long long)R, (long long)C, nt, e);
    CHECKF(e <= BAR, "gemm_%s<4> grouped T=%lld: rel err %.3e", g4_name(v), (long long)T, e);
}

// k_gemm_wg's swiglu job (cuda_gemm4_tile.cuh), as the prefill MoE launches it: gate and up (E experts of I x C)
// in one block, SwiGLU's split of the down projection's input out of the epilogue. Against the unfused
// path on the device (the pair GEMM's gu, then k_split_x<1>): the same bytes, parts and group sums.
// E > 1: grouped over a tile map (T tokens x KS slots, slot s to expert (7s + s/5) % E); else plain.
static void gemm_pair_case(int E, int64_t I, int64_t C, int64_t T, int KS) {
    qmat *gm = make_qmat(I, C, 4, 64, E), *um = make_qmat(I, C, 4, 64, E);
    const int64_t S = T * KS;
    std::vector<int> ex((size_t)S);
    for (int64_t sl = 0; sl < S; sl++) ex[(size_t)sl] = (int)((7 * sl + sl / 5) % E);
    tile_map tm(ex, E);
    const bool grouped = E > 1;
    dbuf<float> dx((size_t)(T * C));
    dx.put(rand_vec((size_t)(T * C), 2.0f));
    dbuf<__nv_bfloat16> xh((size_t)(T * C)), xl((size_t)(T * C)), xsw((size_t)wg_xsw_win(T, (int)(C / 64), 0));
    dbuf<float> xs((size_t)(T * C / 64));
    k_split_x<0><<<(unsigned)T, 256>>>(dx.p, C, 0, C, xh.p, xl.p, xs.p, nullptr, nullptr, 0, xsw.p);
    CKL();
    const int *po = grouped ? tm.doffs.p : nullptr, *ps = grouped ? tm.dsorted.p : nullptr, *pn = grouped ? tm.dnt.p : nullptr;
    const int2 *pt = grouped ? tm.dtiles.p : nullptr;
    const unsigned gy = grouped ? (unsigned)tm.nt + 2 : (unsigned)((T + G4_BN - 1) / G4_BN);
    // unfused: gu[slot] = (gate | up), then k_split_x<1>
    dbuf<float> gu((size_t)(S * 2 * I));
    g4_job j;
    memset(&j, 0, sizeof j);
    j.n = 2;
    j.W[0] = gm->W, j.W[1] = um->W;
    j.y[0] = gu.p, j.y[1] = gu.p + I;
    j.ldy[0] = j.ldy[1] = 2 * I;
    j.start[1] = (int)((I + G4_BM - 1) / G4_BM), j.start[2] = 2 * j.start[1];
    k_gemm_wg<<<dim3((unsigned)j.start[2], gy), 256, wg_smem()>>>(j, xh.p, xl.p, xsw.p, (int)T, po, ps, pt, pn, KS);
    CKL();
    const int ngd = (int)(I / 64);
    dbuf<__nv_bfloat16> wh((size_t)(S * I)), wl((size_t)(S * I)), wsw((size_t)wg_xsw_win(S, ngd, 0));
    dbuf<float> ws((size_t)(S * ngd));
    k_split_x<1><<<(unsigned)S, 256>>>(gu.p, 2 * I, I, I, wh.p, wl.p, ws.p, nullptr, nullptr, 0, wsw.p);
    CKL();
    // the pair
    dbuf<__nv_bfloat16> oh((size_t)(S * I)), ol((size_t)(S * I)), osw((size_t)wg_xsw_win(S, ngd, 0));
    oh.fill_bytes(0xFF), ol.fill_bytes(0xFF), osw.fill_bytes(0xFF); // NaN: every value must be written
    g4_job pj = j;
    pj.swiglu = 1;
    pj.start[1] = pj.start[2] = ngd;
    pj.oh = oh.p, pj.ol = ol.p, pj.osw = osw.p;
    k_gemm_wg<<<dim3((unsigned)ngd, gy), 256, wg_smem()>>>(pj, xh.p, xl.p, xsw.p, (int)T, po, ps, pt, pn, KS);
    CKL();
    size_t bad = 0;
    const auto same = [&](dbuf<__nv_bfloat16> &a, dbuf<__nv_bfloat16> &b) {
        const std::vector<__nv_bfloat16> va = a.get(), vb = b.get();
        for (size_t i = 0; i < va.size(); i++) bad += memcmp(&va[i], &vb[i], 2) != 0;
    };
    same(oh, wh);
    same(ol, wl);
    same(osw, wsw);
    printf("  gemm_wg<4> swiglu pair %s: %d expert(s) of %lld x %lld, %lld tokens x %d: %zu values differ from gu + k_split_x<1>\n",
           grouped ? "grouped" : "plain", E, (long long)I, (long long)C, (long long)T, KS, bad);
    CHECKF(bad == 0, "gemm_wg swiglu pair (E %d, I %lld, T %lld): %zu values differ", E, (long long)I, (long long)T, bad);
    delete gm;
    delete um;
}

static void test_gemm_q(void) {
    g4_attrs();
    qmat *a = make_qmat(1024, 2048, 4, 64), *b = make_qmat(200, 2048, 4, 64), *dn = make_qmat(2048, 512, 4, 64);
    qmat *r8 = make_qmat(256, 2048, 8, 64), *g8 = make_qmat(1, 2048, 8, 64);
    const int64_t Ts_full[] = {1, 7, 64, 65, 200};
    const int64_t Ts_quick[] = {1, 65};
    const int64_t *Ts = quick ? Ts_quick : Ts_full;
    const int nT = quick ? 2 : 5;
    for (int i = 0; i < nT; i++) {
        for (int v = 0; v < (have_wg ? G4_VARIANTS : 1); v++) {
            qmat *two[2] = {a, b};
            gemm_case(Ts[i], 2, two, 0, 0.0f, v);
            qmat *d1[1] = {dn};
            gemm_case(Ts[i], 1, d1, i % 2, 0.0f, v); // the down projection, on a SwiGLU input every other length
        }
        qmat *eight[2] = {r8, g8};
        gemm_case(Ts[i], 2, eight, 0);
    }
    // rows of very different size in one launch (each group's pieces / parts have their own scale);
    // a matrix of 40 rows and two groups (fewer groups than the stages loaded ahead); grouped mode
    qmat *small = make_qmat(40, 128, 4, 64), *ex = make_qmat(200, 256, 4, 64, 3);
    for (int v = 0; v < (have_wg ? G4_VARIANTS : 1); v++) {
        qmat *two[2] = {a, b};
        gemm_case(65, 2, two, 0, 1e5f, v);
        qmat *d1[1] = {dn};
        gemm_case(65, 1, d1, 1, 1e5f, v);
        qmat *s1[1] = {small};
        gemm_case(70, 1, s1, 0, 0.0f, v);
        gemm_grouped_case(quick ? 50 : 150, 2, ex, v);
    }
    if (have_wg) {
        gemm_pair_case(1, 512, 2048, 70, 1);            // the model's expert shape, plain: 64 + 6 tokens
        gemm_pair_case(5, 128, 256, quick ? 60 : 150, 2); // grouped (partial tiles 16 and 32 wide); 2 groups
        gemm_pair_case(3, 1152, 128, 40, 2);            // 18 groups of the down's input: a partial window
    }
    delete small;
    delete ex;
    delete a; delete b; delete dn; delete r8; delete g8;
}

// --time-gemm (a benchmark, not a test): the 4-bit GEMMs side by side at the model's prefill shapes,
// 20 launches each after 3 of warm-up; TFLOP/s counts 2 R C T per launch.
static void time_gemm_case(const char *name, int64_t R, int64_t C, int64_t T) {
    qmat *m = make_qmat(R, C, 4, 64);
    dbuf<float> dx((size_t)(T * C));
    dx.put(rand_vec((size_t)(T * C), 2.0f));
    dbuf<__nv_bfloat16> xh((size_t)(T * C)), xl((size_t)(T * C));
    dbuf<float> xs((size_t)(T * C / 64)), xsig((size_t)(T * C / 64)), dy((size_t)(T * R));
    dbuf<int8_t> xq((size_t)(G4_NP * T * C));
    dbuf<__nv_bfloat16> xsw((size_t)wg_xsw_win(T, (int)(C / 64), 0));
    k_split_x<0><<<(unsigned)T, 256>>>(dx.p, C, 0, C, xh.p, xl.p, xs.p, xq.p, xsig.p, T * C, xsw.p);
    CKL();
    const g4_job j = one_job(m, dy.p, xq.p, xsig.p, T * C);
    printf("  %-27s %5lld x %-5lld T=%-5lld", name, (long long)R, (long long)C, (long long)T);
    for (int v = 0; v < (have_wg ? G4_VARIANTS : 1); v++) {
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        for (int it = 0; it < 23; it++) {
            if (it == 3) CK(cudaEventRecord(a));
            g4_launch(v, j, T, xh.p, xl.p, xs.p, xsw.p);
        }
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CKL();
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        const double us = 1000.0 * ms / 20;
        printf("  %s %7.1f us %5.1f TF/s", g4_name(v), us, 2.0 * (double)R * (double)C * (double)T / us * 1e-6);
        CK(cudaEventDestroy(a));
        CK(cudaEventDestroy(b));
    }
    printf("\n");
    delete m;
}

// The routed experts of a prefill chunk as the model launches them: T tokens x KS slots, each token's
// KS distinct experts drawn uniformly from E (the synth's router is random), the tile map built as
// k_moe_scan does. Beside it the same multiply-adds as one plain GEMM (R x C over T KS tokens): what
// grouping costs (partial tiles, each tile's weights).
static void time_grouped_case(const char *name, int64_t R, int64_t C, int64_t T, int KS, int E) {
    qmat *m = make_qmat(R, C, 4, 64, E, false);
    const int64_t S = T * KS;
    std::vector<int> ex((size_t)S);
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < KS; k++) {
            int e;
            bool dup;
            do {
                e = (int)(rnd() % (uint32_t)E);
                dup = false;
                for (int j = 0; j < k; j++) dup |= ex[(size_t)(t * KS + j)] == e;
            } while (dup);
            ex[(size_t)(t * KS + k)] = e;
        }
    tile_map tm(ex, E);
    const int nt = tm.nt;
    dbuf<float> dx((size_t)(S * C));
    dx.put(rand_vec((size_t)(S * C), 2.0f));
    dbuf<__nv_bfloat16> xh((size_t)(S * C)), xl((size_t)(S * C));
    dbuf<float> xs((size_t)(S * C / 64)), xsig((size_t)(S * C / 64)), dy((size_t)(S * R));
    dbuf<int8_t> xq((size_t)(G4_NP * S * C));
    dbuf<__nv_bfloat16> xsw((size_t)wg_xsw_win(S, (int)(C / 64), 0));
    k_split_x<0><<<(unsigned)S, 256>>>(dx.p, C, 0, C, xh.p, xl.p, xs.p, xq.p, xsig.p, S * C, xsw.p);
    CKL();
    const g4_job j = one_job(m, dy.p, xq.p, xsig.p, S * C);
    // the input rows: slot / KS as the gate/up GEMM reads them (x_div KS, T rows), or slot (the down
    // projection's SwiGLU rows: x_div 1); both read S rows' worth of tiles
    const int x_div = C == 2048 ? KS : 1;
    const dim3 g((unsigned)j.start[1], (unsigned)nt + 2);
    printf("  %-27s %5lld x %-5lld T=%-5lld x %d over %d experts, %d tiles (%.0f%% full):\n", name, (long long)R, (long long)C,
           (long long)T, KS, E, nt, 100.0 * (double)S / ((double)nt * G4_BN));
    for (int v = 0; v < (have_wg ? G4_VARIANTS : 1); v++) {
        for (int plain = 0; plain < 2; plain++) {
            cudaEvent_t a, b;
            CK(cudaEventCreate(&a));
            CK(cudaEventCreate(&b));
            for (int it = 0; it < 13; it++) {
                if (it == 3) CK(cudaEventRecord(a));
                if (plain) g4_launch(v, j, S, xh.p, xl.p, xs.p, xsw.p);
                else if (v) k_gemm_wg<<<g, 256, wg_smem()>>>(j, xh.p, xl.p, xsw.p, (int)T, tm.doffs.p, tm.dsorted.p, tm.dtiles.p, tm.dnt.p, x_div);
                else k_gemm_q<4><<<g, 256, g4_smem<4>()>>>(j, xh.p, xl.p, xs.p, (int)T, tm.doffs.p, tm.dsorted.p, tm.dtiles.p, tm.dnt.p, x_div);
            }
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            CKL();
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, a, b));
            const double us = 1000.0 * ms / 10;
            printf("    %s %-8s %8.1f us %5.1f TF/s\n", g4_name(v), plain ? "plain" : "grouped", us,
                   2.0 * (double)R * (double)C * (double)S / us * 1e-6);
            CK(cudaEventDestroy(a));
            CK(cudaEventDestroy(b));
        }
    }
    delete m;
}

static void run_time_gemm(void) {
    g4_attrs();
    time_gemm_case("GDN in_proj (qkvz+ba)", 12352, 2048, 4096);
    time_gemm_case("GDN in_proj, 1k", 12352, 2048, 1024);
    time_gemm_case("out_proj", 2048, 4096, 4096);
    time_gemm_case("attn q+gate/k/v, 4k", 9216, 2048, 4096);
    time_gemm_case("expert gate+up, 128 tokens", 1024, 2048, 128);
    time_gemm_case("expert down, 128 tokens", 2048, 512, 128);
    time_gemm_case("shared down", 2048, 512, 4096);
    time_grouped_case("routed gate+up, 4k", 1024, 2048, 4096, 8, 256);
    time_grouped_case("routed down, 4k", 2048, 512, 4096, 8, 256);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--time-gemm")) time_gemm = true;
        else { fprintf(stderr, "usage: test_matmul [--quick] [--time-gemm]\n"); return 2; }
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) { fprintf(stderr, "no CUDA device\n"); return 2; }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    { // the wgmma kernel where its sm_90a image runs (as the backend decides)
        dbuf<int> on(1);
        k_wg_probe<<<1, 1>>>(on.p);
        CKL();
        have_wg = on.get()[0] == 1;
    }
    printf("k_gemm_wg (wgmma): %s\n", have_wg ? "tested" : "not built for this device");
    if (time_gemm) {
        run_time_gemm();
        return 0;
    }
    const int grids[3] = {2 * prop.multiProcessorCount, 0, 7};
    for (int gi = 0; gi < 3; gi++) {
        g_blocks = grids[gi];
        printf("GEMV grid: %d blocks aimed for%s\n", g_blocks, g_blocks ? "" : " (one row-block set per block)");
        TEST(test_gemv_shapes);
        TEST(test_gemv_multi);
        TEST(test_gemv_experts);
        if (quick) break;
    }
    TEST(test_moe_down);
    TEST(test_moe_split);
    TEST(test_gemm_q);
    return check_summary();
}
