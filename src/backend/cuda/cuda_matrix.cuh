// cuda_matrix.cuh — dmat, the device view of a weight matrix (also built by the CUDA emulator,
// tests/cuda/emu, for the kernels it runs on the CPU).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

// A weight matrix on the device, in its checkpoint form (see weights.h):
// MLX affine (packed u32 codes + bf16 scales/biases per group) or plain bf16.
// Stacked experts: expert e starts `stride` rows after expert e-1.
struct dmat {
    int type;  // 0 affine, 1 bf16 (lilac_mat_type)
    int bits, group;
    int64_t rows, cols, stride;
    int n_experts;
    const uint32_t *q;
    const __nv_bfloat16 *s, *b, *w;
    // 4-bit, group 64: the same codes in tensor-core fragment order (cuda_packed.cuh),
    // pk_rb row blocks of 16 per expert; null when not packed.
    const uint4 *pk;
    const uint32_t *psb;
    int64_t pk_rb;
};

__host__ __device__ inline dmat dmat_expert(dmat m, int e) {
    int64_t r0 = (int64_t)e * m.stride;
    if (m.type == 0) {
        m.q += r0 * (m.cols * m.bits / 32);
        m.s += r0 * (m.cols / m.group);
        m.b += r0 * (m.cols / m.group);
        if (m.pk) {
            m.pk += (int64_t)e * m.pk_rb * (m.cols / 64) * 32;
            m.psb += (int64_t)e * m.pk_rb * (m.cols / 64) * 16;
        }
    } else {
        m.w += r0 * m.cols;
    }
    m.n_experts = 1;
    return m;
}
