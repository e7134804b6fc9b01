# Dequantize / quantize rows of GGUF block types through the kernel table (csrc/kernels/).
#
# Shapes are checked in llmrt/quants.py; here only what C relies on is asserted: a C-contiguous
# buffer holding exactly n_elements / blck_size blocks. The GIL is released around the C loop.
from c_llmrt cimport *
from libc.stdint cimport uint8_t, int64_t


def dequantize_raw(const uint8_t[::1] raw,      # IN  blocks, nbytes = n / blck_size * type_size
                   float[::1] out,              # OUT n floats
                   int type_id):
    """Dequantize raw blocks of `type_id` into `out` (len(out) elements) with the current kernel."""
    cdef const llmrt_type_traits *tt = llmrt_type_traits_get(type_id)
    if tt == NULL:
        raise ValueError(f"[dequantize] unsupported type id {type_id}")
    cdef const llmrt_kernel_table *kt = llmrt_kernels()
    cdef llmrt_dequant_row_fn fn = kt.dequant_row[type_id]
    if fn == NULL:
        raise ValueError(f"[dequantize] no dequantize kernel for {tt.name.decode()}")
    cdef int64_t n = out.shape[0]
    if n % tt.blck_size != 0 or <size_t>raw.shape[0] != <size_t>(n // tt.blck_size) * tt.type_size:
        raise ValueError(f"[dequantize] {raw.shape[0]} bytes do not hold {n} {tt.name.decode()} elements")
    if n == 0:
        return
    with nogil:
        fn(&raw[0], &out[0], n)


def quantize_raw(const float[::1] x,            # IN  n floats
                 uint8_t[::1] out,              # OUT blocks, nbytes = n / blck_size * type_size
                 int type_id):
    """Quantize `x` into raw blocks of `type_id` (reference rounding) with the current kernel."""
    cdef const llmrt_type_traits *tt = llmrt_type_traits_get(type_id)
    if tt == NULL:
        raise ValueError(f"[quantize] unsupported type id {type_id}")
    cdef const llmrt_kernel_table *kt = llmrt_kernels()
    cdef llmrt_quant_row_fn fn = kt.quant_row[type_id]
    if fn == NULL:
        raise ValueError(f"[quantize] no quantize kernel for {tt.name.decode()}")
    cdef int64_t n = x.shape[0]
    if n % tt.blck_size != 0 or <size_t>out.shape[0] != <size_t>(n // tt.blck_size) * tt.type_size:
        raise ValueError(f"[quantize] {out.shape[0]} bytes do not hold {n} {tt.name.decode()} elements")
    if n == 0:
        return
    with nogil:
        fn(&x[0], &out[0], n)


def quantize_act_raw(const float[::1] x,        # IN  n floats
                     uint8_t[::1] out,          # OUT blocks, nbytes = n / blck_size * type_size
                     int type_id):
    """Quantize `x` as mul_mat quantizes activations (the kernel table's quant_act_row: ggml's
    run-time rounding on this ISA level) into raw blocks of `type_id`."""
    cdef const llmrt_type_traits *tt = llmrt_type_traits_get(type_id)
    if tt == NULL:
        raise ValueError(f"[quantize_act] unsupported type id {type_id}")
    cdef const llmrt_kernel_table *kt = llmrt_kernels()
    cdef llmrt_quant_row_fn fn = kt.quant_act_row[type_id]
    if fn == NULL:
        raise ValueError(f"[quantize_act] no activation quantizer for {tt.name.decode()}")
    cdef int64_t n = x.shape[0]
    if n % tt.blck_size != 0 or <size_t>out.shape[0] != <size_t>(n // tt.blck_size) * tt.type_size:
        raise ValueError(f"[quantize_act] {out.shape[0]} bytes do not hold {n} {tt.name.decode()} elements")
    if n == 0:
        return
    with nogil:
        fn(&x[0], &out[0], n)


def has_kernel(str table, int type_id):
    """True if the current kernel table has a `table` ("dequant_row" / "quant_row") entry."""
    cdef const llmrt_kernel_table *kt = llmrt_kernels()
    if type_id < 0 or type_id >= LLMRT_TYPE_COUNT:
        return False
    if table == "dequant_row":
        return kt.dequant_row[type_id] != NULL
    if table == "quant_row":
        return kt.quant_row[type_id] != NULL
    raise ValueError(f"unknown kernel table {table!r}")


def wq_quantize_rows(const float[:, ::1] x,     # IN  (rows, k) floats
                     uint8_t[:, ::1] out,       # OUT (rows, k / 32 * type_size) blocks
                     int type_id, int64_t group, bint search=True,
                     const float[::1] weights=None):  # IN  (k,) importance per column, or None
    """Group-wise weight-only quantization (csrc/wquant.c) of each row of x into `type_id` blocks
    (Q4_0, Q4_1, Q8_0, WQ_Q8A or their private _F32/_BF16 ids); group <= 0: one group per row.
    search: int4 scales (and mins) searched for the least squared error (weighted by `weights`,
    finite and >= 0, when given); False: min/max, as ggml's reference quantizer."""
    cdef const llmrt_type_traits *tt = llmrt_type_traits_get(type_id)
    if tt == NULL or tt.blck_size != 32:
        raise ValueError(f"[wq_quantize] unsupported type id {type_id}")
    cdef int64_t rows = x.shape[0], k = x.shape[1], r
    if k % 32 != 0 or out.shape[0] != rows or <size_t>out.shape[1] != <size_t>(k // 32) * tt.type_size:
        raise ValueError(f"[wq_quantize] shapes do not match: x {(rows, k)}, out {(out.shape[0], out.shape[1])}")
    if group > 0 and group % 32 != 0:
        raise ValueError(f"[wq_quantize] group size must be a multiple of 32 or -1, got {group}")
    cdef const float *w = NULL
    if weights is not None:
        if weights.shape[0] != k:
            raise ValueError(f"[wq_quantize] weights must have one value per column ({k}), got {weights.shape[0]}")
        wa = np.asarray(weights)
        if not (np.isfinite(wa).all() and (wa >= 0).all()):
            raise ValueError("[wq_quantize] weights must be finite and >= 0")
        if k > 0:
            w = &weights[0]
    cdef int rc = 0
    cdef int rounding = LLMRT_WQ_SEARCH if search else LLMRT_WQ_MINMAX
    with nogil:
        for r in range(rows):
            rc = llmrt_wq_quantize_row_w(&x[r, 0], w, &out[r, 0], k, type_id, group, rounding)
            if rc != 0:
                break
    if rc != 0:
        raise ValueError(f"[wq_quantize] {tt.name.decode()} is not a weight-only type (status {rc})")


def wq_set_weighted_grid(float t0, float tstep, int nstep):
    """The weighted int4 search's candidate grid (csrc/wquant.c; for measurements)."""
    llmrt_wq_set_weighted_grid(t0, tstep, nstep)


def wq_layout(int type_id):
    """The GGUF block layout id a private weight-only type shares (the id itself for others)."""
    return llmrt_wq_layout(type_id)
