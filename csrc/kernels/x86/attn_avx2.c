/*
 * attn_avx2.c — attention's P.V product for the AVX2 level (AVX2 + FMA + F16C); see
 * llmrt_attn_pv_fn in llmrt.h. Compiled for this target only (pragma below).
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
#include "simd_avx2.h" /* f16, loadu128 */

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
#else
    (void)kt;
#endif
}
