/*
 * simd_avx2.h — AVX2 / F16C intrinsic helpers shared by the x86 kernel files (avx2.c, dot_avx2.c,
 * and the AVX-512 files, whose targets include AVX2): unaligned loads, horizontal sums of 8 lanes,
 * nibble / bit unpacking, the u8·s8 dot idioms.
 *
 * Every function is `static inline` and has no target attribute of its own: it compiles for the
 * target of the file that includes it. So include this header AFTER the file's
 * `#pragma GCC target(...)` (and `optimize`), inside its `#if defined(__x86_64__)` block.
 */
#ifndef LLMRT_KERNELS_X86_SIMD_AVX2_H
#define LLMRT_KERNELS_X86_SIMD_AVX2_H

#include <immintrin.h>

#include "llmrt/llmrt.h"

#include <stdint.h>

/* Keep v in one register here (an empty asm that "changes" it). For integer sums accumulated in a
 * loop: integer adds are associative, so GCC -O3 may rebuild a chain of adds as a tree over all the
 * products of the unrolled loop and spill them to the stack; pinning the running sum after each add
 * keeps the chain (the result is the same integer either way). Measured where used. */
#define PIN_REG(v) __asm__("" : "+x"(v))
/* s += maddubs(u, i) (i16 lanes, u unsigned bytes, i signed) with the sum kept in its own register:
 * the add's destination is s itself (with PIN_REG alone GCC wrote the add into the product's
 * register and copied it back, a move per step that cost dispatch slots) */
#define MADDUBS_ADD16(s, u, i)                                                                  \
    do {                                                                                        \
        __m256i tmp_;                                                                           \
        __asm__("vpmaddubsw %3, %2, %1\n\tvpaddw %1, %0, %0" : "+x"(s), "=&x"(tmp_) : "x"(u), "x"(i)); \
    } while (0)

/* f16 -> f32 with F16C (exact). */
static inline float f16(llmrt_fp16_t h) { return _cvtsh_ss(h); }

/* Unaligned loads from any address. */
static inline __m256i loadu256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline __m128i loadu128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }

/* Σ of the 8 f32 lanes of v, in ggml's order (hsum_float_8): halves, then pairs, then the last two. */
static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* hsum_ps of 8 vectors at once: lane r of the result = hsum_ps(v[r]), bit for bit (the same adds on
 * the same operands: halves, then pairs, then the last two, with lanes moved between the steps). */
static inline __m256 hsum8_ps(const __m256 v[8]) {
    __m256 s[4]; /* s[i]: halves summed, rows 2i (lanes 0..3) and 2i + 1 (lanes 4..7) */
    for (int i = 0; i < 4; i++) {
        s[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    }
    /* pairs: t[0] = rows 0, 2 (lane 0..1, 2..3) | rows 1, 3; t[1] = rows 4, 6 | rows 5, 7 */
    __m256 t[2];
    for (int i = 0; i < 2; i++) {
        t[i] = _mm256_add_ps(_mm256_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    /* the last two: lanes rows 0, 2, 4, 6 | 1, 3, 5, 7, then back to row order */
    const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Σ of the 8 i32 lanes of v (wraps like the hardware adds). */
static inline int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* 16 bytes of packed nibbles at p -> 32 bytes: low nibbles (elements 0..15), then high (16..31). */
static inline __m256i unpack_nibbles_32(const uint8_t *p) {
    const __m128i b = loadu128(p);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
}

/* 32 bits -> 32 bytes, byte i = 0xff if bit i is set, else 0 (Q5 high bits). */
static inline __m256i expand_bits_32(uint32_t bits) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    const __m256i bitm = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf); /* byte i = byte i/8 */
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bitm), bitm);
}

/* bytes of v shifted right by `count` bits inside each byte, masked to `mask`. */
static inline __m256i shr_bytes(__m256i v, int count, int mask) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(count)), _mm256_set1_epi8((char)mask));
}

/* Σ x·y over each group of 4 bytes -> 8 i32; x unsigned (<= 63), y signed. */
static inline __m256i dot_u8_i8(__m256i x, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1));
}

/* Same with x signed: sign trick |x|·(y negated where x < 0), exact while y != -128. */
static inline __m256i dot_i8_i8(__m256i x, __m256i y) {
    return dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* Σ (x - off)·y over groups of 4 bytes, x unsigned (<= 63), off > 0: maddubs(x, y) - maddubs(off, y)
 * is exact for every y, -128 included. */
static inline __m256i dot_offset_u8_i8(__m256i x, __m256i off, __m256i y) {
    const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(x, y), _mm256_maddubs_epi16(off, y));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

#endif /* LLMRT_KERNELS_X86_SIMD_AVX2_H */
