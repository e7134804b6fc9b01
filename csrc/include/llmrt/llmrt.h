/*
 * llmrt.h — the C core of llmrt: tensor types, per-type traits, CPU probe and kernel table.
 *
 * How to use it:
 *   1. llmrt_cpu_init() once (idempotent; reads LLMRT_ISA). It probes the CPU with CPUID + XGETBV
 *      (and asks Linux for AMX tile state) and fills the kernel table for the highest ISA level
 *      that is both present and allowed.
 *   2. llmrt_kernels() returns that table. Each entry is a function pointer and the name of the
 *      kernel picked for it; every entry has a generic C fallback, so none is ever NULL for a
 *      type whose traits say it is supported.
 *   3. llmrt_set_isa(level) refills the table for another level (reduced to what the CPU has);
 *      tests use it to run every path this CPU can run.
 *
 * Rules: C never aborts the host process and never prints. Functions that can fail return a
 * status code (LLMRT_OK = 0, negative on error). Shapes and user input are validated by the
 * caller (Python) before C is called; kernels assume valid input.
 */
#ifndef LLMRT_H
#define LLMRT_H

#include <stddef.h>
#include <stdint.h>

#include "llmrt/quant_blocks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
enum {
    LLMRT_OK = 0,
    LLMRT_EINVAL = -1,       /* invalid argument */
    LLMRT_ENOMEM = -2,       /* allocation failed */
    LLMRT_EUNSUPPORTED = -3, /* type / op / ISA not supported */
};

/* Tensor element types. Numbering is ggml's / GGUF's, so a GGUF tensor's type id is used as is. */
typedef enum {
    LLMRT_TYPE_F32 = 0,
    LLMRT_TYPE_F16 = 1,
    LLMRT_TYPE_Q4_0 = 2,
    LLMRT_TYPE_Q4_1 = 3,
    LLMRT_TYPE_Q5_0 = 6,
    LLMRT_TYPE_Q5_1 = 7,
    LLMRT_TYPE_Q8_0 = 8,
    LLMRT_TYPE_Q8_1 = 9,
    LLMRT_TYPE_Q2_K = 10,
    LLMRT_TYPE_Q3_K = 11,
    LLMRT_TYPE_Q4_K = 12,
    LLMRT_TYPE_Q5_K = 13,
    LLMRT_TYPE_Q6_K = 14,
    LLMRT_TYPE_Q8_K = 15,
    LLMRT_TYPE_IQ4_NL = 20,
    LLMRT_TYPE_IQ4_XS = 23,
    LLMRT_TYPE_I8 = 24,
    LLMRT_TYPE_I16 = 25,
    LLMRT_TYPE_I32 = 26,
    LLMRT_TYPE_I64 = 27,
    LLMRT_TYPE_F64 = 28,
    LLMRT_TYPE_BF16 = 30,
    /* llmrt-private ids (weight-only quantization at load, llmrt/wquant.py), above ggml's: they
     * live in memory only and are NEVER written to a GGUF file. WQ_Q8A is int8 asym (block_q8a,
     * int8 compute against Q8_1 activations); the *_F32 / *_BF16 ids have the block layout of the
     * named type (Q4_0 / Q4_1 / Q8_0 / WQ_Q8A) but take f32 (compute_dtype "fp32") or bf16
     * (compute_dtype "bf16") activations: their vec_dot dequantizes each block and fma's it. */
    LLMRT_TYPE_WQ_Q8A = 48,
    LLMRT_TYPE_WQ_Q4_0_F32 = 49,
    LLMRT_TYPE_WQ_Q4_1_F32 = 50,
    LLMRT_TYPE_WQ_Q8_0_F32 = 51,
    LLMRT_TYPE_WQ_Q8A_F32 = 52,
    LLMRT_TYPE_WQ_Q4_0_BF16 = 53,
    LLMRT_TYPE_WQ_Q4_1_BF16 = 54,
    LLMRT_TYPE_WQ_Q8_0_BF16 = 55,
    LLMRT_TYPE_WQ_Q8A_BF16 = 56,
    LLMRT_TYPE_COUNT = 64, /* size of per-type tables; ids without traits are unsupported */
} llmrt_type;

/* Kernel signatures. k = number of elements (a multiple of the type's block size). */
typedef void (*llmrt_dequant_row_fn)(const void *x, float *y, int64_t k);
typedef void (*llmrt_quant_row_fn)(const float *x, void *y, int64_t k);
/* s[0] = dot(x, y) over n elements; x has the weight type, y its vec_dot_type. */
typedef void (*llmrt_vec_dot_fn)(int n, float *s, const void *x, const void *y);

/* Vector math the ops share, per ISA as ggml's CPU backend computes it (vec.h / vec.cpp):
 * y[i] = silu(x[i]) * g[i]; y[i] = silu(x[i]); and ggml_vec_soft_max_f32: y[i] = exp(x[i] - max),
 * returning the sum of the y[i] in double (per-8-lane f32 partial sums on AVX2). */
typedef void (*llmrt_vec_glu_fn)(int n, float *y, const float *x, const float *g);
typedef void (*llmrt_vec_unary_fn)(int n, float *y, const float *x);
typedef double (*llmrt_vec_soft_max_fn)(int n, float *y, const float *x, float max);

/* Packed weights (csrc/include/llmrt/gemm.h says the layout contract). */
typedef size_t (*llmrt_pack_group_bytes_fn)(int64_t K);
/* packs `rows` (1..R) consecutive rows (src_row_bytes apart, plain GGUF layout) into one group */
typedef void (*llmrt_pack_fn)(const void *src, size_t src_row_bytes, int64_t K, int rows, void *group);
/* for r < n_rows, j < n_x: y[j * y_stride + r] = dot(row r of group, activation row j), the exact
 * bits vec_dot gives; x rows (the type's vec_dot_type) x_stride bytes apart */
typedef void (*llmrt_gemm_fn)(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride,
                              int n_x, float *y, int64_t y_stride);
/* Attention's kernels (csrc/ops/attention.c) for a cache of type T (F16 or F32), over nq rows that
 * share one K / V (the query heads of a GQA group): each K row / V row is loaded (and converted)
 * once for all nq rows, but every output keeps the exact float operations of this level's
 * vec_dot[T]. Both take a scratch of LLMRT_ATTN_SCRATCH(hd, nq, n) bytes (64-byte aligned), n the
 * number of cells (>= c1).
 *
 * P.V: computed row by row over V, with each output in vec_dot[T]'s order over n cells:
 *     y[j * ldy + d] = vec_dot_T(n, V[:, d], p + j * ldp)   for j < nq, d < hd,
 *     V[c][d] = v[c * ldv + d]  (T elements)
 * where every cell outside [c0, c1) holds p == 0 in every row (its products are exact zeros,
 * which leave every accumulator unchanged), so only cells in [c0, c1) are read, and of those
 * only cells where some row has p != 0 (a row's zero there adds an exact zero: V is finite in
 * written cells). n is a multiple of 32 (of 256 in attention), hd a multiple of 8. */
typedef void (*llmrt_attn_pv_fn)(int hd, int nq, float *y, int64_t ldy, const void *v, int64_t ldv,
                                 const void *p, int64_t ldp, int c0, int c1, void *scratch);
/* Scores (K.q): s[j * lds + c] = vec_dot_T(hd, K[c], q + j * ldq) for j < nq, c in [c0, c1),
 * K[c] = k + c * ldk elements of T, q rows of type T (hd elements); each exactly as vec_dot[T]. */
typedef void (*llmrt_attn_qk_fn)(int hd, int nq, float *s, int64_t lds, const void *k, int64_t ldk,
                                 const void *q, int64_t ldq, int c0, int c1, void *scratch);
/* Many dots (attention's prefill, see csrc/ops/attention.c):
 *     out[j * ldo + i] = vec_dot_T(n, X_i, Y_j)   for i < nx, j < ny,
 * X_i = x + i * ldx (T elements), Y_j = y + j * ldy: f32 holding T's values exactly (converted
 * from T), so each output has the exact bits of vec_dot[T] on the X row and the T row Y_j came
 * from. The scores are X = K rows, Y = q rows (n = hd); P.V is X = V transposed (rows of cells),
 * Y = the probability rows (n = cells, a multiple of 32). */
typedef void (*llmrt_attn_dots_fn)(int n, int nx, int ny, float *out, int64_t ldo, const void *x, int64_t ldx,
                                   const float *y, int64_t ldy);
#define LLMRT_ATTN_SCRATCH(hd, nq, n) ((size_t)8 * (size_t)(nq) * ((size_t)(hd) + (size_t)(n)) + 16384)

/* Per-type traits (designated initializers in csrc/types.c). */
typedef struct {
    const char *name;       /* GGUF name: "Q4_0", "F16", ... */
    int64_t blck_size;      /* elements per block */
    size_t type_size;       /* bytes per block */
    int is_quantized;
    int vec_dot_type;       /* type the activations are converted to for this type's dot product */
} llmrt_type_traits;

/* NULL when the id is out of range or has no traits (unsupported). */
const llmrt_type_traits *llmrt_type_traits_get(int type);
/* Bytes of a row of ne elements; 0 if ne is not a multiple of the block size or type unknown. */
size_t llmrt_row_size(int type, int64_t ne);

/* ---- CPU ---------------------------------------------------------------------------------- */

typedef struct {
    int sse3, ssse3, avx, avx2, fma, f16c;
    int avx512f, avx512bw, avx512vl, avx512dq, avx512cd;
    int avx512_vnni, avx512_bf16, avx_vnni;
    int amx_tile, amx_int8, amx_bf16;
    int os_avx, os_avx512, os_amx; /* the OS saves the register state (XGETBV) */
    int amx_granted;               /* arch_prctl(ARCH_REQ_XCOMP_PERM) succeeded */
} llmrt_cpu_features;

/* ISA levels, each implying the ones below it. */
typedef enum {
    LLMRT_ISA_GENERIC = 0,
    LLMRT_ISA_AVX2 = 1,        /* AVX2 + FMA + F16C */
    LLMRT_ISA_AVX512 = 2,      /* AVX-512 F/BW/VL/DQ */
    LLMRT_ISA_AVX512_VNNI = 3, /* + AVX512-VNNI */
    LLMRT_ISA_AMX = 4,         /* + AMX-TILE/INT8 (BF16 where present), granted by the OS */
    LLMRT_ISA_COUNT = 5,
} llmrt_isa;

const char *llmrt_isa_name(int level);

/* Best of `reps` timed reads of a `bytes` buffer by n_threads threads, in bytes/s (membw.c);
 * -1 on bad arguments or when memory or threads are unavailable. */
double llmrt_read_bandwidth(size_t bytes, int n_threads, int reps);
/* Parses "generic", "avx2", ...; returns -1 if unknown. */
int llmrt_isa_from_name(const char *name);

const llmrt_cpu_features *llmrt_cpu_features_get(void); /* probes on first call */
int llmrt_isa_max_supported(void);                      /* highest level the CPU (and OS) allow */

/* Initializes once with the level capped by the LLMRT_ISA environment variable. Returns the
 * level in effect. *capped_from is set to the requested level when LLMRT_ISA asked for more
 * than the CPU has (so the caller can warn), else -1. *bad_env is 1 if LLMRT_ISA was not a
 * known name (then the maximum supported level is used). Either pointer may be NULL. */
int llmrt_cpu_init(int *capped_from, int *bad_env);
/* Refills the kernel table for min(level, max supported); returns the level in effect. */
int llmrt_set_isa(int level);
/* Tests only: refills the kernel table for `level` (avx512 or avx512_vnni) with the AVX-512 kernels
 * built on simdw.h's AVX2 emulation backend (csrc/kernels/x86/emu512.c), on any CPU with AVX2:
 * every kernel a machine with that level would run, computed by the emulation. `bf16` (0/1) also
 * emulates AVX512-BF16. Dispatch never calls this. Returns the level in effect, or LLMRT_EUNSUPPORTED
 * (no AVX2, or a level other than avx512 / avx512_vnni). llmrt_isa_current() then reports `level`;
 * llmrt_isa_emulated() is 1 until the next llmrt_set_isa. */
int llmrt_set_isa_emulated(int level, int bf16);
int llmrt_isa_emulated(void);

/* simdw.h's operations one by one (tests/test_simdw.py): op ids of llmrt_simdw_op_*. */
typedef enum {
    LLMRT_SIMDW_ADD_EPI8 = 0, LLMRT_SIMDW_SUB_EPI16, LLMRT_SIMDW_ADD_EPI32, LLMRT_SIMDW_MULLO_EPI16,
    LLMRT_SIMDW_MADDUBS_EPI16, LLMRT_SIMDW_MADD_EPI16, LLMRT_SIMDW_SHUFFLE_EPI8, LLMRT_SIMDW_SIGN_EPI8,
    LLMRT_SIMDW_SRLI_EPI16_4, LLMRT_SIMDW_AND_OR_ANDNOT, LLMRT_SIMDW_BCAST256, LLMRT_SIMDW_UNPACK_EPI8,
    LLMRT_SIMDW_DPBUSD, LLMRT_SIMDW_FMADD_PS, LLMRT_SIMDW_CVTEPI32_PS, LLMRT_SIMDW_CVTPH_PS,
    LLMRT_SIMDW_REDUCE_ADD_PS, LLMRT_SIMDW_DPBF16_PS, LLMRT_SIMDW_CVTEPU8_EPI16, LLMRT_SIMDW_CVTEPI8_EPI32,
    LLMRT_SIMDW_CVTEPI32_EPI16, LLMRT_SIMDW_PERMUTEXVAR_EPI16, LLMRT_SIMDW_BCAST64, LLMRT_SIMDW_PAIRSUM_EPI32, LLMRT_SIMDW_DPWSSD,
    LLMRT_SIMDW_UNPACKLO_EPI32, LLMRT_SIMDW_UNPACKHI_EPI32, LLMRT_SIMDW_UNPACKLO_EPI64, LLMRT_SIMDW_UNPACKHI_EPI64,
    LLMRT_SIMDW_SHUF128_EVEN, LLMRT_SIMDW_SHUF128_ODD,
    LLMRT_SIMDW_OP_COUNT
} llmrt_simdw_op_id;
/* out = op(a, b, c), 64 bytes each. _avx512: the real instructions (only where the CPU has
 * AVX-512 F/BW/VL/DQ, + VNNI / BF16 for those ops: the caller checks); _emu512: the emulation
 * (needs AVX2). LLMRT_EUNSUPPORTED: not built for this platform. */
int llmrt_simdw_op_avx512(int op, const void *a, const void *b, const void *c, void *out);
int llmrt_simdw_op_emu512(int op, const void *a, const void *b, const void *c, void *out);
int llmrt_isa_current(void);

/* ---- kernel table --------------------------------------------------------------------------- */

typedef struct {
    llmrt_dequant_row_fn dequant_row[LLMRT_TYPE_COUNT];
    const char *dequant_row_name[LLMRT_TYPE_COUNT];
    llmrt_quant_row_fn quant_row[LLMRT_TYPE_COUNT];      /* reference rounding (llama.cpp *_ref) */
    const char *quant_row_name[LLMRT_TYPE_COUNT];
    llmrt_vec_dot_fn vec_dot[LLMRT_TYPE_COUNT];          /* weight type x its vec_dot_type */
    const char *vec_dot_name[LLMRT_TYPE_COUNT];
    /* Activation quantizers used by mul_mat: the rounding ggml's CPU backend uses at run time on
     * this ISA (x86 AVX2 Q8_0/Q8_1: id = 127/amax, ties to even), which may differ from the
     * reference quant_row; generic = the reference, as ggml's scalar path. */
    llmrt_quant_row_fn quant_act_row[LLMRT_TYPE_COUNT];
    const char *quant_act_row_name[LLMRT_TYPE_COUNT];
    llmrt_vec_glu_fn vec_swiglu;       /* ggml_vec_swiglu_f32 */
    llmrt_vec_unary_fn vec_silu;       /* ggml_vec_silu_f32 */
    llmrt_vec_soft_max_fn vec_soft_max; /* ggml_vec_soft_max_f32 */
    llmrt_vec_glu_fn vec_geglu;        /* ggml_vec_geglu_f32 (GGML_GELU_FP16: the f16 table) */
    llmrt_vec_unary_fn vec_gelu;       /* ggml_vec_gelu_f32 (the same table) */
    const char *vec_swiglu_name, *vec_silu_name, *vec_soft_max_name, *vec_geglu_name, *vec_gelu_name;
    /* Packed weights (gemm.h): load-time layout (the same at every ISA level, so filled by the
     * generic level only) and the matmul kernel over one group (per ISA, bit-exact with vec_dot). */
    int pack_rows[LLMRT_TYPE_COUNT];                          /* R; 0 = type has no packed path */
    llmrt_pack_group_bytes_fn pack_group_bytes[LLMRT_TYPE_COUNT];
    llmrt_pack_fn pack[LLMRT_TYPE_COUNT];
    llmrt_gemm_fn gemm[LLMRT_TYPE_COUNT];
    const char *gemm_name[LLMRT_TYPE_COUNT];
    int gemm_groups[LLMRT_TYPE_COUNT];  /* consecutive groups one gemm call may take (0 means 1) */
    int gemm_align[LLMRT_TYPE_COUNT];   /* decode splits start on multiples of this many groups (0 means 1) */
    /* attn_pv[T] reproduces the order of attn_pv_dot[T]; attention's column-by-column path uses
     * attn_pv_dot[T] as its dot (vec_dot[T] where no attention kernel is registered), so a higher
     * level that widens vec_dot[T] without attention kernels of its own keeps the lower level's
     * attention whole (levels stack). */
    llmrt_attn_pv_fn attn_pv[LLMRT_TYPE_COUNT];
    llmrt_vec_dot_fn attn_pv_dot[LLMRT_TYPE_COUNT];
    const char *attn_pv_name[LLMRT_TYPE_COUNT];
    llmrt_attn_qk_fn attn_qk[LLMRT_TYPE_COUNT]; /* likewise, used while attn_qk_dot[T] == attn_pv_dot[T] */
    llmrt_vec_dot_fn attn_qk_dot[LLMRT_TYPE_COUNT];
    const char *attn_qk_name[LLMRT_TYPE_COUNT];
    llmrt_attn_dots_fn attn_dots[LLMRT_TYPE_COUNT]; /* likewise, used while attn_dots_dot[T] == attn_pv_dot[T] */
    llmrt_vec_dot_fn attn_dots_dot[LLMRT_TYPE_COUNT];
    const char *attn_dots_name[LLMRT_TYPE_COUNT];
} llmrt_kernel_table;

const llmrt_kernel_table *llmrt_kernels(void);

/* Each ISA file fills the entries it implements (and their names); lower levels are filled first.
 * A register function is only called when the CPU supports its level. */
void llmrt_register_kernels_generic(llmrt_kernel_table *kt);
void llmrt_register_kernels_avx2(llmrt_kernel_table *kt);
void llmrt_register_kernels_avx512(llmrt_kernel_table *kt);
void llmrt_register_kernels_avx512_vnni(llmrt_kernel_table *kt);
void llmrt_register_kernels_amx(llmrt_kernel_table *kt);
/* The emulated levels' registrations (x86/emu512.c), called by llmrt_set_isa_emulated after the
 * generic and AVX2 ones: each AVX-512 kernel file built on simdw.h has an emulated twin. */
void llmrt_register_kernels_emu512(llmrt_kernel_table *kt, int level, int bf16);
/* Dot-product kernels live in their own files (csrc/kernels/dot_generic.c, x86/dot_*.c). */
void llmrt_register_dot_kernels_generic(llmrt_kernel_table *kt);
void llmrt_register_dot_kernels_avx2(llmrt_kernel_table *kt);
/* the 512-bit levels' F32/F16/BF16 vec_dot: llmrt_register_gemm_f_kernels_avx512 (gemm.h) */
/* The AVX2 level's attention dots (x86/dot_avx2.c): ggml_vec_dot_f16's order (4 chains) and its
 * f32 analogue; vec_dot[F16 / F32] there take llama.cpp's prefill order (one chain) instead. */
void llmrt_attn_dot_f16_avx2(int n, float *s, const void *x, const void *y);
void llmrt_attn_dot_f32_avx2(int n, float *s, const void *x, const void *y);
/* Attention kernels (csrc/kernels/attn_generic.c, x86/attn_avx2.c), registered after the dot
 * kernels of the same level (generic: they copy its vec_dot pointers into attn_pv_dot; avx2: the
 * attn_dot_* pair above). */
void llmrt_register_attn_kernels_generic(llmrt_kernel_table *kt);
void llmrt_register_attn_kernels_avx2(llmrt_kernel_table *kt);
/* Kernels of the llmrt-private weight-only types (csrc/kernels/wq_generic.c, x86/wq_avx2.c). */
void llmrt_register_wq_kernels_generic(llmrt_kernel_table *kt);
void llmrt_register_wq_kernels_avx2(llmrt_kernel_table *kt);

/* ---- weight-only quantization at load (csrc/wquant.c) ----------------------------------------- */

/* Group-wise quantization of one row x[k] into blocks of `type` (Q4_0 int4 sym, Q4_1 int4 asym,
 * Q8_0 int8 sym, WQ_Q8A int8 asym, or one of their _F32/_BF16 variants). `group` is a multiple
 * of 32 (or <= 0: the whole row is one group): one scale (and min) is computed per group of
 * `group` elements (the last group may be shorter, still a multiple of 32) and written into
 * every 32-block of the group, so the blocks hold exactly the group-wise quantized values.
 * k must be a multiple of 32. `rounding`: LLMRT_WQ_MINMAX, the scale (and min) from the group's
 * extremes as ggml's reference quantizer computes them (group 32: its exact bytes); or
 * LLMRT_WQ_SEARCH (int4 only; int8 stays min/max): the scale (and min) searched to minimize the
 * group's squared error, never worse than min/max. Returns LLMRT_OK or LLMRT_EINVAL /
 * LLMRT_EUNSUPPORTED. */
enum { LLMRT_WQ_MINMAX = 0, LLMRT_WQ_SEARCH = 1 };
int llmrt_wq_quantize_row(const float *x, void *y, int64_t k, int type, int64_t group, int rounding);
/* The same with importance weights w[k] (>= 0, one per column: E[a_j^2] of the activation that
 * multiplies column j, or NULL: all 1): LLMRT_WQ_SEARCH minimizes each group's weighted squared
 * error sum_j w_j (x_j - xq_j)^2 instead (still never worse than min/max under that error);
 * min/max ignores w. All-1 weights give exactly the bytes of the unweighted search. */
int llmrt_wq_quantize_row_w(const float *x, const float *w, void *y, int64_t k, int type, int64_t group,
                            int rounding);
/* The weighted search's candidate grid: inverse scales (nmax + t0 + tstep * i) / range,
 * i = 0..nstep (default -1, 0.5, 8, as the unweighted search); for measurements. */
void llmrt_wq_set_weighted_grid(float t0, float tstep, int nstep);
/* The GGUF block layout a private type shares (Q4_0, Q4_1, Q8_0 or WQ_Q8A); the type itself
 * for the others. */
int llmrt_wq_layout(int type);

/* ---- half / bfloat16 conversion (scalar, exact, round-to-nearest-even) ------------------------- */

static inline float llmrt_fp16_to_fp32(llmrt_fp16_t h) {
    union { uint32_t u; float f; } o;
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) {
            o.u = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while ((man & 0x400u) == 0) { man <<= 1; exp--; }
            man &= 0x3ffu;
            o.u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        o.u = sign | 0x7f800000u | (man << 13);
    } else {
        o.u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return o.f;
}

static inline llmrt_fp16_t llmrt_fp32_to_fp16(float f) {
    union { float f; uint32_t u; } in = { f };
    const uint32_t x = in.u;
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) { /* inf or nan */
        return (llmrt_fp16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
    }
    if (absx >= 0x477ff000u) { /* rounds to >= 65520: overflow to inf */
        return (llmrt_fp16_t)(sign | 0x7c00u);
    }
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (absx < 0x33000000u) return (llmrt_fp16_t)sign; /* < 2^-25 rounds to 0 */
        const uint32_t e = absx >> 23;
        const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e;         /* 14 + (113 - e) - 1 ... in [14, 24] */
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (llmrt_fp16_t)(sign | h);
    }
    uint32_t h = ((absx >> 13) - (112u << 10)); /* rebias exponent 127 -> 15 */
    const uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (llmrt_fp16_t)(sign | h);
}

static inline float llmrt_bf16_to_fp32(llmrt_bf16_t h) {
    union { uint32_t u; float f; } o;
    o.u = (uint32_t)h << 16;
    return o.f;
}

static inline llmrt_bf16_t llmrt_fp32_to_bf16(float f) {
    union { float f; uint32_t u; } in = { f };
    uint32_t x = in.u;
    if ((x & 0x7fffffffu) > 0x7f800000u) return (llmrt_bf16_t)((x >> 16) | 64); /* quiet nan */
    return (llmrt_bf16_t)((x + (0x7fffu + ((x >> 16) & 1u))) >> 16);
}

/* ggml's CPU GELU (GGML_GELU_FP16) over every half value, filled by llmrt_ops_init (ops/tables.c);
 * two spare zero entries so that a 32-bit gather at index 65535 stays inside the array. */
#define LLMRT_GELU_TABLE_N ((1 << 16) + 2)
extern llmrt_fp16_t llmrt_table_gelu_f16[LLMRT_GELU_TABLE_N];

/* GELU of one value as ggml's table path: 0 at or below -10, x at or above 10, else the table at
 * x rounded to f16. */
static inline float llmrt_gelu_table_f32(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return llmrt_fp16_to_fp32(llmrt_table_gelu_f16[llmrt_fp32_to_fp16(x)]);
}

#ifdef __cplusplus
}
#endif

#endif /* LLMRT_H */
