/*
 * quant_blocks.h — GGUF/ggml quantization block layouts, byte-for-byte.
 *
 * Every struct here is exactly the on-disk layout of one block of a GGUF tensor of that type, so a
 * tensor's bytes can be cast to an array of these blocks without copying. Each struct is followed by
 * a _Static_assert on its size: the compiler checks the layout.
 *
 * Values (x = element value):
 *   Q4_0   x = (q - 8) * d                 q: 4 bits, low nibble -> element j, high nibble -> j + 16
 *   Q4_1   x = q * d + m
 *   Q5_0   x = (q - 16) * d                q: 4 bits from qs + 5th bit from qh
 *   Q5_1   x = q * d + m
 *   Q8_0   x = q * d                       q: int8
 *   Q8_1   x = q * d, s = d * sum(q)       (activation type of Q4_1/Q5_1 dot products)
 *   Q2_K..Q6_K  super-blocks of 256 with per-sub-block scales (see the dequantize functions)
 *   Q8_K   x = q * d, d f32, bsums = sums of 16 consecutive q (activation type of K-quant dots)
 *   IQ4_NL x = kvalues_iq4nl[q] * d        IQ4_XS: super-block of 256 with 6-bit sub-block scales
 */
#ifndef LLMRT_QUANT_BLOCKS_H
#define LLMRT_QUANT_BLOCKS_H

#include <stdint.h>

typedef uint16_t llmrt_fp16_t; /* IEEE half, stored as bits */
typedef uint16_t llmrt_bf16_t; /* bfloat16, stored as bits */

#define QK4_0 32
typedef struct {
    llmrt_fp16_t d;          /* delta */
    uint8_t qs[QK4_0 / 2];   /* nibbles */
} block_q4_0;
_Static_assert(sizeof(block_q4_0) == 2 + QK4_0 / 2, "wrong q4_0 block size");

#define QK4_1 32
typedef struct {
    llmrt_fp16_t d;          /* delta */
    llmrt_fp16_t m;          /* min */
    uint8_t qs[QK4_1 / 2];   /* nibbles */
} block_q4_1;
_Static_assert(sizeof(block_q4_1) == 4 + QK4_1 / 2, "wrong q4_1 block size");

#define QK5_0 32
typedef struct {
    llmrt_fp16_t d;          /* delta */
    uint8_t qh[4];           /* 5th bit of each element */
    uint8_t qs[QK5_0 / 2];   /* low nibbles */
} block_q5_0;
_Static_assert(sizeof(block_q5_0) == 2 + 4 + QK5_0 / 2, "wrong q5_0 block size");

#define QK5_1 32
typedef struct {
    llmrt_fp16_t d;          /* delta */
    llmrt_fp16_t m;          /* min */
    uint8_t qh[4];           /* 5th bit of each element */
    uint8_t qs[QK5_1 / 2];   /* low nibbles */
} block_q5_1;
_Static_assert(sizeof(block_q5_1) == 4 + 4 + QK5_1 / 2, "wrong q5_1 block size");

#define QK8_0 32
typedef struct {
    llmrt_fp16_t d;          /* delta */
    int8_t qs[QK8_0];        /* quants */
} block_q8_0;
_Static_assert(sizeof(block_q8_0) == 2 + QK8_0, "wrong q8_0 block size");

#define QK8_1 32
typedef struct {
    llmrt_fp16_t d;          /* delta */
    llmrt_fp16_t s;          /* d * sum(qs) */
    int8_t qs[QK8_1];        /* quants */
} block_q8_1;
_Static_assert(sizeof(block_q8_1) == 4 + QK8_1, "wrong q8_1 block size");

/* llmrt-private (never in a GGUF file): int8 asymmetric weights, x = (q + 128) * d + m, i.e.
 * the stored int8 q is the unsigned quant 0..255 minus 128 and m is the group's minimum. */
typedef struct {
    llmrt_fp16_t d;          /* delta: (max - min) / 255 of the group */
    llmrt_fp16_t m;          /* min of the group */
    int8_t qs[32];           /* unsigned quant - 128 */
} block_q8a;
_Static_assert(sizeof(block_q8a) == 4 + 32, "wrong q8a block size");

/* K-quants: super-blocks of QK_K elements. */
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct {
    uint8_t scales[QK_K / 16]; /* 4-bit scales (low) and mins (high) of 16 sub-blocks */
    uint8_t qs[QK_K / 4];      /* 2-bit quants */
    llmrt_fp16_t d;            /* super-block scale for scales */
    llmrt_fp16_t dmin;         /* super-block scale for mins */
} block_q2_K;
_Static_assert(sizeof(block_q2_K) == 2 * 2 + QK_K / 16 + QK_K / 4, "wrong q2_K block size");

typedef struct {
    uint8_t hmask[QK_K / 8];   /* high bit of each quant */
    uint8_t qs[QK_K / 4];      /* low 2 bits */
    uint8_t scales[12];        /* 16 6-bit scales, packed */
    llmrt_fp16_t d;            /* super-block scale */
} block_q3_K;
_Static_assert(sizeof(block_q3_K) == 2 + QK_K / 4 + QK_K / 8 + 12, "wrong q3_K block size");

typedef struct {
    llmrt_fp16_t d;                 /* super-block scale for scales */
    llmrt_fp16_t dmin;              /* super-block scale for mins */
    uint8_t scales[K_SCALE_SIZE];   /* 8 6-bit scales and mins, packed (get_scale_min_k4) */
    uint8_t qs[QK_K / 2];           /* 4-bit quants */
} block_q4_K;
_Static_assert(sizeof(block_q4_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2, "wrong q4_K block size");

typedef struct {
    llmrt_fp16_t d;
    llmrt_fp16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];           /* 5th bit */
    uint8_t qs[QK_K / 2];           /* low 4 bits */
} block_q5_K;
_Static_assert(sizeof(block_q5_K) == 2 * 2 + K_SCALE_SIZE + QK_K / 2 + QK_K / 8, "wrong q5_K block size");

typedef struct {
    uint8_t ql[QK_K / 2];      /* low 4 bits */
    uint8_t qh[QK_K / 4];      /* high 2 bits */
    int8_t scales[QK_K / 16];  /* 8-bit sub-block scales */
    llmrt_fp16_t d;            /* super-block scale */
} block_q6_K;
_Static_assert(sizeof(block_q6_K) == 2 + QK_K / 16 + 3 * QK_K / 4, "wrong q6_K block size");

typedef struct {
    float d;                   /* delta (f32) */
    int8_t qs[QK_K];           /* quants */
    int16_t bsums[QK_K / 16];  /* sum of each group of 16 quants */
} block_q8_K;
_Static_assert(sizeof(block_q8_K) == sizeof(float) + QK_K + QK_K / 16 * sizeof(int16_t), "wrong q8_K block size");

#define QK4_NL 32
typedef struct {
    llmrt_fp16_t d;
    uint8_t qs[QK4_NL / 2];
} block_iq4_nl;
_Static_assert(sizeof(block_iq4_nl) == 2 + QK4_NL / 2, "wrong iq4_nl block size");

typedef struct {
    llmrt_fp16_t d;
    uint16_t scales_h;         /* high 2 bits of the 8 6-bit sub-block scales */
    uint8_t scales_l[QK_K / 64]; /* low 4 bits */
    uint8_t qs[QK_K / 2];
} block_iq4_xs;
_Static_assert(sizeof(block_iq4_xs) == 2 + 2 + QK_K / 64 + QK_K / 2, "wrong iq4_xs block size");

#endif /* LLMRT_QUANT_BLOCKS_H */
