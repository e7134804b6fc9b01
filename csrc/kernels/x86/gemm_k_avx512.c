/*
 * gemm_k_avx512.c — GEMV/GEMM kernels over packed rows (pack_k.h) for the AVX-512 level's float
 * types F32, F16, BF16: per (row, activation row) the exact bits of dot_avx512.c's vec_dot (same 16
 * f32 lanes, same operations in the same order, _mm512_reduce_add_ps at the end). The K-quants keep
 * the AVX2 kernels at this level. Compiled for this target only.
 */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

#include <string.h>

#include "../pack_k.h"

#if defined(__x86_64__)
#include "simd_avx512.h" /* loadu512, cat256 (+ simd_avx2.h) */

#define TT 4 /* activation rows per tile */
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define XROW(x, j, x_stride) ((const void *)((const uint8_t *)(x) + (size_t)(j) * (x_stride)))

/* ---- F32 / F16 / BF16: dot_avx512.c's vec_dot_float order ------------------------------------------
 * 4 chains of 16 lanes over steps of 64, then steps of 16 into chain 0, reduce_add((c0 + c1) +
 * (c2 + c3)) in double, scalar tail in double. One chain per pass over a FR x NT tile. */
enum { KIND_F32, KIND_F16, KIND_BF16 };
#define FR 4

static ALWAYS_INLINE __m512 load16_ps(const void *p, int64_t i, int kind) {
    switch (kind) {
    case KIND_F16: return _mm512_cvtph_ps(loadu256((const llmrt_fp16_t *)p + i));
    case KIND_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(loadu256((const llmrt_bf16_t *)p + i)), 16));
    default: return _mm512_loadu_ps((const float *)p + i);
    }
}

static ALWAYS_INLINE float load1_ps(const void *p, int64_t i, int kind) {
    switch (kind) {
    case KIND_F16: return f16(((const llmrt_fp16_t *)p)[i]);
    case KIND_BF16: return llmrt_bf16_to_fp32(((const llmrt_bf16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static ALWAYS_INLINE void tile_float(int kind, int NT, int64_t n, const uint8_t *w, size_t row_bytes,
                                     const void *const *a, float out[FR][3]) {
    __m512 acc[FR][3][4];
    const int64_t n64 = n - n % 64;
    for (int c = 0; c < 4; c++) {
        __m512 s[FR][3];
        for (int r = 0; r < FR; r++) for (int t = 0; t < NT; t++) s[r][t] = _mm512_setzero_ps();
        for (int64_t i = 16 * c; i < n64; i += 64) {
            __m512 av[3];
            for (int t = 0; t < NT; t++) av[t] = load16_ps(a[t], i, kind);
            for (int r = 0; r < FR; r++) {
                const __m512 wv = load16_ps(w + r * row_bytes, i, kind);
                for (int t = 0; t < NT; t++) s[r][t] = _mm512_fmadd_ps(wv, av[t], s[r][t]);
            }
        }
        for (int r = 0; r < FR; r++) for (int t = 0; t < NT; t++) acc[r][t][c] = s[r][t];
    }
    int64_t i0 = n64;
    for (; i0 + 16 <= n; i0 += 16) {
        for (int r = 0; r < FR; r++) {
            const __m512 wv = load16_ps(w + r * row_bytes, i0, kind);
            for (int t = 0; t < NT; t++) acc[r][t][0] = _mm512_fmadd_ps(wv, load16_ps(a[t], i0, kind), acc[r][t][0]);
        }
    }
    for (int r = 0; r < FR; r++) {
        for (int t = 0; t < NT; t++) {
            __m512 *ac = acc[r][t];
            double sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(ac[0], ac[1]), _mm512_add_ps(ac[2], ac[3])));
            const uint8_t *wr = w + r * row_bytes;
            for (int64_t i = i0; i < n; i++) sum += (double)(load1_ps(wr, i, kind) * load1_ps(a[t], i, kind));
            out[r][t] = (float)sum;
        }
    }
}

/* one activation row (decode): the 4 chains in one pass, 2 rows at a time (8 accumulators), so the
 * weights stream through once; then the same steps, reduction and tail as tile_float */
static ALWAYS_INLINE void tile_float1(int kind, int64_t n, const uint8_t *w, size_t row_bytes, const void *a,
                                      float out[FR][3]) {
    for (int r0 = 0; r0 < FR; r0 += 2) {
        __m512 acc[2][4];
        for (int r = 0; r < 2; r++) for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
        const uint8_t *w0 = w + r0 * row_bytes, *w1 = w0 + row_bytes;
        int64_t i = 0;
        for (; i + 64 <= n; i += 64) {
            for (int c = 0; c < 4; c++) {
                const __m512 av = load16_ps(a, i + 16 * c, kind);
                acc[0][c] = _mm512_fmadd_ps(load16_ps(w0, i + 16 * c, kind), av, acc[0][c]);
                acc[1][c] = _mm512_fmadd_ps(load16_ps(w1, i + 16 * c, kind), av, acc[1][c]);
            }
        }
        for (; i + 16 <= n; i += 16) { /* steps of 16 into chain 0 */
            const __m512 av = load16_ps(a, i, kind);
            acc[0][0] = _mm512_fmadd_ps(load16_ps(w0, i, kind), av, acc[0][0]);
            acc[1][0] = _mm512_fmadd_ps(load16_ps(w1, i, kind), av, acc[1][0]);
        }
        for (int r = 0; r < 2; r++) {
            const __m512 *ac = acc[r];
            double sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(ac[0], ac[1]), _mm512_add_ps(ac[2], ac[3])));
            const uint8_t *wr = w0 + r * row_bytes;
            for (int64_t k = i; k < n; k++) sum += (double)(load1_ps(wr, k, kind) * load1_ps(a, k, kind));
            out[r0 + r][0] = (float)sum;
        }
    }
}

static ALWAYS_INLINE void gemm_float(int kind, int64_t K, const void *group, int n_rows, const void *x,
                                     size_t x_stride, int n_x, float *y, int64_t y_stride) {
    const size_t row_bytes = (size_t)K * (kind == KIND_F32 ? 4 : 2);
    for (int r0 = 0; r0 < n_rows; r0 += FR) { /* rows past n_rows are the group's zero padding */
        const uint8_t *w = (const uint8_t *)group + r0 * row_bytes;
        for (int t0 = 0; t0 < n_x; t0 += 3) {
            const int nt = n_x - t0 < 3 ? n_x - t0 : 3;
            const void *a[3];
            for (int t = 0; t < nt; t++) a[t] = XROW(x, t0 + t, x_stride);
            float out[FR][3];
            if (nt == 3) tile_float(kind, 3, K, w, row_bytes, a, out);
            else if (nt == 2) tile_float(kind, 2, K, w, row_bytes, a, out);
            else tile_float1(kind, K, w, row_bytes, a[0], out);
            for (int r = 0; r < FR && r0 + r < n_rows; r++) {
                for (int t = 0; t < nt; t++) y[(int64_t)(t0 + t) * y_stride + r0 + r] = out[r][t];
            }
        }
    }
}

static void gemm_f32_avx512(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                            float *y, int64_t y_stride) {
    gemm_float(KIND_F32, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}
static void gemm_f16_avx512(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                            float *y, int64_t y_stride) {
    gemm_float(KIND_F16, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}
static void gemm_bf16_avx512(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                             float *y, int64_t y_stride) {
    gemm_float(KIND_BF16, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}

#endif /* __x86_64__ */

void llmrt_register_gemm_k_kernels_avx512(llmrt_kernel_table *kt) {
#if defined(__x86_64__)
#define REG(T, fn) do { kt->gemm[LLMRT_TYPE_##T] = fn; kt->gemm_name[LLMRT_TYPE_##T] = #fn; } while (0)
    REG(F32, gemm_f32_avx512);
    REG(F16, gemm_f16_avx512);
    REG(BF16, gemm_bf16_avx512);
#undef REG
#else
    (void)kt;
#endif
}
