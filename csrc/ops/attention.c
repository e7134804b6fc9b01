/*
 * attention.c — causal multi-head attention over the KV cache (GQA, sliding window, softcap).
 *
 * KV_STORE writes the run's n new keys and values (converted to the cache type) into cells
 * [kv_first, kv_first + n); the run has already written those cells' positions. ATTENTION then
 * computes, for each new token i at position p_i and each head h (one chunk per (i, h)):
 *
 *     s_c = scale * q_ih . K[c, h / (n_head / n_head_kv)]     for every cell c < kv_cells
 *           with pos[c] <= p_i and (n_swa == 0 or p_i - pos[c] < n_swa)
 *     s_c = softcap * tanh(s_c / softcap)                      if softcap != 0
 *     out = sum_c softmax(s)_c V[c, kv head]
 *
 * in llama.cpp's non-flash order and roundings (see llmrt_compute_attention), so at the AVX2
 * level the result is bit-identical to llama.cpp's AVX2 build run one token at a time. Cells are visited in index order and
 * masked by their stored positions only: a cell's index is never taken as its position (nor its
 * token order: after evictions, new tokens fill the holes; free cells have position INT32_MAX).
 *
 * Speed without changing a float operation: the kernel table's attn_qk (scores, vec_dot's order
 * inlined over a range of cells) and attn_pv (V read row by row, each output's fma chains kept
 * in vec_dot's lanes, see x86/attn_avx2.c), both over the query heads that share a KV head, so
 * each K / V vector is loaded and converted once for the group; only the cells between the first
 * and last visible one are scored, and the softmax and P.V only visit the 64-cell blocks around
 * them (the others hold masked or unused cells, whose exact zeros change no sum). Threads claim
 * (token, head group) chunks in a prefill, last token first, and (token, head) chunks in a
 * decode step, which is then shared over the heads. Each KV head's cells are one contiguous
 * array (kv_cache.h: head-major), so a chunk reads its K and V as streams.
 *
 * A prefill over an f16 cache (enough tokens for a few chunks per thread) takes attention_tiled
 * instead: chunks of several tokens and one KV head, P.V as many vec_dot_f16's over V transposed
 * (kt->attn_dots), each V vector converted once for several (token, head) rows; bit-identical to
 * the per-token path (tests/test_attention.py compares the two).
 */
#include <math.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h> /* SSE2: part of x86-64 itself, so no target pragma */
#endif

#include "ops/ops.h"

void llmrt_compute_kv_store(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *k = dst->src[0];
    const llmrt_tensor *v = dst->src[1];
    const int l = dst->op_params[0];
    const int64_t n = k->ne[2];
    const int64_t nk = k->ne[0] * k->ne[1]; /* floats per token */
    const int64_t nv = v->ne[0] * v->ne[1];
    for (int64_t i = llmrt_claim(p); i < n; i = llmrt_claim(p)) {
        const llmrt_run_seq *sq = llmrt_token_seq(p->ctx, i); /* the token's own sequence's cache */
        llmrt_kv_cache *cache = sq->cache;
        const int64_t cell = sq->kv_first + (i - sq->tok0);
        const int64_t nh = cache->n_head_kv[l], hk = nk / nh, hv = nv / nh; /* per head */
        const size_t es = cache->type == LLMRT_TYPE_F16 ? sizeof(llmrt_fp16_t) : sizeof(float);
        for (int64_t h = 0; h < nh; h++) { /* the cache is head-major (kv_cache.h) */
            const float *ks = (const float *)((const char *)k->data + i * k->nb[2]) + h * hk;
            const float *vs = (const float *)((const char *)v->data + i * v->nb[2]) + h * hv;
            char *kd = (char *)llmrt_kv_cache_k_head(cache, l, (int)h) + (size_t)cell * (size_t)hk * es;
            char *vd = (char *)llmrt_kv_cache_v_head(cache, l, (int)h) + (size_t)cell * (size_t)hv * es;
            if (cache->type == LLMRT_TYPE_F16) { /* round to nearest even (F16C where the level has it) */
                p->ctx->kt->quant_row[LLMRT_TYPE_F16](ks, kd, hk);
                p->ctx->kt->quant_row[LLMRT_TYPE_F16](vs, vd, hv);
            } else {
                memcpy(kd, ks, (size_t)hk * sizeof(float));
                memcpy(vd, vs, (size_t)hv * sizeof(float));
            }
        }
    }
}

/* llama.cpp computes attention over n_kv cells: the cells used so far (this ubatch's included)
 * padded to a multiple of 256 (llama_kv_cache's n_pad for the CPU); cells past the used ones are
 * masked. The padding decides which cells fall in the vector or the scalar part of ggml's
 * kernels, so it is reproduced here. */
#define KV_PAD 256

int64_t llmrt_attention_n_kv(int64_t cell) {
    const int64_t used = cell + 1;
    return (used + KV_PAD - 1) / KV_PAD * KV_PAD;
}

/* A chunk holds up to this many query heads (of one token, sharing one KV head). */
#define GMAX 8

/* Scratch layout (one thread), G = the heads of a chunk: q16 [G][hd_k] f16 or f32 | w [G][n_kv] f32
 * | p16 [G][n_kv] f16 or f32 | the kernels' scratch (LLMRT_ATTN_SCRATCH), which also holds one V
 * column [n_kv] (f16 or f32) on the column-by-column path. */
static size_t align64(size_t x) { return (x + 63) / 64 * 64; }

/* The tiled prefill path (attention_tiled): a chunk is up to RMAX rows, (token, query head) pairs
 * of TB = RMAX / group tokens (at least one token) and one KV head. Its scratch: qf [R][hd_k] f32
 * | q16 [R][hd_k] f16 | w [R][n_kv] f32 | pf [R][n_kv] f32 | p16 [n_kv] f16 | vt [hd_v][n_kv] f16
 * | yo [R][hd_v] f32 | vis [TB][n_kv] u8 | the attn_qk kernel's scratch, R <= max(RMAX, n_head). */
#define RMAX 32

static size_t tiled_wsize(int64_t n_head, int64_t hd_k, int64_t hd_v, int64_t n_kv) {
    const size_t R = (size_t)(n_head > RMAX ? n_head : RMAX);
    return align64(R * (size_t)hd_k * sizeof(float)) + align64(R * (size_t)hd_k * sizeof(llmrt_fp16_t)) +
           align64(R * (size_t)n_kv * sizeof(float)) * 2 + align64((size_t)n_kv * sizeof(llmrt_fp16_t)) +
           align64((size_t)hd_v * (size_t)n_kv * sizeof(llmrt_fp16_t)) + align64(R * (size_t)hd_v * sizeof(float)) +
           align64(RMAX * (size_t)n_kv) + align64(LLMRT_ATTN_SCRATCH(hd_k, R, n_kv));
}

static size_t wsize_for(int64_t n_head, int64_t hd_k, int64_t hd_v, int64_t n_kv) {
    const size_t G = (size_t)(n_head < GMAX ? n_head : GMAX);
    const int64_t hd = hd_k > hd_v ? hd_k : hd_v;
    const size_t w = align64(G * (size_t)hd_k * sizeof(float)) + align64(G * (size_t)n_kv * sizeof(float)) * 2 +
                     align64(LLMRT_ATTN_SCRATCH(hd, G, n_kv));
    const size_t wt = tiled_wsize(n_head, hd_k, hd_v, n_kv);
    return w > wt ? w : wt;
}

static int64_t hd_v_of(const llmrt_tensor *dst) { return dst->ne[0] / dst->src[0]->ne[1]; }

size_t llmrt_attention_wsize(const llmrt_tensor *dst) {
    /* grown at run time for larger caches */
    return wsize_for(dst->src[0]->ne[1], dst->src[0]->ne[0], hd_v_of(dst), KV_PAD);
}

size_t llmrt_attention_wsize_run(const llmrt_tensor *dst, int n_ctx) {
    return wsize_for(dst->src[0]->ne[1], dst->src[0]->ne[0], hd_v_of(dst),
                     llmrt_attention_n_kv(n_ctx > 0 ? n_ctx - 1 : 0));
}

/* Cells are visited in ranges aligned to this many cells, from cell 0: the softmax and the P.V
 * product then group the cells in the same vector blocks as over all n_kv cells (8 or 16 for
 * vec_soft_max, 32 for vec_dot), and the blocks left out hold only masked cells (exact zeros). */
#define KV_ALIGN 64

/* Whether a cell holding position pc is visible from a token at position p: causal, and within the
 * sliding window when n_swa > 0. */
static inline int visible(int32_t pc, int32_t p, int n_swa) {
    return pc <= p && !(n_swa > 0 && (int64_t)p - (int64_t)pc >= n_swa);
}

/* [*a, *b): the KV_ALIGN blocks of the n_kv cells that hold the cells lo..hi (hi >= lo >= 0). */
static void aligned_range(int64_t lo, int64_t hi, int64_t n_kv, int64_t *a, int64_t *b) {
    *a = lo / KV_ALIGN * KV_ALIGN;
    *b = (hi + KV_ALIGN) / KV_ALIGN * KV_ALIGN;
    if (*b > n_kv) *b = n_kv;
}

/* vis[cell] = whether the cell (< n_kv) is visible from position p_i (as visible(); 0 past
 * n_valid), branch-free; the first and last visible cell (*hi = -1 if none), and the cells
 * [*a, *b) the softmax and P.V visit: the KV_ALIGN blocks holding them (all n_kv if none). */
static void visible_mask(const int32_t *cpos, int64_t n_valid, int64_t n_kv, int32_t p_i, int n_swa, uint8_t *vis,
                         int64_t *lo, int64_t *hi, int64_t *a, int64_t *b) {
    const int no_swa = n_swa <= 0;
    for (int64_t cell = 0; cell < n_valid; cell++) { /* p_i - pc < n_swa, in uint32 (pc <= p_i) */
        const int32_t pc = cpos[cell];
        vis[cell] = (uint8_t)((pc <= p_i) & (no_swa | ((uint32_t)p_i - (uint32_t)pc < (uint32_t)n_swa)));
    }
    memset(vis + n_valid, 0, (size_t)(n_kv - n_valid));
    *lo = 0;
    while (*lo < n_valid && !vis[*lo]) ++*lo;
    *hi = n_valid - 1;
    while (*hi >= 0 && !vis[*hi]) --*hi;
    *a = 0, *b = n_kv;
    if (*hi >= 0) aligned_range(*lo, *hi, n_kv, a, b);
}

/* Prefetch (into L2) the n bytes at p. */
static void prefetch_l2(const char *p, size_t n) {
    for (size_t o = 0; o < n; o += 64) __builtin_prefetch(p + o, 0, 2); /* T1 on x86 */
}

/* ggml_vec_max_f32 of x[0 .. n) in 8 independent chains (a NaN is skipped, as the per-token path
 * does). The maximum's value does not depend on the order; only which of +0 and -0 is kept can,
 * and exp(s - max) is the same for both. */
static float max_f32(const float *x, int64_t n) {
    float m[8];
    int64_t i = 0;
#if defined(__x86_64__) /* _mm_max_ps(a, b) is a > b ? a : b, lane by lane: the chains below, 4 per vector */
    __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0;
    for (; i + 8 <= n; i += 8) {
        m0 = _mm_max_ps(_mm_loadu_ps(x + i), m0);
        m1 = _mm_max_ps(_mm_loadu_ps(x + i + 4), m1);
    }
    _mm_storeu_ps(m, m0);
    _mm_storeu_ps(m + 4, m1);
#else
    for (int k = 0; k < 8; k++) m[k] = -INFINITY;
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 8; k++) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    }
#endif
    for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    float max = m[0];
    for (int k = 1; k < 8; k++) max = m[k] > max ? m[k] : max;
    return max;
}

/* vt[d * ldt + cell] = V[cell][d] (row cell of V at vbase + cell * ldv) for the cells [c0, c1) and
 * d < hd_v; 0 for the cells from n_valid on (unused: their p is 0, but they may hold anything).
 * Blocks of 8 cells x 8 values go through an SSE2 8 x 8 transpose of 16-bit words (8 loads, 24
 * unpacks, 8 stores: the one-value-at-a-time loop stored to a new line of vt per value); pure data
 * movement, the same bits. */
static void transpose_v(llmrt_fp16_t *vt, int64_t ldt, const llmrt_fp16_t *vbase, int64_t ldv, int64_t hd_v,
                        int64_t c0, int64_t c1, int64_t n_valid) {
    int64_t cell = c0;
#if defined(__x86_64__)
    const int64_t hd8 = hd_v & ~(int64_t)7;
    for (; cell + 8 <= c1 && cell + 8 <= n_valid; cell += 8) {
        const llmrt_fp16_t *v = vbase + cell * ldv;
        for (int64_t d = 0; d < hd8; d += 8) {
            __m128i r[8], t[8], u[8];
            for (int i = 0; i < 8; i++) r[i] = _mm_loadu_si128((const __m128i *)(v + i * ldv + d));
            for (int i = 0; i < 8; i += 2) { /* t[i] / t[i + 1]: words 0..3 / 4..7 of cells i, i + 1 interleaved */
                t[i] = _mm_unpacklo_epi16(r[i], r[i + 1]);
                t[i + 1] = _mm_unpackhi_epi16(r[i], r[i + 1]);
            }
            for (int h = 0; h < 2; h++) { /* u[4h + k]: words 4h + 2(k / 2), + 1 of cells 0..3 (k even) / 4..7 */
                u[4 * h + 0] = _mm_unpacklo_epi32(t[h], t[h + 2]);
                u[4 * h + 1] = _mm_unpacklo_epi32(t[h + 4], t[h + 6]);
                u[4 * h + 2] = _mm_unpackhi_epi32(t[h], t[h + 2]);
                u[4 * h + 3] = _mm_unpackhi_epi32(t[h + 4], t[h + 6]);
            }
            for (int q = 0; q < 4; q++) { /* u[2q], u[2q + 1]: words 2q, 2q + 1 of cells 0..3, 4..7 */
                _mm_storeu_si128((__m128i *)(vt + (d + 2 * q) * ldt + cell), _mm_unpacklo_epi64(u[2 * q], u[2 * q + 1]));
                _mm_storeu_si128((__m128i *)(vt + (d + 2 * q + 1) * ldt + cell), _mm_unpackhi_epi64(u[2 * q], u[2 * q + 1]));
            }
        }
        for (int64_t d = hd8; d < hd_v; d++) {
            for (int i = 0; i < 8; i++) vt[d * ldt + cell + i] = v[i * ldv + d];
        }
    }
#endif
    for (; cell < c1; cell++) {
        llmrt_fp16_t *col = vt + cell;
        if (cell < n_valid) {
            const llmrt_fp16_t *row = vbase + cell * ldv;
            for (int64_t d = 0; d < hd_v; d++) col[d * ldt] = row[d];
        } else {
            for (int64_t d = 0; d < hd_v; d++) col[d * ldt] = 0;
        }
    }
}

/* A prefill over an f16 cache, tiled over tokens (kt->attn_dots): the same float operations as the
 * per-token path in llmrt_compute_attention, grouped differently. A chunk is TB consecutive tokens
 * and one KV head: its R = TB * group rows (token t, head j at row t * group + j) are
 *   scores: one attn_dots call, X = the K rows of the cells [LO, HI] (the union of the tokens'
 *           visible ranges; a token's cells outside its own range are scored, then masked),
 *           Y = the q rows (f16-rounded, in f32);
 *   softmax per row over its token's aligned range [a, b), as the per-token path;
 *   P.V:    one attn_dots call over the cells [A, B) (the union of the [a, b)), X = V transposed
 *           (vt[d][cell], V's f16 values), Y = the rows' probabilities (f16-rounded, in f32),
 *           zero outside their token's [a, b). Each output is vec_dot_f16(n_kv, V[:, d], p) of
 *           ggml: [A, B) starts on a KV_ALIGN boundary, so every cell keeps its lane, and the cells
 *           outside a row's [a, b) or past n_valid (vt zeroed there) add exact zeros.
 * vt is filled once per thread and KV head: chunks go KV head by KV head, last tokens first, so a
 * thread's later chunks need a range it mostly has (causal: the same or smaller). */
static void attention_tiled(const llmrt_compute_params *p, llmrt_tensor *dst, llmrt_attn_dots_fn dots,
                            llmrt_attn_qk_fn qk, int64_t TB, int64_t n_kv) {
    const llmrt_tensor *q = dst->src[0];
    const llmrt_kv_cache *cache = p->ctx->cache;
    const llmrt_kernel_table *kt = p->ctx->kt;
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
    const int64_t ldk = hd_k, ldv = hd_v; /* a head's cells are rows of its contiguous array */
    const int32_t *cpos = cache->pos;
    const llmrt_quant_row_fn to_f16 = kt->quant_row[LLMRT_TYPE_F16];  /* round to nearest even */
    const llmrt_dequant_row_fn to_f32 = kt->dequant_row[LLMRT_TYPE_F16]; /* exact */
    const int64_t n_valid = p->ctx->kv_cells;
    const int64_t n_tb = (n + TB - 1) / TB;
    const size_t RA = (size_t)(n_head > RMAX ? n_head : RMAX);

    char *ws = (char *)p->wdata;
    float *qf = (float *)ws;                                                           /* [R][hd_k] */
    llmrt_fp16_t *q16 = (llmrt_fp16_t *)((char *)qf + align64(RA * (size_t)hd_k * sizeof(float))); /* [R][hd_k] */
    float *w = (float *)((char *)q16 + align64(RA * (size_t)hd_k * sizeof(llmrt_fp16_t))); /* [R][n_kv] */
    float *pf = (float *)((char *)w + align64(RA * (size_t)n_kv * sizeof(float)));     /* [R][n_kv] */
    llmrt_fp16_t *p16 = (llmrt_fp16_t *)((char *)pf + align64(RA * (size_t)n_kv * sizeof(float))); /* [n_kv] */
    llmrt_fp16_t *vt = (llmrt_fp16_t *)((char *)p16 + align64((size_t)n_kv * sizeof(llmrt_fp16_t))); /* [hd_v][n_kv] */
    float *yo = (float *)((char *)vt + align64((size_t)hd_v * (size_t)n_kv * sizeof(llmrt_fp16_t))); /* [R][hd_v] */
    uint8_t *vis = (uint8_t *)yo + align64(RA * (size_t)hd_v * sizeof(float));         /* [TB][n_kv] */
    void *kscr = vis + align64(RMAX * (size_t)n_kv);

    int64_t vt_kh = -1, vt_lo = 0, vt_hi = 0; /* vt holds V^T of KV head vt_kh on cells [vt_lo, vt_hi) */
    int64_t lo[RMAX], hi[RMAX], a[RMAX], b[RMAX];
    for (int64_t c = llmrt_claim(p); c < n_head_kv * n_tb; c = llmrt_claim(p)) {
        const int64_t kh = c / n_tb;
        const int64_t i0 = (n_tb - 1 - c % n_tb) * TB;
        const int64_t nt = n - i0 < TB ? n - i0 : TB;
        const int64_t R = nt * group;
        const llmrt_fp16_t *kbase = (const llmrt_fp16_t *)llmrt_kv_cache_k_head(cache, l, (int)kh);
        const llmrt_fp16_t *vbase = (const llmrt_fp16_t *)llmrt_kv_cache_v_head(cache, l, (int)kh);

        /* each token's ranges, and their unions [LO, HI] (scores), [A, B) (softmax, P.V) */
        int64_t LO = n_valid, HI = -1, A = n_kv, B = 0;
        for (int64_t t = 0; t < nt; t++) {
            visible_mask(cpos, n_valid, n_kv, p->ctx->positions[i0 + t], n_swa, vis + t * n_kv, &lo[t], &hi[t], &a[t],
                         &b[t]);
            if (hi[t] >= 0) {
                LO = lo[t] < LO ? lo[t] : LO;
                HI = hi[t] > HI ? hi[t] : HI;
            }
            A = a[t] < A ? a[t] : A;
            B = b[t] > B ? b[t] : B;
        }
        /* q rows in f16 (ggml converts q to K's type), then in f32 (exact) */
        for (int64_t t = 0; t < nt; t++) {
            for (int64_t j = 0; j < group; j++) {
                const float *qv = (const float *)((const char *)q->data + (i0 + t) * q->nb[2] +
                                                  (kh * group + j) * q->nb[1]);
                to_f16(qv, q16 + (t * group + j) * hd_k, hd_k);
                if (qk == NULL) to_f32(q16 + (t * group + j) * hd_k, qf + (t * group + j) * hd_k, hd_k);
            }
        }
        if (qk != NULL) { /* token by token over its own range, the group's heads at once */
            for (int64_t t = 0; t < nt; t++) {
                if (hi[t] < 0) continue;
                qk((int)hd_k, (int)group, w + t * group * n_kv, n_kv, kbase, ldk, q16 + t * group * hd_k, hd_k,
                   (int)lo[t], (int)hi[t] + 1, kscr);
            }
        } else if (HI >= 0) {
            dots((int)hd_k, (int)(HI + 1 - LO), (int)R, w + LO, n_kv, kbase + LO * ldk, ldk, qf, hd_k);
        }

        /* per row: scale, softcap, -inf on masked and unused cells; softmax over [a, b); the
         * probabilities rounded to f16, in f32, zero on the rest of [A, B) */
        for (int64_t r = 0; r < R; r++) {
            const int64_t t = r / group;
            const int64_t at = a[t], bt = b[t]; /* (locals: the build has -fno-strict-aliasing) */
            const uint8_t *vis_t = vis + t * n_kv;
            float *wj = w + r * n_kv;
            float *pj = pf + r * n_kv;
            if (softcap == 0.0f) {
                for (int64_t cell = at; cell < bt; cell++) { /* (cells not scored are not visible) */
                    const float sc = wj[cell] * scale;
                    uint32_t u; /* vis ? sc : -inf, as bits (vectorizes) */
                    memcpy(&u, &sc, sizeof(u));
                    const uint32_t m = 0u - (uint32_t)vis_t[cell];
                    u = (u & m) | (0xff800000u & ~m);
                    memcpy(&wj[cell], &u, sizeof(u));
                }
            } else {
                for (int64_t cell = at; cell < bt; cell++) {
                    wj[cell] = vis_t[cell] ? softcap * tanhf(wj[cell] * scale / softcap) : -INFINITY;
                }
            }
            const float max = max_f32(wj + at, bt - at);
            const double sum = kt->vec_soft_max((int)(bt - at), wj + at, wj + at, max);
            const float inv = (float)(1.0 / sum);
            for (int64_t cell = at; cell < bt; cell++) wj[cell] *= inv;
            to_f16(wj + at, p16, bt - at);
            to_f32(p16, pj + at, bt - at);
            for (int64_t cell = A; cell < at; cell++) pj[cell] = 0.0f;
            for (int64_t cell = bt; cell < B; cell++) pj[cell] = 0.0f;
        }

        /* vt on [A, B): keep what it holds when the ranges touch, transpose the rest */
        if (vt_kh != kh || B < vt_lo || A > vt_hi) vt_kh = kh, vt_lo = vt_hi = A;
        transpose_v(vt, n_kv, vbase, ldv, hd_v, A, vt_lo, n_valid);
        transpose_v(vt, n_kv, vbase, ldv, hd_v, vt_hi, B, n_valid);
        vt_lo = A < vt_lo ? A : vt_lo;
        vt_hi = B > vt_hi ? B : vt_hi;

        dots((int)(B - A), (int)hd_v, (int)R, yo, hd_v, vt + A, n_kv, pf + A, n_kv);
        for (int64_t t = 0; t < nt; t++) {
            float *y = (float *)((char *)dst->data + (i0 + t) * dst->nb[1]) + kh * group * hd_v;
            memcpy(y, yo + t * group * hd_v, (size_t)(group * hd_v) * sizeof(float));
        }
    }
}

/* One (token, head): llama.cpp's non-flash path (llama-graph build_attn_mha with
 * ggml_mul_mat + ggml_soft_max_ext + ggml_mul_mat over the f16 cache, V stored transposed):
 *   s_c = vec_dot_f16(K[c], f16(q))  (ggml converts q to K's type for the product)
 *   w_c = s_c * scale  (then softcap if set), -inf where masked
 *   e_c = exp(w_c - max) with ggml_vec_soft_max_f32, sum in double
 *   p_c = f16(e_c * (float)(1 / sum))  (kq converted to f16 for the product with V)
 *   y_d = vec_dot_f16(V[:, d], p)      over the n_kv cells, masked ones contributing 0
 * An f32 cache uses the f32 kernels and f32 q / p.
 *
 * A chunk is one token and G query heads that share a KV head (all of the group's, at most GMAX,
 * when there are enough chunks to share out; one head each in a decode step, which then still
 * spreads over the threads): the kernels score them and multiply P.V with each K / V row loaded
 * once. Chunks are claimed last token first: in a causal prefill the later tokens see more cells,
 * so the long chunks go first and the short ones fill in at the end. */
void llmrt_compute_attention(const llmrt_compute_params *p, llmrt_tensor *dst) {
    const llmrt_tensor *q = dst->src[0];
    const llmrt_kv_cache *cache = p->ctx->cache;
    const llmrt_kernel_table *kt = p->ctx->kt;
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
    const int is_f16 = cache->type == LLMRT_TYPE_F16;
    const int T = is_f16 ? LLMRT_TYPE_F16 : LLMRT_TYPE_F32;
    /* the dot the level's attention kernels reproduce (a higher level that widens vec_dot[T]
     * without attention kernels of its own keeps the lower level's pair: levels stack) */
    const llmrt_vec_dot_fn dot = kt->attn_pv_dot[T] != NULL ? kt->attn_pv_dot[T] : kt->vec_dot[T];
    const size_t esize = is_f16 ? sizeof(llmrt_fp16_t) : sizeof(float);
    const size_t kcell = (size_t)hd_k * esize; /* bytes from a cell to the next in one KV head */
    const size_t vcell = (size_t)hd_v * esize;
    const llmrt_quant_row_fn to_f16 = kt->quant_row[LLMRT_TYPE_F16]; /* round to nearest even */
    /* row-by-row P.V (same operations as the column dots) when this level has it for `dot` */
    const llmrt_attn_pv_fn pv = kt->attn_pv[T] != NULL && kt->attn_pv_dot[T] == dot && hd_v % 8 == 0
                                    ? kt->attn_pv[T] : NULL;
    const llmrt_attn_qk_fn qk = kt->attn_qk[T] != NULL && kt->attn_qk_dot[T] == dot ? kt->attn_qk[T] : NULL;
    /* the cache of the token's sequence (all the run's caches have the same shapes and type):
     * every live cell and this run's are below n_valid; n_kv as llama.cpp for this ubatch */
    const llmrt_kv_cache *seq_cache = cache;
    const int32_t *cpos = cache->pos;
    int64_t n_valid = p->ctx->kv_cells;
    int64_t n_kv = llmrt_attention_n_kv(n_valid - 1);

    /* a one-sequence prefill over an f16 cache: tiled over tokens when that leaves a few chunks
     * per thread and a chunk has at least 8 rows (transposing V costs about as much as 8 rows of
     * P.V) */
    if (p->ctx->n_seq == 1 && is_f16 && pv != NULL && kt->attn_dots[T] != NULL && kt->attn_dots_dot[T] == dot) {
        const int64_t TB = group < RMAX ? RMAX / group : 1;
        if ((n + TB - 1) / TB * n_head_kv >= 4 * (int64_t)p->nth && (n < TB ? n : TB) * group >= 8) {
            attention_tiled(p, dst, kt->attn_dots[T], qk, TB, n_kv);
            return;
        }
    }

    /* heads per chunk: the whole group (up to GMAX: each K / V vector loaded and converted once
     * for all of them) when that leaves every thread a chunk; else one head per chunk. A decode
     * step's chunk costs about as much per shared K / V conversion as per head (SmolLM2's 3 KV
     * heads of 3 on 2 threads: 2 chunks of 3 heads on one thread beat 5 of one head;
     * benchmarks/README.md, "One-token attention: the whole GQA group per chunk") */
    int64_t G = group < GMAX ? group : GMAX;
    if (n * n_head_kv < (int64_t)p->nth) G = 1;
    const int64_t n_sub = (group + G - 1) / G; /* chunks per (token, KV head) */
    const int64_t per_tok = n_head_kv * n_sub;

    char *ws = (char *)p->wdata;
    void *qc = ws;                                                           /* [G][hd_k] */
    float *w = (float *)(ws + align64((size_t)G * (size_t)hd_k * sizeof(float))); /* [G][n_kv] */
    void *pc = (char *)w + align64((size_t)G * (size_t)n_kv * sizeof(float));    /* [G][n_kv] */
    void *kscr = (char *)pc + align64((size_t)G * (size_t)n_kv * sizeof(float)); /* see wsize_for */

    int64_t last_i = -1, lo = 0, hi = -1; /* token whose visible range lo..hi is known */
    for (int64_t c = llmrt_claim(p); c < n * per_tok; c = llmrt_claim(p)) {
        const int64_t i = n - 1 - c / per_tok;
        if (p->ctx->n_seq > 1) { /* several sequences: token i reads its own one's cache */
            const llmrt_run_seq *sq = llmrt_token_seq(p->ctx, i);
            if (sq->cache != seq_cache) {
                seq_cache = sq->cache;
                cpos = seq_cache->pos;
                n_valid = sq->kv_cells;
                n_kv = llmrt_attention_n_kv(n_valid - 1); /* the scratch fits the largest cache's */
                w = (float *)(ws + align64((size_t)G * (size_t)hd_k * sizeof(float)));
                pc = (char *)w + align64((size_t)G * (size_t)n_kv * sizeof(float));
                kscr = (char *)pc + align64((size_t)G * (size_t)n_kv * sizeof(float));
                last_i = -1;
            }
        }
        const int64_t kh = c % per_tok / n_sub;
        const int64_t h0 = kh * group + c % n_sub * G;              /* first head of the chunk */
        const int64_t nh = kh * group + group - h0 < G ? kh * group + group - h0 : G;
        const int32_t p_i = p->ctx->positions[i];

        for (int64_t j = 0; j < nh; j++) {
            const float *qv = (const float *)((const char *)q->data + i * q->nb[2] + (h0 + j) * q->nb[1]);
            if (is_f16) {
                to_f16(qv, (llmrt_fp16_t *)qc + j * hd_k, hd_k); /* ggml converts q to K's type */
            } else {
                memcpy((float *)qc + j * hd_k, qv, (size_t)hd_k * sizeof(float));
            }
        }
        const char *kbase = (const char *)llmrt_kv_cache_k_head(seq_cache, l, (int)kh);
        const char *vbase = (const char *)llmrt_kv_cache_v_head(seq_cache, l, (int)kh);

        /* lo..hi: the first and last unmasked cell (causal by stored position, sliding window);
         * the same for every head of token i */
        if (i != last_i) {
            lo = n_valid, hi = -1;
            for (int64_t cell = 0; cell < n_valid; cell++) {
                if (visible(cpos[cell], p_i, n_swa)) {
                    if (cell < lo) lo = cell;
                    hi = cell;
                }
            }
            last_i = i;
        }
        /* the cells [a, b) the softmax and P.V visit: all n_kv (ggml's range) on the
         * column-by-column path; else the aligned blocks holding unmasked cells, which gives the
         * same sums (the blocks left out add exact zeros) */
        int64_t a = 0, b = n_kv;
        if (pv != NULL && hi >= 0) aligned_range(lo, hi, n_kv, &a, &b);
        /* V's rows of [lo, hi] asked into L2 before the scores, once per (sequence, KV head): the
         * first chunk of a head to run is its sequence's last token (tokens go last to first),
         * and a decode step's cache comes from memory (the weights went through the caches
         * since the last layer read it). P.V walks V's cells 32 apart, a pattern the hardware
         * prefetchers do not follow (benchmarks/README.md, "Decode attention: a head-major
         * cache, V asked for before the scores") */
        if (pv != NULL && hi >= 0) {
            const llmrt_run_seq *sq = llmrt_token_seq(p->ctx, i);
            if (i == sq->tok0 + sq->n - 1) prefetch_l2(vbase + (size_t)lo * vcell, (size_t)(hi + 1 - lo) * vcell);
        }
        /* scores: K.q on [lo, hi] (masked cells inside are computed, then overwritten) */
        if (hi >= 0) {
            if (qk != NULL) {
                qk((int)hd_k, (int)nh, w, n_kv, kbase, (int64_t)(kcell / esize), qc, hd_k, (int)lo, (int)hi + 1,
                   kscr);
            } else {
                for (int64_t j = 0; j < nh; j++) {
                    const char *qj = (const char *)qc + (size_t)(j * hd_k) * esize;
                    for (int64_t cell = lo; cell <= hi; cell++) {
                        dot((int)hd_k, &w[j * n_kv + cell], kbase + (size_t)cell * kcell, qj);
                    }
                }
            }
        }
        /* per head: scale, softcap, -inf on masked and unused cells; softmax; the probabilities
         * in the V product's type */
        for (int64_t j = 0; j < nh; j++) {
            float *wj = w + j * n_kv;
            float max = -INFINITY;
            for (int64_t cell = a; cell < b; cell++) {
                float s = -INFINITY;
                if (cell >= lo && cell <= hi && visible(cpos[cell], p_i, n_swa)) {
                    s = wj[cell] * scale;
                    if (softcap != 0.0f) s = softcap * tanhf(s / softcap);
                }
                wj[cell] = s;
                max = s > max ? s : max; /* ggml_vec_max_f32 */
            }
            const double sum = kt->vec_soft_max((int)(b - a), wj + a, wj + a, max);
            const float inv = (float)(1.0 / sum);
            if (is_f16) {
                for (int64_t cell = a; cell < b; cell++) wj[cell] *= inv;
                to_f16(wj + a, (llmrt_fp16_t *)pc + j * n_kv + a, b - a);
            } else {
                float *pf = (float *)pc + j * n_kv;
                for (int64_t cell = a; cell < b; cell++) pf[cell] = wj[cell] * inv;
            }
        }
        /* out[d] = V[:, d] . p over the n_kv cells; masked cells read as 0 */
        float *y = (float *)((char *)dst->data + i * dst->nb[1]) + h0 * hd_v;
        if (pv != NULL) {
            /* V is read only in used cells (n_kv may pass n_ctx; unused cells have p = 0 unless
             * the scores are NaN, and then the output is NaN either way) */
            pv((int)hd_v, (int)nh, y, hd_v, vbase, (int64_t)(vcell / esize), pc, n_kv, (int)a,
               (int)(b < n_valid ? b : n_valid), kscr);
            continue;
        }
        for (int64_t j = 0; j < nh; j++) {
            const float *wj = w + j * n_kv;
            const char *pj = (const char *)pc + (size_t)(j * n_kv) * esize;
            for (int64_t d = 0; d < hd_v; d++) {
                if (is_f16) {
                    llmrt_fp16_t *vc = (llmrt_fp16_t *)kscr;
                    for (int64_t cell = 0; cell < n_kv; cell++) {
                        llmrt_fp16_t v = 0;
                        if (cell < n_valid && wj[cell] != 0.0f) {
                            memcpy(&v, vbase + (size_t)cell * vcell + (size_t)d * esize, sizeof(v));
                        }
                        vc[cell] = v;
                    }
                } else {
                    float *vc = (float *)kscr;
                    for (int64_t cell = 0; cell < n_kv; cell++) {
                        float v = 0.0f;
                        if (cell < n_valid && wj[cell] != 0.0f) {
                            memcpy(&v, vbase + (size_t)cell * vcell + (size_t)d * esize, sizeof(v));
                        }
                        vc[cell] = v;
                    }
                }
                dot((int)n_kv, &y[j * hd_v + d], kscr, pj);
            }
        }
    }
}
