/*
 * rope_shift.c — KV_STORE_PRE: pre-RoPE keys into the streaming cache's master copy (see
 * rope_shift.h). The shift itself (llmrt_kv_cache_rerope) lives in kv_cache.c and uses rope.c's
 * helpers, so a re-roped key is computed exactly as the graph's rope node computes it.
 */
#include "ops/rope_shift.h"

#include <string.h>

/* Chunks: one per token (copy its n_head_kv rows), plus chunk n: register the rope params. */
void llmrt_compute_kv_store_pre(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *x = dst->src[0];
    const llmrt_tensor *rope = dst->src[1];
    const llmrt_tensor *ff = dst->src[2];
    const int l = dst->op_params[0];
    if (p->ctx->cache == NULL) return;
    const int64_t hd = x->ne[0], nkv = x->ne[1], n = x->ne[2];
    const size_t cell_floats = (size_t)hd * (size_t)nkv;
    for (int64_t c = llmrt_claim(p); c <= n; c = llmrt_claim(p)) {
        if (c == n) { /* every streaming cache of the run learns the layer's key RoPE */
            llmrt_rope_params rp;
            llmrt_rope_params_from_node(rope, &rp);
            for (int s = 0; s < p->ctx->n_seq; s++) {
                llmrt_kv_cache *cache = p->ctx->seqs[s].cache;
                if (cache->k_pre != NULL) {
                    llmrt_kv_cache_set_rope(cache, l, &rp, ff != NULL ? (const float *)ff->data : NULL);
                }
            }
            continue;
        }
        const llmrt_run_seq *sq = llmrt_token_seq(p->ctx, c);
        if (sq->cache->k_pre == NULL) continue;    /* a cache without shift keeps no master keys */
        const int64_t cell = sq->kv_first + (c - sq->tok0);
        float *d = sq->cache->k_pre[l] + (size_t)cell * cell_floats;
        for (int64_t h = 0; h < nkv; h++) {
            const char *s = (const char *)x->data + c * x->nb[2] + h * x->nb[1];
            memcpy(d + (size_t)h * (size_t)hd, s, (size_t)hd * sizeof(float));
        }
    }
}
