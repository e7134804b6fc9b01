/*
 * kv_cache.h — the key/value cache attention reads and writes.
 *
 * Per layer l: K[l] is [n_ctx][n_head_kv[l]][hd_k[l]] and V[l] is [n_ctx][n_head_kv[l]][hd_v[l]]
 * (innermost last), in f16 (default) or f32. One array pos[n_ctx] (shared by all layers) holds
 * the position of the token stored in each cell; cells [0, n_used) are in use.
 *
 * Attention never assumes cell index == position: it reads pos[] for masking (causal, sliding
 * window). So a streaming cache can later drop cells after the n_keep sinks and move the rest
 * down (shifting their positions and re-rotating K) without touching attention.
 *
 * A graph run stores its n new tokens in cells [n_used, n_used + n):
 *   first = llmrt_kv_cache_prepare(c, n)   reserves them (LLMRT_EINVAL if they do not fit)
 *   llmrt_graph_run(...)                   writes pos[] and K/V of those cells, then commits
 *                                          (n_used += n, n_pending = 0) when it succeeds
 */
#ifndef LLMRT_KV_CACHE_H
#define LLMRT_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n_layer;
    int n_ctx;         /* cells */
    int type;          /* LLMRT_TYPE_F16 or LLMRT_TYPE_F32 */
    int *n_head_kv;    /* [n_layer] */
    int *hd_k;         /* [n_layer] head dim of K */
    int *hd_v;         /* [n_layer] head dim of V */
    void **k;          /* [n_layer] -> [n_ctx][n_head_kv][hd_k] elements of `type` */
    void **v;          /* [n_layer] -> [n_ctx][n_head_kv][hd_v] */
    int32_t *pos;      /* [n_ctx] position of the token in each cell */
    int n_used;        /* cells [0, n_used) hold tokens */
    int n_pending;     /* cells [n_used, n_used + n_pending) reserved for the next run */
} llmrt_kv_cache;

/* NULL on bad arguments or out of memory. Per-layer shapes are arrays of n_layer ints. */
llmrt_kv_cache *llmrt_kv_cache_new(int n_layer, int n_ctx, const int *n_head_kv, const int *hd_k,
                                   const int *hd_v, int type);
void llmrt_kv_cache_free(llmrt_kv_cache *c);

/* Bytes of one cell of layer l's K (or V): n_head_kv * hd * element size. */
size_t llmrt_kv_cache_k_cell_bytes(const llmrt_kv_cache *c, int l);
size_t llmrt_kv_cache_v_cell_bytes(const llmrt_kv_cache *c, int l);

void llmrt_kv_cache_clear(llmrt_kv_cache *c);
/* Reserves n cells after the used ones; returns the first cell index or LLMRT_EINVAL. */
int llmrt_kv_cache_prepare(llmrt_kv_cache *c, int n);
/* Drops cells >= n_used (and any reservation). LLMRT_EINVAL if n_used is out of [0, n_used]. */
int llmrt_kv_cache_truncate(llmrt_kv_cache *c, int n_used);

#ifdef __cplusplus
}
#endif

#endif /* LLMRT_KV_CACHE_H */
