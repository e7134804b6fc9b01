/* wq_bf16_emu512.c — wq_w.inc's vdpbf16ps kernels of the WQ_<L>_BF16 types on simdw.h's AVX2
 * emulation (tests only: registered by llmrt_set_isa_emulated through emu512.c, never by
 * dispatch). Kernel names end in _emu. */
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../gemm_q32.h"

#define SIMDW_EMU512 1
#define SIMDW_BF16 1
#define SIMDW_SUFFIX avx512_emu
#include "simdw.h"
#include "wq_w.inc"

/* what wq_bf16_avx512.c registers at `level` (bf16: the CPU-feature test) */
void llmrt_register_wq_bf16_emu512(llmrt_kernel_table *kt, int level, int bf16) {
    if (level >= LLMRT_ISA_AVX512 && bf16) register_wq_bf16_dp_avx512_emu(kt);
}
#else
void llmrt_register_wq_bf16_emu512(llmrt_kernel_table *kt, int level, int bf16) {
    (void)kt; (void)level; (void)bf16;
}
#endif
