/*
 * dot_avx512.c — float dot-product kernels for the AVX-512 level (F, BW, VL, DQ): F32, F16, BF16 in
 * 4 x 16 f32 lanes, then a scalar tail that reads only the row (gemm_k_avx512.c's packed kernels give
 * the same bits). Compiled for this target only (pragma below); the register function is called only
 * when the CPU supports the level. Every other type keeps the AVX2 kernel (registered first): a level
 * replaces a kernel of the level below only with one that is tested and at least as fast.
 */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"

#include <math.h>
#include <string.h>


#if defined(__x86_64__)
#include "simd_avx512.h" /* f16, loads, hsum_ps, cat256, scales_2x8_ps, nibbles, dot_*_i8, shr_bytes */


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

#endif /* __x86_64__ */

void llmrt_register_dot_kernels_avx512(llmrt_kernel_table *kt) {
#if defined(__x86_64__)
#define REG(T, fn) do { kt->vec_dot[LLMRT_TYPE_##T] = fn; kt->vec_dot_name[LLMRT_TYPE_##T] = #fn; } while (0)
    REG(F32, vec_dot_f32_avx512);
    REG(F16, vec_dot_f16_avx512);
    REG(BF16, vec_dot_bf16_avx512);
#undef REG
#else
    (void)kt;
#endif
}
