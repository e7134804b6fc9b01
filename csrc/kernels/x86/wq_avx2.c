/*
 * wq_avx2.c — AVX2 kernels of the llmrt-private weight-only types (reference: ../wq_generic.c).
 *
 *   WQ_Q8A x Q8_1      int8 asym: |q_w| <= 128, |q_a| <= 127, so the maddubs pairs stay below
 *                      2 * 128 * 127 = 32512 (no i16 saturation); one f32 accumulator, block order.
 *   WQ_<L>_F32 / _BF16 a 32-block is dequantized into 4 x 8 f32 lanes and fma'd with the
 *                      activations into 4 accumulators, summed at the end (not the generic order:
 *                      results agree to f32 rounding, tests/test_wquant.py).
 */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"

#if defined(__x86_64__)
#include "simd_avx2.h"

/* 8 bytes at p (uint8 or int8 per `sgn`) -> 8 f32. */
static inline __m256 cvt8_u8(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)); }
static inline __m256 cvt8_i8(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); }

/* Dequantize one 32-block into w[0..3] (elements 8i..8i+7). */
static inline void deq_block_avx2(int layout, const void *blk, __m256 w[4]) {
    if (layout == LLMRT_TYPE_Q4_0 || layout == LLMRT_TYPE_Q4_1) {
        const uint8_t *qs;
        __m256 d, m;
        if (layout == LLMRT_TYPE_Q4_0) {
            const block_q4_0 *b = blk;
            qs = b->qs;
            d = _mm256_set1_ps(f16(b->d));
            m = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
        } else {
            const block_q4_1 *b = blk;
            qs = b->qs;
            d = _mm256_set1_ps(f16(b->d));
            m = _mm256_set1_ps(f16(b->m));
        }
        const __m128i raw = loadu128(qs);
        const __m128i m4 = _mm_set1_epi8(0x0f);
        const __m128i lo = _mm_and_si128(raw, m4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
        w[0] = _mm256_fmadd_ps(cvt8_u8(lo), d, m);
        w[1] = _mm256_fmadd_ps(cvt8_u8(_mm_srli_si128(lo, 8)), d, m);
        w[2] = _mm256_fmadd_ps(cvt8_u8(hi), d, m);
        w[3] = _mm256_fmadd_ps(cvt8_u8(_mm_srli_si128(hi, 8)), d, m);
    } else if (layout == LLMRT_TYPE_Q8_0) {
        const block_q8_0 *b = blk;
        const __m256 d = _mm256_set1_ps(f16(b->d));
        const __m128i q0 = loadu128(b->qs), q1 = loadu128(b->qs + 16);
        w[0] = _mm256_mul_ps(cvt8_i8(q0), d);
        w[1] = _mm256_mul_ps(cvt8_i8(_mm_srli_si128(q0, 8)), d);
        w[2] = _mm256_mul_ps(cvt8_i8(q1), d);
        w[3] = _mm256_mul_ps(cvt8_i8(_mm_srli_si128(q1, 8)), d);
    } else { /* WQ_Q8A: (q + 128) d + m = q d + (m + 128 d) */
        const block_q8a *b = blk;
        const float df = f16(b->d);
        const __m256 d = _mm256_set1_ps(df), m = _mm256_set1_ps(f16(b->m) + 128.0f * df);
        const __m128i q0 = loadu128(b->qs), q1 = loadu128(b->qs + 16);
        w[0] = _mm256_fmadd_ps(cvt8_i8(q0), d, m);
        w[1] = _mm256_fmadd_ps(cvt8_i8(_mm_srli_si128(q0, 8)), d, m);
        w[2] = _mm256_fmadd_ps(cvt8_i8(q1), d, m);
        w[3] = _mm256_fmadd_ps(cvt8_i8(_mm_srli_si128(q1, 8)), d, m);
    }
}

static inline __m256 load8_bf16(const llmrt_bf16_t *p) {
    const __m256i v = _mm256_cvtepu16_epi32(loadu128(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static inline float sum4(__m256 a[4]) {
    return hsum_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
}

static inline void vec_dot_wq_f32_avx2(int layout, size_t bs, int n, float *s, const void *vx, const float *y) {
    __m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
    __m256 w[4];
    for (int ib = 0; ib < n / 32; ib++) {
        deq_block_avx2(layout, (const char *)vx + (size_t)ib * bs, w);
        for (int i = 0; i < 4; i++) acc[i] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(y + ib * 32 + 8 * i), acc[i]);
    }
    *s = sum4(acc);
}

static inline void vec_dot_wq_bf16_avx2(int layout, size_t bs, int n, float *s, const void *vx, const llmrt_bf16_t *y) {
    __m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
    __m256 w[4];
    for (int ib = 0; ib < n / 32; ib++) {
        deq_block_avx2(layout, (const char *)vx + (size_t)ib * bs, w);
        for (int i = 0; i < 4; i++) acc[i] = _mm256_fmadd_ps(w[i], load8_bf16(y + ib * 32 + 8 * i), acc[i]);
    }
    *s = sum4(acc);
}

static void vec_dot_q8a_q8_1_avx2(int n, float *s, const void *vx, const void *vy) {
    const block_q8a *x = vx;  /* (nb) */
    const block_q8_1 *y = vy; /* (nb) */
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int ib = 0; ib < n / 32; ib++) {
        const float dx = f16(x[ib].d);
        const __m256 d = _mm256_set1_ps(dx * f16(y[ib].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8_i8(loadu256(x[ib].qs), loadu256(y[ib].qs))), acc);
        summs += (f16(x[ib].m) + 128.0f * dx) * f16(y[ib].s);
    }
    *s = hsum_ps(acc) + summs;
}

#define WQ_KERNELS(L, LAYOUT, BLOCK)                                                                     \
    static void vec_dot_##L##_f32_avx2(int n, float *s, const void *vx, const void *vy) {                \
        vec_dot_wq_f32_avx2(LAYOUT, sizeof(BLOCK), n, s, vx, vy);                                        \
    }                                                                                                    \
    static void vec_dot_##L##_bf16_avx2(int n, float *s, const void *vx, const void *vy) {               \
        vec_dot_wq_bf16_avx2(LAYOUT, sizeof(BLOCK), n, s, vx, vy);                                       \
    }

WQ_KERNELS(q4_0, LLMRT_TYPE_Q4_0, block_q4_0)
WQ_KERNELS(q4_1, LLMRT_TYPE_Q4_1, block_q4_1)
WQ_KERNELS(q8_0, LLMRT_TYPE_Q8_0, block_q8_0)
WQ_KERNELS(q8a, LLMRT_TYPE_WQ_Q8A, block_q8a)
#endif /* __x86_64__ */

void llmrt_register_wq_kernels_avx2(llmrt_kernel_table *kt) {
#if defined(__x86_64__)
#define SET(T, fn) do { kt->vec_dot[T] = fn; kt->vec_dot_name[T] = #fn; } while (0)
    SET(LLMRT_TYPE_WQ_Q8A, vec_dot_q8a_q8_1_avx2);
#define REG(L, T)                                                                                        \
    SET(LLMRT_TYPE_WQ_##T##_F32, vec_dot_##L##_f32_avx2);                                               \
    SET(LLMRT_TYPE_WQ_##T##_BF16, vec_dot_##L##_bf16_avx2);
    REG(q4_0, Q4_0)
    REG(q4_1, Q4_1)
    REG(q8_0, Q8_0)
    REG(q8a, Q8A)
#undef REG
#undef SET
#else
    (void)kt;
#endif
}
