/*
 * gemm.h — packed weights: load-time repacking of matmul weights and the GEMV/GEMM kernels that
 * read them.
 *
 * How to use it:
 *   const llmrt_kernel_table *kt = llmrt_kernels();
 *   if (kt->pack_rows[type] > 0) {                       // the type has a packed path
 *       llmrt_packed pw;
 *       llmrt_pack_weight(type, w, row_bytes, K, M, &pw);  // once, at load (_mt: on a pool)
 *       llmrt_graph_weight_packed(g, w_id, &pw);          // MUL_MAT then runs kt->gemm on it
 *       ...
 *       llmrt_packed_free(&pw);                           // after the graph is gone
 *   }
 *
 * Layout. M weight rows of K elements of one GGUF type are regrouped into groups of
 * R = kt->pack_rows[type] rows (the last group padded with zero rows). Group g is group_bytes
 * (a multiple of 64) at data + g * group_bytes; data is 64-byte aligned. Inside a group the layout
 * is the type's own (rows interleaved, scales split out from quants, ...), LOSSLESS, and THE SAME
 * AT EVERY ISA LEVEL: the ISA can be switched at run time (LLMRT_ISA, runtime.set_isa), so only the
 * kernels differ between levels, never the layout. Layout entries (pack_rows, pack_group_bytes,
 * pack) are therefore registered by the generic level only.
 *
 * Kernel table fields (llmrt.h), registered per ISA level like vec_dot (generic first, then each
 * level overrides the gemm it has):
 *   int    pack_rows[t]                     R; 0 = type t has no packed path (vec_dot is used)
 *   size_t pack_group_bytes[t](K)           bytes of one group of R rows of K elements
 *   void   pack[t](src, src_row_bytes, K, rows, group)
 *          packs `rows` (1..R) consecutive plain GGUF rows (src_row_bytes apart) into one group;
 *          rows past `rows` are zero
 *   void   gemm[t](K, group, n_rows, x, x_stride, n_x, y, y_stride)
 *          for r < n_rows (<= R) and j < n_x: y[j * y_stride + r] = dot(row r of the group,
 *          activation row j); activations already in the type's vec_dot_type, rows x_stride bytes
 *          apart; y_stride in floats. Gives, for every (r, j), exactly the bits vec_dot[t] of the
 *          same ISA level gives for that row and activation row, whatever n_x is (n_x = 1: decode
 *          GEMV; n_x > 1: prefill GEMM).
 *   const char *gemm_name[t]
 *   int    gemm_groups[t]                   G (0 means 1): gemm may be given up to G consecutive
 *          groups at once (group_bytes apart): n_rows <= G * R, row r in group r / R; the same
 *          bits as G calls of one group. Whoever sets gemm[t] sets gemm_groups[t] with it.
 *   int    gemm_align[t]                    A (0 means 1): for a gemm whose call is one tile of A
 *          groups (a call of fewer still computes the absent groups' lanes), MUL_MAT's decode split
 *          gives each thread a range, and each claimed chunk, that starts on a multiple of A groups
 *          (A divides G). Set with gemm[t] where it matters; the bits never depend on it.
 * A level whose vec_dot[t] computes in another order than the gemm registered below it, and that
 * has no gemm of its own for t, sets gemm[t] = NULL: MUL_MAT then runs vec_dot on the plain rows
 * (the weight's data), so results stay bit-exact with vec_dot at every level.
 *
 * Rules as in llmrt.h: C never prints or aborts; shapes are validated by the caller.
 */
#ifndef LLMRT_GEMM_H
#define LLMRT_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "llmrt/llmrt.h"
#include "llmrt/threadpool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A whole packed weight [K, M]: n_groups groups of R rows, group_bytes each, 64-byte aligned. */
typedef struct llmrt_packed {
    int type;            /* GGUF type of the rows (llmrt_type) */
    int R;               /* rows per group (kt->pack_rows[type]) */
    int64_t K;           /* elements per row */
    int64_t M;           /* rows */
    int64_t n_groups;    /* ceil(M / R) */
    size_t group_bytes;  /* bytes per group, a multiple of 64 */
    void *data;          /* (n_groups, group_bytes), 64-byte aligned; owned (llmrt_packed_free) */
} llmrt_packed;

/* Packs M rows of K elements (src_row_bytes apart, plain GGUF layout) with the table's layout
 * entries. LLMRT_EUNSUPPORTED if the type has no packed path, LLMRT_EINVAL for a K that is not a
 * multiple of the block size, LLMRT_ENOMEM. On failure *out is zeroed. */
int llmrt_pack_weight(int type, const void *src, size_t src_row_bytes, int64_t K, int64_t M,
                      llmrt_packed *out);
/* The same, with the groups shared out among the threads of pool tp (NULL, a 1-thread pool or a
 * small weight: the calling thread alone). The bytes are those of llmrt_pack_weight whatever the
 * thread count (each group is packed whole by one thread). Not to be called from inside a run of
 * tp (it runs tp itself). */
int llmrt_pack_weight_mt(int type, const void *src, size_t src_row_bytes, int64_t K, int64_t M,
                         llmrt_packed *out, llmrt_threadpool *tp);
void llmrt_packed_free(llmrt_packed *p); /* frees data and zeroes *p; NULL or zeroed is fine */
/* The inverse of pack (tests): writes the first `rows` rows of a group back as plain GGUF rows
 * (dst_row_bytes apart). LLMRT_EUNSUPPORTED for types without an unpacker. */
int llmrt_unpack_group(int type, int64_t K, const void *group, int rows, void *dst, size_t dst_row_bytes);

/* Each file of packed kernels registers what it has (generic: layouts + gemm; ISA files: gemm).
 * Called by llmrt_set_isa in level order, like the vec_dot registrations. */
void llmrt_register_gemm_kernels_generic(llmrt_kernel_table *kt);
void llmrt_register_gemm_kernels_avx2(llmrt_kernel_table *kt);
/* K-quants (Q2_K..Q6_K) and float types (F32, F16, BF16): csrc/kernels/gemm_k_generic.c,
 * x86/gemm_k_avx2.c (layouts in csrc/kernels/pack_k.h); the 512-bit levels' float pairs below. */
void llmrt_register_gemm_k_kernels_generic(llmrt_kernel_table *kt);
void llmrt_register_gemm_k_kernels_avx2(llmrt_kernel_table *kt);
/* x86/gemm_kq_avx512_vnni.c: Q4_K prefill in 16 lanes with VNNI (gemm_kq_w.inc); its emulated
 * twin x86/gemm_kq_emu512.c registers the same at an emulated level (tests only). */
void llmrt_register_gemm_kq_kernels_avx512_vnni(llmrt_kernel_table *kt);
void llmrt_register_gemm_kq_emu512(llmrt_kernel_table *kt, int level, int bf16);
/* x86/gemm_q32_avx512_vnni.c: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 prefill in 16 lanes with VNNI (gemm_q32_w.inc);
 * its emulated twin x86/gemm_q32_emu512.c (tests only). */
void llmrt_register_gemm_q32_kernels_avx512_vnni(llmrt_kernel_table *kt);
void llmrt_register_gemm_q32_emu512(llmrt_kernel_table *kt, int level, int bf16);
/* x86/gemm_f_avx512.c (fp32 fmas) and x86/gemm_f_bf16_avx512.c (vdpbf16ps, CPUs with AVX512-BF16):
 * F32 / F16 / BF16 vec_dot + gemm pairs of the 512-bit levels (gemm_f_w.inc); their emulated twins
 * x86/gemm_f_emu512.c (+ gemm_f_bf16_emu512.c, called by it) register the same at an emulated level. */
void llmrt_register_gemm_f_kernels_avx512(llmrt_kernel_table *kt);
void llmrt_register_gemm_f_bf16_kernels_avx512(llmrt_kernel_table *kt);
void llmrt_register_gemm_f_emu512(llmrt_kernel_table *kt, int level, int bf16);
void llmrt_register_gemm_f_bf16_emu512(llmrt_kernel_table *kt);
/* x86/wq_bf16_avx512.c (CPUs with AVX512-BF16) and its twin x86/wq_bf16_emu512.c: the WQ_<L>_BF16
 * vec_dot + gemm pairs with vdpbf16ps (wq_w.inc), replacing wq_avx2.c's fp32 ones. */
void llmrt_register_wq_bf16_kernels_avx512(llmrt_kernel_table *kt);
void llmrt_register_wq_bf16_emu512(llmrt_kernel_table *kt, int level, int bf16);
/* llmrt_unpack_group for those types (LLMRT_EUNSUPPORTED for the others). */
int llmrt_unpack_group_k(int type, int64_t K, const void *group, int rows, void *dst, size_t dst_row_bytes);

#ifdef __cplusplus
}
#endif

#endif /* LLMRT_GEMM_H */
