/*
 * elementwise.c — ops that map rows to rows: ADD/MUL with broadcasting, SCALE, SILU, GELU,
 * SOFTCAP, and GLU (act(gate) * up). SILU, SwiGLU, GELU and GeGLU use the kernel table's vec_silu /
 * vec_swiglu (ggml's vector exp approximation on AVX2, libm expf in the generic path and in vector
 * tails) and vec_gelu / vec_geglu (ggml's f16 GELU table; gathered 8 at a time on AVX2).
 * Activations are contiguous f32, so a row r of dst is at data + r * nb[1]; chunks are groups of
 * rows.
 */
#include <math.h>
#include <string.h>

#include "ops/ops.h"


/* Rows per chunk: about 16K elements, at least one row. */
static int64_t rows_per_chunk(int64_t ne0) {
    const int64_t r = 16384 / (ne0 > 0 ? ne0 : 1);
    return r > 0 ? r : 1;
}

void llmrt_compute_unary(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *src = dst->src[0];
    const int64_t ne0 = dst->ne[0];
    const int64_t nr = llmrt_nrows(dst);
    const int64_t rpc = rows_per_chunk(ne0);
    const int64_t n_chunks = (nr + rpc - 1) / rpc;
    const float param = llmrt_get_op_param_f32(dst, 0);
    for (int64_t c = llmrt_claim(p); c < n_chunks; c = llmrt_claim(p)) {
        const int64_t r1 = (c + 1) * rpc < nr ? (c + 1) * rpc : nr;
        for (int64_t r = c * rpc; r < r1; r++) {
            const float *x = (const float *)((const char *)src->data + r * src->nb[1]);
            float *y = (float *)((char *)dst->data + r * dst->nb[1]);
            switch (dst->op) {
            case LLMRT_OP_SCALE:
                for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * param;
                break;
            case LLMRT_OP_SILU:
                p->ctx->kt->vec_silu((int)ne0, y, x); /* ggml_vec_silu_f32 */
                break;
            case LLMRT_OP_GELU:
                p->ctx->kt->vec_gelu((int)ne0, y, x); /* ggml_vec_gelu_f32 (GGML_GELU_FP16) */
                break;
            case LLMRT_OP_SOFTCAP:
                for (int64_t i = 0; i < ne0; i++) y[i] = param * tanhf(x[i] / param);
                break;
            default:
                break;
            }
        }
    }
}

/* Element i of b's row (b may be F32, F16 or BF16; ne0 == 1 broadcasts one value). */
static inline float b_elem(const llmrt_tensor *b, const char *row, int64_t i) {
    if (b->ne[0] == 1) i = 0;
    switch (b->type) {
    case LLMRT_TYPE_F16: return llmrt_f16_lookup(((const llmrt_fp16_t *)row)[i]);
    case LLMRT_TYPE_BF16: return llmrt_bf16_to_fp32(((const llmrt_bf16_t *)row)[i]);
    default: return ((const float *)row)[i];
    }
}

void llmrt_compute_binary(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *a = dst->src[0];
    const llmrt_tensor *b = dst->src[1];
    const int64_t ne0 = dst->ne[0], ne1 = dst->ne[1], ne2 = dst->ne[2];
    const int64_t nr = llmrt_nrows(dst);
    const int64_t rpc = rows_per_chunk(ne0);
    const int64_t n_chunks = (nr + rpc - 1) / rpc;
    const int is_add = dst->op == LLMRT_OP_ADD;
    const int fast = b->type == LLMRT_TYPE_F32 && b->ne[0] == ne0;
    for (int64_t c = llmrt_claim(p); c < n_chunks; c = llmrt_claim(p)) {
        const int64_t r1 = (c + 1) * rpc < nr ? (c + 1) * rpc : nr;
        for (int64_t r = c * rpc; r < r1; r++) {
            const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
            const float *x = (const float *)((const char *)a->data + r * a->nb[1]);
            const char *brow = (const char *)b->data + (i1 % b->ne[1]) * b->nb[1] +
                               (i2 % b->ne[2]) * b->nb[2] + (i3 % b->ne[3]) * b->nb[3];
            float *y = (float *)((char *)dst->data + r * dst->nb[1]);
            if (fast) {
                const float *bf = (const float *)brow;
                if (is_add) {
                    for (int64_t i = 0; i < ne0; i++) y[i] = x[i] + bf[i];
                } else {
                    for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * bf[i];
                }
            } else if (is_add) {
                for (int64_t i = 0; i < ne0; i++) y[i] = x[i] + b_elem(b, brow, i);
            } else {
                for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * b_elem(b, brow, i);
            }
        }
    }
}

void llmrt_compute_glu(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *gate = dst->src[0];
    const llmrt_tensor *up = dst->src[1];
    const int64_t ne0 = dst->ne[0];
    const int64_t nr = llmrt_nrows(dst);
    const int64_t rpc = rows_per_chunk(ne0);
    const int64_t n_chunks = (nr + rpc - 1) / rpc;
    const int act = dst->op_params[0];
    for (int64_t c = llmrt_claim(p); c < n_chunks; c = llmrt_claim(p)) {
        const int64_t r1 = (c + 1) * rpc < nr ? (c + 1) * rpc : nr;
        for (int64_t r = c * rpc; r < r1; r++) {
            const float *g = (const float *)((const char *)gate->data + r * gate->nb[1]);
            const float *u = (const float *)((const char *)up->data + r * up->nb[1]);
            float *y = (float *)((char *)dst->data + r * dst->nb[1]);
            if (act == LLMRT_GLU_GELU) {
                p->ctx->kt->vec_geglu((int)ne0, y, g, u); /* ggml_vec_geglu_f32: x >= 10 gives x * up */
            } else {
                p->ctx->kt->vec_swiglu((int)ne0, y, g, u); /* ggml_vec_swiglu_f32 */
            }
        }
    }
}
