/* gemm_q32_avx512_vnni.c — the 32-block vec_dot and gemm kernels of the avx512_vnni level (gemm_q32_w.inc) on
 * the real instructions. The register function is called only where the CPU has AVX-512
 * F/BW/VL/DQ and AVX512-VNNI (llmrt_set_isa). */
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include <math.h>
#include <stddef.h>
#include <string.h>

#define SIMDW_AVX512 1
#define SIMDW_VNNI 1
#define SIMDW_SUFFIX avx512_vnni
#include "simdw.h"
#include "simd_avx2.h"
#include "gemm_k_simd.h"   /* transpose8_epi32 */
#include "gemm_q32_simd.h"
#include "gemm_q32_w.inc"

void llmrt_register_gemm_q32_kernels_avx512_vnni(llmrt_kernel_table *kt) { register_gemm_q32_avx512_vnni(kt); }
#else
void llmrt_register_gemm_q32_kernels_avx512_vnni(llmrt_kernel_table *kt) { (void)kt; }
#endif
