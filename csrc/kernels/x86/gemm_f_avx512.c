/* gemm_f_avx512.c — F32 / F16 / BF16 vec_dot + packed gemm of the 512-bit levels (gemm_f_w.inc, fp32
 * fmas) on the real instructions. The register function is called only where the CPU has AVX-512
 * F/BW/VL/DQ (llmrt_set_isa). (It replaces the former raw-intrinsic dot_avx512.c + gemm_k_avx512.c,
 * keeping their vec_dot order.) */
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SIMDW_AVX512 1
#define SIMDW_SUFFIX avx512
#include "simdw.h"
#include "gemm_f_w.inc"

void llmrt_register_gemm_f_kernels_avx512(llmrt_kernel_table *kt) { register_gemm_f_avx512(kt); }
#else
void llmrt_register_gemm_f_kernels_avx512(llmrt_kernel_table *kt) { (void)kt; }
#endif
