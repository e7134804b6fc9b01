/*
 * mul_mat.c — y = x @ W^T for a weight W [K, M] of any type and f32 activations x [K, rows].
 *
 * Two nodes. QUANTIZE converts each activation row to W's vec_dot_type (Q8_0 for Q4_0, Q8_K for
 * the K-quants, F16 for F16, ...) into an arena tensor, once per run, with the kernel table's
 * quant_act_row: the rounding ggml's CPU backend uses for activations on this ISA. MUL_MAT then computes
 * y[j][m] = vec_dot(W row m, x row j). Its chunks are blocks of MM_BLOCK weight rows; a chunk
 * loops over every activation row for its block, so the block's weights stay in cache while
 * they are reused by all tokens of a prefill.
 */
#include "ops/ops.h"

#define MM_BLOCK 16 /* weight rows per chunk */

void llmrt_compute_quantize(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *src = dst->src[0];
    const int64_t ne0 = dst->ne[0];
    const int64_t nr = llmrt_nrows(dst);
    const llmrt_quant_row_fn q = p->ctx->kt->quant_act_row[dst->type];
    for (int64_t r = llmrt_claim(p); r < nr; r = llmrt_claim(p)) {
        const float *x = (const float *)((const char *)src->data + r * src->nb[1]);
        void *y = (char *)dst->data + r * dst->nb[1];
        if (q != NULL) {
            q(x, y, ne0);
        } else if (dst->type == LLMRT_TYPE_F16) { /* before the F16 kernel exists */
            llmrt_fp16_t *yh = (llmrt_fp16_t *)y;
            for (int64_t i = 0; i < ne0; i++) yh[i] = llmrt_fp32_to_fp16(x[i]);
        } else if (dst->type == LLMRT_TYPE_BF16) {
            llmrt_bf16_t *yb = (llmrt_bf16_t *)y;
            for (int64_t i = 0; i < ne0; i++) yb[i] = llmrt_fp32_to_bf16(x[i]);
        }
    }
}

void llmrt_compute_mul_mat(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *w = dst->src[0];
    const llmrt_tensor *x = dst->src[1];
    const int K = (int)w->ne[0];
    const int64_t M = w->ne[1];
    const int64_t nr = llmrt_nrows(x);
    const llmrt_vec_dot_fn dot = p->ctx->kt->vec_dot[w->type];
    const int64_t n_chunks = (M + MM_BLOCK - 1) / MM_BLOCK;
    for (int64_t c = llmrt_claim(p); c < n_chunks; c = llmrt_claim(p)) {
        const int64_t m0 = c * MM_BLOCK;
        const int64_t m1 = m0 + MM_BLOCK < M ? m0 + MM_BLOCK : M;
        for (int64_t j = 0; j < nr; j++) {
            const void *xr = (const char *)x->data + j * x->nb[1];
            float *y = (float *)((char *)dst->data + j * dst->nb[1]);
            for (int64_t m = m0; m < m1; m++) {
                dot(K, &y[m], (const char *)w->data + m * w->nb[1], xr);
            }
        }
    }
}
