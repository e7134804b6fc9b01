/*
 * emu512.c — the emulated AVX-512 levels (tests only): llmrt_set_isa_emulated() fills the kernel
 * table with generic, then AVX2, then what this function registers: the emulated twin of every
 * AVX-512 kernel file written on simdw.h, in the same order as llmrt_set_isa registers the real
 * ones. A kernel file `foo_avx512.c` built on simdw.h has `foo_emu512.c` (same *_w.inc bodies,
 * SIMDW_EMU512) whose register function takes (kt, level, bf16) and registers what the real files
 * register at that level, with the same CPU-feature conditions replaced by `level` / `bf16`.
 * AVX-512 kernels not (yet) written on simdw.h have no twin: at an emulated level their AVX2
 * entries stay, so the table is what a CPU with that level runs minus those kernels.
 */
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

void llmrt_register_kernels_emu512(llmrt_kernel_table *kt, int level, int bf16) {
    llmrt_register_gemm_f_emu512(kt, level, bf16);
    llmrt_register_wq_bf16_emu512(kt, level, bf16);
    llmrt_register_gemm_kq_emu512(kt, level, bf16);
    llmrt_register_gemm_q32_emu512(kt, level, bf16);
}
