# Packed weights (csrc/include/llmrt/gemm.h): a weight repacked once at load into the kernel
# table's layout for its type, and the gemm kernels over it (tests call them group by group).
from c_llmrt cimport *
from c_graph cimport llmrt_threadpool, llmrt_pack_weight_mt


def pack_rows(int wtype):
    """Rows per packed group of type wtype (0: the type has no packed path)."""
    if wtype < 0 or wtype >= LLMRT_TYPE_COUNT:
        return 0
    return llmrt_kernels().pack_rows[wtype]


cdef class PackedWeight:
    """A weight [K, M] of a GGUF type, packed (lossless) for the gemm kernels. Owns its memory."""
    cdef llmrt_packed p

    cdef int _pack(self, const void *src, int wtype, int64_t K, int64_t M,
                   llmrt_threadpool *tp=NULL) except -1:
        """Packs M plain rows of K elements at src (validated by the caller), on the threads of
        pool tp when given (same bytes)."""
        cdef int rc
        cdef size_t rs = llmrt_row_size(wtype, K)
        with nogil:
            rc = llmrt_pack_weight_mt(wtype, src, rs, K, M, &self.p, tp)
        if rc == LLMRT_ENOMEM:
            raise MemoryError("[pack] out of memory")
        if rc != LLMRT_OK:
            raise ValueError(f"[pack] failed ({rc})")
        return 0

    def __dealloc__(self):
        llmrt_packed_free(&self.p)

    @property
    def type_id(self):
        return self.p.type

    @property
    def R(self):
        return self.p.R

    @property
    def K(self):
        return self.p.K

    @property
    def M(self):
        return self.p.M

    @property
    def n_groups(self):
        return self.p.n_groups

    @property
    def group_bytes(self):
        return self.p.group_bytes

    @property
    def nbytes(self):
        return self.p.group_bytes * self.p.n_groups

    cdef const llmrt_packed *ptr(self):
        return &self.p

    def _check_group(self, int g):
        if g < 0 or g >= self.p.n_groups:
            raise IndexError(f"[packed] group {g} out of range 0..{self.p.n_groups - 1}")

    def group(self, int g):
        """The bytes of group g (a copy), uint8 [group_bytes]."""
        self._check_group(g)
        cdef const unsigned char[::1] v = <const unsigned char[:self.p.group_bytes]>(
            <const unsigned char *>self.p.data + <size_t>g * self.p.group_bytes)
        return np.array(v, dtype=np.uint8)

    def unpack(self, int g):
        """Group g's real rows back in the plain GGUF layout: uint8 [rows, row_size]."""
        self._check_group(g)
        cdef int rows = <int>min(self.p.R, self.p.M - <int64_t>g * self.p.R)
        cdef size_t rs = llmrt_row_size(self.p.type, self.p.K)
        out = np.zeros((rows, rs), dtype=np.uint8)
        cdef unsigned char[:, ::1] o = out
        rc = llmrt_unpack_group(self.p.type, self.p.K,
                                <const unsigned char *>self.p.data + <size_t>g * self.p.group_bytes,
                                rows, &o[0, 0], rs)
        if rc != LLMRT_OK:
            raise ValueError(f"[packed] no unpacker for this type ({rc})")
        return out

    def gemm_groups(self):
        """Consecutive groups one gemm call may take at the current ISA level (gemm.h)."""
        return max(1, llmrt_kernels().gemm_groups[self.p.type])

    def gemm(self, int g, x, int n_rows=-1):
        """y[j, r] = dot(row r of group g, activation row j) with the kernel table's gemm.

        x: uint8 [n_x, row_size(vec_dot_type, K)], the activation rows  # IN
        Returns float32 [n_x, n_rows] (n_rows defaults to the group's real rows). n_rows up to
        gemm_groups() * R takes that many consecutive groups in one call (gemm.h).
        """
        self._check_group(g)
        cdef const llmrt_kernel_table *kt = llmrt_kernels()
        cdef llmrt_gemm_fn fn = kt.gemm[self.p.type]
        if fn == NULL:
            raise ValueError(f"[gemm] no gemm kernel for this type at ISA {isa_current()}")
        cdef int real = <int>min(self.p.R, self.p.M - <int64_t>g * self.p.R)
        cdef int G = max(1, kt.gemm_groups[self.p.type])
        if n_rows < 0:
            n_rows = real
        if n_rows < 1 or n_rows > G * self.p.R:
            raise ValueError(f"[gemm] n_rows = {n_rows} must be in 1..{G * self.p.R}")
        if g + (n_rows + self.p.R - 1) // self.p.R > self.p.n_groups:
            raise ValueError(f"[gemm] {n_rows} rows from group {g} run past the last group")
        cdef int vt = llmrt_type_traits_get(self.p.type).vec_dot_type
        cdef size_t xs = llmrt_row_size(vt, self.p.K)
        xa = np.ascontiguousarray(x, dtype=np.uint8)
        if xa.ndim != 2 or <size_t>xa.shape[1] != xs or xa.shape[0] < 1:
            raise ValueError(f"[gemm] x must be uint8 [n_x >= 1, {xs}], got {xa.shape}")
        # the first row starts 16-byte aligned, the others xs bytes apart, as in the graph's buffers
        cdef size_t xstride = xs
        buf = np.zeros(xa.shape[0] * xstride + 16, dtype=np.uint8)
        off = (-buf.ctypes.data) % 16
        xb = buf[off:off + xa.shape[0] * xstride].reshape(xa.shape[0], xstride)
        xb[:, :xs] = xa
        cdef const unsigned char[:, ::1] xv = xb
        cdef int n_x = xa.shape[0]
        out = np.full((n_x, n_rows), np.nan, dtype=np.float32)
        cdef float[:, ::1] o = out
        cdef const void *grp = <const unsigned char *>self.p.data + <size_t>g * self.p.group_bytes
        cdef int64_t K = self.p.K
        with nogil:
            fn(K, grp, n_rows, &xv[0, 0], xstride, n_x, &o[0, 0], n_rows)
        return out


def pack_weight(arr, int wtype, K, M, int n_threads=1):
    """PackedWeight of M rows of K elements of type wtype (arr: their plain GGUF bytes, uint8,
    M * row_size(wtype, K) bytes); n_threads > 1 packs on the shared pool of that many threads
    (graph.pxi's thread_pool; same bytes)."""
    cdef const llmrt_type_traits *tt = llmrt_type_traits_get(wtype)
    if tt == NULL:
        raise ValueError(f"[pack] unknown type id {wtype}")
    if pack_rows(wtype) == 0:
        raise ValueError(f"[pack] type {tt.name.decode()} has no packed layout")
    if K <= 0 or M <= 0 or K % tt.blck_size != 0:
        raise ValueError(f"[pack] K = {K} must be a positive multiple of the block size "
                         f"{tt.blck_size}, M = {M} positive")
    cdef const unsigned char[::1] a = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    cdef size_t rs = llmrt_row_size(wtype, K)
    if <size_t>a.shape[0] != rs * <size_t>M:
        raise ValueError(f"[pack] arr has {a.shape[0]} bytes, {M} rows of {rs} expected")
    if n_threads < 1:
        raise ValueError(f"[pack] n_threads must be >= 1, got {n_threads}")
    cdef llmrt_threadpool *tp = NULL
    cdef ThreadPool pool
    if n_threads > 1:
        pool = thread_pool(n_threads)
        tp = pool.tp
    pw = PackedWeight()
    pw._pack(&a[0], wtype, K, M, tp)
    return pw
