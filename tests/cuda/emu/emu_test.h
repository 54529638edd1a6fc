// emu/emu_test.h — what the emulator's kernel tests share: a seeded xorshift generator
// (each test sets its own seed, EMU_SEED, before including this) and the pass/fail counts.
#pragma once
#include <stdint.h>

#ifndef EMU_SEED
#define EMU_SEED 0x9E3779B97F4A7C15ull
#endif
static uint64_t rs = EMU_SEED;
static double urand() { // in [0, 1)
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}
static float sym(float a) { return (float)((2.0 * urand() - 1.0) * a); }

static int passes = 0, fails = 0;
