/*
 * graph.c — building, planning and running a compute graph (see llmrt/graph.h).
 *
 *   build time:  tensors are created by the op constructors below, each compute node appended
 *                to `nodes` in order; llmrt_graph_build() computes every tensor's lifetime,
 *                places intermediates in one arena with a best-fit allocator, and sizes the
 *                per-thread scratch.
 *   run time:    llmrt_graph_run() sets the token dims to this run's n / n_out, points the
 *                inputs at the caller's arrays, writes the new cells' positions into the cache,
 *                then every pool thread walks the node list: compute_forward() (the one switch
 *                over ops), with barriers between nodes.
 *
 * Barriers. A barrier costs little on an idle machine but a scheduling quantum when the cores
 * are oversubscribed, and decoding one token runs ~20 nodes per layer. So for each run shape
 * (n, n_out) the runner plans: a node with little work (single[i]) runs on thread 0 alone, and
 * a barrier goes before node j only if j conflicts with a node since the last barrier (reads
 * what it writes, or writes what it reads or writes: arena ranges, or the cache a KV_STORE
 * fills), unless both ran on thread 0, which orders them anyway.
 */
#include "llmrt/graph.h"
#include "llmrt/gemm.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmrt/amx.h"
#include "ops/ops.h"
#include "ops/rope_shift.h"

#define ARENA_ALIGN 64
/* Below this much work (about one element or multiply-add per unit) a node runs on thread 0:
 * sharing it would cost more in synchronization than it saves. */
#define SINGLE_THREAD_WORK 32768

typedef struct {
    size_t offs, size;
} free_block;

struct llmrt_graph {
    int max_tokens;
    int max_out;                 /* capacity of LLMRT_TOK_OUT dims (0 without OUT_ROWS input) */
    llmrt_threadpool *pool;

    llmrt_tensor **tensors;      /* [n_tensors], each malloc'd (pointers stay valid) */
    int n_tensors, cap_tensors;
    llmrt_tensor **nodes;        /* compute nodes in execution order */
    int n_nodes, cap_nodes;
    int inputs[LLMRT_INPUT_COUNT];
    int output;
    int has_attention;
    int built;

    void *arena;
    size_t arena_size;
    size_t tensor_bytes;         /* sum of arena tensor sizes, for comparison */
    void *wdata;                 /* per-thread scratch: n_threads * wstride bytes */
    size_t wstride;
    atomic_int *counters;        /* [n_nodes] chunk counters */
    uint8_t *single;             /* [n_nodes] 1: too little work to share, thread 0 runs it */
    uint8_t *barrier_before;     /* [n_nodes] 1: all threads meet before this node */
    int plan_n, plan_n_out;      /* the run shape `single` / `barrier_before` were made for */
    int n_barriers;
    int64_t single_work;         /* nodes with less work run on thread 0 (SINGLE_THREAD_WORK) */
    int profile;                 /* 1: thread 0 times every node (llmrt_graph_set_profile) */
    int64_t *prof_ns;            /* [n_nodes] thread 0's wall time in the node, its barrier included */
    int64_t *prof_wait_ns;       /* [n_nodes] of which waiting at the barrier before it */
    int64_t prof_runs;           /* runs timed since profiling was switched on */
    float **rope_tabs;           /* [n_rope_tabs] cos/sin tables of rope nodes (one per parameter set) */
    int n_rope_tabs;

    pthread_mutex_t run_lock;    /* one run at a time per graph */
    llmrt_run_ctx ctx;           /* the current run */
    llmrt_run_seq *seqs;         /* [max_tokens] the current run's sequences (ctx.seqs) */
    int32_t *tok_seq;            /* [max_tokens] the sequence of each token (ctx.tok_seq) */
};

static const char *op_names[LLMRT_OP_COUNT] = {
    [LLMRT_OP_NONE] = "weight",
    [LLMRT_OP_INPUT] = "input",
    [LLMRT_OP_GET_ROWS] = "get_rows",
    [LLMRT_OP_RMS_NORM] = "rms_norm",
    [LLMRT_OP_MUL] = "mul",
    [LLMRT_OP_ADD] = "add",
    [LLMRT_OP_SCALE] = "scale",
    [LLMRT_OP_QUANTIZE] = "quantize",
    [LLMRT_OP_MUL_MAT] = "mul_mat",
    [LLMRT_OP_RESHAPE] = "reshape",
    [LLMRT_OP_ROPE] = "rope",
    [LLMRT_OP_KV_STORE] = "kv_store",
    [LLMRT_OP_ATTENTION] = "attention",
    [LLMRT_OP_SILU] = "silu",
    [LLMRT_OP_GELU] = "gelu",
    [LLMRT_OP_GLU] = "glu",
    [LLMRT_OP_SOFTCAP] = "softcap",
    [LLMRT_OP_GET_ROWS_F32] = "get_rows_f32",
    [LLMRT_OP_KV_STORE_PRE] = "kv_store_pre",
    [LLMRT_OP_MOE_ROUTE] = "moe_route",
    [LLMRT_OP_MUL_MAT_ID] = "mul_mat_id",
    [LLMRT_OP_MOE_SUM] = "moe_sum",
};

const char *llmrt_op_name(int op) {
    if (op < 0 || op >= LLMRT_OP_COUNT || op_names[op] == NULL) return "unknown";
    return op_names[op];
}

/* ---- lifetime ---------------------------------------------------------------------------- */

llmrt_graph *llmrt_graph_new(int max_tokens, llmrt_threadpool *pool) {
    if (max_tokens < 1 || pool == NULL) return NULL;
    llmrt_ops_init();
    llmrt_graph *g = (llmrt_graph *)calloc(1, sizeof(*g));
    if (g == NULL) return NULL;
    g->max_tokens = max_tokens;
    g->seqs = (llmrt_run_seq *)calloc((size_t)max_tokens, sizeof(*g->seqs));
    g->tok_seq = (int32_t *)calloc((size_t)max_tokens, sizeof(*g->tok_seq));
    if (g->seqs == NULL || g->tok_seq == NULL) {
        free(g->seqs);
        free(g->tok_seq);
        free(g);
        return NULL;
    }
    g->pool = pool;
    g->output = -1;
    g->single_work = SINGLE_THREAD_WORK;
    for (int i = 0; i < LLMRT_INPUT_COUNT; i++) g->inputs[i] = -1;
    pthread_mutex_init(&g->run_lock, NULL);
    return g;
}

void llmrt_graph_free(llmrt_graph *g) {
    if (g == NULL) return;
    for (int i = 0; i < g->n_tensors; i++) free(g->tensors[i]);
    free(g->tensors);
    free(g->nodes);
    free(g->arena);
    free(g->wdata);
    free(g->counters);
    free(g->single);
    free(g->barrier_before);
    free(g->prof_ns);
    free(g->prof_wait_ns);
    for (int i = 0; i < g->n_rope_tabs; i++) free(g->rope_tabs[i]);
    free(g->rope_tabs);
    free(g->seqs);
    free(g->tok_seq);
    pthread_mutex_destroy(&g->run_lock);
    free(g);
}

/* ---- tensors ----------------------------------------------------------------------------- */

static llmrt_tensor *get(const llmrt_graph *g, int id) {
    if (id < 0 || id >= g->n_tensors) return NULL;
    return g->tensors[id];
}

static int is_act(const llmrt_tensor *t) {
    return t->tok_kind != LLMRT_TOK_NONE;
}

static int is_f32_act(const llmrt_tensor *t) {
    return t != NULL && is_act(t) && t->type == LLMRT_TYPE_F32;
}

static void set_strides(llmrt_tensor *t) {
    const llmrt_type_traits *tt = llmrt_type_traits_get(t->type);
    t->nb[0] = tt->type_size;
    t->nb[1] = llmrt_row_size(t->type, t->ne[0]);
    for (int d = 2; d < LLMRT_MAX_DIMS; d++) t->nb[d] = t->nb[d - 1] * (size_t)t->ne[d - 1];
}

/* A new tensor of `type` with ne[0..n_dims) (token dim included, at its capacity). */
static llmrt_tensor *new_tensor(llmrt_graph *g, int type, int op, int n_dims, const int64_t *ne,
                                int tok_kind) {
    if (g->n_tensors == g->cap_tensors) {
        const int cap = g->cap_tensors ? 2 * g->cap_tensors : 256;
        llmrt_tensor **nt = (llmrt_tensor **)realloc(g->tensors, (size_t)cap * sizeof(*nt));
        if (nt == NULL) return NULL;
        g->tensors = nt;
        g->cap_tensors = cap;
    }
    llmrt_tensor *t = (llmrt_tensor *)calloc(1, sizeof(*t));
    if (t == NULL) return NULL;
    t->id = g->n_tensors;
    t->type = type;
    t->op = op;
    t->n_dims = n_dims;
    for (int d = 0; d < LLMRT_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->tok_kind = tok_kind;
    t->tok_dim = tok_kind == LLMRT_TOK_NONE ? -1 : n_dims - 1;
    t->tok_cap = tok_kind == LLMRT_TOK_NONE ? 0 : ne[n_dims - 1];
    t->node = -1;
    t->last_use = -1;
    set_strides(t);
    g->tensors[g->n_tensors++] = t;
    return t;
}

static int push_node(llmrt_graph *g, llmrt_tensor *t) {
    if (g->n_nodes == g->cap_nodes) {
        const int cap = g->cap_nodes ? 2 * g->cap_nodes : 256;
        llmrt_tensor **nn = (llmrt_tensor **)realloc(g->nodes, (size_t)cap * sizeof(*nn));
        if (nn == NULL) return LLMRT_ENOMEM;
        g->nodes = nn;
        g->cap_nodes = cap;
    }
    t->node = g->n_nodes;
    g->nodes[g->n_nodes++] = t;
    return LLMRT_OK;
}

/* An f32 activation node shaped like `like` but with ne0 replaced (0 keeps it). */
static llmrt_tensor *new_act_like(llmrt_graph *g, int op, const llmrt_tensor *like, int64_t ne0,
                                  int type) {
    int64_t ne[LLMRT_MAX_DIMS];
    for (int d = 0; d < LLMRT_MAX_DIMS; d++) ne[d] = like->ne[d];
    ne[like->tok_dim] = like->tok_cap;
    if (ne0 > 0) ne[0] = ne0;
    llmrt_tensor *t = new_tensor(g, type, op, like->n_dims, ne, like->tok_kind);
    if (t == NULL) return NULL;
    if (push_node(g, t) != LLMRT_OK) return NULL; /* left unreachable; freed with the graph */
    return t;
}

static int same_shape(const llmrt_tensor *a, const llmrt_tensor *b) {
    if (a->tok_kind != b->tok_kind || a->n_dims != b->n_dims) return 0;
    for (int d = 0; d < a->n_dims; d++) {
        if (d == a->tok_dim) continue;
        if (a->ne[d] != b->ne[d]) return 0;
    }
    return 1;
}

#define CHECK_BUILDING(g) do { if ((g)->built) return LLMRT_EINVAL; } while (0)
#define RETURN_ID(t) do { if ((t) == NULL) return LLMRT_ENOMEM; return (t)->id; } while (0)

int llmrt_graph_weight(llmrt_graph *g, int type, const int64_t *ne, int n_dims, const void *data) {
    CHECK_BUILDING(g);
    const llmrt_type_traits *tt = llmrt_type_traits_get(type);
    if (tt == NULL) return LLMRT_EUNSUPPORTED;
    if (n_dims < 1 || n_dims > LLMRT_MAX_DIMS || data == NULL) return LLMRT_EINVAL;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] < 1) return LLMRT_EINVAL;
    }
    if (ne[0] % tt->blck_size != 0) return LLMRT_EINVAL;
    llmrt_tensor *t = new_tensor(g, type, LLMRT_OP_NONE, n_dims, ne, LLMRT_TOK_NONE);
    if (t == NULL) return LLMRT_ENOMEM;
    t->data = (void *)data;
    return t->id;
}

int llmrt_graph_weight_packed(llmrt_graph *g, int w, const llmrt_packed *p) {
    /* allowed before or after build: packed data is not arena, so the plan does not change */
    if (w < 0 || w >= g->n_tensors || p == NULL || p->data == NULL) return LLMRT_EINVAL;
    llmrt_tensor *t = g->tensors[w];
    if (t->op != LLMRT_OP_NONE || p->type != t->type || p->K != t->ne[0]) return LLMRT_EINVAL;
    if (t->n_dims <= 2) {
        if (p->M != t->ne[1]) return LLMRT_EINVAL;
    } else if (t->n_dims == 3) {      /* experts: whole groups per expert */
        if (p->M != t->ne[1] * t->ne[2] || p->R < 1 || t->ne[1] % p->R != 0) return LLMRT_EINVAL;
    } else {
        return LLMRT_EINVAL;
    }
    t->packed = p;
    return LLMRT_OK;
}

int llmrt_graph_weight_amx(llmrt_graph *g, int w, const llmrt_amx_packed *p) {
    if (w < 0 || w >= g->n_tensors || p == NULL || p->data == NULL) return LLMRT_EINVAL;
    llmrt_tensor *t = g->tensors[w];
    if (t->op != LLMRT_OP_NONE || p->wtype != t->type || p->K != t->ne[0]) return LLMRT_EINVAL;
    if (t->n_dims <= 2) {
        if (p->M != t->ne[1]) return LLMRT_EINVAL;
    } else if (t->n_dims == 3) {      /* experts: each expert's rows start on a row step */
        if (p->M != t->ne[1] * t->ne[2] || t->ne[1] % LLMRT_AMX_ROW_STEP != 0) return LLMRT_EINVAL;
    } else {
        return LLMRT_EINVAL;
    }
    t->amx = p;
    return LLMRT_OK;
}

int llmrt_graph_input(llmrt_graph *g, int which, int max_out) {
    CHECK_BUILDING(g);
    if (which < 0 || which >= LLMRT_INPUT_COUNT) return LLMRT_EINVAL;
    if (which == LLMRT_INPUT_OUT_ROWS && max_out < 1) return LLMRT_EINVAL;
    if (g->inputs[which] >= 0) {
        if (which == LLMRT_INPUT_OUT_ROWS && max_out != g->max_out) return LLMRT_EINVAL;
        return g->inputs[which];
    }
    const int is_out = which == LLMRT_INPUT_OUT_ROWS;
    const int64_t ne[1] = { is_out ? max_out : g->max_tokens };
    llmrt_tensor *t = new_tensor(g, LLMRT_TYPE_I32, LLMRT_OP_INPUT, 1, ne,
                                 is_out ? LLMRT_TOK_OUT : LLMRT_TOK_N);
    if (t == NULL) return LLMRT_ENOMEM;
    t->op_params[0] = which;
    g->inputs[which] = t->id;
    if (is_out) g->max_out = max_out;
    return t->id;
}

static int float_weight_type(int type) {
    return type == LLMRT_TYPE_F32 || type == LLMRT_TYPE_F16 || type == LLMRT_TYPE_BF16;
}

int llmrt_graph_get_rows(llmrt_graph *g, int w_id, int idx_id) {
    CHECK_BUILDING(g);
    llmrt_tensor *w = get(g, w_id), *idx = get(g, idx_id);
    if (w == NULL || idx == NULL || is_act(w) || w->ne[2] != 1 || w->ne[3] != 1) return LLMRT_EINVAL;
    if (idx->op != LLMRT_OP_INPUT || idx->op_params[0] != LLMRT_INPUT_TOKENS) return LLMRT_EINVAL;
    if (!float_weight_type(w->type) && llmrt_kernels()->dequant_row[w->type] == NULL) {
        return LLMRT_EUNSUPPORTED;
    }
    const int64_t ne[2] = { w->ne[0], idx->tok_cap };
    llmrt_tensor *t = new_tensor(g, LLMRT_TYPE_F32, LLMRT_OP_GET_ROWS, 2, ne, LLMRT_TOK_N);
    if (t == NULL || push_node(g, t) != LLMRT_OK) return LLMRT_ENOMEM;
    t->src[0] = w;
    t->src[1] = idx;
    return t->id;
}

int llmrt_graph_rms_norm(llmrt_graph *g, int x_id, float eps) {
    CHECK_BUILDING(g);
    llmrt_tensor *x = get(g, x_id);
    if (!is_f32_act(x)) return LLMRT_EINVAL;
    llmrt_tensor *t = new_act_like(g, LLMRT_OP_RMS_NORM, x, 0, LLMRT_TYPE_F32);
    if (t == NULL) return LLMRT_ENOMEM;
    t->src[0] = x;
    llmrt_set_op_param_f32(t, 0, eps);
    return t->id;
}

static int binary(llmrt_graph *g, int op, int a_id, int b_id) {
    CHECK_BUILDING(g);
    llmrt_tensor *a = get(g, a_id), *b = get(g, b_id);
    if (!is_f32_act(a) || b == NULL || !float_weight_type(b->type)) return LLMRT_EINVAL;
    if (is_act(b)) {
        if (b->type != LLMRT_TYPE_F32 || !same_shape(a, b)) return LLMRT_EINVAL;
    } else {
        /* a weight broadcast over a: each dim 1 or equal, and 1 along (and after) the token dim */
        for (int d = 0; d < LLMRT_MAX_DIMS; d++) {
            if (d >= a->tok_dim) {
                if (b->ne[d] != 1) return LLMRT_EINVAL;
            } else if (b->ne[d] != 1 && b->ne[d] != a->ne[d]) {
                return LLMRT_EINVAL;
            }
        }
    }
    llmrt_tensor *t = new_act_like(g, op, a, 0, LLMRT_TYPE_F32);
    if (t == NULL) return LLMRT_ENOMEM;
    t->src[0] = a;
    t->src[1] = b;
    return t->id;
}

int llmrt_graph_mul(llmrt_graph *g, int a, int b) { return binary(g, LLMRT_OP_MUL, a, b); }
int llmrt_graph_add(llmrt_graph *g, int a, int b) { return binary(g, LLMRT_OP_ADD, a, b); }

static int unary(llmrt_graph *g, int op, int x_id, float param) {
    CHECK_BUILDING(g);
    llmrt_tensor *x = get(g, x_id);
    if (!is_f32_act(x)) return LLMRT_EINVAL;
    llmrt_tensor *t = new_act_like(g, op, x, 0, LLMRT_TYPE_F32);
    if (t == NULL) return LLMRT_ENOMEM;
    t->src[0] = x;
    llmrt_set_op_param_f32(t, 0, param);
    return t->id;
}

int llmrt_graph_scale(llmrt_graph *g, int x, float s) { return unary(g, LLMRT_OP_SCALE, x, s); }
int llmrt_graph_silu(llmrt_graph *g, int x) { return unary(g, LLMRT_OP_SILU, x, 0.0f); }
int llmrt_graph_gelu(llmrt_graph *g, int x) { return unary(g, LLMRT_OP_GELU, x, 0.0f); }

int llmrt_graph_softcap(llmrt_graph *g, int x, float cap) {
    if (!(cap > 0.0f)) return LLMRT_EINVAL;
    return unary(g, LLMRT_OP_SOFTCAP, x, cap);
}

/* The hidden QUANTIZE node converting x to type vt (an existing one of the same x is reused:
 * q/k/v, gate/up), or x itself for F32. NULL on ENOMEM. */
static llmrt_tensor *quantized_input(llmrt_graph *g, llmrt_tensor *x, int vt) {
    if (vt == LLMRT_TYPE_F32) return x;
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        llmrt_tensor *nd = g->nodes[i];
        if (nd->op == LLMRT_OP_QUANTIZE && nd->src[0] == x && nd->type == vt) return nd;
    }
    llmrt_tensor *xin = new_act_like(g, LLMRT_OP_QUANTIZE, x, 0, vt);
    if (xin != NULL) xin->src[0] = x;
    return xin;
}

/* What a matmul by w reads of x: x in w's vec_dot_type (checked to exist), into *xin. */
static int matmul_input(llmrt_graph *g, const llmrt_tensor *w, llmrt_tensor *x, llmrt_tensor **xin) {
    const llmrt_kernel_table *kt = llmrt_kernels();
    const int vt = llmrt_type_traits_get(w->type)->vec_dot_type;
    if (kt->vec_dot[w->type] == NULL || vt < 0) return LLMRT_EUNSUPPORTED;
    if (vt != LLMRT_TYPE_F32) { /* F32 weights and the private WQ_*_F32 types take x as is */
        if (kt->quant_row[vt] == NULL && vt != LLMRT_TYPE_F16 && vt != LLMRT_TYPE_BF16) {
            return LLMRT_EUNSUPPORTED;
        }
        if (x->ne[0] % llmrt_type_traits_get(vt)->blck_size != 0) return LLMRT_EINVAL;
    }
    *xin = quantized_input(g, x, vt);
    return *xin != NULL ? LLMRT_OK : LLMRT_ENOMEM;
}

int llmrt_graph_mul_mat(llmrt_graph *g, int w_id, int x_id) {
    CHECK_BUILDING(g);
    llmrt_tensor *w = get(g, w_id), *x = get(g, x_id);
    if (w == NULL || is_act(w) || w->ne[2] != 1 || w->ne[3] != 1) return LLMRT_EINVAL;
    if (!is_f32_act(x) || x->ne[0] != w->ne[0]) return LLMRT_EINVAL;
    if (w->ne[0] > INT_MAX) return LLMRT_EINVAL;
    llmrt_tensor *xin = NULL;
    const int rc = matmul_input(g, w, x, &xin);
    if (rc != LLMRT_OK) return rc;
    llmrt_tensor *t = new_act_like(g, LLMRT_OP_MUL_MAT, x, w->ne[1], LLMRT_TYPE_F32);
    if (t == NULL) return LLMRT_ENOMEM;
    t->src[0] = w;
    t->src[1] = xin;
    return t->id;
}

int llmrt_graph_reshape(llmrt_graph *g, int x_id, const int64_t *ne, int n_dims) {
    CHECK_BUILDING(g);
    llmrt_tensor *x = get(g, x_id);
    if (!is_f32_act(x) || x->op == LLMRT_OP_INPUT) return LLMRT_EINVAL;
    if (n_dims < 1 || n_dims > LLMRT_MAX_DIMS - 1) return LLMRT_EINVAL;
    int64_t have = 1, want = 1;
    for (int d = 0; d < x->tok_dim; d++) have *= x->ne[d];
    int64_t nne[LLMRT_MAX_DIMS];
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] < 1) return LLMRT_EINVAL;
        want *= ne[d];
        nne[d] = ne[d];
    }
    if (have != want) return LLMRT_EINVAL;
    nne[n_dims] = x->tok_cap;
    llmrt_tensor *t = new_tensor(g, LLMRT_TYPE_F32, LLMRT_OP_RESHAPE, n_dims + 1, nne, x->tok_kind);
    if (t == NULL) return LLMRT_ENOMEM;
    t->src[0] = x;
    t->view_src = x->view_src ? x->view_src : x;
    return t->id;
}

int llmrt_graph_rope(llmrt_graph *g, int x_id, int pos_id, int ff_id, const llmrt_rope_params *p) {
    CHECK_BUILDING(g);
    llmrt_tensor *x = get(g, x_id), *pos = get(g, pos_id);
    llmrt_tensor *ff = ff_id >= 0 ? get(g, ff_id) : NULL;
    if (!is_f32_act(x) || x->n_dims != 3 || x->tok_kind != LLMRT_TOK_N) return LLMRT_EINVAL;
    if (pos == NULL || pos->op != LLMRT_OP_INPUT || pos->op_params[0] != LLMRT_INPUT_POSITIONS) {
        return LLMRT_EINVAL;
    }
    if (p->n_rot < 2 || p->n_rot % 2 != 0 || p->n_rot > x->ne[0]) return LLMRT_EINVAL;
    if (p->mode != LLMRT_ROPE_NORMAL && p->mode != LLMRT_ROPE_NEOX) return LLMRT_EINVAL;
    if (ff_id >= 0) {
        if (ff == NULL || is_act(ff) || ff->type != LLMRT_TYPE_F32 || ff->ne[0] < p->n_rot / 2) {
            return LLMRT_EINVAL;
        }
    }
    llmrt_tensor *t = new_act_like(g, LLMRT_OP_ROPE, x, 0, LLMRT_TYPE_F32);
    if (t == NULL) return LLMRT_ENOMEM;
    t->src[0] = x;
    t->src[1] = pos;
    t->src[2] = ff;
    t->op_params[0] = p->n_rot;
    t->op_params[1] = p->mode;
    t->op_params[2] = p->n_ctx_orig;
    llmrt_set_op_param_f32(t, 3, p->freq_base);
    llmrt_set_op_param_f32(t, 4, p->freq_scale);
    llmrt_set_op_param_f32(t, 5, p->ext_factor);
    llmrt_set_op_param_f32(t, 6, p->attn_factor);
    llmrt_set_op_param_f32(t, 7, p->beta_fast);
    llmrt_set_op_param_f32(t, 8, p->beta_slow);
    return t->id;
}

int llmrt_graph_attention(llmrt_graph *g, int q_id, int k_id, int v_id, int layer, float scale,
                          int n_swa, float softcap) {
    CHECK_BUILDING(g);
    llmrt_tensor *q = get(g, q_id), *k = get(g, k_id), *v = get(g, v_id);
    if (!is_f32_act(q) || !is_f32_act(k) || !is_f32_act(v)) return LLMRT_EINVAL;
    if (q->n_dims != 3 || k->n_dims != 3 || v->n_dims != 3) return LLMRT_EINVAL;
    if (q->tok_kind != LLMRT_TOK_N || k->tok_kind != LLMRT_TOK_N || v->tok_kind != LLMRT_TOK_N) {
        return LLMRT_EINVAL;
    }
    if (q->ne[0] != k->ne[0] || k->ne[1] != v->ne[1] || q->ne[1] % k->ne[1] != 0) return LLMRT_EINVAL;
    if (layer < 0 || n_swa < 0 || softcap < 0.0f) return LLMRT_EINVAL;
    /* KV_STORE: no memory of its own; it orders the cache writes before the reads. */
    const int64_t one[1] = { 1 };
    llmrt_tensor *st = new_tensor(g, LLMRT_TYPE_F32, LLMRT_OP_KV_STORE, 1, one, LLMRT_TOK_NONE);
    if (st == NULL || push_node(g, st) != LLMRT_OK) return LLMRT_ENOMEM;
    st->src[0] = k;
    st->src[1] = v;
    st->op_params[0] = layer;
    if (k->op == LLMRT_OP_ROPE) {
        /* KV_STORE_PRE: the pre-RoPE keys for the streaming cache's shift (ops/rope_shift.h) */
        llmrt_tensor *sp = new_tensor(g, LLMRT_TYPE_F32, LLMRT_OP_KV_STORE_PRE, 1, one, LLMRT_TOK_NONE);
        if (sp == NULL || push_node(g, sp) != LLMRT_OK) return LLMRT_ENOMEM;
        sp->src[0] = k->src[0];
        sp->src[1] = k;
        sp->src[2] = k->src[2];
        sp->op_params[0] = layer;
    }
    const int64_t ne[2] = { v->ne[0] * q->ne[1], q->tok_cap };
    llmrt_tensor *t = new_tensor(g, LLMRT_TYPE_F32, LLMRT_OP_ATTENTION, 2, ne, LLMRT_TOK_N);
    if (t == NULL || push_node(g, t) != LLMRT_OK) return LLMRT_ENOMEM;
    t->src[0] = q;
    t->src[1] = st;
    t->op_params[0] = layer;
    llmrt_set_op_param_f32(t, 1, scale);
    t->op_params[2] = n_swa;
    llmrt_set_op_param_f32(t, 3, softcap);
    g->has_attention = 1;
    return t->id;
}

int llmrt_graph_glu(llmrt_graph *g, int gate_id, int up_id, int act) {
    CHECK_BUILDING(g);
    llmrt_tensor *gate = get(g, gate_id), *up = get(g, up_id);
    if (!is_f32_act(gate) || !is_f32_act(up) || !same_shape(gate, up)) return LLMRT_EINVAL;
    if (act != LLMRT_GLU_SILU && act != LLMRT_GLU_GELU) return LLMRT_EINVAL;
    llmrt_tensor *t = new_act_like(g, LLMRT_OP_GLU, gate, 0, LLMRT_TYPE_F32);
    if (t == NULL) return LLMRT_ENOMEM;
    t->src[0] = gate;
    t->src[1] = up;
    t->op_params[0] = act;
    return t->id;
}

int llmrt_graph_get_rows_f32(llmrt_graph *g, int x_id, int rows_id) {
    CHECK_BUILDING(g);
    llmrt_tensor *x = get(g, x_id), *rows = get(g, rows_id);
    if (!is_f32_act(x) || x->tok_kind != LLMRT_TOK_N) return LLMRT_EINVAL;
    if (rows == NULL || rows->op != LLMRT_OP_INPUT || rows->op_params[0] != LLMRT_INPUT_OUT_ROWS) {
        return LLMRT_EINVAL;
    }
    int64_t ne[LLMRT_MAX_DIMS];
    for (int d = 0; d < x->n_dims; d++) ne[d] = x->ne[d];
    ne[x->tok_dim] = rows->tok_cap;
    llmrt_tensor *t = new_tensor(g, LLMRT_TYPE_F32, LLMRT_OP_GET_ROWS_F32, x->n_dims, ne, LLMRT_TOK_OUT);
    if (t == NULL || push_node(g, t) != LLMRT_OK) return LLMRT_ENOMEM;
    t->src[0] = x;
    t->src[1] = rows;
    return t->id;
}

int llmrt_graph_moe_route(llmrt_graph *g, int logits_id, int bias_id, int k, int gating, int norm,
                          float scale) {
    CHECK_BUILDING(g);
    llmrt_tensor *lg = get(g, logits_id);
    llmrt_tensor *bias = bias_id >= 0 ? get(g, bias_id) : NULL;
    if (!is_f32_act(lg) || lg->n_dims != 2) return LLMRT_EINVAL;
    if (k < 1 || k > lg->ne[0] || (gating != LLMRT_MOE_GATING_SOFTMAX && gating != LLMRT_MOE_GATING_SIGMOID)) {
        return LLMRT_EINVAL;
    }
    if (bias_id >= 0 && (bias == NULL || is_act(bias) || bias->type != LLMRT_TYPE_F32 ||
                         bias->ne[0] != lg->ne[0] || bias->ne[1] * bias->ne[2] * bias->ne[3] != 1)) {
        return LLMRT_EINVAL;
    }
    if (!isfinite(scale)) return LLMRT_EINVAL;
    llmrt_tensor *t = new_act_like(g, LLMRT_OP_MOE_ROUTE, lg, 2 * (int64_t)k, LLMRT_TYPE_F32);
    if (t == NULL) return LLMRT_ENOMEM;
    t->src[0] = lg;
    t->src[1] = bias;
    t->op_params[0] = k;
    t->op_params[1] = gating;
    t->op_params[2] = norm != 0;
    llmrt_set_op_param_f32(t, 3, scale);
    return t->id;
}

int llmrt_graph_mul_mat_id(llmrt_graph *g, int w_id, int x_id, int route_id, int up_id, int act) {
    CHECK_BUILDING(g);
    llmrt_tensor *w = get(g, w_id), *x = get(g, x_id), *route = get(g, route_id);
    llmrt_tensor *up = up_id >= 0 ? get(g, up_id) : NULL;
    if (w == NULL || is_act(w) || w->n_dims != 3 || w->ne[0] > INT_MAX) return LLMRT_EINVAL;
    if (route == NULL || route->op != LLMRT_OP_MOE_ROUTE || route->src[0]->ne[0] != w->ne[2]) {
        return LLMRT_EINVAL;
    }
    const int64_t k = route->op_params[0];
    if (!is_f32_act(x) || x->ne[0] != w->ne[0] || x->tok_kind != route->tok_kind) return LLMRT_EINVAL;
    if (!(x->n_dims == 2 || (x->n_dims == 3 && x->ne[1] == k))) return LLMRT_EINVAL;
    if (up_id >= 0) {
        if (up == NULL || is_act(up) || up->type != w->type || up->n_dims != 3) return LLMRT_EINVAL;
        for (int d = 0; d < 3; d++) {
            if (up->ne[d] != w->ne[d]) return LLMRT_EINVAL;
        }
        if (act != LLMRT_GLU_SILU && act != LLMRT_GLU_GELU) return LLMRT_EINVAL;
    } else if (act != -1) {
        return LLMRT_EINVAL;
    }
    llmrt_tensor *xin = NULL;
    const int rc = matmul_input(g, w, x, &xin);
    if (rc != LLMRT_OK) return rc;
    const int64_t ne[3] = { w->ne[1], k, x->tok_cap };
    llmrt_tensor *t = new_tensor(g, LLMRT_TYPE_F32, LLMRT_OP_MUL_MAT_ID, 3, ne, x->tok_kind);
    if (t == NULL || push_node(g, t) != LLMRT_OK) return LLMRT_ENOMEM;
    t->src[0] = w;
    t->src[1] = xin;
    t->src[2] = route;
    t->src[3] = up;
    t->op_params[0] = act;
    return t->id;
}

int llmrt_graph_moe_sum(llmrt_graph *g, int x_id, int route_id, int shared_id, int sgate_id) {
    CHECK_BUILDING(g);
    llmrt_tensor *x = get(g, x_id), *route = get(g, route_id);
    llmrt_tensor *sh = shared_id >= 0 ? get(g, shared_id) : NULL;
    llmrt_tensor *sg = sgate_id >= 0 ? get(g, sgate_id) : NULL;
    if (!is_f32_act(x) || x->n_dims != 3 || route == NULL || route->op != LLMRT_OP_MOE_ROUTE) return LLMRT_EINVAL;
    if (x->ne[1] != route->op_params[0] || x->tok_kind != route->tok_kind) return LLMRT_EINVAL;
    if ((shared_id >= 0) != (sgate_id >= 0)) return LLMRT_EINVAL;
    if (shared_id >= 0) {
        if (!is_f32_act(sh) || sh->n_dims != 2 || sh->ne[0] != x->ne[0] || sh->tok_kind != x->tok_kind) {
            return LLMRT_EINVAL;
        }
        if (!is_f32_act(sg) || sg->n_dims != 2 || sg->ne[0] != 1 || sg->tok_kind != x->tok_kind) return LLMRT_EINVAL;
    }
    const int64_t ne[2] = { x->ne[0], x->tok_cap };
    llmrt_tensor *t = new_tensor(g, LLMRT_TYPE_F32, LLMRT_OP_MOE_SUM, 2, ne, x->tok_kind);
    if (t == NULL || push_node(g, t) != LLMRT_OK) return LLMRT_ENOMEM;
    t->src[0] = x;
    t->src[1] = route;
    t->src[2] = sh;
    t->src[3] = sg;
    return t->id;
}

int llmrt_graph_set_output(llmrt_graph *g, int y_id) {
    CHECK_BUILDING(g);
    llmrt_tensor *y = get(g, y_id);
    if (!is_f32_act(y) || y->op == LLMRT_OP_INPUT) return LLMRT_EINVAL;
    g->output = y_id;
    return LLMRT_OK;
}

/* ---- planning ---------------------------------------------------------------------------- */

/* Best-fit allocator over offsets: `blocks` are the free ranges below `top`, sorted. */
typedef struct {
    free_block *blocks;
    int n, cap;
    size_t top, peak;
} planner;

static size_t align_up(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}

static int planner_alloc(planner *pl, size_t size, size_t *offs) {
    int best = -1;
    for (int i = 0; i < pl->n; i++) {
        if (pl->blocks[i].size >= size && (best < 0 || pl->blocks[i].size < pl->blocks[best].size)) {
            best = i;
        }
    }
    if (best >= 0) {
        *offs = pl->blocks[best].offs;
        pl->blocks[best].offs += size;
        pl->blocks[best].size -= size;
        if (pl->blocks[best].size == 0) {
            memmove(&pl->blocks[best], &pl->blocks[best + 1], (size_t)(pl->n - best - 1) * sizeof(free_block));
            pl->n--;
        }
        return LLMRT_OK;
    }
    /* Nothing fits: grow at the top, starting inside the last free range if it touches the top. */
    if (pl->n > 0 && pl->blocks[pl->n - 1].offs + pl->blocks[pl->n - 1].size == pl->top) {
        *offs = pl->blocks[pl->n - 1].offs;
        pl->n--;
    } else {
        *offs = pl->top;
    }
    pl->top = *offs + size;
    if (pl->top > pl->peak) pl->peak = pl->top;
    return LLMRT_OK;
}

static int planner_free(planner *pl, size_t offs, size_t size) {
    if (offs + size == pl->top) {  /* the topmost range: lower the top, absorbing a free range below */
        pl->top = offs;
        if (pl->n > 0 && pl->blocks[pl->n - 1].offs + pl->blocks[pl->n - 1].size == pl->top) {
            pl->top = pl->blocks[pl->n - 1].offs;
            pl->n--;
        }
        return LLMRT_OK;
    }
    int i = 0;
    while (i < pl->n && pl->blocks[i].offs < offs) i++;
    const int merge_prev = i > 0 && pl->blocks[i - 1].offs + pl->blocks[i - 1].size == offs;
    const int merge_next = i < pl->n && offs + size == pl->blocks[i].offs;
    if (merge_prev && merge_next) {
        pl->blocks[i - 1].size += size + pl->blocks[i].size;
        memmove(&pl->blocks[i], &pl->blocks[i + 1], (size_t)(pl->n - i - 1) * sizeof(free_block));
        pl->n--;
    } else if (merge_prev) {
        pl->blocks[i - 1].size += size;
    } else if (merge_next) {
        pl->blocks[i].offs = offs;
        pl->blocks[i].size += size;
    } else {
        if (pl->n == pl->cap) {
            const int cap = pl->cap ? 2 * pl->cap : 64;
            free_block *nb = (free_block *)realloc(pl->blocks, (size_t)cap * sizeof(*nb));
            if (nb == NULL) return LLMRT_ENOMEM;
            pl->blocks = nb;
            pl->cap = cap;
        }
        memmove(&pl->blocks[i + 1], &pl->blocks[i], (size_t)(pl->n - i) * sizeof(free_block));
        pl->blocks[i].offs = offs;
        pl->blocks[i].size = size;
        pl->n++;
    }
    return LLMRT_OK;
}

/* Tensors that own arena memory: computed activations (not inputs, views or KV_STORE). */
static int in_arena(const llmrt_tensor *t) {
    return t->node >= 0 && is_act(t);
}

static size_t op_wsize(const llmrt_tensor *t) {
    switch (t->op) {
    case LLMRT_OP_ROPE: return llmrt_rope_wsize(t);
    case LLMRT_OP_ATTENTION: return llmrt_attention_wsize(t);
    case LLMRT_OP_MUL_MAT: return llmrt_mul_mat_wsize(t);
    case LLMRT_OP_MOE_ROUTE: return llmrt_moe_route_wsize(t);
    case LLMRT_OP_MUL_MAT_ID: return llmrt_mul_mat_id_wsize(t);
    default: return 0;
    }
}

/* Fusion: rms_norm(x) * w, with w an F32 weight of ne0 values broadcast over the rest, becomes
 * one RMS_NORM node that multiplies by w as it writes (norm.c): y = (x * scale) * w, the same two
 * roundings as the two nodes, one pass over the rows and one node (and barrier) fewer. Done when
 * the MUL is the only reader of the norm (no view of it, not the output). The MUL tensor turns
 * into the fused node, so ids held by callers stay valid; the norm tensor leaves the node list. */
static void fuse_rms_norm_mul(llmrt_graph *g) {
    int *readers = (int *)calloc((size_t)g->n_tensors, sizeof(int));
    if (readers == NULL) return;                          /* no fusion: still correct */
    for (int i = 0; i < g->n_tensors; i++) {
        const llmrt_tensor *t = g->tensors[i];
        if (t->view_src != NULL) readers[t->view_src->id]++;
        for (int s = 0; s < LLMRT_MAX_SRC; s++) {
            if (t->src[s] != NULL) readers[t->src[s]->id]++;
        }
    }
    int fused = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        llmrt_tensor *m = g->nodes[i];
        llmrt_tensor *r = m->op == LLMRT_OP_MUL ? m->src[0] : NULL;
        llmrt_tensor *w = m->op == LLMRT_OP_MUL ? m->src[1] : NULL;
        if (r != NULL && r->op == LLMRT_OP_RMS_NORM && r->src[1] == NULL && readers[r->id] == 1 &&
            r->id != g->output && w != NULL && !is_act(w) && w->type == LLMRT_TYPE_F32 &&
            w->ne[0] == r->ne[0] && w->ne[1] * w->ne[2] * w->ne[3] == 1) {
            m->op = LLMRT_OP_RMS_NORM;
            m->src[0] = r->src[0];
            m->src[1] = w;
            memcpy(m->op_params, r->op_params, sizeof(m->op_params));
            r->src[0] = NULL;                             /* r: a dead tensor, no longer a node */
            r->node = -1;
            fused++;
        }
    }
    if (fused > 0) {
        int n = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            if (g->nodes[i]->node >= 0) g->nodes[n++] = g->nodes[i];
        }
        g->n_nodes = n;
        for (int i = 0; i < n; i++) g->nodes[i]->node = i;
    }
    free(readers);
}

/* Rope nodes with the same parameters, positions and freq_factors compute the same cos/sin per
 * token (Gemma 3: q and k of every local layer, and of every global one): they share one table,
 * filled by the first of them in a run and read by those after a barrier (plan_run). */
static int same_rope(const llmrt_tensor *a, const llmrt_tensor *b) {
    return a->src[1] == b->src[1] && a->src[2] == b->src[2] &&
           memcmp(a->op_params, b->op_params, sizeof(a->op_params)) == 0;
}

static int share_rope_tables(llmrt_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        llmrt_tensor *t = g->nodes[i];
        if (t->op != LLMRT_OP_ROPE) continue;
        t->rope_tab = NULL;
        t->rope_tab_mode = 0;
        for (int j = 0; j < i && t->rope_tab == NULL; j++) {
            if (g->nodes[j]->op == LLMRT_OP_ROPE && same_rope(g->nodes[j], t)) t->rope_tab = g->nodes[j]->rope_tab;
        }
        if (t->rope_tab != NULL) continue;
        llmrt_rope_params rp;
        llmrt_rope_params_from_node(t, &rp);
        float **nt = (float **)realloc(g->rope_tabs, (size_t)(g->n_rope_tabs + 1) * sizeof(*nt));
        if (nt == NULL) return LLMRT_ENOMEM;
        g->rope_tabs = nt;
        const size_t n = (size_t)(t->tok_cap > 0 ? t->tok_cap : 1) * (size_t)(rp.n_rot > 0 ? rp.n_rot : 1);
        float *tab = (float *)malloc(n * sizeof(float));
        if (tab == NULL) return LLMRT_ENOMEM;
        g->rope_tabs[g->n_rope_tabs++] = tab;
        t->rope_tab = tab;
    }
    return LLMRT_OK;
}

int llmrt_graph_build(llmrt_graph *g) {
    if (g->built || g->output < 0) return LLMRT_EINVAL;
    /* (what a failed earlier attempt may have left) */
    free(g->arena);
    free(g->wdata);
    free(g->counters);
    free(g->single);
    free(g->barrier_before);
    free(g->prof_ns);
    free(g->prof_wait_ns);
    g->arena = g->wdata = NULL;
    g->counters = NULL;
    g->single = g->barrier_before = NULL;
    g->prof_ns = g->prof_wait_ns = NULL;
    for (int i = 0; i < g->n_rope_tabs; i++) free(g->rope_tabs[i]);
    free(g->rope_tabs);
    g->rope_tabs = NULL;
    g->n_rope_tabs = 0;

    fuse_rms_norm_mul(g);
    if (share_rope_tables(g) != LLMRT_OK) return LLMRT_ENOMEM;

    /* Lifetimes: a tensor's memory is needed until the last node reading it or a view of it. */
    for (int i = 0; i < g->n_tensors; i++) g->tensors[i]->last_use = g->tensors[i]->node;
    for (int i = 0; i < g->n_nodes; i++) {
        llmrt_tensor *nd = g->nodes[i];
        for (int s = 0; s < LLMRT_MAX_SRC; s++) {
            llmrt_tensor *src = nd->src[s];
            if (src == NULL) continue;
            llmrt_tensor *base = src->view_src ? src->view_src : src;
            if (base->last_use < i) base->last_use = i;
        }
    }
    llmrt_tensor *out = g->tensors[g->output];
    (out->view_src ? out->view_src : out)->last_use = INT_MAX;

    /* Offsets: walk the nodes; allocate each output, then free what is dead after the node. */
    planner pl = { 0 };
    int rc = LLMRT_OK;
    size_t total = 0;
    for (int i = 0; i < g->n_nodes && rc == LLMRT_OK; i++) {
        llmrt_tensor *nd = g->nodes[i];
        if (in_arena(nd)) {  /* before any run, ne holds the capacity */
            nd->size = align_up(nd->nb[LLMRT_MAX_DIMS - 1] * (size_t)nd->ne[LLMRT_MAX_DIMS - 1], ARENA_ALIGN);
            total += nd->size;
            rc = planner_alloc(&pl, nd->size, &nd->offs);
        }
        for (int j = 0; j <= i && rc == LLMRT_OK; j++) {
            llmrt_tensor *t = g->nodes[j];
            if (in_arena(t) && t->last_use == i) rc = planner_free(&pl, t->offs, t->size);
        }
    }
    free(pl.blocks);
    if (rc != LLMRT_OK) return rc;

    g->arena_size = pl.peak > 0 ? pl.peak : ARENA_ALIGN;
    g->tensor_bytes = total;
    if (posix_memalign(&g->arena, ARENA_ALIGN, g->arena_size) != 0) {
        g->arena = NULL;
        return LLMRT_ENOMEM;
    }
    memset(g->arena, 0, g->arena_size);
    for (int i = 0; i < g->n_nodes; i++) {
        if (in_arena(g->nodes[i])) g->nodes[i]->data = (char *)g->arena + g->nodes[i]->offs;
    }
    for (int i = 0; i < g->n_tensors; i++) {
        llmrt_tensor *t = g->tensors[i];
        if (t->view_src != NULL) t->data = t->view_src->data;
    }

    /* Per-thread scratch. */
    size_t ws = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const size_t w = op_wsize(g->nodes[i]);
        if (w > ws) ws = w;
    }
    g->wstride = align_up(ws > 0 ? ws : 1, ARENA_ALIGN);
    const int nth = llmrt_threadpool_n_threads(g->pool);
    if (posix_memalign(&g->wdata, ARENA_ALIGN, g->wstride * (size_t)nth) != 0) {
        g->wdata = NULL;
        return LLMRT_ENOMEM;
    }
    g->counters = (atomic_int *)malloc((size_t)(g->n_nodes > 0 ? g->n_nodes : 1) * sizeof(atomic_int));
    if (g->counters == NULL) return LLMRT_ENOMEM;
    for (int i = 0; i < g->n_nodes; i++) atomic_init(&g->counters[i], 0);
    g->single = (uint8_t *)calloc((size_t)(g->n_nodes > 0 ? g->n_nodes : 1), 1);
    g->barrier_before = (uint8_t *)calloc((size_t)(g->n_nodes > 0 ? g->n_nodes : 1), 1);
    g->prof_ns = (int64_t *)calloc((size_t)(g->n_nodes > 0 ? g->n_nodes : 1), sizeof(int64_t));
    g->prof_wait_ns = (int64_t *)calloc((size_t)(g->n_nodes > 0 ? g->n_nodes : 1), sizeof(int64_t));
    if (g->single == NULL || g->barrier_before == NULL || g->prof_ns == NULL || g->prof_wait_ns == NULL) {
        return LLMRT_ENOMEM;
    }
    g->plan_n = g->plan_n_out = -1;
    g->built = 1;
    return LLMRT_OK;
}

/* ---- running ----------------------------------------------------------------------------- */

static int64_t nelements(const llmrt_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

static int64_t node_work(const llmrt_tensor *t) {
    switch (t->op) {
    case LLMRT_OP_MUL_MAT: return t->src[0]->ne[0] * nelements(t);
    case LLMRT_OP_MUL_MAT_ID: return t->src[0]->ne[0] * nelements(t) * (t->src[3] != NULL ? 2 : 1);
    case LLMRT_OP_MOE_ROUTE: return 8 * nelements(t->src[0]);
    case LLMRT_OP_MOE_SUM: return nelements(t->src[0]);   /* k products per output */
    case LLMRT_OP_ATTENTION: return INT64_MAX; /* grows with the cache: always shared */
    case LLMRT_OP_KV_STORE: return nelements(t->src[0]) + nelements(t->src[1]);
    case LLMRT_OP_KV_STORE_PRE: return nelements(t->src[0]);
    case LLMRT_OP_ROPE: return 4 * nelements(t);
    default: return nelements(t);
    }
}

/* The arena tensor whose memory t is (itself or the tensor it views), or NULL. */
static const llmrt_tensor *arena_mem(const llmrt_tensor *t) {
    const llmrt_tensor *base = t->view_src ? t->view_src : t;
    return in_arena(base) ? base : NULL;
}

static int overlap(const llmrt_tensor *x, const llmrt_tensor *y) {
    return x != NULL && y != NULL && x->offs < y->offs + y->size && y->offs < x->offs + x->size;
}

/* Must b wait for a (a earlier in the node list)? */
static int conflict(const llmrt_tensor *a, const llmrt_tensor *b) {
    const llmrt_tensor *wa = arena_mem(a), *wb = arena_mem(b);
    for (int s = 0; s < LLMRT_MAX_SRC; s++) {
        const llmrt_tensor *src = b->src[s];
        if (src == NULL) continue;
        if (src == a || overlap(arena_mem(src), wa)) return 1;  /* b reads a's output (or cache) */
    }
    for (int s = 0; s < LLMRT_MAX_SRC; s++) {
        if (a->src[s] != NULL && overlap(arena_mem(a->src[s]), wb)) return 1;  /* b overwrites a's input */
    }
    return overlap(wa, wb);
}

static void plan_run(llmrt_graph *g, int n, int n_out) {
    int seg = 0; /* first node since the last barrier */
    g->n_barriers = 0;
    for (int j = 0; j < g->n_nodes; j++) {
        const llmrt_tensor *b = g->nodes[j];
        g->single[j] = node_work(b) < g->single_work;
        int need = 0;
        for (int i = seg; i < j && !need; i++) {
            if (g->single[i] && g->single[j]) continue;
            need = conflict(g->nodes[i], b);
        }
        g->barrier_before[j] = (uint8_t)need;
        if (need) {
            seg = j;
            g->n_barriers++;
        }
    }
    /* Rope tables: shared only when the rope runs in token chunks (each row written by one
     * thread), i.e. n >= 2 * threads; a reader needs a barrier after the table's filler. */
    const int nth = llmrt_threadpool_n_threads(g->pool);
    int n_bar = 0, fill_bar[64];
    const float *fill_tab[64];
    int n_fill = 0;
    for (int j = 0; j < g->n_nodes; j++) {
        llmrt_tensor *t = g->nodes[j];
        n_bar += g->barrier_before[j];
        if (t->op != LLMRT_OP_ROPE) continue;
        t->rope_tab_mode = 0;
        if (t->rope_tab == NULL || n < 2 * nth) continue;
        int f = 0;
        while (f < n_fill && fill_tab[f] != t->rope_tab) f++;
        if (f == n_fill) {
            if (n_fill == 64) continue;             /* more parameter sets than that: own caches */
            fill_tab[n_fill] = t->rope_tab;
            fill_bar[n_fill++] = n_bar;
            t->rope_tab_mode = 1;
        } else if (n_bar > fill_bar[f]) {
            t->rope_tab_mode = 2;
        }
    }
    g->plan_n = n;
    g->plan_n_out = n_out;
}

/* The one switch that runs a node. */
static void compute_forward(const llmrt_compute_params *p, llmrt_tensor *t) {
    switch (t->op) {
    case LLMRT_OP_GET_ROWS: llmrt_compute_get_rows(p, t); break;
    case LLMRT_OP_RMS_NORM: llmrt_compute_rms_norm(p, t); break;
    case LLMRT_OP_MUL:
    case LLMRT_OP_ADD: llmrt_compute_binary(p, t); break;
    case LLMRT_OP_SCALE:
    case LLMRT_OP_SILU:
    case LLMRT_OP_GELU:
    case LLMRT_OP_SOFTCAP: llmrt_compute_unary(p, t); break;
    case LLMRT_OP_QUANTIZE: llmrt_compute_quantize(p, t); break;
    case LLMRT_OP_MUL_MAT: llmrt_compute_mul_mat(p, t); break;
    case LLMRT_OP_ROPE: llmrt_compute_rope(p, t); break;
    case LLMRT_OP_KV_STORE: llmrt_compute_kv_store(p, t); break;
    case LLMRT_OP_ATTENTION: llmrt_compute_attention(p, t); break;
    case LLMRT_OP_GLU: llmrt_compute_glu(p, t); break;
    case LLMRT_OP_GET_ROWS_F32: llmrt_compute_get_rows_f32(p, t); break;
    case LLMRT_OP_KV_STORE_PRE: llmrt_compute_kv_store_pre(p, t); break;
    case LLMRT_OP_MOE_ROUTE: llmrt_compute_moe_route(p, t); break;
    case LLMRT_OP_MUL_MAT_ID: llmrt_compute_mul_mat_id(p, t); break;
    case LLMRT_OP_MOE_SUM: llmrt_compute_moe_sum(p, t); break;
    default: break; /* NONE, INPUT, RESHAPE: nothing to compute */
    }
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void graph_worker(void *arg, int ith, int nth) {
    llmrt_graph *g = (llmrt_graph *)arg;
    llmrt_compute_params p;
    p.ith = ith;
    p.nth = nth;
    p.wdata = (char *)g->wdata + (size_t)ith * g->wstride;
    p.wsize = g->wstride;
    p.ctx = &g->ctx;
    const int prof = g->profile && ith == 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const int64_t t0 = prof ? now_ns() : 0;
        if (g->barrier_before[i]) llmrt_threadpool_barrier(g->pool);
        const int64_t t1 = prof ? now_ns() : 0;
        if (g->single[i] && ith != 0) continue;
        p.nth = g->single[i] ? 1 : nth;
        p.counter = &g->counters[i];
        compute_forward(&p, g->nodes[i]);
        if (prof) {
            g->prof_wait_ns[i] += t1 - t0;
            g->prof_ns[i] += now_ns() - t0;
        }
    }
}

/* Checks what would otherwise read or write out of bounds. */
static int check_run(const llmrt_graph *g, const llmrt_graph_inputs *in, llmrt_kv_cache *const *caches,
                     const int *n_tok, int n_seq) {
    if (!g->built || in == NULL || in->n < 1 || in->n > g->max_tokens) return LLMRT_EINVAL;
    if (g->inputs[LLMRT_INPUT_TOKENS] >= 0 && in->tokens == NULL) return LLMRT_EINVAL;
    if ((g->inputs[LLMRT_INPUT_POSITIONS] >= 0 || g->has_attention) && in->positions == NULL) {
        return LLMRT_EINVAL;
    }
    if (g->inputs[LLMRT_INPUT_OUT_ROWS] >= 0) {
        if (in->out_rows == NULL || in->n_out < 1 || in->n_out > g->max_out) return LLMRT_EINVAL;
        for (int j = 0; j < in->n_out; j++) {
            if (in->out_rows[j] < 0 || in->out_rows[j] >= in->n) return LLMRT_EINVAL;
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const llmrt_tensor *t = g->nodes[i];
        if (t->op != LLMRT_OP_GET_ROWS) continue;
        for (int j = 0; j < in->n; j++) {
            if (in->tokens[j] < 0 || in->tokens[j] >= t->src[0]->ne[1]) return LLMRT_EINVAL;
        }
    }
    if (!g->has_attention) return LLMRT_OK;   /* (a graph without attention ignores caches) */
    /* sequences: each a distinct cache holding a reservation of exactly its tokens, together
     * the run's n tokens, all of the first one's type */
    if (caches == NULL || n_tok == NULL || n_seq < 1 || n_seq > in->n) return LLMRT_EINVAL;
    int total = 0;
    for (int s = 0; s < n_seq; s++) {
        const llmrt_kv_cache *c = caches[s];
        if (c == NULL || n_tok[s] < 1 || c->n_pending != n_tok[s] || c->n_used + n_tok[s] > c->n_ctx ||
            c->type != caches[0]->type) {
            return LLMRT_EINVAL;
        }
        for (int r = 0; r < s; r++) {
            if (caches[r] == c) return LLMRT_EINVAL;
        }
        total += n_tok[s];
    }
    if (total != in->n) return LLMRT_EINVAL;
    for (int i = 0; i < g->n_nodes; i++) {
        const llmrt_tensor *t = g->nodes[i];
        if (t->op == LLMRT_OP_KV_STORE) {
            const int l = t->op_params[0];
            for (int s = 0; s < n_seq; s++) {
                const llmrt_kv_cache *c = caches[s];
                if (l >= c->n_layer || c->n_head_kv[l] != t->src[0]->ne[1] || c->hd_k[l] != t->src[0]->ne[0] ||
                    c->hd_v[l] != t->src[1]->ne[0]) {
                    return LLMRT_EINVAL;
                }
            }
        }
    }
    return LLMRT_OK;
}

/* Attention's scratch depends on the cache's size (llama.cpp's padded n_kv), known only at run
 * time: grow the per-thread scratch when a run needs more (once per larger cache, never per token). */
static int ensure_wsize(llmrt_graph *g, llmrt_kv_cache *const *caches, int n_seq) {
    if (!g->has_attention) return LLMRT_OK;
    int n_ctx = 0;
    for (int s = 0; s < n_seq; s++) n_ctx = caches[s]->n_ctx > n_ctx ? caches[s]->n_ctx : n_ctx;
    size_t ws = g->wstride;
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i]->op != LLMRT_OP_ATTENTION) continue;
        const size_t w = llmrt_attention_wsize_run(g->nodes[i], n_ctx);
        if (w > ws) ws = w;
    }
    if (ws <= g->wstride) return LLMRT_OK;
    ws = align_up(ws, ARENA_ALIGN);
    void *nw = NULL;
    const int nth = llmrt_threadpool_n_threads(g->pool);
    if (posix_memalign(&nw, ARENA_ALIGN, ws * (size_t)nth) != 0) return LLMRT_ENOMEM;
    free(g->wdata);
    g->wdata = nw;
    g->wstride = ws;
    return LLMRT_OK;
}

int llmrt_graph_run_seqs(llmrt_graph *g, const llmrt_graph_inputs *in, llmrt_kv_cache *const *caches,
                         const int *n_tok, int n_seq, float *out) {
    pthread_mutex_lock(&g->run_lock);
    int rc = check_run(g, in, caches, n_tok, n_seq);
    if (rc == LLMRT_OK) rc = ensure_wsize(g, caches, n_seq);
    if (rc != LLMRT_OK || out == NULL) {
        pthread_mutex_unlock(&g->run_lock);
        return rc != LLMRT_OK ? rc : LLMRT_EINVAL;
    }
    const int n_out = g->inputs[LLMRT_INPUT_OUT_ROWS] >= 0 ? in->n_out : 0;

    /* This run's shapes and inputs. */
    for (int i = 0; i < g->n_tensors; i++) {
        llmrt_tensor *t = g->tensors[i];
        if (t->tok_kind == LLMRT_TOK_N) t->ne[t->tok_dim] = in->n;
        if (t->tok_kind == LLMRT_TOK_OUT) t->ne[t->tok_dim] = n_out;
    }
    const void *input_data[LLMRT_INPUT_COUNT] = { in->tokens, in->positions, in->out_rows };
    for (int w = 0; w < LLMRT_INPUT_COUNT; w++) {
        if (g->inputs[w] >= 0) g->tensors[g->inputs[w]]->data = (void *)input_data[w];
    }
    g->ctx.n = in->n;
    g->ctx.n_out = n_out;
    g->ctx.positions = in->positions;
    g->ctx.cache = NULL;
    g->ctx.kv_first = 0;
    g->ctx.kv_cells = 0;
    g->ctx.n_seq = 0;
    g->ctx.seqs = g->seqs;
    g->ctx.tok_seq = g->tok_seq;
    g->ctx.kt = llmrt_kernels();
    if (g->has_attention) {
        int tok0 = 0;
        for (int s = 0; s < n_seq; s++) {
            llmrt_kv_cache *c = caches[s];
            llmrt_run_seq *sq = &g->seqs[s];
            sq->cache = c;
            sq->tok0 = tok0;
            sq->n = n_tok[s];
            sq->kv_first = c->first;
            sq->kv_cells = llmrt_kv_cache_n_cells(c);
            for (int i = 0; i < n_tok[s]; i++) {
                c->pos[c->first + i] = in->positions[tok0 + i];
                g->tok_seq[tok0 + i] = s;
            }
            tok0 += n_tok[s];
        }
        g->ctx.n_seq = n_seq;
        g->ctx.cache = caches[0];
        g->ctx.kv_first = g->seqs[0].kv_first;
        g->ctx.kv_cells = g->seqs[0].kv_cells;
    }
    for (int i = 0; i < g->n_nodes; i++) atomic_store(&g->counters[i], 0);
    if (in->n != g->plan_n || n_out != g->plan_n_out) plan_run(g, in->n, n_out);

    llmrt_threadpool_run(g->pool, graph_worker, g);
    if (g->profile) g->prof_runs++;

    const llmrt_tensor *y = g->tensors[g->output];
    memcpy(out, y->data, y->nb[y->tok_dim] * (size_t)y->ne[y->tok_dim]);
    if (g->has_attention) {
        for (int s = 0; s < n_seq; s++) llmrt_kv_cache_commit(caches[s], n_tok[s]);
    }
    for (int w = 0; w < LLMRT_INPUT_COUNT; w++) {
        if (g->inputs[w] >= 0) g->tensors[g->inputs[w]]->data = NULL;  /* not ours to keep */
    }
    pthread_mutex_unlock(&g->run_lock);
    return LLMRT_OK;
}

int llmrt_graph_run(llmrt_graph *g, const llmrt_graph_inputs *in, llmrt_kv_cache *cache, float *out) {
    const int n = in != NULL ? in->n : 0;
    return llmrt_graph_run_seqs(g, in, cache != NULL ? &cache : NULL, &n, cache != NULL ? 1 : 0, out);
}

/* ---- inspection -------------------------------------------------------------------------- */

const llmrt_tensor *llmrt_graph_tensor(const llmrt_graph *g, int id) { return get(g, id); }
int llmrt_graph_n_tensors(const llmrt_graph *g) { return g->n_tensors; }
int llmrt_graph_n_nodes(const llmrt_graph *g) { return g->n_nodes; }
int llmrt_graph_output(const llmrt_graph *g) { return g->output; }
int llmrt_graph_is_built(const llmrt_graph *g) { return g->built; }
int llmrt_graph_max_tokens(const llmrt_graph *g) { return g->max_tokens; }
int llmrt_graph_max_out(const llmrt_graph *g) { return g->max_out; }
size_t llmrt_graph_arena_bytes(const llmrt_graph *g) { return g->built ? g->arena_size : 0; }
size_t llmrt_graph_tensor_bytes(const llmrt_graph *g) { return g->tensor_bytes; }
int llmrt_graph_n_barriers(const llmrt_graph *g) { return g->built ? g->n_barriers : 0; }

void llmrt_graph_set_profile(llmrt_graph *g, int on) {
    pthread_mutex_lock(&g->run_lock);
    g->profile = on != 0;
    if (g->built) {
        memset(g->prof_ns, 0, (size_t)(g->n_nodes > 0 ? g->n_nodes : 1) * sizeof(int64_t));
        memset(g->prof_wait_ns, 0, (size_t)(g->n_nodes > 0 ? g->n_nodes : 1) * sizeof(int64_t));
    }
    g->prof_runs = 0;
    pthread_mutex_unlock(&g->run_lock);
}

int64_t llmrt_graph_profile(llmrt_graph *g, int64_t *ns, int64_t *wait_ns) {
    if (!g->built) return 0;
    pthread_mutex_lock(&g->run_lock);
    memcpy(ns, g->prof_ns, (size_t)g->n_nodes * sizeof(int64_t));
    memcpy(wait_ns, g->prof_wait_ns, (size_t)g->n_nodes * sizeof(int64_t));
    const int64_t runs = g->prof_runs;
    pthread_mutex_unlock(&g->run_lock);
    return runs;
}
int64_t llmrt_graph_single_work(const llmrt_graph *g) { return g->single_work; }

void llmrt_graph_set_single_work(llmrt_graph *g, int64_t work) {
    pthread_mutex_lock(&g->run_lock);
    g->single_work = work;
    g->plan_n = g->plan_n_out = -1;  /* replan on the next run */
    pthread_mutex_unlock(&g->run_lock);
}

int llmrt_graph_input_id(const llmrt_graph *g, int which) {
    if (which < 0 || which >= LLMRT_INPUT_COUNT) return -1;
    return g->inputs[which];
}
