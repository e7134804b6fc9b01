/*
 * moe.c — mixture-of-experts ops (llama.cpp's build_moe_ffn, as three nodes):
 *
 *   MOE_ROUTE   router logits [n_expert, n] -> [2k, n]: per token the k chosen experts' weights
 *               (row [0, k)) and ids (row [k, 2k), stored as exact floats). probs = softmax (or
 *               sigmoid) of the logits; the experts with the k largest probs (+ an optional
 *               selection bias, exp_probs_b) are chosen, largest first, the lower id first on a
 *               tie; their weights are the probs, renormalised to sum 1 when asked (the sum
 *               clamped below at 2^-14 as llama.cpp does), times a scale.
 *   MUL_MAT_ID  w [K, M, n_expert] times each token's chosen experts -> [M, k, n]. x is [K, n]
 *               (the same row for every slot: gate / up) or [K, k, n] (one row per slot: down),
 *               in w's vec_dot_type (the QUANTIZE node before it, as for MUL_MAT). With a second
 *               weight `up` (src3) it is the fused gate/up/GLU: y = act(w·x) * (up·x), both
 *               products of a chunk computed from the same gathered activations.
 *   MOE_SUM     [M, k, n] -> [M, n]: Σ_s weight_s * y_s in slot order (each product rounded, then
 *               added, as ggml's mul + adds), + sigmoid(shared_gate) * shared (Qwen2-MoE).
 *
 * MUL_MAT_ID groups the run's (token, slot) rows by expert (every thread computes the same
 * grouping in its scratch: O(n k + n_expert), no barrier), so each chosen expert's weights are
 * streamed once for all its tokens and an expert nobody chose is never read (decode reads k
 * experts). Chunks are (expert, block of ID_TOKENS of its rows, ID_ROWS weight rows — more when
 * no expert has ID_TOKENS rows, up to about ID_CHUNK_BYTES of weights), claimed from the node's
 * counter token-block-major within an expert, so a skewed routing (one expert with most tokens)
 * still splits into many chunks and no thread idles. Decode (no expert with more than
 * ID_FEW_TOKENS rows) on more than one thread reads rather than computes: each thread streams one
 * contiguous range of ID_ROWS-row chunks and only the last 1/8 is claimed (llmrt_split_head). A
 * chunk gathers its activation rows into the thread's scratch once per (expert, token block) and
 * runs the level's packed gemm (gemm.h; a 3-D weight is packed as n_expert * M rows, expert e's groups starting
 * at e * M / R) or, for weights without a packed copy, vec_dot row by row; results go through a
 * small [tokens][rows] buffer to the tokens' output rows. Every (row, token) value has the bits
 * of vec_dot on the same level, as in MUL_MAT.
 *
 * AMX (amx.h), as KTransformers picks by tokens per expert: a weight with an AMX copy (all
 * n_expert * M rows, M a multiple of the row step) runs a chunk of >= LLMRT_AMX_MIN_TOKENS tokens
 * of one expert through the tile GEMM while llmrt_amx_matmul() is on, on a view of the copy that
 * starts at the chunk's first row (int8 kinds read the gathered Q8_0 / Q8_1 rows; bf16 kinds the
 * rows rounded to bf16 in the scratch); smaller chunks (decode) keep the level's gemm.
 */
#include <math.h>
#include <string.h>

#include "llmrt/amx.h"
#include "llmrt/gemm.h"
#include "ops/ops.h"

#define ID_TOKENS 64   /* rows of one expert per chunk */
#define ID_ROWS 64     /* weight rows per chunk: a multiple of every pack_rows (4, 8) and of the
                          AMX row step; decode-sized runs take up to ID_TOKENS * ID_ROWS / n */
#define ID_CHUNK_BYTES (128 << 10)   /* no expert with ID_TOKENS rows (but not the decode split): chunks
                                        of about this many weight bytes */
#define ID_FEW_TOKENS 4  /* decode (and a batched decode step): no expert has more tokens than this */
#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

/* ---- MOE_ROUTE --------------------------------------------------------------------------- */

size_t llmrt_moe_route_wsize(const llmrt_tensor *dst) {
    return (2 * sizeof(float) + 1) * (size_t)dst->src[0]->ne[0];
}

void llmrt_compute_moe_route(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *lg = dst->src[0];
    const llmrt_tensor *bias = dst->src[1];
    const int E = (int)lg->ne[0];
    const int k = dst->op_params[0];
    const int gating = dst->op_params[1];
    const int norm = dst->op_params[2];
    const float scale = llmrt_get_op_param_f32(dst, 3);
    const int64_t n = llmrt_nrows(lg);
    float *probs = (float *)p->wdata;
    float *sel = probs + E;
    uint8_t *taken = (uint8_t *)(sel + E);
    for (int64_t t = llmrt_claim(p); t < n; t = llmrt_claim(p)) {
        const float *x = (const float *)((const char *)lg->data + t * lg->nb[1]);
        float *y = (float *)((char *)dst->data + t * dst->nb[1]);
        if (gating == LLMRT_MOE_GATING_SIGMOID) {
            for (int i = 0; i < E; i++) probs[i] = 1.0f / (1.0f + expf(-x[i]));
        } else {                        /* ggml_soft_max: max, exp, the sum in double, scale */
            float mx = -INFINITY;
            for (int i = 0; i < E; i++) mx = x[i] > mx ? x[i] : mx;
            const double sum = p->ctx->kt->vec_soft_max(E, probs, x, mx);
            const float inv = (float)(1.0 / sum);
            for (int i = 0; i < E; i++) probs[i] *= inv;
        }
        for (int i = 0; i < E; i++) {
            sel[i] = probs[i] + (bias != NULL ? ((const float *)bias->data)[i] : 0.0f);
        }
        memset(taken, 0, (size_t)E);
        double wsum = 0.0;
        for (int s = 0; s < k; s++) {   /* k passes of an argmax: E <= a few hundred, k <= 16 */
            int best = -1;              /* k distinct ids whatever the values (-inf, NaN) */
            for (int i = 0; i < E; i++) {
                if (!taken[i] && (best < 0 || sel[i] > sel[best])) best = i;
            }
            taken[best] = 1;
            y[s] = probs[best];
            y[k + s] = (float)best;
            wsum += (double)y[s];
        }
        if (norm) {
            float ws = (float)wsum;
            if (!(ws >= 6.103515625e-5f)) ws = 6.103515625e-5f;
            for (int s = 0; s < k; s++) y[s] = y[s] / ws;
        }
        if (scale != 1.0f) {
            for (int s = 0; s < k; s++) y[s] *= scale;
        }
    }
}

/* ---- MUL_MAT_ID -------------------------------------------------------------------------- */

/* The scratch of one thread: counts, offsets, cursors and chunk starts per expert, the rows of
 * the run grouped by expert, the gathered activations of one chunk and its two result buffers. */
typedef struct {
    int32_t *cnt, *off, *cur, *cstart, *rows;
    char *xbuf;           /* the chunk's activation rows: as QUANTIZE made them, or bf16 (AMX) */
    float *yg, *yu;
} id_scratch;

static size_t id_ints_bytes(int64_t E, int64_t n_rows) {
    return ALIGN64((size_t)(4 * E + 2 + n_rows) * sizeof(int32_t));
}

/* Bytes of one gathered row: as QUANTIZE made it, or (bf16 AMX copy) K_pad bf16 values. */
static size_t id_row_bytes(const llmrt_tensor *dst) {
    const llmrt_amx_packed *aw = dst->src[0]->amx;
    const size_t xs = dst->src[1]->nb[1];
    const size_t xb = aw != NULL && aw->kind == LLMRT_AMX_KIND_BF16 ? (size_t)aw->nkb * 32 * sizeof(uint16_t) : 0;
    return xs > xb ? xs : xb;
}

size_t llmrt_mul_mat_id_wsize(const llmrt_tensor *dst) {
    const int64_t E = dst->src[0]->ne[2];
    const int64_t n_rows = dst->ne[1] * dst->tok_cap;         /* k * n */
    return id_ints_bytes(E, n_rows) + ALIGN64((size_t)ID_TOKENS * id_row_bytes(dst)) +
           2 * ALIGN64((size_t)ID_TOKENS * ID_ROWS * sizeof(float));
}

static id_scratch id_layout(void *w, int64_t E, int64_t n_rows, size_t row_bytes) {
    id_scratch s;
    int32_t *ip = (int32_t *)w;
    s.cnt = ip;
    s.off = ip + E;
    s.cur = ip + 2 * E + 1;
    s.cstart = ip + 3 * E + 1;
    s.rows = ip + 4 * E + 2;
    s.xbuf = (char *)w + id_ints_bytes(E, n_rows);
    s.yg = (float *)(s.xbuf + ALIGN64((size_t)ID_TOKENS * row_bytes));
    s.yu = s.yg + ALIGN64((size_t)ID_TOKENS * ID_ROWS * sizeof(float)) / sizeof(float);
    return s;
}

/* Rows [r0, r1) of expert e of AMX copy aw (n_expert * M rows; M and r0 multiples of the row
 * step) as a copy of their own: the same groups, from the chunk's first row. */
static llmrt_amx_packed amx_expert_view(const llmrt_amx_packed *aw, int64_t M, int64_t e, int64_t r0, int64_t r1) {
    llmrt_amx_packed v = *aw;
    v.M = r1 - r0;
    v.ngroups = (v.M + 15) / 16;
    v.data = aw->data + (size_t)((e * M + r0) / 16) * aw->group_bytes;
    return v;
}

/* y[j * yr + (m - r0)] for rows [r0, r1) of expert e on the tile GEMM (xg: the gathered rows,
 * xs bytes apart, in the copy's activation form). */
static void id_products_amx(const llmrt_tensor *w, int64_t e, int64_t r0, int64_t r1, const char *xg,
                            size_t xs, int nx, float *y, int64_t yr, int backend) {
    const llmrt_amx_packed view = amx_expert_view(w->amx, w->ne[1], e, r0, r1);
    const size_t ys = (size_t)yr * sizeof(float);
    if (view.kind == LLMRT_AMX_KIND_BF16) {
        (void)llmrt_amx_gemm_bf16(&view, (const uint16_t *)xg, xs, nx, y, ys, 0, view.M, backend);
    } else {
        (void)llmrt_amx_gemm_int8(&view, xg, xs, nx, y, ys, 0, view.M, 0, backend);
    }
}

/* y[j * yr + (m - r0)] = row m of expert e of w (rows [r0, r1)) · activation row j. */
static void id_products(const llmrt_compute_params *p, const llmrt_tensor *w, int64_t e, int64_t r0,
                        int64_t r1, const char *xg, size_t xs, const int32_t *list, int nx,
                        const llmrt_tensor *x, int bcast, int k, float *y, int64_t yr) {
    const llmrt_kernel_table *kt = p->ctx->kt;
    const int64_t K = w->ne[0], M = w->ne[1];
    const llmrt_packed *pw = w->packed;
    const llmrt_gemm_fn gemm = pw != NULL ? kt->gemm[w->type] : NULL;
    if (gemm != NULL) {
        const int R = pw->R;
        const int G = kt->gemm_groups[w->type] > 1 ? kt->gemm_groups[w->type] : 1;
        const int64_t base = e * (M / R);
        for (int64_t r = r0; r < r1; r += (int64_t)G * R) {
            const int n_rows = (int)(r1 - r < (int64_t)G * R ? r1 - r : (int64_t)G * R);
            gemm(K, (const char *)pw->data + (size_t)(base + r / R) * pw->group_bytes, n_rows, xg, xs, nx,
                 y + (r - r0), (size_t)yr);
        }
        return;
    }
    const llmrt_vec_dot_fn dot = kt->vec_dot[w->type];
    const char *we = (const char *)w->data + (size_t)e * w->nb[2];
    for (int j = 0; j < nx; j++) {
        const int64_t q = list[j];
        const char *xr = (const char *)x->data + (size_t)(bcast ? q / k : q) * x->nb[1];
        for (int64_t m = r0; m < r1; m++) dot((int)K, &y[j * yr + (m - r0)], we + (size_t)m * w->nb[1], xr);
    }
}

void llmrt_compute_mul_mat_id(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *w = dst->src[0];
    const llmrt_tensor *x = dst->src[1];
    const llmrt_tensor *route = dst->src[2];
    const llmrt_tensor *up = dst->src[3];
    const int act = dst->op_params[0];
    const int64_t E = w->ne[2], M = w->ne[1];
    const int k = (int)dst->ne[1];
    const int64_t n = dst->ne[2];
    const int bcast = x->n_dims == 2;                 /* [K, n]: one row per token for all slots */
    const size_t xs = x->nb[1];
    if (n < 1) return;
    /* AMX: a copy of every weight of the node, the switch on, activations the copy reads, and
     * the scratch sized for it (a copy attached after build is not used) */
    const llmrt_amx_packed *aw = w->amx;
    int amx = aw != NULL && (up == NULL || up->amx != NULL) ? llmrt_amx_matmul() : -1;
    if (amx >= 0 && aw->kind != LLMRT_AMX_KIND_BF16 && x->type != llmrt_amx_act_type(aw)) amx = -1;
    if (amx >= 0 && aw->kind == LLMRT_AMX_KIND_BF16 && x->type != LLMRT_TYPE_F32 &&
        x->type != LLMRT_TYPE_F16 && x->type != LLMRT_TYPE_BF16) {
        amx = -1;
    }
    if (amx >= 0 && p->wsize < llmrt_mul_mat_id_wsize(dst)) amx = -1;
    const int amx_bf16 = amx >= 0 && aw->kind == LLMRT_AMX_KIND_BF16;
    const size_t xbs = amx_bf16 ? (size_t)aw->nkb * 32 * sizeof(uint16_t) : xs;   /* AMX bf16 row */
    id_scratch s = id_layout(p->wdata, E, k * n, amx >= 0 ? id_row_bytes(dst) : xs);

    /* group the (token, slot) rows by expert: the same result in every thread */
    memset(s.cnt, 0, (size_t)E * sizeof(int32_t));
    for (int64_t t = 0; t < n; t++) {
        const float *r = (const float *)((const char *)route->data + t * route->nb[1]);
        for (int j = 0; j < k; j++) s.cnt[(int64_t)r[k + j]]++;
    }
    /* Rows per chunk: ID_ROWS, or for a run of few tokens (an expert has at most n of them)
     * more, up to about ID_CHUNK_BYTES of weights: the [tokens][rows] buffers hold
     * ID_TOKENS * ID_ROWS results. */
    int64_t tmax = 1;                                 /* the most rows of one token block */
    for (int64_t ee = 0; ee < E; ee++) tmax = s.cnt[ee] > tmax ? s.cnt[ee] : tmax;
    if (tmax > ID_TOKENS) tmax = ID_TOKENS;
    int64_t rpc = ID_ROWS;
    if (tmax < ID_TOKENS) {
        const int64_t by_bytes = (int64_t)(ID_CHUNK_BYTES / w->nb[1]) / ID_ROWS * ID_ROWS;
        const int64_t by_buf = (int64_t)ID_TOKENS * ID_ROWS / tmax / ID_ROWS * ID_ROWS;
        rpc = by_bytes < by_buf ? by_bytes : by_buf;
        if (rpc < ID_ROWS) rpc = ID_ROWS;
    }
    /* Decode with more than one thread: as MUL_MAT's decode (mul_mat.c), each thread streams one
     * contiguous range of the first 7/8 of the chunks (llmrt_split_head; expert after expert,
     * each expert's rows in order: consecutive chunks of an expert are consecutive weight bytes)
     * and only the rest is claimed from the counter. Chunks of ID_ROWS rows make the ranges even;
     * the chunk size no longer decides how far a thread reads in one stream. */
    const int split = tmax <= ID_FEW_TOKENS && p->nth > 1;
    if (split) rpc = ID_ROWS;
    const int64_t n_rc = (M + rpc - 1) / rpc;
    s.off[0] = 0;
    s.cstart[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        s.off[e + 1] = s.off[e] + s.cnt[e];
        s.cur[e] = s.off[e];
        s.cstart[e + 1] = s.cstart[e] + (int32_t)(((s.cnt[e] + ID_TOKENS - 1) / ID_TOKENS) * n_rc);
    }
    for (int64_t t = 0; t < n; t++) {
        const float *r = (const float *)((const char *)route->data + t * route->nb[1]);
        for (int j = 0; j < k; j++) s.rows[s.cur[(int64_t)r[k + j]]++] = (int32_t)(t * k + j);
    }

    const int64_t n_chunks = s.cstart[E];
    const llmrt_gemm_fn gemm = p->ctx->kt->gemm[w->type];   /* gather for whichever weight uses it */
    const int packed = gemm != NULL && (w->packed != NULL || (up != NULL && up->packed != NULL));
    const int64_t K = w->ne[0];
    int64_t e = 0, have_e = -1, have_tb = -1;
    int have_amx = 0;
    int64_t c_lo = 0, c_hi = 0;
    const int64_t head = split ? llmrt_split_head(p, n_chunks, &c_lo, &c_hi) : 0;
    /* this thread's range [c_lo, c_hi), then claims of [head, n_chunks): c only grows */
    for (int64_t c = c_lo < c_hi ? c_lo : head + llmrt_claim(p); c < n_chunks;
         c = c + 1 < c_hi ? c + 1 : head + llmrt_claim(p)) {
        while (s.cstart[e + 1] <= c) e++;             /* c only grows: e only moves forward */
        const int64_t local = c - s.cstart[e];
        const int64_t tb = local / n_rc, r0 = (local % n_rc) * rpc;
        const int64_t r1 = r0 + rpc < M ? r0 + rpc : M;
        const int64_t j0 = tb * ID_TOKENS;
        const int nx = (int)(s.cnt[e] - j0 < ID_TOKENS ? s.cnt[e] - j0 : ID_TOKENS);
        const int32_t *list = s.rows + s.off[e] + j0;
        const int use_amx = amx >= 0 && nx >= LLMRT_AMX_MIN_TOKENS;
        if ((packed || use_amx) && (e != have_e || tb != have_tb || use_amx != have_amx)) {
            for (int j = 0; j < nx; j++) {            /* the chunk's activation rows, contiguous */
                const int64_t q = bcast ? list[j] / k : list[j];
                if (use_amx && amx_bf16) {
                    llmrt_amx_rows_bf16(x, q, 1, K, (int64_t)aw->nkb * 32, (uint16_t *)(s.xbuf + (size_t)j * xbs));
                } else {
                    memcpy(s.xbuf + (size_t)j * xs, (const char *)x->data + (size_t)q * xs, xs);
                }
            }
            have_e = e;
            have_tb = tb;
            have_amx = use_amx;
        }
        if (use_amx) {   /* the GEMMs validate; shapes were checked when the copy was attached */
            const size_t as = amx_bf16 ? xbs : xs;
            id_products_amx(w, e, r0, r1, s.xbuf, as, nx, s.yg, rpc, amx);
            if (up != NULL) id_products_amx(up, e, r0, r1, s.xbuf, as, nx, s.yu, rpc, amx);
            if (r0 == 0 && tb == 0) llmrt_amx_count_matmul();   /* once per expert and node */
        } else {
            id_products(p, w, e, r0, r1, s.xbuf, xs, list, nx, x, bcast, k, s.yg, rpc);
            if (up != NULL) id_products(p, up, e, r0, r1, s.xbuf, xs, list, nx, x, bcast, k, s.yu, rpc);
        }
        for (int j = 0; j < nx; j++) {
            float *y = (float *)((char *)dst->data + (size_t)list[j] * dst->nb[1]) + r0;
            const float *g = s.yg + (size_t)j * rpc;
            if (up == NULL) {
                memcpy(y, g, (size_t)(r1 - r0) * sizeof(float));
            } else if (act == LLMRT_GLU_GELU) {
                p->ctx->kt->vec_geglu((int)(r1 - r0), y, g, s.yu + (size_t)j * rpc);
            } else {
                p->ctx->kt->vec_swiglu((int)(r1 - r0), y, g, s.yu + (size_t)j * rpc);
            }
        }
    }
}

/* ---- MOE_SUM ----------------------------------------------------------------------------- */

void llmrt_compute_moe_sum(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *x = dst->src[0];       /* [M, k, n] */
    const llmrt_tensor *route = dst->src[1];
    const llmrt_tensor *sh = dst->src[2];      /* [M, n] or NULL */
    const llmrt_tensor *sg = dst->src[3];      /* [1, n] or NULL */
    const int64_t M = dst->ne[0];
    const int k = (int)x->ne[1];
    const int64_t n = llmrt_nrows(dst);
    for (int64_t t = llmrt_claim(p); t < n; t = llmrt_claim(p)) {
        const float *wt = (const float *)((const char *)route->data + t * route->nb[1]);
        float *y = (float *)((char *)dst->data + t * dst->nb[1]);
        for (int j = 0; j < k; j++) {
            const float *xr = (const float *)((const char *)x->data + (t * k + j) * x->nb[1]);
            const float wj = wt[j];
            if (j == 0) {
                for (int64_t i = 0; i < M; i++) y[i] = xr[i] * wj;
            } else {
                for (int64_t i = 0; i < M; i++) {
                    const float v = xr[i] * wj;    /* rounded, then added (ggml_mul, ggml_add) */
                    y[i] = y[i] + v;
                }
            }
        }
        if (sh != NULL) {
            const float *sr = (const float *)((const char *)sh->data + t * sh->nb[1]);
            const float gl = *(const float *)((const char *)sg->data + t * sg->nb[1]);
            const float gate = 1.0f / (1.0f + expf(-gl));   /* ggml_vec_sigmoid_f32 */
            for (int64_t i = 0; i < M; i++) {
                const float v = sr[i] * gate;
                y[i] = y[i] + v;
            }
        }
    }
}
