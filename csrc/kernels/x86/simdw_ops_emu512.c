/* simdw_ops_emu512.c — simdw.h's operations on the AVX2 emulation backend (tests only; see
 * simdw_ops_w.inc). Needs AVX2 + FMA + F16C. */
#include "llmrt/llmrt.h"
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#define SIMDW_EMU512 1
#define SIMDW_VNNI 1
#define SIMDW_BF16 1
#define SIMDW_SUFFIX emu512
#include "simdw.h"
#include "simdw_ops_w.inc"
#else
int llmrt_simdw_op_emu512(int op, const void *a, const void *b, const void *c, void *out) {
    (void)op; (void)a; (void)b; (void)c; (void)out;
    return LLMRT_EUNSUPPORTED;
}
#endif
