/*
 * gemm_avx512.c — packed-weight gemm kernels (gemm.h) for the AVX512 level. Compiled for this
 * target only; the register function is called only when the CPU supports the level.
 */
#include "llmrt/gemm.h"

void llmrt_register_gemm_kernels_avx512(llmrt_kernel_table *kt) {
    (void)kt;
}
