/*
 * ops.h — internal: what the graph runner hands each op, and the op kernels it calls.
 *
 * Every node runs on all threads of the pool. An op cuts its work into chunks (rows, blocks of
 * weight rows, tokens, (token, head) pairs) and each thread claims the next chunk from the
 * node's atomic counter until none are left:
 *
 *     for (int64_t c = llmrt_claim(p); c < n_chunks; c = llmrt_claim(p)) { ...chunk c... }
 *
 * The counter starts at 0 for every node of every run. dst's ne already holds this run's token
 * count. Inputs were validated when the graph was built and when the run started.
 */
#ifndef LLMRT_OPS_H
#define LLMRT_OPS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "llmrt/graph.h"
#include "llmrt/kv_cache.h"
#include "llmrt/llmrt.h"

/* One sequence of a run: its tokens [tok0, tok0 + n) of the batch go to its own cache. */
typedef struct {
    llmrt_kv_cache *cache;
    int tok0;                       /* the sequence's first token in the batch */
    int n;                          /* its tokens in this run */
    int kv_first;                   /* cache cell of its first token */
    int kv_cells;                   /* cells attention reads: [0, kv_cells) (llmrt_kv_cache_n_cells) */
} llmrt_run_seq;

/* Shared by all threads of one run. */
typedef struct {
    int n;                          /* tokens in this run */
    int n_out;                      /* picked output rows in this run */
    const int32_t *positions;       /* [n] */
    llmrt_kv_cache *cache;          /* sequence 0's cache; NULL if the graph has no attention */
    int kv_first;                   /* sequence 0's kv_first */
    int kv_cells;                   /* sequence 0's kv_cells */
    int n_seq;                      /* sequences in this run (1 for llmrt_graph_run) */
    const llmrt_run_seq *seqs;      /* [n_seq] */
    const int32_t *tok_seq;         /* [n] the sequence of each token */
    const llmrt_kernel_table *kt;
} llmrt_run_ctx;

/* The sequence of token i of the run. */
static inline const llmrt_run_seq *llmrt_token_seq(const llmrt_run_ctx *ctx, int64_t i) {
    return &ctx->seqs[ctx->n_seq == 1 ? 0 : ctx->tok_seq[i]];
}

/* One thread's view of one node. */
typedef struct {
    int ith, nth;
    void *wdata;                    /* this thread's scratch, wsize bytes (64-byte aligned) */
    size_t wsize;
    atomic_int *counter;            /* this node's chunk counter */
    const llmrt_run_ctx *ctx;
} llmrt_compute_params;

static inline int64_t llmrt_claim(const llmrt_compute_params *p) {
    return (int64_t)atomic_fetch_add_explicit(p->counter, 1, memory_order_relaxed);
}

/* Decode split (MUL_MAT, MUL_MAT_ID of up to 4 tokens on more than one thread): of n work units in
 * memory order, the first n - n / LLMRT_SPLIT_TAIL are cut into nth equal contiguous ranges, one per
 * thread (one sequential read each), the rest is left to claims by whichever thread is done first.
 * Sets this thread's range [*lo, *hi) and returns the count of split units (the claims start there). */
#define LLMRT_SPLIT_TAIL 8
static inline int64_t llmrt_split_head(const llmrt_compute_params *p, int64_t n, int64_t *lo, int64_t *hi) {
    const int64_t head = n - n / LLMRT_SPLIT_TAIL;
    *lo = head * p->ith / p->nth;
    *hi = head * (p->ith + 1) / p->nth;
    return head;
}

/* Rows (ne1 * ne2 * ne3) of a tensor at its current shape. */
static inline int64_t llmrt_nrows(const llmrt_tensor *t) {
    return t->ne[1] * t->ne[2] * t->ne[3];
}

/* fp16 -> fp32 through a 64K-entry table (filled by llmrt_ops_init). */
extern float llmrt_table_f32_f16[1 << 16];
static inline float llmrt_f16_lookup(llmrt_fp16_t h) {
    return llmrt_table_f32_f16[h];
}

/* Fills the lookup tables once (thread-safe, idempotent). */
void llmrt_ops_init(void);

/* Converts n values of a float type (F32, F16, BF16) to f32. */
void llmrt_row_to_f32(int type, const void *x, float *y, int64_t n);

/* ---- op kernels: void f(const llmrt_compute_params *p, llmrt_tensor *dst) ---------------- */

void llmrt_compute_get_rows(const llmrt_compute_params *p, llmrt_tensor *dst);
void llmrt_compute_get_rows_f32(const llmrt_compute_params *p, llmrt_tensor *dst);
void llmrt_compute_rms_norm(const llmrt_compute_params *p, llmrt_tensor *dst);
void llmrt_compute_binary(const llmrt_compute_params *p, llmrt_tensor *dst);   /* MUL, ADD */
void llmrt_compute_unary(const llmrt_compute_params *p, llmrt_tensor *dst);    /* SCALE, SILU,
                                                                                  GELU, SOFTCAP */
void llmrt_compute_glu(const llmrt_compute_params *p, llmrt_tensor *dst);
void llmrt_compute_quantize(const llmrt_compute_params *p, llmrt_tensor *dst);
void llmrt_compute_mul_mat(const llmrt_compute_params *p, llmrt_tensor *dst);
void llmrt_compute_rope(const llmrt_compute_params *p, llmrt_tensor *dst);
void llmrt_compute_kv_store(const llmrt_compute_params *p, llmrt_tensor *dst);
void llmrt_compute_attention(const llmrt_compute_params *p, llmrt_tensor *dst);
void llmrt_compute_moe_route(const llmrt_compute_params *p, llmrt_tensor *dst);   /* ops/moe.c */
void llmrt_compute_mul_mat_id(const llmrt_compute_params *p, llmrt_tensor *dst);
void llmrt_compute_moe_sum(const llmrt_compute_params *p, llmrt_tensor *dst);

/* Per-thread scratch bytes an op needs (0 for most). */
size_t llmrt_rope_wsize(const llmrt_tensor *dst);
size_t llmrt_attention_wsize(const llmrt_tensor *dst);
/* MUL_MAT's per-thread scratch: the bf16 activation rows of a weight with a bf16 AMX copy. */
size_t llmrt_mul_mat_wsize(const llmrt_tensor *dst);
/* Activation rows [j0, j0 + n) of x (F32, F16 or BF16) rounded to bf16, K_pad per row (zeros
 * past K), into xb: what the bf16 AMX GEMM reads (mul_mat.c; MUL_MAT_ID too). */
void llmrt_amx_rows_bf16(const llmrt_tensor *x, int64_t j0, int64_t n, int64_t K, int64_t K_pad, uint16_t *xb);
/* MoE scratch: the router's probabilities; MUL_MAT_ID's grouping, gathered rows and results. */
size_t llmrt_moe_route_wsize(const llmrt_tensor *dst);
size_t llmrt_mul_mat_id_wsize(const llmrt_tensor *dst);
/* Attention's scratch for a cache of n_ctx cells (the graph grows its scratch to this at run). */
size_t llmrt_attention_wsize_run(const llmrt_tensor *dst, int n_ctx);
/* llama.cpp's n_kv when the last used cell is `cell` (0-based): cells used, padded to 256. */
int64_t llmrt_attention_n_kv(int64_t cell);

/* ---- RoPE pieces, shared with the cache's shift (ggml_rope_ext semantics) ---------------- */

/* YaRN correction dims [start, end] for n_dims rotated dims (ggml_rope_yarn_corr_dims). */
void llmrt_rope_yarn_corr_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast,
                               float beta_slow, float dims[2]);
/* cache[2i] = cos, cache[2i + 1] = sin of pair i at position pos, i < n_rot / 2, including
 * freq_factors (NULL or [n_rot / 2]), YaRN and attn_factor. sin_sign -1 rotates backwards. */
/* The rope parameters stored in a rope node's op_params. */
void llmrt_rope_params_from_node(const llmrt_tensor *t, llmrt_rope_params *rp);
void llmrt_rope_cache_init(float pos, const llmrt_rope_params *rp, const float *freq_factors,
                           const float corr_dims[2], float sin_sign, float *cache);
/* Rotates one head vector x (hd floats, n_rot <= hd) into y (may alias x) with the cache. */
void llmrt_rope_apply(const float *cache, int n_rot, int mode, int hd, const float *x, float *y);

#endif /* LLMRT_OPS_H */
