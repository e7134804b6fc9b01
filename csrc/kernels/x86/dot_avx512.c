/*
 * dot_avx512.c — dot-product kernels for the AVX-512 level (F, BW, VL, DQ). Compiled for this
 * target only (pragma below); the register function is called only when the CPU supports the level.
 * Types without a kernel here keep the AVX2 one (registered first).
 *
 * Same integer sums as dot_generic.c, 64 bytes at a time:
 *   - 32-element blocks (Q4_0, Q4_1, Q5_0, Q8_0): two blocks per zmm, the two block scales in the
 *     low / high 8 f32 lanes; an odd last block goes through the 256-bit path;
 *   - Q4_K: 64 elements (two sub-blocks) per zmm, the two sub-block scales in the low / high 16
 *     i16 lanes; Q6_K: 64 elements = four 16-element scale groups per zmm;
 *   - offset quants (q - 8, q - 16, q - 32) as maddubs(q, y) - maddubs(offset, y), exact for all y;
 *     Q8_0 as maddubs(|x|, ±y), exact while y != -128 (ggml's Q8 quantizers give [-127, 127]).
 * F32/F16/BF16: 4 x 16 f32 lanes, then a scalar tail that reads only the row. BF16 uses vdpbf16ps
 * when the CPU has AVX512-BF16 (checked at registration).
 */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"

#include <math.h>
#include <string.h>

#include "../quant_common.h" /* unpack_scales_mins_k4 */

#if defined(__x86_64__)
#include "simd_avx512.h" /* f16, loads, hsum_ps, cat256, scales_2x8_ps, nibbles, dot_*_i8, shr_bytes */

/* vdpbf16ps needs GCC >= 10 / clang >= 9 to compile; LLMRT_NO_AVX512BF16 leaves it out. */
#if !defined(LLMRT_NO_AVX512BF16) && ((defined(__clang__) && __clang_major__ >= 9) || \
                                      (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define LLMRT_HAVE_AVX512BF16 1
#endif

/* ---- helpers ----------------------------------------------------------------------------------- */

/* i16 lanes 0..15 = a, 16..31 = b */
static inline __m512i scales_2x16_epi16(int a, int b) {
    return cat256(_mm256_set1_epi16((short)a), _mm256_set1_epi16((short)b));
}

static inline __m512i ones_epi16(void) { return _mm512_set1_epi16(1); }

/* i32 sums of 4 consecutive (q - off)·y, q unsigned <= 63 */
static inline __m512i dot_offset_u8_i8_512(__m512i q, int off, __m512i y) {
    const __m512i p = _mm512_sub_epi16(_mm512_maddubs_epi16(q, y),
                                       _mm512_maddubs_epi16(_mm512_set1_epi8((char)off), y));
    return _mm512_madd_epi16(p, ones_epi16());
}

/* i32 sums of 4 consecutive x·y, x and y signed (y != -128): |x|·(y negated where x < 0) */
static inline __m512i dot_i8_i8_512(__m512i x, __m512i y) {
    const __mmask64 neg = _mm512_movepi8_mask(x);
    const __m512i sy = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(x), sy), ones_epi16());
}

/* ---- float types ------------------------------------------------------------------------------- */

/* F32 / F16 / BF16 share one loop; `kind` is a constant at each call. */
enum { KIND_F32, KIND_F16, KIND_BF16 };

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE __m512 load16_ps(const void *p, int i, int kind) {
    switch (kind) {
    case KIND_F16: return _mm512_cvtph_ps(loadu256((const llmrt_fp16_t *)p + i));
    case KIND_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(loadu256((const llmrt_bf16_t *)p + i)), 16));
    default: return _mm512_loadu_ps((const float *)p + i);
    }
}

static ALWAYS_INLINE float load1_ps(const void *p, int i, int kind) {
    switch (kind) {
    case KIND_F16: return f16(((const llmrt_fp16_t *)p)[i]);
    case KIND_BF16: return llmrt_bf16_to_fp32(((const llmrt_bf16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static ALWAYS_INLINE void vec_dot_float(int n, float *s, const void *x, const void *y, int kind) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        acc0 = _mm512_fmadd_ps(load16_ps(x, i, kind), load16_ps(y, i, kind), acc0);
        acc1 = _mm512_fmadd_ps(load16_ps(x, i + 16, kind), load16_ps(y, i + 16, kind), acc1);
        acc2 = _mm512_fmadd_ps(load16_ps(x, i + 32, kind), load16_ps(y, i + 32, kind), acc2);
        acc3 = _mm512_fmadd_ps(load16_ps(x, i + 48, kind), load16_ps(y, i + 48, kind), acc3);
    }
    for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(load16_ps(x, i, kind), load16_ps(y, i, kind), acc0);
    double sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += (double)(load1_ps(x, i, kind) * load1_ps(y, i, kind)); /* tail: never past the row */
    *s = (float)sum;
}

static void vec_dot_f32_avx512(int n, float *s, const void *x, const void *y) { vec_dot_float(n, s, x, y, KIND_F32); }
static void vec_dot_f16_avx512(int n, float *s, const void *x, const void *y) { vec_dot_float(n, s, x, y, KIND_F16); }
static void vec_dot_bf16_avx512(int n, float *s, const void *x, const void *y) { vec_dot_float(n, s, x, y, KIND_BF16); }

#ifdef LLMRT_HAVE_AVX512BF16
/* vdpbf16ps: 32 bf16 products per instruction, pairs summed into 16 f32 lanes. Only registered when
 * the CPU reports AVX512-BF16. (Denormal inputs count as zero there, as on every BF16 unit.) */
__attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
static void vec_dot_bf16_avx512bf16(int n, float *s, const void *vx, const void *vy) {
    const llmrt_bf16_t *x = vx, *y = vy; /* (n) */
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)_mm512_loadu_si512(x + i), (__m512bh)_mm512_loadu_si512(y + i));
        acc1 = _mm512_dpbf16_ps(acc1, (__m512bh)_mm512_loadu_si512(x + i + 32), (__m512bh)_mm512_loadu_si512(y + i + 32));
    }
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)_mm512_loadu_si512(x + i), (__m512bh)_mm512_loadu_si512(y + i));
    }
    double sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < n; i++) sum += (double)(llmrt_bf16_to_fp32(x[i]) * llmrt_bf16_to_fp32(y[i]));
    *s = (float)sum;
}
#endif

/* ---- 32-element blocks, two per zmm -------------------------------------------------------------- */

static void vec_dot_q4_0_q8_0_avx512(int n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx; /* (nb) */
    const block_q8_0 *y = vy; /* (nb) */
    const int nb = n / QK4_0;
    __m512 acc = _mm512_setzero_ps();
    int ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        const __m512 d = scales_2x8_ps(f16(x[ib].d) * f16(y[ib].d), f16(x[ib + 1].d) * f16(y[ib + 1].d));
        const __m512i qx = cat256(unpack_nibbles_32(x[ib].qs), unpack_nibbles_32(x[ib + 1].qs));
        const __m512i qy = cat256(loadu256(y[ib].qs), loadu256(y[ib + 1].qs));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot_offset_u8_i8_512(qx, 8, qy)), acc);
    }
    __m256 acc1 = _mm256_setzero_ps();
    for (; ib < nb; ib++) {
        const __m256 d = _mm256_set1_ps(f16(x[ib].d) * f16(y[ib].d));
        const __m256i p = dot_offset_u8_i8(unpack_nibbles_32(x[ib].qs), _mm256_set1_epi8(8), loadu256(y[ib].qs));
        acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc1);
    }
    *s = _mm512_reduce_add_ps(acc) + hsum_ps(acc1);
}

static void vec_dot_q4_1_q8_1_avx512(int n, float *s, const void *vx, const void *vy) {
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
        const __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(qx, qy), ones_epi16());
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    __m256 acc1 = _mm256_setzero_ps();
    for (; ib < nb; ib++) {
        summs += f16(x[ib].m) * f16(y[ib].s);
        const __m256 d = _mm256_set1_ps(f16(x[ib].d) * f16(y[ib].d));
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(unpack_nibbles_32(x[ib].qs), loadu256(y[ib].qs)),
                                            _mm256_set1_epi16(1));
        acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc1);
    }
    *s = _mm512_reduce_add_ps(acc) + hsum_ps(acc1) + summs;
}

static void vec_dot_q5_0_q8_0_avx512(int n, float *s, const void *vx, const void *vy) {
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
        qx = _mm512_mask_add_epi8(qx, hbits, qx, k16); /* q | 16 where the 5th bit is set */
        const __m512i qy = cat256(loadu256(y[ib].qs), loadu256(y[ib + 1].qs));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot_offset_u8_i8_512(qx, 16, qy)), acc);
    }
    __m256 acc1 = _mm256_setzero_ps();
    for (; ib < nb; ib++) {
        uint32_t h0;
        memcpy(&h0, x[ib].qh, sizeof(h0));
        const __m256 d = _mm256_set1_ps(f16(x[ib].d) * f16(y[ib].d));
        __m256i qx = unpack_nibbles_32(x[ib].qs);
        qx = _mm256_mask_add_epi8(qx, (__mmask32)h0, qx, _mm256_set1_epi8(16));
        const __m256i p = dot_offset_u8_i8(qx, _mm256_set1_epi8(16), loadu256(y[ib].qs));
        acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc1);
    }
    *s = _mm512_reduce_add_ps(acc) + hsum_ps(acc1);
}

static void vec_dot_q8_0_q8_0_avx512(int n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx; /* (nb) */
    const block_q8_0 *y = vy; /* (nb) */
    const int nb = n / QK8_0;
    __m512 acc = _mm512_setzero_ps();
    int ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        const __m512 d = scales_2x8_ps(f16(x[ib].d) * f16(y[ib].d), f16(x[ib + 1].d) * f16(y[ib + 1].d));
        const __m512i qx = cat256(loadu256(x[ib].qs), loadu256(x[ib + 1].qs));
        const __m512i qy = cat256(loadu256(y[ib].qs), loadu256(y[ib + 1].qs));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot_i8_i8_512(qx, qy)), acc);
    }
    __m256 acc1 = _mm256_setzero_ps();
    for (; ib < nb; ib++) {
        const __m256 d = _mm256_set1_ps(f16(x[ib].d) * f16(y[ib].d));
        const __m256i p = dot_i8_i8(loadu256(x[ib].qs), loadu256(y[ib].qs));
        acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc1);
    }
    *s = _mm512_reduce_add_ps(acc) + hsum_ps(acc1);
}

/* ---- 256-element super-blocks (activations Q8_K) ------------------------------------------------ */

static void vec_dot_q4_K_q8_K_avx512(int n, float *s, const void *vx, const void *vy) {
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
            /* elements 64j..64j+63: low nibbles (sub-block 2j), then high nibbles (2j+1) */
            const __m256i q4 = loadu256(x[i].qs + 32 * j);
            const __m512i q = cat256(_mm256_and_si256(q4, m4), _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4));
            const __m512i p = _mm512_maddubs_epi16(q, loadu512(y[i].qs + 64 * j));
            isum = _mm512_add_epi32(isum, _mm512_madd_epi16(p, scales_2x16_epi16(sc[2 * j], sc[2 * j + 1])));
        }
        const float d = f16(x[i].d) * y[i].d;
        const float dmin = f16(x[i].dmin) * y[i].d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), acc);
        summ = fmaf(dmin, (float)summs, summ); /* fused, as the -O3 build contracts it */
    }
    *s = _mm512_reduce_add_ps(acc) - summ;
}

/* 32 i16 lanes, 8 per scale: scales sc[0..3] of a 64-element stretch (16 elements per scale). */
static inline __m512i scales_4x8_epi16(const int8_t *sc) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_cvtsi32_si128((int)((uint32_t)(uint8_t)sc[0] |
        ((uint32_t)(uint8_t)sc[1] << 8) | ((uint32_t)(uint8_t)sc[2] << 16) | ((uint32_t)(uint8_t)sc[3] << 24))));
    /* byte k of the result = sc[k / 8]; shuffles work per 128-bit lane, both lanes hold sc[0..3] */
    const __m256i idx = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                          0x0101010101010101LL, 0x0000000000000000LL);
    return _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(b, idx));
}

static void vec_dot_q6_K_q8_K_avx512(int n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx; /* (nb) */
    const block_q8_K *y = vy; /* (nb) */
    const int nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m512i k32 = _mm512_set1_epi8(32);
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < nb; i++) {
        __m512i isum = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = loadu256(x[i].ql + 64 * h);
            const __m256i ql1 = loadu256(x[i].ql + 64 * h + 32);
            const __m256i qh = loadu256(x[i].qh + 32 * h);
            /* the four 32-element groups of this half (see dot_generic.c) */
            const __m256i g0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(shr_bytes(qh, 0, 0x03), 4));
            const __m256i g1 = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(shr_bytes(qh, 2, 0x03), 4));
            const __m256i g2 = _mm256_or_si256(shr_bytes(ql0, 4, 0x0f), _mm256_slli_epi16(shr_bytes(qh, 4, 0x03), 4));
            const __m256i g3 = _mm256_or_si256(shr_bytes(ql1, 4, 0x0f), _mm256_slli_epi16(shr_bytes(qh, 6, 0x03), 4));
            for (int k = 0; k < 2; k++) {
                const __m512i q = k == 0 ? cat256(g0, g1) : cat256(g2, g3);
                const __m512i qy = loadu512(y[i].qs + 128 * h + 64 * k);
                const __m512i p = _mm512_sub_epi16(_mm512_maddubs_epi16(q, qy), _mm512_maddubs_epi16(k32, qy));
                isum = _mm512_add_epi32(isum, _mm512_madd_epi16(p, scales_4x8_epi16(x[i].scales + 8 * h + 4 * k)));
            }
        }
        const float d = f16(x[i].d) * y[i].d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), acc);
    }
    *s = _mm512_reduce_add_ps(acc);
}

#endif /* __x86_64__ */

void llmrt_register_dot_kernels_avx512(llmrt_kernel_table *kt) {
#if defined(__x86_64__)
#define REG(T, fn) do { kt->vec_dot[LLMRT_TYPE_##T] = fn; kt->vec_dot_name[LLMRT_TYPE_##T] = #fn; } while (0)
    REG(F32, vec_dot_f32_avx512);
    REG(F16, vec_dot_f16_avx512);
    REG(BF16, vec_dot_bf16_avx512);
#ifdef LLMRT_HAVE_AVX512BF16
    if (llmrt_cpu_features_get()->avx512_bf16) REG(BF16, vec_dot_bf16_avx512bf16);
#endif
    REG(Q4_0, vec_dot_q4_0_q8_0_avx512);
    REG(Q4_1, vec_dot_q4_1_q8_1_avx512);
    REG(Q5_0, vec_dot_q5_0_q8_0_avx512);
    REG(Q8_0, vec_dot_q8_0_q8_0_avx512);
    REG(Q4_K, vec_dot_q4_K_q8_K_avx512);
    REG(Q6_K, vec_dot_q6_K_q8_K_avx512);
#undef REG
#else
    (void)kt;
#endif
}
