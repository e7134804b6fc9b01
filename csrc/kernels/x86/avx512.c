/* avx512.c — kernels for the avx512 ISA level (AVX-512 F/BW/VL/DQ). Compiled for this target only
 * (pragma below); the register function is called only when the CPU supports the level.
 *
 * The same kernels as x86/avx2.c, 16 floats per step, with the same bit-identical-to-generic
 * contract: each value is the generic kernel's float expression, unfused (fp-contract=off);
 * Q8_0/Q8_1 round ties away from zero exactly (trunc, then +-1 when |frac| >= 0.5); Q8_K rounds
 * ties to even (embedded rounding). int32 -> int8 packing uses vpmovsdb, which keeps order.
 *
 * Blocks are read with unaligned loads / memcpy: a row may start at any address.
 */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "../quant_common.h" /* rd_f16, wr_f16, get_scale_min_k4 */

#if defined(__x86_64__)
#include "simd_avx512.h" /* unpack_nibbles_32 */

/* ---- helpers ---------------------------------------------------------------------------------- */

/* 32 int8 -> 2 x 16 floats (elements 0..15, 16..31). */
static inline void i8x32_to_f32(__m256i q, __m512 out[2]) {
    out[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
    out[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
}

/* ---- dequantize ------------------------------------------------------------------------------- */

static void dequant_row_f16_avx512(const void *vx, float *y, int64_t k) {
    const uint8_t *x = vx;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)(x + 2 * i));
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(h));
    }
    for (; i < k; i++) y[i] = rd_f16(x + 2 * i);
}

static void dequant_row_q4_0_avx512(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK4_0;
    const __m256i off = _mm256_set1_epi8(8);
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q4_0);
        const __m512 d = _mm512_set1_ps(rd_f16(b + offsetof(block_q4_0, d)));
        const __m256i q = _mm256_sub_epi8(unpack_nibbles_32(b + offsetof(block_q4_0, qs)), off);
        __m512 f[2];
        i8x32_to_f32(q, f);
        _mm512_storeu_ps(y + 0, _mm512_mul_ps(f[0], d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(f[1], d));
    }
}

static void dequant_row_q4_1_avx512(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK4_1;
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q4_1);
        const __m512 d = _mm512_set1_ps(rd_f16(b + offsetof(block_q4_1, d)));
        const __m512 m = _mm512_set1_ps(rd_f16(b + offsetof(block_q4_1, m)));
        __m512 f[2];
        i8x32_to_f32(unpack_nibbles_32(b + offsetof(block_q4_1, qs)), f);
        _mm512_storeu_ps(y + 0, _mm512_add_ps(_mm512_mul_ps(f[0], d), m));
        _mm512_storeu_ps(y + 16, _mm512_add_ps(_mm512_mul_ps(f[1], d), m));
    }
}

static void dequant_row_q5_0_avx512(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK5_0;
    const __m256i off = _mm256_set1_epi8(16);
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q5_0);
        const __m512 d = _mm512_set1_ps(rd_f16(b + offsetof(block_q5_0, d)));
        uint32_t qh;
        memcpy(&qh, b + offsetof(block_q5_0, qh), sizeof(qh));
        /* byte j = 0x10 where bit j of qh is set */
        const __m256i hi = _mm256_maskz_mov_epi8((__mmask32)qh, bit4);
        __m256i q = _mm256_or_si256(unpack_nibbles_32(b + offsetof(block_q5_0, qs)), hi);
        q = _mm256_sub_epi8(q, off);
        __m512 f[2];
        i8x32_to_f32(q, f);
        _mm512_storeu_ps(y + 0, _mm512_mul_ps(f[0], d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(f[1], d));
    }
}

static void dequant_row_q8_0_avx512(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q8_0);
        const __m512 d = _mm512_set1_ps(rd_f16(b + offsetof(block_q8_0, d)));
        __m512 f[2];
        i8x32_to_f32(_mm256_loadu_si256((const __m256i *)(b + offsetof(block_q8_0, qs))), f);
        _mm512_storeu_ps(y + 0, _mm512_mul_ps(f[0], d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(f[1], d));
    }
}

static void dequant_row_q4_K_avx512(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q4_K);
        const float d = rd_f16(b + offsetof(block_q4_K, d));
        const float dmin = rd_f16(b + offsetof(block_q4_K, dmin));
        const uint8_t *scales = b + offsetof(block_q4_K, scales);
        const uint8_t *q = b + offsetof(block_q4_K, qs);
        for (int is = 0; is < QK_K / 32; is += 2, q += 32, y += 64) {
            uint8_t sc, m;
            get_scale_min_k4(is + 0, scales, &sc, &m);
            const __m512 d1 = _mm512_set1_ps(d * sc), m1 = _mm512_set1_ps(dmin * m);
            get_scale_min_k4(is + 1, scales, &sc, &m);
            const __m512 d2 = _mm512_set1_ps(d * sc), m2 = _mm512_set1_ps(dmin * m);
            const __m256i raw = _mm256_loadu_si256((const __m256i *)q);
            __m512 f[2];
            i8x32_to_f32(_mm256_and_si256(raw, m4), f);
            _mm512_storeu_ps(y + 0, _mm512_sub_ps(_mm512_mul_ps(d1, f[0]), m1));
            _mm512_storeu_ps(y + 16, _mm512_sub_ps(_mm512_mul_ps(d1, f[1]), m1));
            i8x32_to_f32(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), f);
            _mm512_storeu_ps(y + 32, _mm512_sub_ps(_mm512_mul_ps(d2, f[0]), m2));
            _mm512_storeu_ps(y + 48, _mm512_sub_ps(_mm512_mul_ps(d2, f[1]), m2));
        }
    }
}

/* Q6_K: see dequant_row_q6_K_avx2 for the layout. */
static void dequant_row_q6_K_avx512(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m2 = _mm256_set1_epi8(0x03);
    const __m256i off = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q6_K);
        const float d = rd_f16(b + offsetof(block_q6_K, d));
        const uint8_t *ql = b + offsetof(block_q6_K, ql);
        const uint8_t *qh = b + offsetof(block_q6_K, qh);
        const int8_t *sc = (const int8_t *)(b + offsetof(block_q6_K, scales));
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
            for (int t = 0; t < 4; t++) {
                __m512 f[2];
                i8x32_to_f32(_mm256_sub_epi8(q[t], off), f);
                _mm512_storeu_ps(y + 32 * t + 0, _mm512_mul_ps(_mm512_set1_ps(d * sc[2 * t + 0]), f[0]));
                _mm512_storeu_ps(y + 32 * t + 16, _mm512_mul_ps(_mm512_set1_ps(d * sc[2 * t + 1]), f[1]));
            }
        }
    }
}

/* ---- quantize --------------------------------------------------------------------------------- */

static void quant_row_f16_avx512(const float *x, void *vy, int64_t k) {
    uint8_t *y = vy;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_si256((__m256i *)(y + 2 * i), h);
    }
    for (; i < k; i++) wr_f16(y + 2 * i, x[i]);
}

static void quant_row_bf16_avx512(const float *x, void *vy, int64_t k) {
    uint8_t *y = vy;
    int64_t i = 0;
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    const __m512i inf = _mm512_set1_epi32(0x7f800000);
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i bias = _mm512_set1_epi32(0x7fff);
    const __m512i quiet = _mm512_set1_epi32(64);
    for (; i + 16 <= k; i += 16) {
        const __m512i u = _mm512_loadu_si512((const void *)(x + i));
        const __mmask16 isnan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, absmask), inf);
        const __m512i rounded = _mm512_srli_epi32(
            _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one))), 16);
        const __m512i nanv = _mm512_or_si512(_mm512_srli_epi32(u, 16), quiet);
        const __m512i r = _mm512_mask_mov_epi32(rounded, isnan, nanv);
        _mm256_storeu_si256((__m256i *)(y + 2 * i), _mm512_cvtepi32_epi16(r)); /* each r < 2^16 */
    }
    for (; i < k; i++) {
        const llmrt_bf16_t h = llmrt_fp32_to_bf16(x[i]);
        memcpy(y + 2 * i, &h, sizeof(h));
    }
}

/* roundf(v) (ties away from zero) for |v| < 2^23, exactly. */
static inline __m512i roundf_epi32(__m512 v) {
    const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
    const __mmask16 ge = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000u));
    const __m512 step = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_castps_si512(_mm512_set1_ps(1.0f))));
    return _mm512_cvttps_epi32(_mm512_mask_add_ps(t, ge, t, step));
}

/* One 32-element block with the reference Q8_0 rule; returns sum(q) (for Q8_1). */
static inline int quant_block_q8_avx512(const float *x, float *d_out, int8_t *qs) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    __m512i q0 = _mm512_setzero_si512(), q1 = _mm512_setzero_si512();
    if (isfinite(id)) { /* else d is subnormal: the reference stores 0 (see round_i8 in generic.c) */
        const __m512 vid = _mm512_set1_ps(id);
        q0 = roundf_epi32(_mm512_mul_ps(v0, vid));
        q1 = roundf_epi32(_mm512_mul_ps(v1, vid));
    }
    _mm_storeu_si128((__m128i *)qs, _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtsepi32_epi8(q1));
    *d_out = d;
    return _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
}

static void quant_row_q8_0_avx512(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q8_0);
        float d;
        quant_block_q8_avx512(x, &d, (int8_t *)(b + offsetof(block_q8_0, qs)));
        wr_f16(b + offsetof(block_q8_0, d), d);
    }
}

static void quant_row_q8_1_avx512(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++, x += QK8_1) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q8_1);
        float d;
        const int sum = quant_block_q8_avx512(x, &d, (int8_t *)(b + offsetof(block_q8_1, qs)));
        wr_f16(b + offsetof(block_q8_1, d), d);
        wr_f16(b + offsetof(block_q8_1, s), (float)sum * d);
    }
}

/* Q8_K: see quant_row_q8_K_generic; one 16-float vector is exactly one bsums group. */
static void quant_row_q8_K_avx512(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q8_K);
        int8_t *qs = (int8_t *)(b + offsetof(block_q8_K, qs));
        __m512 vmax = _mm512_setzero_ps();
        for (int j = 0; j < QK_K; j += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
        const float amax = _mm512_reduce_max_ps(vmax);
        if (!amax) {
            memset(b, 0, sizeof(block_q8_K)); /* d = 0.0f, q = 0, bsums = 0 */
            continue;
        }
        float max = 0.0f;
        const __m512 vam = _mm512_set1_ps(amax);
        for (int j = 0; j < QK_K; j += 16) {
            const __mmask16 mask = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + j)), vam, _CMP_EQ_OQ);
            if (mask) {
                max = x[j + __builtin_ctz((unsigned)mask)];
                break;
            }
        }
        const float iscale = -127.f / max;
        if (!isfinite(iscale)) { /* max subnormal: the reference stores 0 quants */
            memset(b, 0, sizeof(block_q8_K));
            const float d = 1 / iscale;
            memcpy(b + offsetof(block_q8_K, d), &d, sizeof(d));
            continue;
        }
        const __m512 vis = _mm512_set1_ps(iscale);
        const __m512i lim = _mm512_set1_epi32(127);
        int16_t bsums[QK_K / 16];
        for (int j = 0; j < QK_K; j += 16) {
            const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + j), vis);
            const __m512i q = _mm512_min_epi32(
                _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), lim);
            bsums[j / 16] = (int16_t)_mm512_reduce_add_epi32(q);
            _mm_storeu_si128((__m128i *)(qs + j), _mm512_cvtsepi32_epi8(q));
        }
        memcpy(b + offsetof(block_q8_K, bsums), bsums, sizeof(bsums));
        const float d = 1 / iscale;
        memcpy(b + offsetof(block_q8_K, d), &d, sizeof(d));
    }
}

#define SET_DEQ(T, fn) do { kt->dequant_row[T] = fn; kt->dequant_row_name[T] = #fn; } while (0)
#define SET_Q(T, fn) do { kt->quant_row[T] = fn; kt->quant_row_name[T] = #fn; } while (0)

void llmrt_register_kernels_avx512(llmrt_kernel_table *kt) {
    SET_DEQ(LLMRT_TYPE_F16, dequant_row_f16_avx512);
    SET_DEQ(LLMRT_TYPE_Q4_0, dequant_row_q4_0_avx512);
    SET_DEQ(LLMRT_TYPE_Q4_1, dequant_row_q4_1_avx512);
    SET_DEQ(LLMRT_TYPE_Q5_0, dequant_row_q5_0_avx512);
    SET_DEQ(LLMRT_TYPE_Q8_0, dequant_row_q8_0_avx512);
    SET_DEQ(LLMRT_TYPE_Q4_K, dequant_row_q4_K_avx512);
    SET_DEQ(LLMRT_TYPE_Q6_K, dequant_row_q6_K_avx512);

    SET_Q(LLMRT_TYPE_F16, quant_row_f16_avx512);
    SET_Q(LLMRT_TYPE_BF16, quant_row_bf16_avx512);
    SET_Q(LLMRT_TYPE_Q8_0, quant_row_q8_0_avx512);
    SET_Q(LLMRT_TYPE_Q8_1, quant_row_q8_1_avx512);
    SET_Q(LLMRT_TYPE_Q8_K, quant_row_q8_K_avx512);
}

#else /* not x86-64: the level is never selected */

void llmrt_register_kernels_avx512(llmrt_kernel_table *kt) {
    (void)kt;
}

#endif
