/*
 * wquant.c — group-wise weight-only quantization at load (neural-speed's knobs, llmrt/wquant.py).
 *
 * A row x[k] is cut into groups of `group` elements (group = -1 / <= 0: one group per row, i.e. per
 * output channel). Each group gets ONE scale (and, for asym, one minimum), computed exactly as
 * ggml's reference quantizer computes it for a 32-block, but over the whole group; that scale is
 * then written into every 32-element block of the group. So the result is a plain GGUF-layout
 * tensor (Q4_0 / Q4_1 / Q8_0, or the private WQ_Q8A) that every existing kernel runs, holding
 * exactly the group-wise quantized values. With group = 32 the bytes equal ggml's quantize_row_*_ref.
 *
 *   int4 sym  -> Q4_0    d = v / -8 (v: the value of largest |v|), q = min(15, trunc(x/d + 8.5))
 *   int4 asym -> Q4_1    d = (max - min) / 15, m = min,            q = min(15, trunc((x-m)/d + 0.5))
 *   int8 sym  -> Q8_0    d = amax / 127,                           q = round(x/d)
 *   int8 asym -> WQ_Q8A  d = (max - min) / 255, m = min,           q = min(255, trunc((x-m)/d + 0.5)) - 128
 * (each with id = 1/d, or 0 when d == 0; d and m are stored as f16). Memory cost: the scale is
 * repeated per 32-block, so every group size costs what group 32 costs (Q4_0 4.5 bits/weight,
 * Q4_1 5, Q8_0 8.5, WQ_Q8A 9).
 */
#include "llmrt/llmrt.h"

#include <float.h>
#include <math.h>

int llmrt_wq_layout(int type) {
    switch (type) {
    case LLMRT_TYPE_WQ_Q4_0_F32: case LLMRT_TYPE_WQ_Q4_0_BF16: return LLMRT_TYPE_Q4_0;
    case LLMRT_TYPE_WQ_Q4_1_F32: case LLMRT_TYPE_WQ_Q4_1_BF16: return LLMRT_TYPE_Q4_1;
    case LLMRT_TYPE_WQ_Q8_0_F32: case LLMRT_TYPE_WQ_Q8_0_BF16: return LLMRT_TYPE_Q8_0;
    case LLMRT_TYPE_WQ_Q8A_F32: case LLMRT_TYPE_WQ_Q8A_BF16: return LLMRT_TYPE_WQ_Q8A;
    default: return type;
    }
}

/* Scale (and min) of one group x[n], as the 32-block reference computes them. */
static void group_params(int layout, const float *x, int64_t n, float *d, float *m) {
    if (layout == LLMRT_TYPE_Q4_0) {
        float amax = 0.0f, vmax = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            if (amax < fabsf(x[i])) { amax = fabsf(x[i]); vmax = x[i]; }
        }
        *d = vmax / -8.0f;
        *m = 0.0f;
    } else if (layout == LLMRT_TYPE_Q8_0) {
        float amax = 0.0f;
        for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
        *d = amax / 127.0f;
        *m = 0.0f;
    } else { /* Q4_1, WQ_Q8A: min / max */
        float lo = FLT_MAX, hi = -FLT_MAX;
        for (int64_t i = 0; i < n; i++) {
            if (x[i] < lo) lo = x[i];
            if (x[i] > hi) hi = x[i];
        }
        *d = (hi - lo) / (layout == LLMRT_TYPE_Q4_1 ? 15.0f : 255.0f);
        *m = lo;
    }
}

/* (int)v with v first clamped to [lo, hi] (NaN -> lo): the same integer as ggml's casts for every
 * in-range value, and no undefined float -> int conversion when d is tiny and 1/d overflows. */
static inline int to_int_clamped(float v, float lo, float hi) {
    v = v > lo ? v : lo;
    v = v < hi ? v : hi;
    return (int)v;
}

/* One 32-block x[32] with the group's d, m. */
static void quant_block(int layout, const float *x, void *blk, float d, float m) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (layout == LLMRT_TYPE_Q4_0) {
        block_q4_0 *b = blk;
        b->d = llmrt_fp32_to_fp16(d);
        for (int j = 0; j < 16; j++) {
            const int q0 = to_int_clamped(x[j] * id + 8.5f, 0.0f, 15.0f);
            const int q1 = to_int_clamped(x[j + 16] * id + 8.5f, 0.0f, 15.0f);
            b->qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    } else if (layout == LLMRT_TYPE_Q4_1) {
        block_q4_1 *b = blk;
        b->d = llmrt_fp32_to_fp16(d);
        b->m = llmrt_fp32_to_fp16(m);
        for (int j = 0; j < 16; j++) {
            const int q0 = to_int_clamped((x[j] - m) * id + 0.5f, 0.0f, 15.0f);
            const int q1 = to_int_clamped((x[j + 16] - m) * id + 0.5f, 0.0f, 15.0f);
            b->qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    } else if (layout == LLMRT_TYPE_Q8_0) {
        block_q8_0 *b = blk;
        b->d = llmrt_fp32_to_fp16(d);
        for (int j = 0; j < 32; j++) b->qs[j] = (int8_t)to_int_clamped(roundf(x[j] * id), -127.0f, 127.0f);
    } else { /* WQ_Q8A */
        block_q8a *b = blk;
        b->d = llmrt_fp32_to_fp16(d);
        b->m = llmrt_fp32_to_fp16(m);
        for (int j = 0; j < 32; j++) {
            b->qs[j] = (int8_t)(to_int_clamped((x[j] - m) * id + 0.5f, 0.0f, 255.0f) - 128);
        }
    }
}

int llmrt_wq_quantize_row(const float *x, void *y, int64_t k, int type, int64_t group) {
    const int layout = llmrt_wq_layout(type);
    if (layout != LLMRT_TYPE_Q4_0 && layout != LLMRT_TYPE_Q4_1 && layout != LLMRT_TYPE_Q8_0 &&
        layout != LLMRT_TYPE_WQ_Q8A) {
        return LLMRT_EUNSUPPORTED;
    }
    if (k < 0 || k % 32 != 0) return LLMRT_EINVAL;
    if (group <= 0) group = k;
    if (group % 32 != 0) return LLMRT_EINVAL;
    const size_t bs = llmrt_type_traits_get(layout)->type_size;
    char *out = y;
    for (int64_t g0 = 0; g0 < k; g0 += group) {
        const int64_t n = g0 + group <= k ? group : k - g0;
        float d, m;
        group_params(layout, x + g0, n, &d, &m);
        for (int64_t i = g0; i < g0 + n; i += 32) {
            quant_block(layout, x + i, out + (size_t)(i / 32) * bs, d, m);
        }
    }
    return LLMRT_OK;
}
