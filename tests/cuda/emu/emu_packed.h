// emu/emu_packed.h — 4-bit affine matrices for the emulator's kernel tests: random codes,
// bf16 scales and biases, and the packed layout of cuda_packed.cuh built from them here
// (independently of k_repack4). Include after emu_test.h (urand).
#pragma once
#include <string.h>

#include <vector>

#include "backend/cuda/cuda_matrix.cuh"

// A 4-bit affine matrix of n stacked experts (rows x cols, group 64): codes, bf16 scales and
// biases, and the packed layout of cuda_packed.cuh made from them.
struct qm {
    int64_t rows, cols, n, rb;
    std::vector<uint8_t> q;                 // [n][rows][cols] codes 0..15
    std::vector<__nv_bfloat16> s, b;        // [n][rows][cols / 64]
    std::vector<uint4> pk;                  // [n][rb][cols / 64][32 lanes]
    std::vector<uint32_t> psb;              // [n][rb][cols / 64][16 rows]
    std::vector<uint32_t> mq;               // the MLX codes' place (dmat_expert moves q/s/b too; zeros)
    double w(int64_t e, int64_t r, int64_t c) const {
        const size_t gi = (size_t)((e * rows + r) * (cols / 64) + c / 64);
        return (double)__bfloat162float(s[gi]) * q[(size_t)((e * rows + r) * cols + c)] + (double)__bfloat162float(b[gi]);
    }
    dmat view() const {
        dmat d = {};
        d.type = 0, d.bits = 4, d.group = 64, d.rows = rows, d.cols = cols, d.stride = rows, d.n_experts = (int)n;
        d.q = mq.data(), d.s = s.data(), d.b = b.data(), d.pk = pk.data(), d.psb = psb.data(), d.pk_rb = rb;
        return d;
    }
};
static qm make_qm(int64_t rows, int64_t cols, int64_t n) {
    qm m;
    m.rows = rows, m.cols = cols, m.n = n, m.rb = (rows + 15) / 16;
    const int64_t ng = cols / 64;
    m.q.resize((size_t)(n * rows * cols));
    for (auto &v : m.q) v = (uint8_t)(urand() * 16.0) & 15;
    m.s.resize((size_t)(n * rows * ng));
    m.b.resize(m.s.size());
    for (size_t i = 0; i < m.s.size(); i++) {
        const float sc = (float)(0.004 + 0.012 * urand());
        m.s[i] = __float2bfloat16_rn(sc);
        m.b[i] = __float2bfloat16_rn(-sc * (float)(6.0 + 4.0 * urand()));
    }
    m.mq.assign((size_t)(n * rows * cols / 8), 0u);
    m.pk.assign((size_t)(n * m.rb * ng * 32), uint4{0, 0, 0, 0});
    m.psb.assign((size_t)(n * m.rb * ng * 16), 0u);
    auto code = [&](int64_t e, int64_t r, int64_t c) -> uint32_t { return r < rows ? m.q[(size_t)((e * rows + r) * cols + c)] : 0u; };
    for (int64_t e = 0; e < n; e++)
        for (int64_t rb = 0; rb < m.rb; rb++)
            for (int64_t G = 0; G < ng; G++) {
                const size_t at = (size_t)((e * m.rb + rb) * ng + G);
                for (int lane = 0; lane < 32; lane++) {
                    const int g = lane >> 2, t = lane & 3;
                    const int64_t r0 = 16 * rb + g;
                    uint32_t wd[4];
                    for (int ks = 0; ks < 4; ks++) {
                        const int64_t c0 = 64 * G + 16 * ks + 2 * t;
                        // bits 4i (low code) and 16 + 4i (high code) of register a_i:
                        // a0 (r0, c0|c0+1), a1 (r0+8, c0|c0+1), a2 (r0, c0+8|c0+9), a3 (r0+8, c0+8|c0+9)
                        const int64_t rr[4] = {r0, r0 + 8, r0, r0 + 8}, cc[4] = {c0, c0, c0 + 8, c0 + 8};
                        uint32_t v = 0;
                        for (int i = 0; i < 4; i++) v |= code(e, rr[i], cc[i]) << (4 * i) | code(e, rr[i], cc[i] + 1) << (16 + 4 * i);
                        wd[ks] = v;
                    }
                    m.pk[at * 32 + (size_t)lane] = uint4{wd[0], wd[1], wd[2], wd[3]};
                }
                for (int r = 0; r < 16; r++) {
                    const int64_t row = 16 * rb + r;
                    if (row >= rows) continue;
                    const size_t gi = (size_t)((e * rows + row) * ng + G);
                    uint16_t sb, bb;
                    memcpy(&sb, &m.s[gi], 2);
                    memcpy(&bb, &m.b[gi], 2);
                    m.psb[at * 16 + (size_t)r] = (uint32_t)sb | (uint32_t)bb << 16;
                }
            }
    return m;
}
