/*
 * dot_avx2.c — dot-product kernels (weight type x activation type) for the AVX2 level
 * (AVX2 + FMA + F16C). Compiled for this target only (pragma below); the register function is
 * called only when the CPU supports the level.
 *
 * Same results as dot_generic.c up to f32 rounding: the integer sums inside a block are exact, only
 * the order of the f32 accumulation differs. The integer work uses the usual AVX2 idiom:
 *   maddubs(u8 x, s8 y) -> i16 pair sums, madd(i16, i16 scale or 1) -> i32.
 * maddubs saturates at ±32767, so operands are kept where a pair cannot reach that:
 *   - unsigned weights (Q4_1, Q5_1, K-quants) are at most 63: 2·63·128 < 32767;
 *   - offset weights (Q4_0 q - 8, Q5_0 q - 16, Q3_K q - 4, Q6_K q - 32) are computed as
 *     maddubs(q, y) - maddubs(offset, y), exact for every y;
 *   - signed weights (Q8_0, IQ4_NL, IQ4_XS) go through the sign trick
 *     maddubs(|x|, sign(y, x)), exact while y != -128. ggml's activation quantizers (Q8_0, Q8_1,
 *     Q8_K) only produce [-127, 127], so that holds for every activation row they make;
 * F32/F16/BF16 accumulate in one chain of 8 f32 lanes (llama.cpp's prefill order, see below), then a
 * scalar tail that reads only the row; attention keeps ggml_vec_dot_f16's 4 chains (attn_dot_*).
 *
 * Bit-exactness with llama.cpp: the kernels ggml runs for a single token (vec_dot at n_batch = 1)
 * are reproduced in ggml's exact f32 order: the same integer lane partition (lane k of a block's
 * 8 i32 sums holds elements 4k..4k+3), one accumulator chain in block order, ggml's hsum, and the
 * scalar FMAs that ggml's -march=native build contracts (e.g. Q4_1's Σ m·s). Q4_0, IQ4_NL and
 * Q4_K take the order of the repacked kernels llama.cpp runs for them on AVX2 at every batch size
 * (whole-block integer sums, one f32 fma per block); the float types ggml's prefill order (tinyBLAS,
 * one chain), which their packed GEMM can tile.
 */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"

#include <math.h>
#include <string.h>

#include "../quant_common.h" /* kvalues_iq4nl, unpack_scales_mins_k4, unpack_scales_q3_k */

#if defined(__x86_64__)
#include "simd_avx2.h" /* f16, loads, hsum_ps / hsum_i32, nibbles, dot_*_i8, shr_bytes */

/* ---- helpers ----------------------------------------------------------------------------------- */

/* i16 pair sums of x·y with x signed (sign trick), for a later madd with scales. */
static inline __m256i maddubs_i8_i8(__m256i x, __m256i y) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* 16 i16 lanes: lanes 0..7 = a (first 16 elements of a 32-byte group), lanes 8..15 = b. */
static inline __m256i scales_2x8(int a, int b) {
    return _mm256_set_m128i(_mm_set1_epi16((short)b), _mm_set1_epi16((short)a));
}

/* ---- float types ------------------------------------------------------------------------------- */

/* F32 / F16 / BF16 share one loop; `kind` is a constant at each call, so each kernel gets its own
 * specialized copy. */
enum { KIND_F32, KIND_F16, KIND_BF16 };

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE __m256 load8_ps(const void *p, int i, int kind) {
    switch (kind) {
    case KIND_F16: return _mm256_cvtph_ps(loadu128((const llmrt_fp16_t *)p + i));
    case KIND_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(loadu128((const llmrt_bf16_t *)p + i)), 16));
    default: return _mm256_loadu_ps((const float *)p + i);
    }
}

static ALWAYS_INLINE float load1_ps(const void *p, int i, int kind) {
    switch (kind) {
    case KIND_F16: return f16(((const llmrt_fp16_t *)p)[i]);
    case KIND_BF16: return llmrt_bf16_to_fp32(((const llmrt_bf16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* Weight matmuls (vec_dot[T], and the packed GEMV / GEMM of gemm_k_avx2.c with the same bits): one
 * chain of 8 f32 lanes over steps of 8 (lane l += x[i + l] * y[i + l], one fma), hsum_ps (halves,
 * then movehl, then movehdup), then the tail (n % 8 elements) in double, one f32 product at a time.
 * For n % 8 == 0 that is llama.cpp's own prefill order for these types (llamafile's tinyBLAS on
 * AVX2: one __m256 accumulator per output over steps of 8, the same hsum); its batch-1 vec_dot
 * keeps 4 accumulators (attn_dot_* below). One chain is what lets the packed GEMM stream each
 * weight and activation row once per tile: the 4 chains ran one pass each over L1-sized segments,
 * and every pass's first touch of a line came from L2 in a burst (F16 prefill at 68 % of the fma
 * peak vs 85 % with one chain, Zen 3). */
static ALWAYS_INLINE void vec_dot_float(int n, float *s, const void *x, const void *y, int kind) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(load8_ps(x, i, kind), load8_ps(y, i, kind), acc);
    double sum = hsum_ps(acc);
    for (; i < n; i++) sum += (double)(load1_ps(x, i, kind) * load1_ps(y, i, kind)); /* tail: never past the row */
    *s = (float)sum;
}

static void vec_dot_f32_avx2(int n, float *s, const void *x, const void *y) { vec_dot_float(n, s, x, y, KIND_F32); }
static void vec_dot_f16_avx2(int n, float *s, const void *x, const void *y) { vec_dot_float(n, s, x, y, KIND_F16); }
static void vec_dot_bf16_avx2(int n, float *s, const void *x, const void *y) { vec_dot_float(n, s, x, y, KIND_BF16); }

/* Attention's dots (attn_pv_dot / attn_qk_dot / attn_dots_dot, reproduced by attn_avx2.c's
 * kernels): ggml_vec_dot_f16 on AVX2 in its exact order, and the f32 analogue.
 * F32: 4 chains of 8 lanes over steps of 32 (chain c: elements 8c..8c+7 of each step), then steps
 * of 8 into chain 0, hsum_ps((c0 + c1) + (c2 + c3)) in double, then the scalar tail in double. */
void llmrt_attn_dot_f32_avx2(int n, float *s, const void *x, const void *y) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(load8_ps(x, i, KIND_F32), load8_ps(y, i, KIND_F32), acc0);
        acc1 = _mm256_fmadd_ps(load8_ps(x, i + 8, KIND_F32), load8_ps(y, i + 8, KIND_F32), acc1);
        acc2 = _mm256_fmadd_ps(load8_ps(x, i + 16, KIND_F32), load8_ps(y, i + 16, KIND_F32), acc2);
        acc3 = _mm256_fmadd_ps(load8_ps(x, i + 24, KIND_F32), load8_ps(y, i + 24, KIND_F32), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load8_ps(x, i, KIND_F32), load8_ps(y, i, KIND_F32), acc0);
    double sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += (double)(load1_ps(x, i, KIND_F32) * load1_ps(y, i, KIND_F32));
    *s = (float)sum;
}

/* F16: ggml_vec_dot_f16 on AVX2, in its exact order: 4 accumulators of 8 lanes over steps of 32,
 * reduced as (a0 + a2) + (a1 + a3), then the 128-bit halves, then two hadds; the tail (n % 32
 * elements) is added in double, one f32 product at a time. */
void llmrt_attn_dot_f16_avx2(int n, float *s, const void *vx, const void *vy) {
    const llmrt_fp16_t *x = vx; /* (n) */
    const llmrt_fp16_t *y = vy; /* (n) */
    const int np = n & ~31;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int i = 0; i < np; i += 32) {
        for (int j = 0; j < 4; j++) {
            const __m256 ax = _mm256_cvtph_ps(loadu128(x + i + 8 * j));
            const __m256 ay = _mm256_cvtph_ps(loadu128(y + i + 8 * j));
            acc[j] = _mm256_fmadd_ps(ax, ay, acc[j]);
        }
    }
    acc[0] = _mm256_add_ps(acc[0], acc[2]);
    acc[1] = _mm256_add_ps(acc[1], acc[3]);
    acc[0] = _mm256_add_ps(acc[0], acc[1]);
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(acc[0]), _mm256_extractf128_ps(acc[0], 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    double sum = (double)_mm_cvtss_f32(_mm_hadd_ps(t1, t1));
    for (int i = np; i < n; i++) sum += (double)(f16(x[i]) * f16(y[i]));
    *s = (float)sum;
}

/* ---- 32-element blocks ------------------------------------------------------------------------- */

/* Q4_0 in llama.cpp's repacked order (its q4_0_8x8 gemv / gemm on AVX2, which it runs for every
 * batch size; gemm_avx2.c): per block the whole integer Σ (q - 8)·y, then
 * acc = fma(f32(isum), f32(d_x)·f32(d_y), acc) in block order; the result is acc. */
static void vec_dot_q4_0_q8_0_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx; /* (nb) */
    const block_q8_0 *y = vy; /* (nb) */
    const int nb = n / QK4_0;
    float acc = 0.0f;
    for (int ib = 0; ib < nb; ib++) {
        const __m256i qx = unpack_nibbles_32(x[ib].qs); /* q in 0..15, value q - 8 */
        const int isum = hsum_i32(dot_offset_u8_i8(qx, _mm256_set1_epi8(8), loadu256(y[ib].qs))); /* exact */
        acc = fmaf((float)isum, f16(x[ib].d) * f16(y[ib].d), acc);
    }
    *s = acc;
}

static void vec_dot_q4_1_q8_1_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx; /* (nb) */
    const block_q8_1 *y = vy; /* (nb) */
    const int nb = n / QK4_1;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f; /* Σ m · s */
    for (int ib = 0; ib < nb; ib++) {
        summs = fmaf(f16(x[ib].m), f16(y[ib].s), summs); /* fused, as ggml's build compiles it */
        const __m256 d = _mm256_set1_ps(f16(x[ib].d) * f16(y[ib].d));
        const __m256i qx = unpack_nibbles_32(x[ib].qs);
        const __m256i qy = loadu256(y[ib].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8_i8(qx, qy)), acc);
    }
    *s = hsum_ps(acc) + summs;
}

static void vec_dot_q5_0_q8_0_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx; /* (nb) */
    const block_q8_0 *y = vy; /* (nb) */
    const int nb = n / QK5_0;
    __m256 acc = _mm256_setzero_ps();
    for (int ib = 0; ib < nb; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, sizeof(qh));
        const __m256 d = _mm256_set1_ps(f16(x[ib].d) * f16(y[ib].d));
        const __m256i hi = _mm256_and_si256(expand_bits_32(qh), _mm256_set1_epi8(0x10));
        const __m256i qx = _mm256_or_si256(unpack_nibbles_32(x[ib].qs), hi); /* 0..31, value q - 16 */
        const __m256i qy = loadu256(y[ib].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_offset_u8_i8(qx, _mm256_set1_epi8(16), qy)), acc);
    }
    *s = hsum_ps(acc);
}

static void vec_dot_q5_1_q8_1_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q5_1 *x = vx; /* (nb) */
    const block_q8_1 *y = vy; /* (nb) */
    const int nb = n / QK5_1;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int ib = 0; ib < nb; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, sizeof(qh));
        summs = fmaf(f16(x[ib].m), f16(y[ib].s), summs); /* fused, as Q4_1 (and the packed gemm) */
        const __m256 d = _mm256_set1_ps(f16(x[ib].d) * f16(y[ib].d));
        const __m256i hi = _mm256_and_si256(expand_bits_32(qh), _mm256_set1_epi8(0x10));
        const __m256i qx = _mm256_or_si256(unpack_nibbles_32(x[ib].qs), hi);
        const __m256i qy = loadu256(y[ib].qs);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8_i8(qx, qy)), acc);
    }
    *s = hsum_ps(acc) + summs;
}

static void vec_dot_q8_0_q8_0_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx; /* (nb) */
    const block_q8_0 *y = vy; /* (nb) */
    const int nb = n / QK8_0;
    __m256 acc = _mm256_setzero_ps(); /* one chain, block order: ggml's order */
    for (int ib = 0; ib < nb; ib++) {
        const __m256 d = _mm256_set1_ps(f16(x[ib].d) * f16(y[ib].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8_i8(loadu256(x[ib].qs), loadu256(y[ib].qs))), acc);
    }
    *s = hsum_ps(acc);
}

static inline __m256i iq4nl_table(void) {
    return _mm256_broadcastsi128_si256(loadu128(kvalues_iq4nl));
}

/* IQ4_NL in llama.cpp's repacked order (iq4_nl_8x8, the q4_0_8x8 template with the level table):
 * per block the whole integer Σ level·y, acc = fma(f32(isum), f32(d_x)·f32(d_y), acc) */
static void vec_dot_iq4_nl_q8_0_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_iq4_nl *x = vx; /* (nb) */
    const block_q8_0 *y = vy;   /* (nb) */
    const int nb = n / QK4_NL;
    const __m256i table = iq4nl_table();
    float acc = 0.0f;
    for (int ib = 0; ib < nb; ib++) {
        const __m256i qx = _mm256_shuffle_epi8(table, unpack_nibbles_32(x[ib].qs));
        const int isum = hsum_i32(dot_i8_i8(qx, loadu256(y[ib].qs))); /* exact */
        acc = fmaf((float)isum, f16(x[ib].d) * f16(y[ib].d), acc);
    }
    *s = acc;
}

/* ---- 256-element super-blocks (activations Q8_K) ------------------------------------------------ */

/* Σ_j bsums[j] · m[j/2] for the 16 bsums of a Q8_K block and 8 mins. */
static inline int bsums_dot_mins8(const int16_t *bsums, const uint8_t *m) {
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)m)); /* m0..m7 */
    const __m256i mm = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
    return hsum_i32(_mm256_madd_epi16(loadu256(bsums), mm));
}

static void vec_dot_q2_K_q8_K_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q2_K *x = vx; /* (nb) */
    const block_q8_K *y = vy; /* (nb) */
    const int nb = n / QK_K;
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int i = 0; i < nb; i++) {
        const uint8_t *sc = x[i].scales; /* (16) low nibble scale, high nibble min */
        const __m128i scb = loadu128(sc);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(scb, 4), _mm_set1_epi8(0x0f)));
        const int summs = hsum_i32(_mm256_madd_epi16(loadu256(y[i].bsums), mins));
        __m256i isum = _mm256_setzero_si256();
        for (int k = 0; k < 2; k++) {
            const __m256i q2 = loadu256(x[i].qs + 32 * k);
            for (int j = 0; j < 4; j++) {
                const int g = 4 * k + j; /* group of 32 elements */
                const __m256i q = shr_bytes(q2, 2 * j, 0x03);
                const __m256i p = _mm256_maddubs_epi16(q, loadu256(y[i].qs + 32 * g));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scales_2x8(sc[2 * g] & 0x0f, sc[2 * g + 1] & 0x0f)));
            }
        }
        const float dall = y[i].d * f16(x[i].d);
        const float dmin = y[i].d * f16(x[i].dmin);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(isum), acc);
        summ = fmaf(dmin, (float)summs, summ); /* fused, as ggml's build compiles it */
    }
    *s = hsum_ps(acc) - summ;
}

static void vec_dot_q3_K_q8_K_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q3_K *x = vx; /* (nb) */
    const block_q8_K *y = vy; /* (nb) */
    const int nb = n / QK_K;
    const __m256i four = _mm256_set1_epi8(4);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        int8_t sc[16];
        unpack_scales_q3_k(x[i].scales, sc);
        const __m256i hm = loadu256(x[i].hmask);
        __m256i isum = _mm256_setzero_si256();
        for (int k = 0; k < 2; k++) {
            const __m256i q3 = loadu256(x[i].qs + 32 * k);
            for (int j = 0; j < 4; j++) {
                const int g = 4 * k + j;
                /* q = low 2 bits | high bit << 2, in 0..7; value = q - 4 */
                const __m256i q = _mm256_or_si256(shr_bytes(q3, 2 * j, 0x03),
                                                  _mm256_slli_epi16(shr_bytes(hm, g, 0x01), 2));
                const __m256i qy = loadu256(y[i].qs + 32 * g);
                const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, qy), _mm256_maddubs_epi16(four, qy));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scales_2x8(sc[2 * g], sc[2 * g + 1])));
            }
        }
        const float d = f16(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = hsum_ps(acc);
}

/* 8 i32 lanes summing to Σ_sub-blocks sc · Σ q·y over one Q4_K / Q5_K super-block; qh NULL for Q4_K
 * (layout in dot_generic.c). */
static ALWAYS_INLINE __m256i isum_k4(const uint8_t *qs, const uint8_t *qh, const uint8_t *sc, const int8_t *q8) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i h = qh ? loadu256(qh) : _mm256_setzero_si256();
    __m256i isum = _mm256_setzero_si256();
    for (int j = 0; j < QK_K / 64; j++) {
        const __m256i q4 = loadu256(qs + 32 * j);
        __m256i lo = _mm256_and_si256(q4, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
        if (qh) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(shr_bytes(h, 2 * j, 0x01), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(shr_bytes(h, 2 * j + 1, 0x01), 4));
        }
        const __m256i p0 = _mm256_maddubs_epi16(lo, loadu256(q8 + 64 * j));
        const __m256i p1 = _mm256_maddubs_epi16(hi, loadu256(q8 + 64 * j + 32));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * j])));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * j + 1])));
    }
    return isum;
}

/* Q4_K as ggml computes it for one token: its weights are repacked (8 rows interleaved, REPACK=1
 * on AVX2 when rows % 8 == 0) and ggml_gemv_q4_K_8x8_q8_K keeps each row's whole super-block sum
 * in one i32 lane, so per row and super-block: the exact integers Σ sc·q·y and Σ m·bsum, each
 * converted to f32 and accumulated in its own chain, acc = fma(isum, d·dy, acc); the result is
 * acc - acc_min. */
static void vec_dot_q4_K_q8_K_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx; /* (nb) */
    const block_q8_K *y = vy; /* (nb) */
    const int nb = n / QK_K;
    float acc = 0.0f, acc_min = 0.0f;
    for (int i = 0; i < nb; i++) {
        uint8_t sc[8], m[8];
        unpack_scales_mins_k4(x[i].scales, sc, m);
        const int isum = hsum_i32(isum_k4(x[i].qs, NULL, sc, y[i].qs));
        const int imin = bsums_dot_mins8(y[i].bsums, m);
        acc = fmaf((float)isum, f16(x[i].d) * y[i].d, acc);
        acc_min = fmaf((float)imin, f16(x[i].dmin) * y[i].d, acc_min);
    }
    *s = acc - acc_min;
}

static void vec_dot_q5_K_q8_K_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx; /* (nb) */
    const block_q8_K *y = vy; /* (nb) */
    const int nb = n / QK_K;
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int i = 0; i < nb; i++) {
        uint8_t sc[8], m[8];
        unpack_scales_mins_k4(x[i].scales, sc, m);
        const __m256i isum = isum_k4(x[i].qs, x[i].qh, sc, y[i].qs);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * y[i].d), _mm256_cvtepi32_ps(isum), acc);
        summ = fmaf(f16(x[i].dmin) * y[i].d, (float)bsums_dot_mins8(y[i].bsums, m), summ); /* fused, as ggml's build */
    }
    *s = hsum_ps(acc) - summ;
}

/* ggml_vec_dot_q6_K_q8_K's AVX2 order: unsigned 6-bit q (0..63) times y in 8 i32 lanes (lane k:
 * elements 4k..4k+3 of every 32-element group, scaled), minus the offset 32 as
 * (Σ_pairs bsum·sc) << 5 in the same lanes (lane k: bsums 2k, 2k+1), then one fma per block. */
static void vec_dot_q6_K_q8_K_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx; /* (nb) */
    const block_q8_K *y = vy; /* (nb) */
    const int nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const int8_t *sc = x[i].scales; /* (16) */
        const __m256i sc16 = _mm256_cvtepi8_epi16(loadu128(sc));
        const __m256i sub = _mm256_slli_epi32(_mm256_madd_epi16(loadu256(y[i].bsums), sc16), 5);
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = loadu256(x[i].ql + 64 * h);      /* groups 0 (low), 2 (high) */
            const __m256i ql1 = loadu256(x[i].ql + 64 * h + 32); /* groups 1 (low), 3 (high) */
            const __m256i qh = loadu256(x[i].qh + 32 * h);
            for (int g = 0; g < 4; g++) {
                const __m256i ql = (g % 2) ? ql1 : ql0;
                const __m256i nib = (g < 2) ? _mm256_and_si256(ql, m4)
                                            : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
                const __m256i q = _mm256_or_si256(nib, _mm256_slli_epi16(shr_bytes(qh, 2 * g, 0x03), 4));
                const __m256i qy = loadu256(y[i].qs + 128 * h + 32 * g);
                const __m256i p = _mm256_maddubs_epi16(q, qy); /* |pair| <= 2·63·128 */
                const int is = 8 * h + 2 * g;
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scales_2x8(sc[is], sc[is + 1])));
            }
        }
        isum = _mm256_sub_epi32(isum, sub);
        const float d = y[i].d * f16(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = hsum_ps(acc);
}

static void vec_dot_iq4_xs_q8_K_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_iq4_xs *x = vx; /* (nb) */
    const block_q8_K *y = vy;   /* (nb) */
    const int nb = n / QK_K;
    const __m256i table = iq4nl_table();
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        __m256i isum = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const int ls = ((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) |
                           (((x[i].scales_h >> (2 * ib)) & 3) << 4);
            const __m256i qx = _mm256_shuffle_epi8(table, unpack_nibbles_32(x[i].qs + 16 * ib));
            const __m256i p = maddubs_i8_i8(qx, loadu256(y[i].qs + 32 * ib)); /* |pair| <= 2·127·127 */
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_set1_epi16((short)(ls - 32))));
        }
        const float d4d8 = f16(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d4d8), _mm256_cvtepi32_ps(isum), acc);
    }
    *s = hsum_ps(acc);
}

#endif /* __x86_64__ */

void llmrt_register_dot_kernels_avx2(llmrt_kernel_table *kt) {
#if defined(__x86_64__)
#define REG(T, fn) do { kt->vec_dot[LLMRT_TYPE_##T] = fn; kt->vec_dot_name[LLMRT_TYPE_##T] = #fn; } while (0)
    REG(F32, vec_dot_f32_avx2);
    REG(F16, vec_dot_f16_avx2);
    REG(BF16, vec_dot_bf16_avx2);
    REG(Q4_0, vec_dot_q4_0_q8_0_avx2);
    REG(Q4_1, vec_dot_q4_1_q8_1_avx2);
    REG(Q5_0, vec_dot_q5_0_q8_0_avx2);
    REG(Q5_1, vec_dot_q5_1_q8_1_avx2);
    REG(Q8_0, vec_dot_q8_0_q8_0_avx2);
    REG(Q2_K, vec_dot_q2_K_q8_K_avx2);
    REG(Q3_K, vec_dot_q3_K_q8_K_avx2);
    REG(Q4_K, vec_dot_q4_K_q8_K_avx2);
    REG(Q5_K, vec_dot_q5_K_q8_K_avx2);
    REG(Q6_K, vec_dot_q6_K_q8_K_avx2);
    REG(IQ4_NL, vec_dot_iq4_nl_q8_0_avx2);
    REG(IQ4_XS, vec_dot_iq4_xs_q8_K_avx2);
#undef REG
#else
    (void)kt;
#endif
}
