/* dot_avx2.c — dot-product kernels for the avx2 ISA level. Compiled for this target only (pragma
 * below); the register function is called only when the CPU supports the level. */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"

void llmrt_register_dot_kernels_avx2(llmrt_kernel_table *kt) {
    (void)kt;
}
