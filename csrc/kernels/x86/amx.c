/* amx.c — kernels for the amx ISA level. Compiled for this target only (pragma below); the
 * register function is called only when the CPU supports the level. */
#if defined(__x86_64__)
#pragma GCC target("amx-tile,amx-int8,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"

void llmrt_register_kernels_amx(llmrt_kernel_table *kt) {
    (void)kt;
}
