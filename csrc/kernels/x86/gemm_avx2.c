/*
 * gemm_avx2.c — packed-weight gemm kernels (gemm.h) for the AVX2 level (AVX2 + FMA + F16C), over
 * the layout of gemm_q32.h. Compiled for this target only; the register function is called only
 * when the CPU supports the level.
 *
 * Bit-exact with dot_avx2.c's vec_dot for every (row, token): per block the same exact integer
 * sums in the same 8 i32 lanes (lane k = elements 4k..4k+3), converted to f32 and accumulated with
 * fma(d_x·d_y, lanes, acc) in block order, then the same horizontal sum (and Q4_1/Q5_1's Σ m·s
 * chain, fused as vec_dot's). Q4_0 and IQ4_NL are the exception: for them the level registers
 * llama.cpp's repacked order (gemm_q4_0_q8_0_x8_avx2 / gemm_iq4_nl_q8_0_x8_avx2, below: one f32 fma
 * per whole block), as their vec_dots do. For the lane-order types only the work is shared:
 *   - a tile is 4 rows x NT tokens of __m256 accumulators; each row's quants are unpacked once
 *     per block (one aligned 32-byte load gives two rows' nibbles) and used by NT tokens, each
 *     token's activation block is loaded once and used by 4 rows;
 *   - d_x·d_y for 4 rows is one mul_ps of the group's 4 scales (one cvtph) by the token's d;
 *   - Q5's 5th bits come from the group's pre-arranged bit layout with two 64-bit shifts per
 *     row pair (gemm_q32.h), no byte shuffle;
 *   - the offset of Q5_0 (q - 16) is maddubs(off, y), i16 pair sums computed once
 *     per token and block and subtracted from every row's maddubs(q, y) before the madd to i32
 *     lanes: the same exact integers as vec_dot's maddubs(q, y) - maddubs(off, y) (every i16
 *     value fits, nothing saturates).
 * WQ_Q8A is Q8_0's quants with Q4_1's Σ m·s chain (m + 128 d, as wq_avx2.c's vec_dot).
 * gemm_q32_avx2 serves the lane-order types only (Q4_1, Q5_0, Q5_1, Q8_0, WQ_Q8A: its signed path
 * reads Q8_0's stored int8 quants; Q4_0 and IQ4_NL go to gemm_x8_avx2).
 * n_x = 1 is the decode GEMV (a tile of one token streams the group once); n_x > 1 tiles tokens
 * by GEMM_NT, the rest by smaller tiles; for Q4_1/Q5_0/Q5_1 the group is first unpacked to
 * bytes once per call (tile_q32u, below), and a call of two groups (gemm_groups = 2, what MUL_MAT
 * gives this level) runs 8-row x 1-token tiles over both (tile_q32x2).
 */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/gemm.h"

#include <string.h>

#include "../gemm_q32.h"

#if defined(__x86_64__)
#include "simd_avx2.h" /* f16, loads, hsum_ps, expand_bits_32 */
#include "gemm_q32_simd.h" /* q32_block_quants */

#define ALWAYS_INLINE inline __attribute__((always_inline))
#ifndef GEMV_PF_BYTES
#define GEMV_PF_BYTES 2048 /* decode prefetch distance */
#endif
#define GEMM_NT 4 /* tokens per tile: 4 x 4 accumulators (a few spills; measured faster than 2 or 3) */

#define TILE_NT_MAX 8 /* tokens a tile may have (GEMM_NT, NTU) */

/* A tile's results: each (row r, token j) accumulator acc[r][j] summed horizontally as
 * vec_dot does (plus Q4_1 / Q5_1's Σ m·s, lane r of summ[j]); all 4 rows with a constant bound
 * (so the accumulators stay in registers), then the n_rows wanted are written. */
static ALWAYS_INLINE void tile_store(const __m256 (*acc)[TILE_NT_MAX], const __m128 *summ, const int NT,
                                     const int q8_1, float *y, const int64_t ys, const int n_rows) {
    _Alignas(16) float res[TILE_NT_MAX][Q32_R];
    for (int j = 0; j < NT; j++) {
        _Alignas(16) float sm[4];
        _mm_store_ps(sm, summ[j]);
        for (int r = 0; r < Q32_R; r++) {
            res[j][r] = hsum_ps(acc[r][j]);
            if (q8_1) res[j][r] = res[j][r] + sm[r];
        }
    }
    for (int j = 0; j < NT; j++) {
        for (int r = 0; r < n_rows; r++) y[(int64_t)j * ys + r] = res[j][r];
    }
}

/* tile_store of a 4-row tile's accumulators acc[r][j] and Σ m·s summ[j] through copies: given the
 * accumulators' own address, GCC kept them in memory over the whole block loop (a store of every
 * accumulator per block: llvm-mca, Q4_1, 2 tokens, 8 of 20 stack references per block; -14 % for
 * the Q4_1 matmuls of a 2-sequence serving step, benchmarks/README.md) */
#define tile_out(acc, summ, NT, q8_1, y, ys, n_rows)                                                  \
    do {                                                                                              \
        __m256 out_[Q32_R][TILE_NT_MAX];                                                              \
        __m128 sm_[TILE_NT_MAX];                                                                      \
        for (int j_ = 0; j_ < (NT); j_++) {                                                           \
            sm_[j_] = (summ)[j_];                                                                     \
            for (int r_ = 0; r_ < Q32_R; r_++) out_[r_][j_] = (acc)[r_][j_];                          \
        }                                                                                             \
        tile_store(out_, sm_, (NT), (q8_1), (y), (ys), (n_rows));                                     \
    } while (0)

/* Block ib's scales of the group's 4 rows in f32 (sc region, gemm_q32.h): d, and for Q4_1 / Q5_1
 * (q8_1) m (else 0); WQ_Q8A's m + 128 d (exact as wq_avx2.c's scalar: 128 d is exact, one rounding). */
static ALWAYS_INLINE void group_scales(const int type, const int q8_1, const uint8_t *sc, const int64_t ib, __m128 *xd,
                                       __m128 *xm) {
    if (q8_1) {
        const __m256 dm = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(sc + ib * 16)));
        *xd = _mm256_castps256_ps128(dm);
        *xm = _mm256_extractf128_ps(dm, 1);
        if (type == LLMRT_TYPE_WQ_Q8A) *xm = _mm_fmadd_ps(_mm_set1_ps(128.0f), *xd, *xm);
    } else {
        *xd = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(sc + ib * 8)));
        *xm = _mm_setzero_ps();
    }
}

/* One tile: rows 0..3 of the group x tokens 0..NT-1 of x; writes rows < n_rows. stream: a call of up
 * to SMALL_NX tokens (decode, a batched decode step), whose first tile reads the group from memory:
 * prefetch it. */
static ALWAYS_INLINE void tile_q32(const int type, const int NT, const int64_t nb, const uint8_t *grp,
                                   const uint8_t *x, const size_t xs, float *y, const int64_t ys,
                                   const int n_rows, const int stream) {
    const int q8_1 = q32_nsc(type) == 2;                  /* activations Q8_1 (d, s, qs), else Q8_0 */
    const size_t ybs = q8_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const int yqo = q8_1 ? 4 : 2;                         /* offset of qs in the activation block */
    const int off = q32_off(type);
    const uint8_t *sc = grp;
    const uint8_t *qh = grp + q32_qh_off(type, nb);
    const uint8_t *qs = grp + q32_qs_off(type, nb);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[Q32_R][4];
    __m128 summ[4];                                       /* Σ m·s, lane r = row r */
    for (int j = 0; j < NT; j++) {
        summ[j] = _mm_setzero_ps();
        for (int r = 0; r < Q32_R; r++) acc[r][j] = _mm256_setzero_ps();
    }
    /* group bytes per block, padding aside (<= 136; a constant: no division per call) */
    const size_t pfs = (size_t)(Q32_R * (2 * q32_nsc(type) + (q32_has_qh(type) ? 4 : 0) + q32_qsb(type)));
#pragma GCC unroll 2
    for (int64_t ib = 0; ib < nb; ib++) {
        if (stream) { /* decode streams the weights once (the groups lie back to back): fetch
                       * GEMV_PF_BYTES ahead of the group's bytes consumed per block, pfs, so every
                       * line is asked for (an address past the weights is never read: uintptr_t
                       * arithmetic, a hint only). Batched decode steps of 2-4 tokens too: a
                       * standalone copy, Q4_1 1536 x 65536 from DRAM, one thread, n = 2 / 4:
                       * 9.5-10.3 -> 6.2-7.4 ms / 11.8-12.1 -> 10.6-11.3 ms */
            const uintptr_t a = (uintptr_t)grp + GEMV_PF_BYTES + (uintptr_t)ib * pfs;
            _mm_prefetch((const char *)a, _MM_HINT_T0);
            if (pfs > 64) _mm_prefetch((const char *)(a + 64), _MM_HINT_T0);
        }
        __m128 xd, xm;
        group_scales(type, q8_1, sc, ib, &xd, &xm);
        _Alignas(16) float dp[4][4];                      /* [token][row] d_x·d_y */
        __m256i yq[4], yo[4];
        for (int j = 0; j < NT; j++) {
            const uint8_t *yb = x + (size_t)j * xs + (size_t)ib * ybs;
            /* d_y: cvtph of the block's first 4 halves (d, then 3 halves of other fields: Q8_1's s
             * first), lane 0 */
            const __m128 dy = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)yb));
            _mm_store_ps(dp[j], _mm_mul_ps(xd, _mm_broadcastss_ps(dy)));
            if (q8_1) summ[j] = _mm_fmadd_ps(xm, _mm_permute_ps(dy, 0x55), summ[j]); /* s: lane 1 */
            yq[j] = loadu256(yb + yqo);
            if (off) yo[j] = _mm256_maddubs_epi16(_mm256_set1_epi8((char)off), yq[j]); /* i16 pairs */
        }
        if (q32_signed(type)) { /* Q8_0, WQ_Q8A: the sign trick, as dot_i8_i8 */
            for (int r = 0; r < Q32_R; r++) {
                const __m256i w = _mm256_load_si256((const __m256i *)(qs + ib * 128 + 32 * r));
                const __m256i aw = _mm256_sign_epi8(w, w);
                for (int j = 0; j < NT; j++) {
                    const __m256i i32 = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(yq[j], w)), ones);
                    acc[r][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dp[j][r]), _mm256_cvtepi32_ps(i32), acc[r][j]);
                }
            }
        } else {
            for (int p = 0; p < Q32_R / 2; p++) {
                const __m256i v = _mm256_load_si256((const __m256i *)(qs + ib * 64 + 32 * p));
                __m256i w[2] = { _mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) };
                if (q32_has_qh(type)) { /* 5th bits to bit 4 of each byte (gemm_q32.h) */
                    const __m256i b5 = _mm256_set1_epi8(0x10);
                    long long hq;
                    memcpy(&hq, qh + ib * Q32_R * 4 + 8 * p, 8);
                    const __m256i h = _mm256_set1_epi64x(hq);
                    const __m256i h0 = _mm256_sllv_epi64(h, _mm256_set_epi64x(1, 2, 3, 4));
                    const __m256i h1 = _mm256_srlv_epi64(h, _mm256_set_epi64x(3, 2, 1, 0));
                    w[0] = _mm256_or_si256(w[0], _mm256_and_si256(h0, b5));
                    w[1] = _mm256_or_si256(w[1], _mm256_and_si256(h1, b5));
                }
                for (int k = 0; k < 2; k++) {
                    const int r = 2 * p + k;
                    for (int j = 0; j < NT; j++) {
                        __m256i p16 = _mm256_maddubs_epi16(w[k], yq[j]);
                        if (off) p16 = _mm256_sub_epi16(p16, yo[j]); /* exact in i16 (tile_q32u) */
                        const __m256i i32 = _mm256_madd_epi16(p16, ones);
                        acc[r][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dp[j][r]), _mm256_cvtepi32_ps(i32), acc[r][j]);
                    }
                }
            }
        }
    }
    tile_out(acc, summ, NT, q8_1, y, ys, n_rows);
}

/* ---- prefill (n_x > 1) for the unsigned-quant lane-order types (Q4_1, Q5_0, Q5_1) ------------------
 * The group's quants are unpacked once per call into wq [nb][Q32_R][32] bytes (each row's 32 quants
 * of a block, 5th bit included, as vec_dot's maddubs operand), so a tile spends no work on unpacking
 * and every weight vector is one aligned load. A tile is 4 rows x NTU tokens. Per (row, token, block):
 * maddubs(w, y) - maddubs(off, y) in i16 (exact: no saturation, q·y pairs <= 2·31·128, and the
 * difference Σ (q - off)·y over a pair fits), one madd to the 8 i32 lanes, cvt, fma: 7 instructions
 * with the weight load and the d broadcast. Callgrind, Q5_0 640 x 256 x 64 tokens: 4.22M instructions
 * in the 4 x 4 inline-unpack tile, 3.55M / 3.53M / 3.36M here with NTU = 2 / 3 / 4 (a few
 * accumulators spill at 4; the spills are cheaper than the per-tile work they save). */
#ifndef NTU
#define NTU 4          /* tokens per prefill tile */
#endif
_Static_assert(NTU <= TILE_NT_MAX && GEMM_NT <= TILE_NT_MAX, "tile_store holds TILE_NT_MAX tokens");
#define WQ_NB_MAX 128  /* blocks per row the stack buffer holds (K <= 4096); longer rows: tile_q32 */
#ifndef SMALL_NX
#define SMALL_NX 4     /* up to this many tokens (a batched decode step) the quants are unpacked in
                        * registers per tile (tile_q32), not once per call into memory: too few
                        * tokens to repay the stores and reloads */
#endif

/* wq: block ib's 4 rows at wq + ib * wbs (wbs = 128: this group alone; 256: one of two groups) */
static ALWAYS_INLINE void unpack_q32(const int type, const int64_t nb, const uint8_t *grp, uint8_t *wq,
                                     const size_t wbs) {
    for (int64_t ib = 0; ib < nb; ib++) {
        __m256i w[Q32_R];
        q32_block_quants(type, nb, grp, ib, w);
        for (int r = 0; r < Q32_R; r++) _mm256_store_si256((__m256i *)(wq + (size_t)ib * wbs + 32 * r), w[r]);
    }
}

static ALWAYS_INLINE void tile_q32u(const int type, const int NT, const int64_t nb, const uint8_t *grp,
                                    const uint8_t *wq, const uint8_t *x, const size_t xs, float *y,
                                    const int64_t ys, const int n_rows) {
    const int q8_1 = q32_nsc(type) == 2;
    const size_t ybs = q8_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const int yqo = q8_1 ? 4 : 2;
    const int off = q32_off(type);
    const uint8_t *sc = grp;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i offv = _mm256_set1_epi8((char)off);
    __m256 acc[Q32_R][NTU];
    __m128 summ[NTU];
    for (int j = 0; j < NT; j++) {
        summ[j] = _mm_setzero_ps();
        for (int r = 0; r < Q32_R; r++) acc[r][j] = _mm256_setzero_ps();
    }
    for (int64_t ib = 0; ib < nb; ib++) {
        __m128 xd, xm;
        group_scales(type, q8_1, sc, ib, &xd, &xm);
        const uint8_t *wb = wq + ib * 128;
        for (int j = 0; j < NT; j++) {
            const uint8_t *yb = x + (size_t)j * xs + (size_t)ib * ybs;
            /* d_y: cvtph of the block's first 4 halves (d, then 3 halves of other fields), lane 0 */
            const __m128 dy = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)yb));
            _Alignas(16) float dp[4]; /* d_x·d_y of rows 0..3 */
            _mm_store_ps(dp, _mm_mul_ps(xd, _mm_broadcastss_ps(dy)));
            if (q8_1) summ[j] = _mm_fmadd_ps(xm, _mm_permute_ps(dy, 0x55), summ[j]); /* s: lane 1 */
            const __m256i yq = loadu256(yb + yqo);
            const __m256i yo = off ? _mm256_maddubs_epi16(offv, yq) : _mm256_setzero_si256();
            for (int r = 0; r < Q32_R; r++) {
                __m256i p = _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(wb + 32 * r)), yq);
                if (off) p = _mm256_sub_epi16(p, yo);
                const __m256i i32 = _mm256_madd_epi16(p, ones);
                acc[r][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dp[r]), _mm256_cvtepi32_ps(i32), acc[r][j]);
            }
        }
    }
    tile_out(acc, summ, NT, q8_1, y, ys, n_rows);
}

/* ---- prefill over two groups (8 rows) -------------------------------------------------------------
 * gemm_groups = 2 (gemm.h): MUL_MAT hands this level two consecutive groups per call. Both are
 * unpacked once per call into w8 [nb][8][32] (quants, as unpack_q32) and their scales converted once
 * into d8 [nb][8] (and m8 [nb][8] for Q4_1 / Q5_1) f32, rows 0..3 from the first group. A tile is
 * then 8 rows x 1 token: per (token, block) one d_y conversion, one mul for the 8 rows' d_x·d_y, one
 * maddubs for the offset sums (and Q8_1's Σ m·s as one 8-lane fma), shared by 8 rows instead of 4;
 * per (row, token, block) the same maddubs, i16 subtract, madd, cvt and fma with the broadcast
 * d_x·d_y as tile_q32u. 8 accumulators + the weight, a temporary, ones, the activation, the offset
 * sums and the d broadcast stay in the 16 ymm registers (no spills). */
#define W8_R (2 * Q32_R)

static ALWAYS_INLINE void unpack_q32x2(const int type, const int64_t nb, const uint8_t *g0, const uint8_t *g1,
                                       uint8_t *w8, float *d8, float *m8) {
    const int nsc = q32_nsc(type);
    for (int h = 0; h < 2; h++) {
        const uint8_t *grp = h ? g1 : g0;
        unpack_q32(type, nb, grp, w8 + 128 * h, 256);
        for (int64_t ib = 0; ib < nb; ib++) { /* sc: d of rows 0..3, then (Q4_1 / Q5_1) m (gemm_q32.h) */
            const uint8_t *sc = grp + ib * 8 * nsc;
            _mm_storeu_ps(d8 + ib * W8_R + 4 * h, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)sc)));
            if (nsc == 2) _mm_storeu_ps(m8 + ib * W8_R + 4 * h, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(sc + 8))));
        }
    }
}

static ALWAYS_INLINE void tile_q32x2(const int type, const int64_t nb, const uint8_t *w8, const float *d8,
                                     const float *m8, const uint8_t *x, float *y, const int n_rows) {
    const int q8_1 = q32_nsc(type) == 2;
    const size_t ybs = q8_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const int yqo = q8_1 ? 4 : 2;
    const int off = q32_off(type);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i offv = _mm256_set1_epi8((char)off);
    __m256 acc[W8_R];
    __m256 summ = _mm256_setzero_ps();                    /* Σ m·s, lane r = row r */
    for (int r = 0; r < W8_R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t *yb = x + (size_t)ib * ybs;
        /* d_y: cvtph of the block's first 4 halves (d, then 3 halves of other fields), lane 0 */
        const __m128 dy = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)yb));
        _Alignas(32) float dp[W8_R];                      /* d_x·d_y of rows 0..7 */
        _mm256_store_ps(dp, _mm256_mul_ps(_mm256_loadu_ps(d8 + ib * W8_R), _mm256_broadcastss_ps(dy)));
        if (q8_1) summ = _mm256_fmadd_ps(_mm256_loadu_ps(m8 + ib * W8_R), _mm256_broadcastss_ps(_mm_movehdup_ps(dy)), summ);
        const __m256i yq = loadu256(yb + yqo);
        const __m256i yo = off ? _mm256_maddubs_epi16(offv, yq) : _mm256_setzero_si256();
        const uint8_t *wb = w8 + ib * 256;
        for (int r = 0; r < W8_R; r++) {
            __m256i p = _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(wb + 32 * r)), yq);
            if (off) p = _mm256_sub_epi16(p, yo);         /* exact in i16 (tile_q32u) */
            const __m256i i32 = _mm256_madd_epi16(p, ones);
            acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dp[r]), _mm256_cvtepi32_ps(i32), acc[r]);
        }
    }
    /* the 8 rows' sums in one vector (hsum8_ps: each lane hsum_ps's bits), + Σ m·s, then the rows wanted */
    __m256 res = hsum8_ps(acc);
    if (q8_1) res = _mm256_add_ps(res, summ);
    if (n_rows == W8_R) {
        _mm256_storeu_ps(y, res);
    } else {
        _Alignas(32) float rs[W8_R];
        _mm256_store_ps(rs, res);
        for (int r = 0; r < n_rows; r++) y[r] = rs[r];
    }
}

/* One group (n_rows <= 4). */
static ALWAYS_INLINE void gemm_q32_1(const int type, const int64_t nb, const uint8_t *g, const int n_rows,
                                     const uint8_t *xb, const size_t x_stride, const int n_x, float *y,
                                     const int64_t y_stride) {
    int j = 0;
    if (n_x > SMALL_NX && !q32_signed(type) && nb <= WQ_NB_MAX) {
        _Alignas(32) uint8_t wq[WQ_NB_MAX * 128];
        unpack_q32(type, nb, g, wq, 128);
        for (; j + NTU <= n_x; j += NTU) {
            tile_q32u(type, NTU, nb, g, wq, xb + (size_t)j * x_stride, x_stride, y + (int64_t)j * y_stride, y_stride, n_rows);
        }
        if (j + 2 <= n_x) {
            tile_q32u(type, 2, nb, g, wq, xb + (size_t)j * x_stride, x_stride, y + (int64_t)j * y_stride, y_stride, n_rows);
            j += 2;
        }
        if (j < n_x) tile_q32u(type, 1, nb, g, wq, xb + (size_t)j * x_stride, x_stride, y + (int64_t)j * y_stride, y_stride, n_rows);
        return;
    }
    const int stream = n_x <= SMALL_NX; /* up to SMALL_NX tokens the group comes from memory once */
    for (; j + GEMM_NT <= n_x; j += GEMM_NT) {
        tile_q32(type, GEMM_NT, nb, g, xb + (size_t)j * x_stride, x_stride, y + (int64_t)j * y_stride, y_stride, n_rows,
                 stream);
    }
    if (j + 2 <= n_x) {
        tile_q32(type, 2, nb, g, xb + (size_t)j * x_stride, x_stride, y + (int64_t)j * y_stride, y_stride, n_rows, stream);
        j += 2;
    }
    if (j < n_x) {
        tile_q32(type, 1, nb, g, xb + (size_t)j * x_stride, x_stride, y + (int64_t)j * y_stride, y_stride, n_rows, stream);
    }
}

/* n_rows <= 8: one group, or (n_rows > 4) two consecutive groups, group_bytes apart (gemm_groups) */
static ALWAYS_INLINE void gemm_q32_avx2(const int type, int64_t K, const void *group, int n_rows,
                                        const void *x, size_t x_stride, int n_x, float *y, int64_t y_stride) {
    const int64_t nb = K / 32;
    const uint8_t *g = (const uint8_t *)group;
    const uint8_t *xb = (const uint8_t *)x;
    if (n_rows <= Q32_R) {
        gemm_q32_1(type, nb, g, n_rows, xb, x_stride, n_x, y, y_stride);
        return;
    }
    const size_t gb = q32_group_bytes(type, nb);
    if (n_x > SMALL_NX && !q32_signed(type) && nb <= WQ_NB_MAX) {
        _Alignas(32) uint8_t w8[WQ_NB_MAX * 256];
        _Alignas(32) float d8[WQ_NB_MAX * W8_R], m8[WQ_NB_MAX * W8_R];
        unpack_q32x2(type, nb, g, g + gb, w8, d8, m8);
        for (int j = 0; j < n_x; j++) {
            tile_q32x2(type, nb, w8, d8, m8, xb + (size_t)j * x_stride, y + (int64_t)j * y_stride, n_rows);
        }
        return;
    }
    gemm_q32_1(type, nb, g, Q32_R, xb, x_stride, n_x, y, y_stride);
    gemm_q32_1(type, nb, g + gb, n_rows - Q32_R, xb, x_stride, n_x, y + Q32_R, y_stride);
}

/* ---- Q4_0 and IQ4_NL in llama.cpp's repacked order -------------------------------------------------
 * On AVX2 (and AVX-512) llama.cpp repacks Q4_0 and IQ4_NL weights at load (CPU_REPACK, q4_0_8x8 /
 * iq4_nl_8x8, one template for both) and runs ggml_gemv / ggml_gemm_<type>_8x8_q8_0 for every batch
 * size: per (row, 32-block) the whole block's integer Σ w·y (w = q - 8, or IQ4_NL's level), then
 * acc = fma(f32(isum), f32(d_w)·f32(d_y), acc) in block order, one f32 accumulator per (row, token),
 * no horizontal sum. dot_avx2.c's vec_dots and these kernels give that, bit for bit with each other
 * (the integers are exact whatever their order). A call holds up to 2·Q4B_SETS groups (64 rows,
 * gemm_groups = 16), 8-row sets, rows in the 8 lanes of a vector:
 *   - n_x <= X8_SMALL_NX (decode, a batched decode step of up to 8 sequences; IQ4_NL 6): per group and block, from
 *     the quants in word pairs (gemm_q32.h): per pair vector j one 8-byte broadcast of the token's
 *     words 2j, 2j + 1 serves the 4 rows (Q4_0: maddubs(q, y) of the unsigned nibbles, the 4
 *     summed in i16, one madd; IQ4_NL: the sign trick on the levels, a madd each), giving lane 2r + g
 *     row r's sum over its words 2j + g; a decode joins two blocks' lanes by one vphaddd + vpermq into
 *     the 4 rows' isums of both (q4b_gemv1), Q4_0 then less 8·Σy (made once per call for the token's
 *     blocks, with d_y as f32, 4 copies each). The quants were one vector per row before, each row's 8 i32
 *     lanes summed by a 4-row tree of unpacks and adds (4 madds and 11 instructions per 4 rows and
 *     block; llvm-mca -mcpu=znver3: the FP pipes are the bound): a standalone copy, one thread,
 *     K = 1536, 512 rows from L2, 2.72 -> 2.19 cycles per (row, block) for Q4_0, 3.43 -> 3.30 for
 *     IQ4_NL. A batched step goes group by group in passes of 2 token pairs (q4b_gemv_pairs): per
 *     block the quants unpacked and d widened once for the pass, a pair's two tokens joined by the
 *     vphaddd + vpermq (one block, 2 tokens) into one accumulator register; the group is read from
 *     memory once (the first pass prefetches ahead) and from L1 by the next. The tokens went one after
 *     the other over all the call's groups first (64 rows, from L2 after the first token; the
 *     transposing tile from 4 tokens on): `llmrt bench synthetic-0.4b-q4_0.gguf -t 2 -p N -n 0 -r 15`,
 *     alternated 3 times, t/s before / after: pp2 85-103 / 108-136, pp3 99-116 / 120-163, pp4 113-135
 *     / 152-168, pp5 117-139 / 124-174 (passes of up to 4 tokens, 2 blocks at a time, the tile from 7
 *     tokens on). Those passes kept 8 quant vectors and 4 accumulators live, and GCC kept the
 *     accumulators on the stack; the pairs: `benchmarks/matmul.py -t 1 --packed-only --type Q4_0 -n 1
 *     2 4 6`, 1536 x 4096 (L3), min of 5 alternated rounds, ms: n = 2 0.294 -> 0.261, n = 4 0.535 ->
 *     0.458, n = 6 0.803 -> 0.693 (n = 1 0.183 / 0.173); a serving step of 8 sequences
 *     (`Model.eval_sessions`, 2 rounds, the Q4_0 matmuls) 42.2-46.1 ms in the tile, 38.7 in the pairs,
 *     so the GEMV up to 8 tokens;
 *   - more tokens (prefill, and batched decode steps from 9 sequences on, IQ4_NL 7): the block's quants
 *     transposed once per call (lane r of vector c = row r's weights 4c..4c+3: from the word pairs,
 *     one shufps + vpermq per vector c for 8 rows) as int8 w. Q4_0: w =
 *     q - 8 in [-8, 7], the activations staged as y + 128 (xor 0x80: unsigned) for Q4B_NT tokens;
 *     per (token, block) 8 vpbroadcastd + 8 maddubs(y + 128, w) summed in i16 onto -128·Σw of
 *     the i16 lane's 16 weights (made at the transpose; every partial sum is Σ_seen y·w -
 *     128·Σ_unseen w, |.| <= 16·128·8 = 16384, and a pair (y + 128)·w <= 2·255·8: no wrap, no
 *     saturation), one madd to i32. IQ4_NL (levels up to 127: a pair of (y + 128)·w could
 *     saturate): the activations as they are, per 4 elements maddubs(|w|, sign(y, w)) (|pair| <=
 *     2·127·127) and a madd into i32. Then cvt, fma with the 8 rows' d_w times d_y. Q4_0 spends 9
 *     multiplies per 256 multiply-adds instead of tile_q32x2's 16 (Zen 3, 1 thread, a standalone
 *     copy: 76 vs 44 G/s).
 *     A token tile is staged once for all the call's sets (staging was ~20 % of the kernel's time
 *     with one set per call), and the two sets run in one tile, each activation broadcast serving
 *     both: per activation word 2 weight loads + 4 broadcasts feed 8 maddubs instead of 1 + 4
 *     feeding 4 (llvm-mca -mcpu=znver3 has the vector loads as the bound with the FP pipes just
 *     under it). `benchmarks/matmul.py -t 1 -n 64 --packed-only`, 1536 x 4096, min of 6 alternated
 *     rounds: Q4_0 5.21 -> 4.82 ms, IQ4_NL 8.36 -> 7.67 ms.
 *     The staging (y + 128 copied aligned, d_y widened) is per call, and it cost as much as 14 % of
 *     the kernel with 16 rows per call (a standalone copy of the kernel, 1536 x 4096 x 64 tokens,
 *     with the staging skipped: 4.40 -> 3.82 ms), so a call now takes 8 sets (64 rows): the tile
 *     still runs the sets two at a time on the staged tokens. With the correction folded into the
 *     sums' start (no vpsubd per token and set): the same copy, 4.43 -> 3.84-3.97 ms; end to end
 *     (`llmrt bench -p 512 -n 0`, alternated, t/s) 0.4b Q4_0 315-318 -> 376-377, 1.5b 97-98 ->
 *     116-122.
 * The i16 (Q4_0) and i32 (IQ4_NL) sums of a tile are pinned to one register each per (token, step)
 * (PIN_REG, simd_avx2.h; Q4_0's maddubs + add is one asm, MADDUBS_ADD16, whose add writes the
 * sum's own register: with the pin alone GCC wrote it elsewhere and copied it back): integer adds
 * are associative, and GCC -O3 otherwise rebuilt each token's chain of 8 adds as a tree over all
 * 32 maddubs results of the block, spilling most of them to the stack (61 ymm stores in the
 * kernel, 13 pinned). `benchmarks/matmul.py -t 1 -n 64 --packed-only`, 1536 x 4096, three
 * alternated rounds: Q4_0 6.64-6.79 -> 5.22-5.32 ms, 576 x 1536 0.95-1.00 ->
 * 0.78-0.81 ms; and with it the tile beats the GEMV from 3 tokens on with the weights in L3 (n = 3
 * / 4: 0.62 / 0.82 -> 0.52 / 0.57 ms). End to end, weights from DRAM, the token-by-token GEMV
 * then kept 3 tokens (the GEMV streams each group with its arithmetic, the tile transposes a
 * call's weights in one burst first); the GEMV over token pairs (above) keeps 8. */
#ifndef X8_SMALL_NX
#define X8_SMALL_NX 8 /* up to this many tokens the GEMV (no transpose to repay): decode, batched steps in pairs */
#endif
#ifndef X8_SMALL_NX_IQ4NL
#define X8_SMALL_NX_IQ4NL 6 /* IQ4_NL's bound (<= X8_SMALL_NX): its pair passes spill (the level table and
                             * the sign trick take registers) and lose more to the tile in L3 than Q4_0's
                             * (`matmul.py -t 1 --packed-only -n 7 8`, 1536 x 4096, pairs / tile ms: IQ4_NL
                             * 1.29 / 0.97, 1.35 / 1.05; Q4_0 0.92 / 0.71, 0.90 / 0.77); only Q4_0's were
                             * timed in a serving step, where they won at 8 */
#endif
_Static_assert(X8_SMALL_NX_IQ4NL <= X8_SMALL_NX, "the GEMV's arrays hold X8_SMALL_NX tokens");
#define Q4B_NT 4    /* tokens per prefill tile (4 accumulators, 4 integer sums) */
#define Q4B_CB 64   /* blocks per transposed chunk (K <= 2048 in one; a set's chunk is 16 KB, 128 KB
                     * of stack for a call's 8 sets) */
#define Q4B_TT 64   /* tokens per pass over a longer row's chunks (each chunk transposed once per pass) */
#ifndef Q4B_SETS
#define Q4B_SETS 8  /* 8-row sets per call (gemm_groups = 2 * Q4B_SETS) */
#endif

/* the 8 rows' d of block ib (rows 4..7 zero without a second group) */
static ALWAYS_INLINE __m256 q4b_d8(const uint8_t *g0, const uint8_t *g1, int64_t ib) {
    const __m128 d0 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(g0 + ib * 8)));
    const __m128 d1 = g1 ? _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(g1 + ib * 8))) : _mm_setzero_ps();
    return _mm256_set_m128(d1, d0);
}

#define Q4BG_PF_BYTES GEMV_PF_BYTES
#define Q4BG_MAX_NX X8_SMALL_NX
#define Q4BG_MAX_GROUPS (2 * Q4B_SETS)
#include "q4b_gemv.inc" /* q4b_gemv1, q4b_gemv_pairs, q4b_gemv_small */

/* blocks [ib0, ib0 + cb) of the 8 rows transposed (wt[b * 8 + c]: lane r = row r's int8 weights of
 * elements 4c..4c+3), Q4_0's -128·Σ(q - 8) over each i16 lane's 16 weights (corr[b]: the start of
 * the tile's i16 sums) and the rows' d (d8[b]). From the word pairs: word c = 2j + g of rows 0..3 is
 * lanes 2r + g of group g0's pair vector j, of rows 4..7 the same of g1's; one shufps picks them
 * ([g0 r0 r1, g1 r0 r1 | g0 r2 r3, g1 r2 r3]) and one vpermq puts the rows in order. */
static ALWAYS_INLINE void q4b_unpack(const int type, int64_t nb, const uint8_t *g0, const uint8_t *g1, int64_t ib0,
                                     int cb, __m256i *wt, __m256i *corr, __m256 *d8) {
    const __m256i off = _mm256_set1_epi8(8), one8 = _mm256_set1_epi8(1);
    for (int b = 0; b < cb; b++) {
        __m256i p0[4], p1[4];
        q32_block_pairs(type, nb, g0, ib0 + b, p0);
        if (g1) q32_block_pairs(type, nb, g1, ib0 + b, p1);
        else p1[0] = p1[1] = p1[2] = p1[3] = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256 a = _mm256_castsi256_ps(p0[j]), c = _mm256_castsi256_ps(p1[j]);
            wt[8 * b + 2 * j] = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(a, c, 0x88)), 0xD8);
            wt[8 * b + 2 * j + 1] = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(a, c, 0xDD)), 0xD8);
        }
        if (type == LLMRT_TYPE_Q4_0) {
            __m256i s16 = _mm256_setzero_si256();
            for (int c = 0; c < 8; c++) {
                wt[8 * b + c] = _mm256_sub_epi8(wt[8 * b + c], off);
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(one8, wt[8 * b + c]));
            }
            corr[b] = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, 7));
        }
        d8[b] = q4b_d8(g0, g1, ib0 + b);
    }
}

/* NT tokens (staged in ya / dy) x NS 8-row sets over cb transposed blocks, into acc[s][0..NT): each
 * activation broadcast (a load and a vector-pipe uop on Zen 3) serves the NS sets */
static ALWAYS_INLINE void q4b_tile(const int type, const int NS, const int NT, int cb, __m256i *const *wt,
                                   __m256i *const *corr, __m256 *const *d8, const uint8_t (*ya)[Q4B_CB * 32],
                                   const float (*dy)[Q4B_CB], __m256 (*acc)[Q4B_NT]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 a[2][Q4B_NT];
    for (int s = 0; s < NS; s++)
        for (int t = 0; t < NT; t++) a[s][t] = acc[s][t];
    for (int b = 0; b < cb; b++) {
        __m256i isum[2][Q4B_NT];
        if (type == LLMRT_TYPE_Q4_0) {
            __m256i s16[2][Q4B_NT];
            for (int s = 0; s < NS; s++)
                for (int t = 0; t < NT; t++) s16[s][t] = _mm256_load_si256(&corr[s][b]);
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                __m256i w[2];
                for (int s = 0; s < NS; s++) w[s] = _mm256_load_si256(&wt[s][8 * b + c]);
                for (int t = 0; t < NT; t++) {
                    int32_t y4;
                    memcpy(&y4, ya[t] + 32 * b + 4 * c, 4);
                    const __m256i yv = _mm256_set1_epi32(y4);
                    for (int s = 0; s < NS; s++) MADDUBS_ADD16(s16[s][t], yv, w[s]);
                }
            }
            for (int s = 0; s < NS; s++)
                for (int t = 0; t < NT; t++) isum[s][t] = _mm256_madd_epi16(s16[s][t], ones);
        } else {
            for (int s = 0; s < NS; s++)
                for (int t = 0; t < NT; t++) isum[s][t] = _mm256_setzero_si256();
            for (int c = 0; c < 8; c++) {
                __m256i w[2], aw[2];
                for (int s = 0; s < NS; s++) {
                    w[s] = _mm256_load_si256(&wt[s][8 * b + c]);
                    aw[s] = _mm256_sign_epi8(w[s], w[s]);
                }
                for (int t = 0; t < NT; t++) {
                    int32_t y4;
                    memcpy(&y4, ya[t] + 32 * b + 4 * c, 4);
                    const __m256i yv = _mm256_set1_epi32(y4);
                    for (int s = 0; s < NS; s++) {
                        const __m256i p = _mm256_maddubs_epi16(aw[s], _mm256_sign_epi8(yv, w[s]));
                        isum[s][t] = _mm256_add_epi32(isum[s][t], _mm256_madd_epi16(p, ones));
                        PIN_REG(isum[s][t]);
                    }
                }
            }
        }
        for (int t = 0; t < NT; t++) {
            const __m256 dyt = _mm256_set1_ps(dy[t][b]);
            for (int s = 0; s < NS; s++)
                a[s][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[s][t]), _mm256_mul_ps(d8[s][b], dyt), a[s][t]);
        }
    }
    for (int s = 0; s < NS; s++)
        for (int t = 0; t < NT; t++) acc[s][t] = a[s][t];
}

/* ---- Q8_0 decode in block order, for the avx512_vnni level ------------------------------------------
 * That level sums Q8_0 in the block order (gemm_q32_w.inc: per block the exact integer Σ w·y, acc =
 * fma(f32(isum), d_w·d_y, acc)); this level keeps llama.cpp's lane order. Its decode runs here, in
 * VEX-encoded AVX2, because the same loop with vpdpbusd (xor 0x80 and one vpdpbusd per row and block
 * instead of the sign trick's four instructions) read memory more slowly on a Zen 4 EPYC with both
 * cores on it, though it computes faster from L3: model-shaped chains of 1536 x 1536 / 1536 x 4096
 * Q8_0 GEMVs from memory, 2 threads, four alternated rounds, GB/s: vpdpbusd 34.5 / 34.0 / 31.7 / 27.8
 * and 32.5 / 33.1 / 23.5 / 29.3, this loop 35.8 / 36.6 / 32.8 / 32.5 and 37.1 / 35.8 / 33.1 / 32.5
 * (the avx2 level's lane-order GEMV 36.9 / 34.8 / 38.8 / 30.9 and 35.3 / 35.2 / 40.4 / 32.5). Group by
 * group (each streamed once, prefetched GEMV_PF_BYTES ahead), two blocks per step: each row's block
 * in 8 lanes (dot_i8_i8, exact), the 4 rows' lanes summed by two levels of vphaddd into halves that
 * the two blocks' permutes add into [ib: rows 0..3 | ib + 1: rows 0..3], one cvt and mul, the two
 * fmas in turn (as q4b_gemv1). */
#define Q8B_CB 1024 /* blocks per staged chunk of the token (d_y, 4 copies: 16 KB) */
#define Q8B_G 16    /* groups per pass (their accumulators) */

/* block ib's sums of a group's 4 rows against the token's activations Y: [rows 0..3 | rows 0..3] halves */
static ALWAYS_INLINE __m256i q8b_sums4(const uint8_t *qs, __m256i Y) {
    __m256i L[Q32_R];
    for (int r = 0; r < Q32_R; r++) L[r] = dot_i8_i8(_mm256_load_si256((const __m256i *)(qs + 32 * r)), Y);
    return _mm256_hadd_epi32(_mm256_hadd_epi32(L[0], L[1]), _mm256_hadd_epi32(L[2], L[3]));
}

void llmrt_gemv_q8_0_blk_avx2(int64_t K, const void *group, int n_rows, const void *x, float *y) {
    const int64_t nb = K / 32;
    const size_t gb = q32_group_bytes(LLMRT_TYPE_Q8_0, nb);
    const size_t qo = q32_qs_off(LLMRT_TYPE_Q8_0, nb);
    const int ngr = (n_rows + Q32_R - 1) / Q32_R;
    const block_q8_0 *xq = (const block_q8_0 *)x;
    _Alignas(32) float dy[Q8B_CB][4];
    for (int g0 = 0; g0 < ngr; g0 += Q8B_G) {
        const int ng = ngr - g0 < Q8B_G ? ngr - g0 : Q8B_G;
        __m128 acc[Q8B_G];
        for (int g = 0; g < ng; g++) acc[g] = _mm_setzero_ps();
        for (int64_t ib0 = 0; ib0 < nb; ib0 += Q8B_CB) {
            const int cb = nb - ib0 < Q8B_CB ? (int)(nb - ib0) : Q8B_CB;
            for (int b = 0; b < cb; b++) _mm_store_ps(dy[b], _mm_set1_ps(f16(xq[ib0 + b].d)));
            for (int g = 0; g < ng; g++) {
                const uint8_t *gg = (const uint8_t *)group + (size_t)(g0 + g) * gb;
                __m128 a = acc[g];
                int b = 0;
                for (; b + 2 <= cb; b += 2) {
                    const int64_t ib = ib0 + b;
                    {   /* the groups lie back to back: a hint GEMV_PF_BYTES ahead, never a read */
                        const uintptr_t pa = (uintptr_t)gg + GEMV_PF_BYTES + (uintptr_t)ib * (Q32_R * (2 + 32));
                        for (int o = 0; o < 2 * Q32_R * (2 + 32); o += 64) _mm_prefetch((const char *)(pa + o), _MM_HINT_T0);
                    }
                    const __m256i h0 = q8b_sums4(gg + qo + ib * 128, loadu256(xq[ib].qs));
                    const __m256i h1 = q8b_sums4(gg + qo + (ib + 1) * 128, loadu256(xq[ib + 1].qs));
                    const __m256i isum = _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20),
                                                          _mm256_permute2x128_si256(h0, h1, 0x31));
                    const __m256 f = _mm256_cvtepi32_ps(isum);
                    const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gg + ib * 8))),
                                                   _mm256_load_ps(dy[b]));
                    a = _mm_fmadd_ps(_mm256_castps256_ps128(f), _mm256_castps256_ps128(d), a);
                    a = _mm_fmadd_ps(_mm256_extractf128_ps(f, 1), _mm256_extractf128_ps(d, 1), a);
                }
                if (b < cb) { /* an odd last block */
                    const int64_t ib = ib0 + b;
                    const __m256i h = q8b_sums4(gg + qo + ib * 128, loadu256(xq[ib].qs));
                    const __m128i isum = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
                    const __m128 d = _mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(gg + ib * 8))),
                                                _mm_load_ps(dy[b]));
                    a = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), d, a);
                }
                acc[g] = a;
            }
        }
        for (int g = 0; g < ng; g++) {
            _Alignas(16) float out[4];
            _mm_store_ps(out, acc[g]);
            for (int r = 0; r < Q32_R && (g0 + g) * Q32_R + r < n_rows; r++) y[(g0 + g) * Q32_R + r] = out[r];
        }
    }
}

static ALWAYS_INLINE void gemm_x8_avx2(const int type, int64_t K, const void *group, int n_rows, const void *x,
                                       size_t x_stride, int n_x, float *y, int64_t y_stride) {
    const int64_t nb = K / 32;
    const size_t gb = q32_group_bytes(type, nb);
    const int ngr = (n_rows + Q32_R - 1) / Q32_R; /* groups in this call */
    const int nset = (ngr + 1) / 2;               /* 8-row sets */
    const uint8_t *xb = (const uint8_t *)x;
    const int small_nx = type == LLMRT_TYPE_IQ4_NL ? X8_SMALL_NX_IQ4NL : X8_SMALL_NX;
    if (n_x <= small_nx) { /* decode (q4b_gemv1), a batched decode step (passes of 2 token pairs, q4b_gemv_pairs) */
        q4b_gemv_small(type, nb, group, gb, ngr, n_rows, xb, x_stride, n_x, y, y_stride);
        return;
    }
    const uint8_t *ga[Q4B_SETS], *gz[Q4B_SETS]; /* each set's two groups (the second NULL past the call) */
    for (int s = 0; s < nset; s++) {
        ga[s] = (const uint8_t *)group + (size_t)(2 * s) * gb;
        gz[s] = 2 * s + 1 < ngr ? ga[s] + gb : NULL;
    }
    _Alignas(32) __m256i wt[Q4B_SETS][Q4B_CB * 8], corr[Q4B_SETS][Q4B_CB];
    _Alignas(32) __m256 d8[Q4B_SETS][Q4B_CB];
    _Alignas(32) uint8_t ya[Q4B_NT][Q4B_CB * 32];   /* the tokens' y (Q4_0: y + 128), staged once for all sets */
    float dy[Q4B_NT][Q4B_CB];
    const int once = nb <= Q4B_CB; /* else chunks of Q4B_CB blocks, each transposed once per Q4B_TT tokens */
    if (once)
        for (int s = 0; s < nset; s++) q4b_unpack(type, nb, ga[s], gz[s], 0, (int)nb, wt[s], corr[s], d8[s]);
    const __m256i k80 = _mm256_set1_epi8(type == LLMRT_TYPE_Q4_0 ? (char)0x80 : 0);
    for (int t00 = 0; t00 < n_x; t00 += Q4B_TT) {
        const int ntt = n_x - t00 < Q4B_TT ? n_x - t00 : Q4B_TT;
        _Alignas(32) float accb[Q4B_TT][8 * Q4B_SETS];  /* the accumulators between chunks */
        memset(accb, 0, sizeof(accb));
        for (int64_t ib0 = 0; ib0 < nb; ib0 += Q4B_CB) {
            const int cb = nb - ib0 < Q4B_CB ? (int)(nb - ib0) : Q4B_CB;
            if (!once)
                for (int s = 0; s < nset; s++) q4b_unpack(type, nb, ga[s], gz[s], ib0, cb, wt[s], corr[s], d8[s]);
            for (int t0 = 0; t0 < ntt; t0 += Q4B_NT) {
                const int nt = ntt - t0 < Q4B_NT ? ntt - t0 : Q4B_NT;
                for (int t = 0; t < nt; t++) {
                    const block_q8_0 *yr = (const block_q8_0 *)(xb + (size_t)(t00 + t0 + t) * x_stride) + ib0;
                    for (int b = 0; b < cb; b++) {
                        _mm256_store_si256((__m256i *)(ya[t] + 32 * b), _mm256_xor_si256(loadu256(yr[b].qs), k80));
                        dy[t][b] = f16(yr[b].d);
                    }
                }
                /* the sets two at a time (one broadcast per activation word for both), a last one alone */
                for (int s0 = 0; s0 < nset; s0 += 2) {
                    const int ns = nset - s0 < 2 ? 1 : 2;
                    __m256 acc[2][Q4B_NT] = { { _mm256_setzero_ps() } }; /* (a tile reads only its nt, ns) */
                    __m256i *wts[2] = { wt[s0], wt[s0 + ns - 1] }, *cs[2] = { corr[s0], corr[s0 + ns - 1] };
                    __m256 *ds[2] = { d8[s0], d8[s0 + ns - 1] };
                    for (int s = 0; s < ns; s++)
                        for (int t = 0; t < nt; t++) acc[s][t] = _mm256_load_ps(&accb[t0 + t][8 * (s0 + s)]);
                    /* constant set and token counts per tile: its sums and accumulators stay in registers */
#define Q4B_TILE(NS_)                                                                            \
                    switch (nt) {                                                                \
                    case 4: q4b_tile(type, NS_, 4, cb, wts, cs, ds, ya, dy, acc); break;         \
                    case 3: q4b_tile(type, NS_, 3, cb, wts, cs, ds, ya, dy, acc); break;         \
                    case 2: q4b_tile(type, NS_, 2, cb, wts, cs, ds, ya, dy, acc); break;         \
                    default: q4b_tile(type, NS_, 1, cb, wts, cs, ds, ya, dy, acc); break;        \
                    }
                    if (ns == 2) { Q4B_TILE(2) } else { Q4B_TILE(1) }
#undef Q4B_TILE
                    for (int s = 0; s < ns; s++)
                        for (int t = 0; t < nt; t++) _mm256_store_ps(&accb[t0 + t][8 * (s0 + s)], acc[s][t]);
                }
            }
        }
        for (int t = 0; t < ntt; t++)
            for (int r = 0; r < n_rows; r++) y[(int64_t)(t00 + t) * y_stride + r] = accb[t][r];
    }
}

static void gemm_q4_0_q8_0_x8_avx2(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                                   float *y, int64_t y_stride) {
    gemm_x8_avx2(LLMRT_TYPE_Q4_0, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}

static void gemm_iq4_nl_q8_0_x8_avx2(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride,
                                     int n_x, float *y, int64_t y_stride) {
    gemm_x8_avx2(LLMRT_TYPE_IQ4_NL, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}

/* for the avx512_vnni level, which reproduces these bits (gemm_q32_w.inc) */
#define Q32_GEMM_EXPORT(t, fn)                                                                      \
    void llmrt_gemm_##t##_avx2(int64_t K, const void *group, int n_rows, const void *x,              \
                               size_t x_stride, int n_x, float *y, int64_t y_stride) {              \
        fn(K, group, n_rows, x, x_stride, n_x, y, y_stride);                                        \
    }
#define Q32_GEMM(T, t, tx)                                                                          \
    static void gemm_##t##_##tx##_avx2(int64_t K, const void *group, int n_rows, const void *x,     \
                                       size_t x_stride, int n_x, float *y, int64_t y_stride) {      \
        gemm_q32_avx2(LLMRT_TYPE_##T, K, group, n_rows, x, x_stride, n_x, y, y_stride);             \
    }                                                                                               \
    Q32_GEMM_EXPORT(t, gemm_##t##_##tx##_avx2)
Q32_GEMM_EXPORT(q4_0, gemm_q4_0_q8_0_x8_avx2)     /* llama.cpp's repacked order */
Q32_GEMM_EXPORT(iq4_nl, gemm_iq4_nl_q8_0_x8_avx2) /* likewise */
Q32_GEMM(Q4_1, q4_1, q8_1)
Q32_GEMM(Q5_0, q5_0, q8_0)
Q32_GEMM(Q5_1, q5_1, q8_1)
Q32_GEMM(Q8_0, q8_0, q8_0)
Q32_GEMM(WQ_Q8A, q8a, q8_1)

#endif /* __x86_64__ */

void llmrt_register_gemm_kernels_avx2(llmrt_kernel_table *kt) {
#if defined(__x86_64__)
#define REG(T, fn) do { kt->gemm[LLMRT_TYPE_##T] = fn; kt->gemm_name[LLMRT_TYPE_##T] = #fn; kt->gemm_groups[LLMRT_TYPE_##T] = 1; } while (0)
    REG(Q4_0, gemm_q4_0_q8_0_x8_avx2); /* llama.cpp's repacked order (above) */
    REG(Q4_1, gemm_q4_1_q8_1_avx2);
    REG(Q5_0, gemm_q5_0_q8_0_avx2);
    REG(Q5_1, gemm_q5_1_q8_1_avx2);
    REG(Q8_0, gemm_q8_0_q8_0_avx2);
    REG(IQ4_NL, gemm_iq4_nl_q8_0_x8_avx2); /* likewise */
    REG(WQ_Q8A, gemm_q8a_q8_1_avx2);
    /* more groups per call: the 8-row prefill tiles (tile_q32x2; q4b_tile, two 8-row sets) */
    kt->gemm_groups[LLMRT_TYPE_Q4_1] = 2;
    kt->gemm_groups[LLMRT_TYPE_Q4_0] = kt->gemm_groups[LLMRT_TYPE_IQ4_NL] = 2 * Q4B_SETS; /* gemm_x8_avx2 */
    kt->gemm_groups[LLMRT_TYPE_Q5_0] = kt->gemm_groups[LLMRT_TYPE_Q5_1] = 2;
#undef REG
#else
    (void)kt;
#endif
}
