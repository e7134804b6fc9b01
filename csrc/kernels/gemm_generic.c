/*
 * gemm_generic.c — packed weights: the per-type layouts (pack_rows, pack_group_bytes, pack; the
 * same at every ISA level), their inverse (llmrt_unpack_group, for tests), the portable gemm
 * kernels, and llmrt_pack_weight, which packs a whole weight tensor at load. gemm.h states the
 * contract; gemm_q32.h the layout of the 32-element block types.
 *
 * The generic gemm computes each output exactly as dot_generic.c's vec_dot of the same type does
 * (same integer sums, same f32 expression per block, same order), reading the packed layout.
 */
#include "llmrt/gemm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "gemm_q32.h"
#include "quant_common.h" /* kvalues_iq4nl */

#define FP16(h) llmrt_fp16_to_fp32(h)

/* ---- 32-element block types: layout ------------------------------------------------------------ */

/* byte offsets of a plain GGUF block's fields (d is always at 0) */
static int q32_off_m(int type) { return q32_nsc(type) == 2 ? 2 : -1; }
static int q32_off_qh(int type) { return type == LLMRT_TYPE_Q5_0 ? 2 : type == LLMRT_TYPE_Q5_1 ? 4 : -1; }
static int q32_off_qs(int type) {
    switch (type) {
    case LLMRT_TYPE_Q4_0: return 2;
    case LLMRT_TYPE_Q4_1: return 4;
    case LLMRT_TYPE_Q5_0: return 6;
    case LLMRT_TYPE_Q5_1: return 8;
    case LLMRT_TYPE_WQ_Q8A: return 4;
    default: return 2; /* Q8_0, IQ4_NL */
    }
}

/* the 8 qh bytes of one Q5 block of one row: bit k of byte j = 5th bit of element 8k + j, i.e. bit
 * 8k + j of h. (h >> j) & 0x01010101 keeps those four bits at 0, 8, 16, 24; the multiply by
 * 2^24 + 2^17 + 2^10 + 2^3 moves bit 8k to 24 + k (the 16 partial products land on distinct bits,
 * so nothing carries), and bits 24..27 are the nibble. */
static inline void q32_qh_nibbles(uint32_t h, uint8_t nib[8]) {
    for (int j = 0; j < 8; j++) {
        const uint64_t x = (uint64_t)((h >> j) & 0x01010101u);
        nib[j] = (uint8_t)(((x * 0x01020408u) >> 24) & 0x0f);
    }
}

/* the nibble of element i (0..31) of row r in block ib's 64 quant bytes: byte offset, and shift (0 low,
 * 4 high). pairs: Q4_0 / IQ4_NL's word pairs (gemm_q32.h), else rows 2p and 2p + 1 sharing bytes.
 * q32_q reads through it; pack_q32 / unpack_q32 write and read the same places a byte at a time. */
static inline int q32_nib_at(int pairs, int r, int i, int *shift) {
    if (pairs) {
        const int j = i / 8, g = (i / 4) % 2;  /* word pair, word in the pair */
        *shift = 4 * (j % 2);
        return 32 * (j / 2) + 8 * r + 4 * g + i % 4;
    }
    *shift = 4 * (r % 2);
    return 32 * (r / 2) + i;
}

/* pairs: the quants in word pairs (q32_pairs(type) for a weight's own type; 0 for the WQ ids) */
static inline void pack_q32(int type, int pairs, const void *src, size_t src_row_bytes, int64_t K, int rows,
                            void *group) {
    const int64_t nb = K / 32;
    const size_t bs = llmrt_type_traits_get(type)->type_size;
    const int nsc = q32_nsc(type);
    const int off_m = q32_off_m(type), off_qh = q32_off_qh(type), off_qs = q32_off_qs(type);
    uint8_t *sc = (uint8_t *)group;
    uint8_t *qh = sc + q32_qh_off(type, nb);
    uint8_t *qs = sc + q32_qs_off(type, nb);
    memset(group, 0, q32_group_bytes(type, nb));
    for (int r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)src + (size_t)r * src_row_bytes;
        const int sh = 4 * (r % 2); /* rows 2p and 2p + 1 share bytes: low / high nibble */
        for (int64_t ib = 0; ib < nb; ib++) {
            const uint8_t *b = row + (size_t)ib * bs;
            memcpy(sc + ((size_t)ib * nsc * Q32_R + r) * 2, b, 2); /* d */
            if (nsc == 2) memcpy(sc + ((size_t)ib * nsc * Q32_R + Q32_R + r) * 2, b + off_m, 2);
            if (off_qh >= 0) {
                uint32_t h;
                uint8_t nib[8];
                memcpy(&h, b + off_qh, 4);
                q32_qh_nibbles(h, nib);
                uint8_t *dh = qh + (size_t)ib * Q32_R * 4 + 8 * (r / 2);
                for (int j = 0; j < 8; j++) dh[j] |= (uint8_t)(nib[j] << sh);
            }
            const uint8_t *bq = b + off_qs;
            /* element i < 16 is the low nibble of bq[i], element 16 + i its high nibble */
            if (q32_qsb(type) == 32) {
                memcpy(qs + (size_t)ib * Q32_R * 32 + 32 * r, bq, 32);
            } else if (pairs) {
                /* byte 8r + k (k < 8) holds elements k and 8 + k, byte 32 + 8r + k 16 + k and 24 + k
                 * (q32_nib_at): whole bytes of row r */
                uint8_t *dst = qs + (size_t)ib * Q32_R * 16 + 8 * r;
                for (int k = 0; k < 8; k++) {
                    dst[k] = (uint8_t)((bq[k] & 0x0f) | (bq[8 + k] << 4));
                    dst[32 + k] = (uint8_t)((bq[k] >> 4) | (bq[8 + k] & 0xf0));
                }
            } else {
                uint8_t *dst = qs + (size_t)ib * Q32_R * 16 + 32 * (r / 2);
                for (int i = 0; i < 16; i++) {
                    dst[i] |= (uint8_t)((bq[i] & 0x0f) << sh);
                    dst[16 + i] |= (uint8_t)((bq[i] >> 4) << sh);
                }
            }
        }
    }
}

static void unpack_q32(int type, int pairs, int64_t K, const void *group, int rows, void *dst, size_t dst_row_bytes) {
    const int64_t nb = K / 32;
    const size_t bs = llmrt_type_traits_get(type)->type_size;
    const int nsc = q32_nsc(type);
    const uint8_t *sc = (const uint8_t *)group;
    const uint8_t *qh = sc + q32_qh_off(type, nb);
    const uint8_t *qs = sc + q32_qs_off(type, nb);
    for (int r = 0; r < rows; r++) {
        uint8_t *row = (uint8_t *)dst + (size_t)r * dst_row_bytes;
        for (int64_t ib = 0; ib < nb; ib++) {
            uint8_t *b = row + (size_t)ib * bs;
            memcpy(b, sc + ((size_t)ib * nsc * Q32_R + r) * 2, 2);
            if (nsc == 2) memcpy(b + q32_off_m(type), sc + ((size_t)ib * nsc * Q32_R + Q32_R + r) * 2, 2);
            if (q32_has_qh(type)) {
                const uint8_t *sh = qh + (size_t)ib * Q32_R * 4 + 8 * (r / 2);
                uint32_t h = 0;
                for (int i = 0; i < 32; i++) h |= (uint32_t)((sh[i % 8] >> (4 * (r % 2) + i / 8)) & 1u) << i;
                memcpy(b + q32_off_qh(type), &h, 4);
            }
            uint8_t *bq = b + q32_off_qs(type);
            if (q32_qsb(type) == 32) {
                memcpy(bq, qs + (size_t)ib * Q32_R * 32 + 32 * r, 32);
            } else if (pairs) { /* pack_q32's bytes back */
                const uint8_t *p = qs + (size_t)ib * Q32_R * 16 + 8 * r;
                for (int k = 0; k < 8; k++) {
                    bq[k] = (uint8_t)((p[k] & 0x0f) | (p[32 + k] << 4));
                    bq[8 + k] = (uint8_t)((p[k] >> 4) | (p[32 + k] & 0xf0));
                }
            } else {
                const uint8_t *p = qs + (size_t)ib * Q32_R * 16 + 32 * (r / 2);
                for (int i = 0; i < 16; i++) {
                    const int lo = (r % 2 ? p[i] >> 4 : p[i]) & 0x0f;
                    const int hi = (r % 2 ? p[i + 16] >> 4 : p[i + 16]) & 0x0f;
                    bq[i] = (uint8_t)(lo | hi << 4);
                }
            }
        }
    }
}

#define Q32_LAYOUT(T, t)                                                                           \
    static size_t pack_group_bytes_##t(int64_t K) { return q32_group_bytes(LLMRT_TYPE_##T, K / 32); } \
    static void pack_##t(const void *src, size_t srb, int64_t K, int rows, void *group) {          \
        pack_q32(LLMRT_TYPE_##T, q32_pairs(LLMRT_TYPE_##T), src, srb, K, rows, group);             \
    }
Q32_LAYOUT(Q4_0, q4_0)
Q32_LAYOUT(Q4_1, q4_1)
Q32_LAYOUT(Q5_0, q5_0)
Q32_LAYOUT(Q5_1, q5_1)
Q32_LAYOUT(Q8_0, q8_0)
Q32_LAYOUT(IQ4_NL, iq4_nl)
Q32_LAYOUT(WQ_Q8A, q8a)
/* the WQ_Q4_0 float-activation ids: Q4_0's layout with the quants in rows (wq_avx2.c reads them so) */
static void pack_q4_0_rows(const void *src, size_t srb, int64_t K, int rows, void *group) {
    pack_q32(LLMRT_TYPE_Q4_0, 0, src, srb, K, rows, group);
}
#define pack_group_bytes_q4_0_rows pack_group_bytes_q4_0

/* ---- 32-element block types: portable gemm ------------------------------------------------------ */

/* quant of element i (0..31) of row r in block ib: Q8_0 / WQ_Q8A signed, Q4/Q5 unsigned 0..15 / 0..31,
 * IQ4_NL its level kvalues_iq4nl[nibble]; pairs as pack_q32 */
static inline int q32_q(int type, int pairs, const uint8_t *group, int64_t nb, int64_t ib, int r, int i) {
    const uint8_t *qs = group + q32_qs_off(type, nb);
    if (q32_qsb(type) == 32) return (int8_t)qs[ib * Q32_R * 32 + 32 * r + i];
    int s;
    const int o = q32_nib_at(pairs, r, i, &s);
    int q = (qs[ib * Q32_R * 16 + o] >> s) & 0x0f;
    if (q32_has_qh(type)) {
        const uint8_t h = group[q32_qh_off(type, nb) + ib * Q32_R * 4 + 8 * (r / 2) + i % 8];
        q |= ((h >> (4 * (r % 2) + i / 8)) & 1) << 4;
    }
    return type == LLMRT_TYPE_IQ4_NL ? kvalues_iq4nl[q] : q;
}

static inline llmrt_fp16_t q32_sc(int type, const uint8_t *group, int64_t nb, int64_t ib, int which, int r) {
    llmrt_fp16_t h;
    memcpy(&h, group + ((ib * q32_nsc(type) + which) * Q32_R + r) * 2, 2);
    return h;
}

/* one output, in dot_generic.c's order for the type */
static inline float dot_q32_generic(int type, const uint8_t *group, int64_t nb, int r, const uint8_t *x) {
    const int q8_1 = q32_nsc(type) == 2;             /* activations Q8_1 (d, s, qs) else Q8_0 (d, qs) */
    const size_t ybs = q8_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const int off = type == LLMRT_TYPE_Q4_0 ? 8 : type == LLMRT_TYPE_Q5_0 ? 16 : 0;
    float sumf = 0.0f;
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t *yb = x + (size_t)ib * ybs;
        llmrt_fp16_t yd, ys = 0;
        memcpy(&yd, yb, 2);
        if (q8_1) memcpy(&ys, yb + 2, 2);
        const int8_t *yq = (const int8_t *)(yb + (q8_1 ? 4 : 2));
        int sumi = 0;
        for (int i = 0; i < 32; i++) sumi += (q32_q(type, q32_pairs(type), group, nb, ib, r, i) - off) * yq[i];
        const float xd = FP16(q32_sc(type, group, nb, ib, 0, r));
        switch (type) {
        case LLMRT_TYPE_Q8_0: sumf += (float)sumi * (xd * FP16(yd)); break;
        case LLMRT_TYPE_Q4_0: sumf += (float)sumi * xd * FP16(yd); break;
        case LLMRT_TYPE_Q5_0: sumf += (xd * FP16(yd)) * (float)sumi; break;
        case LLMRT_TYPE_IQ4_NL: sumf += (FP16(yd) * xd) * (float)sumi; break;
        case LLMRT_TYPE_WQ_Q8A: /* wq_generic.c's expression */
            sumf += xd * FP16(yd) * (float)sumi + (FP16(q32_sc(type, group, nb, ib, 1, r)) + 128.0f * xd) * FP16(ys);
            break;
        default: /* Q4_1, Q5_1 */
            sumf += (xd * FP16(yd)) * (float)sumi + FP16(q32_sc(type, group, nb, ib, 1, r)) * FP16(ys);
            break;
        }
    }
    return sumf;
}

static inline void gemm_q32_generic(int type, int64_t K, const void *group, int n_rows, const void *x,
                                    size_t x_stride, int n_x, float *y, int64_t y_stride) {
    for (int j = 0; j < n_x; j++) {
        const uint8_t *xj = (const uint8_t *)x + (size_t)j * x_stride;
        for (int r = 0; r < n_rows; r++) y[j * y_stride + r] = dot_q32_generic(type, group, K / 32, r, xj);
    }
}

#define Q32_GEMM(T, t, tx)                                                                          \
    static void gemm_##t##_##tx##_generic(int64_t K, const void *group, int n_rows, const void *x,  \
                                          size_t x_stride, int n_x, float *y, int64_t y_stride) {   \
        gemm_q32_generic(LLMRT_TYPE_##T, K, group, n_rows, x, x_stride, n_x, y, y_stride);          \
    }
Q32_GEMM(Q4_0, q4_0, q8_0)
Q32_GEMM(Q4_1, q4_1, q8_1)
Q32_GEMM(Q5_0, q5_0, q8_0)
Q32_GEMM(Q5_1, q5_1, q8_1)
Q32_GEMM(Q8_0, q8_0, q8_0)
Q32_GEMM(IQ4_NL, iq4_nl, q8_0)
Q32_GEMM(WQ_Q8A, q8a, q8_1)

/* ---- WQ_<L>_F32 / _BF16: layout L's packed groups, f32 / bf16 activations ------------------------ */

/* the block layout L of a private float-activation id (llmrt.h) */
static int wqf_layout(int type) {
    switch (type) {
    case LLMRT_TYPE_WQ_Q4_0_F32: case LLMRT_TYPE_WQ_Q4_0_BF16: return LLMRT_TYPE_Q4_0;
    case LLMRT_TYPE_WQ_Q4_1_F32: case LLMRT_TYPE_WQ_Q4_1_BF16: return LLMRT_TYPE_Q4_1;
    case LLMRT_TYPE_WQ_Q8_0_F32: case LLMRT_TYPE_WQ_Q8_0_BF16: return LLMRT_TYPE_Q8_0;
    case LLMRT_TYPE_WQ_Q8A_F32: case LLMRT_TYPE_WQ_Q8A_BF16: return LLMRT_TYPE_WQ_Q8A;
    default: return -1;
    }
}

/* one output, in wq_generic.c's order: each block dequantized (its deq_block expressions), then
 * one f32 sum over the elements in order */
static inline float dot_wqf_generic(int type, const uint8_t *group, int64_t nb, int r, const uint8_t *x) {
    const int layout = wqf_layout(type);
    const int bf16 = type >= LLMRT_TYPE_WQ_Q4_0_BF16;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < nb; ib++) {
        const float d = FP16(q32_sc(layout, group, nb, ib, 0, r));
        const float m = q32_nsc(layout) == 2 ? FP16(q32_sc(layout, group, nb, ib, 1, r)) : 0.0f;
        float w[32];
        for (int j = 0; j < 32; j++) {
            const int q = q32_q(layout, 0, group, nb, ib, r, j);
            switch (layout) {
            case LLMRT_TYPE_Q4_0: w[j] = (float)(q - 8) * d; break;
            case LLMRT_TYPE_Q4_1: w[j] = (float)q * d + m; break;
            case LLMRT_TYPE_Q8_0: w[j] = (float)q * d; break;
            default: w[j] = (float)(q + 128) * d + m; break; /* WQ_Q8A */
            }
        }
        for (int j = 0; j < 32; j++) {
            float yj;
            if (bf16) {
                llmrt_bf16_t h;
                memcpy(&h, x + ((size_t)ib * 32 + j) * 2, 2);
                yj = llmrt_bf16_to_fp32(h);
            } else {
                memcpy(&yj, x + ((size_t)ib * 32 + j) * 4, 4);
            }
            sum += w[j] * yj;
        }
    }
    return sum;
}

static void gemm_wqf_generic(int type, int64_t K, const void *group, int n_rows, const void *x, size_t x_stride,
                             int n_x, float *y, int64_t y_stride) {
    for (int j = 0; j < n_x; j++) {
        const uint8_t *xj = (const uint8_t *)x + (size_t)j * x_stride;
        for (int r = 0; r < n_rows; r++) y[j * y_stride + r] = dot_wqf_generic(type, group, K / 32, r, xj);
    }
}

#define WQF_GEMM(T, t)                                                                              \
    static void gemm_##t##_generic(int64_t K, const void *group, int n_rows, const void *x,         \
                                   size_t x_stride, int n_x, float *y, int64_t y_stride) {          \
        gemm_wqf_generic(LLMRT_TYPE_##T, K, group, n_rows, x, x_stride, n_x, y, y_stride);          \
    }
WQF_GEMM(WQ_Q4_0_F32, wq_q4_0_f32)
WQF_GEMM(WQ_Q4_1_F32, wq_q4_1_f32)
WQF_GEMM(WQ_Q8_0_F32, wq_q8_0_f32)
WQF_GEMM(WQ_Q8A_F32, wq_q8a_f32)
WQF_GEMM(WQ_Q4_0_BF16, wq_q4_0_bf16)
WQF_GEMM(WQ_Q4_1_BF16, wq_q4_1_bf16)
WQF_GEMM(WQ_Q8_0_BF16, wq_q8_0_bf16)
WQF_GEMM(WQ_Q8A_BF16, wq_q8a_bf16)

/* ---- whole tensors -------------------------------------------------------------------------- */

int llmrt_unpack_group(int type, int64_t K, const void *group, int rows, void *dst, size_t dst_row_bytes) {
    switch (type) {
    case LLMRT_TYPE_Q4_0: case LLMRT_TYPE_Q4_1: case LLMRT_TYPE_Q5_0: case LLMRT_TYPE_Q5_1:
    case LLMRT_TYPE_Q8_0: case LLMRT_TYPE_IQ4_NL: case LLMRT_TYPE_WQ_Q8A:
        if (K <= 0 || K % 32 != 0 || rows < 0 || rows > Q32_R) return LLMRT_EINVAL;
        unpack_q32(type, q32_pairs(type), K, group, rows, dst, dst_row_bytes);
        return LLMRT_OK;
    default:
        if (wqf_layout(type) >= 0) {
            if (K <= 0 || K % 32 != 0 || rows < 0 || rows > Q32_R) return LLMRT_EINVAL;
            unpack_q32(wqf_layout(type), 0, K, group, rows, dst, dst_row_bytes);
            return LLMRT_OK;
        }
        return llmrt_unpack_group_k(type, K, group, rows, dst, dst_row_bytes); /* gemm_k_generic.c */
    }
}

/* ---- memory of packed weights ------------------------------------------------------------- */

/* Packed weights live on 2 MB-aligned memory (PACK_HUGE): a decode streams them once per token,
 * and on transparent huge pages the hardware prefetchers do not stop at every 4 KB page boundary
 * and the TLB does not miss on every page. A weight of 2 MB or more gets its own allocation;
 * smaller ones (most of a small model's: a 576 x 1536 Q4_1 matrix is 0.5 MB) are cut from shared
 * chunks of PACK_CHUNK_BYTES, one after the other (64-byte aligned), so they sit on huge pages
 * too. A chunk is freed when its last weight is; pages of a chunk that no weight reaches are
 * never touched.
 *
 * Load time: pages are prefaulted run by run with MADV_POPULATE_WRITE (one call per run instead
 * of one fault per page). Chunks are written on 4 KB pages (MADV_NOHUGEPAGE) and marked
 * MADV_HUGEPAGE once packed, for khugepaged to collapse in the background: faulting huge pages
 * in directly was measured slower and erratic on virtual machines whose free huge blocks are
 * handed back to the host (free page reporting): 0.07-0.9 s of kernel time for Gemma 3 270M's
 * 240 MB of packed weights, against 0.18-0.25 s with 4 KB pages. Weights of their own (2 MB and
 * more: the big output matrices, which dominate a small model's decode) still get huge pages
 * from the first touch, so decode reads them through huge pages at once. */
#define PACK_HUGE ((size_t)2 << 20)
#define PACK_PAGE ((size_t)4096)
#define PACK_CHUNK_BYTES ((size_t)64 << 20)
#define PACK_MAX_CHUNKS 4096

typedef struct {
    char *base;  /* PACK_CHUNK_BYTES, PACK_HUGE-aligned */
    size_t used; /* bytes handed out from base */
    int refs;    /* weights living in it */
} pack_chunk;

static pthread_mutex_t pack_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static pack_chunk pack_chunks[PACK_MAX_CHUNKS]; /* base == NULL: a free slot */
static int pack_cur = -1;                        /* the chunk new small weights come from */

static void madvise_hint(void *p, size_t n, int advice) {
#if defined(__linux__)
    (void)madvise(p, n, advice); /* a hint; failure is harmless */
#else
    (void)p; (void)n; (void)advice;
#endif
}

/* huge: huge pages from the first touch, else 4 KB pages until packed (see above) */
static void *huge_alloc(size_t bytes, int huge) {
    void *p = NULL;
    const size_t alloc = (bytes + PACK_HUGE - 1) & ~(PACK_HUGE - 1);
    if (posix_memalign(&p, PACK_HUGE, alloc) != 0) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
    madvise_hint(p, alloc, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#else
    (void)huge;
#endif
    return p;
}

/* bytes (a multiple of 64) of 64-byte aligned memory for one packed weight; NULL if none.
 * *paged: 0 plain malloc memory, 1 a chunk's (4 KB pages until packed), 2 an allocation of its
 * own (huge pages from the start); in 1 and 2 whole pages around the weight are ours to prefault
 * and advise. */
static void *packed_alloc(size_t bytes, int *paged) {
    *paged = 2;
    if (bytes >= PACK_HUGE) return huge_alloc(bytes, 1);
    *paged = 1;
    void *p = NULL;
    pthread_mutex_lock(&pack_mem_lock);
    if (pack_cur < 0 || PACK_CHUNK_BYTES - pack_chunks[pack_cur].used < bytes) {
        pack_cur = -1;
        for (int i = 0; i < PACK_MAX_CHUNKS; i++) {
            if (pack_chunks[i].base == NULL) {
                char *base = (char *)huge_alloc(PACK_CHUNK_BYTES, 0);
                if (base != NULL) {
                    pack_chunks[i].base = base;
                    pack_chunks[i].used = 0;
                    pack_chunks[i].refs = 0;
                    pack_cur = i;
                }
                break;
            }
        }
    }
    if (pack_cur >= 0) {
        pack_chunk *c = &pack_chunks[pack_cur];
        p = c->base + c->used;
        c->used += bytes;
        c->refs++;
    }
    pthread_mutex_unlock(&pack_mem_lock);
    if (p == NULL) { /* no chunk could be had: memory of its own */
        *paged = 0;
        if (posix_memalign(&p, 64, bytes) != 0) p = NULL;
    }
    return p;
}

static void packed_release(void *data) {
    if (data == NULL) return;
    pthread_mutex_lock(&pack_mem_lock);
    for (int i = 0; i < PACK_MAX_CHUNKS; i++) {
        pack_chunk *c = &pack_chunks[i];
        if (c->base != NULL && (char *)data >= c->base && (char *)data < c->base + PACK_CHUNK_BYTES) {
            if (--c->refs == 0) {
                free(c->base);
                c->base = NULL;
                if (pack_cur == i) pack_cur = -1;
            }
            pthread_mutex_unlock(&pack_mem_lock);
            return;
        }
    }
    pthread_mutex_unlock(&pack_mem_lock);
    free(data); /* its own allocation */
}

/* the whole pages covering [p, p + n) */
static void page_span(const char *p, size_t n, char **start, size_t *len) {
    const uintptr_t a = (uintptr_t)p & ~(uintptr_t)(PACK_PAGE - 1);
    const uintptr_t e = ((uintptr_t)p + n + PACK_PAGE - 1) & ~(uintptr_t)(PACK_PAGE - 1);
    *start = (char *)a;
    *len = (size_t)(e - a);
}

/* ---- packing a whole weight ------------------------------------------------------------------ */

/* One packing job shared by the pool's threads: they claim runs of groups (PACK_CLAIM_BYTES) with
 * an atomic counter (a thread that was descheduled does not hold the others up). Every group is
 * written by exactly one thread with the same pack function, so the bytes do not depend on the
 * thread count. Each thread prefaults the pages of the runs it claims. */
typedef struct {
    llmrt_pack_fn pack;
    const char *src;
    size_t src_row_bytes;
    int64_t K, M;
    int R;
    size_t gb;
    int64_t n_groups, chunk;
    char *data;
    int paged;         /* packed_alloc's: nonzero = page-aligned memory of ours, prefault whole pages */
    atomic_llong next; /* next unclaimed run */
} pack_job;

static void pack_groups(const pack_job *j, int64_t g0, int64_t g1) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
    if (j->paged) { /* prefaulting a page twice (runs share edge pages) is harmless */
        char *ps;
        size_t pn;
        page_span(j->data + (size_t)g0 * j->gb, (size_t)(g1 - g0) * j->gb, &ps, &pn);
        madvise_hint(ps, pn, MADV_POPULATE_WRITE);
    }
#endif
    for (int64_t g = g0; g < g1; g++) {
        const int64_t m0 = g * j->R;
        const int rows = (int)(j->M - m0 < j->R ? j->M - m0 : j->R);
        j->pack(j->src + (size_t)m0 * j->src_row_bytes, j->src_row_bytes, j->K, rows, j->data + (size_t)g * j->gb);
    }
}

static void pack_task(void *arg, int ith, int nth) {
    (void)ith;
    (void)nth;
    pack_job *j = (pack_job *)arg;
    const int64_t n_runs = (j->n_groups + j->chunk - 1) / j->chunk;
    for (;;) {
        const int64_t c = (int64_t)atomic_fetch_add(&j->next, 1);
        if (c >= n_runs) break;
        const int64_t g0 = c * j->chunk;
        pack_groups(j, g0, g0 + j->chunk < j->n_groups ? g0 + j->chunk : j->n_groups);
    }
}

/* bytes of packed output per claimed run: big enough that claiming costs nothing, small enough
 * that the threads finish together (a small model's weights are 0.1-0.5 MB: several runs each) */
#define PACK_CLAIM_BYTES ((size_t)64 << 10)
/* below this many packed bytes a weight is packed on the calling thread (waking the pool, some
 * 10 us, costs more than it saves) */
#define PACK_MT_MIN_BYTES ((size_t)128 << 10)

int llmrt_pack_weight_mt(int type, const void *src, size_t src_row_bytes, int64_t K, int64_t M,
                         llmrt_packed *out, llmrt_threadpool *tp) {
    memset(out, 0, sizeof(*out));
    const llmrt_kernel_table *kt = llmrt_kernels();
    const llmrt_type_traits *tt = llmrt_type_traits_get(type);
    if (tt == NULL || kt->pack_rows[type] <= 0 || kt->pack[type] == NULL) return LLMRT_EUNSUPPORTED;
    if (K <= 0 || M <= 0 || K % tt->blck_size != 0 || src == NULL) return LLMRT_EINVAL;
    const int R = kt->pack_rows[type];
    const size_t gb = kt->pack_group_bytes[type](K);
    const int64_t n_groups = (M + R - 1) / R;
    const size_t bytes = gb * (size_t)n_groups;
    if (gb == 0 || gb % 64 != 0) return LLMRT_ENOMEM;
    int paged = 0;
    void *data = packed_alloc(bytes, &paged);
    if (data == NULL) return LLMRT_ENOMEM;
    pack_job j = {kt->pack[type], (const char *)src, src_row_bytes, K, M, R, gb, n_groups, 1, (char *)data, paged, 0};
    j.chunk = (int64_t)(PACK_CLAIM_BYTES / gb);
    if (j.chunk < 1) j.chunk = 1;
    atomic_init(&j.next, 0);
    if (tp != NULL && llmrt_threadpool_n_threads(tp) > 1 && bytes >= PACK_MT_MIN_BYTES && n_groups > j.chunk) {
        llmrt_threadpool_run(tp, pack_task, &j);
    } else {
        pack_groups(&j, 0, n_groups);
    }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (paged == 1) { /* packed: now huge pages, collapsed by khugepaged (neighbours' pages too: harmless) */
        char *ps;
        size_t pn;
        page_span((const char *)data, bytes, &ps, &pn);
        madvise_hint(ps, pn, MADV_HUGEPAGE);
    }
#endif
    out->type = type;
    out->R = R;
    out->K = K;
    out->M = M;
    out->n_groups = n_groups;
    out->group_bytes = gb;
    out->data = data;
    return LLMRT_OK;
}

int llmrt_pack_weight(int type, const void *src, size_t src_row_bytes, int64_t K, int64_t M,
                      llmrt_packed *out) {
    return llmrt_pack_weight_mt(type, src, src_row_bytes, K, M, out, NULL);
}

void llmrt_packed_free(llmrt_packed *p) {
    if (p == NULL) return;
    packed_release(p->data);
    memset(p, 0, sizeof(*p));
}

void llmrt_register_gemm_kernels_generic(llmrt_kernel_table *kt) {
#define LAYOUT(T, t) do { kt->pack_rows[LLMRT_TYPE_##T] = Q32_R;                                   \
                          kt->pack_group_bytes[LLMRT_TYPE_##T] = pack_group_bytes_##t;              \
                          kt->pack[LLMRT_TYPE_##T] = pack_##t; } while (0)
#define REG(T, fn) do { kt->gemm[LLMRT_TYPE_##T] = fn; kt->gemm_name[LLMRT_TYPE_##T] = #fn; } while (0)
    LAYOUT(Q4_0, q4_0);
    LAYOUT(Q4_1, q4_1);
    LAYOUT(Q5_0, q5_0);
    LAYOUT(Q5_1, q5_1);
    LAYOUT(Q8_0, q8_0);
    LAYOUT(IQ4_NL, iq4_nl);
    LAYOUT(WQ_Q8A, q8a);
    REG(Q4_0, gemm_q4_0_q8_0_generic);
    REG(Q4_1, gemm_q4_1_q8_1_generic);
    REG(Q5_0, gemm_q5_0_q8_0_generic);
    REG(Q5_1, gemm_q5_1_q8_1_generic);
    REG(Q8_0, gemm_q8_0_q8_0_generic);
    REG(IQ4_NL, gemm_iq4_nl_q8_0_generic);
    REG(WQ_Q8A, gemm_q8a_q8_1_generic);
    /* the float-activation private ids keep their layout's groups */
#define WQF(T, t, L) do { kt->pack_rows[LLMRT_TYPE_##T] = Q32_R; kt->pack_group_bytes[LLMRT_TYPE_##T] = pack_group_bytes_##L; \
                          kt->pack[LLMRT_TYPE_##T] = pack_##L; REG(T, gemm_##t##_generic); } while (0)
    WQF(WQ_Q4_0_F32, wq_q4_0_f32, q4_0_rows);
    WQF(WQ_Q4_1_F32, wq_q4_1_f32, q4_1);
    WQF(WQ_Q8_0_F32, wq_q8_0_f32, q8_0);
    WQF(WQ_Q8A_F32, wq_q8a_f32, q8a);
    WQF(WQ_Q4_0_BF16, wq_q4_0_bf16, q4_0_rows);
    WQF(WQ_Q4_1_BF16, wq_q4_1_bf16, q4_1);
    WQF(WQ_Q8_0_BF16, wq_q8_0_bf16, q8_0);
    WQF(WQ_Q8A_BF16, wq_q8a_bf16, q8a);
#undef WQF
#undef LAYOUT
#undef REG
}
