/*
 * attention.c — causal multi-head attention over the KV cache (GQA, sliding window, softcap).
 *
 * KV_STORE writes the run's n new keys and values (converted to the cache type) into cells
 * [kv_first, kv_first + n); the run has already written those cells' positions. ATTENTION then
 * computes, for each new token i at position p_i and each head h (one chunk per (i, h)):
 *
 *     s_c = scale * q_ih . K[c, h / (n_head / n_head_kv)]     for every cell c < kv_first + n
 *           with pos[c] <= p_i and (n_swa == 0 or p_i - pos[c] < n_swa)
 *     s_c = softcap * tanh(s_c / softcap)                      if softcap != 0
 *     out = sum_c softmax(s)_c V[c, kv head]
 *
 * with an online softmax (running max m, denominator l, accumulator of hd_v floats in the
 * thread's scratch), so nothing grows with the context. Cells are visited in index order and
 * masked by their stored positions only: a cell's index is never taken as its position.
 */
#include <math.h>
#include <string.h>

#include "ops/ops.h"

void llmrt_compute_kv_store(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *k = dst->src[0];
    const llmrt_tensor *v = dst->src[1];
    llmrt_kv_cache *cache = p->ctx->cache;
    const int l = dst->op_params[0];
    const int64_t n = k->ne[2];
    const int64_t nk = k->ne[0] * k->ne[1]; /* floats per token */
    const int64_t nv = v->ne[0] * v->ne[1];
    const size_t kcell = llmrt_kv_cache_k_cell_bytes(cache, l);
    const size_t vcell = llmrt_kv_cache_v_cell_bytes(cache, l);
    for (int64_t i = llmrt_claim(p); i < n; i = llmrt_claim(p)) {
        const int64_t cell = p->ctx->kv_first + i;
        const float *ks = (const float *)((const char *)k->data + i * k->nb[2]);
        const float *vs = (const float *)((const char *)v->data + i * v->nb[2]);
        char *kd = (char *)cache->k[l] + (size_t)cell * kcell;
        char *vd = (char *)cache->v[l] + (size_t)cell * vcell;
        if (cache->type == LLMRT_TYPE_F16) {
            llmrt_fp16_t *kh = (llmrt_fp16_t *)kd, *vh = (llmrt_fp16_t *)vd;
            for (int64_t e = 0; e < nk; e++) kh[e] = llmrt_fp32_to_fp16(ks[e]);
            for (int64_t e = 0; e < nv; e++) vh[e] = llmrt_fp32_to_fp16(vs[e]);
        } else {
            memcpy(kd, ks, (size_t)nk * sizeof(float));
            memcpy(vd, vs, (size_t)nv * sizeof(float));
        }
    }
}

size_t llmrt_attention_wsize(const llmrt_tensor *dst) {
    const llmrt_tensor *v = dst->src[1]->src[1]; /* KV_STORE's v */
    return (size_t)v->ne[0] * sizeof(float);     /* the accumulator */
}

static inline float dot_f32_f16(const float *q, const llmrt_fp16_t *k, int64_t n) {
    float s = 0.0f;
    for (int64_t e = 0; e < n; e++) s += q[e] * llmrt_f16_lookup(k[e]);
    return s;
}

static inline float dot_f32_f32(const float *q, const float *k, int64_t n) {
    float s = 0.0f;
    for (int64_t e = 0; e < n; e++) s += q[e] * k[e];
    return s;
}

void llmrt_compute_attention(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *q = dst->src[0];
    const llmrt_tensor *store = dst->src[1];
    const llmrt_kv_cache *cache = p->ctx->cache;
    const int l = dst->op_params[0];
    const float scale = llmrt_get_op_param_f32(dst, 1);
    const int n_swa = dst->op_params[2];
    const float softcap = llmrt_get_op_param_f32(dst, 3);

    const int64_t hd_k = q->ne[0];
    const int64_t n_head = q->ne[1];
    const int64_t n = q->ne[2];
    const int64_t n_head_kv = cache->n_head_kv[l];
    const int64_t hd_v = cache->hd_v[l];
    const int64_t group = n_head / n_head_kv;
    const int64_t n_cells = (int64_t)p->ctx->kv_first + n;
    const int is_f16 = cache->type == LLMRT_TYPE_F16;
    const size_t esize = is_f16 ? sizeof(llmrt_fp16_t) : sizeof(float);
    const size_t kcell = llmrt_kv_cache_k_cell_bytes(cache, l);
    const size_t vcell = llmrt_kv_cache_v_cell_bytes(cache, l);
    const int32_t *cpos = cache->pos;
    float *acc = (float *)p->wdata;
    (void)store;

    for (int64_t c = llmrt_claim(p); c < n * n_head; c = llmrt_claim(p)) {
        const int64_t i = c / n_head;
        const int64_t h = c % n_head;
        const int64_t kh = h / group;
        const int32_t p_i = p->ctx->positions[i];
        const float *qv = (const float *)((const char *)q->data + i * q->nb[2] + h * q->nb[1]);
        const char *kbase = (const char *)cache->k[l] + (size_t)kh * (size_t)hd_k * esize;
        const char *vbase = (const char *)cache->v[l] + (size_t)kh * (size_t)hd_v * esize;

        float m = -INFINITY, sum = 0.0f;
        for (int64_t e = 0; e < hd_v; e++) acc[e] = 0.0f;
        for (int64_t cell = 0; cell < n_cells; cell++) {
            const int32_t pc = cpos[cell];
            if (pc > p_i) continue;
            if (n_swa > 0 && (int64_t)p_i - (int64_t)pc >= n_swa) continue;
            const char *kc = kbase + (size_t)cell * kcell;
            float s = is_f16 ? dot_f32_f16(qv, (const llmrt_fp16_t *)kc, hd_k)
                             : dot_f32_f32(qv, (const float *)kc, hd_k);
            s *= scale;
            if (softcap != 0.0f) s = softcap * tanhf(s / softcap);
            float w;
            if (s > m) {
                const float corr = expf(m - s); /* 0 on the first cell (m = -inf) */
                for (int64_t e = 0; e < hd_v; e++) acc[e] *= corr;
                sum *= corr;
                m = s;
                w = 1.0f;
            } else {
                w = expf(s - m);
            }
            sum += w;
            const char *vc = vbase + (size_t)cell * vcell;
            if (is_f16) {
                const llmrt_fp16_t *vh = (const llmrt_fp16_t *)vc;
                for (int64_t e = 0; e < hd_v; e++) acc[e] += w * llmrt_f16_lookup(vh[e]);
            } else {
                const float *vf = (const float *)vc;
                for (int64_t e = 0; e < hd_v; e++) acc[e] += w * vf[e];
            }
        }
        float *y = (float *)((char *)dst->data + i * dst->nb[1]) + h * hd_v;
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int64_t e = 0; e < hd_v; e++) y[e] = acc[e] * inv;
    }
}
