# Restates csrc/include/llmrt/llmrt.h for Cython.
from libc.stdint cimport int64_t, uint16_t

cdef extern from "llmrt/llmrt.h" nogil:
    enum:
        LLMRT_OK
        LLMRT_EINVAL
        LLMRT_ENOMEM
        LLMRT_EUNSUPPORTED
        LLMRT_TYPE_COUNT
        LLMRT_TYPE_F32
        LLMRT_TYPE_F16
        LLMRT_ISA_COUNT

    ctypedef void (*llmrt_dequant_row_fn)(const void *x, float *y, int64_t k)
    ctypedef void (*llmrt_quant_row_fn)(const float *x, void *y, int64_t k)
    ctypedef void (*llmrt_vec_dot_fn)(int n, float *s, const void *x, const void *y)
    ctypedef void (*llmrt_gemm_fn)(int64_t K, const void *group, int n_rows, const void *x,
                                   size_t x_stride, int n_x, float *y, int64_t y_stride)

    ctypedef struct llmrt_type_traits:
        const char *name
        int64_t blck_size
        size_t type_size
        int is_quantized
        int vec_dot_type

    const llmrt_type_traits *llmrt_type_traits_get(int type)
    size_t llmrt_row_size(int type, int64_t ne)

    ctypedef struct llmrt_cpu_features:
        int sse3, ssse3, avx, avx2, fma, f16c
        int avx512f, avx512bw, avx512vl, avx512dq, avx512cd
        int avx512_vnni, avx512_bf16, avx_vnni
        int amx_tile, amx_int8, amx_bf16
        int os_avx, os_avx512, os_amx
        int amx_granted

    const char *llmrt_isa_name(int level)
    double llmrt_read_bandwidth(size_t nbytes, int n_threads, int reps)
    int llmrt_isa_from_name(const char *name)
    const llmrt_cpu_features *llmrt_cpu_features_get()
    int llmrt_isa_max_supported()
    int llmrt_cpu_init(int *capped_from, int *bad_env)
    int llmrt_set_isa(int level)
    int llmrt_set_isa_emulated(int level, int bf16)
    int llmrt_isa_emulated()
    int llmrt_simdw_op_avx512(int op, const void *a, const void *b, const void *c, void *out)
    int llmrt_simdw_op_emu512(int op, const void *a, const void *b, const void *c, void *out)
    int llmrt_isa_current()

    ctypedef void (*llmrt_attn_dots_fn)(int n, int nx, int ny, float *out, int64_t ldo, const void *x,
                                        int64_t ldx, const float *y, int64_t ldy)

    ctypedef struct llmrt_kernel_table:
        llmrt_dequant_row_fn dequant_row[64]
        const char *dequant_row_name[64]
        llmrt_quant_row_fn quant_row[64]
        const char *quant_row_name[64]
        llmrt_vec_dot_fn vec_dot[64]
        const char *vec_dot_name[64]
        llmrt_quant_row_fn quant_act_row[64]
        const char *quant_act_row_name[64]
        int pack_rows[64]
        llmrt_gemm_fn gemm[64]
        const char *gemm_name[64]
        int gemm_groups[64]
        const char *vec_swiglu_name
        const char *vec_silu_name
        const char *vec_soft_max_name
        const char *vec_geglu_name
        const char *vec_gelu_name
        void *attn_qk[64]
        llmrt_vec_dot_fn attn_pv_dot[64]
        llmrt_vec_dot_fn attn_qk_dot[64]
        llmrt_vec_dot_fn attn_dots_dot[64]
        llmrt_attn_dots_fn attn_dots[64]
        const char *attn_dots_name[64]

    const llmrt_kernel_table *llmrt_kernels()

cdef extern from "llmrt/gemm.h" nogil:
    ctypedef struct llmrt_packed:
        int type
        int R
        int64_t K
        int64_t M
        int64_t n_groups
        size_t group_bytes
        void *data

    int llmrt_pack_weight(int type, const void *src, size_t src_row_bytes, int64_t K, int64_t M,
                          llmrt_packed *out)
    void llmrt_packed_free(llmrt_packed *p)
    int llmrt_unpack_group(int type, int64_t K, const void *group, int rows, void *dst,
                           size_t dst_row_bytes)

cdef extern from "llmrt/llmrt.h" nogil:
    enum:
        LLMRT_WQ_MINMAX
        LLMRT_WQ_SEARCH
    int llmrt_wq_quantize_row(const float *x, void *y, int64_t k, int type, int64_t group, int rounding)
    int llmrt_wq_quantize_row_w(const float *x, const float *w, void *y, int64_t k, int type, int64_t group,
                                int rounding)
    int llmrt_wq_layout(int type)
    void llmrt_wq_set_weighted_grid(float t0, float tstep, int nstep)
