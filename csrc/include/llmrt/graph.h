/*
 * graph.h — ggml-style tensors and a compute graph that is built once and run many times.
 *
 * How to use it:
 *   llmrt_threadpool *tp = llmrt_threadpool_new(n_threads);
 *   llmrt_graph *g = llmrt_graph_new(max_tokens, tp);
 *   int w   = llmrt_graph_weight(g, LLMRT_TYPE_Q8_0, ne, 2, data);  // zero-copy over data
 *   int tok = llmrt_graph_input(g, LLMRT_INPUT_TOKENS, 0);
 *   int x   = llmrt_graph_get_rows(g, w, tok);                       // every call returns a
 *   ...                                                              // tensor id (>= 0) or a
 *   llmrt_graph_set_output(g, y);                                    // negative status code
 *   llmrt_graph_build(g);           // plans the arena; no more nodes after this
 *   llmrt_graph_run(g, &inputs, cache, out);   // as often as you like, any n <= max_tokens
 *
 * Tensors. ne[4] are element counts (ne[0] = row length, innermost), nb[4] byte strides, as in
 * ggml. Weights keep their GGUF type and memory. Every activation is f32 and contiguous with the
 * token dimension last (outermost): [ne0, n] or [ne0, ne1, n]. That dimension is "dynamic": its
 * capacity is fixed at build time (max_tokens, or max_out for tensors after the output-row
 * pick), and each run sets it to the run's n (or n_out). Because it is outermost, strides do
 * not depend on it, so one plan serves every n.
 *
 * Nodes run in the order they were added (which is a topological order). Some user ops add a
 * hidden node first: mul_mat converts its activations to the weight's vec_dot_type (QUANTIZE),
 * attention stores the new keys/values in the cache (KV_STORE) and, when its k is a rope node,
 * the pre-RoPE keys in the cache's master copy for shift-RoPE (KV_STORE_PRE). The op enum is
 * append-only.
 *
 * Memory. Intermediate tensors get offsets in one arena at build time: a tensor lives from the
 * node that makes it to the last node that reads it (directly or through a reshape view), and a
 * best-fit allocator over those lifetimes reuses freed ranges. No malloc happens during a run.
 *
 * Threads. A run executes every node on all threads of the pool; inside a node threads claim
 * chunks of its work (rows, row blocks, (token, head) pairs) from an atomic counter. Barriers
 * separate a node from the earlier ones it depends on (graph.c plans where; a node with little
 * work runs on thread 0 alone). Kernels assume valid shapes: the caller (Cython) validates first. C checks
 * only what would otherwise be a memory error and returns LLMRT_EINVAL.
 */
#ifndef LLMRT_GRAPH_H
#define LLMRT_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "llmrt/kv_cache.h"
#include "llmrt/llmrt.h"
#include "llmrt/threadpool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ops. Append only: the numbers may be stored or logged. */
typedef enum {
    LLMRT_OP_NONE = 0,      /* a weight (leaf) */
    LLMRT_OP_INPUT,         /* int32 [n] or [n_out], set per run */
    LLMRT_OP_GET_ROWS,      /* src0 weight [ne0, rows], src1 int32 idx [n]  -> [ne0, n] */
    LLMRT_OP_RMS_NORM,      /* src0 [ne0, ...]; params: f32 eps */
    LLMRT_OP_MUL,           /* src0 * src1 (src1 broadcast: each dim 1 or equal) */
    LLMRT_OP_ADD,           /* src0 + src1 (same broadcast) */
    LLMRT_OP_SCALE,         /* src0 * s; params: f32 s */
    LLMRT_OP_QUANTIZE,      /* (hidden) f32 rows of src0 -> rows of this tensor's type */
    LLMRT_OP_MUL_MAT,       /* src0 weight [K, M], src1 [K, rows...] (f32 or its vec_dot_type) */
    LLMRT_OP_RESHAPE,       /* view of src0, no compute */
    LLMRT_OP_ROPE,          /* src0 [hd, n_head, n], src1 pos int32 [n], src2 freq_factors|NULL */
    LLMRT_OP_KV_STORE,      /* (hidden) src0 k [hd_k, nkv, n], src1 v -> cache cells; params: layer */
    LLMRT_OP_ATTENTION,     /* src0 q [hd_k, nh, n], src1 its KV_STORE -> [hd_v * nh, n] */
    LLMRT_OP_SILU,          /* x * sigmoid(x) */
    LLMRT_OP_GELU,          /* tanh approximation, through an f16 table exactly as ggml's CPU op */
    LLMRT_OP_GLU,           /* act(src0) * src1; params: int act (LLMRT_GLU_*) */
    LLMRT_OP_SOFTCAP,       /* cap * tanh(x / cap); params: f32 cap */
    LLMRT_OP_GET_ROWS_F32,  /* src0 activation [..., n], src1 rows int32 [n_out] -> [..., n_out] */
    LLMRT_OP_KV_STORE_PRE,  /* (hidden) src0 pre-RoPE k, src1 its rope node, src2 freq_factors
                               -> the streaming cache's master keys; params: layer */
    LLMRT_OP_MOE_ROUTE,     /* src0 router logits [n_expert, n], src1 selection bias|NULL -> [2k, n]:
                               the chosen experts' weights, then their ids; params: k, gating,
                               norm, f32 scale (ops/moe.c) */
    LLMRT_OP_MUL_MAT_ID,    /* src0 weight [K, M, n_expert], src1 [K, n] or [K, k, n], src2 route,
                               src3 up weight|NULL (fused GLU) -> [M, k, n]; params: GLU act|-1 */
    LLMRT_OP_MOE_SUM,       /* src0 [M, k, n], src1 route, src2 shared [M, n]|NULL, src3 shared
                               gate logits [1, n]|NULL -> [M, n] */
    LLMRT_OP_COUNT
} llmrt_op;

/* Which count the token (outermost) dimension of a tensor follows. */
enum {
    LLMRT_TOK_NONE = 0,   /* no token dim: weights */
    LLMRT_TOK_N = 1,      /* the run's n tokens (capacity max_tokens) */
    LLMRT_TOK_OUT = 2,    /* the run's n_out picked rows (capacity max_out) */
};

/* Inputs (llmrt_graph_input). */
enum {
    LLMRT_INPUT_TOKENS = 0,     /* int32 [n] token ids */
    LLMRT_INPUT_POSITIONS = 1,  /* int32 [n] positions */
    LLMRT_INPUT_OUT_ROWS = 2,   /* int32 [n_out] rows (token indices) to keep */
    LLMRT_INPUT_COUNT = 3,
};

/* GLU activations. */
enum {
    LLMRT_GLU_SILU = 0,
    LLMRT_GLU_GELU = 1,
};

/* MoE router gating functions (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_* minus one). */
enum {
    LLMRT_MOE_GATING_SOFTMAX = 0,
    LLMRT_MOE_GATING_SIGMOID = 1,
};

/* RoPE modes (ggml's values). */
enum {
    LLMRT_ROPE_NORMAL = 0,  /* rotate pairs (2i, 2i + 1) */
    LLMRT_ROPE_NEOX = 2,    /* rotate pairs (i, i + n_rot / 2) */
};

#define LLMRT_MAX_DIMS 4
#define LLMRT_MAX_SRC 4
#define LLMRT_MAX_OP_PARAMS 16

typedef struct llmrt_tensor {
    int id;                                 /* index in the graph's tensor list */
    int type;                               /* llmrt_type; activations are F32 */
    int op;                                 /* llmrt_op that makes it */
    int n_dims;                             /* 1..4, counting the token dim */
    int64_t ne[LLMRT_MAX_DIMS];             /* elements per dim; ne[tok_dim] is set per run */
    size_t nb[LLMRT_MAX_DIMS];              /* byte strides: nb[0] = block bytes, nb[1] = row */
    int tok_kind;                           /* LLMRT_TOK_* */
    int tok_dim;                            /* n_dims - 1 for activations, -1 for weights */
    int64_t tok_cap;                        /* capacity of the token dim */
    void *data;                             /* weights: caller's memory; else arena (or input) */
    const struct llmrt_packed *packed;      /* weights: load-time repacked copy of data (gemm.h),
                                               caller's memory, or NULL; MUL_MAT then uses
                                               kt->gemm on it when the level has one */
    const struct llmrt_amx_packed *amx;     /* weights: AMX tile-layout copy (amx.h) or NULL;
                                               MUL_MAT uses it for >= LLMRT_AMX_MIN_TOKENS
                                               tokens while llmrt_amx_matmul() is on */
    struct llmrt_tensor *src[LLMRT_MAX_SRC];
    struct llmrt_tensor *view_src;          /* reshape: the tensor whose memory this is */
    int32_t op_params[LLMRT_MAX_OP_PARAMS]; /* ints, or floats stored bitwise */

    /* planning (graph.c) */
    int node;                               /* index in the node list, -1 for leaves */
    int last_use;                           /* last node reading this memory */
    size_t size;                            /* bytes at capacity (arena tensors) */
    size_t offs;                            /* offset in the arena */
    /* ROPE: the cos/sin table ([tok_cap][n_rot] f32) this node shares with the other rope nodes
     * of the same parameters and positions (graph.c), and its part in the current run's plan:
     * 0 its own per-token cache (as alone), 1 fills the table's rows as it goes, 2 reads the rows
     * an earlier node filled (only across a barrier). */
    float *rope_tab;
    int rope_tab_mode;
} llmrt_tensor;

/* llmrt_rope_params (the parameters of llmrt_graph_rope) is defined in kv_cache.h. */

/* What one run reads. */
typedef struct {
    int n;                       /* tokens, 1 <= n <= max_tokens */
    const int32_t *tokens;       /* [n] */
    const int32_t *positions;    /* [n] */
    int n_out;                   /* rows kept by get_rows_f32 (<= max_out); ignored if none */
    const int32_t *out_rows;     /* [n_out], each in [0, n) */
} llmrt_graph_inputs;

typedef struct llmrt_graph llmrt_graph;

/* NULL if max_tokens < 1, pool is NULL, or out of memory. The pool must outlive the graph. */
llmrt_graph *llmrt_graph_new(int max_tokens, llmrt_threadpool *pool);
void llmrt_graph_free(llmrt_graph *g);

/* ---- building: each returns a tensor id (>= 0) or a negative status ------------------------ */

/* A weight over caller memory (kept alive by the caller); ne[0..n_dims) in ggml order. */
int llmrt_graph_weight(llmrt_graph *g, int type, const int64_t *ne, int n_dims, const void *data);
/* Attaches a packed copy (gemm.h; kept alive by the caller, like data) to weight w: MUL_MAT
 * reads it with kt->gemm, everything else (get_rows, levels without a gemm) keeps reading data.
 * Allowed before or after build. LLMRT_EINVAL if w is not a 2-D weight or p does not match its
 * type and shape [K, M]. A 3-D expert weight [K, M, n_expert] takes a copy packed as
 * [K, M * n_expert] when M is a multiple of p->R (each expert's rows in whole groups). */
struct llmrt_packed;
int llmrt_graph_weight_packed(llmrt_graph *g, int w, const struct llmrt_packed *p);
/* Attaches an AMX-packed copy (amx.h; int8 or bf16 kind, kept alive by the caller) to weight w, as
 * llmrt_graph_weight_packed. LLMRT_EINVAL if it does not match w's type and shape. An expert
 * weight [K, M, n_expert] takes a copy of its M * n_expert rows when M is a multiple of
 * LLMRT_AMX_ROW_STEP (MUL_MAT_ID then runs experts with enough tokens on it). */
struct llmrt_amx_packed;
int llmrt_graph_weight_amx(llmrt_graph *g, int w, const struct llmrt_amx_packed *p);
/* LLMRT_INPUT_TOKENS / POSITIONS (one each, [n]) or OUT_ROWS ([n_out], capacity max_out). */
int llmrt_graph_input(llmrt_graph *g, int which, int max_out);
int llmrt_graph_get_rows(llmrt_graph *g, int w, int idx);
int llmrt_graph_rms_norm(llmrt_graph *g, int x, float eps);
int llmrt_graph_mul(llmrt_graph *g, int a, int b);
int llmrt_graph_add(llmrt_graph *g, int a, int b);
int llmrt_graph_scale(llmrt_graph *g, int a, float s);
int llmrt_graph_mul_mat(llmrt_graph *g, int w, int x);
/* ne[0..n_dims) is the new per-token shape; the token dim is appended. */
int llmrt_graph_reshape(llmrt_graph *g, int x, const int64_t *ne, int n_dims);
/* freq_factors: a F32 weight [n_rot / 2] or -1. */
int llmrt_graph_rope(llmrt_graph *g, int x, int pos, int freq_factors, const llmrt_rope_params *p);
int llmrt_graph_attention(llmrt_graph *g, int q, int k, int v, int layer, float scale, int n_swa,
                          float softcap);
int llmrt_graph_silu(llmrt_graph *g, int x);
int llmrt_graph_gelu(llmrt_graph *g, int x);
int llmrt_graph_glu(llmrt_graph *g, int gate, int up, int act);
int llmrt_graph_softcap(llmrt_graph *g, int x, float cap);
int llmrt_graph_get_rows_f32(llmrt_graph *g, int x, int rows);
/* Mixture of experts (ops/moe.c). route: logits [n_expert, n] -> [2k, n]; bias: an F32 weight
 * [n_expert] added for the choice only, or -1; gating LLMRT_MOE_GATING_*; norm 1: the k weights
 * renormalised to sum 1; scale multiplies them. */
int llmrt_graph_moe_route(llmrt_graph *g, int logits, int bias, int k, int gating, int norm, float scale);
/* w [K, M, n_expert] times x ([K, n]: one row per token, or [K, k, n]: one per slot) for each
 * token's chosen experts -> [M, k, n]. up >= 0 (a weight of w's type and shape): act(w x) * (up x)
 * with act LLMRT_GLU_*; up = -1 needs act = -1. */
int llmrt_graph_mul_mat_id(llmrt_graph *g, int w, int x, int route, int up, int act);
/* Σ_s weight_s * x[:, s, t] -> [M, n], + sigmoid(shared_gate) * shared when both are >= 0. */
int llmrt_graph_moe_sum(llmrt_graph *g, int x, int route, int shared, int shared_gate);
int llmrt_graph_set_output(llmrt_graph *g, int y);

/* Plans the arena and per-thread scratch. LLMRT_EINVAL without an output, LLMRT_ENOMEM. */
int llmrt_graph_build(llmrt_graph *g);

/* Runs the graph. If it has attention nodes, cache must hold a reservation of exactly in->n
 * cells (llmrt_kv_cache_prepare); on success the run commits them. Copies the output tensor
 * (rows of ne0 * ne1 * ne2 floats, one per token or picked row) to out. */
int llmrt_graph_run(llmrt_graph *g, const llmrt_graph_inputs *in, llmrt_kv_cache *cache,
                    float *out);

/* Runs a batch of several sequences (continuous batching): the run's tokens are n_seq groups,
 * in order, group s being n_tok[s] > 0 tokens of the sequence whose cache is caches[s] (distinct
 * caches of equal shapes and type, each with a reservation of exactly n_tok[s] cells; the n_tok
 * sum to in->n). Every node but attention sees one batch, so each weight is read once for all the
 * sequences; KV_STORE writes a token into its own sequence's cache and ATTENTION reads only that
 * cache. On success each cache commits its tokens. n_seq == 1 is llmrt_graph_run. */
int llmrt_graph_run_seqs(llmrt_graph *g, const llmrt_graph_inputs *in, llmrt_kv_cache *const *caches,
                         const int *n_tok, int n_seq, float *out);

/* ---- inspection ---------------------------------------------------------------------------- */

const llmrt_tensor *llmrt_graph_tensor(const llmrt_graph *g, int id);  /* NULL if out of range */
int llmrt_graph_n_tensors(const llmrt_graph *g);
int llmrt_graph_n_nodes(const llmrt_graph *g);       /* compute nodes (not weights, inputs, views) */
int llmrt_graph_output(const llmrt_graph *g);        /* output tensor id or -1 */
int llmrt_graph_input_id(const llmrt_graph *g, int which);  /* -1 if the graph has none */
int llmrt_graph_is_built(const llmrt_graph *g);
int llmrt_graph_max_tokens(const llmrt_graph *g);
int llmrt_graph_max_out(const llmrt_graph *g);
size_t llmrt_graph_arena_bytes(const llmrt_graph *g);
/* Sum of the capacity sizes of all arena tensors (what the arena would be without reuse). */
size_t llmrt_graph_tensor_bytes(const llmrt_graph *g);
/* Barriers per run in the plan of the last run (0 before the first run). */
int llmrt_graph_n_barriers(const llmrt_graph *g);
/* Profiling: on = 1 makes thread 0 time every node of every run (its wall time in the node,
 * including the barrier before it, and that barrier's wait alone); on or off clears the sums.
 * llmrt_graph_profile copies the sums (ns, [n_nodes] each) and returns the runs they cover. */
void llmrt_graph_set_profile(llmrt_graph *g, int on);
int64_t llmrt_graph_profile(llmrt_graph *g, int64_t *ns, int64_t *wait_ns);
/* Nodes with less work than this (elements, or multiply-adds for mul_mat) run on thread 0 alone.
 * Default 32768; 0 shares every node (tests use it to exercise the parallel paths). */
int64_t llmrt_graph_single_work(const llmrt_graph *g);
void llmrt_graph_set_single_work(llmrt_graph *g, int64_t work);
const char *llmrt_op_name(int op);

static inline float llmrt_get_op_param_f32(const llmrt_tensor *t, int i) {
    union { int32_t i; float f; } u;
    u.i = t->op_params[i];
    return u.f;
}

static inline void llmrt_set_op_param_f32(llmrt_tensor *t, int i, float v) {
    union { int32_t i; float f; } u;
    u.f = v;
    t->op_params[i] = u.i;
}

#ifdef __cplusplus
}
#endif

#endif /* LLMRT_GRAPH_H */
