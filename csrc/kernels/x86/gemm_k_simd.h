/*
 * gemm_k_simd.h — AVX2 helpers shared by the packed K-quant kernels (gemm_k_avx2.c, gemm_k_avx512.c,
 * gemm_kq_w.inc): scale vectors from the packed scale bytes, the Q4_K/Q5_K mins part for 8 rows at
 * once, an 8 x 8 i32 transpose.
 * Integer-only (exact). `static inline`, no target of its own: include it AFTER the file's
 * `#pragma GCC target(...)` and simd_avx2.h, inside its `#if defined(__x86_64__)` block.
 */
#ifndef LLMRT_KERNELS_X86_GEMM_K_SIMD_H
#define LLMRT_KERNELS_X86_GEMM_K_SIMD_H

#include <string.h>

#include "simd_avx2.h"
#include "../pack_k.h"
#include "../quant_common.h" /* kvalues_iq4nl */

/* scales16_to_2x8's shuffle for group g: low half word 2g % 8 of the pair's source (s0..s7 for g < 4,
 * else s8..s15, in both halves), high half word (2g + 1) % 8 */
static inline __m256i scales16_idx(int g) {
    const int w0 = (2 * g) % 8, w1 = (2 * g + 1) % 8;
    return _mm256_setr_epi8(2 * w0, 2 * w0 + 1, 2 * w0, 2 * w0 + 1, 2 * w0, 2 * w0 + 1, 2 * w0, 2 * w0 + 1, 2 * w0,
                            2 * w0 + 1, 2 * w0, 2 * w0 + 1, 2 * w0, 2 * w0 + 1, 2 * w0, 2 * w0 + 1, 2 * w1, 2 * w1 + 1,
                            2 * w1, 2 * w1 + 1, 2 * w1, 2 * w1 + 1, 2 * w1, 2 * w1 + 1, 2 * w1, 2 * w1 + 1, 2 * w1,
                            2 * w1 + 1, 2 * w1, 2 * w1 + 1, 2 * w1, 2 * w1 + 1);
}

/* the 8 i16 scale vectors of a super-block from its 16 scales (int8, or uint8 masked to 0..15):
 * sc[g] = 8 x s[2g] | 8 x s[2g+1] (lanes 0..7 scale the first 16 elements of group g) */
static inline void scales16_to_2x8(__m128i s8, int is_signed, __m256i *sc) {
    const __m256i s16 = is_signed ? _mm256_cvtepi8_epi16(s8) : _mm256_cvtepu8_epi16(s8); /* s0..s7 | s8..s15 */
    const __m256i lo = _mm256_permute2x128_si256(s16, s16, 0x00); /* s0..s7 in both halves */
    const __m256i hi = _mm256_permute2x128_si256(s16, s16, 0x11); /* s8..s15 in both halves */
    for (int g = 0; g < 8; g++) sc[g] = _mm256_shuffle_epi8(g < 4 ? lo : hi, scales16_idx(g));
}

/* the 8 i16 scale vectors of a Q4_K / Q5_K row-block from its 8 uint8 scales: sc[s] = 16 x s[s] */
static inline void scales8_to_16(const uint8_t *s8, __m256i *sc) {
    uint64_t b;
    memcpy(&b, s8, 8);
    const __m256i s16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)b)));
    for (int s = 0; s < 8; s++) {
        sc[s] = _mm256_shuffle_epi8(s16, _mm256_set1_epi16((short)(2 * s | (2 * s + 1) << 8)));
    }
}

/* Q4_K / Q5_K mins part for the 8 rows of a block group, lane r = Σ_l bsums[l] · m_r[l/2] (exact),
 * from the m field (pack_k.h) and one Q8_K block's bsums */
static inline __m256i imin8_k4(const uint8_t *mfield, const int16_t *bsums) {
    /* pb[s] = bsums[2s] + bsums[2s+1]; i16 pairs (pb[2k], pb[2k+1]) sit at i32 element k (k < 2) and
     * k + 2 (k >= 2) of packs(pb, pb); |pb| <= 2·16·127: no saturation */
    const __m256i pb = _mm256_madd_epi16(loadu256(bsums), _mm256_set1_epi16(1));
    const __m256i pb16 = _mm256_packs_epi32(pb, pb);
    __m256i imin = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
        const __m256i mk = _mm256_cvtepu8_epi16(loadu128(mfield + 16 * k)); /* lane r: (m_r[2k], m_r[2k+1]) */
        const __m256i bk = _mm256_permutevar8x32_epi32(pb16, _mm256_set1_epi32(k < 2 ? k : k + 2));
        imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mk, bk));
    }
    return imin;
}

/* 8 i32 vectors -> one, lane r = Σ of the 8 lanes of v[r] (exact; integer adds) */
static inline __m256i hsum8_i32(const __m256i *v) {
    const __m256i a01 = _mm256_hadd_epi32(v[0], v[1]);
    const __m256i a23 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i a45 = _mm256_hadd_epi32(v[4], v[5]);
    const __m256i a67 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i b0 = _mm256_hadd_epi32(a01, a23); /* per 128-bit half: partial sums of v0..v3 */
    const __m256i b1 = _mm256_hadd_epi32(a45, a67); /* v4..v7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20), _mm256_permute2x128_si256(b0, b1, 0x31));
}

/* 8 x 8 i32 transpose: o[c] lane r = v[r] lane c */
static inline void transpose8_epi32(const __m256i *v, __m256i *o) {
    __m256i a[8], b[8];
    for (int k = 0; k < 4; k++) { /* rows 2k, 2k+1 interleaved: a[2k] columns 0,1 | 4,5; a[2k+1] 2,3 | 6,7 */
        a[2 * k] = _mm256_unpacklo_epi32(v[2 * k], v[2 * k + 1]);
        a[2 * k + 1] = _mm256_unpackhi_epi32(v[2 * k], v[2 * k + 1]);
    }
    for (int h = 0; h < 2; h++) { /* rows 4h..4h+3: b[4h + c] column c | c + 4 */
        b[4 * h + 0] = _mm256_unpacklo_epi64(a[4 * h], a[4 * h + 2]);
        b[4 * h + 1] = _mm256_unpackhi_epi64(a[4 * h], a[4 * h + 2]);
        b[4 * h + 2] = _mm256_unpacklo_epi64(a[4 * h + 1], a[4 * h + 3]);
        b[4 * h + 3] = _mm256_unpackhi_epi64(a[4 * h + 1], a[4 * h + 3]);
    }
    for (int c = 0; c < 4; c++) {
        o[c] = _mm256_permute2x128_si256(b[c], b[4 + c], 0x20);
        o[c + 4] = _mm256_permute2x128_si256(b[c], b[4 + c], 0x31);
    }
}

/* Row r of a packed Q2_K block group (pack_k.h): q[s] = the 32 quants of 32-group s, 0..3. */
static inline void unpack_q2k_row(const uint8_t *bg, int r, __m256i *q) {
    for (int k = 0; k < 2; k++) {
        const __m256i q2 = loadu256(bg + Q2K_QS + 64 * r + 32 * k);
        for (int j = 0; j < 4; j++) q[4 * k + j] = shr_bytes(q2, 2 * j, 0x03);
    }
}

/* Row r of a packed Q3_K block group (pack_k.h): q[s] = the 32 quants of 32-group s, 0..7 (value
 * q - 4). */
static inline void unpack_q3k_row(const uint8_t *bg, int r, __m256i *q) {
    const __m256i hm = loadu256(bg + Q3K_HM + 32 * r);
    for (int k = 0; k < 2; k++) {
        const __m256i q3 = loadu256(bg + Q3K_QS + 64 * r + 32 * k);
        for (int j = 0; j < 4; j++) {
            const int g = 4 * k + j;
            q[g] = _mm256_or_si256(shr_bytes(q3, 2 * j, 0x03), _mm256_slli_epi16(shr_bytes(hm, g, 0x01), 2));
        }
    }
}

/* Row r of a packed IQ4_XS block group (pack_k.h): q[s] = the 32 levels of 32-group s as int8
 * (kvalues_iq4nl[nibble]; the block's byte l holds elements l and l + 16 of its group). */
static inline void unpack_iq4xs_row(const uint8_t *bg, int r, __m256i *q) {
    const __m256i table = _mm256_broadcastsi128_si256(loadu128(kvalues_iq4nl));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    for (int s = 0; s < 8; s++) {
        const __m128i b = loadu128(bg + IQ4XS_QS + 128 * r + 16 * s);
        const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
        q[s] = _mm256_shuffle_epi8(table, nib);
    }
}

/* Row r of a packed Q5_K block group (pack_k.h): q[s] = the 32 quants of 32-group s, 0..31, in
 * element order (nibble | the qh bit of the group at bit 4). */
static inline void unpack_q5k_row(const uint8_t *bg, int r, __m256i *q) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i h = loadu256(bg + Q5K_QH + 32 * r);
    for (int j = 0; j < 4; j++) {
        const __m256i q4 = loadu256(bg + Q5K_QS + 128 * r + 32 * j);
        const __m256i lo = _mm256_and_si256(q4, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
        q[2 * j] = _mm256_or_si256(lo, _mm256_slli_epi16(shr_bytes(h, 2 * j, 0x01), 4));
        q[2 * j + 1] = _mm256_or_si256(hi, _mm256_slli_epi16(shr_bytes(h, 2 * j + 1, 0x01), 4));
    }
}

/* Row r of a packed Q6_K block group (pack_k.h): q[s] = the 32 quants of 32-group s, 0..63 (value
 * q - 32), in element order: q = nibble | 2 bits of qh at bits 4..5; the bits 2g, 2g + 1 of a qh
 * byte are moved there by one 16-bit shift (4, 2, 0, -2 bits: no bit crosses into the neighbour
 * byte's bits 4..5) and a mask. */
static inline void unpack_q6k_row(const uint8_t *bg, int r, __m256i *q) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        const __m256i ql0 = loadu256(bg + Q6K_QL + 128 * r + 64 * h);      /* groups 0 (low), 2 (high) */
        const __m256i ql1 = loadu256(bg + Q6K_QL + 128 * r + 64 * h + 32); /* groups 1 (low), 3 (high) */
        const __m256i qh = loadu256(bg + Q6K_QH + 64 * r + 32 * h);
        q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
        q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
        q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
        q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
    }
}

/* gemm_k_avx2.c's K-quant / IQ4_XS gemms (gemm.h's signature), for the levels above that reproduce
 * their bits (gemm_kq_w.inc) */
#define GEMM_K_AVX2_PROTO(t) void llmrt_gemm_##t##_avx2(int64_t K, const void *group, int n_rows, const void *x, \
                                                        size_t x_stride, int n_x, float *y, int64_t y_stride);
GEMM_K_AVX2_PROTO(q2_K)
GEMM_K_AVX2_PROTO(q3_K)
GEMM_K_AVX2_PROTO(q4_K)
GEMM_K_AVX2_PROTO(q5_K)
GEMM_K_AVX2_PROTO(q6_K)
GEMM_K_AVX2_PROTO(iq4_xs)
#undef GEMM_K_AVX2_PROTO

#endif /* LLMRT_KERNELS_X86_GEMM_K_SIMD_H */
