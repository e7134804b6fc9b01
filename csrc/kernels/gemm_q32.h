/*
 * gemm_q32.h — the packed layout of the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * IQ4_NL: its block is Q4_0's, d and 16 bytes of nibbles, the nibble an index into kvalues_iq4nl;
 * the llmrt-private WQ_Q8A: Q8_0's quants with Q4_1's d and m, x = q·d + (m + 128 d)),
 * shared by gemm_generic.c (pack, unpack, portable gemm) and the ISA gemm files. The same at every
 * ISA level (gemm.h).
 *
 * A group holds Q32_R = 4 rows of K elements, nb = K / 32 blocks per row, in three regions, each
 * walked block by block, in the order a GEMV reads them (so the group streams front to back and
 * the hardware prefetchers follow; scales placed after the quants cost a memory stall per group):
 *
 *   sc  [nb][nsc][Q32_R] f16   d of rows 0..3, then (Q4_1 / Q5_1 / WQ_Q8A) m of rows 0..3: 8 or 16 bytes,
 *                                one cvtph for the 4 rows; padded to 64 bytes;
 *   qh  [nb][Q32_R / 2][8]     Q5 only: the 5th bits of rows 2p and 2p + 1, 8 bytes per pair:
 *                                bit k of byte j = 5th bit of element 8k + j of row 2p, bit 4 + k
 *                                of byte j the same of row 2p + 1 (k < 4, j < 8). With the 8 bytes
 *                                broadcast to the four 64-bit lanes of a ymm, lane k shifted left by
 *                                4 - k (row 2p) or right by k (row 2p + 1) brings every element's
 *                                bit to bit 4 of its own byte: two shifts and an and per row, no
 *                                byte shuffle; padded to 64 bytes;
 *   qs  [nb][Q32_R * qsb]      quants, qsb = 32 bytes per row and block for Q8_0, 16 for the others:
 *                                Q8_0 / WQ_Q8A: row r's 32 int8 at ib * 128 + 32 * r (as in the block);
 *                                Q4_1/Q5 ("rows"): the low 4 bits of rows 2p and 2p + 1 share 32 bytes
 *                                at ib * 64 + 32 * p: byte i = q(2p, i) | q(2p + 1, i) << 4, i = element
 *                                0..31 of the block (GGUF keeps elements i and i + 16 in one byte),
 *                                so one 32-byte load and two masks give both rows' 32 quants;
 *                                Q4_0/IQ4_NL ("word pairs", q32_pairs): the 4 rows' 64 bytes at ib * 64
 *                                hold two vectors h = 0, 1; byte 32 h + 8 r + 4 g + i (row r, g = 0, 1,
 *                                i < 4) = q(r, 16 h + 4 g + i) | q(r, 16 h + 8 + 4 g + i) << 4. So the
 *                                low (high) nibbles of vector h are, for word pair j = 2 h (2 h + 1),
 *                                each row's activation words 2 j and 2 j + 1 (elements 8 j .. 8 j + 7)
 *                                in i32 lanes 2 r and 2 r + 1: one 8-byte broadcast of the activations
 *                                serves the 4 rows, and a row's block sum needs no per-row horizontal
 *                                sum (gemm_avx2.c's GEMV). The WQ_Q4_0 float-activation ids pack
 *                                Q4_0's layout with rows (gemm_generic.c).
 *
 * Every region starts 64-byte aligned (so every 32-byte quant load is aligned) and the group is a
 * multiple of 64 bytes. Rows past the tensor's last row are zero (d = 0).
 */
#ifndef LLMRT_KERNELS_GEMM_Q32_H
#define LLMRT_KERNELS_GEMM_Q32_H

#include <stddef.h>
#include <stdint.h>

#include "llmrt/llmrt.h"

#define Q32_R 4 /* rows per group */

static inline int q32_qsb(int type) { return (type == LLMRT_TYPE_Q8_0 || type == LLMRT_TYPE_WQ_Q8A) ? 32 : 16; }
/* int8 weights as stored or looked up (Q8_0, WQ_Q8A, IQ4_NL), the sign trick's operand; else unsigned quants */
static inline int q32_signed(int type) { return q32_qsb(type) == 32 || type == LLMRT_TYPE_IQ4_NL; }
static inline int q32_has_qh(int type) { return type == LLMRT_TYPE_Q5_0 || type == LLMRT_TYPE_Q5_1; }
/* the offset of the unsigned quants: the weight is q - off (Q4_0 8, Q5_0 16, else 0) */
static inline int q32_off(int type) { return type == LLMRT_TYPE_Q4_0 ? 8 : type == LLMRT_TYPE_Q5_0 ? 16 : 0; }
/* Q4_0 / IQ4_NL weights: their quants in word pairs (above), every other type in rows */
static inline int q32_pairs(int type) { return type == LLMRT_TYPE_Q4_0 || type == LLMRT_TYPE_IQ4_NL; }
static inline int q32_nsc(int type) {
    return (type == LLMRT_TYPE_Q4_1 || type == LLMRT_TYPE_Q5_1 || type == LLMRT_TYPE_WQ_Q8A) ? 2 : 1;
}

static inline size_t q32_pad64(size_t n) { return (n + 63) & ~(size_t)63; }

/* byte offsets of the regions inside a group of nb blocks per row (sc is at 0) */
static inline size_t q32_qh_off(int type, int64_t nb) { return q32_pad64((size_t)nb * (size_t)q32_nsc(type) * Q32_R * 2); }
static inline size_t q32_qs_off(int type, int64_t nb) {
    return q32_qh_off(type, nb) + (q32_has_qh(type) ? q32_pad64((size_t)nb * Q32_R * 4) : 0);
}
static inline size_t q32_group_bytes(int type, int64_t nb) {
    return q32_qs_off(type, nb) + (size_t)nb * Q32_R * (size_t)q32_qsb(type);
}

#endif /* LLMRT_KERNELS_GEMM_Q32_H */
