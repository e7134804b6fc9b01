# The AMX path (csrc/kernels/amx_*.c, csrc/kernels/x86/amx.c): test hooks for the tile layer and
# the int8 / bf16 GEMMs, on either backend ("model" = software tiles, "hw" = real instructions).
# Shapes are checked here; the C entry points re-check what they rely on and return a status.
from c_amx cimport *
from libc.stdint cimport int64_t, uint8_t, uint16_t
from libc.string cimport memcpy

AMX_OPS = {"dpbssd": 0, "dpbsud": 1, "dpbusd": 2, "dpbuud": 3, "dpbf16ps": 4}
_AMX_BACKENDS = {"model": LLMRT_AMX_MODEL, "hw": LLMRT_AMX_HW}


def _amx_backend(str backend):
    if backend not in _AMX_BACKENDS:
        raise ValueError(f"[amx] backend must be 'model' or 'hw', not {backend!r}")
    return _AMX_BACKENDS[backend]


def _amx_check(int rc, str what):
    if rc == LLMRT_EUNSUPPORTED:
        raise RuntimeError(f"[{what}] AMX is not available on this CPU / OS / build")
    if rc != LLMRT_OK:
        raise ValueError(f"[{what}] failed with status {rc}")


def amx_hw_available():
    """(int8, bf16): whether the real AMX instructions may run here."""
    return bool(llmrt_amx_hw_available()), bool(llmrt_amx_hw_bf16_available())


def amx_set_matmul(backend):
    """Prefill matmuls on the AMX path: "hw" (real instructions; ignored without AMX), "model"
    (the software tiles: slow, for tests on any machine) or None (off). Takes effect for graphs
    built afterwards (their weights get an AMX copy) and runs of >= 16 tokens. Returns the
    backend in effect."""
    llmrt_amx_set_matmul(-1 if backend is None else _amx_backend(backend))
    return amx_matmul()


def amx_matmul():
    """The AMX prefill backend in effect: "hw", "model" or None."""
    cdef int b = llmrt_amx_matmul()
    return None if b < 0 else ("hw" if b == LLMRT_AMX_HW else "model")


def amx_matmul_calls():
    """MUL_MAT nodes that ran on the AMX path so far (for tests)."""
    return llmrt_amx_matmul_calls()


def amx_supports(int wtype):
    return bool(llmrt_amx_supports(wtype))


def amx_dp_once(str op, c, a, b, str backend="model"):
    """One tile dot-product instruction: returns the new C.

    c: (m, n) int32 (int8 ops) or float32 (dpbf16ps)   # IN, copied
    a: (m, ka) uint8 bytes (ka = 4..64, multiple of 4)  # IN
    b: (ka // 4, 4 * n) uint8 bytes                      # IN
    """
    if op not in AMX_OPS:
        raise ValueError(f"[amx_dp_once] unknown op {op!r}")
    cdt = np.float32 if op == "dpbf16ps" else np.int32
    c = np.array(c, dtype=cdt, order="C", copy=True)
    a = np.ascontiguousarray(a, dtype=np.uint8)
    b = np.ascontiguousarray(b, dtype=np.uint8)
    if c.ndim != 2 or a.ndim != 2 or b.ndim != 2:
        raise ValueError("[amx_dp_once] c, a, b must be 2-d")
    cdef int m = c.shape[0], n = c.shape[1], ka = a.shape[1]
    if a.shape[0] != m or b.shape[0] * 4 != ka or b.shape[1] != 4 * n:
        raise ValueError(f"[amx_dp_once] shapes c {c.shape}, a {a.shape}, b {b.shape} do not fit")
    cdef uint8_t[:, ::1] cv = c.view(np.uint8)
    cdef const uint8_t[:, ::1] av = a
    cdef const uint8_t[:, ::1] bv = b
    cdef int be = _amx_backend(backend), iop = AMX_OPS[op], rc
    with nogil:
        rc = llmrt_amx_dp_once(be, iop, m, n, ka, &cv[0, 0], &av[0, 0], &bv[0, 0])
    _amx_check(rc, "amx_dp_once")
    return c


cdef class AmxPacked:
    """Weights repacked for the AMX GEMMs (llmrt_amx_pack): M rows of K elements of a GGUF type."""
    cdef llmrt_amx_packed p

    def __cinit__(self):
        self.p.data = NULL

    def __init__(self, int wtype, raw, int64_t M, int64_t K):
        """raw: (M, row_bytes) uint8, one GGUF row of K elements per row  # IN"""
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        if raw.ndim != 2 or raw.shape[0] != M:
            raise ValueError(f"[AmxPacked] raw must be (M={M}, row_bytes), got {raw.shape}")
        cdef const uint8_t[:, ::1] rv = raw
        cdef size_t nb1 = raw.shape[1]
        cdef int rc
        with nogil:
            rc = llmrt_amx_pack(&self.p, wtype, &rv[0, 0], nb1, M, K)
        _amx_check(rc, "AmxPacked")

    def __dealloc__(self):
        llmrt_amx_packed_free(&self.p)

    @property
    def M(self): return self.p.M
    @property
    def K(self): return self.p.K
    @property
    def kind(self): return "int8" if self.p.kind == LLMRT_AMX_KIND_INT8 else "bf16"
    @property
    def act_type(self): return llmrt_amx_act_type(&self.p)
    @property
    def nkb(self): return self.p.nkb

    def data(self):
        """The packed bytes, (ngroups, nkb, blk_bytes) uint8 (a copy)."""
        cdef size_t total = <size_t>self.p.ngroups * self.p.group_bytes
        out = np.empty(total, dtype=np.uint8)
        cdef uint8_t[::1] ov = out
        if total:
            memcpy(&ov[0], self.p.data, total)
        return out.reshape(self.p.ngroups, self.p.nkb, self.p.blk_bytes)

    def gemm_int8(self, act, int64_t n, int64_t row0=0, row1=None, int kc=0, str backend="model"):
        """y (n, M) float32; columns [row0, row1) computed, the rest 0.
        act: (n, act_row_bytes) uint8, rows of act_type blocks (quantize_act_raw)  # IN"""
        act = np.ascontiguousarray(act, dtype=np.uint8)
        if act.ndim != 2 or act.shape[0] != n or n < 1:
            raise ValueError(f"[amx_gemm_int8] act must be (n={n}, row_bytes), got {act.shape}")
        cdef int64_t r1 = self.p.M if row1 is None else row1
        y = np.zeros((n, self.p.M), dtype=np.float32)
        cdef float[:, ::1] yv = y
        cdef const uint8_t[:, ::1] avv = act
        cdef size_t anb1 = act.shape[1], ynb1 = self.p.M * 4
        cdef int be = _amx_backend(backend), rc
        with nogil:
            rc = llmrt_amx_gemm_int8(&self.p, &avv[0, 0], anb1, n, &yv[0, 0], ynb1, row0, r1, kc, be)
        _amx_check(rc, "amx_gemm_int8")
        return y

    def gemm_bf16(self, xb, int64_t row0=0, row1=None, str backend="model"):
        """y (n, M) float32. xb: (n, K_pad) uint16 bf16 activations (amx_act_bf16)  # IN"""
        xb = np.ascontiguousarray(xb, dtype=np.uint16)
        if xb.ndim != 2 or xb.shape[0] < 1 or xb.shape[1] != self.p.nkb * 32:
            raise ValueError(f"[amx_gemm_bf16] xb must be (n, {self.p.nkb * 32}), got {xb.shape}")
        cdef int64_t n = xb.shape[0]
        cdef int64_t r1 = self.p.M if row1 is None else row1
        y = np.zeros((n, self.p.M), dtype=np.float32)
        cdef float[:, ::1] yv = y
        cdef const uint16_t[:, ::1] xv = xb
        cdef size_t xnb1 = xb.shape[1] * 2, ynb1 = self.p.M * 4
        cdef int be = _amx_backend(backend), rc
        with nogil:
            rc = llmrt_amx_gemm_bf16(&self.p, &xv[0, 0], xnb1, n, &yv[0, 0], ynb1, row0, r1, be)
        _amx_check(rc, "amx_gemm_bf16")
        return y


def amx_act_bf16(x):
    """x (n, K) float32 -> (n, K_pad) uint16 bf16, K_pad = 32 * ceil(K / 32)  # IN / OUT"""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError("[amx_act_bf16] x must be 2-d")
    cdef int64_t n = x.shape[0], K = x.shape[1]
    cdef int64_t K_pad = (K + 31) // 32 * 32
    out = np.zeros((n, K_pad), dtype=np.uint16)
    if n == 0 or K == 0:
        return out
    cdef const float[:, ::1] xv = x
    cdef uint16_t[:, ::1] ov = out
    with nogil:
        llmrt_amx_act_bf16(&xv[0, 0], K * 4, n, K, &ov[0, 0], K_pad * 2)
    return out


cdef class AmxPackedWeight:
    """A weight [K, M] packed into AMX's B-tile layout (int8 kinds; amx.h). Owns its memory."""
    cdef llmrt_amx_packed p

    cdef int _pack(self, const void *src, int wtype, int64_t K, int64_t M, size_t nb1) except -1:
        cdef int rc
        with nogil:
            rc = llmrt_amx_pack(&self.p, wtype, src, nb1, M, K)
        if rc == LLMRT_ENOMEM:
            raise MemoryError("[amx pack] out of memory")
        _amx_check(rc, "amx pack")
        return 0

    cdef const llmrt_amx_packed *ptr(self):
        return &self.p

    def __dealloc__(self):
        llmrt_amx_packed_free(&self.p)
