/* amx.c — kernels for the amx ISA level: the real-instruction backend of the AMX tile layer
 * (llmrt/amx.h) and the AMX GEMMs (../amx_gemm.h) compiled against it. Compiled for this target
 * only (pragma below); everything here runs only when llmrt_amx_hw_available() says the CPU and
 * the OS grant AMX. Where the compiler lacks the AMX intrinsics, the entry points report
 * LLMRT_EUNSUPPORTED and llmrt_amx_hw_available() is 0, so the build never breaks. */
#if defined(__x86_64__)
#pragma GCC target("amx-tile,amx-int8,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/amx.h"
#include "llmrt/llmrt.h"

#if defined(__x86_64__) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
#define LLMRT_AMX_HW_COMPILED 1
#else
#define LLMRT_AMX_HW_COMPILED 0
#endif

void llmrt_register_kernels_amx(llmrt_kernel_table *kt) {
    (void)kt; /* the AMX GEMMs are called directly (llmrt_amx_gemm_*), not through the table */
}

int llmrt_amx_hw_available(void) {
    const llmrt_cpu_features *f = llmrt_cpu_features_get();
    return LLMRT_AMX_HW_COMPILED && f->amx_tile && f->amx_int8 && f->os_amx && f->amx_granted;
}

int llmrt_amx_hw_bf16_available(void) {
    return llmrt_amx_hw_available() && llmrt_cpu_features_get()->amx_bf16;
}

#if LLMRT_AMX_HW_COMPILED

/* One instruction on tmm0 (C) / tmm1 (A) / tmm2 (B), buffers row-major with rows of colsb bytes. */
int llmrt_amx_dp_once_hw(int op, const llmrt_amx_tilecfg *cfg, void *c, const void *a,
                         const void *b) {
    __asm__ volatile("" : : "r"(cfg) : "memory"); /* see AMX_CONFIG below */
    _tile_loadconfig(cfg);
    _tile_loadd(0, c, cfg->colsb[0]);
    _tile_loadd(1, a, cfg->colsb[1]);
    _tile_loadd(2, b, cfg->colsb[2]);
    switch (op) {
    case LLMRT_AMX_DPBSSD: _tile_dpbssd(0, 1, 2); break;
    case LLMRT_AMX_DPBSUD: _tile_dpbsud(0, 1, 2); break;
    case LLMRT_AMX_DPBUSD: _tile_dpbusd(0, 1, 2); break;
    case LLMRT_AMX_DPBUUD: _tile_dpbuud(0, 1, 2); break;
    case LLMRT_AMX_DPBF16PS: _tile_dpbf16ps(0, 1, 2); break;
    default: _tile_release(); return LLMRT_EINVAL;
    }
    _tile_stored(0, c, cfg->colsb[0]);
    _tile_release();
    return LLMRT_OK;
}

#define AMX_FN(name) name##_hw
#define AMX_STATE do { } while (0)
/* gcc's _tile_loadconfig tells the compiler it reads only 8 bytes of the 64-byte operand: the
 * barrier makes every store to the config happen before LDTILECFG. */
#define AMX_CONFIG(cfgp) do { __asm__ volatile("" : : "r"(cfgp) : "memory"); \
                              _tile_loadconfig(cfgp); } while (0)
#define AMX_RELEASE() _tile_release()
#define AMX_STATUS LLMRT_OK
#define AMX_LOAD(t, p, stride) _tile_loadd(t, (p), (stride))
#define AMX_STORE(t, p, stride) _tile_stored(t, (p), (stride))
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#define AMX_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#include "../amx_gemm.h"

#else /* no AMX intrinsics in this compiler / not x86-64: never called (availability is 0) */

int llmrt_amx_dp_once_hw(int op, const llmrt_amx_tilecfg *cfg, void *c, const void *a,
                         const void *b) {
    (void)op; (void)cfg; (void)c; (void)a; (void)b;
    return LLMRT_EUNSUPPORTED;
}

int llmrt_amx_gemm_int8_hw(const llmrt_amx_packed *w, const uint8_t *act, size_t act_nb1,
                           int64_t n, float *y, size_t y_nb1, int64_t row0, int64_t row1, int kc) {
    (void)w; (void)act; (void)act_nb1; (void)n; (void)y; (void)y_nb1; (void)row0; (void)row1;
    (void)kc;
    return LLMRT_EUNSUPPORTED;
}

int llmrt_amx_gemm_bf16_hw(const llmrt_amx_packed *w, const uint8_t *xb, size_t xb_nb1,
                           int64_t n, float *y, size_t y_nb1, int64_t row0, int64_t row1) {
    (void)w; (void)xb; (void)xb_nb1; (void)n; (void)y; (void)y_nb1; (void)row0; (void)row1;
    return LLMRT_EUNSUPPORTED;
}

#endif
