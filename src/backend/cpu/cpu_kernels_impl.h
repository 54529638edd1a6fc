/* cpu_kernels_impl.h — what the kernel sets share: where a group's pieces sit
 * (cpu_kernels.h's layout) and one group's integer sum written plainly (the
 * scalar set, and the SIMD sets' lone last group). */
#ifndef LILAC_CPU_KERNELS_IMPL_H
#define LILAC_CPU_KERNELS_IMPL_H

#include <stdint.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

/* Offsets of group g's even and odd 4-bit-order pieces in a row of ng groups. */
static inline void cpu_pair_offsets(int64_t ng, int64_t g, int64_t *ev, int64_t *od) {
    if ((ng & 1) && g == ng - 1) { /* lone last group: [even | odd] */
        *ev = g * 64;
        *od = g * 64 + 32;
    } else { /* pair (2p, 2p+1): [A even | B even | A odd | B odd] */
        *ev = (g >> 1) * 128 + (g & 1) * 32;
        *od = *ev + 64;
    }
}

/* Over group g of a 4-bit row (codes: its 32 bytes): *hm = sum_i q_i (256 h_i + m_i), *l = sum_i q_i l_i. */
static inline void cpu_group4_sums(int64_t ng, int64_t g, const uint8_t *codes, const int8_t *ph, const int8_t *pm,
                                   const int8_t *pl, int32_t *hm, int32_t *l) {
    int64_t ev, od;
    cpu_pair_offsets(ng, g, &ev, &od);
    int32_t sh = 0, sm = 0, sl = 0;
    for (int i = 0; i < 32; i++) {
        const int32_t lo = codes[i] & 15, hi = codes[i] >> 4;
        sh += lo * ph[ev + i] + hi * ph[od + i];
        sm += lo * pm[ev + i] + hi * pm[od + i];
        sl += lo * pl[ev + i] + hi * pl[od + i];
    }
    *hm = sh * 256 + sm;
    *l = sl;
}

/* The same for a group of 8-bit codes (64 bytes) and element-order pieces. */
static inline void cpu_group8_sums(const uint8_t *codes, const int8_t *nh, const int8_t *nm, const int8_t *nl,
                                   int32_t *hm, int32_t *l) {
    int32_t sh = 0, sm = 0, sl = 0;
    for (int i = 0; i < 64; i++) {
        sh += codes[i] * nh[i];
        sm += codes[i] * nm[i];
        sl += codes[i] * nl[i];
    }
    *hm = sh * 256 + sm;
    *l = sl;
}

/* A group's f32 value from its sums: hm + l/256. */
static inline float cpu_sums_value(int32_t hm, int32_t l) { return (float)hm + (float)l * (1.0f / 256.0f); }

#if defined(__x86_64__)
/* AVX-VNNI (VEX vpdpbusd): CPUID.(EAX=7,ECX=1):EAX bit 4. */
static inline int cpu_has_avxvnni(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, 0) < 7) return 0;
    __cpuid_count(7, 1, a, b, c, d);
    (void)b, (void)c, (void)d;
    return (a >> 4) & 1;
}
#endif

#endif
