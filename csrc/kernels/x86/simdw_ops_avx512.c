/* simdw_ops_avx512.c — simdw.h's operations on the real AVX-512 instructions (tests only; see
 * simdw_ops_w.inc). Called only where the CPU has AVX-512 F/BW/VL/DQ (+ VNNI, BF16 for those ops). */
#include "llmrt/llmrt.h"
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")
#define SIMDW_AVX512 1
#define SIMDW_VNNI 1
#define SIMDW_BF16 1
#define SIMDW_SUFFIX avx512
#include "simdw.h"
#include "simdw_ops_w.inc"
#else
int llmrt_simdw_op_avx512(int op, const void *a, const void *b, const void *c, void *out) {
    (void)op; (void)a; (void)b; (void)c; (void)out;
    return LLMRT_EUNSUPPORTED;
}
#endif
