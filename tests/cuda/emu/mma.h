// emu/mma.h — a CPU stand-in for the part of CUDA's WMMA API (nvcuda::wmma, tf32
// m16n16k8) that src/backend/cuda/cuda_gdn_chunk.cuh uses, for the emulator of
// cuda_runtime.h beside it.
//
// A fragment here holds its whole tile in every lane (x[] is the tile, row-major, and
// num_elements its size), not the hardware's per-lane share: what the emulation checks
// is the kernel's use of the API (pointers, leading dimensions, layouts, the order of
// products and barriers), not the hardware's fragment map, which the API hides and the
// kernels never depend on (they only apply element-wise operations to fragments).
// Loads read the tile in every lane; products and stores are made by lane 0 alone (one
// copy of the work), so a lane may read what another lane of its warp stored only after
// a barrier, as on the GPU.
//   load_matrix_sync(a, p, ld): matrix_a row_major: a(m, k) = p[m ld + k]; col_major: p[k ld + m]
//                               matrix_b row_major: b(k, n) = p[k ld + n]; col_major: p[n ld + k]
//   accumulator: load/store with mem_row_major (m, n) = p[m ld + n] or mem_col_major p[n ld + m]
//   __float_to_tf32: round to nearest, ties away (cvt.rna.tf32.f32), 10 explicit bits
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
} // namespace precision
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K> struct dims;
template <int M, int N, int K> struct dims<matrix_a, M, N, K> { static const int R = M, C = K; };
template <int M, int N, int K> struct dims<matrix_b, M, N, K> { static const int R = K, C = N; };
template <int M, int N, int K> struct dims<accumulator, M, N, K> { static const int R = M, C = N; };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static const int R = dims<Use, M, N, K>::R, C = dims<Use, M, N, K>::C;
    enum { num_elements = R * C };
    float x[R * C];
};

inline float __float_to_tf32(float v) {
    if (!isfinite(v)) return v;
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0x1000u) & 0xFFFFE000u; // ties away from zero (on the magnitude bits)
    float r;
    memcpy(&r, &u, 4);
    return r;
}

inline bool lane0() { return (cuemu::tid.x & 31) == 0; }

template <class Use, int M, int N, int K, class T>
inline void load_matrix_sync(fragment<Use, M, N, K, T, row_major> &f, const float *p, unsigned ld) {
    for (int r = 0; r < f.R; r++)
        for (int c = 0; c < f.C; c++) f.x[r * f.C + c] = p[(size_t)r * ld + c];
}
template <class Use, int M, int N, int K, class T>
inline void load_matrix_sync(fragment<Use, M, N, K, T, col_major> &f, const float *p, unsigned ld) {
    for (int r = 0; r < f.R; r++)
        for (int c = 0; c < f.C; c++) f.x[r * f.C + c] = p[(size_t)c * ld + r];
}
template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p, unsigned ld, layout_t l) {
    for (int r = 0; r < f.R; r++)
        for (int c = 0; c < f.C; c++) f.x[r * f.C + c] = l == mem_row_major ? p[(size_t)r * ld + c] : p[(size_t)c * ld + r];
}
template <int M, int N, int K>
inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f, unsigned ld, layout_t l) {
    if (!lane0()) return;
    for (int r = 0; r < f.R; r++)
        for (int c = 0; c < f.C; c++) (l == mem_row_major ? p[(size_t)r * ld + c] : p[(size_t)c * ld + r]) = f.x[r * f.C + c];
}
template <class Use, int M, int N, int K, class T, class Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout> &f, float v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}
// d = a b + c, each product exact (tf32 operands), summed in f32 in k order
template <int M, int N, int K, class LA, class LB>
inline void mma_sync(fragment<accumulator, M, N, K, float> &d, const fragment<matrix_a, M, N, K, precision::tf32, LA> &a,
                     const fragment<matrix_b, M, N, K, precision::tf32, LB> &b, const fragment<accumulator, M, N, K, float> &c) {
    if (!lane0()) return;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float s = c.x[m * N + n];
            for (int k = 0; k < K; k++) s += a.x[m * K + k] * b.x[k * N + n];
            d.x[m * N + n] = s;
        }
}
} // namespace wmma
} // namespace nvcuda
