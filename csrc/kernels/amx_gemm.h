/*
 * amx_gemm.h — the AMX int8 and bf16 GEMM bodies, written once against the tile layer and
 * compiled twice: by csrc/kernels/amx_model.c (software model) and csrc/kernels/x86/amx.c (real
 * instructions). Include it after defining:
 *
 *   AMX_FN(name)           the function name with its backend suffix (name##_model / name##_hw)
 *   AMX_STATE              declarations the backend needs inside each function (model: the tiles)
 *   AMX_CONFIG(cfgp)       LDTILECFG          AMX_RELEASE()         TILERELEASE
 *   AMX_LOAD(t, p, stride) TILELOADD          AMX_STORE(t, p, stride) TILESTORED
 *   AMX_ZERO(t)            TILEZERO           AMX_DPBSSD(c, a, b)   AMX_DPBF16PS(c, a, b)
 *   AMX_STATUS             after AMX_RELEASE: LLMRT_OK, or the model's error for an invalid tile use
 *
 * Tile indices are literal constants (the instructions encode them). Tile roles, a 32 x 32 output
 * block as 2 x 2 tiles of 16 tokens x 16 weight rows:
 *
 *        B: tmm6 (rows r..r+15)  tmm7 (rows r+16..r+31)
 *   A: tmm4 (tokens t..t+15)     C: tmm0              tmm1
 *      tmm5 (tokens t+16..t+31)     tmm2              tmm3
 *
 * Edges: a token tail configures fewer rows in A/C (tmm5, tmm2, tmm3 unused when <= 16 tokens
 * remain), a weight-row tail uses only tmm6 (rows are zero-padded to 16 in the packing and the
 * padded columns are never written to y). The float epilogue is plain C shared by both builds
 * (fmaf, no expression the compiler could contract differently), so both give the same bits.
 */
#include "llmrt/amx.h"
#include "llmrt/llmrt.h"
#include "quant_common.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* tile config: m0 / m1 tokens in the upper / lower tile row (m1 may be 0: tmm2, 3, 5 unused).
 * C tiles m x 16 dwords; A tiles m x a_colsb bytes; B tiles b_rows x (16 rows x 4 bytes).
 * int8: a_colsb 32 (one 32-block), b_rows 8; bf16: a_colsb 64 (32 bf16), b_rows 16 (pairs). */
static void AMX_FN(cfg_tiles)(llmrt_amx_tilecfg *cfg, int m0, int m1, int a_colsb, int b_rows) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->palette_id = 1;
    const int mc[4] = { m0, m0, m1, m1 };     /* C tiles 0..3 */
    for (int t = 0; t < 4; t++) {
        cfg->rows[t] = (uint8_t)mc[t];
        cfg->colsb[t] = mc[t] > 0 ? 64 : 0;
    }
    cfg->rows[4] = (uint8_t)m0;               /* A tiles 4, 5 */
    cfg->colsb[4] = (uint16_t)a_colsb;
    cfg->rows[5] = (uint8_t)m1;
    cfg->colsb[5] = m1 > 0 ? (uint16_t)a_colsb : 0;
    for (int t = 6; t < 8; t++) {             /* B tiles 6, 7 */
        cfg->rows[t] = (uint8_t)b_rows;
        cfg->colsb[t] = 64;
    }
}

/* acc[i][j] (+)= scaled int32 tile results of one 32-block, tokens i < mt, columns j < nc. */
static void AMX_FN(epilogue_int8)(float acc[32][32], const int32_t ci[4][256], const float *dw,
                                  const float *mw, const float *dx, const float *sx, int mt,
                                  int nc) {
    for (int i = 0; i < mt; i++) {
        const int32_t *c0 = ci[i < 16 ? 0 : 2] + (i & 15) * 16; /* columns 0..15 */
        const int32_t *c1 = ci[i < 16 ? 1 : 3] + (i & 15) * 16; /* columns 16..31 */
        float *a = acc[i];
        const float d = dx[i];
        for (int j = 0; j < 16; j++) a[j] = fmaf((float)c0[j], dw[j] * d, a[j]);
        if (nc > 16) {
            for (int j = 0; j < 16; j++) a[16 + j] = fmaf((float)c1[j], dw[16 + j] * d, a[16 + j]);
        }
        if (mw != NULL) {
            const float s = sx[i];
            for (int j = 0; j < nc; j++) a[j] = fmaf(mw[j], s, a[j]);
        }
    }
}

int AMX_FN(llmrt_amx_gemm_int8)(const llmrt_amx_packed *w, const uint8_t *act, size_t act_nb1,
                                 int64_t n, float *y, size_t y_nb1, int64_t row0, int64_t row1,
                                 int kc) {
    AMX_STATE;
    const int has_min = w->has_min;
    const size_t ab = has_min ? sizeof(block_q8_1) : sizeof(block_q8_0); /* activation block */
    const size_t qs_off = has_min ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    const size_t blk = w->blk_bytes;
    const int64_t nkb = w->nkb;
    if (kc <= 0) kc = LLMRT_AMX_KC_DEFAULT;

    _Alignas(64) int32_t ci[4][256];   /* the four C tiles of one 32-block, 16 x 16 each */
    _Alignas(64) float acc[32][32];    /* [token][weight row] of the current 32 x 32 block */
    float dw[32], mw[32], dx[32], sx[32];
    llmrt_amx_tilecfg cfg;
    int cur_m0 = -1, cur_m1 = -1;
    memset(ci, 0, sizeof(ci));
    memset(mw, 0, sizeof(mw));
    memset(sx, 0, sizeof(sx));

    for (int64_t r = row0; r < row1; r += 32) {
        const int nr = (int)(row1 - r < 32 ? row1 - r : 32);  /* output columns in this step */
        const int nc = nr > 16 ? 32 : 16;                      /* columns the tiles compute */
        const uint8_t *w0 = w->data + (size_t)(r / 16) * w->group_bytes;
        const uint8_t *w1 = w0 + w->group_bytes;               /* used only when nr > 16 */
        for (int64_t k0 = 0; k0 < nkb; k0 += kc) {             /* K chunks: weights stay hot */
            const int64_t k1 = k0 + kc < nkb ? k0 + kc : nkb;
            for (int64_t t = 0; t < n; t += 32) {
                const int m0 = (int)(n - t < 16 ? n - t : 16);
                const int m1 = (int)(n - t - 16 <= 0 ? 0 : (n - t - 16 < 16 ? n - t - 16 : 16));
                const int mt = m0 + m1;
                if (m0 != cur_m0 || m1 != cur_m1) {
                    AMX_FN(cfg_tiles)(&cfg, m0, m1, 32, 8);
                    AMX_CONFIG(&cfg);
                    cur_m0 = m0;
                    cur_m1 = m1;
                }
                for (int i = 0; i < mt; i++) {
                    const float *yr = (const float *)((const uint8_t *)y + (size_t)(t + i) * y_nb1) + r;
                    for (int j = 0; j < 32; j++) acc[i][j] = (k0 > 0 && j < nr) ? yr[j] : 0.0f;
                }
                const uint8_t *xt = act + (size_t)t * act_nb1;
                for (int64_t kb = k0; kb < k1; kb++) {
                    const uint8_t *xa = xt + (size_t)kb * ab;
                    const uint8_t *b0 = w0 + (size_t)kb * blk;
                    const uint8_t *b1 = w1 + (size_t)kb * blk;
                    AMX_LOAD(4, xa + qs_off, act_nb1);
                    AMX_LOAD(6, b0, 64);
                    AMX_ZERO(0);
                    AMX_DPBSSD(0, 4, 6);
                    AMX_STORE(0, ci[0], 64);
                    if (nr > 16) {
                        AMX_LOAD(7, b1, 64);
                        AMX_ZERO(1);
                        AMX_DPBSSD(1, 4, 7);
                        AMX_STORE(1, ci[1], 64);
                    }
                    if (m1 > 0) {
                        AMX_LOAD(5, xa + 16 * act_nb1 + qs_off, act_nb1);
                        AMX_ZERO(2);
                        AMX_DPBSSD(2, 5, 6);
                        AMX_STORE(2, ci[2], 64);
                        if (nr > 16) {
                            AMX_ZERO(3);
                            AMX_DPBSSD(3, 5, 7);
                            AMX_STORE(3, ci[3], 64);
                        }
                    }
                    /* scales: weights' d (and m) after the 512 quant bytes; activations' d, s */
                    memcpy(dw, b0 + 512, 16 * sizeof(float));
                    if (nr > 16) memcpy(dw + 16, b1 + 512, 16 * sizeof(float));
                    if (has_min) {
                        memcpy(mw, b0 + 576, 16 * sizeof(float));
                        if (nr > 16) memcpy(mw + 16, b1 + 576, 16 * sizeof(float));
                    }
                    for (int i = 0; i < mt; i++) {
                        const uint8_t *blkx = xa + (size_t)i * act_nb1;
                        dx[i] = rd_f16(blkx);
                        if (has_min) sx[i] = rd_f16(blkx + offsetof(block_q8_1, s));
                    }
                    AMX_FN(epilogue_int8)(acc, (const int32_t (*)[256])ci, dw,
                                          has_min ? mw : NULL, dx, sx, mt, nc);
                }
                for (int i = 0; i < mt; i++) {
                    float *yr = (float *)((uint8_t *)y + (size_t)(t + i) * y_nb1) + r;
                    for (int j = 0; j < nr; j++) yr[j] = acc[i][j];
                }
            }
        }
    }
    AMX_RELEASE();
    return AMX_STATUS;
}

int AMX_FN(llmrt_amx_gemm_bf16)(const llmrt_amx_packed *w, const uint8_t *xb, size_t xb_nb1,
                                 int64_t n, float *y, size_t y_nb1, int64_t row0, int64_t row1) {
    AMX_STATE;
    const int64_t nkb = w->nkb;
    _Alignas(64) float cf[4][256];     /* the four C tiles, 16 x 16 f32 each */
    llmrt_amx_tilecfg cfg;
    int cur_m0 = -1, cur_m1 = -1;
    memset(cf, 0, sizeof(cf));

    for (int64_t r = row0; r < row1; r += 32) {
        const int nr = (int)(row1 - r < 32 ? row1 - r : 32);
        const uint8_t *w0 = w->data + (size_t)(r / 16) * w->group_bytes;
        const uint8_t *w1 = w0 + w->group_bytes;
        for (int64_t t = 0; t < n; t += 32) {
            const int m0 = (int)(n - t < 16 ? n - t : 16);
            const int m1 = (int)(n - t - 16 <= 0 ? 0 : (n - t - 16 < 16 ? n - t - 16 : 16));
            if (m0 != cur_m0 || m1 != cur_m1) {
                AMX_FN(cfg_tiles)(&cfg, m0, m1, 64, 16);
                AMX_CONFIG(&cfg);
                cur_m0 = m0;
                cur_m1 = m1;
            }
            const uint8_t *xt = xb + (size_t)t * xb_nb1;
            AMX_ZERO(0);
            if (nr > 16) AMX_ZERO(1);
            if (m1 > 0) {
                AMX_ZERO(2);
                if (nr > 16) AMX_ZERO(3);
            }
            for (int64_t c = 0; c < nkb; c++) {       /* 32 K elements = 16 bf16 pairs per step */
                AMX_LOAD(4, xt + (size_t)c * 64, xb_nb1);
                AMX_LOAD(6, w0 + (size_t)c * 1024, 64);
                AMX_DPBF16PS(0, 4, 6);
                if (nr > 16) {
                    AMX_LOAD(7, w1 + (size_t)c * 1024, 64);
                    AMX_DPBF16PS(1, 4, 7);
                }
                if (m1 > 0) {
                    AMX_LOAD(5, xt + 16 * xb_nb1 + (size_t)c * 64, xb_nb1);
                    AMX_DPBF16PS(2, 5, 6);
                    if (nr > 16) AMX_DPBF16PS(3, 5, 7);
                }
            }
            AMX_STORE(0, cf[0], 64);
            if (nr > 16) AMX_STORE(1, cf[1], 64);
            if (m1 > 0) {
                AMX_STORE(2, cf[2], 64);
                if (nr > 16) AMX_STORE(3, cf[3], 64);
            }
            for (int i = 0; i < m0 + m1; i++) {
                float *yr = (float *)((uint8_t *)y + (size_t)(t + i) * y_nb1) + r;
                const float *c0 = cf[i < 16 ? 0 : 2] + (i & 15) * 16;
                const float *c1 = cf[i < 16 ? 1 : 3] + (i & 15) * 16;
                for (int j = 0; j < nr; j++) yr[j] = j < 16 ? c0[j] : c1[j - 16];
            }
        }
    }
    AMX_RELEASE();
    return AMX_STATUS;
}
