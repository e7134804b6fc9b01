/*
 * get_rows.c — GET_ROWS picks rows of a weight (any type, dequantized to f32): the token
 * embedding lookup. GET_ROWS_F32 picks token positions of an activation (the rows whose logits
 * are wanted). One chunk per picked row.
 */
#include <string.h>

#include "ops/ops.h"

void llmrt_compute_get_rows(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *w = dst->src[0];
    const llmrt_tensor *idx = dst->src[1];
    const int32_t *ids = (const int32_t *)idx->data;
    const int64_t n = dst->ne[1];
    const int64_t ne0 = dst->ne[0];
    const llmrt_dequant_row_fn deq = p->ctx->kt->dequant_row[w->type];
    for (int64_t i = llmrt_claim(p); i < n; i = llmrt_claim(p)) {
        const void *x = (const char *)w->data + (int64_t)ids[i] * w->nb[1];
        float *y = (float *)((char *)dst->data + i * dst->nb[1]);
        if (w->type == LLMRT_TYPE_F32) {
            memcpy(y, x, (size_t)ne0 * sizeof(float));
        } else if (deq != NULL) {
            deq(x, y, ne0);
        } else {
            llmrt_row_to_f32(w->type, x, y, ne0);  /* F16 / BF16 before their kernels exist */
        }
    }
}

void llmrt_compute_get_rows_f32(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *src = dst->src[0];
    const int32_t *rows = (const int32_t *)dst->src[1]->data;
    const int td = dst->tok_dim;
    const int64_t n_out = dst->ne[td];
    const size_t bytes = dst->nb[td];  /* one token's block */
    for (int64_t j = llmrt_claim(p); j < n_out; j = llmrt_claim(p)) {
        memcpy((char *)dst->data + j * bytes, (const char *)src->data + (int64_t)rows[j] * src->nb[td],
               bytes);
    }
}
