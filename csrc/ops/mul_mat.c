/*
 * mul_mat.c — y = x @ W^T for a weight W [K, M] of any type and f32 activations x [K, rows].
 *
 * Two nodes. QUANTIZE converts each activation row to W's vec_dot_type (Q8_0 for Q4_0, Q8_K for
 * the K-quants, F16 for F16, ...) into an arena tensor, once per run, with the kernel table's
 * quant_act_row: the rounding ggml's CPU backend uses for activations on this ISA. MUL_MAT then computes
 * y[j][m] = vec_dot(W row m, x row j).
 *
 * Packed weights (gemm.h; W->packed set at load and the level has a gemm for the type): chunks
 * are (range of groups) x (block of tokens), claimed atomically in token-block-major order, so
 * both threads work on the same token block (its activations stay in L2) on different weights.
 * A group's R rows (or kt->gemm_groups consecutive groups) are fed to kt->gemm for all tokens of
 * the block at once (the groups, a few KB, stay in L1 while the kernel tiles the tokens). Group
 * ranges are sized for at least MM_CHUNKS_PER_THREAD chunks per thread per token block, at most
 * MM_CHUNK_BYTES of weights (rounded up to whole gemm calls in a prefill). Decode (up to
 * MM_FEW_TOKENS tokens, more than one thread) is read from memory rather than computed: each thread
 * streams one contiguous range of 7/8 of the groups, and only the last 1/8 is claimed in small
 * chunks (see mul_mat_packed). Chunks claimed in turn had each thread jump from one 16-64 KB piece
 * to the next, every start a new stream for the prefetchers, and the threads take turns on one
 * counter's cache line: decode ran slower on every file measured, by up to a quarter
 * (benchmarks/README.md).
 *
 * AMX (amx.h): a weight with an AMX copy, in a run of >= LLMRT_AMX_MIN_TOKENS tokens while
 * llmrt_amx_matmul() is on, goes to llmrt_amx_gemm_int8 instead: chunks are MM_AMX_ROWS weight
 * rows (all tokens), the activations the QUANTIZE node made (Q8_0 / Q8_1) read as they are.
 * F32 / F16 / BF16 weights have a bf16 copy and go to llmrt_amx_gemm_bf16: chunks are MM_AMX_ROWS
 * weight rows x MM_AMX_TOKENS tokens, whose activation rows each thread rounds to bf16 into its
 * scratch (once per token block it works on). BF16 weights keep their values (the activations are
 * rounded to bf16, as ggml does for BF16 weights); F16 / F32 weights are rounded to bf16 too.
 *
 * Plain weights: chunks are blocks of MM_BLOCK weight rows; a chunk loops over every activation
 * row for its block, so the block's weights stay in cache while they are reused by all tokens.
 */
#include "llmrt/amx.h"
#include <string.h>
#include "llmrt/gemm.h"
#include "ops/ops.h"

#define MM_BLOCK 16               /* weight rows per chunk (plain weights) */
#define MM_TOKENS 64              /* tokens per chunk (packed): 64 x K activation bytes stay in L2 */
#define MM_CHUNKS_PER_THREAD 8    /* packed: at least this many chunks per thread and token block */
#define MM_CHUNK_BYTES (64 << 10) /* packed: at most this many weight bytes per chunk */
#define MM_FEW_TOKENS 4           /* packed: up to this many tokens (decode, a batched decode step)
                                   * the threads stream contiguous ranges (llmrt_split_head); above,
                                   * chunks are whole calls of gemm_groups groups (a call's size
                                   * matters to prefill: e.g. the avx2 Q4_0 kernel stages its tokens
                                   * once per call, for 64 rows) */
#define MM_TAIL_CHUNKS 4          /* packed decode: claimed chunks of the tail per thread */
#define MM_AMX_ROWS 64            /* AMX: weight rows per chunk (a multiple of LLMRT_AMX_ROW_STEP) */
#define MM_AMX_TOKENS 32          /* AMX bf16: tokens per chunk (their bf16 rows in the thread's scratch) */

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

/* groups [g0, g1) of pw for n_x tokens from xj into yj, in calls of up to G groups */
static void mm_groups(const llmrt_packed *pw, llmrt_gemm_fn gemm, int G, int64_t g0, int64_t g1, const char *xj,
                      size_t xs, int n_x, float *yj, int64_t ys) {
    for (int64_t g = g0; g < g1; g += G) {
        const int64_t gr = (g1 - g < G ? g1 - g : G) * pw->R;     /* rows of this call's groups */
        const int n_rows = (int)(pw->M - g * pw->R < gr ? pw->M - g * pw->R : gr);
        gemm(pw->K, (const char *)pw->data + (size_t)g * pw->group_bytes, n_rows, xj, xs, n_x, yj + g * pw->R, ys);
    }
}

static void mul_mat_packed(const llmrt_compute_params *p, llmrt_tensor *dst, llmrt_gemm_fn gemm,
                           int gemm_groups, int gemm_align) {
    const llmrt_packed *pw = dst->src[0]->packed;
    const llmrt_tensor *x = dst->src[1];
    const int64_t nr = llmrt_nrows(x);
    const int64_t ng = pw->n_groups;
    const int G = gemm_groups > 1 ? gemm_groups : 1;             /* groups per gemm call */
    const char *xd = (const char *)x->data;
    float *yd = (float *)dst->data;
    const size_t xs = x->nb[1];
    const int64_t ys = (int64_t)(dst->nb[1] / sizeof(float));
    if (nr <= MM_FEW_TOKENS && p->nth > 1) {
        /* decode: thread ith streams its contiguous range of the first 7/8 of the groups (one
         * sequential read, what the hardware prefetcher follows and the kernels' prefetches run
         * ahead in), then the last 1/8 goes in small claimed chunks to whichever thread is done
         * first (a thread that starts late or runs slower is helped by up to that much; further
         * behind, the node waits for it). */
        const int64_t A = gemm_align > 1 ? gemm_align : 1;   /* the split's unit: A groups */
        const int64_t nu = (ng + A - 1) / A;
        int64_t u_lo, u_hi;
        const int64_t head = llmrt_split_head(p, nu, &u_lo, &u_hi), tail = nu - head;
        mm_groups(pw, gemm, G, u_lo * A, u_hi * A < ng ? u_hi * A : ng, xd, xs, (int)nr, yd, ys);
        int64_t tpc = tail / ((int64_t)MM_TAIL_CHUNKS * p->nth);  /* units per tail chunk */
        if (tpc < 1) tpc = 1;
        for (int64_t c = llmrt_claim(p); c * tpc < tail; c = llmrt_claim(p)) {
            const int64_t g0 = (head + c * tpc) * A, g1 = (head + (c + 1) * tpc) * A;
            mm_groups(pw, gemm, G, g0, g1 < ng ? g1 : ng, xd, xs, (int)nr, yd, ys);
        }
        return;
    }
    int64_t gpc = ng / ((int64_t)MM_CHUNKS_PER_THREAD * p->nth);  /* groups per chunk */
    const int64_t gmax = (int64_t)(MM_CHUNK_BYTES / pw->group_bytes);
    if (gpc > gmax) gpc = gmax;
    if (nr > MM_FEW_TOKENS) gpc = (gpc + G - 1) / G * G;          /* prefill: whole calls */
    if (gpc < 1) gpc = 1;
    const int64_t n_gc = (ng + gpc - 1) / gpc;
    const int64_t n_tb = (nr + MM_TOKENS - 1) / MM_TOKENS;
    const int64_t n_chunks = n_gc * n_tb;
    for (int64_t c = llmrt_claim(p); c < n_chunks; c = llmrt_claim(p)) {
        const int64_t j0 = (c / n_gc) * MM_TOKENS;
        const int n_x = (int)(nr - j0 < MM_TOKENS ? nr - j0 : MM_TOKENS);
        const int64_t g0 = (c % n_gc) * gpc;
        mm_groups(pw, gemm, G, g0, g0 + gpc < ng ? g0 + gpc : ng, xd + (size_t)j0 * xs, xs, n_x, yd + j0 * ys, ys);
    }
}

/* Activation rows [j0, j0 + n) of x (F32, F16 or BF16) rounded to bf16, K_pad per row (zeros past
 * K), into xb: what the bf16 tile GEMM reads. F32 rows are rounded once (llmrt_amx_act_bf16); F16 /
 * BF16 rows (the QUANTIZE node's copy for F16 / BF16 weights) are exact in f32 first. */
void llmrt_amx_rows_bf16(const llmrt_tensor *x, int64_t j0, int64_t n, int64_t K, int64_t K_pad, uint16_t *xb) {
    const size_t xbs = (size_t)K_pad * sizeof(uint16_t);
    if (x->type == LLMRT_TYPE_F32) {
        llmrt_amx_act_bf16((const float *)((const char *)x->data + (size_t)j0 * x->nb[1]), x->nb[1], n, K, xb, xbs);
        return;
    }
    for (int64_t t = 0; t < n; t++) {
        const char *xr = (const char *)x->data + (size_t)(j0 + t) * x->nb[1];
        uint16_t *br = xb + (size_t)t * (size_t)K_pad;
        if (x->type == LLMRT_TYPE_BF16) {
            memcpy(br, xr, (size_t)K * sizeof(uint16_t));
        } else {
            for (int64_t k = 0; k < K; k++) {
                llmrt_fp16_t h;
                memcpy(&h, xr + 2 * k, sizeof(h));
                br[k] = llmrt_fp32_to_bf16(llmrt_fp16_to_fp32(h));
            }
        }
        memset(br + K, 0, (size_t)(K_pad - K) * sizeof(uint16_t));
    }
}

size_t llmrt_mul_mat_wsize(const llmrt_tensor *dst) {
    const llmrt_amx_packed *aw = dst->src[0]->amx;
    if (aw == NULL || aw->kind != LLMRT_AMX_KIND_BF16) return 0;
    return (size_t)MM_AMX_TOKENS * (size_t)(aw->nkb * 32) * sizeof(uint16_t);
}

/* 1 if this node ran on the AMX path (else nothing was written). The GEMM validates its
 * arguments; a refusal (never expected: shapes were checked when the copy was attached) leaves
 * the node to the other paths, which every thread then takes alike. */
static int mul_mat_amx(const llmrt_compute_params *p, llmrt_tensor *dst, int backend) {
    const llmrt_tensor *w = dst->src[0];
    const llmrt_tensor *x = dst->src[1];
    const llmrt_amx_packed *aw = w->amx;
    if (aw->kind == LLMRT_AMX_KIND_BF16) {   /* F32 / F16 / BF16 weights: bf16 tiles */
        if (x->type != LLMRT_TYPE_F32 && x->type != LLMRT_TYPE_F16 && x->type != LLMRT_TYPE_BF16) return 0;
        if (p->wsize < llmrt_mul_mat_wsize(dst)) return 0;
        const int64_t nr = llmrt_nrows(x);
        const int64_t K = aw->K, K_pad = aw->nkb * 32;
        const int64_t n_rc = (aw->M + MM_AMX_ROWS - 1) / MM_AMX_ROWS;
        const int64_t n_tb = (nr + MM_AMX_TOKENS - 1) / MM_AMX_TOKENS;
        uint16_t *xb = (uint16_t *)p->wdata;
        if (p->ith == 0) llmrt_amx_count_matmul();
        int64_t have = -1;                       /* the token block xb holds */
        for (int64_t c = llmrt_claim(p); c < n_rc * n_tb; c = llmrt_claim(p)) {
            const int64_t tb = c / n_rc, r0 = (c % n_rc) * MM_AMX_ROWS;
            const int64_t r1 = r0 + MM_AMX_ROWS < aw->M ? r0 + MM_AMX_ROWS : aw->M;
            const int64_t j0 = tb * MM_AMX_TOKENS;
            const int64_t n = nr - j0 < MM_AMX_TOKENS ? nr - j0 : MM_AMX_TOKENS;
            if (tb != have) {
                llmrt_amx_rows_bf16(x, j0, n, K, K_pad, xb);
                have = tb;
            }
            (void)llmrt_amx_gemm_bf16(aw, xb, (size_t)K_pad * sizeof(uint16_t), n,
                                      (float *)((char *)dst->data + (size_t)j0 * dst->nb[1]), dst->nb[1], r0, r1,
                                      backend);
        }
        return 1;
    }
    if (x->type != llmrt_amx_act_type(aw)) return 0;
    const int64_t nr = llmrt_nrows(x);
    const int64_t n_chunks = (aw->M + MM_AMX_ROWS - 1) / MM_AMX_ROWS;
    if (p->ith == 0) llmrt_amx_count_matmul();
    for (int64_t c = llmrt_claim(p); c < n_chunks; c = llmrt_claim(p)) {
        const int64_t r0 = c * MM_AMX_ROWS;
        const int64_t r1 = r0 + MM_AMX_ROWS < aw->M ? r0 + MM_AMX_ROWS : aw->M;
        (void)llmrt_amx_gemm_int8(aw, x->data, x->nb[1], nr, (float *)dst->data, dst->nb[1], r0, r1,
                                  0, backend);
    }
    return 1;
}

void llmrt_compute_mul_mat(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *w = dst->src[0];
    const llmrt_tensor *x = dst->src[1];
    if (w->amx != NULL && llmrt_nrows(x) >= LLMRT_AMX_MIN_TOKENS) {
        const int backend = llmrt_amx_matmul();
        if (backend >= 0 && mul_mat_amx(p, dst, backend)) return;
    }
    const llmrt_gemm_fn gemm = w->packed ? p->ctx->kt->gemm[w->type] : NULL;
    if (gemm != NULL) {
        mul_mat_packed(p, dst, gemm, p->ctx->kt->gemm_groups[w->type], p->ctx->kt->gemm_align[w->type]);
        return;
    }
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
