/*
 * simdw.h — the 512-bit SIMD layer the AVX-512 kernels are written against, with two backends:
 *
 *   SIMDW_AVX512  the real instructions. The including file is compiled for an AVX-512 target
 *                 (`#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,...")`).
 *   SIMDW_EMU512  the same operations built from AVX2 (a vector is two ymm halves), bit for bit:
 *                 integer ops lane for lane, float ops the same IEEE operation per lane,
 *                 vpdpbusd as exact i32 sums (no intermediate saturation, wrapping like the
 *                 hardware), vdpbf16ps as its two rounded f32 adds with DAZ/FTZ. The including
 *                 file is compiled for "avx2,fma,f16c". It lets every AVX-512 level's kernels run
 *                 in the tests of a machine without AVX-512, as the AMX tile model does for tiles
 *                 (tests/test_simdw.py checks each operation against the real instruction where the
 *                 CPU has it). Dispatch never registers an emulated kernel: only
 *                 llmrt_set_isa_emulated() (tests) does.
 *
 * A kernel file defines exactly one backend macro, and SIMDW_VNNI / SIMDW_BF16 (0 or 1: whether
 * w_dpbusd, w_dpwssd / w_dpbf16_ps exist; for the real backend the target must then include avx512vnni /
 * avx512bf16), then includes this header after its target pragma. Kernel bodies shared by the two
 * backends live in `*_w.inc` files included by one real and one emulated .c file, their function
 * names built with WNAME(name) (name ## _ ## SIMDW_SUFFIX).
 *
 * 256-bit work (tails, horizontal sums in a fixed order) is written with AVX2 intrinsics directly:
 * they are valid in both backends' targets. w_lo / w_hi / w_cat move between the widths.
 *
 * Every function is static inline, without a target attribute of its own.
 */
#ifndef LLMRT_KERNELS_X86_SIMDW_H
#define LLMRT_KERNELS_X86_SIMDW_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#if defined(SIMDW_AVX512) == defined(SIMDW_EMU512)
#error "define exactly one of SIMDW_AVX512, SIMDW_EMU512 before including simdw.h"
#endif
#ifndef SIMDW_VNNI
#define SIMDW_VNNI 0
#endif
#ifndef SIMDW_BF16
#define SIMDW_BF16 0
#endif

#define SIMDW_CAT_(a, b) a##_##b
#define SIMDW_CAT(a, b) SIMDW_CAT_(a, b)
#define WNAME(name) SIMDW_CAT(name, SIMDW_SUFFIX)

/* ---- types and moves between widths ------------------------------------------------------------ */
#ifdef SIMDW_AVX512
typedef __m512i wvi; /* 64 bytes / 32 i16 / 16 i32 */
typedef __m512 wvf;  /* 16 f32 */
static inline __m256i w_lo(wvi v) { return _mm512_castsi512_si256(v); }
static inline __m256i w_hi(wvi v) { return _mm512_extracti64x4_epi64(v, 1); }
static inline wvi w_cat(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
static inline __m256 w_lo_ps(wvf v) { return _mm512_castps512_ps256(v); }
static inline __m256 w_hi_ps(wvf v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
static inline wvf w_cat_ps(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1); }
#else
typedef struct { __m256i lo, hi; } wvi;
typedef struct { __m256 lo, hi; } wvf;
static inline __m256i w_lo(wvi v) { return v.lo; }
static inline __m256i w_hi(wvi v) { return v.hi; }
static inline wvi w_cat(__m256i lo, __m256i hi) { wvi r = { lo, hi }; return r; }
static inline __m256 w_lo_ps(wvf v) { return v.lo; }
static inline __m256 w_hi_ps(wvf v) { return v.hi; }
static inline wvf w_cat_ps(__m256 lo, __m256 hi) { wvf r = { lo, hi }; return r; }
#endif

/* Lane-wise operations: one definition per backend through these two macros. */
#ifdef SIMDW_AVX512
#define SIMDW_I2(name, op512, op256) static inline wvi name(wvi a, wvi b) { return op512(a, b); }
#define SIMDW_F2(name, op512, op256) static inline wvf name(wvf a, wvf b) { return op512(a, b); }
#else
#define SIMDW_I2(name, op512, op256) \
    static inline wvi name(wvi a, wvi b) { wvi r = { op256(a.lo, b.lo), op256(a.hi, b.hi) }; return r; }
#define SIMDW_F2(name, op512, op256) \
    static inline wvf name(wvf a, wvf b) { wvf r = { op256(a.lo, b.lo), op256(a.hi, b.hi) }; return r; }
#endif

/* ---- integer ------------------------------------------------------------------------------------- */
/* 128-bit lanes across two vectors: [a0, a2, b0, b2] and [a1, a3, b1, b3] (lane i: bytes 16i..16i+15) */
#ifdef SIMDW_AVX512
static inline wvi w_shuf128_even(wvi a, wvi b) { return _mm512_shuffle_i32x4(a, b, 0x88); }
static inline wvi w_shuf128_odd(wvi a, wvi b) { return _mm512_shuffle_i32x4(a, b, 0xDD); }
#else
static inline wvi w_shuf128_even(wvi a, wvi b) {
    wvi r = { _mm256_permute2x128_si256(a.lo, a.hi, 0x20), _mm256_permute2x128_si256(b.lo, b.hi, 0x20) };
    return r;
}
static inline wvi w_shuf128_odd(wvi a, wvi b) {
    wvi r = { _mm256_permute2x128_si256(a.lo, a.hi, 0x31), _mm256_permute2x128_si256(b.lo, b.hi, 0x31) };
    return r;
}
#endif


#ifdef SIMDW_AVX512
static inline wvi w_loadu(const void *p) { return _mm512_loadu_si512(p); }
static inline wvi w_load(const void *p) { return _mm512_load_si512(p); } /* 64-byte aligned */
static inline void w_storeu(void *p, wvi v) { _mm512_storeu_si512(p, v); }
static inline wvi w_zero(void) { return _mm512_setzero_si512(); }
static inline wvi w_set1_epi8(int8_t x) { return _mm512_set1_epi8(x); }
static inline wvi w_set1_epi16(int16_t x) { return _mm512_set1_epi16(x); }
static inline wvi w_set1_epi32(int32_t x) { return _mm512_set1_epi32(x); }
/* the 32 bytes at p in both halves */
static inline wvi w_bcast256(const void *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p)); }
/* the 8 bytes at p in every 64-bit lane (a vpbroadcastq from memory) */
static inline wvi w_bcast64(const void *p) {
    long long x;
    memcpy(&x, p, 8);
    return _mm512_set1_epi64(x);
}
#define w_srli_epi16(v, n) _mm512_srli_epi16((v), (n))
#define w_slli_epi16(v, n) _mm512_slli_epi16((v), (n))
#define w_srli_epi32(v, n) _mm512_srli_epi32((v), (n))
#define w_slli_epi32(v, n) _mm512_slli_epi32((v), (n))
#define w_srli_epi64(v, n) _mm512_srli_epi64((v), (n))
#define w_slli_epi64(v, n) _mm512_slli_epi64((v), (n))
#else
static inline wvi w_loadu(const void *p) {
    wvi r = { _mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)p + 1) };
    return r;
}
static inline wvi w_load(const void *p) {
    wvi r = { _mm256_load_si256((const __m256i *)p), _mm256_load_si256((const __m256i *)p + 1) };
    return r;
}
static inline void w_storeu(void *p, wvi v) {
    _mm256_storeu_si256((__m256i *)p, v.lo);
    _mm256_storeu_si256((__m256i *)p + 1, v.hi);
}
static inline wvi w_zero(void) { wvi r = { _mm256_setzero_si256(), _mm256_setzero_si256() }; return r; }
static inline wvi w_set1_epi8(int8_t x) { const __m256i v = _mm256_set1_epi8(x); wvi r = { v, v }; return r; }
static inline wvi w_set1_epi16(int16_t x) { const __m256i v = _mm256_set1_epi16(x); wvi r = { v, v }; return r; }
static inline wvi w_set1_epi32(int32_t x) { const __m256i v = _mm256_set1_epi32(x); wvi r = { v, v }; return r; }
static inline wvi w_bcast256(const void *p) { const __m256i v = _mm256_loadu_si256((const __m256i *)p); wvi r = { v, v }; return r; }
static inline wvi w_bcast64(const void *p) {
    long long x;
    memcpy(&x, p, 8);
    const __m256i v = _mm256_set1_epi64x(x);
    wvi r = { v, v };
    return r;
}
#define SIMDW_SHIFT(op256, v, n) ({ wvi v_ = (v); wvi r_ = { op256(v_.lo, (n)), op256(v_.hi, (n)) }; r_; })
#define w_srli_epi16(v, n) SIMDW_SHIFT(_mm256_srli_epi16, v, n)
#define w_slli_epi16(v, n) SIMDW_SHIFT(_mm256_slli_epi16, v, n)
#define w_srli_epi32(v, n) SIMDW_SHIFT(_mm256_srli_epi32, v, n)
#define w_slli_epi32(v, n) SIMDW_SHIFT(_mm256_slli_epi32, v, n)
#define w_srli_epi64(v, n) SIMDW_SHIFT(_mm256_srli_epi64, v, n)
#define w_slli_epi64(v, n) SIMDW_SHIFT(_mm256_slli_epi64, v, n)
#endif

SIMDW_I2(w_and, _mm512_and_si512, _mm256_and_si256)
/* the even i32 lanes of a, the odd ones of b */
#ifdef SIMDW_AVX512
static inline wvi w_blend_odd32(wvi a, wvi b) { return _mm512_mask_blend_epi32(0xAAAA, a, b); }
#else
static inline wvi w_blend_odd32(wvi a, wvi b) {
    wvi r = { _mm256_blend_epi32(a.lo, b.lo, 0xAA), _mm256_blend_epi32(a.hi, b.hi, 0xAA) };
    return r;
}
#endif
SIMDW_I2(w_or, _mm512_or_si512, _mm256_or_si256)
SIMDW_I2(w_xor, _mm512_xor_si512, _mm256_xor_si256)
SIMDW_I2(w_andnot, _mm512_andnot_si512, _mm256_andnot_si256) /* ~a & b */
SIMDW_I2(w_add_epi8, _mm512_add_epi8, _mm256_add_epi8)
SIMDW_I2(w_sub_epi8, _mm512_sub_epi8, _mm256_sub_epi8)
SIMDW_I2(w_add_epi16, _mm512_add_epi16, _mm256_add_epi16)
SIMDW_I2(w_sub_epi16, _mm512_sub_epi16, _mm256_sub_epi16)
SIMDW_I2(w_add_epi32, _mm512_add_epi32, _mm256_add_epi32)
SIMDW_I2(w_sub_epi32, _mm512_sub_epi32, _mm256_sub_epi32)
SIMDW_I2(w_mullo_epi16, _mm512_mullo_epi16, _mm256_mullo_epi16)
SIMDW_I2(w_mullo_epi32, _mm512_mullo_epi32, _mm256_mullo_epi32)
SIMDW_I2(w_maddubs_epi16, _mm512_maddubs_epi16, _mm256_maddubs_epi16) /* u8 x s8, pairs, i16 saturating */
SIMDW_I2(w_madd_epi16, _mm512_madd_epi16, _mm256_madd_epi16)          /* i16 x i16, pairs, i32 */
SIMDW_I2(w_shuffle_epi8, _mm512_shuffle_epi8, _mm256_shuffle_epi8)    /* within each 128-bit lane */
SIMDW_I2(w_unpacklo_epi8, _mm512_unpacklo_epi8, _mm256_unpacklo_epi8) /* within each 128-bit lane */
SIMDW_I2(w_unpackhi_epi8, _mm512_unpackhi_epi8, _mm256_unpackhi_epi8)
SIMDW_I2(w_unpacklo_epi32, _mm512_unpacklo_epi32, _mm256_unpacklo_epi32)
SIMDW_I2(w_unpackhi_epi32, _mm512_unpackhi_epi32, _mm256_unpackhi_epi32)
SIMDW_I2(w_unpacklo_epi64, _mm512_unpacklo_epi64, _mm256_unpacklo_epi64)
SIMDW_I2(w_unpackhi_epi64, _mm512_unpackhi_epi64, _mm256_unpackhi_epi64)

/* a with the sign of b applied per byte (AVX2's vpsignb): -a where b < 0, 0 where b == 0. */
static inline wvi w_sign_epi8(wvi a, wvi b) {
#ifdef SIMDW_AVX512
    const __mmask64 neg = _mm512_movepi8_mask(b);
    const __mmask64 nz = _mm512_test_epi8_mask(b, b);
    return _mm512_maskz_mov_epi8(nz, _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a));
#else
    wvi r = { _mm256_sign_epi8(a.lo, b.lo), _mm256_sign_epi8(a.hi, b.hi) };
    return r;
#endif
}

/* Widening, narrowing and a table of 32 words (the WQ bf16 kernels, wq_w.inc). */
#ifdef SIMDW_AVX512
static inline wvi w_cvtepu8_epi16(__m256i b) { return _mm512_cvtepu8_epi16(b); }   /* 32 u8 -> 32 u16 */
static inline wvi w_cvtepi8_epi32(__m128i b) { return _mm512_cvtepi8_epi32(b); }   /* 16 i8 -> 16 i32 */
static inline __m256i w_cvtepi32_epi16(wvi v) { return _mm512_cvtepi32_epi16(v); } /* low 16 bits (vpmovdw) */
/* lane i = table[idx[i] mod 32] (vpermw) */
static inline wvi w_permutexvar_epi16(wvi idx, wvi table) { return _mm512_permutexvar_epi16(idx, table); }
#else
static inline wvi w_cvtepu8_epi16(__m256i b) {
    wvi r = { _mm256_cvtepu8_epi16(_mm256_castsi256_si128(b)), _mm256_cvtepu8_epi16(_mm256_extracti128_si256(b, 1)) };
    return r;
}
static inline wvi w_cvtepi8_epi32(__m128i b) {
    wvi r = { _mm256_cvtepi8_epi32(b), _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)) };
    return r;
}
static inline __m256i w_cvtepi32_epi16(wvi v) {
    /* bytes 0,1 of each i32 to the low 8 bytes of its 128-bit lane, then the two lanes' low halves */
    const __m256i sh = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i lo = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v.lo, sh), _MM_SHUFFLE(3, 1, 2, 0));
    const __m256i hi = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v.hi, sh), _MM_SHUFFLE(3, 1, 2, 0));
    return _mm256_permute2x128_si256(lo, hi, 0x20);
}
static inline wvi w_permutexvar_epi16(wvi idx, wvi table) { /* a scalar table walk (tests only) */
    uint16_t t[32], ix[32], r[32];
    w_storeu(t, table);
    w_storeu(ix, idx);
    for (int i = 0; i < 32; i++) r[i] = t[ix[i] & 31];
    return w_loadu(r);
}
#endif

/* Σ over each group of 4 bytes of u8(u) · s8(s), added to the i32 lanes of acc, wrapping:
 * vpdpbusd (AVX512-VNNI). The emulation widens to i16 and sums exactly (the products of a pair fit
 * an i32 exactly, |Σ4| < 2^17), so no pair is saturated as maddubs would. */
#if SIMDW_VNNI
#ifdef SIMDW_AVX512
static inline wvi w_dpbusd(wvi acc, wvi u, wvi s) { return _mm512_dpbusd_epi32(acc, u, s); }
#else
static inline __m256i simdw_dpbusd_256(__m256i acc, __m256i u, __m256i s) {
    /* bytes 0..15 and 16..31 widened; madd gives the sums of byte pairs (2k, 2k + 1) */
    const __m256i p0 = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(u)),
                                         _mm256_cvtepi8_epi16(_mm256_castsi256_si128(s)));
    const __m256i p1 = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(u, 1)),
                                         _mm256_cvtepi8_epi16(_mm256_extracti128_si256(s, 1)));
    /* hadd: [q0 q1 q4 q5 | q2 q3 q6 q7] (q = the sums of 4 bytes), 64-bit lanes back to order */
    const __m256i h = _mm256_hadd_epi32(p0, p1);
    return _mm256_add_epi32(acc, _mm256_permute4x64_epi64(h, _MM_SHUFFLE(3, 1, 2, 0)));
}
static inline wvi w_dpbusd(wvi acc, wvi u, wvi s) {
    wvi r = { simdw_dpbusd_256(acc.lo, u.lo, s.lo), simdw_dpbusd_256(acc.hi, u.hi, s.hi) };
    return r;
}
#endif
/* Σ over each pair of i16 of a · b, added to the i32 lanes of acc, wrapping: vpdpwssd (AVX512-VNNI). The
 * emulation: madd (the pair's sum in i32, wrapping only for two (-32768)² products) and an add: the
 * same sum modulo 2^32. */
#ifdef SIMDW_AVX512
static inline wvi w_dpwssd(wvi acc, wvi a, wvi b) { return _mm512_dpwssd_epi32(acc, a, b); }
#else
static inline wvi w_dpwssd(wvi acc, wvi a, wvi b) {
    wvi r = { _mm256_add_epi32(acc.lo, _mm256_madd_epi16(a.lo, b.lo)),
              _mm256_add_epi32(acc.hi, _mm256_madd_epi16(a.hi, b.hi)) };
    return r;
}
#endif
/* the same on 256 bits (AVX512-VL + VNNI's ymm vpdpbusd), for kernels that keep AVX2's widths */
#ifdef SIMDW_AVX512
static inline __m256i w256_dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
#else
static inline __m256i w256_dpbusd(__m256i acc, __m256i u, __m256i s) { return simdw_dpbusd_256(acc, u, s); }
#endif
#endif

/* ---- float --------------------------------------------------------------------------------------- */
#ifdef SIMDW_AVX512
static inline wvf w_zero_ps(void) { return _mm512_setzero_ps(); }
static inline wvf w_set1_ps(float x) { return _mm512_set1_ps(x); }
static inline wvf w_loadu_ps(const float *p) { return _mm512_loadu_ps(p); }
static inline void w_storeu_ps(float *p, wvf v) { _mm512_storeu_ps(p, v); }
static inline wvf w_fmadd_ps(wvf a, wvf b, wvf c) { return _mm512_fmadd_ps(a, b, c); }
static inline wvf w_cvtepi32_ps(wvi v) { return _mm512_cvtepi32_ps(v); }
static inline wvf w_cvtph_ps(__m256i h) { return _mm512_cvtph_ps(h); } /* 16 f16 -> 16 f32 (exact) */
static inline wvf w_cvtbf16_ps(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); } /* 16 bf16 -> 16 f32 (exact) */
static inline wvf w_castsi_ps(wvi v) { return _mm512_castsi512_ps(v); }
static inline wvi w_castps_si(wvf v) { return _mm512_castps_si512(v); }
/* lane i = a (i < 8) or b (i >= 8) */
static inline wvf w_set2x8_ps(float a, float b) { return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1); }
#else
static inline wvf w_zero_ps(void) { wvf r = { _mm256_setzero_ps(), _mm256_setzero_ps() }; return r; }
static inline wvf w_set1_ps(float x) { const __m256 v = _mm256_set1_ps(x); wvf r = { v, v }; return r; }
static inline wvf w_loadu_ps(const float *p) { wvf r = { _mm256_loadu_ps(p), _mm256_loadu_ps(p + 8) }; return r; }
static inline void w_storeu_ps(float *p, wvf v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
static inline wvf w_fmadd_ps(wvf a, wvf b, wvf c) {
    wvf r = { _mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi) };
    return r;
}
static inline wvf w_cvtepi32_ps(wvi v) { wvf r = { _mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi) }; return r; }
static inline wvf w_cvtph_ps(__m256i h) {
    wvf r = { _mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)) };
    return r;
}
static inline wvf w_cvtbf16_ps(__m256i h) {
    wvf r = { _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16)),
              _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16)) };
    return r;
}
static inline wvf w_castsi_ps(wvi v) { wvf r = { _mm256_castsi256_ps(v.lo), _mm256_castsi256_ps(v.hi) }; return r; }
static inline wvi w_castps_si(wvf v) { wvi r = { _mm256_castps_si256(v.lo), _mm256_castps_si256(v.hi) }; return r; }
static inline wvf w_set2x8_ps(float a, float b) { wvf r = { _mm256_set1_ps(a), _mm256_set1_ps(b) }; return r; }
#endif

SIMDW_F2(w_add_ps, _mm512_add_ps, _mm256_add_ps)
SIMDW_F2(w_sub_ps, _mm512_sub_ps, _mm256_sub_ps)
SIMDW_F2(w_mul_ps, _mm512_mul_ps, _mm256_mul_ps)
SIMDW_F2(w_max_ps, _mm512_max_ps, _mm256_max_ps)

/* Σ of the 16 lanes in a fixed order, the same in both backends: halves (256), then halves (128),
 * then lanes (0,1,2,3) + (2,3,0,1), then lane 0 + lane 1 (GCC's _mm512_reduce_add_ps order). */
static inline float w_reduce_add_ps(wvf v) {
    const __m256 s8 = _mm256_add_ps(w_lo_ps(v), w_hi_ps(v));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_shuffle_ps(s4, s4, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, _MM_SHUFFLE(1, 1, 1, 1))));
}

/* vdpbf16ps (AVX512-BF16): per f32 lane j, acc += a.bf16[2j+1]·b.bf16[2j+1], then
 * acc += a.bf16[2j]·b.bf16[2j], each add rounded to nearest even, with bf16 denormal inputs read as
 * zero and denormal results flushed to zero (DAZ/FTZ whatever MXCSR says). The products of two
 * bf16 are exact in f32 (8 + 8 significant bits) unless they overflow (inf, as in hardware) or
 * underflow (flushed). */
#if SIMDW_BF16
#ifdef SIMDW_AVX512
static inline wvf w_dpbf16_ps(wvf acc, wvi a, wvi b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}
#else
static inline __m256 simdw_ftz_ps(__m256 v) { /* denormals -> zero of the same sign */
    const __m256i e = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7f800000));
    const __m256i den = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
    return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_and_si256(den, _mm256_set1_epi32(0x7fffffff)),
                                                   _mm256_castps_si256(v)));
}
static inline __m256 simdw_dpbf16_256(__m256 acc, __m256i a, __m256i b) {
    const __m256i hi16 = _mm256_set1_epi32((int)0xffff0000u);
    const __m256 a_odd = simdw_ftz_ps(_mm256_castsi256_ps(_mm256_and_si256(a, hi16)));
    const __m256 b_odd = simdw_ftz_ps(_mm256_castsi256_ps(_mm256_and_si256(b, hi16)));
    const __m256 a_even = simdw_ftz_ps(_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)));
    const __m256 b_even = simdw_ftz_ps(_mm256_castsi256_ps(_mm256_slli_epi32(b, 16)));
    acc = simdw_ftz_ps(acc);
    acc = simdw_ftz_ps(_mm256_add_ps(acc, simdw_ftz_ps(_mm256_mul_ps(a_odd, b_odd))));
    return simdw_ftz_ps(_mm256_add_ps(acc, simdw_ftz_ps(_mm256_mul_ps(a_even, b_even))));
}
static inline wvf w_dpbf16_ps(wvf acc, wvi a, wvi b) {
    wvf r = { simdw_dpbf16_256(acc.lo, a.lo, b.lo), simdw_dpbf16_256(acc.hi, a.hi, b.hi) };
    return r;
}
#endif
#endif

#undef SIMDW_I2
#undef SIMDW_F2

#endif /* LLMRT_KERNELS_X86_SIMDW_H */
