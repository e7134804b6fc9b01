/*
 * amx.h — the AMX path: a tile-instruction layer with two backends, and int8 / bf16 GEMMs on it.
 *
 * Why a layer: the machines that build and test llmrt mostly lack AMX. The GEMMs below are written
 * once against eight tile operations (config, load, store, zero, TDPB[SU][SU]D, TDPBF16PS) and
 * compiled twice: against a portable software model of the tiles (csrc/kernels/amx_model.c, runs
 * anywhere, so packing, tiling and edge handling are tested bit-exactly on every machine) and
 * against the real instructions (csrc/kernels/x86/amx.c, run only when CPUID + XGETBV + Linux's
 * arch_prctl(ARCH_REQ_XCOMP_PERM) grant AMX; see csrc/cpu.c). Same source, same arithmetic order:
 * the two backends must agree bit for bit (tests/test_amx.py checks it where AMX exists).
 *
 * How to use the GEMMs (y = x · Wᵀ, W: M rows of K elements, x: n rows, y: n rows of M floats):
 *
 *   int8 (weights Q8_0, Q4_0, Q5_0 with Q8_0 activations; Q4_1, Q5_1 with Q8_1 activations):
 *     llmrt_amx_packed w;
 *     llmrt_amx_pack(&w, LLMRT_TYPE_Q4_0, raw, row_bytes, M, K);    // once, at load
 *     // per batch: quantize x with the kernel table's quant_act_row[llmrt_amx_act_type(&w)],
 *     // one row of K elements per token (row stride act_nb1 bytes), then per thread:
 *     llmrt_amx_gemm_int8(&w, act, act_nb1, n, y, y_nb1, row0, row1, 0, LLMRT_AMX_HW);
 *     llmrt_amx_packed_free(&w);
 *   bf16 (weights F32, F16, BF16; activations rounded to bf16 by llmrt_amx_act_bf16):
 *     llmrt_amx_pack(&w, LLMRT_TYPE_F16, raw, row_bytes, M, K);
 *     llmrt_amx_act_bf16(x, x_nb1, n, K, xb, xb_nb1);                  // xb: n rows of K_pad bf16
 *     llmrt_amx_gemm_bf16(&w, xb, xb_nb1, n, y, y_nb1, row0, row1, LLMRT_AMX_HW);
 *
 *   row0/row1 select the weight rows (= output columns) one call computes, so threads split M:
 *   row0 a multiple of 32 (LLMRT_AMX_ROW_STEP), row1 a multiple of 32 or M. Calls on disjoint row
 *   ranges write disjoint output columns and may run concurrently. backend = LLMRT_AMX_MODEL runs
 *   the software model (slow; for tests), LLMRT_AMX_HW the instructions (LLMRT_EUNSUPPORTED when
 *   llmrt_amx_hw_available() is 0). No allocation in the GEMMs.
 *
 * Arithmetic (the order both backends follow, per output y[t][r]):
 *   int8: acc = 0; for each 32-block kb in order: ci = Σ_k xq[t][k]·wq[r][k] (exact int32),
 *         acc = fmaf((float)ci, dw[r][kb] * dx[t][kb], acc);  and for Q4_1/Q5_1 then
 *         acc = fmaf(mw[r][kb], sx[t][kb], acc)   (sx = the Q8_1 block's s = dx·Σxq);  y = acc.
 *   bf16: the TDPBF16PS order: acc = 0; for each K pair p in order:
 *         acc = ftz(fma(a[2p], b[2p], acc)); acc = ftz(fma(a[2p+1], b[2p+1], acc)) (see below).
 */
#ifndef LLMRT_AMX_H
#define LLMRT_AMX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tile layer -------------------------------------------------------------------------------- */

enum {
    LLMRT_AMX_NTILES = 8,      /* palette 1: tmm0..tmm7 */
    LLMRT_AMX_MAX_ROWS = 16,   /* rows per tile */
    LLMRT_AMX_MAX_COLSB = 64,  /* bytes per tile row */
};

/* Backends. */
enum { LLMRT_AMX_MODEL = 0, LLMRT_AMX_HW = 1 };

/* Tile dot-product instructions. */
typedef enum {
    LLMRT_AMX_DPBSSD = 0,   /* int8 A signed   x int8 B signed   -> int32 */
    LLMRT_AMX_DPBSUD = 1,   /* int8 A signed   x int8 B unsigned -> int32 */
    LLMRT_AMX_DPBUSD = 2,   /* int8 A unsigned x int8 B signed   -> int32 */
    LLMRT_AMX_DPBUUD = 3,   /* int8 A unsigned x int8 B unsigned -> int32 */
    LLMRT_AMX_DPBF16PS = 4, /* bf16 pairs -> f32 */
    LLMRT_AMX_NOPS = 5,
} llmrt_amx_op;

/* The 64-byte LDTILECFG memory operand, palette 1 (byte-compatible with the instruction). */
typedef struct {
    uint8_t palette_id;     /* 1 */
    uint8_t start_row;      /* 0 (restart point after an interrupted load/store) */
    uint8_t reserved[14];   /* 0 */
    uint16_t colsb[16];     /* bytes per row of tile i (<= 64); tiles 8..15 must be 0 */
    uint8_t rows[16];       /* rows of tile i (<= 16); tiles 8..15 must be 0 */
} llmrt_amx_tilecfg;
_Static_assert(sizeof(llmrt_amx_tilecfg) == 64, "LDTILECFG operand is 64 bytes");

/* The software model: eight 1 KiB tiles and the current configuration.
 *
 * Semantics follow Intel's SDM pseudo-code (TILELOADD, TILESTORED, TILEZERO, TDPB*D, TDPBF16PS):
 *   load   row r < rows[t]: colsb[t] bytes from base + r*stride; the rest of the tile is zeroed.
 *   store  row r < rows[t]: colsb[t] bytes to base + r*stride; nothing else is written.
 *   dpb*d  C[m][n] += Σ_{k < colsb(A)/4} Σ_{i<4} A[m][4k+i] · B[k][4n+i], int8 signed or unsigned
 *          per operand, int32 accumulation wrapping modulo 2^32 (computed in uint32).
 *   dpbf16ps  for k, then for i in {0,1}: C[m][n] = fma(A[m].bf16[2k+i], B[k].bf16[2n+i], C[m][n])
 *          rounded to nearest even; input denormals (A, B and C) read as zero, output denormals
 *          flushed to zero (signed), MXCSR ignored. NaN: any NaN operand or an invalid operation
 *          gives a NaN; the model's payload/sign may differ from hardware (compare isnan only).
 *          Where the model may differ from hardware: products below the f32 normal range (the SDM
 *          does not say whether the FMA's exact product or a flushed product is accumulated: the
 *          model accumulates the exact product, then flushes the sum), and the tininess test of
 *          FTZ (the model flushes a sum whose rounded value is below 2^-126). Finite normal data
 *          whose partial sums stay normal is exact.
 *   Invalid uses (unconfigured, tile index, rows/colsb beyond palette 1, shape mismatch in a dot
 *   product: rows(A) = rows(C), colsb(A)/4 = rows(B), colsb(B) = colsb(C)) raise #UD on hardware;
 *   the model sets err = LLMRT_EINVAL (sticky) and leaves the tiles unchanged. */
typedef struct {
    llmrt_amx_tilecfg cfg;
    int configured;
    int err;
    uint8_t t[LLMRT_AMX_NTILES][LLMRT_AMX_MAX_ROWS * LLMRT_AMX_MAX_COLSB]; /* row r at [r*64] */
} llmrt_amx_model;

void llmrt_amx_model_init(llmrt_amx_model *s);
void llmrt_amx_model_config(llmrt_amx_model *s, const llmrt_amx_tilecfg *cfg); /* zeroes tiles */
void llmrt_amx_model_release(llmrt_amx_model *s);
void llmrt_amx_model_load(llmrt_amx_model *s, int t, const void *base, size_t stride);
void llmrt_amx_model_store(llmrt_amx_model *s, int t, void *base, size_t stride);
void llmrt_amx_model_zero(llmrt_amx_model *s, int t);
void llmrt_amx_model_dp(llmrt_amx_model *s, int op, int c, int a, int b);

/* One dot-product instruction on the chosen backend, for tests: configures tmm0 = C (m rows x
 * 4n bytes), tmm1 = A (m x ka bytes), tmm2 = B (ka/4 rows x 4n bytes), loads C, A, B from
 * contiguous row-major buffers, runs `op`, stores C back, releases. m in 1..16, n in 1..16,
 * ka in 4..64 step 4. Returns LLMRT_OK, LLMRT_EINVAL or LLMRT_EUNSUPPORTED (no AMX for HW). */
int llmrt_amx_dp_once(int backend, int op, int m, int n, int ka, void *c, const void *a,
                      const void *b);

/* 1 when the real instructions may run: AMX-TILE + AMX-INT8 present, OS saves tile state and
 * Linux granted XTILEDATA (csrc/cpu.c), and this build has the intrinsics. bf16 also needs
 * llmrt_amx_hw_bf16_available(). */
int llmrt_amx_hw_available(void);
int llmrt_amx_hw_bf16_available(void);

/* ---- packed weights ----------------------------------------------------------------------------- */

enum {
    LLMRT_AMX_KIND_INT8 = 0,
    LLMRT_AMX_KIND_BF16 = 1,
    LLMRT_AMX_ROW_STEP = 32,   /* output columns per inner step (two 16-column tiles) */
    LLMRT_AMX_KC_DEFAULT = 32, /* int8: 32-blocks per K chunk (L1/L2 blocking of the weights) */
};

/* Weights repacked into the B-tile ("VNNI") layout, 64-byte aligned, rows padded to a multiple
 * of 16 with zeros (scales 0). Group g holds rows 16g..16g+15, contiguous over K:
 *   int8, per 32-block kb: int8 q[8][16][4] (q[kk][n][i] = weight q of row 16g+n, element
 *        32kb+4kk+i, Q4_0/Q5_0 with their offset removed: q-8, q-16; Q4_1/Q5_1 unsigned q
 *        0..15 / 0..31, all fit int8), then float d[16] (the block scales, f16 -> f32 exact),
 *        then for Q4_1/Q5_1 float m[16] (the mins).                 blk_bytes = 576 or 640
 *   bf16, per 32-element chunk c: bf16 q[16][16][2] (q[p][n][i] = row 16g+n, element 32c+2p+i,
 *        rounded to nearest even from F32/F16; K padded with zeros to a multiple of 32). 1024 B */
typedef struct llmrt_amx_packed {
    int kind;            /* LLMRT_AMX_KIND_* */
    int wtype;           /* source GGUF type */
    int has_min;         /* int8: Q4_1 / Q5_1 (needs Q8_1 activations with their s) */
    int64_t M, K;        /* weight rows, elements per row */
    int64_t ngroups;     /* ceil(M / 16) */
    int64_t nkb;         /* int8: K / 32 blocks; bf16: ceil(K / 32) chunks (K_pad = 32 nkb) */
    size_t blk_bytes;    /* bytes per (group, block) */
    size_t group_bytes;  /* nkb * blk_bytes */
    uint8_t *data;       /* (ngroups, nkb, blk_bytes), 64-byte aligned, owned */
} llmrt_amx_packed;

/* 1 if `wtype` can be packed (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 -> int8; F32, F16, BF16 -> bf16). */
int llmrt_amx_supports(int wtype);
/* Packs M rows of K elements of `wtype` (row r at w + r*nb1). K must be a multiple of 32 for
 * the quantized types. Allocates p->data. LLMRT_OK, LLMRT_EINVAL, LLMRT_EUNSUPPORTED, LLMRT_ENOMEM. */
int llmrt_amx_pack(llmrt_amx_packed *p, int wtype, const void *w, size_t nb1, int64_t M, int64_t K);
void llmrt_amx_packed_free(llmrt_amx_packed *p);
/* The activation type the int8 GEMM reads: LLMRT_TYPE_Q8_0 or LLMRT_TYPE_Q8_1 (-1 for bf16). */
int llmrt_amx_act_type(const llmrt_amx_packed *p);

/* ---- MUL_MAT's use of the AMX path -------------------------------------------------------------- */

/* MUL_MAT runs a weight with an AMX copy (llmrt_graph_weight_amx) through llmrt_amx_gemm_int8 when
 * the run has at least LLMRT_AMX_MIN_TOKENS tokens and the switch below is on: backend
 * LLMRT_AMX_HW (set by llmrt_set_isa at the amx level when the CPU grants AMX) or LLMRT_AMX_MODEL
 * (the software model: for tests on machines without AMX), -1 off. Fewer tokens (decode) keep the
 * AVX-512 VNNI / AVX2 kernels. llmrt_amx_matmul_calls() counts the MUL_MAT nodes that took the
 * AMX path (for tests). Change the switch between graph runs, never during one: every thread of a
 * MUL_MAT node reads it and all must take the same path. */
enum { LLMRT_AMX_MIN_TOKENS = 16 };
void llmrt_amx_set_matmul(int backend);  /* -1, LLMRT_AMX_MODEL or LLMRT_AMX_HW (if available) */
int llmrt_amx_matmul(void);
long llmrt_amx_matmul_calls(void);
void llmrt_amx_count_matmul(void);

/* ---- GEMMs ---------------------------------------------------------------------------------------- */

/* y[t][r] for t < n, row0 <= r < row1 (see the top of this file). act: n rows of K elements of
 * llmrt_amx_act_type(w) blocks, row t at act + t*act_nb1. y row t at y + t*y_nb1 (bytes). kc: K
 * blocking in 32-blocks (0 = LLMRT_AMX_KC_DEFAULT); it does not change the result. */
int llmrt_amx_gemm_int8(const llmrt_amx_packed *w, const void *act, size_t act_nb1, int64_t n,
                        float *y, size_t y_nb1, int64_t row0, int64_t row1, int kc, int backend);

/* Rounds n rows of K floats (row t at x + t*x_nb1 bytes) to bf16 (nearest even), zero-padded to
 * K_pad = 32*ceil(K/32) elements; row t at xb + t*xb_nb1 bytes. */
void llmrt_amx_act_bf16(const float *x, size_t x_nb1, int64_t n, int64_t K, uint16_t *xb,
                        size_t xb_nb1);

/* y[t][r] = the TDPBF16PS-ordered dot of bf16 activation row t (K_pad elements at
 * xb + t*xb_nb1) with packed row r, for t < n, row0 <= r < row1. */
int llmrt_amx_gemm_bf16(const llmrt_amx_packed *w, const uint16_t *xb, size_t xb_nb1, int64_t n,
                        float *y, size_t y_nb1, int64_t row0, int64_t row1, int backend);

/* Backend entry points behind the two GEMMs (the callers validate arguments first). They return
 * LLMRT_OK, or for the model LLMRT_EINVAL if the GEMM used a tile invalidly (a bug). */
int llmrt_amx_gemm_int8_model(const llmrt_amx_packed *w, const uint8_t *act, size_t act_nb1,
                               int64_t n, float *y, size_t y_nb1, int64_t row0, int64_t row1,
                               int kc);
int llmrt_amx_gemm_bf16_model(const llmrt_amx_packed *w, const uint8_t *xb, size_t xb_nb1,
                               int64_t n, float *y, size_t y_nb1, int64_t row0, int64_t row1);
int llmrt_amx_gemm_int8_hw(const llmrt_amx_packed *w, const uint8_t *act, size_t act_nb1,
                            int64_t n, float *y, size_t y_nb1, int64_t row0, int64_t row1, int kc);
int llmrt_amx_gemm_bf16_hw(const llmrt_amx_packed *w, const uint8_t *xb, size_t xb_nb1,
                            int64_t n, float *y, size_t y_nb1, int64_t row0, int64_t row1);
int llmrt_amx_dp_once_hw(int op, const llmrt_amx_tilecfg *cfg, void *c, const void *a,
                         const void *b);

#ifdef __cplusplus
}
#endif

#endif /* LLMRT_AMX_H */
