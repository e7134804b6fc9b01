/*
 * gemm_q32_simd.h — AVX2 helpers shared by the packed 32-block kernels (gemm_avx2.c,
 * gemm_q32_w.inc) over the layout of ../gemm_q32.h. `static inline`, no target of its own: include
 * it after the file's `#pragma GCC target(...)`, inside its `#if defined(__x86_64__)` block.
 */
#ifndef LLMRT_KERNELS_X86_GEMM_Q32_SIMD_H
#define LLMRT_KERNELS_X86_GEMM_Q32_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "../gemm_q32.h"

/* IQ4_NL's 16 levels in both 128-bit lanes (a vpshufb table; quant_common.h's kvalues_iq4nl) */
static inline __m256i q32_iq4nl_table(void) {
    return _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                            -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
}

/* Block ib's quants of Q4_0 / IQ4_NL's 4 rows in word pairs (gemm_q32.h): p[j] i32 lanes 2r, 2r + 1 =
 * row r's activation words 2j, 2j + 1 (Q4_0 0..15, IQ4_NL the int8 levels). */
static inline void q32_block_pairs(const int type, const int64_t nb, const uint8_t *grp, const int64_t ib,
                                   __m256i p[4]) {
    const uint8_t *qs = grp + q32_qs_off(type, nb) + ib * 64;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int h = 0; h < 2; h++) {
        const __m256i v = _mm256_load_si256((const __m256i *)(qs + 32 * h));
        p[2 * h] = _mm256_and_si256(v, m4);
        p[2 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (type == LLMRT_TYPE_IQ4_NL) {
            p[2 * h] = _mm256_shuffle_epi8(q32_iq4nl_table(), p[2 * h]);
            p[2 * h + 1] = _mm256_shuffle_epi8(q32_iq4nl_table(), p[2 * h + 1]);
        }
    }
}

/* Block ib's quants of the group's 4 rows, one 32-byte vector per row (element order): Q4_0 / Q4_1
 * 0..15, Q5_0 / Q5_1 0..31 (5th bit included), Q8_0 / WQ_Q8A the int8 values as stored, IQ4_NL the int8
 * levels of its nibbles. */
static inline void q32_block_quants(const int type, const int64_t nb, const uint8_t *grp, const int64_t ib,
                                    __m256i w[Q32_R]) {
    const uint8_t *qs = grp + q32_qs_off(type, nb);
    if (q32_qsb(type) == 32) { /* Q8_0, WQ_Q8A */
        for (int r = 0; r < Q32_R; r++) w[r] = _mm256_load_si256((const __m256i *)(qs + ib * 128 + 32 * r));
        return;
    }
    if (q32_pairs(type)) { /* row r = the 64-bit elements r of the 4 pair vectors, in order */
        __m256i p[4];
        q32_block_pairs(type, nb, grp, ib, p);
        const __m256i t0 = _mm256_unpacklo_epi64(p[0], p[1]), t1 = _mm256_unpackhi_epi64(p[0], p[1]);
        const __m256i t2 = _mm256_unpacklo_epi64(p[2], p[3]), t3 = _mm256_unpackhi_epi64(p[2], p[3]);
        w[0] = _mm256_permute2x128_si256(t0, t2, 0x20);
        w[1] = _mm256_permute2x128_si256(t1, t3, 0x20);
        w[2] = _mm256_permute2x128_si256(t0, t2, 0x31);
        w[3] = _mm256_permute2x128_si256(t1, t3, 0x31);
        return;
    }
    const uint8_t *qh = grp + q32_qh_off(type, nb); /* Q4_1, Q5_0, Q5_1 */
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i b5 = _mm256_set1_epi8(0x10);
    for (int p = 0; p < Q32_R / 2; p++) {
        const __m256i v = _mm256_load_si256((const __m256i *)(qs + ib * 64 + 32 * p));
        __m256i w0 = _mm256_and_si256(v, m4), w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (q32_has_qh(type)) { /* 5th bits to bit 4 of each byte (gemm_q32.h) */
            long long hq;
            memcpy(&hq, qh + ib * Q32_R * 4 + 8 * p, 8);
            const __m256i h = _mm256_set1_epi64x(hq);
            w0 = _mm256_or_si256(w0, _mm256_and_si256(_mm256_sllv_epi64(h, _mm256_set_epi64x(1, 2, 3, 4)), b5));
            w1 = _mm256_or_si256(w1, _mm256_and_si256(_mm256_srlv_epi64(h, _mm256_set_epi64x(3, 2, 1, 0)), b5));
        }
        w[2 * p] = w0;
        w[2 * p + 1] = w1;
    }
}

/* gemm_avx2.c's 32-block gemms (gemm.h's signature; Q4_0 and IQ4_NL its repacked-order kernels),
 * for the levels above that reproduce their bits (gemm_q32_w.inc) */
#define GEMM_Q32_AVX2_PROTO(t) void llmrt_gemm_##t##_avx2(int64_t K, const void *group, int n_rows, const void *x, \
                                                          size_t x_stride, int n_x, float *y, int64_t y_stride);
GEMM_Q32_AVX2_PROTO(q4_0)
GEMM_Q32_AVX2_PROTO(q4_1)
GEMM_Q32_AVX2_PROTO(q5_0)
GEMM_Q32_AVX2_PROTO(q5_1)
GEMM_Q32_AVX2_PROTO(q8_0)
GEMM_Q32_AVX2_PROTO(iq4_nl)
GEMM_Q32_AVX2_PROTO(q8a)
#undef GEMM_Q32_AVX2_PROTO
/* gemm_avx2.c's Q8_0 decode in the avx512_vnni level's block order (one token, n_rows rows of groups
 * from group into y) */
void llmrt_gemv_q8_0_blk_avx2(int64_t K, const void *group, int n_rows, const void *x, float *y);

#endif /* LLMRT_KERNELS_X86_GEMM_Q32_SIMD_H */
