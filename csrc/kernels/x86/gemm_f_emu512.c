/* gemm_f_emu512.c — gemm_f_w.inc's fp32 kernels on simdw.h's AVX2 emulation (tests only: registered
 * by llmrt_set_isa_emulated through emu512.c, never by dispatch). Kernel names end in _emu. */
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SIMDW_EMU512 1
#define SIMDW_SUFFIX avx512_emu
#include "simdw.h"
#include "gemm_f_w.inc"

/* what gemm_f_avx512.c and gemm_f_bf16_avx512.c register at `level` (bf16: the CPU-feature test) */
void llmrt_register_gemm_f_emu512(llmrt_kernel_table *kt, int level, int bf16) {
    if (level < LLMRT_ISA_AVX512) return;
    register_gemm_f_avx512_emu(kt);
    if (bf16) llmrt_register_gemm_f_bf16_emu512(kt);
}
#else
void llmrt_register_gemm_f_emu512(llmrt_kernel_table *kt, int level, int bf16) {
    (void)kt; (void)level; (void)bf16;
}
#endif
