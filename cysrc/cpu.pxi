# CPU probe, ISA level and kernel table (csrc/cpu.c).
from c_llmrt cimport *

_FEATURE_NAMES = (
    "sse3", "ssse3", "avx", "avx2", "fma", "f16c",
    "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
    "avx512_vnni", "avx512_bf16", "avx_vnni",
    "amx_tile", "amx_int8", "amx_bf16", "os_avx", "os_avx512", "os_amx", "amx_granted",
)

ISA_NAMES = tuple(llmrt_isa_name(i).decode() for i in range(LLMRT_ISA_COUNT))


def cpu_features():
    """Dict of CPU feature flags as the probe found them (after OS support checks)."""
    cdef const llmrt_cpu_features *f = llmrt_cpu_features_get()
    values = (
        f.sse3, f.ssse3, f.avx, f.avx2, f.fma, f.f16c,
        f.avx512f, f.avx512bw, f.avx512vl, f.avx512dq, f.avx512cd,
        f.avx512_vnni, f.avx512_bf16, f.avx_vnni,
        f.amx_tile, f.amx_int8, f.amx_bf16, f.os_avx, f.os_avx512, f.os_amx, f.amx_granted,
    )
    return {name: bool(v) for name, v in zip(_FEATURE_NAMES, values)}


def isa_max_supported():
    """Name of the highest ISA level this CPU (and OS) supports."""
    return ISA_NAMES[llmrt_isa_max_supported()]


def cpu_init():
    """Initialize from LLMRT_ISA. Returns (level in effect, capped-from level or None, bad_env)."""
    cdef int capped = -1
    cdef int bad = 0
    cdef int level = llmrt_cpu_init(&capped, &bad)
    return ISA_NAMES[level], (ISA_NAMES[capped] if capped >= 0 else None), bool(bad)


def set_isa(name):
    """Refill the kernel table for ISA level `name`, reduced to what the CPU has. Returns the
    level in effect."""
    cdef int level = llmrt_isa_from_name(name.encode())
    if level < 0:
        raise ValueError(f"unknown ISA level {name!r}; expected one of {', '.join(ISA_NAMES)}")
    return ISA_NAMES[llmrt_set_isa(level)]


def set_isa_emulated(name, bint bf16=True):
    """Tests only: the kernel table of level `name` (avx512 | avx512_vnni) with its AVX-512 kernels
    on simdw.h's AVX2 emulation (csrc/kernels/x86/emu512.c). Returns the level name."""
    cdef int level = llmrt_isa_from_name(name.encode())
    cdef int r = llmrt_set_isa_emulated(level, 1 if bf16 else 0)
    if r < 0:
        raise ValueError(f"cannot emulate ISA level {name!r} here (needs avx512 or avx512_vnni, and AVX2)")
    return ISA_NAMES[r]


def isa_emulated():
    return bool(llmrt_isa_emulated())


SIMDW_OPS = ("add_epi8", "sub_epi16", "add_epi32", "mullo_epi16", "maddubs_epi16", "madd_epi16",
             "shuffle_epi8", "sign_epi8", "srli_epi16_4", "and_or_andnot", "bcast256", "unpack_epi8",
             "dpbusd", "fmadd_ps", "cvtepi32_ps", "cvtph_ps", "reduce_add_ps", "dpbf16_ps",
             "cvtepu8_epi16", "cvtepi8_epi32", "cvtepi32_epi16", "permutexvar_epi16", "bcast64", "pairsum_epi32", "dpwssd",
             "unpacklo_epi32", "unpackhi_epi32", "unpacklo_epi64", "unpackhi_epi64", "shuf128_even",
             "shuf128_odd")


def simdw_op(str backend, str op, const unsigned char[::1] a, const unsigned char[::1] b,
             const unsigned char[::1] c):
    """Tests only: out = op(a, b, c) on 64-byte vectors with simdw.h's backend "avx512" (the real
    instructions: the caller checks the CPU has them) or "emu512". Returns 64 bytes."""
    if a.shape[0] != 64 or b.shape[0] != 64 or c.shape[0] != 64:
        raise ValueError("simdw_op operands are 64 bytes each")
    cdef int opi = SIMDW_OPS.index(op)
    out = bytearray(64)
    cdef unsigned char[::1] o = out
    cdef int r
    if backend == "avx512":
        r = llmrt_simdw_op_avx512(opi, &a[0], &b[0], &c[0], &o[0])
    elif backend == "emu512":
        r = llmrt_simdw_op_emu512(opi, &a[0], &b[0], &c[0], &o[0])
    else:
        raise ValueError(f"unknown simdw backend {backend!r}")
    if r != 0:
        raise RuntimeError(f"simdw op {op} failed on {backend}: status {r}")
    return bytes(out)


def isa_current():
    return ISA_NAMES[llmrt_isa_current()]


def kernel_names():
    """{table: {type name: kernel name}} for every filled entry of the kernel table."""
    cdef const llmrt_kernel_table *kt = llmrt_kernels()
    cdef const llmrt_type_traits *tt
    out = {"dequant_row": {}, "quant_row": {}, "vec_dot": {}, "quant_act_row": {}, "gemm": {}}
    for t in range(LLMRT_TYPE_COUNT):
        tt = llmrt_type_traits_get(t)
        if tt == NULL:
            continue
        tname = tt.name.decode()
        if kt.dequant_row_name[t] != NULL:
            out["dequant_row"][tname] = kt.dequant_row_name[t].decode()
        if kt.quant_row_name[t] != NULL:
            out["quant_row"][tname] = kt.quant_row_name[t].decode()
        if kt.vec_dot_name[t] != NULL:
            out["vec_dot"][tname] = kt.vec_dot_name[t].decode()
        if kt.quant_act_row_name[t] != NULL:
            out["quant_act_row"][tname] = kt.quant_act_row_name[t].decode()
        if kt.pack_rows[t] > 0 and kt.gemm_name[t] != NULL:   # packed path (gemm.h)
            out["gemm"][tname] = kt.gemm_name[t].decode()
    return out


def vec_kernel_names():
    """{entry: kernel name} for the kernel table's vector-math entries (swiglu, silu, soft_max,
    geglu, gelu)."""
    cdef const llmrt_kernel_table *kt = llmrt_kernels()
    return {"vec_swiglu": kt.vec_swiglu_name.decode(), "vec_silu": kt.vec_silu_name.decode(),
            "vec_soft_max": kt.vec_soft_max_name.decode(), "vec_geglu": kt.vec_geglu_name.decode(),
            "vec_gelu": kt.vec_gelu_name.decode()}


def type_traits(int type_id):
    """(name, block size, bytes per block, is_quantized, vec_dot_type) or None if unsupported."""
    cdef const llmrt_type_traits *tt = llmrt_type_traits_get(type_id)
    if tt == NULL:
        return None
    return (tt.name.decode(), tt.blck_size, tt.type_size, bool(tt.is_quantized), tt.vec_dot_type)


def read_bandwidth(size_t nbytes=256 << 20, int n_threads=1, int reps=3):
    """Measured memory read bandwidth in bytes/s: the best of `reps` reads of an nbytes buffer
    by n_threads threads (csrc/membw.c). Raises MemoryError if it cannot run."""
    cdef double bw
    with nogil:
        bw = llmrt_read_bandwidth(nbytes, n_threads, reps)
    if bw <= 0:
        raise MemoryError(f"could not measure bandwidth ({nbytes} bytes, {n_threads} threads)")
    return bw
