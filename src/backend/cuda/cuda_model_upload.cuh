// cuda_model_upload.cuh — the model's weights on the device: each checkpoint tensor (or buffer the model
// owns) uploaded whole, once, through pinned staging buffers; 4-bit matrices repacked into the
// tensor-core fragment order (k_repack4, cuda_packed.cuh); shared by every session of the model.
// Part of cuda_backend.cu, which includes it once (one translation unit: every kernel is
// registered once, and the attributes set on a kernel are those of the one that is launched).
#pragma once

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
