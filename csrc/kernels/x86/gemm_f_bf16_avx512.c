/* gemm_f_bf16_avx512.c — BF16 weights with vdpbf16ps (gemm_f_w.inc, SIMDW_BF16 = 1) on the real
 * instructions: vec_dot_bf16_dp_avx512 + gemm_bf16_dp_avx512. The register function is called only
 * where the CPU has AVX-512 F/BW/VL/DQ and AVX512-BF16 (llmrt_set_isa), after
 * llmrt_register_gemm_f_kernels_avx512, whose BF16 pair it replaces. */
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SIMDW_AVX512 1
#define SIMDW_BF16 1
#define SIMDW_SUFFIX avx512
#include "simdw.h"
#include "gemm_f_w.inc"

void llmrt_register_gemm_f_bf16_kernels_avx512(llmrt_kernel_table *kt) { register_gemm_f_bf16_dp_avx512(kt); }
#else
void llmrt_register_gemm_f_bf16_kernels_avx512(llmrt_kernel_table *kt) { (void)kt; }
#endif
