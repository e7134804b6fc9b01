# Restates csrc/include/llmrt/{threadpool,kv_cache,graph}.h (and gemm.h's llmrt_pack_weight_mt) for Cython.
from libc.stdint cimport int32_t, int64_t
from c_llmrt cimport llmrt_packed


cdef extern from "llmrt/threadpool.h" nogil:
    ctypedef struct llmrt_threadpool:
        pass
    llmrt_threadpool *llmrt_threadpool_new(int n_threads)
    void llmrt_threadpool_free(llmrt_threadpool *tp)
    int llmrt_threadpool_n_threads(const llmrt_threadpool *tp)

cdef extern from "llmrt/gemm.h" nogil:
    # gemm.h's pool variant of llmrt_pack_weight (the rest of gemm.h is in c_llmrt.pxd)
    int llmrt_pack_weight_mt(int type, const void *src, size_t src_row_bytes, int64_t K, int64_t M,
                             llmrt_packed *out, llmrt_threadpool *tp)

cdef extern from "llmrt/kv_cache.h" nogil:
    ctypedef struct llmrt_rope_params:
        int n_rot
        int mode
        int n_ctx_orig
        float freq_base
        float freq_scale
        float ext_factor
        float attn_factor
        float beta_fast
        float beta_slow

    ctypedef struct llmrt_kv_cache:
        int n_layer
        int n_ctx
        int type
        int *n_head_kv
        int *hd_k
        int *hd_v
        void **k
        void **v
        int32_t *pos
        int n_used
        int n_pending
        int32_t *order
        int n_phys
        int first
        int32_t pos_offset
        float **k_pre
        llmrt_rope_params *rope
        float **rope_ff
        unsigned char *has_rope
        unsigned char *has_ff

    llmrt_kv_cache *llmrt_kv_cache_new(int n_layer, int n_ctx, const int *n_head_kv,
                                       const int *hd_k, const int *hd_v, int type)
    void llmrt_kv_cache_free(llmrt_kv_cache *c)
    size_t llmrt_kv_cache_k_cell_bytes(const llmrt_kv_cache *c, int l)
    void *llmrt_kv_cache_k_head(const llmrt_kv_cache *c, int l, int kh)
    void *llmrt_kv_cache_v_head(const llmrt_kv_cache *c, int l, int kh)
    size_t llmrt_kv_cache_v_cell_bytes(const llmrt_kv_cache *c, int l)
    void llmrt_kv_cache_clear(llmrt_kv_cache *c)
    int llmrt_kv_cache_prepare(llmrt_kv_cache *c, int n)
    int llmrt_kv_cache_truncate(llmrt_kv_cache *c, int n_used)
    int llmrt_kv_cache_n_cells(const llmrt_kv_cache *c)
    void llmrt_kv_cache_compact(llmrt_kv_cache *c)
    size_t llmrt_kv_cache_nbytes(const llmrt_kv_cache *c)
    int llmrt_kv_cache_enable_shift(llmrt_kv_cache *c)
    int llmrt_kv_cache_set_rope(llmrt_kv_cache *c, int l, const llmrt_rope_params *rp, const float *ff)
    int llmrt_kv_cache_evict(llmrt_kv_cache *c, int n_keep, int n_discard)
    int llmrt_kv_cache_rerope(llmrt_kv_cache *c, int c0, int c1)
    int llmrt_kv_cache_shift(llmrt_kv_cache *c, int n_keep, int n_discard)
    int llmrt_kv_cache_copy(llmrt_kv_cache *dst, const llmrt_kv_cache *src)
    size_t llmrt_kv_cache_state_bytes(const llmrt_kv_cache *c)
    int llmrt_kv_cache_state_save(const llmrt_kv_cache *c, void *buf, size_t size)
    int llmrt_kv_cache_state_load(llmrt_kv_cache *c, const void *buf, size_t size)

cdef extern from "llmrt/graph.h" nogil:
    enum:
        LLMRT_OP_NONE
        LLMRT_OP_INPUT
        LLMRT_OP_GET_ROWS
        LLMRT_OP_RMS_NORM
        LLMRT_OP_MUL
        LLMRT_OP_ADD
        LLMRT_OP_SCALE
        LLMRT_OP_QUANTIZE
        LLMRT_OP_MUL_MAT
        LLMRT_OP_RESHAPE
        LLMRT_OP_ROPE
        LLMRT_OP_KV_STORE
        LLMRT_OP_ATTENTION
        LLMRT_OP_SILU
        LLMRT_OP_GELU
        LLMRT_OP_GLU
        LLMRT_OP_SOFTCAP
        LLMRT_OP_GET_ROWS_F32
        LLMRT_OP_KV_STORE_PRE
        LLMRT_OP_MOE_ROUTE
        LLMRT_OP_MUL_MAT_ID
        LLMRT_OP_MOE_SUM
        LLMRT_OP_COUNT
    enum:
        LLMRT_TOK_NONE
        LLMRT_TOK_N
        LLMRT_TOK_OUT
    enum:
        LLMRT_INPUT_TOKENS
        LLMRT_INPUT_POSITIONS
        LLMRT_INPUT_OUT_ROWS
    enum:
        LLMRT_GLU_SILU
        LLMRT_GLU_GELU
    enum:
        LLMRT_MOE_GATING_SOFTMAX
        LLMRT_MOE_GATING_SIGMOID
    enum:
        LLMRT_ROPE_NORMAL
        LLMRT_ROPE_NEOX
        LLMRT_MAX_DIMS

    ctypedef struct llmrt_tensor:
        int id
        int type
        int op
        int n_dims
        int64_t ne[4]
        size_t nb[4]
        int tok_kind
        int tok_dim
        int64_t tok_cap
        void *data
        const llmrt_packed *packed
        const void *amx
        llmrt_tensor *src[4]
        llmrt_tensor *view_src
        int32_t op_params[16]
        int node
        int last_use
        size_t size
        size_t offs

    ctypedef struct llmrt_graph_inputs:
        int n
        const int32_t *tokens
        const int32_t *positions
        int n_out
        const int32_t *out_rows

    ctypedef struct llmrt_graph:
        pass

    llmrt_graph *llmrt_graph_new(int max_tokens, llmrt_threadpool *pool)
    void llmrt_graph_free(llmrt_graph *g)
    int llmrt_graph_weight(llmrt_graph *g, int type, const int64_t *ne, int n_dims, const void *data)
    int llmrt_graph_weight_packed(llmrt_graph *g, int w, const llmrt_packed *p)
    int llmrt_graph_weight_amx(llmrt_graph *g, int w, const void *p)
    int llmrt_graph_input(llmrt_graph *g, int which, int max_out)
    int llmrt_graph_get_rows(llmrt_graph *g, int w, int idx)
    int llmrt_graph_rms_norm(llmrt_graph *g, int x, float eps)
    int llmrt_graph_mul(llmrt_graph *g, int a, int b)
    int llmrt_graph_add(llmrt_graph *g, int a, int b)
    int llmrt_graph_scale(llmrt_graph *g, int a, float s)
    int llmrt_graph_mul_mat(llmrt_graph *g, int w, int x)
    int llmrt_graph_reshape(llmrt_graph *g, int x, const int64_t *ne, int n_dims)
    int llmrt_graph_rope(llmrt_graph *g, int x, int pos, int freq_factors, const llmrt_rope_params *p)
    int llmrt_graph_attention(llmrt_graph *g, int q, int k, int v, int layer, float scale, int n_swa,
                              float softcap)
    int llmrt_graph_silu(llmrt_graph *g, int x)
    int llmrt_graph_gelu(llmrt_graph *g, int x)
    int llmrt_graph_glu(llmrt_graph *g, int gate, int up, int act)
    int llmrt_graph_softcap(llmrt_graph *g, int x, float cap)
    int llmrt_graph_get_rows_f32(llmrt_graph *g, int x, int rows)
    int llmrt_graph_moe_route(llmrt_graph *g, int logits, int bias, int k, int gating, int norm,
                              float scale)
    int llmrt_graph_mul_mat_id(llmrt_graph *g, int w, int x, int route, int up, int act)
    int llmrt_graph_moe_sum(llmrt_graph *g, int x, int route, int shared, int shared_gate)
    int llmrt_graph_set_output(llmrt_graph *g, int y)
    int llmrt_graph_build(llmrt_graph *g)
    int llmrt_graph_run(llmrt_graph *g, const llmrt_graph_inputs *inp, llmrt_kv_cache *cache,
                        float *out)
    int llmrt_graph_run_seqs(llmrt_graph *g, const llmrt_graph_inputs *inp, llmrt_kv_cache **caches,
                             const int *n_tok, int n_seq, float *out)

    const llmrt_tensor *llmrt_graph_tensor(const llmrt_graph *g, int id)
    int llmrt_graph_n_tensors(const llmrt_graph *g)
    int llmrt_graph_n_nodes(const llmrt_graph *g)
    int llmrt_graph_output(const llmrt_graph *g)
    int llmrt_graph_input_id(const llmrt_graph *g, int which)
    int llmrt_graph_is_built(const llmrt_graph *g)
    int llmrt_graph_max_tokens(const llmrt_graph *g)
    int llmrt_graph_max_out(const llmrt_graph *g)
    size_t llmrt_graph_arena_bytes(const llmrt_graph *g)
    size_t llmrt_graph_tensor_bytes(const llmrt_graph *g)
    int llmrt_graph_n_barriers(const llmrt_graph *g)
    void llmrt_graph_set_profile(llmrt_graph *g, int on)
    int64_t llmrt_graph_profile(llmrt_graph *g, int64_t *ns, int64_t *wait_ns)
    int64_t llmrt_graph_single_work(const llmrt_graph *g)
    void llmrt_graph_set_single_work(llmrt_graph *g, int64_t work)
    const char *llmrt_op_name(int op)
