// emu/cuda_bf16.h — the bf16 storage type for the CUDA emulator (cuda_runtime.h beside it):
// kernels under emulation only move bf16 values (copies, pointer arithmetic); their
// arithmetic goes through the stand-ins that read the bits (wgmma.h).
#pragma once
struct __nv_bfloat16 {
    unsigned short x;
};
