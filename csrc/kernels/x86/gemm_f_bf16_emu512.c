/* gemm_f_bf16_emu512.c — gemm_f_w.inc's vdpbf16ps kernels on simdw.h's AVX2 emulation of vdpbf16ps
 * (tests only; called by llmrt_register_gemm_f_emu512). Kernel names end in _emu. */
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SIMDW_EMU512 1
#define SIMDW_BF16 1
#define SIMDW_SUFFIX avx512_emu
#include "simdw.h"
#include "gemm_f_w.inc"

void llmrt_register_gemm_f_bf16_emu512(llmrt_kernel_table *kt) { register_gemm_f_bf16_dp_avx512_emu(kt); }
#else
void llmrt_register_gemm_f_bf16_emu512(llmrt_kernel_table *kt) { (void)kt; }
#endif
