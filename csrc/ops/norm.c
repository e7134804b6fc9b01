/*
 * norm.c — RMS_NORM over ne0 of each row: y = x / sqrt(mean(x^2) + eps). The sum of squares is
 * accumulated in double, as ggml does, so long rows lose nothing. With a src[1] (the graph fuses
 * rms_norm(x) * w into one node), y = (x * scale) * w[i]: the two nodes' roundings in one pass.
 */
#include <math.h>

#include "ops/ops.h"

#define NORM_ROWS 4 /* rows per chunk: their sums run as independent chains, side by side */

/* y = (x * scale) [* w] for one row, scale from its sum of squares (y never overlaps x or w:
 * distinct arena tensors, so the loops vectorize; elementwise products round the same). */
static void norm_row(const float *restrict x, float *restrict y, const float *restrict w, int64_t ne0,
                     double sum, float eps) {
    const float mean = (float)(sum / (double)ne0);
    const float scale = 1.0f / sqrtf(mean + eps);
    if (w != NULL) {   /* fused rms_norm(x) * w (graph.c): the MUL's rounding, in place */
        for (int64_t i = 0; i < ne0; i++) y[i] = (x[i] * scale) * w[i];
    } else {
        for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * scale;
    }
}

/* Each row's sum is ggml's: sum += (double)(x[i] * x[i]) for i = 0, 1, ... in order, a chain of
 * dependent double adds (latency-bound). Four rows at a time keep four chains in flight: each
 * chain's order, so each row's result, is unchanged. */
void llmrt_compute_rms_norm(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *src = dst->src[0];
    const int64_t ne0 = dst->ne[0];
    const int64_t nr = llmrt_nrows(dst);
    const float eps = llmrt_get_op_param_f32(dst, 0);
    const float *w = dst->src[1] != NULL ? (const float *)dst->src[1]->data : NULL; /* [ne0] */
    const int64_t n_chunks = (nr + NORM_ROWS - 1) / NORM_ROWS;
#define ROW_X(r) ((const float *)((const char *)src->data + (r) * src->nb[1]))
#define ROW_Y(r) ((float *)((char *)dst->data + (r) * dst->nb[1]))
    for (int64_t c = llmrt_claim(p); c < n_chunks; c = llmrt_claim(p)) {
        const int64_t r0 = c * NORM_ROWS;
        if (r0 + NORM_ROWS <= nr) {
            const float *x0 = ROW_X(r0), *x1 = ROW_X(r0 + 1), *x2 = ROW_X(r0 + 2), *x3 = ROW_X(r0 + 3);
            double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
            for (int64_t i = 0; i < ne0; i++) {
                s0 += (double)(x0[i] * x0[i]);
                s1 += (double)(x1[i] * x1[i]);
                s2 += (double)(x2[i] * x2[i]);
                s3 += (double)(x3[i] * x3[i]);
            }
            norm_row(x0, ROW_Y(r0), w, ne0, s0, eps);
            norm_row(x1, ROW_Y(r0 + 1), w, ne0, s1, eps);
            norm_row(x2, ROW_Y(r0 + 2), w, ne0, s2, eps);
            norm_row(x3, ROW_Y(r0 + 3), w, ne0, s3, eps);
        } else {
            for (int64_t r = r0; r < nr; r++) {
                const float *x = ROW_X(r);
                double sum = 0.0;
                for (int64_t i = 0; i < ne0; i++) sum += (double)(x[i] * x[i]);
                norm_row(x, ROW_Y(r), w, ne0, sum, eps);
            }
        }
    }
#undef ROW_X
#undef ROW_Y
}
