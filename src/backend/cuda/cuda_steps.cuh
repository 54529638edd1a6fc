// cuda_steps.cuh — what a session does with the forward pass: forward() in prefill chunks, the
// greedy decode loop on one CUDA graph per step, snapshots, the batched step, and sampling on
// the device (cuda_sample.cu).
// Part of cuda_backend.cu, which includes it once (one translation unit: every kernel is
// registered once, and the attributes set on a kernel are those of the one that is launched).
#pragma once

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
