/*
 * quant_common.h — small portable helpers shared by the kernel files (generic.c, dot_generic.c
 * and the x86/ ISA files): f16 byte access, the IQ4_NL level table, K-quant scale unpacking.
 *
 * Everything is `static inline` (or a static table) and plain C11, so each kernel file gets its own
 * copy compiled under its own `#pragma GCC target` / `optimize`: include this header AFTER those
 * pragmas. Integer-only or exact conversions: no float arithmetic whose order could matter.
 */
#ifndef LLMRT_KERNELS_QUANT_COMMON_H
#define LLMRT_KERNELS_QUANT_COMMON_H

#include "llmrt/llmrt.h"

#include <stdint.h>
#include <string.h>

/* ---- f16 fields at any address -------------------------------------------------------------- */

/* Reads an f16 stored at p (2 bytes, any alignment) as f32. */
static inline float rd_f16(const uint8_t *p) {
    llmrt_fp16_t h;
    memcpy(&h, p, sizeof(h));
    return llmrt_fp16_to_fp32(h);
}

/* Writes f as f16 (round to nearest even) at p (2 bytes, any alignment). */
static inline void wr_f16(uint8_t *p, float f) {
    const llmrt_fp16_t h = llmrt_fp32_to_fp16(f);
    memcpy(p, &h, sizeof(h));
}

/* ---- tables ----------------------------------------------------------------------------------- */

/* IQ4_NL / IQ4_XS non-linear 4-bit levels (ggml's kvalues_iq4nl): value = kvalues_iq4nl[nibble]. */
static const int8_t kvalues_iq4nl[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

/* ---- K-quant scales --------------------------------------------------------------------------- */

/* Q4_K / Q5_K: 6-bit scale *d and min *m of sub-block j (0..7) from the 12 packed bytes q
 * (ggml's get_scale_min_k4). Bytes 0..3: scales 0..3 (low 6 bits); bytes 4..7: mins 0..3;
 * bytes 8..11: low 4 bits of scales/mins 4..7; the top 2 bits of bytes 0..7 are their high bits. */
static inline void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* Q4_K / Q5_K: all 8 scales sc[0..7] and mins m[0..7] at once (get_scale_min_k4 for j = 0..7). */
static inline void unpack_scales_mins_k4(const uint8_t *q, uint8_t *sc, uint8_t *m) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
    }
    for (int j = 4; j < 8; j++) {
        sc[j] = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        m[j] = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Q3_K: 16 6-bit scales packed in 12 bytes: low nibbles in bytes 0..7, high 2-bit pairs in 8..11.
 * Writes them minus 32 (the stored offset), in [-32, 31]. */
static inline void unpack_scales_q3_k(const uint8_t *q, int8_t *sc) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? (q[j] & 0x0f) : (q[j - 8] >> 4);
        const int hi = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* Σ_sub-blocks sc · Σ q·y over one Q4_K / Q5_K super-block. 32 bytes of qs hold sub-block 2j in
 * their low nibbles and 2j+1 in their high nibbles; Q5_K adds a 5th bit: bit 2j (low) / 2j+1 (high)
 * of qh[l]. qh is NULL for Q4_K. */
static inline int isum_k4_int(const uint8_t *qs, const uint8_t *qh, const uint8_t *sc, const int8_t *q8) {
    int isum = 0;
    for (int j = 0; j < QK_K / 64; j++) {
        const uint8_t *q4 = qs + 32 * j;
        int lo = 0, hi = 0;
        for (int l = 0; l < 32; l++) {
            const int h0 = qh ? ((qh[l] >> (2 * j)) & 1) << 4 : 0;
            const int h1 = qh ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0;
            lo += ((q4[l] & 0x0f) | h0) * q8[64 * j + l];
            hi += ((q4[l] >> 4) | h1) * q8[64 * j + 32 + l];
        }
        isum += sc[2 * j] * lo + sc[2 * j + 1] * hi;
    }
    return isum;
}

/* Σ_j bsums[j] · m[j/2]: the mins' part, from the Q8_K block's 16-element sums. */
static inline int summs_k4_int(const int16_t *bsums, const uint8_t *m) {
    int summs = 0;
    for (int j = 0; j < QK_K / 16; j++) summs += bsums[j] * m[j / 2];
    return summs;
}

#endif /* LLMRT_KERNELS_QUANT_COMMON_H */
