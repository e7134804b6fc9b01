# Dot-product kernels (csrc/kernels/dot_generic.c, csrc/kernels/x86/dot_*.c) through the kernel
# table, one row at a time. Used by tests to check every ISA variant against the generic one.
from c_llmrt cimport *


def _aligned_bytes(x):
    """x as a flat contiguous uint8 array whose data is 16-byte aligned (kernels may read a block's
    f32/f16 fields in place, so the row must start aligned, as rows in the graph's buffers do)."""
    x = np.ascontiguousarray(x, dtype=np.uint8).reshape(-1)
    if x.ctypes.data % 16 != 0:
        buf = np.empty(x.shape[0] + 16, dtype=np.uint8)
        off = (-buf.ctypes.data) % 16
        y = buf[off:off + x.shape[0]]
        y[:] = x
        x = y
    return x


def vec_dot(int wtype, w, a, int n):
    """dot(weight row, activation row) with the kernel table's vec_dot[wtype].

    w: uint8 array, one row of n elements of type `wtype` (llmrt_row_size(wtype, n) bytes)  # IN
    a: uint8 array, one row of n elements of wtype's vec_dot_type (e.g. Q8_0 for Q4_0)       # IN
    Returns the dot product as a Python float (the kernel's f32 result).
    """
    cdef const llmrt_type_traits *tt = llmrt_type_traits_get(wtype)
    if tt == NULL:
        raise ValueError(f"[vec_dot] unknown type id {wtype}")
    name = tt.name.decode()
    cdef const llmrt_kernel_table *kt = llmrt_kernels()
    cdef llmrt_vec_dot_fn fn = kt.vec_dot[wtype]
    if fn == NULL:
        raise ValueError(f"[vec_dot] no dot-product kernel for type {name}")
    if n <= 0 or n % tt.blck_size != 0:
        raise ValueError(f"[vec_dot] n = {n} must be a positive multiple of {name}'s block size "
                         f"{tt.blck_size}")
    cdef int atype = tt.vec_dot_type
    cdef const llmrt_type_traits *at = llmrt_type_traits_get(atype)
    if at == NULL or n % at.blck_size != 0:
        raise ValueError(f"[vec_dot] n = {n} does not fit {name}'s activation type")
    cdef const unsigned char[::1] wv = _aligned_bytes(w)
    cdef const unsigned char[::1] av = _aligned_bytes(a)
    cdef size_t wsize = llmrt_row_size(wtype, n)
    cdef size_t asize = llmrt_row_size(atype, n)
    if <size_t>wv.shape[0] != wsize:
        raise ValueError(f"[vec_dot] weight row has {wv.shape[0]} bytes, a {name} row of {n} "
                         f"elements has {wsize}")
    if <size_t>av.shape[0] != asize:
        raise ValueError(f"[vec_dot] activation row has {av.shape[0]} bytes, a "
                         f"{at.name.decode()} row of {n} elements has {asize}")
    cdef float s = 0.0
    with nogil:
        fn(n, &s, &wv[0], &av[0])
    return s


def attn_dot(x, y):
    """dot(x, y) with the dot attention's kernels reproduce for x's type (F16 or F32 rows): the kernel
    table's attn_pv_dot[T], which must also be its attn_qk_dot[T] and attn_dots_dot[T] where those
    kernels exist (vec_dot[T] where the level registers none).

    x, y: (n,) float16 or float32, the same dtype   # IN
    Returns the f32 result as a Python float.
    """
    x = np.ascontiguousarray(x)
    y = np.ascontiguousarray(y)
    if x.dtype != y.dtype or x.dtype not in (np.float16, np.float32) or x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"[attn_dot] x {x.dtype}{x.shape} and y {y.dtype}{y.shape}: two (n,) rows of one "
                         "type, float16 or float32")
    cdef int t = LLMRT_TYPE_F16 if x.dtype == np.float16 else LLMRT_TYPE_F32
    cdef const llmrt_kernel_table *kt = llmrt_kernels()
    cdef llmrt_vec_dot_fn fn = kt.attn_pv_dot[t] if kt.attn_pv_dot[t] != NULL else kt.vec_dot[t]
    if kt.attn_qk[t] != NULL and kt.attn_qk_dot[t] != fn:
        raise ValueError("[attn_dot] attn_qk_dot differs from attn_pv_dot at this level")
    if kt.attn_dots[t] != NULL and kt.attn_dots_dot[t] != fn:
        raise ValueError("[attn_dot] attn_dots_dot differs from attn_pv_dot at this level")
    cdef const unsigned char[::1] xv = _aligned_bytes(x.view(np.uint8))
    cdef const unsigned char[::1] yv = _aligned_bytes(y.view(np.uint8))
    cdef int n = x.shape[0]
    cdef float s = 0.0
    if n > 0:
        with nogil:
            fn(n, &s, &xv[0], &yv[0])
    return s


def attn_dots(x, y):
    """out[j, i] = vec_dot_f16(n, x[i], y[j]) with the kernel table's attn_dots[F16] (attention's
    many dots, csrc/kernels/x86/attn_avx2.c), name of the kernel.

    x: (nx, n) float16   # IN
    y: (ny, n) float16   # IN (passed to the kernel as its exact f32 values)
    Returns ((ny, nx) float32, kernel name).
    """
    cdef const llmrt_kernel_table *kt = llmrt_kernels()
    cdef llmrt_attn_dots_fn fn = kt.attn_dots[LLMRT_TYPE_F16]
    if fn == NULL:
        raise ValueError("[attn_dots] no kernel for F16 at this ISA level")
    x = np.ascontiguousarray(x, dtype=np.float16)
    y = np.ascontiguousarray(y, dtype=np.float16)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1] or x.shape[1] < 1:
        raise ValueError(f"[attn_dots] x {x.shape} and y {y.shape} must be (nx, n) and (ny, n), n >= 1")
    cdef int n = x.shape[1], nx = x.shape[0], ny = y.shape[0]
    cdef const unsigned short[:, ::1] xv = x.view(np.uint16)
    cdef const float[:, ::1] yv = y.astype(np.float32)
    out = np.empty((ny, nx), dtype=np.float32)
    cdef float[:, ::1] ov = out
    if nx > 0 and ny > 0:
        with nogil:
            fn(n, nx, ny, &ov[0, 0], nx, &xv[0, 0], n, &yv[0, 0], n)
    return out, kt.attn_dots_name[LLMRT_TYPE_F16].decode()
