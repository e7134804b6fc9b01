/*
 * tables.c — lookup tables the ops share, filled once: fp16 -> fp32 for every half value, and
 * GELU over every half value (ggml's CPU GELU rounds its input to f16 and looks the result up
 * in such a table; we do the same so results agree with llama.cpp bit for bit).
 */
#include <math.h>
#include <pthread.h>

#include "ops/ops.h"

float llmrt_table_f32_f16[1 << 16];
llmrt_fp16_t llmrt_table_gelu_f16[LLMRT_GELU_TABLE_N]; /* entries past 0xffff stay 0 */

/* ggml's constants for the tanh approximation. */
#define GELU_COEF_A 0.044715f
#define SQRT_2_OVER_PI 0.79788456080286535587989211986876f

float llmrt_gelu_f32(float x) {
    return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x)));
}

static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_fill(void) {
    for (uint32_t i = 0; i < (1u << 16); i++) {
        const float f = llmrt_fp16_to_fp32((llmrt_fp16_t)i);
        llmrt_table_f32_f16[i] = f;
        llmrt_table_gelu_f16[i] = llmrt_fp32_to_fp16(llmrt_gelu_f32(f));
    }
}

void llmrt_ops_init(void) {
    pthread_once(&tables_once, tables_fill);
}

void llmrt_row_to_f32(int type, const void *x, float *y, int64_t n) {
    switch (type) {
    case LLMRT_TYPE_F32: {
        const float *xf = (const float *)x;
        for (int64_t i = 0; i < n; i++) y[i] = xf[i];
        break;
    }
    case LLMRT_TYPE_F16: {
        const llmrt_fp16_t *xh = (const llmrt_fp16_t *)x;
        for (int64_t i = 0; i < n; i++) y[i] = llmrt_f16_lookup(xh[i]);
        break;
    }
    case LLMRT_TYPE_BF16: {
        const llmrt_bf16_t *xb = (const llmrt_bf16_t *)x;
        for (int64_t i = 0; i < n; i++) y[i] = llmrt_bf16_to_fp32(xb[i]);
        break;
    }
    default:
        break;
    }
}
