/*
 * kv_cache.c — allocation and bookkeeping of the KV cache (see kv_cache.h for the layout).
 * Attention and the graph run read and write the cells; this file owns the memory and the
 * counters (n_used, n_pending). Eviction and shift-RoPE will live here too.
 */
#include "llmrt/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "llmrt/llmrt.h"

static size_t elem_size(const llmrt_kv_cache *c) {
    return c->type == LLMRT_TYPE_F16 ? sizeof(llmrt_fp16_t) : sizeof(float);
}

size_t llmrt_kv_cache_k_cell_bytes(const llmrt_kv_cache *c, int l) {
    return (size_t)c->n_head_kv[l] * (size_t)c->hd_k[l] * elem_size(c);
}

size_t llmrt_kv_cache_v_cell_bytes(const llmrt_kv_cache *c, int l) {
    return (size_t)c->n_head_kv[l] * (size_t)c->hd_v[l] * elem_size(c);
}

void llmrt_kv_cache_free(llmrt_kv_cache *c) {
    if (c == NULL) return;
    if (c->k != NULL) {
        for (int l = 0; l < c->n_layer; l++) free(c->k[l]);
    }
    if (c->v != NULL) {
        for (int l = 0; l < c->n_layer; l++) free(c->v[l]);
    }
    free(c->k);
    free(c->v);
    free(c->pos);
    free(c->n_head_kv);
    free(c->hd_k);
    free(c->hd_v);
    free(c);
}

llmrt_kv_cache *llmrt_kv_cache_new(int n_layer, int n_ctx, const int *n_head_kv, const int *hd_k,
                                   const int *hd_v, int type) {
    if (n_layer < 1 || n_ctx < 1 || (type != LLMRT_TYPE_F16 && type != LLMRT_TYPE_F32)) return NULL;
    for (int l = 0; l < n_layer; l++) {
        if (n_head_kv[l] < 1 || hd_k[l] < 1 || hd_v[l] < 1) return NULL;
    }
    llmrt_kv_cache *c = (llmrt_kv_cache *)calloc(1, sizeof(*c));
    if (c == NULL) return NULL;
    c->n_layer = n_layer;
    c->n_ctx = n_ctx;
    c->type = type;
    c->n_head_kv = (int *)malloc((size_t)n_layer * sizeof(int));
    c->hd_k = (int *)malloc((size_t)n_layer * sizeof(int));
    c->hd_v = (int *)malloc((size_t)n_layer * sizeof(int));
    c->k = (void **)calloc((size_t)n_layer, sizeof(void *));
    c->v = (void **)calloc((size_t)n_layer, sizeof(void *));
    c->pos = (int32_t *)calloc((size_t)n_ctx, sizeof(int32_t));
    if (!c->n_head_kv || !c->hd_k || !c->hd_v || !c->k || !c->v || !c->pos) {
        llmrt_kv_cache_free(c);
        return NULL;
    }
    for (int l = 0; l < n_layer; l++) {
        c->n_head_kv[l] = n_head_kv[l];
        c->hd_k[l] = hd_k[l];
        c->hd_v[l] = hd_v[l];
        /* zero-filled so that reading a cell never touches uninitialized memory */
        c->k[l] = calloc((size_t)n_ctx, llmrt_kv_cache_k_cell_bytes(c, l));
        c->v[l] = calloc((size_t)n_ctx, llmrt_kv_cache_v_cell_bytes(c, l));
        if (c->k[l] == NULL || c->v[l] == NULL) {
            llmrt_kv_cache_free(c);
            return NULL;
        }
    }
    return c;
}

void llmrt_kv_cache_clear(llmrt_kv_cache *c) {
    c->n_used = 0;
    c->n_pending = 0;
}

int llmrt_kv_cache_prepare(llmrt_kv_cache *c, int n) {
    if (n < 1 || n > c->n_ctx - c->n_used) return LLMRT_EINVAL;
    c->n_pending = n;
    return c->n_used;
}

int llmrt_kv_cache_truncate(llmrt_kv_cache *c, int n_used) {
    if (n_used < 0 || n_used > c->n_used) return LLMRT_EINVAL;
    c->n_used = n_used;
    c->n_pending = 0;
    return LLMRT_OK;
}
