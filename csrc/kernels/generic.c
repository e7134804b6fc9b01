/*
 * generic.c — portable C kernels: dequantize / quantize rows of every GGUF block type llmrt reads.
 * They are the reference every ISA variant (csrc/kernels/x86/) is checked against.
 *
 * Semantics follow ggml (ggml-quants.c) exactly:
 *   - dequantize_row_*: the same float expression, in the same order, so results are bit-identical
 *     to gguf.quants.dequantize (numpy, f32 arithmetic).
 *   - quantize_row_*: llama.cpp's *_ref reference rounding: the same max / scale choice, roundf
 *     (half away from zero) for Q8_0/Q8_1, truncation of x*id + 0.5 (or + 8.5, + 16.5) for the
 *     4/5-bit types, nearest_int (round half to even, the 1.5*2^23 trick) for Q8_K and K-quants.
 *     Q8_0, Q8_1, Q8_K, F16 and BF16 double as the matmul's activation quantizers.
 *     IQ4_NL follows quantize_row_iq4_nl_ref; Q2_K..Q6_K follow quantize_row_q{2..6}_K_ref
 *     (make_qkx2_quants / make_q3_quants / make_qx_quants without an importance matrix).
 *   - The reference's float -> int casts of inf/NaN (only reachable when 1/d overflows for a
 *     subnormal d) are reproduced as x86 does them (the quant becomes 0), without the UB.
 *
 * Block bytes are read and written through byte pointers + offsetof (memcpy for multi-byte fields),
 * so a row may start at any address: no unaligned struct access. Float arrays must be aligned.
 *
 * Floating-point contraction (a*b+c -> fma) is switched off here: the reference is unfused.
 */
#pragma GCC optimize("fp-contract=off")

#include "llmrt/llmrt.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "quant_common.h"

/* ---- helpers (rd_f16 / wr_f16, kvalues_iq4nl, get_scale_min_k4 are in quant_common.h) -------- */

/* ggml's nearest_int: add 1.5*2^23 so the float adder rounds to an integer (half to even). */
static inline int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int32_t i;
    memcpy(&i, &val, sizeof(i));
    return (int)(i & 0x007fffff) - 0x00400000;
}

/* ==== dequantize ================================================================================ */

static void dequant_row_f32_generic(const void *vx, float *y, int64_t k) {
    memcpy(y, vx, (size_t)k * sizeof(float));
}

static void dequant_row_f16_generic(const void *vx, float *y, int64_t k) {
    const uint8_t *x = vx;
    for (int64_t i = 0; i < k; i++) y[i] = rd_f16(x + 2 * i);
}

static void dequant_row_bf16_generic(const void *vx, float *y, int64_t k) {
    const uint8_t *x = vx;
    for (int64_t i = 0; i < k; i++) {
        llmrt_bf16_t h;
        memcpy(&h, x + 2 * i, sizeof(h));
        y[i] = llmrt_bf16_to_fp32(h);
    }
}

static void dequant_row_q4_0_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK4_0;
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q4_0);
        const float d = rd_f16(b + offsetof(block_q4_0, d));
        const uint8_t *qs = b + offsetof(block_q4_0, qs);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int x0 = (qs[j] & 0x0F) - 8;
            const int x1 = (qs[j] >> 4) - 8;
            y[j] = x0 * d;
            y[j + QK4_0 / 2] = x1 * d;
        }
    }
}

static void dequant_row_q4_1_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK4_1;
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q4_1);
        const float d = rd_f16(b + offsetof(block_q4_1, d));
        const float m = rd_f16(b + offsetof(block_q4_1, m));
        const uint8_t *qs = b + offsetof(block_q4_1, qs);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int x0 = qs[j] & 0x0F;
            const int x1 = qs[j] >> 4;
            y[j] = x0 * d + m;
            y[j + QK4_1 / 2] = x1 * d + m;
        }
    }
}

static void dequant_row_q5_0_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK5_0;
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q5_0);
        const float d = rd_f16(b + offsetof(block_q5_0, d));
        uint32_t qh;
        memcpy(&qh, b + offsetof(block_q5_0, qh), sizeof(qh));
        const uint8_t *qs = b + offsetof(block_q5_0, qs);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1u) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1u) << 4;
            const int x0 = ((qs[j] & 0x0F) | h0) - 16;
            const int x1 = ((qs[j] >> 4) | h1) - 16;
            y[j] = x0 * d;
            y[j + QK5_0 / 2] = x1 * d;
        }
    }
}

static void dequant_row_q5_1_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK5_1;
    for (int64_t i = 0; i < nb; i++, y += QK5_1) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q5_1);
        const float d = rd_f16(b + offsetof(block_q5_1, d));
        const float m = rd_f16(b + offsetof(block_q5_1, m));
        uint32_t qh;
        memcpy(&qh, b + offsetof(block_q5_1, qh), sizeof(qh));
        const uint8_t *qs = b + offsetof(block_q5_1, qs);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1u) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1u) << 4;
            const int x0 = (qs[j] & 0x0F) | h0;
            const int x1 = (qs[j] >> 4) | h1;
            y[j] = x0 * d + m;
            y[j + QK5_1 / 2] = x1 * d + m;
        }
    }
}

static void dequant_row_q8_0_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q8_0);
        const float d = rd_f16(b + offsetof(block_q8_0, d));
        const int8_t *qs = (const int8_t *)(b + offsetof(block_q8_0, qs));
        for (int j = 0; j < QK8_0; j++) y[j] = qs[j] * d;
    }
}

static void dequant_row_q8_1_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++, y += QK8_1) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q8_1);
        const float d = rd_f16(b + offsetof(block_q8_1, d));
        const int8_t *qs = (const int8_t *)(b + offsetof(block_q8_1, qs));
        for (int j = 0; j < QK8_1; j++) y[j] = qs[j] * d;
    }
}

/* Q2_K: 16 sub-blocks of 16; byte l of a 32-byte group holds 4 elements (shifts 0, 2, 4, 6) that
 * are 32 apart. x = d * (sc & 15) * q - dmin * (sc >> 4). */
static void dequant_row_q2_K_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q2_K);
        const float d = rd_f16(b + offsetof(block_q2_K, d));
        const float dmin = rd_f16(b + offsetof(block_q2_K, dmin));
        const uint8_t *sc = b + offsetof(block_q2_K, scales);
        const uint8_t *q = b + offsetof(block_q2_K, qs);
        int is = 0;
        for (int n = 0; n < QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int half = 0; half < 2; half++, is++) {
                    const float dl = d * (sc[is] & 0xF);
                    const float ml = dmin * (sc[is] >> 4);
                    for (int l = 0; l < 16; l++) {
                        *y++ = dl * ((q[l + 16 * half] >> shift) & 3) - ml;
                    }
                }
            }
        }
    }
}

/* Q3_K: 16 sub-blocks of 16 with 6-bit signed scales (stored + 32); q = 2 low bits from qs,
 * minus 4 when the hmask bit is clear. x = d * (sc - 32) * q. */
static void dequant_row_q3_K_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q3_K);
        const float d_all = rd_f16(b + offsetof(block_q3_K, d));
        const uint8_t *q = b + offsetof(block_q3_K, qs);
        const uint8_t *hm = b + offsetof(block_q3_K, hmask);
        const uint8_t *s = b + offsetof(block_q3_K, scales);
        int8_t scales[16]; /* unpacked 6-bit scales minus 32 */
        unpack_scales_q3_k(s, scales);
        int is = 0;
        uint8_t m = 1;
        for (int n = 0; n < QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int half = 0; half < 2; half++, is++) {
                    const float dl = d_all * scales[is];
                    for (int l = 0; l < 16; l++) {
                        const int ql = (q[l + 16 * half] >> shift) & 3;
                        *y++ = dl * (ql - ((hm[l + 16 * half] & m) ? 0 : 4));
                    }
                }
            }
        }
    }
}

/* Q4_K: 8 sub-blocks of 32; 32 bytes hold sub-block 2j (low nibbles) and 2j+1 (high nibbles). */
static void dequant_row_q4_K_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q4_K);
        const float d = rd_f16(b + offsetof(block_q4_K, d));
        const float min = rd_f16(b + offsetof(block_q4_K, dmin));
        const uint8_t *scales = b + offsetof(block_q4_K, scales);
        const uint8_t *q = b + offsetof(block_q4_K, qs);
        uint8_t sc, m;
        for (int is = 0; is < QK_K / 32; is += 2, q += 32) {
            get_scale_min_k4(is + 0, scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void dequant_row_q5_K_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q5_K);
        const float d = rd_f16(b + offsetof(block_q5_K, d));
        const float min = rd_f16(b + offsetof(block_q5_K, dmin));
        const uint8_t *scales = b + offsetof(block_q5_K, scales);
        const uint8_t *ql = b + offsetof(block_q5_K, qs);
        const uint8_t *qh = b + offsetof(block_q5_K, qh);
        uint8_t sc, m;
        uint8_t u1 = 1, u2 = 2;
        for (int is = 0; is < QK_K / 32; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
            get_scale_min_k4(is + 0, scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

/* Q6_K: 16 sub-blocks of 16 with int8 scales; per 128 elements, 64 ql bytes + 32 qh bytes. */
static void dequant_row_q6_K_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q6_K);
        const float d = rd_f16(b + offsetof(block_q6_K, d));
        const uint8_t *ql = b + offsetof(block_q6_K, ql);
        const uint8_t *qh = b + offsetof(block_q6_K, qh);
        const int8_t *sc = (const int8_t *)(b + offsetof(block_q6_K, scales));
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

static void dequant_row_q8_K_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_q8_K);
        float d;
        memcpy(&d, b + offsetof(block_q8_K, d), sizeof(d));
        const int8_t *qs = (const int8_t *)(b + offsetof(block_q8_K, qs));
        for (int j = 0; j < QK_K; j++) y[j] = qs[j] * d;
    }
}

static void dequant_row_iq4_nl_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK4_NL;
    for (int64_t i = 0; i < nb; i++, y += QK4_NL) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_iq4_nl);
        const float d = rd_f16(b + offsetof(block_iq4_nl, d));
        const uint8_t *qs = b + offsetof(block_iq4_nl, qs);
        for (int j = 0; j < QK4_NL / 2; j++) {
            y[j] = d * kvalues_iq4nl[qs[j] & 0xF];
            y[j + QK4_NL / 2] = d * kvalues_iq4nl[qs[j] >> 4];
        }
    }
}

/* IQ4_XS: 8 sub-blocks of 32, 6-bit scales (4 low bits in scales_l, 2 high bits in scales_h). */
static void dequant_row_iq4_xs_generic(const void *vx, float *y, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = (const uint8_t *)vx + i * sizeof(block_iq4_xs);
        const float d = rd_f16(b + offsetof(block_iq4_xs, d));
        uint16_t scales_h;
        memcpy(&scales_h, b + offsetof(block_iq4_xs, scales_h), sizeof(scales_h));
        const uint8_t *scales_l = b + offsetof(block_iq4_xs, scales_l);
        const uint8_t *qs = b + offsetof(block_iq4_xs, qs);
        for (int ib = 0; ib < QK_K / 32; ib++, y += 32, qs += 16) {
            const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
            const float dl = d * (ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j + 0] = dl * kvalues_iq4nl[qs[j] & 0xF];
                y[j + 16] = dl * kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

/* ==== quantize (reference rounding) ============================================================= */

static void quant_row_f32_generic(const float *x, void *vy, int64_t k) {
    memcpy(vy, x, (size_t)k * sizeof(float));
}

static void quant_row_f16_generic(const float *x, void *vy, int64_t k) {
    uint8_t *y = vy;
    for (int64_t i = 0; i < k; i++) wr_f16(y + 2 * i, x[i]);
}

static void quant_row_bf16_generic(const float *x, void *vy, int64_t k) {
    uint8_t *y = vy;
    for (int64_t i = 0; i < k; i++) {
        const llmrt_bf16_t h = llmrt_fp32_to_bf16(x[i]);
        memcpy(y + 2 * i, &h, sizeof(h));
    }
}

/* Signed value of largest magnitude (the first one on ties), as ggml picks it. */
static inline float signed_absmax(const float *x, int n, float *amax_out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    if (amax_out) *amax_out = amax;
    return max;
}

/* The reference converts x*id + 0.5 (or + 8.5, + 16.5) with a plain (int8_t) cast, then MIN(hi).
 * For finite v that is trunc(v) clamped to [lo, hi] (v leaves the range only by float noise).
 * v is non-finite only when id = 1/d overflowed (d subnormal): x86 converts inf/NaN to
 * INT_MIN, whose low byte is 0, so llama.cpp stores 0 there; so do we, without the UB. */
static inline int trunc_clamp(float v, int lo, int hi) {
    if (!isfinite(v)) return 0;
    if (v <= (float)lo) return lo;
    if (v >= (float)hi) return hi;
    return (int)v;
}

/* min and max of x[0..n-1] (Q4_1 / Q5_1: the block's range), by the reference's comparisons. */
static inline void block_min_max(const float *x, int n, float *min_out, float *max_out) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    *min_out = min;
    *max_out = max;
}

/* Q5_0 / Q5_1: stores 5-bit quants q0 (element j) and q1 (element j + 16): low nibbles into qs[j],
 * 5th bits into bits j and j + 16 of qh. */
_Static_assert(QK5_0 == QK5_1, "put_q5_pair serves both Q5_0 and Q5_1");
static inline void put_q5_pair(uint8_t *qs, uint32_t *qh, int j, int q0, int q1) {
    qs[j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
    *qh |= ((uint32_t)(q0 & 0x10) >> 4) << j;
    *qh |= ((uint32_t)(q1 & 0x10) >> 4) << (j + QK5_0 / 2);
}

static void quant_row_q4_0_generic(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK4_0;
    for (int64_t i = 0; i < nb; i++, x += QK4_0) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q4_0);
        const float max = signed_absmax(x, QK4_0, NULL);
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        wr_f16(b + offsetof(block_q4_0, d), d);
        uint8_t *qs = b + offsetof(block_q4_0, qs);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const float x0 = x[j] * id;
            const float x1 = x[j + QK4_0 / 2] * id;
            /* reference: MIN(15, (int8_t)(x + 8.5f)) */
            const int q0 = trunc_clamp(x0 + 8.5f, 0, 15);
            const int q1 = trunc_clamp(x1 + 8.5f, 0, 15);
            qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void quant_row_q4_1_generic(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK4_1;
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q4_1);
        float min, max;
        block_min_max(x, QK4_1, &min, &max);
        const float d = (max - min) / ((1 << 4) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        wr_f16(b + offsetof(block_q4_1, d), d);
        wr_f16(b + offsetof(block_q4_1, m), min);
        uint8_t *qs = b + offsetof(block_q4_1, qs);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const float x0 = (x[j] - min) * id;
            const float x1 = (x[j + QK4_1 / 2] - min) * id;
            const int q0 = trunc_clamp(x0 + 0.5f, 0, 15);
            const int q1 = trunc_clamp(x1 + 0.5f, 0, 15);
            qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void quant_row_q5_0_generic(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK5_0;
    for (int64_t i = 0; i < nb; i++, x += QK5_0) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q5_0);
        const float max = signed_absmax(x, QK5_0, NULL);
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        wr_f16(b + offsetof(block_q5_0, d), d);
        uint8_t *qs = b + offsetof(block_q5_0, qs);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const float x0 = x[j] * id;
            const float x1 = x[j + QK5_0 / 2] * id;
            const int q0 = trunc_clamp(x0 + 16.5f, 0, 31);
            const int q1 = trunc_clamp(x1 + 16.5f, 0, 31);
            put_q5_pair(qs, &qh, j, q0, q1);
        }
        memcpy(b + offsetof(block_q5_0, qh), &qh, sizeof(qh));
    }
}

static void quant_row_q5_1_generic(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK5_1;
    for (int64_t i = 0; i < nb; i++, x += QK5_1) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q5_1);
        float min, max;
        block_min_max(x, QK5_1, &min, &max);
        const float d = (max - min) / ((1 << 5) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        wr_f16(b + offsetof(block_q5_1, d), d);
        wr_f16(b + offsetof(block_q5_1, m), min);
        uint8_t *qs = b + offsetof(block_q5_1, qs);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const float x0 = (x[j] - min) * id;
            const float x1 = (x[j + QK5_1 / 2] - min) * id;
            const int q0 = trunc_clamp(x0 + 0.5f, 0, 31);
            const int q1 = trunc_clamp(x1 + 0.5f, 0, 31);
            put_q5_pair(qs, &qh, j, q0, q1);
        }
        memcpy(b + offsetof(block_q5_1, qh), &qh, sizeof(qh));
    }
}

/* roundf (half away from zero) to int8; |v| <= 127 (plus float noise) by construction, or
 * non-finite when id overflowed (d subnormal): then 0, as the reference's cast gives on x86. */
static inline int8_t round_i8(float v) {
    if (!isfinite(v)) return 0;
    const float r = roundf(v);
    if (r < -127.0f) return -127;
    if (r > 127.0f) return 127;
    return (int8_t)r;
}

static void quant_row_q8_0_generic(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK8_0;
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q8_0);
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        wr_f16(b + offsetof(block_q8_0, d), d);
        int8_t *qs = (int8_t *)(b + offsetof(block_q8_0, qs));
        for (int j = 0; j < QK8_0; j++) qs[j] = round_i8(x[j] * id);
    }
}

/* Q8_1: as Q8_0, plus s = d * sum(q) (f16), which the Q4_1/Q5_1 dot products use for the min. */
static void quant_row_q8_1_generic(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK8_1;
    for (int64_t i = 0; i < nb; i++, x += QK8_1) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q8_1);
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        wr_f16(b + offsetof(block_q8_1, d), d);
        int8_t *qs = (int8_t *)(b + offsetof(block_q8_1, qs));
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            qs[j] = round_i8(x[j] * id);
            sum += qs[j];
        }
        wr_f16(b + offsetof(block_q8_1, s), (float)sum * d);
    }
}

/* Q8_K: f32 d = max / -127 of the signed max, q = min(127, nearest_int(-127 / max * x)),
 * bsums = sums of 16 consecutive q. An all-zero block has d = 0, q = 0, bsums = 0. */
static void quant_row_q8_K_generic(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q8_K);
        int8_t *qs = (int8_t *)(b + offsetof(block_q8_K, qs));
        int16_t bsums[QK_K / 16];
        float amax;
        const float max = signed_absmax(x, QK_K, &amax);
        if (!amax) {
            const float zero = 0.0f;
            memcpy(b + offsetof(block_q8_K, d), &zero, sizeof(zero));
            memset(qs, 0, QK_K);
            memset(b + offsetof(block_q8_K, bsums), 0, sizeof(bsums));
            continue;
        }
        const float iscale = -127.f / max;
        if (isfinite(iscale)) {
            for (int j = 0; j < QK_K; j++) {
                const int v = nearest_int(iscale * x[j]);
                qs[j] = (int8_t)(v < 127 ? v : 127);
            }
        } else {
            /* max subnormal: iscale*x is inf/NaN, which the reference's nearest_int turns into
             * -2^22 or 0, both stored as int8 0 */
            memset(qs, 0, QK_K);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += qs[16 * j + l];
            bsums[j] = (int16_t)sum;
        }
        memcpy(b + offsetof(block_q8_K, bsums), bsums, sizeof(bsums));
        const float d = 1 / iscale;
        memcpy(b + offsetof(block_q8_K, d), &d, sizeof(d));
    }
}

/* Index of the level nearest to v in the sorted table val[16] (upper level on a midpoint). */
static inline int best_index_iq4nl(float v) {
    if (v <= kvalues_iq4nl[0]) return 0;
    if (v >= kvalues_iq4nl[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < kvalues_iq4nl[mid]) hi = mid; else lo = mid;
    }
    return v - kvalues_iq4nl[hi - 1] < kvalues_iq4nl[hi] - v ? hi - 1 : hi;
}

/* IQ4_NL reference (ggml's quantize_row_iq4_nl_ref, i.e. the impl with ntry = -1 and no imatrix):
 * levels from d0 = max / -127, then d = the weighted least-squares scale for those levels
 * (weights x^2), stored as f16; the levels are not recomputed. */
static void quant_row_iq4_nl_generic(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK4_NL;
    for (int64_t i = 0; i < nb; i++, x += QK4_NL) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_iq4_nl);
        uint8_t *qs = b + offsetof(block_iq4_nl, qs);
        uint8_t L[QK4_NL];
        float amax;
        const float max = signed_absmax(x, QK4_NL, &amax);
        float d = 0.0f;
        if (amax < 1e-15f) { /* GROUP_MAX_EPS */
            memset(L, 0, sizeof(L));
        } else {
            const float d0 = max / kvalues_iq4nl[0];
            const float id = 1 / d0;
            float sumqx = 0, sumq2 = 0;
            for (int j = 0; j < QK4_NL; j++) {
                const int l = best_index_iq4nl(id * x[j]);
                L[j] = (uint8_t)l;
                const float q = kvalues_iq4nl[l];
                const float w = x[j] * x[j];
                sumqx += w * q * x[j];
                sumq2 += w * q * q;
            }
            d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        }
        wr_f16(b + offsetof(block_iq4_nl, d), d);
        for (int j = 0; j < QK4_NL / 2; j++) qs[j] = (uint8_t)(L[j] | (L[j + QK4_NL / 2] << 4));
    }
}

/* ==== K-quant reference quantizers (llama.cpp quantize_row_q{2..6}_K_ref, no importance matrix) ===
 *
 * Scale search helpers with ggml's exact float expressions and evaluation order. They are evaluated
 * unfused (a native llama.cpp build may let the compiler fuse some of them into FMAs, which can
 * flip a rare rounding decision; the bytes then differ while both stay valid encodings). */

#define GROUP_MAX_EPS 1e-15f
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* Symmetric levels in [-nmax, nmax-1] with a least-squares scale (rmse_type 1: weights x^2),
 * trying 18 perturbed inverse scales; L gets level + nmax. Returns the scale. (make_qx_quants) */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = MAX(-nmax, MIN(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * x[i]);
            l = MAX(-nmax, MIN(nmax - 1, l));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                const int l = nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + MAX(-nmax, MIN(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's symmetric levels in [-nmax, nmax-1], refined one element at a time (make_q3_quants with
 * do_rmse); L gets level + nmax. Returns the scale. */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = MAX(-nmax, MIN(nmax - 1, l));
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = nearest_int(x[i] * sl2 / slx);
                new_l = MAX(-nmax, MIN(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Asymmetric levels in [0, nmax] with scale and min fitted by weighted least squares over nstep+1
 * candidate inverse scales (make_qkx2_quants). *the_min gets -min (>= 0). Returns the scale. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                              int use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)MAX(0, MIN(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * (x[i] - min));
            l = MAX(0, MIN(nmax, l));
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; i++) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* 2-bit packing shared by Q2_K and Q3_K: per 128 elements, byte l holds elements l, l+32, l+64,
 * l+96 in bit pairs 0, 2, 4, 6. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128) {
        for (int l = 0; l < 32; l++) {
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
        }
    }
}

static void quant_row_q2_K_generic(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK_K;
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q2_K);
        uint8_t *sc = b + offsetof(block_q2_K, scales);
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; j++) sc[j] = (uint8_t)nearest_int(iscale * scales[j]);
            wr_f16(b + offsetof(block_q2_K, d), max_scale / q4scale);
        } else {
            for (int j = 0; j < QK_K / 16; j++) sc[j] = 0;
            wr_f16(b + offsetof(block_q2_K, d), 0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; j++) sc[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
            wr_f16(b + offsetof(block_q2_K, dmin), max_min / q4scale);
        } else {
            wr_f16(b + offsetof(block_q2_K, dmin), 0.f);
        }
        const float dd = rd_f16(b + offsetof(block_q2_K, d));
        const float dmm = rd_f16(b + offsetof(block_q2_K, dmin));
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = dd * (sc[j] & 0xF);
            if (!d) continue;
            const float dm = dmm * (sc[j] >> 4);
            for (int ii = 0; ii < 16; ii++) {
                const int l = nearest_int((x[16 * j + ii] + dm) / d);
                L[16 * j + ii] = (uint8_t)MAX(0, MIN(3, l));
            }
        }
        pack_2bit(L, b + offsetof(block_q2_K, qs));
    }
}

static void quant_row_q3_K_generic(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK_K;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q3_K);
        uint8_t *s = b + offsetof(block_q3_K, scales);
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
            const float scale = fabsf(scales[j]);
            if (scale > amax) { amax = scale; max_scale = scales[j]; }
        }
        memset(s, 0, 12);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                int l = nearest_int(iscale * scales[j]);
                l = (int8_t)l; /* the reference stores it in an int8_t first */
                l = MAX(-32, MIN(31, l)) + 32;
                if (j < 8) s[j] = (uint8_t)(l & 0xF);
                else s[j - 8] |= (uint8_t)((l & 0xF) << 4);
                l >>= 4;
                s[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
            }
            wr_f16(b + offsetof(block_q3_K, d), 1 / iscale);
        } else {
            wr_f16(b + offsetof(block_q3_K, d), 0.f);
        }
        const float dd = rd_f16(b + offsetof(block_q3_K, d));
        for (int j = 0; j < QK_K / 16; j++) {
            const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
            const int sc = (lo | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
            const float d = dd * sc;
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                const int l = nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(MAX(-4, MIN(3, l)) + 4);
            }
        }
        uint8_t *hmask = b + offsetof(block_q3_K, hmask);
        memset(hmask, 0, QK_K / 8);
        /* high bit of elements 0..31 -> bit 0 of hmask[0..31], 32..63 -> bit 1, ... */
        uint8_t Lu[QK_K];
        for (int j = 0; j < QK_K; j++) {
            int l = L[j];
            if (l > 3) {
                hmask[j % 32] |= (uint8_t)(1u << (j / 32));
                l -= 4;
            }
            Lu[j] = (uint8_t)l;
        }
        pack_2bit(Lu, b + offsetof(block_q3_K, qs));
    }
}

/* Packs 8 6-bit scales and mins of a Q4_K / Q5_K super-block (inverse of get_scale_min_k4). */
static void pack_scale_min_k4(const uint8_t *ls, const uint8_t *lm, uint8_t *q) {
    for (int j = 0; j < QK_K / 32; j++) {
        if (j < 4) {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            q[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            q[j - 0] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): fills L[256] and the block's d, dmin, scales. */
static void quant_k4_scales(const float *x, uint8_t *L, int nmax, float rmin, int nstep,
                            uint8_t *d_f16, uint8_t *dmin_f16, uint8_t *packed) {
    uint8_t Laux[32], ls[QK_K / 32], lm[QK_K / 32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; j++) {
        const uint8_t a = (uint8_t)nearest_int(inv_scale * scales[j]);
        const uint8_t m = (uint8_t)nearest_int(inv_min * mins[j]);
        ls[j] = MIN(63, a);
        lm[j] = MIN(63, m);
    }
    memset(packed, 0, K_SCALE_SIZE);
    pack_scale_min_k4(ls, lm, packed);
    wr_f16(d_f16, max_scale / 63.f);
    wr_f16(dmin_f16, max_min / 63.f);
    const float dd = rd_f16(d_f16), dmm = rd_f16(dmin_f16);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        get_scale_min_k4(j, packed, &sc, &m);
        const float d = dd * sc;
        if (!d) continue;
        const float dm = dmm * m;
        for (int ii = 0; ii < 32; ii++) {
            const int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)MAX(0, MIN(nmax, l));
        }
    }
}

static void quant_row_q4_K_generic(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK_K;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q4_K);
        quant_k4_scales(x, L, 15, -1.f, 20, b + offsetof(block_q4_K, d), b + offsetof(block_q4_K, dmin),
                        b + offsetof(block_q4_K, scales));
        uint8_t *q = b + offsetof(block_q4_K, qs);
        for (int j = 0; j < QK_K; j += 64, q += 32) {
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
        }
    }
}

static void quant_row_q5_K_generic(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK_K;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q5_K);
        quant_k4_scales(x, L, 31, -0.5f, 15, b + offsetof(block_q5_K, d), b + offsetof(block_q5_K, dmin),
                        b + offsetof(block_q5_K, scales));
        uint8_t *qh = b + offsetof(block_q5_K, qh);
        uint8_t *ql = b + offsetof(block_q5_K, qs);
        memset(qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < QK_K; n += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
                if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
}

static void quant_row_q6_K_generic(const float *x, void *vy, int64_t k) {
    const int64_t nb = k / QK_K;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        uint8_t *b = (uint8_t *)vy + i * sizeof(block_q6_K);
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            const float abs_scale = fabsf(scales[ib]);
            if (abs_scale > max_abs_scale) { max_abs_scale = abs_scale; max_scale = scales[ib]; }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(b, 0, sizeof(block_q6_K));
            continue;
        }
        int8_t *sc = (int8_t *)(b + offsetof(block_q6_K, scales));
        const float iscale = -128.f / max_scale;
        wr_f16(b + offsetof(block_q6_K, d), 1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++) sc[ib] = (int8_t)MIN(127, nearest_int(iscale * scales[ib]));
        const float dd = rd_f16(b + offsetof(block_q6_K, d));
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = dd * sc[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                const int l = nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(MAX(-32, MIN(31, l)) + 32);
            }
        }
        uint8_t *ql = b + offsetof(block_q6_K, ql);
        uint8_t *qh = b + offsetof(block_q6_K, qh);
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const int q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF;
                const int q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

/* ==== vector math (ggml's scalar paths) ========================================================= */

static inline float silu_f32_generic(float x) {
    return x / (1.0f + expf(-x)); /* ggml_silu_f32 */
}

static void vec_swiglu_generic(int n, float *y, const float *x, const float *g) {
    for (int i = 0; i < n; i++) y[i] = silu_f32_generic(x[i]) * g[i];
}

static void vec_silu_generic(int n, float *y, const float *x) {
    for (int i = 0; i < n; i++) y[i] = silu_f32_generic(x[i]);
}

/* ggml_vec_gelu_f32 / ggml_vec_geglu_f32 (GGML_GELU_FP16): the f16 table, one value at a time */
static void vec_gelu_generic(int n, float *y, const float *x) {
    for (int i = 0; i < n; i++) y[i] = llmrt_gelu_table_f32(x[i]);
}

static void vec_geglu_generic(int n, float *y, const float *x, const float *g) {
    for (int i = 0; i < n; i++) y[i] = x[i] <= -10.0f ? 0.0f : llmrt_gelu_table_f32(x[i]) * g[i];
}

static double vec_soft_max_generic(int n, float *y, const float *x, float max) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        const float v = expf(x[i] - max);
        sum += (double)v;
        y[i] = v;
    }
    return sum;
}

/* ==== registration ============================================================================== */

#define SET_DEQ(T, fn) do { kt->dequant_row[T] = fn; kt->dequant_row_name[T] = #fn; } while (0)
#define SET_Q(T, fn) do { kt->quant_row[T] = fn; kt->quant_row_name[T] = #fn; } while (0)

void llmrt_register_kernels_generic(llmrt_kernel_table *kt) {
    SET_DEQ(LLMRT_TYPE_F32, dequant_row_f32_generic);
    SET_DEQ(LLMRT_TYPE_F16, dequant_row_f16_generic);
    SET_DEQ(LLMRT_TYPE_BF16, dequant_row_bf16_generic);
    SET_DEQ(LLMRT_TYPE_Q4_0, dequant_row_q4_0_generic);
    SET_DEQ(LLMRT_TYPE_Q4_1, dequant_row_q4_1_generic);
    SET_DEQ(LLMRT_TYPE_Q5_0, dequant_row_q5_0_generic);
    SET_DEQ(LLMRT_TYPE_Q5_1, dequant_row_q5_1_generic);
    SET_DEQ(LLMRT_TYPE_Q8_0, dequant_row_q8_0_generic);
    SET_DEQ(LLMRT_TYPE_Q8_1, dequant_row_q8_1_generic);
    SET_DEQ(LLMRT_TYPE_Q2_K, dequant_row_q2_K_generic);
    SET_DEQ(LLMRT_TYPE_Q3_K, dequant_row_q3_K_generic);
    SET_DEQ(LLMRT_TYPE_Q4_K, dequant_row_q4_K_generic);
    SET_DEQ(LLMRT_TYPE_Q5_K, dequant_row_q5_K_generic);
    SET_DEQ(LLMRT_TYPE_Q6_K, dequant_row_q6_K_generic);
    SET_DEQ(LLMRT_TYPE_Q8_K, dequant_row_q8_K_generic);
    SET_DEQ(LLMRT_TYPE_IQ4_NL, dequant_row_iq4_nl_generic);
    SET_DEQ(LLMRT_TYPE_IQ4_XS, dequant_row_iq4_xs_generic);

    SET_Q(LLMRT_TYPE_F32, quant_row_f32_generic);
    SET_Q(LLMRT_TYPE_F16, quant_row_f16_generic);
    SET_Q(LLMRT_TYPE_BF16, quant_row_bf16_generic);
    SET_Q(LLMRT_TYPE_Q4_0, quant_row_q4_0_generic);
    SET_Q(LLMRT_TYPE_Q4_1, quant_row_q4_1_generic);
    SET_Q(LLMRT_TYPE_Q5_0, quant_row_q5_0_generic);
    SET_Q(LLMRT_TYPE_Q5_1, quant_row_q5_1_generic);
    SET_Q(LLMRT_TYPE_Q8_0, quant_row_q8_0_generic);
    SET_Q(LLMRT_TYPE_Q8_1, quant_row_q8_1_generic);
    SET_Q(LLMRT_TYPE_Q8_K, quant_row_q8_K_generic);
    SET_Q(LLMRT_TYPE_Q2_K, quant_row_q2_K_generic);
    SET_Q(LLMRT_TYPE_Q3_K, quant_row_q3_K_generic);
    SET_Q(LLMRT_TYPE_Q4_K, quant_row_q4_K_generic);
    SET_Q(LLMRT_TYPE_Q5_K, quant_row_q5_K_generic);
    SET_Q(LLMRT_TYPE_Q6_K, quant_row_q6_K_generic);
    SET_Q(LLMRT_TYPE_IQ4_NL, quant_row_iq4_nl_generic);

    kt->vec_swiglu = vec_swiglu_generic;
    kt->vec_swiglu_name = "vec_swiglu_generic";
    kt->vec_silu = vec_silu_generic;
    kt->vec_silu_name = "vec_silu_generic";
    kt->vec_gelu = vec_gelu_generic;
    kt->vec_gelu_name = "vec_gelu_generic";
    kt->vec_geglu = vec_geglu_generic;
    kt->vec_geglu_name = "vec_geglu_generic";
    kt->vec_soft_max = vec_soft_max_generic;
    kt->vec_soft_max_name = "vec_soft_max_generic";

    /* ggml's scalar quantize_row_q8_0 / q8_1 / q8_K are the reference ones: activations too */
    for (int t = 0; t < LLMRT_TYPE_COUNT; t++) {
        kt->quant_act_row[t] = kt->quant_row[t];
        kt->quant_act_row_name[t] = kt->quant_row_name[t];
    }
}
