/*
 * attn_generic.c — attention's P.V product for the generic level (see llmrt_attn_pv_fn in
 * llmrt.h). The generic vec_dot_f16 / vec_dot_f32 (dot_generic.c) add each f32 product to one
 * double in index order, so visiting the cells in index order, row by row, and adding each
 * row's products to hd doubles gives every output the same sequence of operations. Each of the nq
 * probability rows is done on its own (this level has no conversion to share). Skipped cells
 * have p == 0: their products are ±0 and adding ±0 to a double sum that starts at +0 changes
 * nothing.
 */
#include "llmrt/llmrt.h"

#define FP16(h) llmrt_fp16_to_fp32(h)

static void attn_pv_f16_generic(int hd, int nq, float *y, int64_t ldy, const void *vv, int64_t ldv,
                                const void *vp, int64_t ldp, int c0, int c1, void *scratch) {
    const llmrt_fp16_t *v = vv; /* (cells, ldv) */
    double *sum = scratch;      /* (hd) */
    for (int j = 0; j < nq; j++) {
        const llmrt_fp16_t *p = (const llmrt_fp16_t *)vp + j * ldp; /* (cells) */
        for (int d = 0; d < hd; d++) sum[d] = 0.0;
        for (int c = c0; c < c1; c++) {
            if (p[c] == 0) continue;
            const float pc = FP16(p[c]);
            const llmrt_fp16_t *row = v + (int64_t)c * ldv;
            for (int d = 0; d < hd; d++) sum[d] += (double)(FP16(row[d]) * pc);
        }
        for (int d = 0; d < hd; d++) y[j * ldy + d] = (float)sum[d];
    }
}

static void attn_pv_f32_generic(int hd, int nq, float *y, int64_t ldy, const void *vv, int64_t ldv,
                                const void *vp, int64_t ldp, int c0, int c1, void *scratch) {
    const float *v = vv; /* (cells, ldv) */
    double *sum = scratch; /* (hd) */
    for (int j = 0; j < nq; j++) {
        const float *p = (const float *)vp + j * ldp; /* (cells) */
        for (int d = 0; d < hd; d++) sum[d] = 0.0;
        for (int c = c0; c < c1; c++) {
            if (p[c] == 0.0f) continue;
            const float pc = p[c];
            const float *row = v + (int64_t)c * ldv;
            for (int d = 0; d < hd; d++) sum[d] += (double)(row[d] * pc);
        }
        for (int d = 0; d < hd; d++) y[j * ldy + d] = (float)sum[d];
    }
}

/* Many dots (llmrt_attn_dots_fn): vec_dot_f16_generic's sum in double, in index order, with Y's f32
 * values (exact f16 ones). */
static void attn_dots_f16_generic(int n, int nx, int ny, float *out, int64_t ldo, const void *vx, int64_t ldx,
                                  const float *y, int64_t ldy) {
    for (int j = 0; j < ny; j++) {
        for (int i = 0; i < nx; i++) {
            const llmrt_fp16_t *x = (const llmrt_fp16_t *)vx + i * ldx; /* (n) */
            const float *yj = y + j * ldy;                              /* (n) */
            double sum = 0.0;
            for (int e = 0; e < n; e++) sum += (double)(FP16(x[e]) * yj[e]);
            out[j * ldo + i] = (float)sum;
        }
    }
}

void llmrt_register_attn_kernels_generic(llmrt_kernel_table *kt) {
    kt->attn_pv[LLMRT_TYPE_F16] = attn_pv_f16_generic;
    kt->attn_pv_dot[LLMRT_TYPE_F16] = kt->vec_dot[LLMRT_TYPE_F16];
    kt->attn_pv_name[LLMRT_TYPE_F16] = "attn_pv_f16_generic";
    kt->attn_pv[LLMRT_TYPE_F32] = attn_pv_f32_generic;
    kt->attn_pv_dot[LLMRT_TYPE_F32] = kt->vec_dot[LLMRT_TYPE_F32];
    kt->attn_pv_name[LLMRT_TYPE_F32] = "attn_pv_f32_generic";
    kt->attn_dots[LLMRT_TYPE_F16] = attn_dots_f16_generic;
    kt->attn_dots_dot[LLMRT_TYPE_F16] = kt->vec_dot[LLMRT_TYPE_F16];
    kt->attn_dots_name[LLMRT_TYPE_F16] = "attn_dots_f16_generic";
}
