/*
 * amx_pack.c — the AMX path's portable parts: weights repacked into the B-tile ("VNNI") layout,
 * activations rounded to bf16, argument checks and the backend switch in front of the GEMMs, and
 * the one-instruction test entry (llmrt_amx_dp_once). Layouts are described in llmrt/amx.h.
 */
#include "llmrt/amx.h"
#include "llmrt/llmrt.h"
#include "quant_common.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

int llmrt_amx_supports(int wtype) {
    switch (wtype) {
    case LLMRT_TYPE_Q8_0: case LLMRT_TYPE_Q4_0: case LLMRT_TYPE_Q4_1:
    case LLMRT_TYPE_Q5_0: case LLMRT_TYPE_Q5_1:
    case LLMRT_TYPE_F32: case LLMRT_TYPE_F16: case LLMRT_TYPE_BF16:
        return 1;
    default:
        return 0;
    }
}

int llmrt_amx_act_type(const llmrt_amx_packed *p) {
    if (p->kind != LLMRT_AMX_KIND_INT8) return -1;
    return p->has_min ? LLMRT_TYPE_Q8_1 : LLMRT_TYPE_Q8_0;
}

/* One 32-block of a quantized row as int8 q[32] (offset removed for the symmetric types), its
 * scale d and (Q4_1 / Q5_1) min m. */
static void unpack_block(int wtype, const uint8_t *b, int8_t q[32], float *d, float *m) {
    *m = 0.0f;
    switch (wtype) {
    case LLMRT_TYPE_Q8_0:
        *d = rd_f16(b + offsetof(block_q8_0, d));
        memcpy(q, b + offsetof(block_q8_0, qs), 32);
        break;
    case LLMRT_TYPE_Q4_0:
    case LLMRT_TYPE_Q4_1: {
        const int is1 = wtype == LLMRT_TYPE_Q4_1;
        const uint8_t *qs = b + (is1 ? offsetof(block_q4_1, qs) : offsetof(block_q4_0, qs));
        const int off = is1 ? 0 : 8;
        *d = rd_f16(b); /* d is the first field of both */
        if (is1) *m = rd_f16(b + offsetof(block_q4_1, m));
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)((qs[j] & 0x0f) - off);
            q[j + 16] = (int8_t)((qs[j] >> 4) - off);
        }
        break;
    }
    case LLMRT_TYPE_Q5_0:
    case LLMRT_TYPE_Q5_1: {
        const int is1 = wtype == LLMRT_TYPE_Q5_1;
        const uint8_t *qs = b + (is1 ? offsetof(block_q5_1, qs) : offsetof(block_q5_0, qs));
        uint32_t qh;
        memcpy(&qh, b + (is1 ? offsetof(block_q5_1, qh) : offsetof(block_q5_0, qh)), sizeof(qh));
        const int off = is1 ? 0 : 16;
        *d = rd_f16(b);
        if (is1) *m = rd_f16(b + offsetof(block_q5_1, m));
        for (int j = 0; j < 16; j++) {
            const int h0 = (int)((qh >> j) & 1u) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1u) << 4;
            q[j] = (int8_t)(((qs[j] & 0x0f) | h0) - off);
            q[j + 16] = (int8_t)(((qs[j] >> 4) | h1) - off);
        }
        break;
    }
    default:
        memset(q, 0, 32);
        *d = 0.0f;
    }
}

/* element k of a F32 / F16 / BF16 row as bf16 (round to nearest even) */
static uint16_t elem_bf16(int wtype, const uint8_t *row, int64_t k) {
    if (wtype == LLMRT_TYPE_BF16) {
        uint16_t h;
        memcpy(&h, row + 2 * k, sizeof(h));
        return h;
    }
    float f;
    if (wtype == LLMRT_TYPE_F16) {
        f = rd_f16(row + 2 * k);
    } else {
        memcpy(&f, row + 4 * k, sizeof(f));
    }
    return llmrt_fp32_to_bf16(f);
}

int llmrt_amx_pack(llmrt_amx_packed *p, int wtype, const void *w, size_t nb1, int64_t M, int64_t K) {
    memset(p, 0, sizeof(*p));
    if (!llmrt_amx_supports(wtype)) return LLMRT_EUNSUPPORTED;
    if (w == NULL || M <= 0 || K <= 0) return LLMRT_EINVAL;
    const int is_f = wtype == LLMRT_TYPE_F32 || wtype == LLMRT_TYPE_F16 || wtype == LLMRT_TYPE_BF16;
    if (!is_f && K % 32 != 0) return LLMRT_EINVAL;
    if (nb1 < llmrt_row_size(wtype, K)) return LLMRT_EINVAL;
    p->kind = is_f ? LLMRT_AMX_KIND_BF16 : LLMRT_AMX_KIND_INT8;
    p->wtype = wtype;
    p->has_min = wtype == LLMRT_TYPE_Q4_1 || wtype == LLMRT_TYPE_Q5_1;
    p->M = M;
    p->K = K;
    p->ngroups = (M + 15) / 16;
    p->nkb = (K + 31) / 32;
    p->blk_bytes = is_f ? 1024 : (p->has_min ? 640 : 576);
    p->group_bytes = (size_t)p->nkb * p->blk_bytes;
    const size_t total = (size_t)p->ngroups * p->group_bytes; /* a multiple of 64 */
    p->data = aligned_alloc(64, total);
    if (p->data == NULL) {
        memset(p, 0, sizeof(*p));
        return LLMRT_ENOMEM;
    }
    memset(p->data, 0, total); /* padding rows / K tail stay zero */
    const size_t bsz = is_f ? 0 : llmrt_type_traits_get(wtype)->type_size;
    for (int64_t r = 0; r < M; r++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)r * nb1;
        uint8_t *g = p->data + (size_t)(r / 16) * p->group_bytes;
        const int n = (int)(r % 16);
        for (int64_t kb = 0; kb < p->nkb; kb++) {
            uint8_t *blk = g + (size_t)kb * p->blk_bytes;
            if (is_f) { /* bf16 q[p][n][i] = element 32kb + 2p + i */
                for (int64_t e = 0; e < 32 && kb * 32 + e < K; e++) {
                    const uint16_t h = elem_bf16(wtype, row, kb * 32 + e);
                    memcpy(blk + (e / 2) * 64 + n * 4 + (e % 2) * 2, &h, sizeof(h));
                }
            } else {    /* int8 q[kk][n][i] = element 32kb + 4kk + i, then d[16], m[16] */
                int8_t q[32];
                float d, m;
                unpack_block(wtype, row + (size_t)kb * bsz, q, &d, &m);
                for (int e = 0; e < 32; e++) blk[(e / 4) * 64 + n * 4 + (e % 4)] = (uint8_t)q[e];
                memcpy(blk + 512 + n * 4, &d, sizeof(d));
                if (p->has_min) memcpy(blk + 576 + n * 4, &m, sizeof(m));
            }
        }
    }
    return LLMRT_OK;
}

void llmrt_amx_packed_free(llmrt_amx_packed *p) {
    if (p == NULL) return;
    free(p->data);
    memset(p, 0, sizeof(*p));
}

void llmrt_amx_act_bf16(const float *x, size_t x_nb1, int64_t n, int64_t K, uint16_t *xb,
                        size_t xb_nb1) {
    const int64_t K_pad = (K + 31) / 32 * 32;
    for (int64_t t = 0; t < n; t++) {
        const uint8_t *xr = (const uint8_t *)x + (size_t)t * x_nb1;
        uint8_t *br = (uint8_t *)xb + (size_t)t * xb_nb1;
        for (int64_t k = 0; k < K_pad; k++) {
            uint16_t h = 0;
            if (k < K) {
                float f;
                memcpy(&f, xr + 4 * k, sizeof(f));
                h = llmrt_fp32_to_bf16(f);
            }
            memcpy(br + 2 * k, &h, sizeof(h));
        }
    }
}

/* shared checks of the GEMM entry points */
static int check_rows(const llmrt_amx_packed *w, int64_t n, size_t y_nb1, int64_t row0,
                      int64_t row1) {
    if (w == NULL || w->data == NULL || n < 0) return LLMRT_EINVAL;
    if (row0 < 0 || row0 > row1 || row1 > w->M || row0 % LLMRT_AMX_ROW_STEP != 0) return LLMRT_EINVAL;
    if (row1 % LLMRT_AMX_ROW_STEP != 0 && row1 != w->M) return LLMRT_EINVAL;
    if (y_nb1 % sizeof(float) != 0 || (n > 1 && y_nb1 < (size_t)row1 * sizeof(float))) return LLMRT_EINVAL;
    return LLMRT_OK;
}

int llmrt_amx_gemm_int8(const llmrt_amx_packed *w, const void *act, size_t act_nb1, int64_t n,
                        float *y, size_t y_nb1, int64_t row0, int64_t row1, int kc, int backend) {
    int rc = check_rows(w, n, y_nb1, row0, row1);
    if (rc != LLMRT_OK) return rc;
    if (w->kind != LLMRT_AMX_KIND_INT8) return LLMRT_EINVAL;
    if (n > 1 && act_nb1 < llmrt_row_size(llmrt_amx_act_type(w), w->K)) return LLMRT_EINVAL;
    if (backend == LLMRT_AMX_HW && !llmrt_amx_hw_available()) return LLMRT_EUNSUPPORTED;
    if (backend != LLMRT_AMX_HW && backend != LLMRT_AMX_MODEL) return LLMRT_EINVAL;
    if (n == 0 || row0 == row1) return LLMRT_OK;
    if (act == NULL || y == NULL) return LLMRT_EINVAL;
    if (backend == LLMRT_AMX_HW) {
        return llmrt_amx_gemm_int8_hw(w, act, act_nb1, n, y, y_nb1, row0, row1, kc);
    }
    return llmrt_amx_gemm_int8_model(w, act, act_nb1, n, y, y_nb1, row0, row1, kc);
}

int llmrt_amx_gemm_bf16(const llmrt_amx_packed *w, const uint16_t *xb, size_t xb_nb1, int64_t n,
                        float *y, size_t y_nb1, int64_t row0, int64_t row1, int backend) {
    int rc = check_rows(w, n, y_nb1, row0, row1);
    if (rc != LLMRT_OK) return rc;
    if (w->kind != LLMRT_AMX_KIND_BF16) return LLMRT_EINVAL;
    if (n > 1 && xb_nb1 < (size_t)w->nkb * 64) return LLMRT_EINVAL;
    if (backend == LLMRT_AMX_HW && !llmrt_amx_hw_bf16_available()) return LLMRT_EUNSUPPORTED;
    if (backend != LLMRT_AMX_HW && backend != LLMRT_AMX_MODEL) return LLMRT_EINVAL;
    if (n == 0 || row0 == row1) return LLMRT_OK;
    if (xb == NULL || y == NULL) return LLMRT_EINVAL;
    if (backend == LLMRT_AMX_HW) {
        return llmrt_amx_gemm_bf16_hw(w, (const uint8_t *)xb, xb_nb1, n, y, y_nb1, row0, row1);
    }
    return llmrt_amx_gemm_bf16_model(w, (const uint8_t *)xb, xb_nb1, n, y, y_nb1, row0, row1);
}

int llmrt_amx_dp_once(int backend, int op, int m, int n, int ka, void *c, const void *a,
                      const void *b) {
    if (op < 0 || op >= LLMRT_AMX_NOPS || m < 1 || m > 16 || n < 1 || n > 16 || ka < 4 || ka > 64
        || ka % 4 != 0 || c == NULL || a == NULL || b == NULL) {
        return LLMRT_EINVAL;
    }
    llmrt_amx_tilecfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette_id = 1;
    cfg.rows[0] = (uint8_t)m;       /* C: m x n dwords */
    cfg.colsb[0] = (uint16_t)(4 * n);
    cfg.rows[1] = (uint8_t)m;       /* A: m x ka bytes */
    cfg.colsb[1] = (uint16_t)ka;
    cfg.rows[2] = (uint8_t)(ka / 4); /* B: ka/4 x n dwords */
    cfg.colsb[2] = (uint16_t)(4 * n);
    if (backend == LLMRT_AMX_HW) {
        const int ok = op == LLMRT_AMX_DPBF16PS ? llmrt_amx_hw_bf16_available()
                                                : llmrt_amx_hw_available();
        if (!ok) return LLMRT_EUNSUPPORTED;
        return llmrt_amx_dp_once_hw(op, &cfg, c, a, b);
    }
    if (backend != LLMRT_AMX_MODEL) return LLMRT_EINVAL;
    llmrt_amx_model s;
    llmrt_amx_model_init(&s);
    llmrt_amx_model_config(&s, &cfg);
    llmrt_amx_model_load(&s, 0, c, cfg.colsb[0]);
    llmrt_amx_model_load(&s, 1, a, cfg.colsb[1]);
    llmrt_amx_model_load(&s, 2, b, cfg.colsb[2]);
    llmrt_amx_model_dp(&s, op, 0, 1, 2);
    llmrt_amx_model_store(&s, 0, c, cfg.colsb[0]);
    llmrt_amx_model_release(&s);
    return s.err;
}

/* ---- MUL_MAT's switch (amx.h) ---------------------------------------------------------------- */

static _Atomic int amx_matmul_backend = -1;
static _Atomic long amx_matmul_count = 0;

void llmrt_amx_set_matmul(int backend) {
    if (backend == LLMRT_AMX_HW && !llmrt_amx_hw_available()) backend = -1;
    if (backend != LLMRT_AMX_MODEL && backend != LLMRT_AMX_HW) backend = -1;
    atomic_store(&amx_matmul_backend, backend);
}

int llmrt_amx_matmul(void) { return atomic_load(&amx_matmul_backend); }

long llmrt_amx_matmul_calls(void) { return atomic_load(&amx_matmul_count); }

void llmrt_amx_count_matmul(void) { atomic_fetch_add(&amx_matmul_count, 1); }
