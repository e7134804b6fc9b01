/*
 * dot_generic.c — portable dot-product kernels: s = dot(weight row x, activation row y).
 *
 * One kernel per weight type, each reading the activation row in that type's vec_dot_type
 * (csrc/types.c): F32·F32, F16·F16, BF16·BF16, Q4_0/Q5_0/Q8_0/IQ4_NL·Q8_0, Q4_1/Q5_1·Q8_1,
 * Q2_K..Q6_K/IQ4_XS·Q8_K.
 *
 * Semantics are llama.cpp's (ggml_vec_dot_*_generic): exact integer sums inside a block, times the
 * block scales, accumulated in f32. Q4_1/Q5_1 add m·s with s = d·Σq stored in the Q8_1 block;
 * K-quants with mins subtract dmin·Σ(min · bsum) using the Q8_K block's 16-element sums. F32/F16/BF16
 * multiply in f32 and accumulate in double, as ggml's scalar path does. These are the reference
 * every ISA variant is tested against.
 *
 * n is the number of elements, a multiple of the weight type's block size (checked by the caller).
 */
#include "llmrt/llmrt.h"

#include <string.h>

#include "quant_common.h" /* kvalues_iq4nl, unpack_scales_mins_k4, unpack_scales_q3_k */

#define FP16(h) llmrt_fp16_to_fp32(h)

/* ---- float types --------------------------------------------------------------------------- */

static void vec_dot_f32_generic(int n, float *s, const void *vx, const void *vy) {
    const float *x = vx; /* (n) */
    const float *y = vy; /* (n) */
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * y[i]);
    *s = (float)sum;
}

static void vec_dot_f16_generic(int n, float *s, const void *vx, const void *vy) {
    const llmrt_fp16_t *x = vx; /* (n) */
    const llmrt_fp16_t *y = vy; /* (n) */
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(FP16(x[i]) * FP16(y[i]));
    *s = (float)sum;
}

static void vec_dot_bf16_generic(int n, float *s, const void *vx, const void *vy) {
    const llmrt_bf16_t *x = vx; /* (n) */
    const llmrt_bf16_t *y = vy; /* (n) */
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(llmrt_bf16_to_fp32(x[i]) * llmrt_bf16_to_fp32(y[i]));
    *s = (float)sum;
}

/* ---- 32-element blocks ------------------------------------------------------------------------ */

static void vec_dot_q8_0_q8_0_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx; /* (nb) */
    const block_q8_0 *y = vy; /* (nb) */
    const int nb = n / QK8_0;
    float sumf = 0.0f;
    for (int ib = 0; ib < nb; ib++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += x[ib].qs[j] * y[ib].qs[j];
        sumf += (float)sumi * (FP16(x[ib].d) * FP16(y[ib].d));
    }
    *s = sumf;
}


static void vec_dot_q4_0_q8_0_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx; /* (nb) */
    const block_q8_0 *y = vy; /* (nb) */
    const int nb = n / QK4_0;
    float sumf = 0.0f;
    for (int ib = 0; ib < nb; ib++) {
        int sumi = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            sumi += ((x[ib].qs[j] & 0x0f) - 8) * y[ib].qs[j];
            sumi += ((x[ib].qs[j] >> 4) - 8) * y[ib].qs[j + QK4_0 / 2];
        }
        sumf += (float)sumi * FP16(x[ib].d) * FP16(y[ib].d);
    }
    *s = sumf;
}

static void vec_dot_q4_1_q8_1_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx; /* (nb) */
    const block_q8_1 *y = vy; /* (nb) */
    const int nb = n / QK4_1;
    float sumf = 0.0f;
    for (int ib = 0; ib < nb; ib++) {
        int sumi = 0;
        for (int j = 0; j < QK4_1 / 2; j++) {
            sumi += (x[ib].qs[j] & 0x0f) * y[ib].qs[j];
            sumi += (x[ib].qs[j] >> 4) * y[ib].qs[j + QK4_1 / 2];
        }
        /* Σ (q·d + m)·(qy·dy) = d·dy·Σ q·qy + m·(dy·Σ qy), the last factor being y.s */
        sumf += (FP16(x[ib].d) * FP16(y[ib].d)) * (float)sumi + FP16(x[ib].m) * FP16(y[ib].s);
    }
    *s = sumf;
}

/* 5th bit of element j (0..31) of a Q5 block, as 0 or 16. */
static inline int q5_hbit(uint32_t qh, int j) { return (int)((qh >> j) & 1u) << 4; }

static void vec_dot_q5_0_q8_0_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx; /* (nb) */
    const block_q8_0 *y = vy; /* (nb) */
    const int nb = n / QK5_0;
    float sumf = 0.0f;
    for (int ib = 0; ib < nb; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, sizeof(qh));
        int sumi = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int v0 = ((x[ib].qs[j] & 0x0f) | q5_hbit(qh, j)) - 16;
            const int v1 = ((x[ib].qs[j] >> 4) | q5_hbit(qh, j + QK5_0 / 2)) - 16;
            sumi += v0 * y[ib].qs[j] + v1 * y[ib].qs[j + QK5_0 / 2];
        }
        sumf += (FP16(x[ib].d) * FP16(y[ib].d)) * (float)sumi;
    }
    *s = sumf;
}

static void vec_dot_q5_1_q8_1_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q5_1 *x = vx; /* (nb) */
    const block_q8_1 *y = vy; /* (nb) */
    const int nb = n / QK5_1;
    float sumf = 0.0f;
    for (int ib = 0; ib < nb; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, sizeof(qh));
        int sumi = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int v0 = (x[ib].qs[j] & 0x0f) | q5_hbit(qh, j);
            const int v1 = (x[ib].qs[j] >> 4) | q5_hbit(qh, j + QK5_1 / 2);
            sumi += v0 * y[ib].qs[j] + v1 * y[ib].qs[j + QK5_1 / 2];
        }
        sumf += (FP16(x[ib].d) * FP16(y[ib].d)) * (float)sumi + FP16(x[ib].m) * FP16(y[ib].s);
    }
    *s = sumf;
}

static void vec_dot_iq4_nl_q8_0_generic(int n, float *s, const void *vx, const void *vy) {
    const block_iq4_nl *x = vx; /* (nb) */
    const block_q8_0 *y = vy;   /* (nb) */
    const int nb = n / QK4_NL;
    float sumf = 0.0f;
    for (int ib = 0; ib < nb; ib++) {
        int sumi = 0;
        for (int j = 0; j < QK4_NL / 2; j++) {
            sumi += kvalues_iq4nl[x[ib].qs[j] & 0x0f] * y[ib].qs[j];
            sumi += kvalues_iq4nl[x[ib].qs[j] >> 4] * y[ib].qs[j + QK4_NL / 2];
        }
        sumf += (FP16(y[ib].d) * FP16(x[ib].d)) * (float)sumi;
    }
    *s = sumf;
}

/* ---- 256-element super-blocks (activations Q8_K) ----------------------------------------------- */

static void vec_dot_q2_K_q8_K_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q2_K *x = vx; /* (nb) */
    const block_q8_K *y = vy; /* (nb) */
    const int nb = n / QK_K;
    float sumf = 0.0f;
    for (int i = 0; i < nb; i++) {
        const uint8_t *sc = x[i].scales; /* (16) low nibble scale, high nibble min */
        int summs = 0;
        for (int j = 0; j < 16; j++) summs += y[i].bsums[j] * (sc[j] >> 4);
        int isum = 0;
        for (int e = 0; e < QK_K; e += 16) {
            /* elements e..e+15: 2-bit field (e % 128) / 32 of bytes qs[128/4 * (e/128) + e%32 ...] */
            const uint8_t *q2 = x[i].qs + 32 * (e / 128) + e % 32;
            const int shift = 2 * ((e % 128) / 32);
            int isuml = 0;
            for (int l = 0; l < 16; l++) isuml += y[i].qs[e + l] * ((q2[l] >> shift) & 3);
            isum += (sc[e / 16] & 0x0f) * isuml;
        }
        const float dall = y[i].d * FP16(x[i].d);
        const float dmin = y[i].d * FP16(x[i].dmin);
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    *s = sumf;
}

static void vec_dot_q3_K_q8_K_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q3_K *x = vx; /* (nb) */
    const block_q8_K *y = vy; /* (nb) */
    const int nb = n / QK_K;
    float sumf = 0.0f;
    for (int i = 0; i < nb; i++) {
        int8_t sc[16];
        unpack_scales_q3_k(x[i].scales, sc);
        int isum = 0;
        for (int e = 0; e < QK_K; e += 16) {
            /* element e+l: 2 low bits from field (e%128)/32 of qs[32*(e/128) + e%32 + l], high bit
             * from bit e/32 of hmask[e%32 + l]; value = low - (high ? 0 : 4) in [-4, 3] */
            const uint8_t *q3 = x[i].qs + 32 * (e / 128) + e % 32;
            const uint8_t *hm = x[i].hmask + e % 32;
            const int shift = 2 * ((e % 128) / 32);
            const int hbit = e / 32;
            int isuml = 0;
            for (int l = 0; l < 16; l++) {
                const int v = ((q3[l] >> shift) & 3) - (((hm[l] >> hbit) & 1) ? 0 : 4);
                isuml += y[i].qs[e + l] * v;
            }
            isum += sc[e / 16] * isuml;
        }
        sumf += (FP16(x[i].d) * y[i].d) * (float)isum;
    }
    *s = sumf;
}

/* One Q4_K / Q5_K super-block times one Q8_K block: d·Σ sc·Σ q·y - dmin·Σ m·bsum (qh NULL for Q4_K). */
static inline float dot_k4_q8_K(llmrt_fp16_t xd, llmrt_fp16_t xdmin, const uint8_t *scales, const uint8_t *qs,
                                const uint8_t *qh, const block_q8_K *y) {
    uint8_t sc[8], m[8];
    unpack_scales_mins_k4(scales, sc, m);
    const int isum = isum_k4_int(qs, qh, sc, y->qs);
    const float d = FP16(xd) * y->d;
    const float dmin = FP16(xdmin) * y->d;
    return d * (float)isum - dmin * (float)summs_k4_int(y->bsums, m);
}

static void vec_dot_q4_K_q8_K_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx; /* (nb) */
    const block_q8_K *y = vy; /* (nb) */
    const int nb = n / QK_K;
    float sumf = 0.0f;
    for (int i = 0; i < nb; i++) {
        sumf += dot_k4_q8_K(x[i].d, x[i].dmin, x[i].scales, x[i].qs, NULL, &y[i]);
    }
    *s = sumf;
}

static void vec_dot_q5_K_q8_K_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx; /* (nb) */
    const block_q8_K *y = vy; /* (nb) */
    const int nb = n / QK_K;
    float sumf = 0.0f;
    for (int i = 0; i < nb; i++) {
        sumf += dot_k4_q8_K(x[i].d, x[i].dmin, x[i].scales, x[i].qs, x[i].qh, &y[i]);
    }
    *s = sumf;
}

static void vec_dot_q6_K_q8_K_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx; /* (nb) */
    const block_q8_K *y = vy; /* (nb) */
    const int nb = n / QK_K;
    float sumf = 0.0f;
    for (int i = 0; i < nb; i++) {
        int isum = 0;
        for (int h = 0; h < QK_K / 128; h++) {
            /* half h: 64 ql bytes, 32 qh bytes; element 128h + 32g + l (g = 0..3) takes the low
             * (g < 2) or high (g >= 2) nibble of ql[l + 32(g%2)] and bits 2g..2g+1 of qh[l] */
            const uint8_t *ql = x[i].ql + 64 * h;
            const uint8_t *qh = x[i].qh + 32 * h;
            for (int g = 0; g < 4; g++) {
                const int8_t *q8 = y[i].qs + 128 * h + 32 * g;
                const int nshift = 4 * (g / 2);
                int s0 = 0, s1 = 0; /* the two 16-element scale groups */
                for (int l = 0; l < 32; l++) {
                    const int v = (((ql[l + 32 * (g % 2)] >> nshift) & 0x0f) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
                    if (l < 16) s0 += v * q8[l]; else s1 += v * q8[l];
                }
                const int is = (128 * h + 32 * g) / 16;
                isum += x[i].scales[is] * s0 + x[i].scales[is + 1] * s1;
            }
        }
        sumf += (FP16(x[i].d) * y[i].d) * (float)isum;
    }
    *s = sumf;
}

static void vec_dot_iq4_xs_q8_K_generic(int n, float *s, const void *vx, const void *vy) {
    const block_iq4_xs *x = vx; /* (nb) */
    const block_q8_K *y = vy;   /* (nb) */
    const int nb = n / QK_K;
    float sumf = 0.0f;
    for (int i = 0; i < nb; i++) {
        const float d4d8 = FP16(x[i].d) * y[i].d;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            /* 6-bit sub-block scale: low 4 bits in scales_l, high 2 in scales_h; offset 32 */
            const int ls = ((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) |
                           (((x[i].scales_h >> (2 * ib)) & 3) << 4);
            const uint8_t *qs = x[i].qs + 16 * ib;
            const int8_t *q8 = y[i].qs + 32 * ib;
            int sumi = 0;
            for (int j = 0; j < 16; j++) {
                sumi += kvalues_iq4nl[qs[j] & 0x0f] * q8[j];
                sumi += kvalues_iq4nl[qs[j] >> 4] * q8[j + 16];
            }
            sumf += (d4d8 * (float)(ls - 32)) * (float)sumi;
        }
    }
    *s = sumf;
}

void llmrt_register_dot_kernels_generic(llmrt_kernel_table *kt) {
#define REG(T, fn) do { kt->vec_dot[LLMRT_TYPE_##T] = fn; kt->vec_dot_name[LLMRT_TYPE_##T] = #fn; } while (0)
    REG(F32, vec_dot_f32_generic);
    REG(F16, vec_dot_f16_generic);
    REG(BF16, vec_dot_bf16_generic);
    REG(Q4_0, vec_dot_q4_0_q8_0_generic);
    REG(Q4_1, vec_dot_q4_1_q8_1_generic);
    REG(Q5_0, vec_dot_q5_0_q8_0_generic);
    REG(Q5_1, vec_dot_q5_1_q8_1_generic);
    REG(Q8_0, vec_dot_q8_0_q8_0_generic);
    REG(Q2_K, vec_dot_q2_K_q8_K_generic);
    REG(Q3_K, vec_dot_q3_K_q8_K_generic);
    REG(Q4_K, vec_dot_q4_K_q8_K_generic);
    REG(Q5_K, vec_dot_q5_K_q8_K_generic);
    REG(Q6_K, vec_dot_q6_K_q8_K_generic);
    REG(IQ4_NL, vec_dot_iq4_nl_q8_0_generic);
    REG(IQ4_XS, vec_dot_iq4_xs_q8_K_generic);
#undef REG
}
