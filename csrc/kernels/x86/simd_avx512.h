/*
 * simd_avx512.h — AVX-512 (F/BW/VL/DQ) intrinsic helpers shared by the x86 AVX-512 kernel files
 * (avx512.c). Pulls in simd_avx2.h (their targets include AVX2).
 *
 * `static inline`, no target attribute of its own: include it AFTER the file's
 * `#pragma GCC target(...)`, inside its `#if defined(__x86_64__)` block.
 */
#ifndef LLMRT_KERNELS_X86_SIMD_AVX512_H
#define LLMRT_KERNELS_X86_SIMD_AVX512_H

#include "simd_avx2.h"

static inline __m512i loadu512(const void *p) { return _mm512_loadu_si512(p); }

/* zmm = [a (low 256 bits) | b (high 256 bits)] */
static inline __m512i cat256(__m256i a, __m256i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

/* f32 lanes 0..7 = a, 8..15 = b (the scales of two 32-element blocks in one zmm). */
static inline __m512 scales_2x8_ps(float a, float b) {
    return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

#endif /* LLMRT_KERNELS_X86_SIMD_AVX512_H */
