/* avx2.c — kernels for the avx2 ISA level (AVX2 + FMA + F16C). Compiled for this target only
 * (pragma below); the register function is called only when the CPU supports the level.
 *
 * Dequantize: F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, 8 floats per step. Each value is the same
 * float expression as in generic.c, evaluated in the same order and unfused (fp-contract=off), so
 * the output is bit-identical to the generic kernels.
 * Quantize (activations): F16, BF16, Q8_0, Q8_1, Q8_K, bit-identical to generic.c: roundf ties
 * away from zero for Q8_0/Q8_1 (done exactly: trunc, then +-1 when |frac| >= 0.5), nearest_int
 * ties to even for Q8_K (the default MXCSR rounding of cvtps2dq).
 * Activation quantizers (kernel table's quant_act_row, used by mul_mat): Q8_0 / Q8_1 as ggml's
 * x86 quantize_row_q8_0 / q8_1 run them (id = 127 / amax, ties to even), so llmrt's activation
 * blocks are byte-identical to llama.cpp's; the other types use the reference kernels above.
 *
 * Blocks are read with unaligned loads / memcpy: a row may start at any address.
 */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "../quant_common.h" /* rd_f16, get_scale_min_k4 */

#if defined(__x86_64__)
#include "simd_avx2.h" /* unpack_nibbles_32, expand_bits_32, hsum_i32 */

/* ---- helpers ---------------------------------------------------------------------------------- */

/* wr_f16 with F16C: rounds to nearest even like llmrt_fp32_to_fp16 (they differ only in NaN payloads). */
static inline void wr_f16_f16c(uint8_t *p, float f) {
    const llmrt_fp16_t h = (llmrt_fp16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    memcpy(p, &h, sizeof(h));
}

/* Converts 32 int8 (in a 256-bit register) to 4 x 8 floats. */
static inline void i8x32_to_f32(__m256i q, __m256 out[4]) {
    const __m128i q0 = _mm256_castsi256_si128(q);
    const __m128i q1 = _mm256_extracti128_si256(q, 1);
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8)));
    out[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1));
    out[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8)));
}

/* ---- dequantize ------------------------------------------------------------------------------- */

static void dequant_row_f16_avx2(const void *vx, float *y, int64_t k) {
    const uint8_t *x = vx;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(x + 2 * i));
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
    }
    for (; i < k; i++) y[i] = rd_f16(x + 2 * i);
}

static void dequant_row_q4_0_avx2(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK4_0;
    const __m256i off = _mm256_set1_epi8(8);
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q4_0);
        const __m256 d = _mm256_set1_ps(rd_f16(b + offsetof(block_q4_0, d)));
        const __m256i q = _mm256_sub_epi8(unpack_nibbles_32(b + offsetof(block_q4_0, qs)), off);
        __m256 f[4];
        i8x32_to_f32(q, f);
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(y + 8 * j, _mm256_mul_ps(f[j], d));
    }
}

static void dequant_row_q4_1_avx2(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK4_1;
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q4_1);
        const __m256 d = _mm256_set1_ps(rd_f16(b + offsetof(block_q4_1, d)));
        const __m256 m = _mm256_set1_ps(rd_f16(b + offsetof(block_q4_1, m)));
        const __m256i q = unpack_nibbles_32(b + offsetof(block_q4_1, qs));
        __m256 f[4];
        i8x32_to_f32(q, f);
        for (int j = 0; j < 4; j++) {
            _mm256_storeu_ps(y + 8 * j, _mm256_add_ps(_mm256_mul_ps(f[j], d), m));
        }
    }
}

static void dequant_row_q5_0_avx2(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK5_0;
    const __m256i off = _mm256_set1_epi8(16);
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q5_0);
        const __m256 d = _mm256_set1_ps(rd_f16(b + offsetof(block_q5_0, d)));
        uint32_t qh;
        memcpy(&qh, b + offsetof(block_q5_0, qh), sizeof(qh));
        const __m256i hi = _mm256_and_si256(expand_bits_32(qh), bit4);
        __m256i q = _mm256_or_si256(unpack_nibbles_32(b + offsetof(block_q5_0, qs)), hi);
        q = _mm256_sub_epi8(q, off);
        __m256 f[4];
        i8x32_to_f32(q, f);
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(y + 8 * j, _mm256_mul_ps(f[j], d));
    }
}

static void dequant_row_q8_0_avx2(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q8_0);
        const __m256 d = _mm256_set1_ps(rd_f16(b + offsetof(block_q8_0, d)));
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + offsetof(block_q8_0, qs)));
        __m256 f[4];
        i8x32_to_f32(q, f);
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(y + 8 * j, _mm256_mul_ps(f[j], d));
    }
}

/* Q4_K: per 64 elements, 32 bytes: low nibbles -> sub-block 2j, high nibbles -> 2j+1.
 * x = (d * sc) * q - (dmin * m). */
static void dequant_row_q4_K_avx2(const void *vx, float *y, int64_t k) {
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
            const __m256 d1 = _mm256_set1_ps(d * sc), m1 = _mm256_set1_ps(dmin * m);
            get_scale_min_k4(is + 1, scales, &sc, &m);
            const __m256 d2 = _mm256_set1_ps(d * sc), m2 = _mm256_set1_ps(dmin * m);
            const __m256i raw = _mm256_loadu_si256((const __m256i *)q);
            __m256 f[4];
            i8x32_to_f32(_mm256_and_si256(raw, m4), f);
            for (int j = 0; j < 4; j++) _mm256_storeu_ps(y + 8 * j, _mm256_sub_ps(_mm256_mul_ps(d1, f[j]), m1));
            i8x32_to_f32(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), f);
            for (int j = 0; j < 4; j++) _mm256_storeu_ps(y + 32 + 8 * j, _mm256_sub_ps(_mm256_mul_ps(d2, f[j]), m2));
        }
    }
}

/* Q6_K: per 128 elements, ql[64] and qh[32]; element l + 32*t (t = 0..3, l = 0..31) takes the
 * nibble (t < 2 ? low : high) of ql[l + 32*(t & 1)] and 2 bits (2*t) of qh[l]; scale sc[l/16 + 2*t].
 * x = (d * sc) * (q - 32). */
static void dequant_row_q6_K_avx2(const void *vx, float *y, int64_t k) {
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
                __m256 f[4];
                i8x32_to_f32(_mm256_sub_epi8(q[t], off), f);
                const __m256 s0 = _mm256_set1_ps(d * sc[2 * t + 0]); /* elements 0..15 */
                const __m256 s1 = _mm256_set1_ps(d * sc[2 * t + 1]); /* elements 16..31 */
                _mm256_storeu_ps(y + 32 * t + 0, _mm256_mul_ps(s0, f[0]));
                _mm256_storeu_ps(y + 32 * t + 8, _mm256_mul_ps(s0, f[1]));
                _mm256_storeu_ps(y + 32 * t + 16, _mm256_mul_ps(s1, f[2]));
                _mm256_storeu_ps(y + 32 * t + 24, _mm256_mul_ps(s1, f[3]));
            }
        }
    }
}

/* ---- quantize --------------------------------------------------------------------------------- */

static void quant_row_f16_avx2(const float *x, void *vy, int64_t k) {
    uint8_t *y = vy;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(y + 2 * i), h);
    }
    for (; i < k; i++) wr_f16_f16c(y + 2 * i, x[i]);
}

/* bf16 = round-to-nearest-even of the top 16 bits; NaN -> quiet NaN (same as llmrt_fp32_to_bf16). */
static void quant_row_bf16_avx2(const float *x, void *vy, int64_t k) {
    uint8_t *y = vy;
    int64_t i = 0;
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000);
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i bias = _mm256_set1_epi32(0x7fff);
    const __m256i quiet = _mm256_set1_epi32(64);
    for (; i + 16 <= k; i += 16) {
        __m256i r[2];
        for (int h = 0; h < 2; h++) {
            const __m256i u = _mm256_loadu_si256((const __m256i *)(x + i + 8 * h));
            const __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
            const __m256i rounded = _mm256_srli_epi32(
                _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one))), 16);
            const __m256i nanv = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
            r[h] = _mm256_blendv_epi8(rounded, nanv, isnan);
        }
        /* pack 2 x 8 uint32 (each < 65536) into 16 uint16, fixing packus' lane interleave */
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
        _mm256_storeu_si256((__m256i *)(y + 2 * i), p);
    }
    for (; i < k; i++) {
        const llmrt_bf16_t h = llmrt_fp32_to_bf16(x[i]);
        memcpy(y + 2 * i, &h, sizeof(h));
    }
}

static inline float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* roundf(v) (ties away from zero) for |v| < 2^23, exactly: t = trunc(v); v - t is exact. */
static inline __m256i roundf_epi32(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    const __m256 ge = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f)); /* +-1 */
    return _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(ge, step)));
}

/* 4 x 8 int32 (each in [-128, 127]) -> 32 int8 in order. */
static inline __m256i pack_i32x32_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_packs_epi32(a, b); /* a0-3 b0-3 | a4-7 b4-7 */
    const __m256i cd = _mm256_packs_epi32(c, d);
    const __m256i abcd = _mm256_packs_epi16(ab, cd); /* a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7 */
    return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* One 32-element block with the reference Q8_0 rule; returns sum(q) (for Q8_1). */
static inline int quant_block_q8_avx2(const float *x, float *d_out, int8_t *qs) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_loadu_ps(x + 8 * j);
        amax = _mm256_max_ps(amax, _mm256_and_ps(v[j], absmask));
    }
    const float d = hmax_ps(amax) / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int j = 0; j < 4; j++) q[j] = roundf_epi32(_mm256_mul_ps(v[j], vid));
    if (!isfinite(id)) { /* d subnormal: the reference stores 0 (see round_i8 in generic.c) */
        for (int j = 0; j < 4; j++) q[j] = _mm256_setzero_si256();
    }
    const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)qs, pack_i32x32_i8(q[0], q[1], q[2], q[3]));
    *d_out = d;
    return hsum_i32(sum);
}

static void quant_row_q8_0_avx2(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q8_0);
        float d;
        quant_block_q8_avx2(x, &d, (int8_t *)(b + offsetof(block_q8_0, qs)));
        wr_f16_f16c(b + offsetof(block_q8_0, d), d);
    }
}

static void quant_row_q8_1_avx2(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++, x += QK8_1) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q8_1);
        float d;
        const int sum = quant_block_q8_avx2(x, &d, (int8_t *)(b + offsetof(block_q8_1, qs)));
        wr_f16_f16c(b + offsetof(block_q8_1, d), d);
        wr_f16_f16c(b + offsetof(block_q8_1, s), (float)sum * d);
    }
}

/* ---- activation quantizers: ggml's x86 run-time quantize_row_q8_0 / q8_1 --------------------- */

/* One 32-element block as ggml's AVX2 quantize_row_q8_0 does it (not the reference): the
 * multiplier is id = 127 / amax (not 1 / d), and v * id is rounded to nearest, ties to EVEN
 * (round_ps with the default rounding mode). d = amax / 127 is stored as f16. Returns sum(q). */
static inline int quant_block_q8_act_avx2(const float *x, float *d_out, int8_t *qs) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4];
    __m256 amax = _mm256_and_ps(_mm256_loadu_ps(x), absmask);
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_loadu_ps(x + 8 * j);
        amax = _mm256_max_ps(amax, _mm256_and_ps(v[j], absmask));
    }
    const float m = hmax_ps(amax);
    const float d = m / 127.f;
    const float id = m != 0.0f ? 127.f / m : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int j = 0; j < 4; j++) {
        q[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], vid),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)qs, pack_i32x32_i8(q[0], q[1], q[2], q[3]));
    *d_out = d;
    return hsum_i32(sum);
}

static void quant_act_row_q8_0_avx2(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q8_0);
        float d;
        quant_block_q8_act_avx2(x, &d, (int8_t *)(b + offsetof(block_q8_0, qs)));
        wr_f16_f16c(b + offsetof(block_q8_0, d), d);
    }
}

static void quant_act_row_q8_1_avx2(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++, x += QK8_1) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q8_1);
        float d;
        const int sum = quant_block_q8_act_avx2(x, &d, (int8_t *)(b + offsetof(block_q8_1, qs)));
        wr_f16_f16c(b + offsetof(block_q8_1, d), d);
        wr_f16_f16c(b + offsetof(block_q8_1, s), d * (float)sum);
    }
}

/* Q8_K: see quant_row_q8_K_generic. The signed max is the first element whose |x| equals the
 * block's max |x| (first on ties, as the reference's strict '>' scan). */
static void quant_row_q8_K_avx2(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK_K;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q8_K);
        int8_t *qs = (int8_t *)(b + offsetof(block_q8_K, qs));
        __m256 vmax = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + j), absmask));
        const float amax = hmax_ps(vmax);
        if (!amax) {
            memset(b, 0, sizeof(block_q8_K)); /* d = 0.0f, q = 0, bsums = 0 */
            continue;
        }
        float max = 0.0f;
        const __m256 vam = _mm256_set1_ps(amax);
        for (int j = 0; j < QK_K; j += 8) {
            const int mask = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absmask), vam, _CMP_EQ_OQ));
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
        const __m256 vis = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        int16_t bsums[QK_K / 16];
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            for (int t = 0; t < 4; t++) {
                const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * t), vis);
                q[t] = _mm256_min_epi32(_mm256_cvtps_epi32(v), lim); /* MXCSR default: ties to even */
            }
            bsums[j / 16 + 0] = (int16_t)hsum_i32(_mm256_add_epi32(q[0], q[1]));
            bsums[j / 16 + 1] = (int16_t)hsum_i32(_mm256_add_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(qs + j), pack_i32x32_i8(q[0], q[1], q[2], q[3]));
        }
        memcpy(b + offsetof(block_q8_K, bsums), bsums, sizeof(bsums));
        const float d = 1 / iscale;
        memcpy(b + offsetof(block_q8_K, d), &d, sizeof(d));
    }
}

/* ---- vector math: ggml's AVX2 + FMA paths (vec.h / vec.cpp) ----------------------------------- */

/* exp(x) for 8 floats: ggml_v_expf's algorithm (x = n ln2 + b with n = round(x / ln2) via the
 * 1.5 * 2^23 trick, a degree-5 polynomial in b, and a two-scale path for |n| > 126 that gives
 * 0 / inf / subnormals), with the same fused operations in the same order. */
static inline __m256 v_expf_avx2(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
    const __m256 absn = _mm256_andnot_ps(_mm256_set1_ps(-0.f), n);
    const __m256 c = _mm256_cmp_ps(absn, _mm256_set1_ps(126), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    if (!_mm256_movemask_ps(c)) return _mm256_fmadd_ps(j, k, k);
    /* |n| > 126: scale in two steps s1 * s2 (s1 = 2^127 or 2^-125 by the sign of n) */
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 d = _mm256_cmp_ps(absn, _mm256_set1_ps(192), _CMP_GT_OQ);
    return _mm256_or_ps(_mm256_and_ps(d, _mm256_mul_ps(s1, s1)),
                        _mm256_andnot_ps(d, _mm256_or_ps(_mm256_and_ps(c, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                                                         _mm256_andnot_ps(c, _mm256_fmadd_ps(k, j, k)))));
}

/* silu(x) = x / (1 + exp(-x)) for 8 floats (ggml_v_silu) */
static inline __m256 v_silu_avx2(__m256 x) {
    const __m256 neg_x = _mm256_sub_ps(_mm256_setzero_ps(), x);
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1), v_expf_avx2(neg_x)));
}

/* scalar tails: ggml_silu_f32 with libm expf */
static inline float silu_f32_scalar(float x) {
    return x / (1.0f + expf(-x));
}

static void vec_swiglu_avx2(int n, float *y, const float *x, const float *g) {
    int i = 0;
    for (; i + 7 < n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_mul_ps(v_silu_avx2(_mm256_loadu_ps(x + i)), _mm256_loadu_ps(g + i)));
    }
    for (; i < n; i++) y[i] = silu_f32_scalar(x[i]) * g[i];
}

static void vec_silu_avx2(int n, float *y, const float *x) {
    int i = 0;
    for (; i + 7 < n; i += 8) _mm256_storeu_ps(y + i, v_silu_avx2(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = silu_f32_scalar(x[i]);
}

/* GELU through the f16 table (GGML_GELU_FP16), 8 at a time: F16C rounds x to half (to nearest
 * even, as the scalar conversion), a 32-bit gather at 2 * h reads table[h] in its low half (the
 * table has spare entries past 0xffff), F16C widens it back; lanes at or above 10 take x, at or
 * below -10 zero. The same values as the scalar loop, so the same results bit for bit. */
static inline __m256 v_gelu_table_avx2(__m256 x, __m256 *lo) {
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i t = _mm256_i32gather_epi32((const int *)(const void *)llmrt_table_gelu_f16,
                                             _mm256_cvtepu16_epi32(h), 2);
    /* low 16 bits of each lane -> 8 packed halves (packus keeps them: and-ed to 16 bits) */
    const __m256i t16 = _mm256_and_si256(t, _mm256_set1_epi32(0xffff));
    const __m256i pk = _mm256_permute4x64_epi64(_mm256_packus_epi32(t16, t16), 0x08);
    const __m256 v = _mm256_cvtph_ps(_mm256_castsi256_si128(pk));
    *lo = _mm256_cmp_ps(x, _mm256_set1_ps(-10.0f), _CMP_LE_OQ);
    const __m256 hi = _mm256_cmp_ps(x, _mm256_set1_ps(10.0f), _CMP_GE_OQ);
    return _mm256_blendv_ps(v, x, hi);
}

static void vec_gelu_avx2(int n, float *y, const float *x) {
    int i = 0;
    for (; i + 7 < n; i += 8) {
        __m256 lo;
        const __m256 v = v_gelu_table_avx2(_mm256_loadu_ps(x + i), &lo);
        _mm256_storeu_ps(y + i, _mm256_andnot_ps(lo, v));
    }
    for (; i < n; i++) y[i] = llmrt_gelu_table_f32(x[i]);
}

static void vec_geglu_avx2(int n, float *y, const float *x, const float *g) {
    int i = 0;
    for (; i + 7 < n; i += 8) {
        __m256 lo;
        const __m256 v = v_gelu_table_avx2(_mm256_loadu_ps(x + i), &lo);
        _mm256_storeu_ps(y + i, _mm256_andnot_ps(lo, _mm256_mul_ps(v, _mm256_loadu_ps(g + i))));
    }
    for (; i < n; i++) y[i] = x[i] <= -10.0f ? 0.0f : llmrt_gelu_table_f32(x[i]) * g[i];
}

/* ggml_vec_soft_max_f32: blocks of 8 with the vector exp, each block's f32 horizontal sum added to
 * a double; then a scalar tail with libm expf. */
static double vec_soft_max_avx2(int n, float *y, const float *x, float max) {
    int i = 0;
    double sum = 0.0;
    for (; i + 7 < n; i += 8) {
        const __m256 val = v_expf_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(max)));
        _mm256_storeu_ps(y + i, val);
        __m128 v2 = _mm_add_ps(_mm256_extractf128_ps(val, 1), _mm256_castps256_ps128(val));
        v2 = _mm_add_ps(v2, _mm_movehl_ps(v2, v2));
        v2 = _mm_add_ss(v2, _mm_movehdup_ps(v2));
        sum += (double)_mm_cvtss_f32(v2);
    }
    for (; i < n; i++) {
        const float val = expf(x[i] - max);
        sum += (double)val;
        y[i] = val;
    }
    return sum;
}

#define SET_DEQ(T, fn) do { kt->dequant_row[T] = fn; kt->dequant_row_name[T] = #fn; } while (0)
#define SET_Q(T, fn) do { kt->quant_row[T] = fn; kt->quant_row_name[T] = #fn; } while (0)
#define SET_QA(T, fn) do { kt->quant_act_row[T] = fn; kt->quant_act_row_name[T] = #fn; } while (0)

void llmrt_register_kernels_avx2(llmrt_kernel_table *kt) {
    SET_DEQ(LLMRT_TYPE_F16, dequant_row_f16_avx2);
    SET_DEQ(LLMRT_TYPE_Q4_0, dequant_row_q4_0_avx2);
    SET_DEQ(LLMRT_TYPE_Q4_1, dequant_row_q4_1_avx2);
    SET_DEQ(LLMRT_TYPE_Q5_0, dequant_row_q5_0_avx2);
    SET_DEQ(LLMRT_TYPE_Q8_0, dequant_row_q8_0_avx2);
    SET_DEQ(LLMRT_TYPE_Q4_K, dequant_row_q4_K_avx2);
    SET_DEQ(LLMRT_TYPE_Q6_K, dequant_row_q6_K_avx2);

    SET_Q(LLMRT_TYPE_F16, quant_row_f16_avx2);
    SET_Q(LLMRT_TYPE_BF16, quant_row_bf16_avx2);
    SET_Q(LLMRT_TYPE_Q8_0, quant_row_q8_0_avx2);
    SET_Q(LLMRT_TYPE_Q8_1, quant_row_q8_1_avx2);
    SET_Q(LLMRT_TYPE_Q8_K, quant_row_q8_K_avx2);

    kt->vec_swiglu = vec_swiglu_avx2;
    kt->vec_swiglu_name = "vec_swiglu_avx2";
    kt->vec_silu = vec_silu_avx2;
    kt->vec_silu_name = "vec_silu_avx2";
    kt->vec_soft_max = vec_soft_max_avx2;
    kt->vec_soft_max_name = "vec_soft_max_avx2";
    kt->vec_gelu = vec_gelu_avx2;
    kt->vec_gelu_name = "vec_gelu_avx2";
    kt->vec_geglu = vec_geglu_avx2;
    kt->vec_geglu_name = "vec_geglu_avx2";

    /* activations: ggml's run-time rounding for Q8_0 / Q8_1, the reference one for the rest */
    SET_QA(LLMRT_TYPE_F16, quant_row_f16_avx2);
    SET_QA(LLMRT_TYPE_BF16, quant_row_bf16_avx2);
    SET_QA(LLMRT_TYPE_Q8_0, quant_act_row_q8_0_avx2);
    SET_QA(LLMRT_TYPE_Q8_1, quant_act_row_q8_1_avx2);
    SET_QA(LLMRT_TYPE_Q8_K, quant_row_q8_K_avx2);
}

#else /* not x86-64: the level is never selected */

void llmrt_register_kernels_avx2(llmrt_kernel_table *kt) {
    (void)kt;
}

#endif
