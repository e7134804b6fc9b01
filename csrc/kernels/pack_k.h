/*
 * pack_k.h — packed layouts of the K-quants (Q2_K..Q6_K) and the float types (F32, F16, BF16) for
 * the GEMV/GEMM kernels (gemm_k_generic.c, x86/gemm_k_avx2.c); the contract is in llmrt/gemm.h.
 *
 * K-quants (and IQ4_XS, a 256-element super-block type too): a group holds PK_R = 8 rows. For each super-block i (256 elements) the group has one
 * "block group" of BG bytes at group + i * BG, holding super-block i of all 8 rows, fields split
 * out per row so a kernel reads each field of a row with one aligned load and never unpacks the
 * 6-bit scale bytes at run time:
 *
 *   Q4_K (BG 1184)  d[8] f16 | dmin[8] f16 | sc[8 rows][8] u8 | m[4 pairs][8 rows][2] u8 |
 *                   qs[8 rows][128] (the block's own nibble order)
 *   Q5_K (BG 1440)  as Q4_K, with qh[8 rows][32] before qs
 *   Q6_K (BG 1696)  d[8] f16 | pad 16 | sc[8 rows][16] i8 | ql[8 rows][128] | qh[8 rows][64]
 *   Q3_K (BG  928)  d[8] f16 | pad 16 | sc[8 rows][16] i8 (the 6-bit scale minus 32) |
 *                   hmask[8 rows][32] | qs[8 rows][64]
 *   Q2_K (BG  672)  d[8] f16 | dmin[8] f16 | scales[8 rows][16] u8 (as stored) | qs[8 rows][64]
 *   IQ4_XS (BG 1120) d[8] f16 | pad 16 | ls[8 rows][8] i8 (the 6-bit sub-block scale minus 32) |
 *                   qs[8 rows][128] (the block's own nibbles: kvalues_iq4nl indices)
 *
 * d / dmin stay f16 (bit for bit), scales and mins are the values get_scale_min_k4 /
 * unpack_scales_q3_k (IQ4_XS: its scales_l / scales_h pair) give, so every field is an exact re-arrangement: packing is lossless (the
 * test rebuilds the GGUF blocks from it byte for byte). Q4_K/Q5_K mins are stored as (m[2k],
 * m[2k+1]) byte pairs per row, so one cvtepu8_epi16 gives 8 rows of i16 pairs for a madd with
 * the Q8_K block's paired bsums. Every BG is a multiple of 32 and every field starts 32-byte
 * aligned (the group is 64-byte aligned).
 *
 * F32/F16/BF16: a group holds PK_R = 8 rows, plain, one after the other: row r at
 * group + r * K * elsize. Nothing to unpack; the gain is tiling rows x tokens.
 */
#ifndef LLMRT_KERNELS_PACK_K_H
#define LLMRT_KERNELS_PACK_K_H

#include <stddef.h>
#include <stdint.h>

#define PK_R 8 /* rows per group, every type here */

enum {
    Q4K_D = 0, Q4K_DMIN = 16, Q4K_SC = 32, Q4K_M = 96, Q4K_QS = 160, Q4K_BG = 1184,
    Q5K_D = 0, Q5K_DMIN = 16, Q5K_SC = 32, Q5K_M = 96, Q5K_QH = 160, Q5K_QS = 416, Q5K_BG = 1440,
    Q6K_D = 0, Q6K_SC = 32, Q6K_QL = 160, Q6K_QH = 1184, Q6K_BG = 1696,
    Q3K_D = 0, Q3K_SC = 32, Q3K_HM = 160, Q3K_QS = 416, Q3K_BG = 928,
    Q2K_D = 0, Q2K_DMIN = 16, Q2K_SC = 32, Q2K_QS = 160, Q2K_BG = 672,
    IQ4XS_D = 0, IQ4XS_SC = 32, IQ4XS_QS = 96, IQ4XS_BG = 1120,
};

/* bytes of one group of nb super-blocks of bg bytes each: groups start 64-byte aligned */
static inline size_t pk_group_bytes(int64_t nb, size_t bg) { return ((size_t)nb * bg + 63) & ~(size_t)63; }

/* byte offset of min m[s] of row r inside a Q4_K / Q5_K block group's m field */
static inline int pk_min_off(int r, int s) { return 16 * (s / 2) + 2 * r + (s % 2); }

#endif /* LLMRT_KERNELS_PACK_K_H */
