/*
 * gemm_k_avx512.c — GEMV/GEMM kernels over packed rows (pack_k.h) for the AVX-512 level, for the
 * types whose vec_dot dot_avx512.c overrides: Q4_K, Q6_K, F32, F16, BF16. Each gives, per (row,
 * activation row), the exact bits of that level's vec_dot (same 16-lane integer partition, same
 * f32 operations in the same order, _mm512_reduce_add_ps at the end). The AVX512-VNNI level's
 * Q4_K / Q6_K vec_dot (dpbusd + mullo) forms the same i32 lanes and the same f32 operations, so
 * these kernels stay exact there too. Q2_K, Q3_K, Q5_K keep the AVX2 vec_dot at this level, and so
 * keep the AVX2 gemm. BF16 on a CPU with AVX512-BF16 uses vdpbf16ps in vec_dot, which has no gemm
 * here: gemm[BF16] is set to NULL (gemm.h: MUL_MAT then runs vec_dot on the plain rows).
 *
 * Compiled for this target only; cannot run on CPUs without AVX-512 (tests skip there).
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
#include "gemm_k_simd.h" /* imin8_k4 */

#define TT 4 /* activation rows per tile */
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define XROW(x, j, x_stride) ((const void *)((const uint8_t *)(x) + (size_t)(j) * (x_stride)))

/* ---- Q4_K: vec_dot_q4_K_q8_K_avx512's order -------------------------------------------------------
 * per super-block: 16 i32 lanes (64 elements = two sub-blocks per zmm, scales in the low / high 16
 * i16 lanes), acc = fma(d·dy, lanes, acc); summ = fma(dmin·dy, Σ m·bsum, summ) (contracted in
 * ggml's build); result reduce_add(acc) - summ. The mins part runs for 8 rows in the f32 lanes. */
static void gemm_q4_K_avx512(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                             float *y, int64_t y_stride) {
    const int64_t nb = K / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int t0 = 0; t0 < n_x; t0 += TT) {
        const int nt = n_x - t0 < TT ? n_x - t0 : TT;
        __m512 acc[TT][PK_R];
        __m256 summ8[TT]; /* lane r: row r */
        for (int t = 0; t < nt; t++) {
            summ8[t] = _mm256_setzero_ps();
            for (int r = 0; r < PK_R; r++) acc[t][r] = _mm512_setzero_ps();
        }
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *bg = (const uint8_t *)group + i * Q4K_BG;
            const block_q8_K *yb[TT];
            for (int t = 0; t < nt; t++) yb[t] = (const block_q8_K *)XROW(x, t0 + t, x_stride) + i;
            for (int r = 0; r < n_rows; r++) {
                const uint8_t *qs = bg + Q4K_QS + 128 * r;
                const uint8_t *sc = bg + Q4K_SC + 8 * r;
                __m512i q[4], scv[4];
                for (int j = 0; j < 4; j++) {
                    const __m256i q4 = loadu256(qs + 32 * j);
                    q[j] = cat256(_mm256_and_si256(q4, m4), _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4));
                    scv[j] = cat256(_mm256_set1_epi16(sc[2 * j]), _mm256_set1_epi16(sc[2 * j + 1]));
                }
                const float d = f16(((const llmrt_fp16_t *)(bg + Q4K_D))[r]);
                for (int t = 0; t < nt; t++) {
                    __m512i isum = _mm512_setzero_si512();
                    for (int j = 0; j < 4; j++) {
                        const __m512i p = _mm512_maddubs_epi16(q[j], loadu512(yb[t]->qs + 64 * j));
                        isum = _mm512_add_epi32(isum, _mm512_madd_epi16(p, scv[j]));
                    }
                    acc[t][r] = _mm512_fmadd_ps(_mm512_set1_ps(d * yb[t]->d), _mm512_cvtepi32_ps(isum), acc[t][r]);
                }
            }
            const __m256 dmin8 = _mm256_cvtph_ps(loadu128(bg + Q4K_DMIN));
            for (int t = 0; t < nt; t++) {
                const __m256i imin = imin8_k4(bg + Q4K_M, yb[t]->bsums);
                summ8[t] = _mm256_fmadd_ps(_mm256_mul_ps(dmin8, _mm256_set1_ps(yb[t]->d)), _mm256_cvtepi32_ps(imin),
                                           summ8[t]);
            }
        }
        for (int t = 0; t < nt; t++) {
            float s8[PK_R];
            _mm256_storeu_ps(s8, summ8[t]);
            for (int r = 0; r < n_rows; r++) {
                y[(int64_t)(t0 + t) * y_stride + r] = _mm512_reduce_add_ps(acc[t][r]) - s8[r];
            }
        }
    }
}

/* ---- Q6_K: vec_dot_q6_K_q8_K_avx512's order --------------------------------------------------------
 * per half h and k: 64 elements (groups 2k, 2k+1 of the half) per zmm, (q - 32)·y as maddubs(q, y) -
 * maddubs(32, y), madd with the four 16-element scales (8 i16 lanes each); acc = fma(d·dy, lanes,
 * acc); result reduce_add(acc). */
static void gemm_q6_K_avx512(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                             float *y, int64_t y_stride) {
    const int64_t nb = K / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m512i k32 = _mm512_set1_epi8(32);
    for (int t0 = 0; t0 < n_x; t0 += TT) {
        const int nt = n_x - t0 < TT ? n_x - t0 : TT;
        __m512 acc[TT][PK_R];
        for (int t = 0; t < nt; t++) {
            for (int r = 0; r < PK_R; r++) acc[t][r] = _mm512_setzero_ps();
        }
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *bg = (const uint8_t *)group + i * Q6K_BG;
            const block_q8_K *yb[TT];
            __m512i p32[TT][4]; /* maddubs(32, y) of each 64-element stretch (the offset) */
            for (int t = 0; t < nt; t++) {
                yb[t] = (const block_q8_K *)XROW(x, t0 + t, x_stride) + i;
                for (int s = 0; s < 4; s++) p32[t][s] = _mm512_maddubs_epi16(k32, loadu512(yb[t]->qs + 64 * s));
            }
            for (int r = 0; r < n_rows; r++) {
                __m512i q[4], scv[4];
                const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(loadu128(bg + Q6K_SC + 16 * r)));
                for (int h = 0; h < 2; h++) {
                    const __m256i ql0 = loadu256(bg + Q6K_QL + 128 * r + 64 * h);
                    const __m256i ql1 = loadu256(bg + Q6K_QL + 128 * r + 64 * h + 32);
                    const __m256i qh = loadu256(bg + Q6K_QH + 64 * r + 32 * h);
                    const __m256i g0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(shr_bytes(qh, 0, 0x03), 4));
                    const __m256i g1 = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(shr_bytes(qh, 2, 0x03), 4));
                    const __m256i g2 = _mm256_or_si256(shr_bytes(ql0, 4, 0x0f), _mm256_slli_epi16(shr_bytes(qh, 4, 0x03), 4));
                    const __m256i g3 = _mm256_or_si256(shr_bytes(ql1, 4, 0x0f), _mm256_slli_epi16(shr_bytes(qh, 6, 0x03), 4));
                    q[2 * h] = cat256(g0, g1);
                    q[2 * h + 1] = cat256(g2, g3);
                }
                for (int s = 0; s < 4; s++) {
                    /* i16 lane l = scale 4s + l/8 */
                    __m512i idx = _mm512_set1_epi16((short)(4 * s));
                    idx = _mm512_add_epi16(idx, _mm512_srli_epi16(
                        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                         15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3));
                    scv[s] = _mm512_permutexvar_epi16(idx, sc16);
                }
                const float d = f16(((const llmrt_fp16_t *)(bg + Q6K_D))[r]);
                for (int t = 0; t < nt; t++) {
                    __m512i isum = _mm512_setzero_si512();
                    for (int s = 0; s < 4; s++) {
                        const __m512i p = _mm512_sub_epi16(_mm512_maddubs_epi16(q[s], loadu512(yb[t]->qs + 64 * s)),
                                                           p32[t][s]);
                        isum = _mm512_add_epi32(isum, _mm512_madd_epi16(p, scv[s]));
                    }
                    acc[t][r] = _mm512_fmadd_ps(_mm512_set1_ps(d * yb[t]->d), _mm512_cvtepi32_ps(isum), acc[t][r]);
                }
            }
        }
        for (int t = 0; t < nt; t++) {
            for (int r = 0; r < n_rows; r++) y[(int64_t)(t0 + t) * y_stride + r] = _mm512_reduce_add_ps(acc[t][r]);
        }
    }
}

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
    REG(Q4_K, gemm_q4_K_avx512);
    REG(Q6_K, gemm_q6_K_avx512);
    REG(F32, gemm_f32_avx512);
    REG(F16, gemm_f16_avx512);
    REG(BF16, gemm_bf16_avx512);
    if (llmrt_cpu_features_get()->avx512_bf16) { /* vec_dot uses vdpbf16ps there (dot_avx512.c) */
        kt->gemm[LLMRT_TYPE_BF16] = NULL;
        kt->gemm_name[LLMRT_TYPE_BF16] = NULL;
    }
#undef REG
#else
    (void)kt;
#endif
}
