/*
 * gemm_k_generic.c — load-time packing and portable GEMV/GEMM kernels for the K-quants (Q2_K..Q6_K)
 * and the float types (F32, F16, BF16). Layouts: pack_k.h; contract: llmrt/gemm.h.
 *
 * The pack functions (and pack_rows / pack_group_bytes) are registered here only: the layout is
 * the same at every ISA level. The generic gemm kernels compute each (row, activation row) with
 * exactly the float operations of the matching dot_generic.c kernel (same expressions, same
 * order), reading the packed fields instead of the GGUF blocks; the integer sums are exact, so
 * only their value matters.
 */
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

#include <string.h>

#include "pack_k.h"
#include "quant_common.h" /* unpack_scales_mins_k4, unpack_scales_q3_k, isum_k4_int, summs_k4_int */

#define FP16(h) llmrt_fp16_to_fp32(h)

static inline llmrt_fp16_t ld_h(const uint8_t *p) { llmrt_fp16_t h; memcpy(&h, p, 2); return h; }
static inline size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* activation row j (block_q8_K blocks; rows are 4-byte aligned like every Q8_K row llmrt makes) */
#define XROW(x, j, x_stride) ((const void *)((const uint8_t *)(x) + (size_t)(j) * (x_stride)))

/* ---- group sizes ------------------------------------------------------------------------------ */

static size_t group_bytes_q2_K(int64_t K) { return pk_group_bytes(K / QK_K, Q2K_BG); }
static size_t group_bytes_q3_K(int64_t K) { return pk_group_bytes(K / QK_K, Q3K_BG); }
static size_t group_bytes_q4_K(int64_t K) { return pk_group_bytes(K / QK_K, Q4K_BG); }
static size_t group_bytes_q5_K(int64_t K) { return pk_group_bytes(K / QK_K, Q5K_BG); }
static size_t group_bytes_q6_K(int64_t K) { return pk_group_bytes(K / QK_K, Q6K_BG); }
static size_t group_bytes_iq4_xs(int64_t K) { return pk_group_bytes(K / QK_K, IQ4XS_BG); }
static size_t group_bytes_f32(int64_t K) { return round64((size_t)K * PK_R * sizeof(float)); }
static size_t group_bytes_f16(int64_t K) { return round64((size_t)K * PK_R * sizeof(llmrt_fp16_t)); }

/* ---- packing ---------------------------------------------------------------------------------- */

/* super-block i of source row r, copied out (source rows may sit at any address); rows past `rows`
 * are all-zero GGUF blocks (the group's padding: zero rows, packed like any other) */
#define SRC_BLOCK(T, src, src_row_bytes, rows, r, i, out) do { \
        if ((r) < (rows)) memcpy(&(out), (const uint8_t *)(src) + (size_t)(r) * (src_row_bytes) + (size_t)(i) * sizeof(T), sizeof(T)); \
        else memset(&(out), 0, sizeof(T)); \
    } while (0)

static void pack_q4_K(const void *src, size_t src_row_bytes, int64_t K, int rows, void *group) {
    const int64_t nb = K / QK_K;
    memset(group, 0, group_bytes_q4_K(K));
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *bg = (uint8_t *)group + i * Q4K_BG;
        for (int r = 0; r < PK_R; r++) {
            block_q4_K b;
            SRC_BLOCK(block_q4_K, src, src_row_bytes, rows, r, i, b);
            uint8_t sc[8], m[8];
            unpack_scales_mins_k4(b.scales, sc, m);
            memcpy(bg + Q4K_D + 2 * r, &b.d, 2);
            memcpy(bg + Q4K_DMIN + 2 * r, &b.dmin, 2);
            memcpy(bg + Q4K_SC + 8 * r, sc, 8);
            for (int s = 0; s < 8; s++) bg[Q4K_M + pk_min_off(r, s)] = m[s];
            memcpy(bg + Q4K_QS + 128 * r, b.qs, 128);
        }
    }
}

static void pack_q5_K(const void *src, size_t src_row_bytes, int64_t K, int rows, void *group) {
    const int64_t nb = K / QK_K;
    memset(group, 0, group_bytes_q5_K(K));
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *bg = (uint8_t *)group + i * Q5K_BG;
        for (int r = 0; r < PK_R; r++) {
            block_q5_K b;
            SRC_BLOCK(block_q5_K, src, src_row_bytes, rows, r, i, b);
            uint8_t sc[8], m[8];
            unpack_scales_mins_k4(b.scales, sc, m);
            memcpy(bg + Q5K_D + 2 * r, &b.d, 2);
            memcpy(bg + Q5K_DMIN + 2 * r, &b.dmin, 2);
            memcpy(bg + Q5K_SC + 8 * r, sc, 8);
            for (int s = 0; s < 8; s++) bg[Q5K_M + pk_min_off(r, s)] = m[s];
            memcpy(bg + Q5K_QH + 32 * r, b.qh, 32);
            memcpy(bg + Q5K_QS + 128 * r, b.qs, 128);
        }
    }
}

static void pack_q6_K(const void *src, size_t src_row_bytes, int64_t K, int rows, void *group) {
    const int64_t nb = K / QK_K;
    memset(group, 0, group_bytes_q6_K(K));
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *bg = (uint8_t *)group + i * Q6K_BG;
        for (int r = 0; r < PK_R; r++) {
            block_q6_K b;
            SRC_BLOCK(block_q6_K, src, src_row_bytes, rows, r, i, b);
            memcpy(bg + Q6K_D + 2 * r, &b.d, 2);
            memcpy(bg + Q6K_SC + 16 * r, b.scales, 16);
            memcpy(bg + Q6K_QL + 128 * r, b.ql, 128);
            memcpy(bg + Q6K_QH + 64 * r, b.qh, 64);
        }
    }
}

static void pack_q3_K(const void *src, size_t src_row_bytes, int64_t K, int rows, void *group) {
    const int64_t nb = K / QK_K;
    memset(group, 0, group_bytes_q3_K(K));
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *bg = (uint8_t *)group + i * Q3K_BG;
        for (int r = 0; r < PK_R; r++) {
            block_q3_K b;
            SRC_BLOCK(block_q3_K, src, src_row_bytes, rows, r, i, b);
            int8_t sc[16];
            unpack_scales_q3_k(b.scales, sc);
            memcpy(bg + Q3K_D + 2 * r, &b.d, 2);
            memcpy(bg + Q3K_SC + 16 * r, sc, 16);
            memcpy(bg + Q3K_HM + 32 * r, b.hmask, 32);
            memcpy(bg + Q3K_QS + 64 * r, b.qs, 64);
        }
    }
}

static void pack_q2_K(const void *src, size_t src_row_bytes, int64_t K, int rows, void *group) {
    const int64_t nb = K / QK_K;
    memset(group, 0, group_bytes_q2_K(K));
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *bg = (uint8_t *)group + i * Q2K_BG;
        for (int r = 0; r < PK_R; r++) {
            block_q2_K b;
            SRC_BLOCK(block_q2_K, src, src_row_bytes, rows, r, i, b);
            memcpy(bg + Q2K_D + 2 * r, &b.d, 2);
            memcpy(bg + Q2K_DMIN + 2 * r, &b.dmin, 2);
            memcpy(bg + Q2K_SC + 16 * r, b.scales, 16);
            memcpy(bg + Q2K_QS + 64 * r, b.qs, 64);
        }
    }
}

/* the 6-bit sub-block scale ib of an IQ4_XS block, minus 32 (dot_generic.c's ls - 32) */
static int8_t iq4_xs_ls(const block_iq4_xs *b, int ib) {
    const int ls = ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((b->scales_h >> (2 * ib)) & 3) << 4);
    return (int8_t)(ls - 32);
}

static void pack_iq4_xs(const void *src, size_t src_row_bytes, int64_t K, int rows, void *group) {
    const int64_t nb = K / QK_K;
    memset(group, 0, group_bytes_iq4_xs(K));
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *bg = (uint8_t *)group + i * IQ4XS_BG;
        for (int r = 0; r < PK_R; r++) {
            block_iq4_xs b;
            SRC_BLOCK(block_iq4_xs, src, src_row_bytes, rows, r, i, b);
            memcpy(bg + IQ4XS_D + 2 * r, &b.d, 2);
            for (int ib = 0; ib < QK_K / 32; ib++) bg[IQ4XS_SC + 8 * r + ib] = (uint8_t)iq4_xs_ls(&b, ib);
            memcpy(bg + IQ4XS_QS + 128 * r, b.qs, 128);
        }
    }
}

/* float types: rows copied one after the other */
static void pack_rows_plain(const void *src, size_t src_row_bytes, size_t row_bytes, size_t gbytes, int rows,
                            void *group) {
    memset(group, 0, gbytes);
    for (int r = 0; r < rows; r++) {
        memcpy((uint8_t *)group + r * row_bytes, (const uint8_t *)src + (size_t)r * src_row_bytes, row_bytes);
    }
}
static void pack_f32(const void *src, size_t src_row_bytes, int64_t K, int rows, void *group) {
    pack_rows_plain(src, src_row_bytes, (size_t)K * sizeof(float), group_bytes_f32(K), rows, group);
}
static void pack_f16(const void *src, size_t src_row_bytes, int64_t K, int rows, void *group) {
    pack_rows_plain(src, src_row_bytes, (size_t)K * sizeof(llmrt_fp16_t), group_bytes_f16(K), rows, group);
}

/* ---- unpacking (the inverse of pack; tests) ----------------------------------------------------- */

/* get_scale_min_k4 inverted: 8 six-bit scales and mins -> the 12 GGUF bytes */
static void pack_scales_mins_k4(const uint8_t *sc, const uint8_t *m, uint8_t *q) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        q[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        q[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | (m[j + 4] & 0x0f) << 4);
    }
}

/* unpack_scales_q3_k inverted: 16 scales (value - 32) -> the 12 GGUF bytes */
static void pack_scales_q3_k(const int8_t *sc, uint8_t *q) {
    memset(q, 0, 12);
    for (int j = 0; j < 16; j++) {
        const int v = sc[j] + 32;
        q[j % 8] |= (uint8_t)((v & 0x0f) << (j < 8 ? 0 : 4));
        q[8 + j % 4] |= (uint8_t)((v >> 4) << (2 * (j / 4)));
    }
}

int llmrt_unpack_group_k(int type, int64_t K, const void *group, int rows, void *dst, size_t dst_row_bytes) {
    const llmrt_type_traits *tt = llmrt_type_traits_get(type);
    if (tt == NULL || K <= 0 || K % tt->blck_size != 0 || rows < 0 || rows > PK_R) return LLMRT_EINVAL;
    const uint8_t *g = group;
    switch (type) {
    case LLMRT_TYPE_F32: case LLMRT_TYPE_F16: case LLMRT_TYPE_BF16: { /* plain rows */
        const size_t rb = (size_t)K * tt->type_size;
        for (int r = 0; r < rows; r++) memcpy((uint8_t *)dst + (size_t)r * dst_row_bytes, g + r * rb, rb);
        return LLMRT_OK;
    }
    case LLMRT_TYPE_Q2_K: case LLMRT_TYPE_Q3_K: case LLMRT_TYPE_Q4_K: case LLMRT_TYPE_Q5_K: case LLMRT_TYPE_Q6_K:
    case LLMRT_TYPE_IQ4_XS:
        break;
    default:
        return LLMRT_EUNSUPPORTED;
    }
    const int64_t nb = K / QK_K;
    for (int r = 0; r < rows; r++) {
        uint8_t *row = (uint8_t *)dst + (size_t)r * dst_row_bytes;
        for (int64_t i = 0; i < nb; i++) {
            uint8_t sc[8], m[8];
            switch (type) {
            case LLMRT_TYPE_Q4_K: case LLMRT_TYPE_Q5_K: {
                const int q5 = type == LLMRT_TYPE_Q5_K;
                const uint8_t *bg = g + i * (q5 ? Q5K_BG : Q4K_BG);
                uint8_t *b = row + i * (q5 ? sizeof(block_q5_K) : sizeof(block_q4_K));
                memcpy(sc, bg + Q4K_SC + 8 * r, 8); /* Q5K_SC, Q5K_M, Q5K_D, Q5K_DMIN equal Q4K_* */
                for (int s = 0; s < 8; s++) m[s] = bg[Q4K_M + pk_min_off(r, s)];
                memcpy(b, bg + Q4K_D + 2 * r, 2);
                memcpy(b + 2, bg + Q4K_DMIN + 2 * r, 2);
                pack_scales_mins_k4(sc, m, b + 4);
                if (q5) {
                    memcpy(b + 16, bg + Q5K_QH + 32 * r, 32);
                    memcpy(b + 48, bg + Q5K_QS + 128 * r, 128);
                } else {
                    memcpy(b + 16, bg + Q4K_QS + 128 * r, 128);
                }
                break;
            }
            case LLMRT_TYPE_Q6_K: {
                const uint8_t *bg = g + i * Q6K_BG;
                uint8_t *b = row + i * sizeof(block_q6_K);
                memcpy(b, bg + Q6K_QL + 128 * r, 128);
                memcpy(b + 128, bg + Q6K_QH + 64 * r, 64);
                memcpy(b + 192, bg + Q6K_SC + 16 * r, 16);
                memcpy(b + 208, bg + Q6K_D + 2 * r, 2);
                break;
            }
            case LLMRT_TYPE_IQ4_XS: {
                const uint8_t *bg = g + i * IQ4XS_BG;
                block_iq4_xs b;
                memset(&b, 0, sizeof(b));
                memcpy(&b.d, bg + IQ4XS_D + 2 * r, 2);
                for (int ib = 0; ib < QK_K / 32; ib++) {
                    const int ls = (int)(int8_t)bg[IQ4XS_SC + 8 * r + ib] + 32;
                    b.scales_l[ib / 2] |= (uint8_t)((ls & 0x0f) << (4 * (ib % 2)));
                    b.scales_h |= (uint16_t)((ls >> 4) << (2 * ib));
                }
                memcpy(b.qs, bg + IQ4XS_QS + 128 * r, 128);
                memcpy(row + i * sizeof(block_iq4_xs), &b, sizeof(b));
                break;
            }
            case LLMRT_TYPE_Q3_K: {
                const uint8_t *bg = g + i * Q3K_BG;
                uint8_t *b = row + i * sizeof(block_q3_K);
                int8_t sc3[16];
                memcpy(sc3, bg + Q3K_SC + 16 * r, 16);
                memcpy(b, bg + Q3K_HM + 32 * r, 32);
                memcpy(b + 32, bg + Q3K_QS + 64 * r, 64);
                pack_scales_q3_k(sc3, b + 96);
                memcpy(b + 108, bg + Q3K_D + 2 * r, 2);
                break;
            }
            default: { /* Q2_K */
                const uint8_t *bg = g + i * Q2K_BG;
                uint8_t *b = row + i * sizeof(block_q2_K);
                memcpy(b, bg + Q2K_SC + 16 * r, 16);
                memcpy(b + 16, bg + Q2K_QS + 64 * r, 64);
                memcpy(b + 80, bg + Q2K_D + 2 * r, 2);
                memcpy(b + 82, bg + Q2K_DMIN + 2 * r, 2);
                break;
            }
            }
        }
    }
    return LLMRT_OK;
}

/* ---- generic kernels: dot_generic.c's arithmetic over the packed fields ------------------------ */

/* Q4_K (qh_off 0) and Q5_K: sumf += d·isum - dmin·Σ m·bsum per super-block, as dot_k4_q8_K. */
static inline void gemm_k4_generic(int64_t K, const uint8_t *group, int n_rows, const void *x, size_t x_stride,
                                   int n_x, float *y, int64_t y_stride, int bg_bytes, int o_d, int o_dmin,
                                   int o_sc, int o_m, int o_qh, int o_qs) {
    const int64_t nb = K / QK_K;
    for (int j = 0; j < n_x; j++) {
        const block_q8_K *yb = XROW(x, j, x_stride); /* (nb) */
        for (int r = 0; r < n_rows; r++) {
            float sumf = 0.0f;
            for (int64_t i = 0; i < nb; i++) {
                const uint8_t *bg = group + i * bg_bytes;
                uint8_t m[8];
                for (int s = 0; s < 8; s++) m[s] = bg[o_m + pk_min_off(r, s)];
                const int isum = isum_k4_int(bg + o_qs + 128 * r, o_qh ? bg + o_qh + 32 * r : NULL,
                                         bg + o_sc + 8 * r, yb[i].qs);
                const int summs = summs_k4_int(yb[i].bsums, m);
                const float d = FP16(ld_h(bg + o_d + 2 * r)) * yb[i].d;
                const float dmin = FP16(ld_h(bg + o_dmin + 2 * r)) * yb[i].d;
                sumf += d * (float)isum - dmin * (float)summs;
            }
            y[j * y_stride + r] = sumf;
        }
    }
}

static void gemm_q4_K_generic(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                              float *y, int64_t y_stride) {
    gemm_k4_generic(K, group, n_rows, x, x_stride, n_x, y, y_stride, Q4K_BG, Q4K_D, Q4K_DMIN, Q4K_SC, Q4K_M, 0,
                    Q4K_QS);
}

static void gemm_q5_K_generic(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                              float *y, int64_t y_stride) {
    gemm_k4_generic(K, group, n_rows, x, x_stride, n_x, y, y_stride, Q5K_BG, Q5K_D, Q5K_DMIN, Q5K_SC, Q5K_M, Q5K_QH,
                    Q5K_QS);
}

static void gemm_q6_K_generic(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                              float *y, int64_t y_stride) {
    const int64_t nb = K / QK_K;
    const uint8_t *g = group;
    for (int j = 0; j < n_x; j++) {
        const block_q8_K *yb = XROW(x, j, x_stride); /* (nb) */
        for (int r = 0; r < n_rows; r++) {
            float sumf = 0.0f;
            for (int64_t i = 0; i < nb; i++) {
                const uint8_t *bg = g + i * Q6K_BG;
                const int8_t *sc = (const int8_t *)(bg + Q6K_SC + 16 * r);
                int isum = 0;
                for (int h = 0; h < QK_K / 128; h++) {
                    const uint8_t *ql = bg + Q6K_QL + 128 * r + 64 * h;
                    const uint8_t *qh = bg + Q6K_QH + 64 * r + 32 * h;
                    for (int gg = 0; gg < 4; gg++) {
                        const int8_t *q8 = yb[i].qs + 128 * h + 32 * gg;
                        const int nshift = 4 * (gg / 2);
                        int s0 = 0, s1 = 0;
                        for (int l = 0; l < 32; l++) {
                            const int v = (((ql[l + 32 * (gg % 2)] >> nshift) & 0x0f) |
                                           (((qh[l] >> (2 * gg)) & 3) << 4)) - 32;
                            if (l < 16) s0 += v * q8[l]; else s1 += v * q8[l];
                        }
                        const int is = (128 * h + 32 * gg) / 16;
                        isum += sc[is] * s0 + sc[is + 1] * s1;
                    }
                }
                sumf += (FP16(ld_h(bg + Q6K_D + 2 * r)) * yb[i].d) * (float)isum;
            }
            y[j * y_stride + r] = sumf;
        }
    }
}

static void gemm_q3_K_generic(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                              float *y, int64_t y_stride) {
    const int64_t nb = K / QK_K;
    const uint8_t *g = group;
    for (int j = 0; j < n_x; j++) {
        const block_q8_K *yb = XROW(x, j, x_stride); /* (nb) */
        for (int r = 0; r < n_rows; r++) {
            float sumf = 0.0f;
            for (int64_t i = 0; i < nb; i++) {
                const uint8_t *bg = g + i * Q3K_BG;
                const int8_t *sc = (const int8_t *)(bg + Q3K_SC + 16 * r);
                const uint8_t *qs = bg + Q3K_QS + 64 * r;
                const uint8_t *hmask = bg + Q3K_HM + 32 * r;
                int isum = 0;
                for (int e = 0; e < QK_K; e += 16) {
                    const uint8_t *q3 = qs + 32 * (e / 128) + e % 32;
                    const uint8_t *hm = hmask + e % 32;
                    const int shift = 2 * ((e % 128) / 32);
                    const int hbit = e / 32;
                    int isuml = 0;
                    for (int l = 0; l < 16; l++) {
                        const int v = ((q3[l] >> shift) & 3) - (((hm[l] >> hbit) & 1) ? 0 : 4);
                        isuml += yb[i].qs[e + l] * v;
                    }
                    isum += sc[e / 16] * isuml;
                }
                sumf += (FP16(ld_h(bg + Q3K_D + 2 * r)) * yb[i].d) * (float)isum;
            }
            y[j * y_stride + r] = sumf;
        }
    }
}

/* IQ4_XS: dot_generic.c's vec_dot_iq4_xs_q8_K_generic: sumf += (d·dy·ls) · isum per 32-group */
static void gemm_iq4_xs_generic(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                                float *y, int64_t y_stride) {
    const int64_t nb = K / QK_K;
    const uint8_t *g = group;
    for (int j = 0; j < n_x; j++) {
        const block_q8_K *yb = XROW(x, j, x_stride); /* (nb) */
        for (int r = 0; r < n_rows; r++) {
            float sumf = 0.0f;
            for (int64_t i = 0; i < nb; i++) {
                const uint8_t *bg = g + i * IQ4XS_BG;
                const float d4d8 = FP16(ld_h(bg + IQ4XS_D + 2 * r)) * yb[i].d;
                for (int ib = 0; ib < QK_K / 32; ib++) {
                    const uint8_t *qs = bg + IQ4XS_QS + 128 * r + 16 * ib;
                    const int8_t *q8 = yb[i].qs + 32 * ib;
                    int sumi = 0;
                    for (int l = 0; l < 16; l++) {
                        sumi += kvalues_iq4nl[qs[l] & 0x0f] * q8[l];
                        sumi += kvalues_iq4nl[qs[l] >> 4] * q8[l + 16];
                    }
                    sumf += (d4d8 * (float)(int8_t)bg[IQ4XS_SC + 8 * r + ib]) * (float)sumi;
                }
            }
            y[j * y_stride + r] = sumf;
        }
    }
}

static void gemm_q2_K_generic(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                              float *y, int64_t y_stride) {
    const int64_t nb = K / QK_K;
    const uint8_t *g = group;
    for (int j = 0; j < n_x; j++) {
        const block_q8_K *yb = XROW(x, j, x_stride); /* (nb) */
        for (int r = 0; r < n_rows; r++) {
            float sumf = 0.0f;
            for (int64_t i = 0; i < nb; i++) {
                const uint8_t *bg = g + i * Q2K_BG;
                const uint8_t *sc = bg + Q2K_SC + 16 * r;
                const uint8_t *qs = bg + Q2K_QS + 64 * r;
                int summs = 0;
                for (int l = 0; l < 16; l++) summs += yb[i].bsums[l] * (sc[l] >> 4);
                int isum = 0;
                for (int e = 0; e < QK_K; e += 16) {
                    const uint8_t *q2 = qs + 32 * (e / 128) + e % 32;
                    const int shift = 2 * ((e % 128) / 32);
                    int isuml = 0;
                    for (int l = 0; l < 16; l++) isuml += yb[i].qs[e + l] * ((q2[l] >> shift) & 3);
                    isum += (sc[e / 16] & 0x0f) * isuml;
                }
                const float dall = yb[i].d * FP16(ld_h(bg + Q2K_D + 2 * r));
                const float dmin = yb[i].d * FP16(ld_h(bg + Q2K_DMIN + 2 * r));
                sumf += dall * (float)isum - dmin * (float)summs;
            }
            y[j * y_stride + r] = sumf;
        }
    }
}

/* float types: f32 products summed in double, as dot_generic.c */
static void gemm_f32_generic(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                             float *y, int64_t y_stride) {
    for (int j = 0; j < n_x; j++) {
        const float *a = XROW(x, j, x_stride); /* (K) */
        for (int r = 0; r < n_rows; r++) {
            const float *w = (const float *)group + r * K; /* (K) */
            double sum = 0.0;
            for (int64_t i = 0; i < K; i++) sum += (double)(w[i] * a[i]);
            y[j * y_stride + r] = (float)sum;
        }
    }
}

static void gemm_f16_generic(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                             float *y, int64_t y_stride) {
    for (int j = 0; j < n_x; j++) {
        const llmrt_fp16_t *a = XROW(x, j, x_stride); /* (K) */
        for (int r = 0; r < n_rows; r++) {
            const llmrt_fp16_t *w = (const llmrt_fp16_t *)group + r * K; /* (K) */
            double sum = 0.0;
            for (int64_t i = 0; i < K; i++) sum += (double)(FP16(w[i]) * FP16(a[i]));
            y[j * y_stride + r] = (float)sum;
        }
    }
}

static void gemm_bf16_generic(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                              float *y, int64_t y_stride) {
    for (int j = 0; j < n_x; j++) {
        const llmrt_bf16_t *a = XROW(x, j, x_stride); /* (K) */
        for (int r = 0; r < n_rows; r++) {
            const llmrt_bf16_t *w = (const llmrt_bf16_t *)group + r * K; /* (K) */
            double sum = 0.0;
            for (int64_t i = 0; i < K; i++) sum += (double)(llmrt_bf16_to_fp32(w[i]) * llmrt_bf16_to_fp32(a[i]));
            y[j * y_stride + r] = (float)sum;
        }
    }
}

void llmrt_register_gemm_k_kernels_generic(llmrt_kernel_table *kt) {
#define REG(T, gb, pk, fn) do { \
        kt->pack_rows[LLMRT_TYPE_##T] = PK_R; kt->pack_group_bytes[LLMRT_TYPE_##T] = gb; \
        kt->pack[LLMRT_TYPE_##T] = pk; kt->gemm[LLMRT_TYPE_##T] = fn; kt->gemm_name[LLMRT_TYPE_##T] = #fn; \
    } while (0)
    REG(Q2_K, group_bytes_q2_K, pack_q2_K, gemm_q2_K_generic);
    REG(Q3_K, group_bytes_q3_K, pack_q3_K, gemm_q3_K_generic);
    REG(Q4_K, group_bytes_q4_K, pack_q4_K, gemm_q4_K_generic);
    REG(Q5_K, group_bytes_q5_K, pack_q5_K, gemm_q5_K_generic);
    REG(Q6_K, group_bytes_q6_K, pack_q6_K, gemm_q6_K_generic);
    REG(IQ4_XS, group_bytes_iq4_xs, pack_iq4_xs, gemm_iq4_xs_generic);
    REG(F32, group_bytes_f32, pack_f32, gemm_f32_generic);
    REG(F16, group_bytes_f16, pack_f16, gemm_f16_generic);
    REG(BF16, group_bytes_f16, pack_f16, gemm_bf16_generic); /* bf16 rows: 2 bytes an element, as f16 */
#undef REG
}
