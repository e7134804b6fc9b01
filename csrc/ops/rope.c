/*
 * rope.c — rotary position embedding with ggml_rope_ext's exact semantics.
 *
 * For a head vector x of hd dims and a position p, pair i (i < n_rot / 2) is rotated by
 *     theta_i = p * freq_base^(-2i / n_rot) / freq_factors[i]
 * NORMAL mode rotates (x[2i], x[2i+1]); NEOX mode rotates (x[i], x[i + n_rot/2]); dims >= n_rot
 * pass through. YaRN (ext_factor != 0) blends the interpolated angle freq_scale * theta with
 * the extrapolated one by a ramp over the correction dims and scales the magnitude by
 * 1 + 0.1 ln(1 / freq_scale); attn_factor scales cos and sin. theta_i is built by repeated
 * multiplication in float, as ggml does, so angles match it to the last bit; the rotation uses
 * the fused multiply-adds of ggml's FMA build when the ISA level has FMA (see llmrt_rope_apply).
 */
#pragma GCC optimize("fp-contract=off") /* every fused op is written out (fmaf) */
#include <math.h>
#include <string.h>

#include "ops/ops.h"

static float corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

void llmrt_rope_yarn_corr_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast,
                               float beta_slow, float dims[2]) {
    const float start = floorf(corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base));
    const float end = ceilf(corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base));
    dims[0] = start > 0.0f ? start : 0.0f;
    dims[1] = end < (float)(n_dims - 1) ? end : (float)(n_dims - 1);
}

static float yarn_ramp(float low, float high, int64_t i0) {
    const float y = (float)(i0 / 2) - low;
    const float d = high - low > 0.001f ? high - low : 0.001f;
    const float r = y / d;
    return 1.0f - (r < 0.0f ? 0.0f : (r > 1.0f ? 1.0f : r));
}

void llmrt_rope_cache_init(float pos, const llmrt_rope_params *rp, const float *freq_factors,
                           const float corr_dims[2], float sin_sign, float *cache) {
    const float theta_scale = powf(rp->freq_base, -2.0f / (float)rp->n_rot);
    float theta = pos;
    for (int64_t i0 = 0; i0 < rp->n_rot; i0 += 2) {
        const float ff = freq_factors ? freq_factors[i0 / 2] : 1.0f;
        const float theta_extrap = theta / ff;
        const float theta_interp = rp->freq_scale * theta_extrap;
        float th = theta_interp;
        float mscale = rp->attn_factor;
        if (rp->ext_factor != 0.0f) {
            const float ramp_mix = yarn_ramp(corr_dims[0], corr_dims[1], i0) * rp->ext_factor;
            th = theta_interp * (1.0f - ramp_mix) + theta_extrap * ramp_mix;
            mscale *= 1.0f + 0.1f * logf(1.0f / rp->freq_scale);
        }
        cache[i0 + 0] = cosf(th) * mscale;
        cache[i0 + 1] = sinf(th) * mscale * sin_sign;
        theta *= theta_scale;
    }
}

/* The rotation, with the roundings of ggml's CPU build on an FMA machine: GCC contracts
 * x0*c - x1*s and x0*s + x1*c into one fused op each (checked bit for bit against llama.cpp's
 * rope output, both modes):  y0 = fma(x0, c, -(x1*s)),  y1 = fma(x0, s, x1*c).
 * Without FMA (generic level): plain f32 products and sums, as ggml's scalar build. */
static int rope_fused(void) {
    return llmrt_isa_current() >= LLMRT_ISA_AVX2;
}

static inline __attribute__((always_inline)) void rotate(float x0, float x1, float c, float s, int fused,
                                                        float *y0, float *y1) {
    const float x1s = x1 * s, x1c = x1 * c;
    if (fused) {
        *y0 = fmaf(x0, c, -x1s);
        *y1 = fmaf(x0, s, x1c);
    } else {
        const float x0c = x0 * c, x0s = x0 * s;
        *y0 = x0c - x1s;
        *y1 = x0s + x1c;
    }
}

/* The rotated pairs of one head (mode: NeoX pairs (i, i + n_rot/2), else (2i, 2i + 1)). */
static inline __attribute__((always_inline)) void rope_pairs(const float *cache, int n_rot, int mode, int fused,
                                                            const float *x, float *y) {
    if (mode == LLMRT_ROPE_NEOX) {
        const int half = n_rot / 2;
        for (int i = 0; i < half; i++) {
            rotate(x[i], x[i + half], cache[2 * i], cache[2 * i + 1], fused, &y[i], &y[i + half]);
        }
    } else {
        for (int i = 0; i < n_rot; i += 2) {
            rotate(x[i], x[i + 1], cache[i], cache[i + 1], fused, &y[i], &y[i + 1]);
        }
    }
}

#if defined(__x86_64__)
/* The fused rotation compiled for FMA (the levels that use it have FMA), so fmaf is one vfmadd
 * instead of a libm call; the same roundings. */
__attribute__((target("fma"))) static void rope_pairs_fma(const float *cache, int n_rot, int mode,
                                                          const float *x, float *y) {
    rope_pairs(cache, n_rot, mode, 1, x, y);
}
#endif

void llmrt_rope_apply(const float *cache, int n_rot, int mode, int hd, const float *x, float *y) {
    const int fused = rope_fused();
#if defined(__x86_64__)
    if (fused) {
        rope_pairs_fma(cache, n_rot, mode, x, y);
    } else {
        rope_pairs(cache, n_rot, mode, 0, x, y);
    }
#else
    rope_pairs(cache, n_rot, mode, fused, x, y);
#endif
    if (y != x) {
        for (int i = n_rot; i < hd; i++) y[i] = x[i];
    }
}

void llmrt_rope_params_from_node(const llmrt_tensor *t, llmrt_rope_params *rp) {
    rp->n_rot = t->op_params[0];
    rp->mode = t->op_params[1];
    rp->n_ctx_orig = t->op_params[2];
    rp->freq_base = llmrt_get_op_param_f32(t, 3);
    rp->freq_scale = llmrt_get_op_param_f32(t, 4);
    rp->ext_factor = llmrt_get_op_param_f32(t, 5);
    rp->attn_factor = llmrt_get_op_param_f32(t, 6);
    rp->beta_fast = llmrt_get_op_param_f32(t, 7);
    rp->beta_slow = llmrt_get_op_param_f32(t, 8);
}

size_t llmrt_rope_wsize(const llmrt_tensor *dst) {
    return (size_t)dst->op_params[0] * sizeof(float); /* one cos/sin cache of n_rot floats */
}

void llmrt_compute_rope(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *src = dst->src[0];
    const int32_t *pos = (const int32_t *)dst->src[1]->data;
    const float *ff = dst->src[2] ? (const float *)dst->src[2]->data : NULL;
    llmrt_rope_params rp;
    llmrt_rope_params_from_node(dst, &rp);
    float corr_dims[2];
    llmrt_rope_yarn_corr_dims(rp.n_rot, rp.n_ctx_orig, rp.freq_base, rp.beta_fast, rp.beta_slow,
                              corr_dims);
    const int hd = (int)dst->ne[0];
    const int64_t n_head = dst->ne[1];
    const int64_t n = dst->ne[2];
    float *cache = (float *)p->wdata;
    /* Chunks are whole tokens (one cos/sin cache each) unless there are too few tokens to keep
     * every thread busy; then (token, head) pairs. Both compute the same values. With a shared
     * table (graph.c plan_run), the token's cache is its row there: written by this node (mode
     * 1, token chunks: one writer per row) or by an earlier one (mode 2). */
    const int tab_mode = dst->rope_tab != NULL ? dst->rope_tab_mode : 0;
    const int per_head = tab_mode == 0 && n < 2 * (int64_t)p->nth;
    const float *c_tok = cache;
    const int64_t n_chunks = per_head ? n * n_head : n;
    int64_t cached_token = -1;
    for (int64_t c = llmrt_claim(p); c < n_chunks; c = llmrt_claim(p)) {
        const int64_t i = per_head ? c / n_head : c;
        const int64_t h0 = per_head ? c % n_head : 0;
        const int64_t h1 = per_head ? h0 + 1 : n_head;
        if (i != cached_token) {
            if (tab_mode == 0) {
                llmrt_rope_cache_init((float)pos[i], &rp, ff, corr_dims, 1.0f, cache);
            } else {
                float *row = dst->rope_tab + i * rp.n_rot;
                if (tab_mode == 1) llmrt_rope_cache_init((float)pos[i], &rp, ff, corr_dims, 1.0f, row);
                c_tok = row;
            }
            cached_token = i;
        }
        for (int64_t h = h0; h < h1; h++) {
            const float *x = (const float *)((const char *)src->data + i * src->nb[2] + h * src->nb[1]);
            float *y = (float *)((char *)dst->data + i * dst->nb[2] + h * dst->nb[1]);
            llmrt_rope_apply(c_tok, rp.n_rot, rp.mode, hd, x, y);
        }
    }
}
