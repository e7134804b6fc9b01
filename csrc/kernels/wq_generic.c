/*
 * wq_generic.c — plain C kernels of the llmrt-private weight-only types (llmrt.h: WQ_*), the
 * reference the AVX2 versions (x86/wq_avx2.c) are checked against.
 *
 *   WQ_Q8A x Q8_1       int8 asym weights (block_q8a, x = (q + 128) d + m) against int8
 *                       activations: per block d_w d_a sum(q_w q_a) + (m_w + 128 d_w) s_a
 *                       (s_a = d_a sum(q_a), the Q8_1 block's s).
 *   WQ_<L>_F32 x F32    compute_dtype "fp32": each 32-block of layout L (Q4_0, Q4_1, Q8_0,
 *                       WQ_Q8A) is dequantized to f32 and fma'd with f32 activations.
 *   WQ_<L>_BF16 x BF16  compute_dtype "bf16": the same against activations rounded to bf16.
 * Dequantize rows (get_rows, tests) and reference quantize rows (group 32, min/max: ggml's
 * reference quantizer's bytes) for every private id.
 */
#include "llmrt/llmrt.h"

#include <math.h>

/* Dequantize one 32-block of `layout` into w[32]. */
static inline void deq_block(int layout, const void *blk, float *w) {
    if (layout == LLMRT_TYPE_Q4_0) {
        const block_q4_0 *b = blk;
        const float d = llmrt_fp16_to_fp32(b->d);
        for (int j = 0; j < 16; j++) {
            w[j] = (float)((b->qs[j] & 0x0f) - 8) * d;
            w[j + 16] = (float)((b->qs[j] >> 4) - 8) * d;
        }
    } else if (layout == LLMRT_TYPE_Q4_1) {
        const block_q4_1 *b = blk;
        const float d = llmrt_fp16_to_fp32(b->d), m = llmrt_fp16_to_fp32(b->m);
        for (int j = 0; j < 16; j++) {
            w[j] = (float)(b->qs[j] & 0x0f) * d + m;
            w[j + 16] = (float)(b->qs[j] >> 4) * d + m;
        }
    } else if (layout == LLMRT_TYPE_Q8_0) {
        const block_q8_0 *b = blk;
        const float d = llmrt_fp16_to_fp32(b->d);
        for (int j = 0; j < 32; j++) w[j] = (float)b->qs[j] * d;
    } else { /* WQ_Q8A */
        const block_q8a *b = blk;
        const float d = llmrt_fp16_to_fp32(b->d), m = llmrt_fp16_to_fp32(b->m);
        for (int j = 0; j < 32; j++) w[j] = (float)(b->qs[j] + 128) * d + m;
    }
}

static inline void dequant_row_wq(int layout, size_t bs, const void *x, float *y, int64_t k) {
    for (int64_t i = 0; i < k / 32; i++) deq_block(layout, (const char *)x + (size_t)i * bs, y + i * 32);
}

/* s = sum over blocks of dot(dequant(block), y[32 floats]), one f32 accumulator per row. */
static inline void vec_dot_wq_f32(int layout, size_t bs, int n, float *s, const void *vx, const float *y) {
    float w[32];
    float sum = 0.0f;
    for (int ib = 0; ib < n / 32; ib++) {
        deq_block(layout, (const char *)vx + (size_t)ib * bs, w);
        for (int j = 0; j < 32; j++) sum += w[j] * y[ib * 32 + j];
    }
    *s = sum;
}

static inline void vec_dot_wq_bf16(int layout, size_t bs, int n, float *s, const void *vx, const llmrt_bf16_t *y) {
    float w[32];
    float sum = 0.0f;
    for (int ib = 0; ib < n / 32; ib++) {
        deq_block(layout, (const char *)vx + (size_t)ib * bs, w);
        for (int j = 0; j < 32; j++) sum += w[j] * llmrt_bf16_to_fp32(y[ib * 32 + j]);
    }
    *s = sum;
}

static void vec_dot_q8a_q8_1_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q8a *x = vx;  /* (nb) */
    const block_q8_1 *y = vy; /* (nb) */
    float sum = 0.0f;
    for (int ib = 0; ib < n / 32; ib++) {
        int isum = 0;
        for (int j = 0; j < 32; j++) isum += x[ib].qs[j] * y[ib].qs[j];
        const float dx = llmrt_fp16_to_fp32(x[ib].d), dy = llmrt_fp16_to_fp32(y[ib].d);
        sum += dx * dy * (float)isum + (llmrt_fp16_to_fp32(x[ib].m) + 128.0f * dx) * llmrt_fp16_to_fp32(y[ib].s);
    }
    *s = sum;
}

#define WQ_KERNELS(L, LAYOUT, BLOCK)                                                                     \
    static void dequant_row_##L##_generic(const void *x, float *y, int64_t k) {                          \
        dequant_row_wq(LAYOUT, sizeof(BLOCK), x, y, k);                                                  \
    }                                                                                                    \
    static void quant_row_##L##_generic(const float *x, void *y, int64_t k) {                            \
        (void)llmrt_wq_quantize_row(x, y, k, LAYOUT, 32, LLMRT_WQ_MINMAX);                                                \
    }                                                                                                    \
    static void vec_dot_##L##_f32_generic(int n, float *s, const void *vx, const void *vy) {             \
        vec_dot_wq_f32(LAYOUT, sizeof(BLOCK), n, s, vx, vy);                                             \
    }                                                                                                    \
    static void vec_dot_##L##_bf16_generic(int n, float *s, const void *vx, const void *vy) {            \
        vec_dot_wq_bf16(LAYOUT, sizeof(BLOCK), n, s, vx, vy);                                            \
    }

WQ_KERNELS(q4_0, LLMRT_TYPE_Q4_0, block_q4_0)
WQ_KERNELS(q4_1, LLMRT_TYPE_Q4_1, block_q4_1)
WQ_KERNELS(q8_0, LLMRT_TYPE_Q8_0, block_q8_0)
WQ_KERNELS(q8a, LLMRT_TYPE_WQ_Q8A, block_q8a)

#define SET(tab, T, fn) do { kt->tab[T] = fn; kt->tab##_name[T] = #fn; } while (0)

void llmrt_register_wq_kernels_generic(llmrt_kernel_table *kt) {
    SET(dequant_row, LLMRT_TYPE_WQ_Q8A, dequant_row_q8a_generic);
    SET(quant_row, LLMRT_TYPE_WQ_Q8A, quant_row_q8a_generic);
    SET(vec_dot, LLMRT_TYPE_WQ_Q8A, vec_dot_q8a_q8_1_generic);
#define REG(L, T)                                                                                        \
    SET(dequant_row, LLMRT_TYPE_WQ_##T##_F32, dequant_row_##L##_generic);                               \
    SET(dequant_row, LLMRT_TYPE_WQ_##T##_BF16, dequant_row_##L##_generic);                              \
    SET(quant_row, LLMRT_TYPE_WQ_##T##_F32, quant_row_##L##_generic);                                   \
    SET(quant_row, LLMRT_TYPE_WQ_##T##_BF16, quant_row_##L##_generic);                                  \
    SET(vec_dot, LLMRT_TYPE_WQ_##T##_F32, vec_dot_##L##_f32_generic);                                   \
    SET(vec_dot, LLMRT_TYPE_WQ_##T##_BF16, vec_dot_##L##_bf16_generic);
    REG(q4_0, Q4_0)
    REG(q4_1, Q4_1)
    REG(q8_0, Q8_0)
    REG(q8a, Q8A)
#undef REG
}
