/*
 * kv_cache.h — the key/value cache attention reads and writes, and its streaming operations.
 *
 * Per layer l: K[l] is [n_head_kv[l]][n_ctx][hd_k[l]] and V[l] is [n_head_kv[l]][n_ctx][hd_v[l]]
 * (innermost last; head-major: attention reads one KV head's cells as one contiguous stream, which
 * the hardware prefetchers follow, where a head's slices of cell-major rows ran at a fifth of
 * the memory's speed), in f16 (default) or f32. One array pos[n_ctx] (shared by all layers) holds
 * the position of the token stored in each cell. The cache holds n_used tokens; token j (in the
 * order they came, "token order") is in cell order[j]. Cells need not be in token order: an
 * eviction leaves holes that later tokens fill, and nothing moves. A free cell has position
 * LLMRT_KV_POS_FREE (visible from no position). A cache that never evicts has order[j] == j.
 *
 * Attention never assumes cell index == position nor token order: it reads pos[] for masking
 * (causal, sliding window) over the cells [0, llmrt_kv_cache_n_cells). So the streaming cache
 * drops tokens after the n_keep sinks and turns positions without touching attention.
 *
 * A graph run stores its n new tokens in n consecutive free cells:
 *   first = llmrt_kv_cache_prepare(c, n)   reserves them (LLMRT_EINVAL if they do not fit): the
 *                                          first hole of n cells, else after the highest live
 *                                          cell, else after compacting the cells (rare: a batch
 *                                          larger than every hole in a fragmented cache)
 *   llmrt_graph_run(...)                   writes pos[] and K/V of those cells, then commits
 *                                          (llmrt_kv_cache_commit: they become the last n tokens)
 *
 * Streaming (StreamingLLM: sinks + recent window, positions counted inside the cache):
 *   llmrt_kv_cache_enable_shift(c)         (empty cache) keeps a master copy of every key
 *                                          BEFORE RoPE, f32: k_pre[l] [n_ctx][n_head_kv][hd_k].
 *                                          A graph whose attention k is a rope node stores it
 *                                          (hidden KV_STORE_PRE node) and registers the layer's
 *                                          rope parameters (rope[l], rope_ff[l]).
 *   llmrt_kv_cache_evict(c, n_keep, d)     drops tokens [n_keep, n_keep + d) (their cells become
 *                                          holes) and subtracts d from the later tokens' positions.
 *   llmrt_kv_cache_rerope(c, t0, t1)       recomputes the working K of tokens [t0, t1) as
 *                                          RoPE(k_pre, pos[cell]) with the layer's parameters.
 *   llmrt_kv_cache_shift(c, n_keep, d)     drops the same tokens, and instead of turning every
 *                                          later key back by d positions it turns the n_keep
 *                                          sinks forward by d (pos += d, re-roped): the same
 *                                          relative positions, so the same attention (RoPE scores
 *                                          depend on position differences only; masks too), for
 *                                          O(n_keep) rotations instead of O(n_used). pos_offset
 *                                          counts that advance: every position is pos_offset
 *                                          above evict + rerope's, and the next token goes at
 *                                          (last position + 1) as always. When pos_offset reaches
 *                                          n_ctx, the shift re-ropes every key at its position
 *                                          - pos_offset (pos_offset back to 0), so positions stay
 *                                          below ~2 n_ctx: once per n_ctx evicted tokens.
 * No drift: after any number of shifts, the working K of a cell is ONE rotation of its exact
 * master key at its current position (bit-identical to what a graph run at that position
 * stores for the same pre-RoPE key), never a rotation of a rotation.
 */
#ifndef LLMRT_KV_CACHE_H
#define LLMRT_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* RoPE parameters as ggml_rope_ext takes them: of a graph's rope node (llmrt_graph_rope) and of
 * one cache layer's keys (the shift re-ropes them with exactly the node's parameters). */
typedef struct {
    int n_rot;           /* dims rotated (even, <= head dim); the rest pass through */
    int mode;            /* 0 normal pairs (2i, 2i+1), 2 NeoX pairs (i, i + n_rot/2) */
    int n_ctx_orig;      /* YaRN: original training context */
    float freq_base;
    float freq_scale;
    float ext_factor;    /* YaRN extrapolation mix; 0 disables YaRN */
    float attn_factor;   /* magnitude scale */
    float beta_fast;
    float beta_slow;
} llmrt_rope_params;

typedef struct {
    int n_layer;
    int n_ctx;         /* cells */
    int type;          /* LLMRT_TYPE_F16 or LLMRT_TYPE_F32 */
    int *n_head_kv;    /* [n_layer] */
    int *hd_k;         /* [n_layer] head dim of K */
    int *hd_v;         /* [n_layer] head dim of V */
    void **k;          /* [n_layer] -> [n_head_kv][n_ctx][hd_k] elements of `type` (head-major) */
    void **v;          /* [n_layer] -> [n_head_kv][n_ctx][hd_v] */
    int32_t *pos;      /* [n_ctx] position of the token in each cell */
    int n_used;        /* tokens in the cache */
    int n_pending;     /* cells [first, first + n_pending) reserved for the next run */
    int32_t *order;    /* [n_ctx] order[j]: the cell of token j, j < n_used */
    uint8_t *live;     /* [n_ctx] 1: the cell holds a token */
    int n_phys;        /* one past the highest live cell */
    int first;         /* first cell reserved by prepare (the run's kv_first) */
    int32_t pos_offset; /* how far shifts turned positions forward (see shift above) */
    unsigned char *tmp; /* one cell of the largest of K, V, k_pre (compaction) */
    uint8_t *mark;     /* [n_ctx] compaction scratch */
    /* streaming (NULL / 0 until llmrt_kv_cache_enable_shift) */
    float **k_pre;         /* [n_layer] -> [n_ctx][n_head_kv][hd_k] f32 keys before RoPE */
    llmrt_rope_params *rope;   /* [n_layer] the layer's key RoPE (valid where has_rope[l]) */
    float **rope_ff;       /* [n_layer] -> [hd_k / 2] freq_factors (used where has_ff[l]) */
    uint8_t *has_rope;     /* [n_layer] 1: the layer's keys are roped (registered by a run) */
    uint8_t *has_ff;       /* [n_layer] 1: rope_ff[l] holds freq_factors */
    float *scratch;        /* [2 * max hd_k] cos/sin cache + one rotated head (rerope) */
} llmrt_kv_cache;

/* The position of a free cell: visible from no position. */
#define LLMRT_KV_POS_FREE INT32_MAX

/* NULL on bad arguments or out of memory. Per-layer shapes are arrays of n_layer ints. */
llmrt_kv_cache *llmrt_kv_cache_new(int n_layer, int n_ctx, const int *n_head_kv, const int *hd_k,
                                   const int *hd_v, int type);
void llmrt_kv_cache_free(llmrt_kv_cache *c);

/* Bytes of one cell of layer l's K (or V): n_head_kv * hd * element size. */
size_t llmrt_kv_cache_k_cell_bytes(const llmrt_kv_cache *c, int l);
size_t llmrt_kv_cache_v_cell_bytes(const llmrt_kv_cache *c, int l);
/* Head kh of layer l's K / V: n_ctx rows of hd_k / hd_v elements, a row per cell, contiguous. */
void *llmrt_kv_cache_k_head(const llmrt_kv_cache *c, int l, int kh);
void *llmrt_kv_cache_v_head(const llmrt_kv_cache *c, int l, int kh);
/* Bytes the cache allocated (K, V, positions, master keys and rope tables). */
size_t llmrt_kv_cache_nbytes(const llmrt_kv_cache *c);

void llmrt_kv_cache_clear(llmrt_kv_cache *c);
/* Reserves n consecutive free cells (see above); returns the first or LLMRT_EINVAL. */
int llmrt_kv_cache_prepare(llmrt_kv_cache *c, int n);
/* After a run wrote the n reserved cells [first, first + n): they become the last n tokens. */
void llmrt_kv_cache_commit(llmrt_kv_cache *c, int n);
/* Cells attention may have to read in a run: every live cell and the reserved ones are below. */
int llmrt_kv_cache_n_cells(const llmrt_kv_cache *c);
/* Keeps tokens [0, n_used) (drops any reservation). LLMRT_EINVAL if n_used is out of [0, n_used]. */
int llmrt_kv_cache_truncate(llmrt_kv_cache *c, int n_used);
/* Moves the cells into token order (order[j] == j); positions and contents are unchanged. */
void llmrt_kv_cache_compact(llmrt_kv_cache *c);

/* ---- streaming ----------------------------------------------------------------------------- */

/* Allocates the master keys and rope tables. LLMRT_EINVAL unless the cache is empty (n_used 0),
 * LLMRT_ENOMEM. Idempotent. */
int llmrt_kv_cache_enable_shift(llmrt_kv_cache *c);
/* Registers layer l's key RoPE (ff: NULL or n_rot / 2 freq_factors, copied). LLMRT_EINVAL on
 * bad arguments or without enable_shift. Graph runs call it (KV_STORE_PRE). */
int llmrt_kv_cache_set_rope(llmrt_kv_cache *c, int l, const llmrt_rope_params *rp, const float *ff);
/* Drops tokens [n_keep, n_keep + n_discard) (their cells become free); the later tokens'
 * positions drop by n_discard. K is NOT re-rotated. LLMRT_EINVAL unless 0 <= n_keep,
 * 1 <= n_discard, n_keep + n_discard <= n_used and nothing is pending. */
int llmrt_kv_cache_evict(llmrt_kv_cache *c, int n_keep, int n_discard);
/* Working K of tokens [c0, c1) of every roped layer := RoPE(k_pre, pos[cell]). LLMRT_EINVAL on
 * a bad range or when a roped layer has no master keys. O((c1 - c0) * kv_dim) per layer; the
 * cos/sin of a position is computed once per group of layers with equal rope parameters. */
int llmrt_kv_cache_rerope(llmrt_kv_cache *c, int c0, int c1);
/* Drops tokens [n_keep, n_keep + n_discard) and turns the sinks forward (see above). Same
 * errors as evict, and LLMRT_EINVAL without enable_shift. */
int llmrt_kv_cache_shift(llmrt_kv_cache *c, int n_keep, int n_discard);
/* Copies every cell, position, cell map, master key and rope registration of src into dst (same
 * shapes and type; dst has shift enabled iff src has). LLMRT_EINVAL otherwise. */
int llmrt_kv_cache_copy(llmrt_kv_cache *dst, const llmrt_kv_cache *src);

/* ---- state image (saving a session) ---------------------------------------------------------
 * Everything that defines what attention sees, as bytes: the shapes and type (checked on load),
 * n_used, n_phys, pos_offset, the positions and live marks of cells [0, n_phys), the token
 * order, and per layer the K and V of those cells and, with shift enabled, their master keys and
 * the layer's rope registration. Cells keep their indices, so a loaded cache is the saved one
 * cell for cell (attention visits cells in index order: the same sums). Native byte order. K
 * and V go in cell-major order ([cell][head][hd], the cache's layout before it went head-major),
 * so images saved before and after that load alike. */
size_t llmrt_kv_cache_state_bytes(const llmrt_kv_cache *c);
/* Writes the image (exactly state_bytes bytes; nothing may be pending). LLMRT_EINVAL otherwise. */
int llmrt_kv_cache_state_save(const llmrt_kv_cache *c, void *buf, size_t size);
/* Loads an image into a cache of the same shapes, type, n_ctx and shift setting. Checks all of it
 * first (sizes, shapes, cell marks, token order, rope parameters): on LLMRT_EINVAL the cache is
 * unchanged. Free cells get position LLMRT_KV_POS_FREE whatever the image says. */
int llmrt_kv_cache_state_load(llmrt_kv_cache *c, const void *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* LLMRT_KV_CACHE_H */
