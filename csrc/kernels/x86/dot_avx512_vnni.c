/*
 * dot_avx512_vnni.c — dot-product kernels for the AVX512-VNNI level. Compiled for this target only
 * (pragma below); the register function is called only when the CPU supports the level. Types
 * without a kernel here keep the AVX-512 / AVX2 one (registered first).
 *
 * vpdpbusd (_mm512_dpbusd_epi32) adds the sum of 4 u8·s8 products to each i32 lane, with no
 * intermediate saturation, so one instruction replaces maddubs + madd and every sum is exact:
 *   - offset quants (Q4_0 q - 8, Q5_0 q - 16, Q6_K q - 32): dpbusd(q, y) - dpbusd(offset, y);
 *   - Q8_0 (signed weights): dpbusd(x + 128, y) - dpbusd(128, y), exact for every byte value.
 * Layout as in dot_avx512.c: two 32-element blocks per zmm; Q4_K 64 elements (two sub-blocks with
 * their scales in the low / high 8 i32 lanes); Q6_K 64 elements (four scales, 4 lanes each).
 */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"

#include <math.h>
#include <string.h>

#include "../quant_common.h" /* unpack_scales_mins_k4 */

#if defined(__x86_64__)
#include "simd_avx512.h" /* f16, loads, hsum_ps, cat256, scales_2x8_ps, nibbles, shr_bytes */

/* ---- helpers ----------------------------------------------------------------------------------- */

/* i32 sums of 4 consecutive (q - off)·y; q unsigned */
static inline __m512i dot_offset_512(__m512i q, int off, __m512i y) {
    const __m512i z = _mm512_setzero_si512();
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(z, q, y), _mm512_dpbusd_epi32(z, _mm512_set1_epi8((char)off), y));
}

static inline __m256i dot_offset_256(__m256i q, int off, __m256i y) {
    const __m256i z = _mm256_setzero_si256();
    return _mm256_sub_epi32(_mm256_dpbusd_epi32(z, q, y), _mm256_dpbusd_epi32(z, _mm256_set1_epi8((char)off), y));
}

/* ---- 32-element blocks, two per zmm -------------------------------------------------------------- */

static void vec_dot_q4_0_q8_0_avx512_vnni(int n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx; /* (nb) */
    const block_q8_0 *y = vy; /* (nb) */
    const int nb = n / QK4_0;
    __m512 acc = _mm512_setzero_ps();
    int ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        const __m512 d = scales_2x8_ps(f16(x[ib].d) * f16(y[ib].d), f16(x[ib + 1].d) * f16(y[ib + 1].d));
        const __m512i qx = cat256(unpack_nibbles_32(x[ib].qs), unpack_nibbles_32(x[ib + 1].qs));
        const __m512i qy = cat256(loadu256(y[ib].qs), loadu256(y[ib + 1].qs));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot_offset_512(qx, 8, qy)), acc);
    }
    __m256 acc1 = _mm256_setzero_ps();
    for (; ib < nb; ib++) {
        const __m256 d = _mm256_set1_ps(f16(x[ib].d) * f16(y[ib].d));
        const __m256i p = dot_offset_256(unpack_nibbles_32(x[ib].qs), 8, loadu256(y[ib].qs));
        acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc1);
    }
    *s = _mm512_reduce_add_ps(acc) + hsum_ps(acc1);
}

static void vec_dot_q4_1_q8_1_avx512_vnni(int n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx; /* (nb) */
    const block_q8_1 *y = vy; /* (nb) */
    const int nb = n / QK4_1;
    __m512 acc = _mm512_setzero_ps();
    float summs = 0.0f; /* Σ m · s */
    int ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        summs += f16(x[ib].m) * f16(y[ib].s) + f16(x[ib + 1].m) * f16(y[ib + 1].s);
        const __m512 d = scales_2x8_ps(f16(x[ib].d) * f16(y[ib].d), f16(x[ib + 1].d) * f16(y[ib + 1].d));
        const __m512i qx = cat256(unpack_nibbles_32(x[ib].qs), unpack_nibbles_32(x[ib + 1].qs));
        const __m512i qy = cat256(loadu256(y[ib].qs), loadu256(y[ib + 1].qs));
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy);
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    __m256 acc1 = _mm256_setzero_ps();
    for (; ib < nb; ib++) {
        summs += f16(x[ib].m) * f16(y[ib].s);
        const __m256 d = _mm256_set1_ps(f16(x[ib].d) * f16(y[ib].d));
        const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), unpack_nibbles_32(x[ib].qs), loadu256(y[ib].qs));
        acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc1);
    }
    *s = _mm512_reduce_add_ps(acc) + hsum_ps(acc1) + summs;
}

static void vec_dot_q5_0_q8_0_avx512_vnni(int n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx; /* (nb) */
    const block_q8_0 *y = vy; /* (nb) */
    const int nb = n / QK5_0;
    const __m512i k16 = _mm512_set1_epi8(16);
    __m512 acc = _mm512_setzero_ps();
    int ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        uint32_t h0, h1;
        memcpy(&h0, x[ib].qh, sizeof(h0));
        memcpy(&h1, x[ib + 1].qh, sizeof(h1));
        const __mmask64 hbits = (__mmask64)h0 | ((__mmask64)h1 << 32); /* bit i: 5th bit of element i */
        const __m512 d = scales_2x8_ps(f16(x[ib].d) * f16(y[ib].d), f16(x[ib + 1].d) * f16(y[ib + 1].d));
        __m512i qx = cat256(unpack_nibbles_32(x[ib].qs), unpack_nibbles_32(x[ib + 1].qs));
        qx = _mm512_mask_add_epi8(qx, hbits, qx, k16);
        const __m512i qy = cat256(loadu256(y[ib].qs), loadu256(y[ib + 1].qs));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot_offset_512(qx, 16, qy)), acc);
    }
    __m256 acc1 = _mm256_setzero_ps();
    for (; ib < nb; ib++) {
        uint32_t h0;
        memcpy(&h0, x[ib].qh, sizeof(h0));
        const __m256 d = _mm256_set1_ps(f16(x[ib].d) * f16(y[ib].d));
        __m256i qx = unpack_nibbles_32(x[ib].qs);
        qx = _mm256_mask_add_epi8(qx, (__mmask32)h0, qx, _mm256_set1_epi8(16));
        const __m256i p = dot_offset_256(qx, 16, loadu256(y[ib].qs));
        acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc1);
    }
    *s = _mm512_reduce_add_ps(acc) + hsum_ps(acc1);
}

static void vec_dot_q8_0_q8_0_avx512_vnni(int n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx; /* (nb) */
    const block_q8_0 *y = vy; /* (nb) */
    const int nb = n / QK8_0;
    __m512 acc = _mm512_setzero_ps();
    int ib = 0;
    /* x + 128 as u8 is x ^ 0x80; subtract 128·Σy afterwards */
    for (; ib + 2 <= nb; ib += 2) {
        const __m512 d = scales_2x8_ps(f16(x[ib].d) * f16(y[ib].d), f16(x[ib + 1].d) * f16(y[ib + 1].d));
        const __m512i qx = _mm512_xor_si512(cat256(loadu256(x[ib].qs), loadu256(x[ib + 1].qs)), _mm512_set1_epi8((char)0x80));
        const __m512i qy = cat256(loadu256(y[ib].qs), loadu256(y[ib + 1].qs));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot_offset_512(qx, 128, qy)), acc);
    }
    __m256 acc1 = _mm256_setzero_ps();
    for (; ib < nb; ib++) {
        const __m256 d = _mm256_set1_ps(f16(x[ib].d) * f16(y[ib].d));
        const __m256i qx = _mm256_xor_si256(loadu256(x[ib].qs), _mm256_set1_epi8((char)0x80));
        const __m256i p = dot_offset_256(qx, 128, loadu256(y[ib].qs));
        acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc1);
    }
    *s = _mm512_reduce_add_ps(acc) + hsum_ps(acc1);
}

/* ---- 256-element super-blocks (activations Q8_K) ------------------------------------------------ */

static void vec_dot_q4_K_q8_K_avx512_vnni(int n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx; /* (nb) */
    const block_q8_K *y = vy; /* (nb) */
    const int nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m512 acc = _mm512_setzero_ps();
    float summ = 0.0f;
    for (int i = 0; i < nb; i++) {
        uint8_t sc[8], m[8];
        unpack_scales_mins_k4(x[i].scales, sc, m);
        int summs = 0;
        for (int j = 0; j < QK_K / 16; j++) summs += y[i].bsums[j] * m[j / 2];
        __m512i isum = _mm512_setzero_si512();
        for (int j = 0; j < QK_K / 64; j++) {
            const __m256i q4 = loadu256(x[i].qs + 32 * j);
            const __m512i q = cat256(_mm256_and_si256(q4, m4), _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4));
            const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, loadu512(y[i].qs + 64 * j));
            const __m512i scv = cat256(_mm256_set1_epi32(sc[2 * j]), _mm256_set1_epi32(sc[2 * j + 1]));
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(p, scv));
        }
        const float d = f16(x[i].d) * y[i].d;
        const float dmin = f16(x[i].dmin) * y[i].d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), acc);
        summ = fmaf(dmin, (float)summs, summ); /* fused, as the -O3 build contracts it */
    }
    *s = _mm512_reduce_add_ps(acc) - summ;
}

/* 16 i32 lanes, 4 per scale: the scales sc[0..3] of a 64-element stretch. */
static inline __m512i scales_4x4_epi32(const int8_t *sc) {
    int32_t packed;
    memcpy(&packed, sc, sizeof(packed));
    const __m128i idx = _mm_set_epi64x(0x0303030302020202LL, 0x0101010100000000LL); /* byte k = k/4 */
    return _mm512_cvtepi8_epi32(_mm_shuffle_epi8(_mm_cvtsi32_si128(packed), idx));
}

static void vec_dot_q6_K_q8_K_avx512_vnni(int n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx; /* (nb) */
    const block_q8_K *y = vy; /* (nb) */
    const int nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < nb; i++) {
        __m512i isum = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = loadu256(x[i].ql + 64 * h);
            const __m256i ql1 = loadu256(x[i].ql + 64 * h + 32);
            const __m256i qh = loadu256(x[i].qh + 32 * h);
            const __m256i g0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(shr_bytes(qh, 0, 0x03), 4));
            const __m256i g1 = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(shr_bytes(qh, 2, 0x03), 4));
            const __m256i g2 = _mm256_or_si256(shr_bytes(ql0, 4, 0x0f), _mm256_slli_epi16(shr_bytes(qh, 4, 0x03), 4));
            const __m256i g3 = _mm256_or_si256(shr_bytes(ql1, 4, 0x0f), _mm256_slli_epi16(shr_bytes(qh, 6, 0x03), 4));
            for (int k = 0; k < 2; k++) {
                const __m512i q = k == 0 ? cat256(g0, g1) : cat256(g2, g3);
                const __m512i p = dot_offset_512(q, 32, loadu512(y[i].qs + 128 * h + 64 * k));
                isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(p, scales_4x4_epi32(x[i].scales + 8 * h + 4 * k)));
            }
        }
        const float d = f16(x[i].d) * y[i].d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), acc);
    }
    *s = _mm512_reduce_add_ps(acc);
}

#endif /* __x86_64__ */

void llmrt_register_dot_kernels_avx512_vnni(llmrt_kernel_table *kt) {
#if defined(__x86_64__)
#define REG(T, fn) do { kt->vec_dot[LLMRT_TYPE_##T] = fn; kt->vec_dot_name[LLMRT_TYPE_##T] = #fn; } while (0)
    REG(Q4_0, vec_dot_q4_0_q8_0_avx512_vnni);
    REG(Q4_1, vec_dot_q4_1_q8_1_avx512_vnni);
    REG(Q5_0, vec_dot_q5_0_q8_0_avx512_vnni);
    REG(Q8_0, vec_dot_q8_0_q8_0_avx512_vnni);
    REG(Q4_K, vec_dot_q4_K_q8_K_avx512_vnni);
    REG(Q6_K, vec_dot_q6_K_q8_K_avx512_vnni);
#undef REG
#else
    (void)kt;
#endif
}
