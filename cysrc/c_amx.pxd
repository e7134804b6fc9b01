# Restates csrc/include/llmrt/amx.h for Cython (the AMX tile layer and GEMMs).
from libc.stdint cimport int64_t, uint8_t, uint16_t

cdef extern from "llmrt/amx.h" nogil:
    enum:
        LLMRT_AMX_MODEL
        LLMRT_AMX_HW
        LLMRT_AMX_NOPS
        LLMRT_AMX_KIND_INT8
        LLMRT_AMX_KIND_BF16
        LLMRT_AMX_ROW_STEP

    ctypedef struct llmrt_amx_packed:
        int kind
        int wtype
        int has_min
        int64_t M, K
        int64_t ngroups
        int64_t nkb
        size_t blk_bytes
        size_t group_bytes
        uint8_t *data

    int llmrt_amx_dp_once(int backend, int op, int m, int n, int ka, void *c, const void *a,
                          const void *b)
    int llmrt_amx_hw_available()
    void llmrt_amx_set_matmul(int backend)
    int llmrt_amx_matmul()
    long llmrt_amx_matmul_calls()
    int llmrt_amx_hw_bf16_available()
    int llmrt_amx_supports(int wtype)
    int llmrt_amx_pack(llmrt_amx_packed *p, int wtype, const void *w, size_t nb1, int64_t M,
                       int64_t K)
    void llmrt_amx_packed_free(llmrt_amx_packed *p)
    int llmrt_amx_act_type(const llmrt_amx_packed *p)
    int llmrt_amx_gemm_int8(const llmrt_amx_packed *w, const void *act, size_t act_nb1, int64_t n,
                            float *y, size_t y_nb1, int64_t row0, int64_t row1, int kc,
                            int backend)
    void llmrt_amx_act_bf16(const float *x, size_t x_nb1, int64_t n, int64_t K, uint16_t *xb,
                            size_t xb_nb1)
    int llmrt_amx_gemm_bf16(const llmrt_amx_packed *w, const uint16_t *xb, size_t xb_nb1,
                            int64_t n, float *y, size_t y_nb1, int64_t row0, int64_t row1,
                            int backend)
