/*
 * attn_avx2.c — attention's scores and P.V product for the AVX2 level (AVX2 + FMA + F16C); see
 * llmrt_attn_qk_fn / llmrt_attn_pv_fn in llmrt.h. Compiled for this target only (pragma below).
 *
 * Both take nq rows that share one K / V (the query heads of a GQA group) and load and convert
 * each K or V vector once for up to 4 rows: one cvtph feeds up to 4 fmas, each into its own
 * row's accumulator, so no output's sequence of operations changes.
 *
 * P.V. The column-by-column way (gather V[:, d] over n cells, then vec_dot) is what ggml
 * computes; this gives each output y[d] the same float operations while reading V row by row:
 *
 *   attn_dot_f16_avx2 / attn_dot_f32_avx2 over n cells (n a multiple of 32) keep 4 accumulators of
 *   8 lanes; cell c goes to accumulator j = (c % 32) / 8, lane c % 8, by one fma, in increasing c.
 *   So "lane" L = c % 32 is a chain of fmas over the cells L, L + 32, L + 64, ... Here, for each
 *   block of outputs d (up to 8 registers over the rows) and each L, that chain runs with the
 *   outputs in the 8 f32 lanes of the registers (the same fma, one output per register lane),
 *   then the 32 chain results are reduced per output in the kernel's order:
 *     f16: A = (acc0 + acc2) + (acc1 + acc3); t_k = A_k + A_{k+4}; y = (t_0 + t_1) + (t_2 + t_3)
 *     f32: A = (acc0 + acc1) + (acc2 + acc3); s_k = A_k + A_{k+4}; y = (s_0 + s_2) + (s_1 + s_3)
 *   (no scalar tail: n % 32 == 0). Cells with p == 0 add fma(v, 0, acc) == acc exactly (an
 *   accumulator that starts at +0 never becomes -0; V is finite in written cells), so cells
 *   where every row has p == 0 are skipped, as is every cell outside [c0, c1). The f16
 *   probabilities are converted to f32 once (exact), into the scratch.
 *
 * Scores. Each K.q is attn_dot_f16_avx2's / attn_dot_f32_avx2's sequence (see dot_f16 below);
 * for f16 the q rows are converted to f32 once (exact), and each K vector, converted once, goes
 * into the accumulators of every row.
 *
 * Many dots (attn_dots_f16_avx2, the tiled prefill's P.V over V transposed): attn_dot_f16_avx2 of
 * every (X row, Y row) pair in 4 x 3 register tiles, see "many dots" below.
 */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"

#if defined(__x86_64__)
#include "simd_avx2.h" /* f16, loadu128, hsum_ps */

#define ALWAYS_INLINE inline __attribute__((always_inline))

enum { KIND_F32, KIND_F16 };

static ALWAYS_INLINE void prefetch_v(int kind, const void *p, int64_t i) {
    _mm_prefetch(kind == KIND_F16 ? (const char *)((const llmrt_fp16_t *)p + i) : (const char *)((const float *)p + i),
                 _MM_HINT_T0);
}

static ALWAYS_INLINE __m256 load8(const void *p, int64_t i, int kind) {
    if (kind == KIND_F16) return _mm256_cvtph_ps(loadu128((const llmrt_fp16_t *)p + i));
    return _mm256_loadu_ps((const float *)p + i);
}

/* The chains of outputs d0 .. d0 + 8 NV of NQ rows, one L at a time: chain L of output
 * d0 + 8 k + e of row j goes to ch[((j * 32 + L) * NV + k) * 8 + e]. pf: the rows' probabilities
 * in f32, pf[j * ldp + c - c0]; nz[c - c0]: whether some row's p[c] != 0. */
static ALWAYS_INLINE void pv_chains(int kind, int NQ, int NV, float *ch, const void *v, int64_t ldv,
                                    const float *pf, int64_t ldp, const uint8_t *nz, int c0, int c1, int d0,
                                    int pf_next) {
    const int64_t n = (int64_t)c1 - c0;
    for (int L = 0; L < 32; L++) {
        /* the next block's V (d0 + 8 NV on) into L1 meanwhile: a 32nd of the cells per pass */
        if (pf_next) {
            for (int64_t m = L * n / 32; m < (L + 1) * n / 32; m++) {
                prefetch_v(kind, v, (c0 + m) * ldv + d0 + 8 * NV);
            }
        }
        __m256 a[4][8];
        for (int j = 0; j < NQ; j++) {
            for (int k = 0; k < NV; k++) a[j][k] = _mm256_setzero_ps();
        }
        /* cells c0 + m, m = the first >= 0 with (c0 + m) % 32 == L, then every 32nd (64-bit
         * indices: the build's -fwrapv keeps 32-bit ones from becoming pointer increments) */
        for (int64_t m = ((L - c0 % 32) + 32) % 32; m < (int64_t)c1 - c0; m += 32) {
            if (!nz[m]) continue;
            __m256 pb[4];
            for (int j = 0; j < NQ; j++) pb[j] = _mm256_broadcast_ss(pf + j * ldp + m);
            const int64_t row = (c0 + m) * ldv + d0;
            for (int k = 0; k < NV; k++) {
                const __m256 vk = load8(v, row + 8 * k, kind);
                for (int j = 0; j < NQ; j++) a[j][k] = _mm256_fmadd_ps(vk, pb[j], a[j][k]);
            }
        }
        for (int j = 0; j < NQ; j++) {
            for (int k = 0; k < NV; k++) _mm256_storeu_ps(ch + ((j * 32 + L) * NV + k) * 8, a[j][k]);
        }
    }
}

/* y rows j < NQ, outputs d0 .. d0 + 8 NV: the 32 chains per output reduced in vec_dot's order;
 * chain L = 8 i + l is lane l of accumulator i. */
static ALWAYS_INLINE void pv_reduce(int kind, int NQ, int NV, float *y, int64_t ldy, const float *ch, int d0) {
    for (int j = 0; j < NQ; j++) {
        for (int k = 0; k < NV; k++) {
#define CH(L) _mm256_loadu_ps(ch + ((j * 32 + (L)) * NV + k) * 8)
            __m256 A[8];
            for (int l = 0; l < 8; l++) {
                const __m256 a0 = CH(l), a1 = CH(8 + l), a2 = CH(16 + l), a3 = CH(24 + l);
                if (kind == KIND_F16) A[l] = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
                else A[l] = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
            }
#undef CH
            __m256 t[4];
            for (int i = 0; i < 4; i++) t[i] = _mm256_add_ps(A[i], A[i + 4]);
            __m256 r;
            if (kind == KIND_F16) r = _mm256_add_ps(_mm256_add_ps(t[0], t[1]), _mm256_add_ps(t[2], t[3]));
            else r = _mm256_add_ps(_mm256_add_ps(t[0], t[2]), _mm256_add_ps(t[1], t[3]));
            _mm256_storeu_ps(y + j * ldy + d0 + 8 * k, r);
        }
    }
}

/* NQ rows (constant), all hd outputs, in blocks of 8 NV outputs (NV the largest that fits). */
static ALWAYS_INLINE void pv_rows(int kind, int NQ, int NVMAX, int hd, float *y, int64_t ldy, const void *v,
                                  int64_t ldv, const float *pf, int64_t ldp, const uint8_t *nz, int c0, int c1,
                                  float *ch) {
    /* the passes of a block read every 32nd cell: the first block's V is asked into L1 here,
     * each next block's during the passes of the one before */
    for (int64_t c = c0; c < c1; c++) prefetch_v(kind, v, c * ldv);
    for (int d0 = 0; d0 < hd;) {
        const int left = hd - d0;
        int nv = NVMAX;
        while (nv > 1 && 8 * nv > left) nv /= 2;
        const int nx = d0 + 8 * nv < hd;
        switch (nv) { /* constant register counts, so the accumulators stay in registers */
        case 8: pv_chains(kind, NQ, 8, ch, v, ldv, pf, ldp, nz, c0, c1, d0, nx); pv_reduce(kind, NQ, 8, y, ldy, ch, d0); break;
        case 4: pv_chains(kind, NQ, 4, ch, v, ldv, pf, ldp, nz, c0, c1, d0, nx); pv_reduce(kind, NQ, 4, y, ldy, ch, d0); break;
        case 2: pv_chains(kind, NQ, 2, ch, v, ldv, pf, ldp, nz, c0, c1, d0, nx); pv_reduce(kind, NQ, 2, y, ldy, ch, d0); break;
        default: pv_chains(kind, NQ, 1, ch, v, ldv, pf, ldp, nz, c0, c1, d0, nx); pv_reduce(kind, NQ, 1, y, ldy, ch, d0); break;
        }
        d0 += 8 * nv;
    }
}

/* Scratch: ch (32 * 128 floats: the chains of one block, at most 32 * NQ * 8 NV = 32 * 96) | nz (n bytes)
 * | pf (min(nq, 4) rows of n floats). */
static ALWAYS_INLINE void attn_pv(int kind, int hd, int nq, float *y, int64_t ldy, const void *v, int64_t ldv,
                                  const void *p, int64_t ldp, int c0, int c1, void *scratch) {
    const int n = c1 > c0 ? c1 - c0 : 0;
    float *ch = scratch;
    uint8_t *nz = (uint8_t *)(ch + 32 * 128);
    float *pf = (float *)((char *)nz + ((size_t)n + 63) / 64 * 64);
    for (int j0 = 0; j0 < nq; j0 += 4) {
        const int NQ = nq - j0 < 4 ? nq - j0 : 4;
        /* probabilities of rows j0 .. j0 + NQ in f32 (the f16 ones converted exactly) */
        for (int c = 0; c < n; c++) nz[c] = 0;
        for (int j = 0; j < NQ; j++) {
            float *pj = pf + (int64_t)j * n;
            if (kind == KIND_F16) {
                const llmrt_fp16_t *ph = (const llmrt_fp16_t *)p + (j0 + j) * ldp + c0;
                int c = 0;
                for (; c + 8 <= n; c += 8) _mm256_storeu_ps(pj + c, _mm256_cvtph_ps(loadu128(ph + c)));
                for (; c < n; c++) pj[c] = f16(ph[c]);
                for (c = 0; c < n; c++) nz[c] |= ph[c] != 0;
            } else {
                const float *ps = (const float *)p + (j0 + j) * ldp + c0;
                for (int c = 0; c < n; c++) {
                    pj[c] = ps[c];
                    nz[c] |= ps[c] != 0.0f;
                }
            }
        }
        float *yj = y + j0 * ldy;
        switch (NQ) {
        case 4: pv_rows(kind, 4, 2, hd, yj, ldy, v, ldv, pf, n, nz, c0, c1, ch); break;
        case 3: pv_rows(kind, 3, 4, hd, yj, ldy, v, ldv, pf, n, nz, c0, c1, ch); break; /* 12 accumulators */
        case 2: pv_rows(kind, 2, 4, hd, yj, ldy, v, ldv, pf, n, nz, c0, c1, ch); break;
        default: pv_rows(kind, 1, 8, hd, yj, ldy, v, ldv, pf, n, nz, c0, c1, ch); break;
        }
    }
}

/* ---- scores: one dot per (row, cell), as attn_dot_f16_avx2 / attn_dot_f32_avx2 (dot_avx2.c)
 * compute it:
 *   f16: 4 x 8 lanes over steps of 32, (a0 + a2) + (a1 + a3), halves, two hadds, double tail;
 *   f32: 4 x 8 lanes over steps of 32, then steps of 8 into a0, hsum_ps((a0 + a1) + (a2 + a3)),
 *        double tail. */

/* Accumulators i0 .. i0 + NI of NQ rows' dots with one f16 K row kr over its first np (a multiple
 * of 32) elements: acc[j][i] = accumulator i of row j, lane l summing elements 32 e + 8 i + l in
 * increasing e, as attn_dot_f16_avx2 builds it. qf: the rows in f32, ldq apart. */
static ALWAYS_INLINE void qk_f16_acc(int np, int NQ, int i0, int NI, const llmrt_fp16_t *kr, const float *qf,
                                     int64_t ldq, __m256 acc[4][4]) {
    for (int j = 0; j < NQ; j++) {
        for (int i = i0; i < i0 + NI; i++) acc[j][i] = _mm256_setzero_ps();
    }
    for (int e = 0; e < np; e += 32) {
        for (int i = i0; i < i0 + NI; i++) {
            const __m256 kv = _mm256_cvtph_ps(loadu128(kr + e + 8 * i)); /* once for the NQ rows */
            for (int j = 0; j < NQ; j++) {
                acc[j][i] = _mm256_fmadd_ps(kv, _mm256_loadu_ps(qf + j * ldq + e + 8 * i), acc[j][i]);
            }
        }
    }
}

/* attn_dot_f16_avx2's end: the 4 accumulators reduced, then the scalar tail in double. */
static ALWAYS_INLINE float qk_f16_finish(__m256 a[4], int np, int hd, const llmrt_fp16_t *kr, const float *qj) {
    const __m256 a02 = _mm256_add_ps(a[0], a[2]);
    const __m256 a13 = _mm256_add_ps(a[1], a[3]);
    const __m256 r = _mm256_add_ps(a02, a13);
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    double sum = (double)_mm_cvtss_f32(_mm_hadd_ps(t1, t1));
    for (int i = np; i < hd; i++) sum += (double)(f16(kr[i]) * qj[i]);
    return (float)sum;
}

/* qk_f16_finish's horizontal sum (halves, then two hadds) of 8 vectors at once, lane e of the
 * result from r[e], by the same adds: halves of two vectors side by side, then hadds that pair
 * the same lanes as hadd(t, t) does, then the lanes put back in order. No tail (np == hd), and
 * (float)(double)x == x. */
static ALWAYS_INLINE __m256 qk_f16_end8(const __m256 r[8]) {
    __m256 t[4];
    for (int i = 0; i < 4; i++) {
        const __m256 lo = _mm256_permute2f128_ps(r[2 * i], r[2 * i + 1], 0x20); /* r[2i].lo | r[2i+1].lo */
        const __m256 hi = _mm256_permute2f128_ps(r[2 * i], r[2 * i + 1], 0x31); /* r[2i].hi | r[2i+1].hi */
        t[i] = _mm256_add_ps(lo, hi);
    }
    const __m256 u0 = _mm256_hadd_ps(t[0], t[1]); /* lanes: pairs of r0, r2 | r1, r3 */
    const __m256 u1 = _mm256_hadd_ps(t[2], t[3]); /* r4, r6 | r5, r7 */
    const __m256 x = _mm256_hadd_ps(u0, u1);      /* r0 r2 r4 r6 | r1 r3 r5 r7 */
    return _mm256_permutevar8x32_ps(x, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* All 4 accumulators of NQ rows with one K row: up to 2 rows keep the 4 in registers at once;
 * 3 or 4 rows go over the K row in two passes of 2 accumulators. */
static ALWAYS_INLINE void qk_f16_acc_all(int np, int NQ, const llmrt_fp16_t *kr, const float *qf, int64_t ldq,
                                         __m256 acc[4][4]) {
    if (NQ <= 2) {
        qk_f16_acc(np, NQ, 0, 4, kr, qf, ldq, acc);
    } else {
        qk_f16_acc(np, NQ, 0, 2, kr, qf, ldq, acc);
        qk_f16_acc(np, NQ, 2, 2, kr, qf, ldq, acc);
    }
}

/* NQ rows (constant) over cells [c0, c1); HD constant where the caller makes it so (accumulators:
 * qk_f16_acc_all). */
static ALWAYS_INLINE void qk_f16_rows(int HD, int NQ, float *s, int64_t lds, const llmrt_fp16_t *k, int64_t ldk,
                                      const float *qf, int64_t ldq, int c0, int c1) {
    const int np = HD & ~31;
    int64_t c = c0;
    /* no tail: the ends of 8 cells at once (qk_f16_end8) where the 8 cells' sums fit (head size 64,
     * or 128 for up to 3 rows; 4 rows or head size 256 spilled them and ran slower,
     * benchmarks/README.md, "Long prompts") */
    if (np == HD && (HD <= 64 || (HD <= 128 && NQ <= 3))) {
        for (; c + 8 <= c1; c += 8) {
            __m256 r[4][8]; /* (a0 + a2) + (a1 + a3) of row j, cell c + e */
            for (int e = 0; e < 8; e++) {
                const llmrt_fp16_t *kr = k + (c + e) * ldk;
                __m256 acc[4][4];
                qk_f16_acc_all(np, NQ, kr, qf, ldq, acc);
                for (int j = 0; j < NQ; j++) {
                    r[j][e] = _mm256_add_ps(_mm256_add_ps(acc[j][0], acc[j][2]), _mm256_add_ps(acc[j][1], acc[j][3]));
                }
            }
            for (int j = 0; j < NQ; j++) _mm256_storeu_ps(s + j * lds + c, qk_f16_end8(r[j]));
        }
    }
    for (; c < c1; c++) {
        const llmrt_fp16_t *kr = k + c * ldk;
        __m256 acc[4][4];
        qk_f16_acc_all(np, NQ, kr, qf, ldq, acc);
        for (int j = 0; j < NQ; j++) s[j * lds + c] = qk_f16_finish(acc[j], np, HD, kr, qf + j * ldq);
    }
}

static ALWAYS_INLINE void qk_f16_hd(int HD, int nq, float *s, int64_t lds, const llmrt_fp16_t *k, int64_t ldk,
                                    const float *qf, int64_t ldq, int c0, int c1) {
    for (int j0 = 0; j0 < nq; j0 += 4) {
        float *sj = s + j0 * lds;
        const float *qj = qf + j0 * ldq;
        switch (nq - j0 < 4 ? nq - j0 : 4) {
        case 4: qk_f16_rows(HD, 4, sj, lds, k, ldk, qj, ldq, c0, c1); break;
        case 3: qk_f16_rows(HD, 3, sj, lds, k, ldk, qj, ldq, c0, c1); break;
        case 2: qk_f16_rows(HD, 2, sj, lds, k, ldk, qj, ldq, c0, c1); break;
        default: qk_f16_rows(HD, 1, sj, lds, k, ldk, qj, ldq, c0, c1); break;
        }
    }
}

static void attn_qk_f16_avx2(int hd, int nq, float *s, int64_t lds, const void *k, int64_t ldk, const void *q,
                             int64_t ldq, int c0, int c1, void *scratch) {
    /* the q rows in f32 (exact), hd apart */
    float *qf = scratch;
    for (int j = 0; j < nq; j++) {
        const llmrt_fp16_t *qh = (const llmrt_fp16_t *)q + j * ldq;
        float *qo = qf + (int64_t)j * hd;
        int i = 0;
        for (; i + 8 <= hd; i += 8) _mm256_storeu_ps(qo + i, _mm256_cvtph_ps(loadu128(qh + i)));
        for (; i < hd; i++) qo[i] = f16(qh[i]);
    }
    switch (hd) { /* the common head sizes: the loop bounds are constants */
    case 64: qk_f16_hd(64, nq, s, lds, k, ldk, qf, 64, c0, c1); break;
    case 128: qk_f16_hd(128, nq, s, lds, k, ldk, qf, 128, c0, c1); break;
    case 256: qk_f16_hd(256, nq, s, lds, k, ldk, qf, 256, c0, c1); break;
    default: qk_f16_hd(hd, nq, s, lds, k, ldk, qf, hd, c0, c1); break;
    }
}

static ALWAYS_INLINE float dot_f32(int n, const float *x, const float *y) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
    double sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += (double)(x[i] * y[i]);
    return (float)sum;
}

/* f32 cache: nothing to convert, so one row at a time. */
static void attn_qk_f32_avx2(int hd, int nq, float *s, int64_t lds, const void *k, int64_t ldk, const void *q,
                             int64_t ldq, int c0, int c1, void *scratch) {
    (void)scratch;
    const float *kk = k; /* (cells, ldk) */
    for (int j = 0; j < nq; j++) {
        const float *qj = (const float *)q + j * ldq;
        for (int c = c0; c < c1; c++) s[j * lds + c] = dot_f32(hd, kk + (int64_t)c * ldk, qj);
    }
}

/* ---- many dots (llmrt_attn_dots_fn): out[j * ldo + i] = attn_dot_f16_avx2(n, X_i, Y_j), tiled
 * RX X rows by RY Y rows in registers. attn_dot_f16_avx2's 4 accumulators are independent chains
 * (accumulator a sums elements 32 e + 8 a + l in increasing e, lane l), so they are built one at a
 * time (4 passes over the rows), each X vector converted once for the RY rows and each Y vector
 * loaded once for the RX rows: RX * RY chains of fmas in flight. Then
 * r = (a0 + a2) + (a1 + a3) as attn_dot_f16_avx2 adds them, and the horizontal sums of 8 r at once
 * (qk_f16_end8) or, with a tail, one at a time (qk_f16_finish's end). */

enum { DX = 4, DY = 3, DXB = 24 }; /* tile: DX X rows by DY Y rows; X rows per finishing block */

/* Accumulator a of the tile (RX <= DX, RY <= DY): acc[j][i] over np (a multiple of 32) elements. */
static ALWAYS_INLINE void dots_pass(int np, int RX, int RY, int a, const llmrt_fp16_t *x, int64_t ldx,
                                    const float *y, int64_t ldy, __m256 acc[DY][DX]) {
    for (int j = 0; j < RY; j++) {
        for (int i = 0; i < RX; i++) acc[j][i] = _mm256_setzero_ps();
    }
    for (int64_t e = 8 * a; e < np; e += 32) {
        __m256 yv[DY];
        for (int j = 0; j < RY; j++) yv[j] = _mm256_loadu_ps(y + j * ldy + e);
        for (int i = 0; i < RX; i++) {
            const __m256 xv = _mm256_cvtph_ps(loadu128(x + i * ldx + e)); /* once for the RY rows */
            for (int j = 0; j < RY; j++) acc[j][i] = _mm256_fmadd_ps(xv, yv[j], acc[j][i]);
        }
    }
}

/* r[j][i] = (a0 + a2) + (a1 + a3) of X row i and Y row j (passes in the order 0, 2, 1, 3). */
static ALWAYS_INLINE void dots_tile(int np, int RX, int RY, const llmrt_fp16_t *x, int64_t ldx, const float *y,
                                    int64_t ldy, __m256 r[DY][DX]) {
    __m256 t[DY][DX], u[DY][DX];
    dots_pass(np, RX, RY, 0, x, ldx, y, ldy, t);
    dots_pass(np, RX, RY, 2, x, ldx, y, ldy, u);
    for (int j = 0; j < RY; j++) {
        for (int i = 0; i < RX; i++) t[j][i] = _mm256_add_ps(t[j][i], u[j][i]); /* a0 + a2 */
    }
    dots_pass(np, RX, RY, 1, x, ldx, y, ldy, r);
    dots_pass(np, RX, RY, 3, x, ldx, y, ldy, u);
    for (int j = 0; j < RY; j++) {
        for (int i = 0; i < RX; i++) r[j][i] = _mm256_add_ps(t[j][i], _mm256_add_ps(r[j][i], u[j][i]));
    }
}

/* attn_dot_f16_avx2's end from r = (a0 + a2) + (a1 + a3): halves, two hadds, the tail in double. */
static ALWAYS_INLINE float dots_finish(__m256 r, int np, int n, const llmrt_fp16_t *xr, const float *yr) {
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    double sum = (double)_mm_cvtss_f32(_mm_hadd_ps(t1, t1));
    for (int i = np; i < n; i++) sum += (double)(f16(xr[i]) * yr[i]);
    return (float)sum;
}

/* RY (constant) Y rows with all nx X rows, DXB X rows at a time: their r kept, then finished. */
static ALWAYS_INLINE void dots_rows(int N, int RY, int nx, float *out, int64_t ldo, const llmrt_fp16_t *x,
                                    int64_t ldx, const float *y, int64_t ldy) {
    const int np = N & ~31;
    for (int i0 = 0; i0 < nx; i0 += DXB) {
        const int nb = nx - i0 < DXB ? nx - i0 : DXB;
        __m256 rb[DY][DXB];
        int i = 0;
        for (; i + DX <= nb; i += DX) {
            __m256 r[DY][DX];
            dots_tile(np, DX, RY, x + (i0 + i) * ldx, ldx, y, ldy, r);
            for (int j = 0; j < RY; j++) {
                for (int k = 0; k < DX; k++) rb[j][i + k] = r[j][k];
            }
        }
        if (nb > i) { /* the last 1 .. DX - 1 X rows */
            __m256 r[DY][DX];
            const int rx = nb - i;
            switch (rx) {
            case 3: dots_tile(np, 3, RY, x + (i0 + i) * ldx, ldx, y, ldy, r); break;
            case 2: dots_tile(np, 2, RY, x + (i0 + i) * ldx, ldx, y, ldy, r); break;
            default: dots_tile(np, 1, RY, x + (i0 + i) * ldx, ldx, y, ldy, r); break;
            }
            for (int j = 0; j < RY; j++) {
                for (int k = 0; k < rx; k++) rb[j][i + k] = r[j][k];
            }
        }
        for (int j = 0; j < RY; j++) {
            float *o = out + j * ldo + i0;
            int k = 0;
            if (np == N) {
                for (; k + 8 <= nb; k += 8) _mm256_storeu_ps(o + k, qk_f16_end8(rb[j] + k));
            }
            for (; k < nb; k++) o[k] = dots_finish(rb[j][k], np, N, x + (i0 + k) * ldx, y + j * ldy);
        }
    }
}

static ALWAYS_INLINE void dots_n(int N, int nx, int ny, float *out, int64_t ldo, const llmrt_fp16_t *x,
                                 int64_t ldx, const float *y, int64_t ldy) {
    for (int j0 = 0; j0 < ny; j0 += DY) {
        float *o = out + j0 * ldo;
        const float *yj = y + j0 * ldy;
        switch (ny - j0 < DY ? ny - j0 : DY) {
        case 3: dots_rows(N, 3, nx, o, ldo, x, ldx, yj, ldy); break;
        case 2: dots_rows(N, 2, nx, o, ldo, x, ldx, yj, ldy); break;
        default: dots_rows(N, 1, nx, o, ldo, x, ldx, yj, ldy); break;
        }
    }
}

/* n is not specialized: with constant bounds the 4 passes unroll into one block that spills. */
static void attn_dots_f16_avx2(int n, int nx, int ny, float *out, int64_t ldo, const void *x, int64_t ldx,
                               const float *y, int64_t ldy) {
    dots_n(n, nx, ny, out, ldo, x, ldx, y, ldy);
}

static void attn_pv_f16_avx2(int hd, int nq, float *y, int64_t ldy, const void *v, int64_t ldv, const void *p,
                             int64_t ldp, int c0, int c1, void *scratch) {
    attn_pv(KIND_F16, hd, nq, y, ldy, v, ldv, p, ldp, c0, c1, scratch);
}

static void attn_pv_f32_avx2(int hd, int nq, float *y, int64_t ldy, const void *v, int64_t ldv, const void *p,
                             int64_t ldp, int c0, int c1, void *scratch) {
    attn_pv(KIND_F32, hd, nq, y, ldy, v, ldv, p, ldp, c0, c1, scratch);
}
#endif

void llmrt_register_attn_kernels_avx2(llmrt_kernel_table *kt) {
#if defined(__x86_64__)
    kt->attn_pv[LLMRT_TYPE_F16] = attn_pv_f16_avx2;
    kt->attn_pv_dot[LLMRT_TYPE_F16] = llmrt_attn_dot_f16_avx2;
    kt->attn_pv_name[LLMRT_TYPE_F16] = "attn_pv_f16_avx2";
    kt->attn_pv[LLMRT_TYPE_F32] = attn_pv_f32_avx2;
    kt->attn_pv_dot[LLMRT_TYPE_F32] = llmrt_attn_dot_f32_avx2;
    kt->attn_pv_name[LLMRT_TYPE_F32] = "attn_pv_f32_avx2";
    kt->attn_qk[LLMRT_TYPE_F16] = attn_qk_f16_avx2;
    kt->attn_qk_dot[LLMRT_TYPE_F16] = llmrt_attn_dot_f16_avx2;
    kt->attn_qk_name[LLMRT_TYPE_F16] = "attn_qk_f16_avx2";
    kt->attn_qk[LLMRT_TYPE_F32] = attn_qk_f32_avx2;
    kt->attn_qk_dot[LLMRT_TYPE_F32] = llmrt_attn_dot_f32_avx2;
    kt->attn_qk_name[LLMRT_TYPE_F32] = "attn_qk_f32_avx2";
    kt->attn_dots[LLMRT_TYPE_F16] = attn_dots_f16_avx2;
    kt->attn_dots_dot[LLMRT_TYPE_F16] = llmrt_attn_dot_f16_avx2;
    kt->attn_dots_name[LLMRT_TYPE_F16] = "attn_dots_f16_avx2";
#else
    (void)kt;
#endif
}
