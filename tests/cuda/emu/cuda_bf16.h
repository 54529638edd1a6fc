// emu/cuda_bf16.h — the bf16 storage type for the CUDA emulator (cuda_runtime.h beside it):
// kernels under emulation mostly move bf16 values (copies, pointer arithmetic); their
// arithmetic goes through the stand-ins that read the bits (wgmma.h, mma.h). The two
// conversions: f32 -> bf16 rounded to nearest even (NaN stays NaN; either spelling), bf16 -> f32 exact.
#pragma once
struct __nv_bfloat16 {
    unsigned short x;
};
#include <string.h>
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 b;
    b.x = (u & 0x7FFFFFFFu) > 0x7F800000u ? (unsigned short)((u >> 16) | 0x40u) : (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    return b;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 b) {
    const unsigned u = (unsigned)b.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// A pair (row_dot's bf16 branch), widened to two floats.
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
template <typename F2 = struct float2>
inline F2 __bfloat1622float2(__nv_bfloat162 h) {
    return F2{__bfloat162float(h.x), __bfloat162float(h.y)};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
