/*
 * gemm_avx512.c — packed-weight gemm kernels (gemm.h) for the AVX512 level.
 *
 * dot_avx512.c's vec_dot for Q4_0, Q4_1, Q5_0 and Q8_0 sums two blocks per zmm, an order the AVX2
 * gemm does not follow, and this level has no gemm of its own for them yet: their gemm entry is
 * cleared, so MUL_MAT runs that vec_dot on the plain rows (bit-exact by construction). Q5_1 keeps
 * the AVX2 vec_dot at this level, and so the AVX2 gemm.
 */
#include "llmrt/gemm.h"

void llmrt_register_gemm_kernels_avx512(llmrt_kernel_table *kt) {
    static const int differ[] = { LLMRT_TYPE_Q4_0, LLMRT_TYPE_Q4_1, LLMRT_TYPE_Q5_0, LLMRT_TYPE_Q8_0 };
    for (size_t i = 0; i < sizeof(differ) / sizeof(differ[0]); i++) {
        kt->gemm[differ[i]] = NULL;
        kt->gemm_name[differ[i]] = NULL;
        kt->gemm_groups[differ[i]] = 0;
    }
}
