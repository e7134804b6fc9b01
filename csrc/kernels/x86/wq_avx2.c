/*
 * wq_avx2.c — AVX2 kernels of the llmrt-private weight-only types (reference: ../wq_generic.c).
 *
 *   WQ_Q8A x Q8_1      int8 asym: |q_w| <= 128, |q_a| <= 127, so the maddubs pairs stay below
 *                      2 * 128 * 127 = 32512 (no i16 saturation); one f32 accumulator, block order.
 *   WQ_<L>_F32 / _BF16 a 32-block is dequantized into 4 x 8 f32 lanes and fma'd with the
 *                      activations into 4 accumulators, summed at the end (not the generic order:
 *                      results agree to f32 rounding, tests/test_wquant.py).
 *   packed gemm        WQ_<L>_F32 / _BF16 over layout L's packed groups (below), the vec_dot's bits.
 */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

#include <math.h>
#include <string.h>

#include "../gemm_q32.h"

#if defined(__x86_64__)
#include "simd_avx2.h"

/* 8 bytes at p (uint8 or int8 per `sgn`) -> 8 f32. */
static inline __m256 cvt8_u8(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)); }
static inline __m256 cvt8_i8(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); }

/* One 32-block of `layout` from its parts: q0 / q1 the quants of elements 0..15 / 16..31 (u8 for
 * Q4_0 / Q4_1, i8 for Q8_0 / WQ_Q8A), d and (Q4_1, WQ_Q8A) m as f32 -> w[0..3] (elements 8i..8i+7). */
static inline void deq_apply(int layout, __m128i q0, __m128i q1, float df, float mf, __m256 w[4]) {
    const __m256 d = _mm256_set1_ps(df);
    if (layout == LLMRT_TYPE_Q4_0 || layout == LLMRT_TYPE_Q4_1) {
        const __m256 m = layout == LLMRT_TYPE_Q4_0 ? _mm256_mul_ps(d, _mm256_set1_ps(-8.0f)) : _mm256_set1_ps(mf);
        w[0] = _mm256_fmadd_ps(cvt8_u8(q0), d, m);
        w[1] = _mm256_fmadd_ps(cvt8_u8(_mm_srli_si128(q0, 8)), d, m);
        w[2] = _mm256_fmadd_ps(cvt8_u8(q1), d, m);
        w[3] = _mm256_fmadd_ps(cvt8_u8(_mm_srli_si128(q1, 8)), d, m);
    } else if (layout == LLMRT_TYPE_Q8_0) {
        w[0] = _mm256_mul_ps(cvt8_i8(q0), d);
        w[1] = _mm256_mul_ps(cvt8_i8(_mm_srli_si128(q0, 8)), d);
        w[2] = _mm256_mul_ps(cvt8_i8(q1), d);
        w[3] = _mm256_mul_ps(cvt8_i8(_mm_srli_si128(q1, 8)), d);
    } else { /* WQ_Q8A: (q + 128) d + m = q d + (m + 128 d) */
        const __m256 m = _mm256_set1_ps(mf + 128.0f * df);
        w[0] = _mm256_fmadd_ps(cvt8_i8(q0), d, m);
        w[1] = _mm256_fmadd_ps(cvt8_i8(_mm_srli_si128(q0, 8)), d, m);
        w[2] = _mm256_fmadd_ps(cvt8_i8(q1), d, m);
        w[3] = _mm256_fmadd_ps(cvt8_i8(_mm_srli_si128(q1, 8)), d, m);
    }
}

/* Dequantize one 32-block (GGUF / block_q8a bytes) into w[0..3] (elements 8i..8i+7). */
static inline void deq_block_avx2(int layout, const void *blk, __m256 w[4]) {
    if (layout == LLMRT_TYPE_Q4_0 || layout == LLMRT_TYPE_Q4_1) {
        const uint8_t *qs = layout == LLMRT_TYPE_Q4_0 ? ((const block_q4_0 *)blk)->qs : ((const block_q4_1 *)blk)->qs;
        const float df = f16(((const block_q4_0 *)blk)->d); /* d first in both */
        const float mf = layout == LLMRT_TYPE_Q4_1 ? f16(((const block_q4_1 *)blk)->m) : 0.0f;
        const __m128i raw = loadu128(qs);
        const __m128i m4 = _mm_set1_epi8(0x0f);
        deq_apply(layout, _mm_and_si128(raw, m4), _mm_and_si128(_mm_srli_epi16(raw, 4), m4), df, mf, w);
    } else if (layout == LLMRT_TYPE_Q8_0) {
        const block_q8_0 *b = blk;
        deq_apply(layout, loadu128(b->qs), loadu128(b->qs + 16), f16(b->d), 0.0f, w);
    } else {
        const block_q8a *b = blk;
        deq_apply(layout, loadu128(b->qs), loadu128(b->qs + 16), f16(b->d), f16(b->m), w);
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
        /* (m + 128 d) · s, both fused: written out, so an -O1 build (no contraction) gives the same bits
         * as the packed gemm's explicit fmas */
        summs = fmaf(fmaf(128.0f, dx, f16(x[ib].m)), f16(y[ib].s), summs);
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

/* ---- packed gemm of WQ_<L>_F32 / _BF16 (gemm.h; layout L's packed groups, ../gemm_q32.h) ----------
 * Bit-exact with the vec_dots above for every (row, token): each block of a row is dequantized
 * with deq_apply (the same operations on the same values), and fma'd with the token's activations
 * into the same 4 x 8 lanes in block order, summed by sum4 at the end. Only the work is shared:
 * decode (n_x = 1) dequantizes from the packed group as it goes, two rows per pass over the
 * activations (row 3 of a group exists, zero, when n_rows is 3); prefill dequantizes WQP_KC blocks
 * of the group's 4 rows once into an f32 buffer, then every token of the call runs over them (its
 * bf16 activations widened once per chunk, exactly), two rows at a time: 8 accumulators, the 4
 * activation vectors in registers, the weights as fma memory operands. */
#define WQP_KC 16   /* blocks per dequantized chunk: 4 rows x 16 x 32 f32 = 8 KB */
#define WQP_TC 64   /* tokens whose accumulators live at once (MM_TOKENS): 32 KB */
#define WQP_PF 2048 /* decode prefetch distance (gemm_avx2.c's GEMV_PF_BYTES) */

static inline int wqp_layout(int type) {
    switch (type) {
    case LLMRT_TYPE_WQ_Q4_0_F32: case LLMRT_TYPE_WQ_Q4_0_BF16: return LLMRT_TYPE_Q4_0;
    case LLMRT_TYPE_WQ_Q4_1_F32: case LLMRT_TYPE_WQ_Q4_1_BF16: return LLMRT_TYPE_Q4_1;
    case LLMRT_TYPE_WQ_Q8_0_F32: case LLMRT_TYPE_WQ_Q8_0_BF16: return LLMRT_TYPE_Q8_0;
    default: return LLMRT_TYPE_WQ_Q8A;
    }
}

/* Block ib of row r (0..3) of a packed group, dequantized as deq_block_avx2 does the plain block. */
static inline void wqp_deq(int layout, const uint8_t *grp, int64_t nb, int64_t ib, int r, __m256 w[4]) {
    const int nsc = q32_nsc(layout);
    llmrt_fp16_t h[2] = { 0, 0 };
    memcpy(&h[0], grp + ((size_t)ib * nsc * Q32_R + r) * 2, 2);
    if (nsc == 2) memcpy(&h[1], grp + ((size_t)ib * nsc * Q32_R + Q32_R + r) * 2, 2);
    const uint8_t *qs = grp + q32_qs_off(layout, nb);
    __m128i q0, q1;
    if (q32_qsb(layout) == 32) {
        q0 = _mm_load_si128((const __m128i *)(qs + ib * 128 + 32 * r));
        q1 = _mm_load_si128((const __m128i *)(qs + ib * 128 + 32 * r + 16));
    } else { /* byte i: element i of rows 2p (low nibble) and 2p + 1 (high) */
        __m256i v = _mm256_load_si256((const __m256i *)(qs + ib * 64 + 32 * (r / 2)));
        if (r % 2) v = _mm256_srli_epi16(v, 4);
        v = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
        q0 = _mm256_castsi256_si128(v);
        q1 = _mm256_extracti128_si256(v, 1);
    }
    deq_apply(layout, q0, q1, f16(h[0]), nsc == 2 ? f16(h[1]) : 0.0f, w);
}

/* 8 activations (f32, or bf16 widened exactly) at element i of row x */
static inline __m256 wqp_y8(const int bf16, const uint8_t *x, int64_t i) {
    return bf16 ? load8_bf16((const llmrt_bf16_t *)x + i) : _mm256_loadu_ps((const float *)x + i);
}

static void gemm_wqf_avx2(const int type, int64_t K, const void *group, int n_rows, const void *x, size_t x_stride,
                          int n_x, float *y, int64_t y_stride) {
    const int layout = wqp_layout(type);
    const int bf16 = type >= LLMRT_TYPE_WQ_Q4_0_BF16;
    const int64_t nb = K / 32;
    const uint8_t *grp = (const uint8_t *)group;
    const uint8_t *xb = (const uint8_t *)x;
    if (n_x == 1) { /* two rows per pass: each activation vector (bf16 widened) serves both */
        const size_t pfs = (size_t)Q32_R * (size_t)(2 * q32_nsc(layout) + q32_qsb(layout)); /* bytes per block */
        for (int r = 0; r < n_rows; r += 2) {
            __m256 a0[4], a1[4];
            for (int i = 0; i < 4; i++) a0[i] = a1[i] = _mm256_setzero_ps();
            for (int64_t ib = 0; ib < nb; ib++) {
                if (r == 0) { /* the first pass streams the group (and the next) in: fetch WQP_PF bytes
                               * ahead of the group's bytes per block, pfs (a hint only, as gemm_avx2.c) */
                    const uintptr_t a = (uintptr_t)grp + WQP_PF + (uintptr_t)ib * pfs;
                    for (size_t o = 0; o < pfs; o += 64) _mm_prefetch((const char *)(a + o), _MM_HINT_T0);
                }
                __m256 yv[4], w[4];
                for (int i = 0; i < 4; i++) yv[i] = wqp_y8(bf16, xb, ib * 32 + 8 * i);
                wqp_deq(layout, grp, nb, ib, r, w);
                for (int i = 0; i < 4; i++) a0[i] = _mm256_fmadd_ps(w[i], yv[i], a0[i]);
                wqp_deq(layout, grp, nb, ib, r + 1, w);
                for (int i = 0; i < 4; i++) a1[i] = _mm256_fmadd_ps(w[i], yv[i], a1[i]);
            }
            y[r] = sum4(a0);
            if (r + 1 < n_rows) y[r + 1] = sum4(a1);
        }
        return;
    }
    _Alignas(32) float wf[Q32_R][WQP_KC * 32];
    _Alignas(32) float yf[WQP_KC * 32];                  /* a bf16 token's chunk, widened */
    _Alignas(32) float acc[WQP_TC][Q32_R][4][8];
    for (int t0 = 0; t0 < n_x; t0 += WQP_TC) {
        const int nt = n_x - t0 < WQP_TC ? n_x - t0 : WQP_TC;
        memset(acc, 0, sizeof(acc[0]) * (size_t)nt);
        for (int64_t b0 = 0; b0 < nb; b0 += WQP_KC) {
            const int kc = (int)(nb - b0 < WQP_KC ? nb - b0 : WQP_KC);
            for (int r = 0; r < Q32_R; r++) {
                for (int ib = 0; ib < kc; ib++) {
                    __m256 w[4];
                    wqp_deq(layout, grp, nb, b0 + ib, r, w);
                    for (int i = 0; i < 4; i++) _mm256_store_ps(&wf[r][ib * 32 + 8 * i], w[i]);
                }
            }
            for (int t = 0; t < nt; t++) {
                const uint8_t *xt = xb + (size_t)(t0 + t) * x_stride;
                const float *ys;
                if (bf16) {
                    for (int i = 0; i < kc * 32; i += 8) _mm256_store_ps(yf + i, wqp_y8(1, xt, b0 * 32 + i));
                    ys = yf;
                } else {
                    ys = (const float *)xt + b0 * 32;
                }
                for (int r = 0; r < Q32_R; r += 2) {
                    __m256 a0[4], a1[4];
                    for (int i = 0; i < 4; i++) {
                        a0[i] = _mm256_load_ps(acc[t][r][i]);
                        a1[i] = _mm256_load_ps(acc[t][r + 1][i]);
                    }
                    for (int ib = 0; ib < kc; ib++) {
                        for (int i = 0; i < 4; i++) {
                            const __m256 yv = _mm256_loadu_ps(ys + ib * 32 + 8 * i);
                            a0[i] = _mm256_fmadd_ps(_mm256_load_ps(&wf[r][ib * 32 + 8 * i]), yv, a0[i]);
                            a1[i] = _mm256_fmadd_ps(_mm256_load_ps(&wf[r + 1][ib * 32 + 8 * i]), yv, a1[i]);
                        }
                    }
                    for (int i = 0; i < 4; i++) {
                        _mm256_store_ps(acc[t][r][i], a0[i]);
                        _mm256_store_ps(acc[t][r + 1][i], a1[i]);
                    }
                }
            }
        }
        for (int t = 0; t < nt; t++) {
            for (int r = 0; r < n_rows; r++) {
                __m256 a[4];
                for (int i = 0; i < 4; i++) a[i] = _mm256_load_ps(acc[t][r][i]);
                y[(int64_t)(t0 + t) * y_stride + r] = sum4(a);
            }
        }
    }
}

#define WQP_GEMM(T, t)                                                                                   \
    static void gemm_##t##_avx2(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride,  \
                                int n_x, float *y, int64_t y_stride) {                                   \
        gemm_wqf_avx2(LLMRT_TYPE_##T, K, group, n_rows, x, x_stride, n_x, y, y_stride);                  \
    }
WQP_GEMM(WQ_Q4_0_F32, wq_q4_0_f32)
WQP_GEMM(WQ_Q4_1_F32, wq_q4_1_f32)
WQP_GEMM(WQ_Q8_0_F32, wq_q8_0_f32)
WQP_GEMM(WQ_Q8A_F32, wq_q8a_f32)
WQP_GEMM(WQ_Q4_0_BF16, wq_q4_0_bf16)
WQP_GEMM(WQ_Q4_1_BF16, wq_q4_1_bf16)
WQP_GEMM(WQ_Q8_0_BF16, wq_q8_0_bf16)
WQP_GEMM(WQ_Q8A_BF16, wq_q8a_bf16)
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
#define GEMM(T, fn) do { kt->gemm[LLMRT_TYPE_##T] = fn; kt->gemm_name[LLMRT_TYPE_##T] = #fn; kt->gemm_groups[LLMRT_TYPE_##T] = 1; } while (0)
    GEMM(WQ_Q4_0_F32, gemm_wq_q4_0_f32_avx2);
    GEMM(WQ_Q4_1_F32, gemm_wq_q4_1_f32_avx2);
    GEMM(WQ_Q8_0_F32, gemm_wq_q8_0_f32_avx2);
    GEMM(WQ_Q8A_F32, gemm_wq_q8a_f32_avx2);
    GEMM(WQ_Q4_0_BF16, gemm_wq_q4_0_bf16_avx2);
    GEMM(WQ_Q4_1_BF16, gemm_wq_q4_1_bf16_avx2);
    GEMM(WQ_Q8_0_BF16, gemm_wq_q8_0_bf16_avx2);
    GEMM(WQ_Q8A_BF16, gemm_wq_q8a_bf16_avx2);
#undef GEMM
#else
    (void)kt;
#endif
}
