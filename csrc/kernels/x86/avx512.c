/* avx512.c — kernels for the avx512 ISA level. Compiled for this target only (pragma below); the
 * register function is called only when the CPU supports the level. */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"

void llmrt_register_kernels_avx512(llmrt_kernel_table *kt) {
    (void)kt;
}
