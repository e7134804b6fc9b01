/*
 * norm.c — RMS_NORM over ne0 of each row: y = x / sqrt(mean(x^2) + eps). The sum of squares is
 * accumulated in double, as ggml does, so long rows lose nothing. With a src[1] (the graph fuses
 * rms_norm(x) * w into one node), y = (x * scale) * w[i]: the two nodes' roundings in one pass.
 */
#include <math.h>

#include "ops/ops.h"

void llmrt_compute_rms_norm(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *src = dst->src[0];
    const int64_t ne0 = dst->ne[0];
    const int64_t nr = llmrt_nrows(dst);
    const float eps = llmrt_get_op_param_f32(dst, 0);
    const float *w = dst->src[1] != NULL ? (const float *)dst->src[1]->data : NULL; /* [ne0] */
    for (int64_t r = llmrt_claim(p); r < nr; r = llmrt_claim(p)) {
        const float *x = (const float *)((const char *)src->data + r * src->nb[1]);
        float *y = (float *)((char *)dst->data + r * dst->nb[1]);
        double sum = 0.0;
        for (int64_t i = 0; i < ne0; i++) sum += (double)(x[i] * x[i]);
        const float mean = (float)(sum / (double)ne0);
        const float scale = 1.0f / sqrtf(mean + eps);
        if (w != NULL) {   /* fused rms_norm(x) * w (graph.c): the MUL's rounding, in place */
            for (int64_t i = 0; i < ne0; i++) y[i] = (x[i] * scale) * w[i];
        } else {
            for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * scale;
        }
    }
}
