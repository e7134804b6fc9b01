/* gemm_q32_emu512.c — gemm_q32_w.inc on simdw.h's AVX2 emulation (tests only: registered by
 * llmrt_set_isa_emulated through emu512.c, never by dispatch). Kernel names end in _emu. */
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <math.h>
#include <stddef.h>
#include <string.h>

#define SIMDW_EMU512 1
#define SIMDW_VNNI 1
#define SIMDW_SUFFIX avx512_vnni_emu
#include "simdw.h"
#include "simd_avx2.h"
#include "gemm_k_simd.h"   /* transpose8_epi32 */
#include "gemm_q32_simd.h"
#include "gemm_q32_w.inc"

/* what gemm_q32_avx512_vnni.c registers at the avx512_vnni level */
void llmrt_register_gemm_q32_emu512(llmrt_kernel_table *kt, int level, int bf16) {
    (void)bf16;
    if (level >= LLMRT_ISA_AVX512_VNNI) register_gemm_q32_avx512_vnni_emu(kt);
}
#else
void llmrt_register_gemm_q32_emu512(llmrt_kernel_table *kt, int level, int bf16) {
    (void)kt; (void)level; (void)bf16;
}
#endif
