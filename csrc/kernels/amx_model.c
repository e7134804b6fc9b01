/*
 * amx_model.c — the software model of AMX's tile instructions (palette 1: eight tiles of 16 rows x
 * 64 bytes) and the AMX GEMMs (amx_gemm.h) compiled against it. Portable C11, no target pragma:
 * it runs on every machine, so the AMX packing and tiling are tested everywhere. Semantics and
 * the limits of exactness vs hardware are documented in llmrt/amx.h.
 */
#include "llmrt/amx.h"
#include "llmrt/llmrt.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

void llmrt_amx_model_init(llmrt_amx_model *s) {
    memset(s, 0, sizeof(*s));
}

static int cfg_valid(const llmrt_amx_tilecfg *cfg) {
    if (cfg->palette_id != 1 || cfg->start_row != 0) return 0;
    for (int i = 0; i < 14; i++) if (cfg->reserved[i] != 0) return 0;
    for (int t = 0; t < 16; t++) {
        const int rows = cfg->rows[t], colsb = cfg->colsb[t];
        if (t >= LLMRT_AMX_NTILES) {
            if (rows != 0 || colsb != 0) return 0;
        } else if (rows > LLMRT_AMX_MAX_ROWS || colsb > LLMRT_AMX_MAX_COLSB
                   || (rows == 0) != (colsb == 0)) {
            return 0;
        }
    }
    return 1;
}

void llmrt_amx_model_config(llmrt_amx_model *s, const llmrt_amx_tilecfg *cfg) {
    if (!cfg_valid(cfg)) {
        s->err = LLMRT_EINVAL;
        return;
    }
    s->cfg = *cfg;
    s->configured = 1;
    memset(s->t, 0, sizeof(s->t)); /* LDTILECFG zeroes the tile data */
}

void llmrt_amx_model_release(llmrt_amx_model *s) {
    s->configured = 0;
    memset(&s->cfg, 0, sizeof(s->cfg));
    memset(s->t, 0, sizeof(s->t));
}

/* 1 if tile t is configured (non-empty); else sets err */
static int tile_ok(llmrt_amx_model *s, int t) {
    if (!s->configured || t < 0 || t >= LLMRT_AMX_NTILES || s->cfg.rows[t] == 0) {
        s->err = LLMRT_EINVAL;
        return 0;
    }
    return 1;
}

void llmrt_amx_model_load(llmrt_amx_model *s, int t, const void *base, size_t stride) {
    if (!tile_ok(s, t)) return;
    const int rows = s->cfg.rows[t], colsb = s->cfg.colsb[t];
    memset(s->t[t], 0, sizeof(s->t[t]));
    for (int r = 0; r < rows; r++) {
        memcpy(s->t[t] + r * LLMRT_AMX_MAX_COLSB, (const uint8_t *)base + (size_t)r * stride,
               (size_t)colsb);
    }
}

void llmrt_amx_model_store(llmrt_amx_model *s, int t, void *base, size_t stride) {
    if (!tile_ok(s, t)) return;
    const int rows = s->cfg.rows[t], colsb = s->cfg.colsb[t];
    for (int r = 0; r < rows; r++) {
        memcpy((uint8_t *)base + (size_t)r * stride, s->t[t] + r * LLMRT_AMX_MAX_COLSB,
               (size_t)colsb);
    }
}

void llmrt_amx_model_zero(llmrt_amx_model *s, int t) {
    if (!tile_ok(s, t)) return;
    memset(s->t[t], 0, sizeof(s->t[t]));
}

static uint32_t rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static float rd_f32(const uint8_t *p) {
    float v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* f32 with denormals read as (signed) zero */
static float daz(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    memcpy(&x, &u, sizeof(u));
    return x;
}

/* bf16 at p (little endian) as f32, denormals as zero (make_fp32 + DAZ) */
static float bf16_daz(const uint8_t *p) {
    const uint32_t u = (uint32_t)p[0] << 16 | (uint32_t)p[1] << 24;
    float x;
    memcpy(&x, &u, sizeof(x));
    return daz(x);
}

void llmrt_amx_model_dp(llmrt_amx_model *s, int op, int c, int a, int b) {
    if (op < 0 || op >= LLMRT_AMX_NOPS || !tile_ok(s, c) || !tile_ok(s, a) || !tile_ok(s, b)
        || c == a || c == b || a == b) {
        s->err = LLMRT_EINVAL;
        return;
    }
    const llmrt_amx_tilecfg *cfg = &s->cfg;
    const int M = cfg->rows[c], N = cfg->colsb[c] / 4, K = cfg->colsb[a] / 4;
    if (cfg->rows[a] != M || cfg->colsb[a] % 4 != 0 || cfg->rows[b] != K
        || cfg->colsb[b] != cfg->colsb[c] || cfg->colsb[c] % 4 != 0) {
        s->err = LLMRT_EINVAL;
        return;
    }
    uint8_t *tc = s->t[c];
    const uint8_t *ta = s->t[a], *tb = s->t[b];
    if (op == LLMRT_AMX_DPBF16PS) {
        for (int m = 0; m < M; m++) {
            for (int n = 0; n < N; n++) {
                float acc = daz(rd_f32(tc + m * 64 + n * 4));
                for (int k = 0; k < K; k++) {
                    for (int i = 0; i < 2; i++) {
                        const float x = bf16_daz(ta + m * 64 + k * 4 + i * 2);
                        const float z = bf16_daz(tb + k * 64 + n * 4 + i * 2);
                        acc = daz(fmaf(x, z, acc)); /* RNE, then flush a denormal to zero */
                    }
                }
                memcpy(tc + m * 64 + n * 4, &acc, sizeof(acc));
            }
        }
    } else {
        const int a_signed = op == LLMRT_AMX_DPBSSD || op == LLMRT_AMX_DPBSUD;
        const int b_signed = op == LLMRT_AMX_DPBSSD || op == LLMRT_AMX_DPBUSD;
        for (int m = 0; m < M; m++) {
            for (int n = 0; n < N; n++) {
                uint32_t acc = rd_u32(tc + m * 64 + n * 4); /* wraps modulo 2^32 */
                for (int k = 0; k < K; k++) {
                    for (int i = 0; i < 4; i++) {
                        const uint8_t ua = ta[m * 64 + k * 4 + i], ub = tb[k * 64 + n * 4 + i];
                        const int32_t va = a_signed ? (int32_t)(int8_t)ua : (int32_t)ua;
                        const int32_t vb = b_signed ? (int32_t)(int8_t)ub : (int32_t)ub;
                        acc += (uint32_t)(va * vb); /* |va * vb| <= 2^16: no overflow */
                    }
                }
                memcpy(tc + m * 64 + n * 4, &acc, sizeof(acc));
            }
        }
    }
    /* write_row_and_zero: bytes past colsb and rows past M of C are zeroed */
    for (int m = 0; m < LLMRT_AMX_MAX_ROWS; m++) {
        const int from = m < M ? cfg->colsb[c] : 0;
        memset(tc + m * 64 + from, 0, (size_t)(64 - from));
    }
}

/* ---- the GEMMs on the model ------------------------------------------------------------------- */

#define AMX_FN(name) name##_model
#define AMX_STATE llmrt_amx_model amx_st_; llmrt_amx_model_init(&amx_st_)
#define AMX_CONFIG(cfgp) llmrt_amx_model_config(&amx_st_, (cfgp))
#define AMX_RELEASE() llmrt_amx_model_release(&amx_st_)
#define AMX_STATUS amx_st_.err
#define AMX_LOAD(t, p, stride) llmrt_amx_model_load(&amx_st_, (t), (p), (stride))
#define AMX_STORE(t, p, stride) llmrt_amx_model_store(&amx_st_, (t), (p), (stride))
#define AMX_ZERO(t) llmrt_amx_model_zero(&amx_st_, (t))
#define AMX_DPBSSD(c, a, b) llmrt_amx_model_dp(&amx_st_, LLMRT_AMX_DPBSSD, (c), (a), (b))
#define AMX_DPBF16PS(c, a, b) llmrt_amx_model_dp(&amx_st_, LLMRT_AMX_DPBF16PS, (c), (a), (b))
#include "amx_gemm.h"
