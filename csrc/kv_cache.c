/*
 * kv_cache.c — the KV cache: allocation, bookkeeping (n_used, n_pending, which cell holds which
 * token) and the streaming operations (see kv_cache.h): eviction after the n_keep sinks (the
 * evicted cells become holes the next tokens fill; no cell moves), and shift-RoPE, which turns the
 * sinks forward instead of the window back (the same relative positions) and recomputes each
 * turned key from its exact pre-RoPE master copy, so shifts never accumulate error and cost
 * O(n_keep) key rotations, not O(n_ctx).
 * Attention and the graph run read and write the cells; the rotation arithmetic is rope.c's
 * (llmrt_rope_cache_init / llmrt_rope_apply), exactly what the graph's rope node computes.
 */
#include "llmrt/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "llmrt/llmrt.h"
#include "ops/ops.h"

static size_t elem_size(const llmrt_kv_cache *c) {
    return c->type == LLMRT_TYPE_F16 ? sizeof(llmrt_fp16_t) : sizeof(float);
}

size_t llmrt_kv_cache_k_cell_bytes(const llmrt_kv_cache *c, int l) {
    return (size_t)c->n_head_kv[l] * (size_t)c->hd_k[l] * elem_size(c);
}

size_t llmrt_kv_cache_v_cell_bytes(const llmrt_kv_cache *c, int l) {
    return (size_t)c->n_head_kv[l] * (size_t)c->hd_v[l] * elem_size(c);
}

void *llmrt_kv_cache_k_head(const llmrt_kv_cache *c, int l, int kh) {
    return (char *)c->k[l] + (size_t)kh * (size_t)c->n_ctx * (size_t)c->hd_k[l] * elem_size(c);
}

void *llmrt_kv_cache_v_head(const llmrt_kv_cache *c, int l, int kh) {
    return (char *)c->v[l] + (size_t)kh * (size_t)c->n_ctx * (size_t)c->hd_v[l] * elem_size(c);
}

/* Floats of one cell of layer l's master keys. */
static size_t kpre_cell_floats(const llmrt_kv_cache *c, int l) {
    return (size_t)c->n_head_kv[l] * (size_t)c->hd_k[l];
}

/* The compaction's one-cell buffer: the largest cell of K, V or (shift) k_pre. */
static size_t tmp_bytes(const llmrt_kv_cache *c) {
    size_t m = sizeof(int32_t);
    for (int l = 0; l < c->n_layer; l++) {
        const size_t k = kpre_cell_floats(c, l) * sizeof(float), v = llmrt_kv_cache_v_cell_bytes(c, l);
        m = k > m ? k : m;
        m = v > m ? v : m;
    }
    return m;
}

static int max_hd_k(const llmrt_kv_cache *c) {
    int m = 1;
    for (int l = 0; l < c->n_layer; l++) {
        if (c->hd_k[l] > m) m = c->hd_k[l];
    }
    return m;
}

size_t llmrt_kv_cache_nbytes(const llmrt_kv_cache *c) {
    size_t n = (size_t)c->n_ctx * (2 * sizeof(int32_t) + 2) + tmp_bytes(c);
    for (int l = 0; l < c->n_layer; l++) {
        n += (size_t)c->n_ctx * (llmrt_kv_cache_k_cell_bytes(c, l) + llmrt_kv_cache_v_cell_bytes(c, l));
        if (c->k_pre != NULL) {
            n += (size_t)c->n_ctx * kpre_cell_floats(c, l) * sizeof(float);
            n += (size_t)(c->hd_k[l] / 2 + 1) * sizeof(float);
        }
    }
    if (c->k_pre != NULL) {
        n += (size_t)c->n_layer * (sizeof(llmrt_rope_params) + 2);
        n += (size_t)2 * (size_t)max_hd_k(c) * sizeof(float);
    }
    return n;
}

static void free_shift(llmrt_kv_cache *c) {
    if (c->k_pre != NULL) {
        for (int l = 0; l < c->n_layer; l++) free(c->k_pre[l]);
    }
    if (c->rope_ff != NULL) {
        for (int l = 0; l < c->n_layer; l++) free(c->rope_ff[l]);
    }
    free(c->k_pre);
    free(c->rope_ff);
    free(c->rope);
    free(c->has_rope);
    free(c->has_ff);
    free(c->scratch);
    c->k_pre = NULL;
    c->rope_ff = NULL;
    c->rope = NULL;
    c->has_rope = NULL;
    c->has_ff = NULL;
    c->scratch = NULL;
}

void llmrt_kv_cache_free(llmrt_kv_cache *c) {
    if (c == NULL) return;
    free_shift(c);
    if (c->k != NULL) {
        for (int l = 0; l < c->n_layer; l++) free(c->k[l]);
    }
    if (c->v != NULL) {
        for (int l = 0; l < c->n_layer; l++) free(c->v[l]);
    }
    free(c->k);
    free(c->v);
    free(c->pos);
    free(c->order);
    free(c->live);
    free(c->mark);
    free(c->tmp);
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
    c->order = (int32_t *)calloc((size_t)n_ctx, sizeof(int32_t));
    c->live = (uint8_t *)calloc((size_t)n_ctx, 1);
    c->mark = (uint8_t *)calloc((size_t)n_ctx, 1);
    if (!c->n_head_kv || !c->hd_k || !c->hd_v || !c->k || !c->v || !c->pos || !c->order || !c->live ||
        !c->mark) {
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
    c->tmp = (unsigned char *)malloc(tmp_bytes(c));
    if (c->tmp == NULL) {
        llmrt_kv_cache_free(c);
        return NULL;
    }
    llmrt_kv_cache_clear(c);
    return c;
}

/* A cell no token holds: invisible from every position (attention masks by pos[]). */
static void free_cell(llmrt_kv_cache *c, int cell) {
    c->live[cell] = 0;
    c->pos[cell] = LLMRT_KV_POS_FREE;
}

/* n_phys := one past the highest live cell. */
static void trim_phys(llmrt_kv_cache *c) {
    while (c->n_phys > 0 && !c->live[c->n_phys - 1]) c->n_phys--;
}

void llmrt_kv_cache_clear(llmrt_kv_cache *c) {
    c->n_used = 0;
    c->n_pending = 0;
    c->n_phys = 0;
    c->first = 0;
    c->pos_offset = 0;
    for (int i = 0; i < c->n_ctx; i++) free_cell(c, i);
}

int llmrt_kv_cache_prepare(llmrt_kv_cache *c, int n) {
    if (n < 1 || n > c->n_ctx - c->n_used) return LLMRT_EINVAL;
    int first = -1;
    for (int i = 0, run = 0; i < c->n_phys; i++) {       /* a hole of n cells */
        run = c->live[i] ? 0 : run + 1;
        if (run == n) {
            first = i + 1 - n;
            break;
        }
    }
    if (first < 0 && c->n_phys + n <= c->n_ctx) first = c->n_phys;
    if (first < 0) {                                     /* fragmented: move the tokens down */
        llmrt_kv_cache_compact(c);
        first = c->n_phys;
    }
    c->first = first;
    c->n_pending = n;
    return first;
}

void llmrt_kv_cache_commit(llmrt_kv_cache *c, int n) {
    for (int i = 0; i < n; i++) {
        c->order[c->n_used + i] = c->first + i;
        c->live[c->first + i] = 1;
    }
    c->n_used += n;
    c->n_pending = 0;
    if (c->first + n > c->n_phys) c->n_phys = c->first + n;
}

int llmrt_kv_cache_n_cells(const llmrt_kv_cache *c) {
    const int end = c->n_pending > 0 ? c->first + c->n_pending : 0;
    return end > c->n_phys ? end : c->n_phys;
}

int llmrt_kv_cache_truncate(llmrt_kv_cache *c, int n_used) {
    if (n_used < 0 || n_used > c->n_used) return LLMRT_EINVAL;
    for (int j = n_used; j < c->n_used; j++) free_cell(c, c->order[j]);
    c->n_used = n_used;
    c->n_pending = 0;
    trim_phys(c);
    return LLMRT_OK;
}

/* Moves element src_of[j] of base (n elements of `size` bytes) to element j, for a permutation
 * src_of of [0, n): cycle by cycle through one buffer (c->tmp), each element moved once. */
static void permute(llmrt_kv_cache *c, void *base, size_t size, const int32_t *src_of, int n) {
    unsigned char *b = (unsigned char *)base;
    memset(c->mark, 0, (size_t)n);
    for (int j = 0; j < n; j++) {
        if (c->mark[j]) continue;
        c->mark[j] = 1;
        if (src_of[j] == j) continue;
        memcpy(c->tmp, b + (size_t)j * size, size);
        int k = j;
        for (;;) {
            const int s = src_of[k];
            if (s == j) {
                memcpy(b + (size_t)k * size, c->tmp, size);
                break;
            }
            memcpy(b + (size_t)k * size, b + (size_t)s * size, size);
            c->mark[s] = 1;
            k = s;
        }
    }
}

void llmrt_kv_cache_compact(llmrt_kv_cache *c) {
    /* order[j] for j >= n_used: the free cells, in increasing order (a full permutation) */
    int j = c->n_used;
    for (int i = 0; i < c->n_ctx; i++) {
        if (!c->live[i]) c->order[j++] = i;
    }
    int moved = 0;
    for (int i = 0; i < c->n_used && !moved; i++) moved = c->order[i] != i;
    if (moved) {
        for (int l = 0; l < c->n_layer; l++) {
            for (int h = 0; h < c->n_head_kv[l]; h++) {
                permute(c, llmrt_kv_cache_k_head(c, l, h), (size_t)c->hd_k[l] * elem_size(c), c->order, c->n_ctx);
                permute(c, llmrt_kv_cache_v_head(c, l, h), (size_t)c->hd_v[l] * elem_size(c), c->order, c->n_ctx);
            }
            if (c->k_pre != NULL) {
                permute(c, c->k_pre[l], kpre_cell_floats(c, l) * sizeof(float), c->order, c->n_ctx);
            }
        }
        permute(c, c->pos, sizeof(int32_t), c->order, c->n_ctx);
        permute(c, c->live, 1, c->order, c->n_ctx);
    }
    for (int i = 0; i < c->n_ctx; i++) c->order[i] = i;
    c->n_phys = c->n_used;
}

/* ---- streaming ------------------------------------------------------------------------------ */

int llmrt_kv_cache_enable_shift(llmrt_kv_cache *c) {
    if (c->k_pre != NULL) return LLMRT_OK;
    if (c->n_used != 0 || c->n_pending != 0) return LLMRT_EINVAL;
    const int L = c->n_layer;
    c->k_pre = (float **)calloc((size_t)L, sizeof(float *));
    c->rope_ff = (float **)calloc((size_t)L, sizeof(float *));
    c->rope = (llmrt_rope_params *)calloc((size_t)L, sizeof(llmrt_rope_params));
    c->has_rope = (uint8_t *)calloc((size_t)L, 1);
    c->has_ff = (uint8_t *)calloc((size_t)L, 1);
    c->scratch = (float *)calloc((size_t)2 * (size_t)max_hd_k(c), sizeof(float));
    if (!c->k_pre || !c->rope_ff || !c->rope || !c->has_rope || !c->has_ff || !c->scratch) {
        free_shift(c);
        return LLMRT_ENOMEM;
    }
    for (int l = 0; l < L; l++) {
        c->k_pre[l] = (float *)calloc((size_t)c->n_ctx * kpre_cell_floats(c, l), sizeof(float));
        c->rope_ff[l] = (float *)calloc((size_t)(c->hd_k[l] / 2 + 1), sizeof(float));
        if (c->k_pre[l] == NULL || c->rope_ff[l] == NULL) {
            free_shift(c);
            return LLMRT_ENOMEM;
        }
    }
    return LLMRT_OK;
}

int llmrt_kv_cache_set_rope(llmrt_kv_cache *c, int l, const llmrt_rope_params *rp, const float *ff) {
    if (c->k_pre == NULL || l < 0 || l >= c->n_layer || rp == NULL) return LLMRT_EINVAL;
    if (rp->n_rot < 2 || rp->n_rot % 2 != 0 || rp->n_rot > c->hd_k[l]) return LLMRT_EINVAL;
    c->rope[l] = *rp;
    c->has_ff[l] = ff != NULL;
    if (ff != NULL) memcpy(c->rope_ff[l], ff, (size_t)(rp->n_rot / 2) * sizeof(float));
    c->has_rope[l] = 1;
    return LLMRT_OK;
}

/* Frees the cells of tokens [n_keep, n_keep + n_discard) and closes the gap in order[]
 * (the later tokens' cells stay where they are). */
static void drop_tokens(llmrt_kv_cache *c, int n_keep, int n_discard) {
    const int src = n_keep + n_discard;
    for (int j = n_keep; j < src; j++) free_cell(c, c->order[j]);
    memmove(c->order + n_keep, c->order + src, (size_t)(c->n_used - src) * sizeof(int32_t));
    c->n_used -= n_discard;
    trim_phys(c);
}

static int check_evict(const llmrt_kv_cache *c, int n_keep, int n_discard) {
    if (n_keep < 0 || n_discard < 1 || c->n_pending != 0) return LLMRT_EINVAL;
    if (n_keep > c->n_used - n_discard) return LLMRT_EINVAL;
    return LLMRT_OK;
}

/* pos += delta, in int64 (positions are caller data: clamp, never overflow) */
static void add_pos(llmrt_kv_cache *c, int cell, int64_t delta) {
    const int64_t p = (int64_t)c->pos[cell] + delta;
    c->pos[cell] = (int32_t)(p < INT32_MIN ? INT32_MIN : (p > INT32_MAX - 1 ? INT32_MAX - 1 : p));
}

int llmrt_kv_cache_evict(llmrt_kv_cache *c, int n_keep, int n_discard) {
    const int rc = check_evict(c, n_keep, n_discard);
    if (rc != LLMRT_OK) return rc;
    drop_tokens(c, n_keep, n_discard);
    for (int j = n_keep; j < c->n_used; j++) add_pos(c, c->order[j], -(int64_t)n_discard);
    return LLMRT_OK;
}

/* Do layers a and b rotate their keys identically (so one cos/sin cache serves both)? */
static int same_rope(const llmrt_kv_cache *c, int a, int b) {
    const llmrt_rope_params *x = &c->rope[a], *y = &c->rope[b];
    if (x->n_rot != y->n_rot || x->mode != y->mode || x->n_ctx_orig != y->n_ctx_orig ||
        x->freq_base != y->freq_base || x->freq_scale != y->freq_scale ||
        x->ext_factor != y->ext_factor || x->attn_factor != y->attn_factor ||
        x->beta_fast != y->beta_fast || x->beta_slow != y->beta_slow) {
        return 0;
    }
    if (c->has_ff[a] != c->has_ff[b]) return 0;
    return !c->has_ff[a] || memcmp(c->rope_ff[a], c->rope_ff[b], (size_t)(x->n_rot / 2) * sizeof(float)) == 0;
}

/* Working K of one cell of layer l := RoPE(master) with the cos/sin cache `cs`. */
static void rerope_cell(llmrt_kv_cache *c, int l, int cell, const float *cs, float *tmp) {
    const int hd = c->hd_k[l], nkv = c->n_head_kv[l];
    const llmrt_rope_params *rp = &c->rope[l];
    const float *x = c->k_pre[l] + (size_t)cell * kpre_cell_floats(c, l);
    if (c->type == LLMRT_TYPE_F16) {
        const llmrt_quant_row_fn to_f16 = llmrt_kernels()->quant_row[LLMRT_TYPE_F16]; /* RNE, as KV_STORE */
        for (int h = 0; h < nkv; h++) {
            llmrt_rope_apply(cs, rp->n_rot, rp->mode, hd, x + (size_t)h * hd, tmp);
            to_f16(tmp, (llmrt_fp16_t *)llmrt_kv_cache_k_head(c, l, h) + (size_t)cell * hd, hd);
        }
    } else {
        for (int h = 0; h < nkv; h++) {
            llmrt_rope_apply(cs, rp->n_rot, rp->mode, hd, x + (size_t)h * hd,
                             (float *)llmrt_kv_cache_k_head(c, l, h) + (size_t)cell * hd);
        }
    }
}

int llmrt_kv_cache_rerope(llmrt_kv_cache *c, int c0, int c1) {
    if (c0 < 0 || c1 < c0 || c1 > c->n_used) return LLMRT_EINVAL;
    if (c->k_pre == NULL) return LLMRT_EINVAL;
    if (c0 == c1) return LLMRT_OK;
    const int L = c->n_layer;
    float *cs = c->scratch;                     /* [n_rot] cos/sin pairs */
    float *tmp = c->scratch + max_hd_k(c);      /* [hd_k] one rotated head */
    for (int g = 0; g < L; g++) {
        if (!c->has_rope[g]) continue;
        int leader = 1;                          /* g is the first layer of its rope group */
        for (int a = 0; a < g && leader; a++) {
            if (c->has_rope[a] && same_rope(c, a, g)) leader = 0;
        }
        if (!leader) continue;
        const llmrt_rope_params rp = c->rope[g];
        float corr_dims[2];
        llmrt_rope_yarn_corr_dims(rp.n_rot, rp.n_ctx_orig, rp.freq_base, rp.beta_fast, rp.beta_slow,
                                  corr_dims);
        const float *ff = c->has_ff[g] ? c->rope_ff[g] : NULL;
        for (int j = c0; j < c1; j++) {
            const int cell = c->order[j];
            llmrt_rope_cache_init((float)c->pos[cell], &rp, ff, corr_dims, 1.0f, cs);
            for (int l = g; l < L; l++) {
                if (l == g || (c->has_rope[l] && same_rope(c, l, g))) rerope_cell(c, l, cell, cs, tmp);
            }
        }
    }
    return LLMRT_OK;
}

int llmrt_kv_cache_shift(llmrt_kv_cache *c, int n_keep, int n_discard) {
    if (c->k_pre == NULL) return LLMRT_EINVAL;
    const int rc = check_evict(c, n_keep, n_discard);
    if (rc != LLMRT_OK) return rc;
    drop_tokens(c, n_keep, n_discard);
    const int64_t off = (int64_t)c->pos_offset + n_discard;
    if (off >= c->n_ctx) {          /* stored angles stay below ~2 n_ctx: everything back down */
        for (int j = n_keep; j < c->n_used; j++) add_pos(c, c->order[j], -(int64_t)n_discard);
        for (int j = 0; j < c->n_used; j++) add_pos(c, c->order[j], -(int64_t)c->pos_offset);
        c->pos_offset = 0;
        return llmrt_kv_cache_rerope(c, 0, c->n_used);
    }
    for (int j = 0; j < n_keep; j++) add_pos(c, c->order[j], n_discard);
    c->pos_offset = (int32_t)off;
    return llmrt_kv_cache_rerope(c, 0, n_keep);
}

int llmrt_kv_cache_copy(llmrt_kv_cache *dst, const llmrt_kv_cache *src) {
    if (dst == src) return LLMRT_OK;
    if (dst->n_layer != src->n_layer || dst->n_ctx != src->n_ctx || dst->type != src->type) {
        return LLMRT_EINVAL;
    }
    if ((dst->k_pre == NULL) != (src->k_pre == NULL)) return LLMRT_EINVAL;
    for (int l = 0; l < src->n_layer; l++) {
        if (dst->n_head_kv[l] != src->n_head_kv[l] || dst->hd_k[l] != src->hd_k[l] ||
            dst->hd_v[l] != src->hd_v[l]) {
            return LLMRT_EINVAL;
        }
    }
    const size_t n = (size_t)src->n_ctx;
    for (int l = 0; l < src->n_layer; l++) {
        memcpy(dst->k[l], src->k[l], n * llmrt_kv_cache_k_cell_bytes(src, l));
        memcpy(dst->v[l], src->v[l], n * llmrt_kv_cache_v_cell_bytes(src, l));
        if (src->k_pre != NULL) {
            memcpy(dst->k_pre[l], src->k_pre[l], n * kpre_cell_floats(src, l) * sizeof(float));
            memcpy(dst->rope_ff[l], src->rope_ff[l], (size_t)(src->hd_k[l] / 2 + 1) * sizeof(float));
            dst->rope[l] = src->rope[l];
            dst->has_rope[l] = src->has_rope[l];
            dst->has_ff[l] = src->has_ff[l];
        }
    }
    memcpy(dst->pos, src->pos, n * sizeof(int32_t));
    memcpy(dst->order, src->order, n * sizeof(int32_t));
    memcpy(dst->live, src->live, n);
    dst->n_phys = src->n_phys;
    dst->first = src->first;
    dst->pos_offset = src->pos_offset;
    dst->n_used = src->n_used;
    dst->n_pending = 0;
    return LLMRT_OK;
}

/* ---- state image (sessions saved to a file) ------------------------------------------------- */

#define STATE_MAGIC 0x31564B4Cu /* "LKV1" */

/* A cursor over an image: writes when w != NULL, else reads from r; stops (ok = 0) at the end. */
typedef struct {
    unsigned char *w;
    const unsigned char *r;
    size_t size, at;
    int ok;
} cursor;

static void *cur_take(cursor *k, size_t n) {
    if (!k->ok || n > k->size - k->at) {
        k->ok = 0;
        return NULL;
    }
    void *p = (k->w != NULL ? (void *)(k->w + k->at) : (void *)(uintptr_t)(k->r + k->at));
    k->at += n;
    return p;
}

static size_t pad4(size_t n) { return (n + 3) & ~(size_t)3; }

/* Moves the first n cells of a head-major K or V array (nh heads of n_ctx rows of `row` bytes)
 * between the image and the cache as n cell-major cells ([cell][head][row]: the image keeps the
 * layout it had before the cache went head-major), padded to 4 (image -> cache only when apply). */
static void cur_cells(cursor *k, void *mem, size_t n, int nh, size_t n_ctx, size_t row, int apply) {
    unsigned char *p = (unsigned char *)cur_take(k, pad4(n * (size_t)nh * row));
    if (p == NULL) return;
    unsigned char *m = (unsigned char *)mem;
    for (size_t i = 0; i < n; i++) {
        for (int h = 0; h < nh; h++) {
            unsigned char *img = p + (i * (size_t)nh + (size_t)h) * row, *cache = m + ((size_t)h * n_ctx + i) * row;
            if (k->w != NULL) memcpy(img, cache, row);
            else if (apply) memcpy(cache, img, row);
        }
    }
    if (k->w != NULL) memset(p + n * (size_t)nh * row, 0, pad4(n * (size_t)nh * row) - n * (size_t)nh * row);
}

/* Moves n bytes between the image and `mem` (image -> mem only when apply), padded to 4. */
static void cur_bytes(cursor *k, void *mem, size_t n, int apply) {
    unsigned char *p = (unsigned char *)cur_take(k, pad4(n));
    if (p == NULL) return;
    if (k->w != NULL) {
        memcpy(p, mem, n);
        memset(p + n, 0, pad4(n) - n);
    } else if (apply) {
        memcpy(mem, p, n);
    }
}

static int32_t cur_i32(cursor *k, int32_t v) {
    int32_t *p = (int32_t *)cur_take(k, sizeof(int32_t));
    if (p == NULL) return 0;
    if (k->w != NULL) {
        memcpy(p, &v, sizeof(v));
        return v;
    }
    int32_t x;
    memcpy(&x, p, sizeof(x));
    return x;
}

/* One pass over the image: writes it (k->w), or reads it (checking it fits this cache) and,
 * when apply, loads it. The header fields it reads are checked against the cache before any
 * cell is touched; apply runs only after a checking pass succeeded. */
static int state_pass(llmrt_kv_cache *c, cursor *k, int apply) {
    const int writing = k->w != NULL;
    const int has_shift = c->k_pre != NULL;
    if ((uint32_t)cur_i32(k, (int32_t)STATE_MAGIC) != STATE_MAGIC) return LLMRT_EINVAL;
    if (cur_i32(k, c->n_layer) != c->n_layer || cur_i32(k, c->n_ctx) != c->n_ctx ||
        cur_i32(k, c->type) != c->type || cur_i32(k, has_shift) != has_shift) {
        return LLMRT_EINVAL;
    }
    const int n_used = cur_i32(k, c->n_used);
    const int n_phys = cur_i32(k, c->n_phys);
    const int32_t pos_offset = cur_i32(k, c->pos_offset);
    if (!k->ok || n_used < 0 || n_phys < n_used || n_phys > c->n_ctx || pos_offset < 0) return LLMRT_EINVAL;
    for (int l = 0; l < c->n_layer; l++) {
        if (cur_i32(k, c->n_head_kv[l]) != c->n_head_kv[l] || cur_i32(k, c->hd_k[l]) != c->hd_k[l] ||
            cur_i32(k, c->hd_v[l]) != c->hd_v[l]) {
            return LLMRT_EINVAL;
        }
    }
    /* positions, token order, live marks: checked for consistency before anything is applied */
    const size_t np = (size_t)n_phys;
    const int32_t *pos = (const int32_t *)cur_take(k, np * sizeof(int32_t));
    const int32_t *order = (const int32_t *)cur_take(k, (size_t)n_used * sizeof(int32_t));
    const uint8_t *live = (const uint8_t *)cur_take(k, pad4(np));
    if (!k->ok) return LLMRT_EINVAL;
    if (writing) {
        memcpy((void *)(uintptr_t)pos, c->pos, np * sizeof(int32_t));
        memcpy((void *)(uintptr_t)order, c->order, (size_t)n_used * sizeof(int32_t));
        memset((void *)(uintptr_t)live, 0, pad4(np));
        memcpy((void *)(uintptr_t)live, c->live, np);
    } else if (!apply) {
        int n_live = 0;
        for (size_t i = 0; i < np; i++) {
            if (live[i] > 1) return LLMRT_EINVAL;
            n_live += live[i];
            int32_t p;
            memcpy(&p, pos + i, sizeof(p));
            if (live[i] && (p < 0 || p == LLMRT_KV_POS_FREE)) return LLMRT_EINVAL;
        }
        if (n_live != n_used || (n_phys > 0 && !live[np - 1])) return LLMRT_EINVAL;
        memset(c->mark, 0, (size_t)c->n_ctx);           /* scratch: each live cell once in order */
        for (int j = 0; j < n_used; j++) {
            int32_t cell;
            memcpy(&cell, order + j, sizeof(cell));
            if (cell < 0 || cell >= n_phys || !live[cell] || c->mark[cell]) return LLMRT_EINVAL;
            c->mark[cell] = 1;
        }
    }
    for (int l = 0; l < c->n_layer; l++) {
        const size_t es = elem_size(c);
        cur_cells(k, c->k[l], np, c->n_head_kv[l], (size_t)c->n_ctx, (size_t)c->hd_k[l] * es, apply);
        cur_cells(k, c->v[l], np, c->n_head_kv[l], (size_t)c->n_ctx, (size_t)c->hd_v[l] * es, apply);
        if (!has_shift) continue;
        cur_bytes(k, c->k_pre[l], np * kpre_cell_floats(c, l) * sizeof(float), apply);
        const uint8_t has_rope = (uint8_t)cur_i32(k, c->has_rope[l]);
        const uint8_t has_ff = (uint8_t)cur_i32(k, c->has_ff[l]);
        llmrt_rope_params rp = c->rope[l];
        cur_bytes(k, &rp, sizeof(rp), 1);
        const size_t nff = (size_t)(c->hd_k[l] / 2 + 1);
        if (!k->ok || has_rope > 1 || has_ff > 1) return LLMRT_EINVAL;
        if (!writing && has_rope && (rp.n_rot < 2 || rp.n_rot % 2 != 0 || rp.n_rot > c->hd_k[l])) {
            return LLMRT_EINVAL;
        }
        cur_bytes(k, c->rope_ff[l], nff * sizeof(float), apply);
        if (apply) {
            c->has_rope[l] = has_rope;
            c->has_ff[l] = has_ff;
            c->rope[l] = rp;
        }
    }
    if (!k->ok || (!writing && k->at != k->size)) return LLMRT_EINVAL;
    if (apply) {
        memcpy(c->pos, pos, np * sizeof(int32_t));
        memcpy(c->order, order, (size_t)n_used * sizeof(int32_t));
        memcpy(c->live, live, np);
        for (int i = 0; i < c->n_ctx; i++) {
            if (i >= n_phys || !c->live[i]) {   /* free cells are visible from no position */
                c->live[i] = 0;
                c->pos[i] = LLMRT_KV_POS_FREE;
            }
        }
        c->n_used = n_used;
        c->n_phys = n_phys;
        c->pos_offset = pos_offset;
        c->n_pending = 0;
        c->first = 0;
    }
    return LLMRT_OK;
}

size_t llmrt_kv_cache_state_bytes(const llmrt_kv_cache *c) {
    /* what state_pass writes: 8 header ints, 3 per layer, positions, order, live marks, cells */
    size_t n = 4 * 8 + (size_t)c->n_layer * 12;
    const size_t np = (size_t)c->n_phys;
    n += np * 4 + (size_t)c->n_used * 4 + pad4(np);
    for (int l = 0; l < c->n_layer; l++) {
        n += pad4(np * llmrt_kv_cache_k_cell_bytes(c, l)) + pad4(np * llmrt_kv_cache_v_cell_bytes(c, l));
        if (c->k_pre != NULL) {
            n += np * kpre_cell_floats(c, l) * sizeof(float) + 8 + pad4(sizeof(llmrt_rope_params)) +
                 (size_t)(c->hd_k[l] / 2 + 1) * sizeof(float);
        }
    }
    return n;
}

int llmrt_kv_cache_state_save(const llmrt_kv_cache *c, void *buf, size_t size) {
    if (c == NULL || buf == NULL || c->n_pending != 0 || size != llmrt_kv_cache_state_bytes(c)) return LLMRT_EINVAL;
    cursor k = { (unsigned char *)buf, NULL, size, 0, 1 };
    const int rc = state_pass((llmrt_kv_cache *)(uintptr_t)c, &k, 0);
    return rc == LLMRT_OK && k.at == size ? LLMRT_OK : LLMRT_EINVAL;
}

int llmrt_kv_cache_state_load(llmrt_kv_cache *c, const void *buf, size_t size) {
    if (c == NULL || buf == NULL || c->n_pending != 0) return LLMRT_EINVAL;
    cursor check = { NULL, (const unsigned char *)buf, size, 0, 1 };
    int rc = state_pass(c, &check, 0);           /* everything checked, nothing written */
    if (rc != LLMRT_OK) return rc;
    cursor load = { NULL, (const unsigned char *)buf, size, 0, 1 };
    return state_pass(c, &load, 1);
}
