/*
 * attn_avx2.c — attention's scores and P.V product for the AVX2 level (AVX2 + FMA + F16C); see
 * llmrt_attn_qk_fn / llmrt_attn_pv_fn in llmrt.h. Compiled for this target only (pragma below).
 *
 * The column-by-column way (gather V[:, d] over n cells, then vec_dot) is what ggml computes; this
 * gives each output y[d] the same float operations while reading V row by row:
 *
 *   vec_dot_f16_avx2 / vec_dot_f32_avx2 over n cells (n a multiple of 32) keep 4 accumulators of
 *   8 lanes; cell c goes to accumulator j = (c % 32) / 8, lane c % 8, by one fma, in increasing c.
 *   So "lane" L = c % 32 is a chain of fmas over the cells L, L + 32, L + 64, ... Here, for each
 *   block of up to 64 outputs d (8 registers) and each L, that chain runs with the outputs in the
 *   8 f32 lanes of the registers (the same fma, one output per register lane), then the 32 chain
 *   results are reduced per output in the kernel's order:
 *     f16: A = (acc0 + acc2) + (acc1 + acc3); t_k = A_k + A_{k+4}; y = (t_0 + t_1) + (t_2 + t_3)
 *     f32: A = (acc0 + acc1) + (acc2 + acc3); s_k = A_k + A_{k+4}; y = (s_0 + s_2) + (s_1 + s_3)
 *   (no scalar tail: n % 32 == 0). Cells with p == 0 add fma(v, 0, acc) == acc exactly (an
 *   accumulator that starts at +0 never becomes -0), so they are skipped, as is every cell outside
 *   [c0, c1).
 */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"

#if defined(__x86_64__)
#include "simd_avx2.h" /* f16, loadu128, hsum_ps */

#define ALWAYS_INLINE inline __attribute__((always_inline))

enum { KIND_F32, KIND_F16 };

static ALWAYS_INLINE __m256 load8(const void *p, int64_t i, int kind) {
    if (kind == KIND_F16) return _mm256_cvtph_ps(loadu128((const llmrt_fp16_t *)p + i));
    return _mm256_loadu_ps((const float *)p + i);
}

/* out[0 .. 8 * nv) = the fma chain of lane L (cells cs, cs + 32, ... < c1) for outputs d0 .. */
static ALWAYS_INLINE void pv_chain(int kind, int nv, float *out, const void *v, int64_t ldv, const void *p,
                                   int cs, int c1, int d0) {
    __m256 a[8];
    for (int k = 0; k < nv; k++) a[k] = _mm256_setzero_ps();
    for (int c = cs; c < c1; c += 32) {
        float pc;
        if (kind == KIND_F16) {
            const llmrt_fp16_t h = ((const llmrt_fp16_t *)p)[c];
            if (h == 0) continue;
            pc = f16(h);
        } else {
            pc = ((const float *)p)[c];
            if (pc == 0.0f) continue;
        }
        const __m256 pb = _mm256_set1_ps(pc);
        const int64_t row = (int64_t)c * ldv + d0;
        for (int k = 0; k < nv; k++) a[k] = _mm256_fmadd_ps(load8(v, row + 8 * k, kind), pb, a[k]);
    }
    for (int k = 0; k < nv; k++) _mm256_storeu_ps(out + 8 * k, a[k]);
}

static ALWAYS_INLINE void attn_pv(int kind, int hd, float *y, const void *v, int64_t ldv, const void *p,
                                  int c0, int c1, float *acc /* (32, hd): chain L of output d at L*hd + d */) {
    for (int d0 = 0; d0 < hd;) {
        const int left = hd - d0;
        const int nv = left >= 64 ? 8 : left >= 32 ? 4 : left >= 16 ? 2 : 1;
        for (int L = 0; L < 32; L++) {
            /* first cell >= c0 with c % 32 == L */
            const int cs = c0 + ((L - c0 % 32) + 32) % 32;
            float *out = acc + (int64_t)L * hd + d0;
            switch (nv) { /* constant register counts, so the accumulators stay in registers */
            case 8: pv_chain(kind, 8, out, v, ldv, p, cs, c1, d0); break;
            case 4: pv_chain(kind, 4, out, v, ldv, p, cs, c1, d0); break;
            case 2: pv_chain(kind, 2, out, v, ldv, p, cs, c1, d0); break;
            default: pv_chain(kind, 1, out, v, ldv, p, cs, c1, d0); break;
            }
        }
        d0 += 8 * nv;
    }
    /* reduce the 32 chains per output; chain L = 8 j + l is lane l of accumulator j */
    for (int d = 0; d < hd; d += 8) {
        __m256 A[8];
        for (int l = 0; l < 8; l++) {
            const __m256 a0 = _mm256_loadu_ps(acc + (int64_t)(l) * hd + d);
            const __m256 a1 = _mm256_loadu_ps(acc + (int64_t)(8 + l) * hd + d);
            const __m256 a2 = _mm256_loadu_ps(acc + (int64_t)(16 + l) * hd + d);
            const __m256 a3 = _mm256_loadu_ps(acc + (int64_t)(24 + l) * hd + d);
            if (kind == KIND_F16) A[l] = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
            else A[l] = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        }
        __m256 t[4];
        for (int k = 0; k < 4; k++) t[k] = _mm256_add_ps(A[k], A[k + 4]);
        __m256 r;
        if (kind == KIND_F16) r = _mm256_add_ps(_mm256_add_ps(t[0], t[1]), _mm256_add_ps(t[2], t[3]));
        else r = _mm256_add_ps(_mm256_add_ps(t[0], t[2]), _mm256_add_ps(t[1], t[3]));
        _mm256_storeu_ps(y + d, r);
    }
}

/* ---- scores: one dot per cell, as vec_dot_f16_avx2 / vec_dot_f32_avx2 (dot_avx2.c) compute it,
 * inlined so the loop over cells has no call and q stays hot:
 *   f16: 4 x 8 lanes over steps of 32, (a0 + a2) + (a1 + a3), halves, two hadds, double tail;
 *   f32: 4 x 8 lanes over steps of 32, then steps of 8 into a0, hsum_ps((a0 + a1) + (a2 + a3)),
 *        double tail. */
static ALWAYS_INLINE float dot_f16(int n, const llmrt_fp16_t *x, const llmrt_fp16_t *y) {
    const int np = n & ~31;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int i = 0; i < np; i += 32) {
        for (int j = 0; j < 4; j++) {
            acc[j] = _mm256_fmadd_ps(_mm256_cvtph_ps(loadu128(x + i + 8 * j)),
                                     _mm256_cvtph_ps(loadu128(y + i + 8 * j)), acc[j]);
        }
    }
    acc[0] = _mm256_add_ps(acc[0], acc[2]);
    acc[1] = _mm256_add_ps(acc[1], acc[3]);
    acc[0] = _mm256_add_ps(acc[0], acc[1]);
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(acc[0]), _mm256_extractf128_ps(acc[0], 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    double sum = (double)_mm_cvtss_f32(_mm_hadd_ps(t1, t1));
    for (int i = np; i < n; i++) sum += (double)(f16(x[i]) * f16(y[i]));
    return (float)sum;
}

static ALWAYS_INLINE float dot_f32(int n, const float *x, const float *y) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
    double sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += (double)(x[i] * y[i]);
    return (float)sum;
}

static void attn_qk_f16_avx2(int hd, float *s, const void *k, int64_t ldk, const void *q, int c0, int c1) {
    const llmrt_fp16_t *kk = k; /* (cells, ldk) */
    if (hd == 64) { /* the common head size: the loop bounds are constants */
        for (int c = c0; c < c1; c++) s[c] = dot_f16(64, kk + (int64_t)c * ldk, q);
        return;
    }
    for (int c = c0; c < c1; c++) s[c] = dot_f16(hd, kk + (int64_t)c * ldk, q);
}

static void attn_qk_f32_avx2(int hd, float *s, const void *k, int64_t ldk, const void *q, int c0, int c1) {
    const float *kk = k; /* (cells, ldk) */
    for (int c = c0; c < c1; c++) s[c] = dot_f32(hd, kk + (int64_t)c * ldk, q);
}

static void attn_pv_f16_avx2(int hd, float *y, const void *v, int64_t ldv, const void *p, int c0, int c1,
                             void *scratch) {
    attn_pv(KIND_F16, hd, y, v, ldv, p, c0, c1, scratch);
}

static void attn_pv_f32_avx2(int hd, float *y, const void *v, int64_t ldv, const void *p, int c0, int c1,
                             void *scratch) {
    attn_pv(KIND_F32, hd, y, v, ldv, p, c0, c1, scratch);
}
#endif

void llmrt_register_attn_kernels_avx2(llmrt_kernel_table *kt) {
#if defined(__x86_64__)
    kt->attn_pv[LLMRT_TYPE_F16] = attn_pv_f16_avx2;
    kt->attn_pv_dot[LLMRT_TYPE_F16] = kt->vec_dot[LLMRT_TYPE_F16];
    kt->attn_pv_name[LLMRT_TYPE_F16] = "attn_pv_f16_avx2";
    kt->attn_pv[LLMRT_TYPE_F32] = attn_pv_f32_avx2;
    kt->attn_pv_dot[LLMRT_TYPE_F32] = kt->vec_dot[LLMRT_TYPE_F32];
    kt->attn_pv_name[LLMRT_TYPE_F32] = "attn_pv_f32_avx2";
    kt->attn_qk[LLMRT_TYPE_F16] = attn_qk_f16_avx2;
    kt->attn_qk_dot[LLMRT_TYPE_F16] = kt->vec_dot[LLMRT_TYPE_F16];
    kt->attn_qk_name[LLMRT_TYPE_F16] = "attn_qk_f16_avx2";
    kt->attn_qk[LLMRT_TYPE_F32] = attn_qk_f32_avx2;
    kt->attn_qk_dot[LLMRT_TYPE_F32] = kt->vec_dot[LLMRT_TYPE_F32];
    kt->attn_qk_name[LLMRT_TYPE_F32] = "attn_qk_f32_avx2";
#else
    (void)kt;
#endif
}
