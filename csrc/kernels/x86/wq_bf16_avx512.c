/* wq_bf16_avx512.c — the WQ_<L>_BF16 types with vdpbf16ps (wq_w.inc) on the real instructions. The
 * register function is called only where the CPU has AVX-512 F/BW/VL/DQ and AVX512-BF16
 * (llmrt_set_isa), after wq_avx2.c's, whose WQ_<L>_BF16 kernels it replaces. */
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../gemm_q32.h"

#define SIMDW_AVX512 1
#define SIMDW_BF16 1
#define SIMDW_SUFFIX avx512
#include "simdw.h"
#include "wq_w.inc"

void llmrt_register_wq_bf16_kernels_avx512(llmrt_kernel_table *kt) { register_wq_bf16_dp_avx512(kt); }
#else
void llmrt_register_wq_bf16_kernels_avx512(llmrt_kernel_table *kt) { (void)kt; }
#endif
