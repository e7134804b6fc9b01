# Compute graph, thread pool and KV cache (csrc/graph.c, csrc/ops/, csrc/threadpool.c,
# csrc/kv_cache.c).
#
# Every op method checks shapes and types here and raises ValueError naming the op
# ("[mul_mat] w.ne0 (64) != x.ne0 (32)") before C is called; C then only builds the node.
# Graph.run validates the run's inputs, releases the GIL and returns a new float32 array.
from c_graph cimport *
from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

# ggml type ids used here (the full list is llmrt.h's llmrt_type)
_T_F32 = 0
_T_F16 = 1
_T_I32 = 26
_T_BF16 = 30

_ROPE_MODES = (0, 2)
_GLU_ACTS = {"silu": LLMRT_GLU_SILU, "gelu": LLMRT_GLU_GELU}
_MOE_GATING = {"softmax": LLMRT_MOE_GATING_SOFTMAX, "sigmoid": LLMRT_MOE_GATING_SIGMOID}


cdef class Graph


def _type_name(int type_id):
    cdef const llmrt_type_traits *tt = llmrt_type_traits_get(type_id)
    return tt.name.decode() if tt != NULL else f"type {type_id}"


cdef class ThreadPool:
    """A pool of n_threads - 1 worker threads (the calling thread is the n-th), started once."""
    cdef llmrt_threadpool *tp
    cdef readonly int n_threads

    def __cinit__(self, int n_threads):
        if n_threads < 1:
            raise ValueError(f"[threadpool] n_threads must be >= 1, got {n_threads}")
        self.tp = llmrt_threadpool_new(n_threads)
        if self.tp == NULL:
            raise MemoryError(f"[threadpool] could not start {n_threads} threads")
        self.n_threads = n_threads

    def __dealloc__(self):
        if self.tp != NULL:
            llmrt_threadpool_free(self.tp)
            self.tp = NULL


_pools = {}


def thread_pool(int n_threads):
    """The process-wide pool with n_threads threads (created on first use, then shared by every
    Graph that asks for that many threads)."""
    pool = _pools.get(n_threads)
    if pool is None:
        pool = ThreadPool(n_threads)
        _pools[n_threads] = pool
    return pool


cdef class KVCache:
    """Per-layer K and V cells [n_ctx, n_head_kv, hd] in f16 (default) or f32, one positions
    array shared by all layers, and n_used. n_head_kv, hd_k and hd_v are ints or per-layer
    lists (Gemma-style per-layer shapes)."""
    cdef llmrt_kv_cache *c
    cdef readonly str dtype

    def __cinit__(self, int n_layer, int n_ctx, n_head_kv, hd_k, hd_v, dtype="f16"):
        if n_layer < 1:
            raise ValueError(f"[kv_cache] n_layer must be >= 1, got {n_layer}")
        if n_ctx < 1:
            raise ValueError(f"[kv_cache] n_ctx must be >= 1, got {n_ctx}")
        if dtype not in ("f16", "f32"):
            raise ValueError(f"[kv_cache] dtype must be 'f16' or 'f32', got {dtype!r}")
        shapes = []
        for name, val in (("n_head_kv", n_head_kv), ("hd_k", hd_k), ("hd_v", hd_v)):
            vals = [int(v) for v in val] if hasattr(val, "__len__") else [int(val)] * n_layer
            if len(vals) != n_layer:
                raise ValueError(f"[kv_cache] {name} has {len(vals)} entries, expected n_layer = {n_layer}")
            if min(vals) < 1:
                raise ValueError(f"[kv_cache] {name} must be >= 1, got {min(vals)}")
            shapes.append(np.ascontiguousarray(vals, dtype=np.intc))
        cdef int[::1] nkv = shapes[0]
        cdef int[::1] hk = shapes[1]
        cdef int[::1] hv = shapes[2]
        self.c = llmrt_kv_cache_new(n_layer, n_ctx, &nkv[0], &hk[0], &hv[0],
                                    _T_F16 if dtype == "f16" else _T_F32)
        if self.c == NULL:
            raise MemoryError(f"[kv_cache] could not allocate {n_layer} layers x {n_ctx} cells")
        self.dtype = dtype

    def __dealloc__(self):
        if self.c != NULL:
            llmrt_kv_cache_free(self.c)
            self.c = NULL

    @property
    def n_layer(self):
        return self.c.n_layer

    @property
    def n_ctx(self):
        return self.c.n_ctx

    @property
    def n_used(self):
        return self.c.n_used

    @property
    def n_pending(self):
        """Cells reserved by prepare() for the next run (0 when none)."""
        return self.c.n_pending

    def layer_shape(self, int layer):
        """(n_head_kv, hd_k, hd_v) of a layer."""
        self._check_layer(layer)
        return (self.c.n_head_kv[layer], self.c.hd_k[layer], self.c.hd_v[layer])

    def _check_layer(self, int layer):
        if layer < 0 or layer >= self.c.n_layer:
            raise ValueError(f"[kv_cache] layer {layer} out of range [0, {self.c.n_layer})")

    def order(self):
        """The cell of each token, in token order, int32 [n_used] (a copy). Evictions leave
        holes that later tokens fill, so cells need not be in token order."""
        cdef int n = self.c.n_used
        out = np.empty(max(n, 1), dtype=np.int32)
        cdef int32_t[::1] o = out
        memcpy(&o[0], self.c.order, <size_t>n * sizeof(int32_t))
        return out[:n]

    @property
    def n_cells(self):
        """Cells attention reads (every live cell is below)."""
        return llmrt_kv_cache_n_cells(self.c)

    @property
    def pos_offset(self):
        """How far shift() has turned positions forward (kv_cache.h): the next token's position
        is the last one's + 1, which is (tokens in the cache) + pos_offset in a session."""
        return self.c.pos_offset

    def compact(self):
        """Move the cells into token order (contents and positions unchanged)."""
        if self.c.n_pending:
            raise ValueError(f"[kv_cache] compact: {self.c.n_pending} cells are reserved for a run")
        llmrt_kv_cache_compact(self.c)

    def positions(self):
        """Positions of the tokens, in token order, int32 [n_used] (a copy)."""
        cdef int n = self.c.n_used
        out = np.empty(max(n, 1), dtype=np.int32)
        cdef int32_t[::1] o = out
        cdef int j
        for j in range(n):
            o[j] = self.c.pos[self.c.order[j]]
        return out[:n]

    cdef object _gather(self, const unsigned char *base, size_t cell):
        """The cells of the tokens, in token order: [n_used * cell] bytes (a copy)."""
        cdef int n = self.c.n_used
        raw = np.empty(cell * <size_t>n + 1, dtype=np.uint8)  # + 1: &r[0] exists even when empty
        cdef unsigned char[::1] r = raw
        cdef int j
        for j in range(n):
            memcpy(&r[<size_t>j * cell], base + <size_t>self.c.order[j] * cell, cell)
        return raw[:cell * <size_t>n]

    def _cells(self, int layer, bint want_k):
        self._check_layer(layer)
        cdef int nh = self.c.n_head_kv[layer]
        cdef int hd = self.c.hd_k[layer] if want_k else self.c.hd_v[layer]
        cdef size_t row = <size_t>hd * (2 if self.dtype == "f16" else 4)
        dt = np.float16 if self.dtype == "f16" else np.float32
        out = np.empty((self.c.n_used, nh, hd), dtype=dt)
        cdef int h
        cdef const unsigned char *head
        for h in range(nh):     # the cache is head-major: each head's cells, gathered in token order
            if want_k:
                head = <const unsigned char *>llmrt_kv_cache_k_head(self.c, layer, h)
            else:
                head = <const unsigned char *>llmrt_kv_cache_v_head(self.c, layer, h)
            out[:, h, :] = self._gather(head, row).view(dt).reshape(self.c.n_used, hd)
        return out

    def k(self, int layer):
        """Keys of the tokens of a layer, in token order, [n_used, n_head_kv, hd_k] (a copy)."""
        return self._cells(layer, True)

    def v(self, int layer):
        """Values of the tokens of a layer, in token order, [n_used, n_head_kv, hd_v] (a copy)."""
        return self._cells(layer, False)

    def clear(self):
        llmrt_kv_cache_clear(self.c)

    def prepare(self, int n):
        """Reserve n consecutive free cells for the next run; returns the first cell index."""
        if n < 1:
            raise ValueError(f"[kv_cache] prepare: n must be >= 1, got {n}")
        rc = llmrt_kv_cache_prepare(self.c, n)
        if rc < 0:
            raise ValueError(f"[kv_cache] prepare: {n} new cells do not fit: n_used {self.c.n_used}"
                             f" + {n} > n_ctx {self.c.n_ctx}")
        return rc

    def truncate(self, int n_used):
        """Keep the first n_used tokens (drops any reservation)."""
        if n_used < 0 or n_used > self.c.n_used:
            raise ValueError(f"[kv_cache] truncate: n_used must be in [0, {self.c.n_used}], got {n_used}")
        llmrt_kv_cache_truncate(self.c, n_used)

    # ---- streaming (see csrc/include/llmrt/kv_cache.h) --------------------------------------

    @property
    def nbytes(self):
        """Bytes the cache allocated (K, V, positions and, with shift, the master keys)."""
        return llmrt_kv_cache_nbytes(self.c)

    @property
    def has_shift(self):
        """True once enable_shift() has allocated the pre-RoPE master keys."""
        return self.c.k_pre != NULL

    def enable_shift(self):
        """Keep an f32 copy of every key before RoPE (filled by graph runs), so that shift()
        recomputes moved keys as one rotation of the exact master: no drift. Empty cache only."""
        rc = llmrt_kv_cache_enable_shift(self.c)
        if rc == LLMRT_ENOMEM:
            raise MemoryError("[kv_cache] enable_shift: out of memory")
        if rc < 0:
            raise ValueError(f"[kv_cache] enable_shift: the cache must be empty (n_used "
                             f"{self.c.n_used})")

    def _check_evict(self, str op, int n_keep, int n_discard):
        if self.c.n_pending:
            raise ValueError(f"[kv_cache] {op}: {self.c.n_pending} cells are reserved for a run")
        if n_keep < 0 or n_discard < 1 or n_keep + n_discard > self.c.n_used:
            raise ValueError(f"[kv_cache] {op}: need 0 <= n_keep ({n_keep}), 1 <= n_discard "
                             f"({n_discard}) and n_keep + n_discard <= n_used ({self.c.n_used})")

    def evict(self, int n_keep, int n_discard):
        """Drop tokens [n_keep, n_keep + n_discard) (their cells become holes); the later tokens'
        positions drop by n_discard. Keys are NOT re-rotated (see shift())."""
        self._check_evict("evict", n_keep, n_discard)
        llmrt_kv_cache_evict(self.c, n_keep, n_discard)

    def rerope(self, int c0=0, c1=None):
        """Working K of tokens [c0, c1) := RoPE(master key, the token's position), per layer with
        the rope parameters the graph registered. Needs enable_shift()."""
        cdef int e = self.c.n_used if c1 is None else c1
        if not self.has_shift:
            raise ValueError("[kv_cache] rerope: no master keys (call enable_shift() first)")
        if c0 < 0 or e < c0 or e > self.c.n_used:
            raise ValueError(f"[kv_cache] rerope: tokens [{c0}, {e}) not within [0, {self.c.n_used})")
        llmrt_kv_cache_rerope(self.c, c0, e)

    def shift(self, int n_keep, int n_discard):
        """Drop tokens [n_keep, n_keep + n_discard) and turn the n_keep sinks forward by
        n_discard positions (re-roped from their master keys) instead of every later key back:
        the same relative positions, O(n_keep) work (kv_cache.h). pos_offset grows by n_discard;
        once it reaches n_ctx, every key is re-roped back down (pos_offset 0)."""
        if not self.has_shift:
            raise ValueError("[kv_cache] shift: no master keys (call enable_shift() first)")
        self._check_evict("shift", n_keep, n_discard)
        llmrt_kv_cache_shift(self.c, n_keep, n_discard)

    def copy_from(self, KVCache other):
        """Make this cache an exact copy of `other` (same shapes, dtype and shift setting)."""
        rc = llmrt_kv_cache_copy(self.c, other.c)
        if rc < 0:
            raise ValueError(f"[kv_cache] copy_from: {other!r} does not have this cache's shapes, "
                             f"dtype and shift setting ({self!r}, shift {self.has_shift})")

    def state(self):
        """The cache's state image as bytes (kv_cache.h): cells, positions, token order, master
        keys and rope registrations. load_state() of it gives this cache back, cell for cell."""
        if self.c.n_pending:
            raise ValueError(f"[kv_cache] state: {self.c.n_pending} cells are reserved for a run")
        cdef size_t n = llmrt_kv_cache_state_bytes(self.c)
        buf = bytearray(n)
        cdef unsigned char[::1] b = buf
        if llmrt_kv_cache_state_save(self.c, &b[0], n) != 0:
            raise RuntimeError("[kv_cache] state: could not write the image")
        return bytes(buf)

    def load_state(self, data):
        """Replace this cache's contents with a state() image of a cache of the same shapes,
        dtype, n_ctx and shift setting. ValueError (and this cache unchanged) otherwise."""
        cdef const unsigned char[::1] b = memoryview(bytes(data)).cast("B") if len(data) else None
        if b is None or llmrt_kv_cache_state_load(self.c, &b[0], b.shape[0]) != 0:
            raise ValueError("[kv_cache] load_state: the image does not fit this cache (other shapes, "
                             "dtype, size or shift setting, or damaged)")

    def k_pre(self, int layer):
        """Master (pre-RoPE) keys of the tokens, in token order, f32 [n_used, n_head_kv, hd_k]
        (a copy)."""
        self._check_layer(layer)
        if not self.has_shift:
            raise ValueError("[kv_cache] k_pre: no master keys (call enable_shift() first)")
        cdef int nkv = self.c.n_head_kv[layer]
        cdef int hd = self.c.hd_k[layer]
        raw = self._gather(<const unsigned char *>self.c.k_pre[layer], <size_t>nkv * hd * sizeof(float))
        return raw.view(np.float32).reshape(self.c.n_used, nkv, hd)

    def rope_params(self, int layer):
        """The key RoPE a graph run registered for `layer` (a dict), or None."""
        self._check_layer(layer)
        if not self.has_shift or not self.c.has_rope[layer]:
            return None
        cdef llmrt_rope_params r = self.c.rope[layer]
        d = dict(n_rot=r.n_rot, mode=r.mode, n_ctx_orig=r.n_ctx_orig, freq_base=r.freq_base,
                 freq_scale=r.freq_scale, ext_factor=r.ext_factor, attn_factor=r.attn_factor,
                 beta_fast=r.beta_fast, beta_slow=r.beta_slow, freq_factors=None)
        if self.c.has_ff[layer]:
            d["freq_factors"] = np.array([self.c.rope_ff[layer][i] for i in range(r.n_rot // 2)],
                                         dtype=np.float32)
        return d

    def __repr__(self):
        return (f"KVCache(n_layer={self.c.n_layer}, n_ctx={self.c.n_ctx}, n_used={self.c.n_used}, "
                f"dtype={self.dtype!r})")


cdef class Tensor:
    """A handle to a tensor of a Graph. ne is in ggml order (ne[0] = row length); for
    activations the last entry is the token dim at its capacity (token_dim says which)."""
    cdef readonly Graph graph
    cdef readonly int id
    cdef public str name         # a weight's tensor name in its file (set by the loader), or None

    def __cinit__(self, Graph graph, int id):
        self.graph = graph
        self.id = id
        self.name = None

    cdef const llmrt_tensor *t(self):
        return llmrt_graph_tensor(self.graph.g, self.id)

    @property
    def type_id(self):
        return self.t().type

    @property
    def type_name(self):
        return _type_name(self.t().type)

    @property
    def n_dims(self):
        return self.t().n_dims

    @property
    def ne(self):
        cdef const llmrt_tensor *t = self.t()
        ne = [t.ne[d] for d in range(t.n_dims)]
        if t.tok_dim >= 0:
            ne[t.tok_dim] = t.tok_cap
        return tuple(ne)

    @property
    def token_dim(self):
        """Index of the token dim, or None for weights."""
        cdef int d = self.t().tok_dim
        return None if d < 0 else d

    @property
    def is_weight(self):
        return self.t().tok_kind == LLMRT_TOK_NONE

    @property
    def op(self):
        return llmrt_op_name(self.t().op).decode()

    @property
    def described(self):
        """Its type and, for a weight that has one, its name: the way op errors name it."""
        return f"{self.type_name} ({self.name})" if self.name else self.type_name

    def __repr__(self):
        name = f" {self.name}" if self.name else ""
        return f"Tensor({self.op}{name}, {self.type_name}, ne={self.ne})"


cdef class Graph:
    """A compute graph built once for up to max_tokens tokens per run and run many times.

    Weights are zero-copy views of numpy arrays (the graph keeps a reference). Activations are
    f32 with the token dim last. build() plans the arena; run() executes on n_threads threads.
    """
    cdef llmrt_graph *g
    cdef readonly ThreadPool pool
    cdef readonly int max_tokens
    cdef list _keep              # arrays whose memory weights point into
    cdef int _vocab              # smallest row count of a get_rows weight (-1 if none)
    cdef list _attn              # (layer, n_head_kv, hd_k, hd_v) per attention node
    cdef object _cache           # the cache given to attention(), used when run() gets none
    cdef dict _packs             # packed copies of mul_mat weights, by (address, type, K, M)
    cdef readonly bint pack      # repack mul_mat weights of types with a packed path (gemm.h)

    def __cinit__(self, int max_tokens, int n_threads, packs=None, bint pack=True):
        """packs: a dict shared by graphs over the same weights (a model's batch buckets), so
        each weight is packed once; pack=False keeps every weight plain (vec_dot path)."""
        if max_tokens < 1:
            raise ValueError(f"[graph] max_tokens must be >= 1, got {max_tokens}")
        if n_threads < 1:
            raise ValueError(f"[graph] n_threads must be >= 1, got {n_threads}")
        self.pool = thread_pool(n_threads)
        self.g = llmrt_graph_new(max_tokens, self.pool.tp)
        if self.g == NULL:
            raise MemoryError("[graph] out of memory")
        self.max_tokens = max_tokens
        self._keep = []
        self._vocab = -1
        self._attn = []
        self._cache = None
        self._packs = {} if packs is None else packs
        self.pack = pack

    def __dealloc__(self):
        if self.g != NULL:
            llmrt_graph_free(self.g)
            self.g = NULL

    # ---- helpers ----------------------------------------------------------------------------

    cdef Tensor _new(self, int rc, str op):
        if rc >= 0:
            return Tensor(self, rc)
        if rc == LLMRT_ENOMEM:
            raise MemoryError(f"[{op}] out of memory")
        if rc == LLMRT_EUNSUPPORTED:
            raise RuntimeError(f"[{op}] not supported: no kernel for this type in the kernel table")
        raise ValueError(f"[{op}] invalid arguments")

    cdef _building(self, str op):
        if llmrt_graph_is_built(self.g):
            raise RuntimeError(f"[{op}] the graph is already built; no more nodes")

    cdef const llmrt_tensor *_tensor(self, x, str op, str name) except NULL:
        if not isinstance(x, Tensor) or (<Tensor>x).graph is not self:
            raise ValueError(f"[{op}] {name} must be a Tensor of this graph, got {type(x).__name__}")
        return llmrt_graph_tensor(self.g, (<Tensor>x).id)

    cdef const llmrt_tensor *_act(self, x, str op, str name) except NULL:
        cdef const llmrt_tensor *t = self._tensor(x, op, name)
        if t.tok_kind == LLMRT_TOK_NONE or t.type != _T_F32 or t.op == LLMRT_OP_INPUT:
            raise ValueError(f"[{op}] {name} must be an f32 activation, got {x!r}")
        return t

    cdef const llmrt_tensor *_weight(self, x, str op, str name) except NULL:
        cdef const llmrt_tensor *t = self._tensor(x, op, name)
        if t.tok_kind != LLMRT_TOK_NONE:
            raise ValueError(f"[{op}] {name} must be a weight, got {x!r}")
        return t

    cdef _input(self, x, int which, str op, str name, str maker):
        cdef const llmrt_tensor *t = self._tensor(x, op, name)
        if t.op != LLMRT_OP_INPUT or t.op_params[0] != which:
            raise ValueError(f"[{op}] {name} must be the graph's {maker}, got {x!r}")

    # ---- leaves -----------------------------------------------------------------------------

    def weight(self, arr, int type_id, ne):
        """A weight over arr's memory (zero-copy; the graph keeps arr alive). ne in ggml order."""
        self._building("weight")
        cdef const llmrt_type_traits *tt = llmrt_type_traits_get(type_id)
        if tt == NULL:
            raise ValueError(f"[weight] unsupported type id {type_id}")
        tname = tt.name.decode()
        if not isinstance(arr, np.ndarray):
            raise ValueError(f"[weight] arr must be a numpy array, got {type(arr).__name__}")
        if not arr.flags.c_contiguous:
            raise ValueError("[weight] arr must be C-contiguous")
        ok = {_T_F32: (np.float32, np.uint8), _T_F16: (np.float16, np.uint16, np.uint8),
              _T_BF16: (np.uint16, np.uint8)}.get(type_id, (np.uint8,))
        if arr.dtype not in [np.dtype(d) for d in ok]:
            raise ValueError(f"[weight] a {tname} weight needs dtype "
                             f"{' or '.join(np.dtype(d).name for d in ok)}, got {arr.dtype}")
        ne = tuple(int(v) for v in ne)
        if not 1 <= len(ne) <= 4:
            raise ValueError(f"[weight] ne must have 1 to 4 dims, got {ne}")
        if min(ne) < 1:
            raise ValueError(f"[weight] every ne must be >= 1, got {ne}")
        if ne[0] % tt.blck_size != 0:
            raise ValueError(f"[weight] ne0 ({ne[0]}) must be a multiple of the {tname} block "
                             f"size ({tt.blck_size})")
        rows = 1
        for v in ne[1:]:
            rows *= v
        rs = llmrt_row_size(type_id, ne[0])
        if arr.nbytes != rs * rows:
            raise ValueError(f"[weight] arr.nbytes ({arr.nbytes}) != row_size({tname}, {ne[0]}) "
                             f"({rs}) * {rows} rows = {rs * rows}")
        cdef uintptr_t addr = <uintptr_t>cnp.PyArray_DATA(<cnp.ndarray>arr)
        align = 4 if (type_id == _T_F32 or tt.type_size % 4 == 0) else 2
        if addr % align != 0:
            raise ValueError(f"[weight] data of a {tname} weight must be {align}-byte aligned")
        cdef int64_t cne[4]
        for d in range(len(ne)):
            cne[d] = ne[d]
        rc = llmrt_graph_weight(self.g, type_id, cne, len(ne), <const void *>addr)
        t = self._new(rc, "weight")
        self._keep.append(arr)
        return t

    def input_tokens(self):
        """int32 [n] token ids, set per run."""
        self._building("input_tokens")
        return self._new(llmrt_graph_input(self.g, LLMRT_INPUT_TOKENS, 0), "input_tokens")

    def input_positions(self):
        """int32 [n] positions, set per run."""
        self._building("input_positions")
        return self._new(llmrt_graph_input(self.g, LLMRT_INPUT_POSITIONS, 0), "input_positions")

    def input_out_rows(self, int max_out):
        """int32 [n_out <= max_out]: token indices whose rows get_rows_f32 keeps."""
        self._building("input_out_rows")
        if max_out < 1:
            raise ValueError(f"[input_out_rows] max_out must be >= 1, got {max_out}")
        cdef int have = llmrt_graph_input_id(self.g, LLMRT_INPUT_OUT_ROWS)
        if have >= 0 and llmrt_graph_max_out(self.g) != max_out:
            raise ValueError(f"[input_out_rows] already defined with max_out "
                             f"{llmrt_graph_max_out(self.g)}, got {max_out}")
        return self._new(llmrt_graph_input(self.g, LLMRT_INPUT_OUT_ROWS, max_out), "input_out_rows")

    # ---- ops --------------------------------------------------------------------------------

    def get_rows(self, w, tok):
        """Rows tok of weight w [ne0, n_rows] (any type, dequantized) -> f32 [ne0, n]."""
        self._building("get_rows")
        cdef const llmrt_tensor *tw = self._weight(w, "get_rows", "w")
        self._input(tok, LLMRT_INPUT_TOKENS, "get_rows", "tok", "input_tokens()")
        if tw.ne[2] != 1 or tw.ne[3] != 1:
            raise ValueError(f"[get_rows] w must be 2-D, got {w!r}")
        t = self._new(llmrt_graph_get_rows(self.g, w.id, tok.id), "get_rows")
        if self._vocab < 0 or tw.ne[1] < self._vocab:
            self._vocab = tw.ne[1]
        return t

    def rms_norm(self, x, float eps):
        """x / sqrt(mean(x^2) + eps) over ne0 of each row (per head for [hd, n_head, n])."""
        self._building("rms_norm")
        self._act(x, "rms_norm", "x")
        if not eps >= 0:
            raise ValueError(f"[rms_norm] eps must be >= 0, got {eps}")
        return self._new(llmrt_graph_rms_norm(self.g, x.id, eps), "rms_norm")

    cdef _binary(self, str op, a, b):
        self._building(op)
        cdef const llmrt_tensor *ta = self._act(a, op, "a")
        cdef const llmrt_tensor *tb = self._tensor(b, op, "b")
        if tb.tok_kind != LLMRT_TOK_NONE:
            if tb.type != _T_F32 or tb.op == LLMRT_OP_INPUT:
                raise ValueError(f"[{op}] b must be an f32 activation or a weight, got {b!r}")
            if a.ne != b.ne or ta.tok_kind != tb.tok_kind:
                raise ValueError(f"[{op}] shapes differ: a.ne {a.ne} != b.ne {b.ne}")
        else:
            if tb.type not in (_T_F32, _T_F16, _T_BF16):
                raise ValueError(f"[{op}] a weight b must be F32, F16 or BF16, got {b.described}")
            ane = a.ne
            for d in range(4):
                bd = tb.ne[d]
                ad = ane[d] if d < len(ane) else 1
                if d >= ta.tok_dim:
                    if bd != 1:
                        raise ValueError(f"[{op}] b.ne{d} ({bd}) must be 1: a's dim {d} is "
                                         f"{'the token dim' if d == ta.tok_dim else 'past it'} (b: {b!r})")
                elif bd != 1 and bd != ad:
                    raise ValueError(f"[{op}] b.ne{d} ({bd}) must be 1 or a.ne{d} ({ad}) (b: {b!r})")
        if op == "mul":
            return self._new(llmrt_graph_mul(self.g, a.id, b.id), op)
        return self._new(llmrt_graph_add(self.g, a.id, b.id), op)

    def mul(self, a, b):
        """a * b elementwise; b an activation of a's shape or a weight broadcast over a."""
        return self._binary("mul", a, b)

    def add(self, a, b):
        """a + b elementwise; b an activation of a's shape or a weight broadcast over a."""
        return self._binary("add", a, b)

    def scale(self, a, float s):
        self._building("scale")
        self._act(a, "scale", "a")
        return self._new(llmrt_graph_scale(self.g, a.id, s), "scale")

    def mul_mat(self, w, x):
        """w [K, M] (any weight type) times x f32 [K, n] -> f32 [M, n]."""
        self._building("mul_mat")
        cdef const llmrt_tensor *tw = self._weight(w, "mul_mat", "w")
        cdef const llmrt_tensor *tx = self._act(x, "mul_mat", "x")
        if tw.ne[2] != 1 or tw.ne[3] != 1:
            raise ValueError(f"[mul_mat] w must be 2-D, got {w!r}")
        if tw.ne[0] != tx.ne[0]:
            raise ValueError(f"[mul_mat] w.ne0 ({tw.ne[0]}) != x.ne0 ({tx.ne[0]}) (w: {w!r})")
        cdef const llmrt_kernel_table *kt = llmrt_kernels()
        cdef const llmrt_type_traits *tt = llmrt_type_traits_get(tw.type)
        if kt.vec_dot[tw.type] == NULL:
            raise RuntimeError(f"[mul_mat] no vec_dot kernel for {w.described} weights")
        vt = tt.vec_dot_type
        if (vt not in (_T_F32, _T_F16, _T_BF16) and kt.quant_row[vt] == NULL):
            raise RuntimeError(f"[mul_mat] no quant_row kernel for {_type_name(vt)} "
                               f"(the activation type of {w.described})")
        t = self._new(llmrt_graph_mul_mat(self.g, w.id, x.id), "mul_mat")
        self._attach_copies(w.id)
        return t

    cdef _attach_copies(self, int wid):
        """The load-time copies MUL_MAT / MUL_MAT_ID read instead of weight wid's plain rows
        (each made once per model): packed for the level's gemm, and the AMX tile layout while
        the AMX path is on. An expert weight [K, M, n_expert] gets them only when every expert
        is whole groups (M a multiple of the pack rows; of the AMX row step, 32)."""
        if not self.pack:
            return
        cdef const llmrt_tensor *tw = llmrt_graph_tensor(self.g, wid)
        cdef int R = llmrt_kernels().pack_rows[tw.type]
        cdef bint experts = tw.n_dims == 3
        if tw.packed == NULL and R > 0 and (not experts or tw.ne[1] % R == 0):
            self._attach_packed(wid, tw)
        if tw.amx == NULL and (not experts or tw.ne[1] % 32 == 0) and _amx_wanted(tw.type, tw.ne[0]):
            self._attach_amx(wid, tw)

    cdef _attach_amx(self, int wid, const llmrt_tensor *tw):
        """An AMX tile-layout copy of weight tw (once per model, like _attach_packed), used by
        MUL_MAT for prefill while the AMX path is on (amx_set_matmul)."""
        cdef int64_t M = tw.ne[1] * tw.ne[2]                    # experts: all their rows
        key = (<uintptr_t>tw.data, tw.type, tw.ne[0], M, 1)      # 1: the AMX copy
        pw = self._packs.get(key)
        if pw is None:
            pw = AmxPackedWeight()
            nb1 = llmrt_row_size(tw.type, tw.ne[0])
            (<AmxPackedWeight>pw)._pack(tw.data, tw.type, tw.ne[0], M, nb1)
            self._packs[key] = pw
        rc = llmrt_graph_weight_amx(self.g, wid, <const void *>(<AmxPackedWeight>pw).ptr())
        if rc != LLMRT_OK:
            raise ValueError(f"[weight] could not attach the AMX copy of weight {wid} ({rc})")
        self._keep.append(pw)

    cdef _attach_packed(self, int wid, const llmrt_tensor *tw):
        """Repacks weight tw once (or reuses the copy another graph over the same memory made)
        and lets MUL_MAT read it with the kernel table's gemm. An expert weight [K, M, n_expert]
        is packed as its M * n_expert rows (MUL_MAT_ID)."""
        cdef int64_t M = tw.ne[1] * tw.ne[2]
        key = (<uintptr_t>tw.data, tw.type, tw.ne[0], M)
        pw = self._packs.get(key)
        if pw is None:
            pw = PackedWeight()
            (<PackedWeight>pw)._pack(tw.data, tw.type, tw.ne[0], M, self.pool.tp)
            self._packs[key] = pw
        rc = llmrt_graph_weight_packed(self.g, wid, (<PackedWeight>pw).ptr())
        if rc != LLMRT_OK:
            raise ValueError(f"[weight] could not attach the packed copy of weight {wid} ({rc})")
        self._keep.append(pw)

    # ---- mixture of experts (csrc/ops/moe.c) ---------------------------------------------

    def moe_route(self, logits, int k, gating="softmax", bint norm=True, float scale=1.0, bias=None):
        """Router logits f32 [n_expert, n] -> [2k, n]: per token the k chosen experts' weights,
        then their ids (exact floats). gating "softmax" | "sigmoid"; norm: weights renormalised
        to sum 1; scale multiplies them; bias: an F32 weight [n_expert] added for the choice only."""
        self._building("moe_route")
        cdef const llmrt_tensor *tl = self._act(logits, "moe_route", "logits")
        if tl.n_dims != 2:
            raise ValueError(f"[moe_route] logits must be [n_expert, n], got ne={logits.ne}")
        if not 1 <= k <= tl.ne[0]:
            raise ValueError(f"[moe_route] k ({k}) must be in [1, n_expert = {tl.ne[0]}]")
        if gating not in _MOE_GATING:
            raise ValueError(f"[moe_route] gating must be 'softmax' or 'sigmoid', got {gating!r}")
        if not math.isfinite(scale):
            raise ValueError(f"[moe_route] scale must be finite, got {scale}")
        cdef int bias_id = -1
        cdef const llmrt_tensor *tb
        if bias is not None:
            tb = self._weight(bias, "moe_route", "bias")
            if tb.type != _T_F32 or tb.ne[0] != tl.ne[0] or tb.ne[1] * tb.ne[2] * tb.ne[3] != 1:
                raise ValueError(f"[moe_route] bias must be an F32 weight of n_expert ({tl.ne[0]}) "
                                 f"values, got {bias!r}")
            bias_id = bias.id
        return self._new(llmrt_graph_moe_route(self.g, logits.id, bias_id, k, _MOE_GATING[gating],
                                               norm, scale), "moe_route")

    def mul_mat_id(self, w, x, route, up=None, act=None):
        """Expert weights w [K, M, n_expert] times each token's chosen experts (route: a
        moe_route tensor) -> f32 [M, k, n]. x is [K, n] (one row for every slot) or [K, k, n].
        With up (same type and shape as w) and act "silu" | "gelu": act(w x) * (up x), fused."""
        self._building("mul_mat_id")
        cdef const llmrt_tensor *tw = self._weight(w, "mul_mat_id", "w")
        cdef const llmrt_tensor *tx = self._act(x, "mul_mat_id", "x")
        cdef const llmrt_tensor *tr = self._tensor(route, "mul_mat_id", "route")
        cdef const llmrt_tensor *tu
        if tw.n_dims != 3:
            raise ValueError(f"[mul_mat_id] w must be 3-D [K, M, n_expert], got {w!r}")
        if tr.op != LLMRT_OP_MOE_ROUTE:
            raise ValueError(f"[mul_mat_id] route must be a moe_route tensor, got {route!r}")
        if tr.src[0].ne[0] != tw.ne[2]:
            raise ValueError(f"[mul_mat_id] the router has {tr.src[0].ne[0]} experts, w has {tw.ne[2]} ({w!r})")
        cdef int k = tr.op_params[0]
        if tw.ne[0] != tx.ne[0]:
            raise ValueError(f"[mul_mat_id] w.ne0 ({tw.ne[0]}) != x.ne0 ({tx.ne[0]}) (w: {w!r})")
        if not (tx.n_dims == 2 or (tx.n_dims == 3 and tx.ne[1] == k)):
            raise ValueError(f"[mul_mat_id] x must be [K, n] or [K, k={k}, n], got ne={x.ne}")
        if tx.tok_kind != tr.tok_kind:
            raise ValueError("[mul_mat_id] x and route must have the same token rows")
        cdef int up_id = -1
        cdef int act_id = -1
        if up is not None:
            tu = self._weight(up, "mul_mat_id", "up")
            if tu.type != tw.type or up.ne != w.ne:
                raise ValueError(f"[mul_mat_id] up ({up!r}) must have w's type and shape ({w!r})")
            if act not in _GLU_ACTS:
                raise ValueError(f"[mul_mat_id] act must be 'silu' or 'gelu' with up, got {act!r}")
            up_id, act_id = up.id, _GLU_ACTS[act]
        elif act is not None:
            raise ValueError("[mul_mat_id] act needs up (the fused gate/up form)")
        cdef const llmrt_kernel_table *kt = llmrt_kernels()
        if kt.vec_dot[tw.type] == NULL:
            raise RuntimeError(f"[mul_mat_id] no vec_dot kernel for {w.described} weights")
        t = self._new(llmrt_graph_mul_mat_id(self.g, w.id, x.id, route.id, up_id, act_id), "mul_mat_id")
        self._attach_copies(w.id)
        if up is not None:
            self._attach_copies(up.id)
        return t

    def moe_sum(self, x, route, shared=None, shared_gate=None):
        """Σ_s weight_s * x[:, s, t] over a token's k experts (x [M, k, n] from mul_mat_id) ->
        [M, n], + sigmoid(shared_gate) * shared (shared [M, n], shared_gate [1, n]) if given."""
        self._building("moe_sum")
        cdef const llmrt_tensor *tx = self._act(x, "moe_sum", "x")
        cdef const llmrt_tensor *tr = self._tensor(route, "moe_sum", "route")
        if tr.op != LLMRT_OP_MOE_ROUTE:
            raise ValueError(f"[moe_sum] route must be a moe_route tensor, got {route!r}")
        if tx.n_dims != 3 or tx.ne[1] != tr.op_params[0] or tx.tok_kind != tr.tok_kind:
            raise ValueError(f"[moe_sum] x must be [M, k={tr.op_params[0]}, n], got ne={x.ne}")
        cdef int sh_id = -1
        cdef int sg_id = -1
        cdef const llmrt_tensor *ts
        cdef const llmrt_tensor *tg
        if (shared is None) != (shared_gate is None):
            raise ValueError("[moe_sum] shared and shared_gate go together")
        if shared is not None:
            ts = self._act(shared, "moe_sum", "shared")
            tg = self._act(shared_gate, "moe_sum", "shared_gate")
            if ts.n_dims != 2 or ts.ne[0] != tx.ne[0] or ts.tok_kind != tx.tok_kind:
                raise ValueError(f"[moe_sum] shared must be [{tx.ne[0]}, n], got ne={shared.ne}")
            if tg.n_dims != 2 or tg.ne[0] != 1 or tg.tok_kind != tx.tok_kind:
                raise ValueError(f"[moe_sum] shared_gate must be [1, n], got ne={shared_gate.ne}")
            sh_id, sg_id = shared.id, shared_gate.id
        return self._new(llmrt_graph_moe_sum(self.g, x.id, route.id, sh_id, sg_id), "moe_sum")

    def reshape(self, x, ne):
        """A view of x with per-token shape ne (ggml order); the token dim stays last. ne may
        end with -1 (or the token capacity) standing for the token dim."""
        self._building("reshape")
        cdef const llmrt_tensor *tx = self._act(x, "reshape", "x")
        ne = tuple(int(v) for v in ne)
        have = 1
        for d in range(tx.tok_dim):
            have *= tx.ne[d]
        want = 1
        for v in ne:
            want *= v
        if want != have and len(ne) >= 2 and ne[len(ne) - 1] in (-1, tx.tok_cap):
            ne = ne[:len(ne) - 1]
            want = 1
            for v in ne:
                want *= v
        if not 1 <= len(ne) <= 3 or min(ne) < 1:
            raise ValueError(f"[reshape] ne must be 1 to 3 positive per-token dims, got {ne}")
        if want != have:
            raise ValueError(f"[reshape] ne {ne} holds {want} elements per token, x has {have}")
        cdef int64_t cne[4]
        for d in range(len(ne)):
            cne[d] = ne[d]
        return self._new(llmrt_graph_reshape(self.g, x.id, cne, len(ne)), "reshape")

    def rope(self, x, pos, int n_rot, int mode, float freq_base, float freq_scale=1.0,
             float ext_factor=0.0, float attn_factor=1.0, float beta_fast=32.0,
             float beta_slow=1.0, int n_ctx_orig=0, freq_factors=None):
        """Rotary embedding of x [hd, n_head, n] at positions pos, as ggml_rope_ext."""
        self._building("rope")
        cdef const llmrt_tensor *tx = self._act(x, "rope", "x")
        self._input(pos, LLMRT_INPUT_POSITIONS, "rope", "pos", "input_positions()")
        if tx.n_dims != 3 or tx.tok_kind != LLMRT_TOK_N:
            raise ValueError(f"[rope] x must be [hd, n_head, n], got ne={x.ne}")
        if n_rot < 2 or n_rot % 2 or n_rot > tx.ne[0]:
            raise ValueError(f"[rope] n_rot ({n_rot}) must be even, >= 2 and <= hd ({tx.ne[0]})")
        if mode not in _ROPE_MODES:
            raise ValueError(f"[rope] mode must be 0 (normal) or 2 (neox), got {mode}")
        if not freq_base > 0:
            raise ValueError(f"[rope] freq_base must be > 0, got {freq_base}")
        if not freq_scale > 0:
            raise ValueError(f"[rope] freq_scale must be > 0, got {freq_scale}")
        cdef int ff_id = -1
        cdef const llmrt_tensor *tf
        if freq_factors is not None:
            tf = self._weight(freq_factors, "rope", "freq_factors")
            if tf.type != _T_F32 or tf.ne[0] < n_rot // 2:
                raise ValueError(f"[rope] freq_factors must be an F32 weight of >= n_rot/2 "
                                 f"({n_rot // 2}) values, got {freq_factors!r}")
            ff_id = freq_factors.id
        cdef llmrt_rope_params p
        p.n_rot = n_rot
        p.mode = mode
        p.n_ctx_orig = n_ctx_orig
        p.freq_base = freq_base
        p.freq_scale = freq_scale
        p.ext_factor = ext_factor
        p.attn_factor = attn_factor
        p.beta_fast = beta_fast
        p.beta_slow = beta_slow
        return self._new(llmrt_graph_rope(self.g, x.id, pos.id, ff_id, &p), "rope")

    def attention(self, q, k, v, cache, int layer, float scale, int n_swa=0, float softcap=0.0):
        """Stores k, v of this run's tokens in `layer` of the cache, then attends causally over
        the cache (GQA, optional sliding window n_swa and softcap). -> [hd_v * n_head, n]."""
        self._building("attention")
        cdef const llmrt_tensor *tq = self._act(q, "attention", "q")
        cdef const llmrt_tensor *tk = self._act(k, "attention", "k")
        cdef const llmrt_tensor *tv = self._act(v, "attention", "v")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if len(t.ne) != 3 or t.token_dim != 2:
                raise ValueError(f"[attention] {name} must be [hd, n_head, n], got ne={t.ne}")
        if tq.tok_kind != LLMRT_TOK_N or tk.tok_kind != LLMRT_TOK_N or tv.tok_kind != LLMRT_TOK_N:
            raise ValueError("[attention] q, k, v must have one row per token (not picked rows)")
        if tq.ne[0] != tk.ne[0]:
            raise ValueError(f"[attention] q head dim ({tq.ne[0]}) != k head dim ({tk.ne[0]})")
        if tk.ne[1] != tv.ne[1]:
            raise ValueError(f"[attention] k heads ({tk.ne[1]}) != v heads ({tv.ne[1]})")
        if tq.ne[1] % tk.ne[1] != 0:
            raise ValueError(f"[attention] n_head ({tq.ne[1]}) is not a multiple of n_head_kv "
                             f"({tk.ne[1]})")
        if layer < 0:
            raise ValueError(f"[attention] layer must be >= 0, got {layer}")
        if n_swa < 0:
            raise ValueError(f"[attention] n_swa must be >= 0, got {n_swa}")
        if not softcap >= 0:
            raise ValueError(f"[attention] softcap must be >= 0, got {softcap}")
        shape = (layer, tk.ne[1], tk.ne[0], tv.ne[0])
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise ValueError(f"[attention] cache must be a KVCache, got {type(cache).__name__}")
            self._check_cache_layer(cache, shape, "attention")
            if self._cache is None:
                self._cache = cache
        t = self._new(llmrt_graph_attention(self.g, q.id, k.id, v.id, layer, scale, n_swa, softcap),
                      "attention")
        self._attn.append(shape)
        return t

    cdef _check_cache_layer(self, KVCache cache, shape, str op):
        layer, nkv, hdk, hdv = shape
        if layer >= cache.n_layer:
            raise ValueError(f"[{op}] layer {layer} out of range: the cache has {cache.n_layer} layers")
        have = cache.layer_shape(layer)
        if have != (nkv, hdk, hdv):
            raise ValueError(f"[{op}] layer {layer}: k/v need (n_head_kv, hd_k, hd_v) = "
                             f"{(nkv, hdk, hdv)}, the cache has {have}")

    def silu(self, x):
        self._building("silu")
        self._act(x, "silu", "x")
        return self._new(llmrt_graph_silu(self.g, x.id), "silu")

    def gelu(self, x):
        """GELU, tanh approximation, computed as ggml's CPU op (through an f16 table)."""
        self._building("gelu")
        self._act(x, "gelu", "x")
        return self._new(llmrt_graph_gelu(self.g, x.id), "gelu")

    def glu(self, gate, up, act):
        """act(gate) * up with act "silu" or "gelu"."""
        self._building("glu")
        self._act(gate, "glu", "gate")
        self._act(up, "glu", "up")
        if act not in _GLU_ACTS:
            raise ValueError(f"[glu] act must be 'silu' or 'gelu', got {act!r}")
        if gate.ne != up.ne or gate.token_dim != up.token_dim:
            raise ValueError(f"[glu] gate.ne {gate.ne} != up.ne {up.ne}")
        return self._new(llmrt_graph_glu(self.g, gate.id, up.id, _GLU_ACTS[act]), "glu")

    def softcap(self, x, float cap):
        """cap * tanh(x / cap)."""
        self._building("softcap")
        self._act(x, "softcap", "x")
        if not cap > 0:
            raise ValueError(f"[softcap] cap must be > 0, got {cap}")
        return self._new(llmrt_graph_softcap(self.g, x.id, cap), "softcap")

    def get_rows_f32(self, x, rows):
        """The rows (token indices) `rows` of activation x: [..., n] -> [..., n_out]."""
        self._building("get_rows_f32")
        cdef const llmrt_tensor *tx = self._act(x, "get_rows_f32", "x")
        self._input(rows, LLMRT_INPUT_OUT_ROWS, "get_rows_f32", "rows", "input_out_rows()")
        if tx.tok_kind != LLMRT_TOK_N:
            raise ValueError("[get_rows_f32] x must have one row per token (not picked rows)")
        return self._new(llmrt_graph_get_rows_f32(self.g, x.id, rows.id), "get_rows_f32")

    def set_output(self, y):
        self._building("set_output")
        self._act(y, "set_output", "y")
        rc = llmrt_graph_set_output(self.g, y.id)
        if rc < 0:
            raise ValueError("[set_output] invalid output")

    def build(self):
        """Plan the arena; after this no more nodes can be added."""
        self._building("build")
        if llmrt_graph_output(self.g) < 0:
            raise ValueError("[build] no output: call set_output() first")
        rc = llmrt_graph_build(self.g)
        if rc == LLMRT_ENOMEM:
            raise MemoryError("[build] out of memory planning the arena")
        if rc < 0:
            raise RuntimeError(f"[build] failed with status {rc}")

    # ---- running ----------------------------------------------------------------------------

    cdef _int32(self, x, str name, int n=-1):
        a = np.asarray(x)
        if a.ndim != 1 or (a.size > 0 and not np.issubdtype(a.dtype, np.integer)):
            raise ValueError(f"[run] {name} must be a 1-D integer array, got shape {a.shape} "
                             f"dtype {a.dtype}")
        if n >= 0 and a.shape[0] != n:
            raise ValueError(f"[run] {name} has {a.shape[0]} entries, expected {n}")
        if a.dtype != np.int32:
            if a.size and (a.min() < -2**31 or a.max() >= 2**31):
                raise ValueError(f"[run] {name} has values outside int32")
            a = a.astype(np.int32)
        return np.ascontiguousarray(a)

    # ---- the checks run() and run_seqs() share (op: the name in the messages) -------------

    cdef int _batch_n(self, pos_a, str op) except -1:
        cdef int n = pos_a.shape[0]
        if n < 1 or n > self.max_tokens:
            raise ValueError(f"[{op}] n ({n}) must be in [1, max_tokens = {self.max_tokens}]")
        return n

    cdef object _token_ids(self, tokens, int n, str op):
        tok_a = self._int32(tokens, "tokens", n)
        if self._vocab >= 0 and (tok_a.min() < 0 or tok_a.max() >= self._vocab):
            raise ValueError(f"[{op}] token ids must be in [0, {self._vocab}), got "
                             f"[{tok_a.min()}, {tok_a.max()}]")
        return tok_a

    cdef object _out_rows(self, out_rows, int n, int max_out, str op):
        rows_a = self._int32(out_rows, "out_rows")
        if not 1 <= rows_a.shape[0] <= max_out:
            raise ValueError(f"[{op}] out_rows has {rows_a.shape[0]} entries, must be in "
                             f"[1, max_out = {max_out}]")
        if rows_a.min() < 0 or rows_a.max() >= n:
            raise ValueError(f"[{op}] out_rows must be in [0, n = {n}), got "
                             f"[{rows_a.min()}, {rows_a.max()}]")
        return rows_a

    def run(self, tokens, positions, out_rows=None, cache=None):
        """Run the graph on n tokens; returns a new float32 array [n_out or n, ...per-token
        dims reversed] (e.g. [n_out, ne0])."""
        if not llmrt_graph_is_built(self.g):
            raise RuntimeError("[run] call build() first")
        has_tok = llmrt_graph_input_id(self.g, LLMRT_INPUT_TOKENS) >= 0
        has_rows = llmrt_graph_input_id(self.g, LLMRT_INPUT_OUT_ROWS) >= 0
        pos_a = self._int32(positions, "positions")
        cdef int n = self._batch_n(pos_a, "run")
        if tokens is None:
            if has_tok:
                raise ValueError("[run] the graph reads tokens: tokens must not be None")
            tok_a = np.zeros(n, dtype=np.int32)
        else:
            tok_a = self._token_ids(tokens, n, "run")
        cdef int max_out = llmrt_graph_max_out(self.g)
        if has_rows:
            if out_rows is None:
                if n > max_out:
                    raise ValueError(f"[run] out_rows=None keeps all {n} rows, more than "
                                     f"max_out = {max_out}")
                rows_a = np.arange(n, dtype=np.int32)
            else:
                rows_a = self._out_rows(out_rows, n, max_out, "run")
        else:
            if out_rows is not None:
                raise ValueError("[run] out_rows given but the graph has no input_out_rows()")
            rows_a = np.zeros(1, dtype=np.int32)
        cdef KVCache kc = None
        if self._attn:
            if cache is None:
                cache = self._cache
            if cache is None:
                raise ValueError("[run] the graph has attention: a KVCache is required")
            if not isinstance(cache, KVCache):
                raise ValueError(f"[run] cache must be a KVCache, got {type(cache).__name__}")
            kc = <KVCache>cache
            for shape in self._attn:
                self._check_cache_layer(kc, shape, "run")
            if kc.c.n_pending == 0:
                kc.prepare(n)
            elif kc.c.n_pending != n:
                raise ValueError(f"[run] the cache has {kc.c.n_pending} cells prepared, the run "
                                 f"has {n} tokens")
        elif cache is not None and not isinstance(cache, KVCache):
            raise ValueError(f"[run] cache must be a KVCache, got {type(cache).__name__}")

        cdef const llmrt_tensor *y = llmrt_graph_tensor(self.g, llmrt_graph_output(self.g))
        n_rows = n if y.tok_kind == LLMRT_TOK_N else rows_a.shape[0]
        shape = [n_rows] + [y.ne[d] for d in range(y.tok_dim - 1, -1, -1)]
        out = np.empty(shape, dtype=np.float32)

        cdef int32_t[::1] tv = tok_a
        cdef int32_t[::1] pv = pos_a
        cdef int32_t[::1] rv = rows_a
        cdef float[::1] ov = out.reshape(-1)
        cdef llmrt_graph_inputs inp
        inp.n = n
        inp.tokens = &tv[0]
        inp.positions = &pv[0]
        inp.n_out = rows_a.shape[0]
        inp.out_rows = &rv[0]
        cdef llmrt_kv_cache *cptr = kc.c if kc is not None else NULL
        cdef int rc
        with nogil:
            rc = llmrt_graph_run(self.g, &inp, cptr, &ov[0])
        if rc < 0:
            raise RuntimeError(f"[run] failed with status {rc}")
        return out

    def run_seqs(self, tokens, positions, out_rows, caches, counts):
        """Run one batch of several sequences (continuous batching, graph.h llmrt_graph_run_seqs):
        the tokens are len(caches) groups in order, group s being counts[s] tokens of the
        sequence whose KV cache is caches[s] (distinct caches; each prepared for exactly its
        count, or not prepared: then it is here). Weights are read once for the whole batch;
        each token's attention reads only its own sequence's cache. Returns the rows of
        out_rows (e.g. each sequence's last token), as run()."""
        if not llmrt_graph_is_built(self.g):
            raise RuntimeError("[run_seqs] call build() first")
        if not self._attn:
            raise ValueError("[run_seqs] the graph has no attention: use run()")
        caches = list(caches)
        cnt = self._int32(counts, "counts")
        cdef int n_seq = len(caches)
        if n_seq < 1 or cnt.shape[0] != n_seq:
            raise ValueError(f"[run_seqs] {n_seq} caches and {cnt.shape[0]} counts: need one count per "
                             f"cache, at least one")
        if cnt.min() < 1:
            raise ValueError(f"[run_seqs] every sequence needs >= 1 token, got counts {cnt.tolist()}")
        pos_a = self._int32(positions, "positions")
        cdef int n = self._batch_n(pos_a, "run_seqs")
        if int(cnt.sum()) != n:
            raise ValueError(f"[run_seqs] counts sum to {int(cnt.sum())}, the batch has {n} tokens")
        tok_a = self._token_ids(tokens, n, "run_seqs")
        cdef int max_out = llmrt_graph_max_out(self.g)
        if llmrt_graph_input_id(self.g, LLMRT_INPUT_OUT_ROWS) < 0:
            raise ValueError("[run_seqs] the graph keeps every row: build it with input_out_rows()")
        rows_a = self._out_rows(out_rows, n, max_out, "run_seqs")
        if len(set(map(id, caches))) != n_seq:
            raise ValueError("[run_seqs] a cache appears twice: each sequence needs its own")
        cdef KVCache kc
        dtype = None
        for s in range(n_seq):
            if not isinstance(caches[s], KVCache):
                raise ValueError(f"[run_seqs] caches[{s}] must be a KVCache, got {type(caches[s]).__name__}")
            kc = <KVCache>caches[s]
            for shape in self._attn:
                self._check_cache_layer(kc, shape, "run_seqs")
            if dtype is None:
                dtype = kc.c.type
            elif kc.c.type != dtype:
                raise ValueError("[run_seqs] the caches must all have the same dtype")
            if kc.c.n_pending != 0 and kc.c.n_pending != cnt[s]:
                raise ValueError(f"[run_seqs] caches[{s}] has {kc.c.n_pending} cells prepared, its "
                                 f"sequence has {cnt[s]} tokens")
        prepared = []
        try:
            for s in range(n_seq):
                kc = <KVCache>caches[s]
                if kc.c.n_pending == 0:
                    kc.prepare(int(cnt[s]))
                    prepared.append(kc)
        except BaseException:
            for kc in prepared:         # leave no reservation behind
                llmrt_kv_cache_truncate(kc.c, kc.c.n_used)
            raise

        cdef const llmrt_tensor *y = llmrt_graph_tensor(self.g, llmrt_graph_output(self.g))
        shape = [rows_a.shape[0]] + [y.ne[d] for d in range(y.tok_dim - 1, -1, -1)]
        out = np.empty(shape, dtype=np.float32)
        cdef int32_t[::1] tv = tok_a
        cdef int32_t[::1] pv = pos_a
        cdef int32_t[::1] rv = rows_a
        cdef int32_t[::1] cv = cnt
        cdef float[::1] ov = out.reshape(-1)
        cdef llmrt_graph_inputs inp
        inp.n = n
        inp.tokens = &tv[0]
        inp.positions = &pv[0]
        inp.n_out = rows_a.shape[0]
        inp.out_rows = &rv[0]
        cdef llmrt_kv_cache **cps = <llmrt_kv_cache **>malloc(n_seq * sizeof(llmrt_kv_cache *))
        cdef int *nts = <int *>malloc(n_seq * sizeof(int))
        if cps == NULL or nts == NULL:
            free(cps)
            free(nts)
            raise MemoryError("[run_seqs] out of memory")
        for s in range(n_seq):
            cps[s] = (<KVCache>caches[s]).c
            nts[s] = cv[s]
        cdef int rc
        with nogil:
            rc = llmrt_graph_run_seqs(self.g, &inp, cps, nts, n_seq, &ov[0])
        free(cps)
        free(nts)
        if rc < 0:
            raise RuntimeError(f"[run_seqs] failed with status {rc}")
        return out

    # ---- inspection -------------------------------------------------------------------------

    @property
    def n_nodes(self):
        """Compute nodes (including the hidden quantize / kv_store nodes)."""
        return llmrt_graph_n_nodes(self.g)

    @property
    def n_tensors(self):
        return llmrt_graph_n_tensors(self.g)

    @property
    def arena_bytes(self):
        """Bytes of the planned arena (0 before build)."""
        return llmrt_graph_arena_bytes(self.g)

    @property
    def tensor_bytes(self):
        """Sum of all intermediate tensors' sizes at capacity (the arena without reuse)."""
        return llmrt_graph_tensor_bytes(self.g)

    def set_profile(self, bint on=True):
        """Profiling: on, thread 0 times every node of every run from now on (wall time in the
        node, including the barrier before it); off stops. Both clear the sums."""
        llmrt_graph_set_profile(self.g, on)

    def profile(self):
        """(runs, rows): the per-node sums since set_profile(True), rows of (node index, op name,
        weight type id of a mul_mat or -1, ns, barrier wait ns), in execution order."""
        cdef int n = llmrt_graph_n_nodes(self.g)
        if not llmrt_graph_is_built(self.g) or n < 1:
            return 0, []
        cdef cnp.ndarray[cnp.int64_t, ndim=1] ns = np.zeros(n, dtype=np.int64)
        cdef cnp.ndarray[cnp.int64_t, ndim=1] wait = np.zeros(n, dtype=np.int64)
        cdef int64_t runs = llmrt_graph_profile(self.g, &ns[0], &wait[0])
        cdef const llmrt_tensor *t
        rows = []
        for i in range(llmrt_graph_n_tensors(self.g)):
            t = llmrt_graph_tensor(self.g, i)
            if t == NULL or t.node < 0 or t.node >= n:
                continue
            wt = (t.src[0].type if (t.op == LLMRT_OP_MUL_MAT or t.op == LLMRT_OP_MUL_MAT_ID)
                  and t.src[0] != NULL else -1)
            rows.append((t.node, llmrt_op_name(t.op).decode(), wt, int(ns[t.node]), int(wait[t.node])))
        rows.sort()
        return int(runs), rows

    @property
    def n_barriers(self):
        """Barriers per run in the plan of the last run (the plan depends on n)."""
        return llmrt_graph_n_barriers(self.g)

    @property
    def single_thread_work(self):
        """Nodes with less work than this (elements, or multiply-adds for mul_mat) run on one
        thread. 0 shares every node across the pool (tests use it)."""
        return llmrt_graph_single_work(self.g)

    @single_thread_work.setter
    def single_thread_work(self, work):
        if work < 0:
            raise ValueError(f"[graph] single_thread_work must be >= 0, got {work}")
        llmrt_graph_set_single_work(self.g, work)

    @property
    def n_threads(self):
        return self.pool.n_threads

    @property
    def is_built(self):
        return bool(llmrt_graph_is_built(self.g))


cdef bint _amx_wanted(int wtype, int64_t K):
    """An AMX copy for this weight: the AMX path is on and one of its GEMMs takes the type (int8
    for the 32-block quants, K a multiple of 32; bf16 tiles for F32 / F16 / BF16)."""
    if llmrt_amx_matmul() < 0 or not llmrt_amx_supports(wtype):
        return False
    return K % 32 == 0 or wtype == _T_F32 or wtype == _T_F16 or wtype == _T_BF16
