/*
 * gemm_k_avx2.c — GEMV/GEMM kernels over packed K-quant rows (Q2_K..Q6_K, IQ4_XS) and float rows
 * (F32, F16, BF16) for the AVX2 level (AVX2 + FMA + F16C). Layouts: ../pack_k.h; contract:
 * llmrt/gemm.h.
 *
 * Each kernel gives, for every (row r, activation row t), the exact bits of the matching
 * dot_avx2.c vec_dot: the integer sums inside a super-block are exact (any order gives the same
 * integers), and the float work is the same operations in the same order on the same values:
 *   - Q4_K: ggml's repacked-q4_K order; per super-block the whole-block integers isum and imin,
 *     then acc = fma(isum, d·dy, acc), accm = fma(imin, dmin·dy, accm), result acc - accm. Here
 *     the 8 rows of a group sit in the 8 f32 lanes, so one vector fma does all 8 rows.
 *   - Q2_K, Q3_K, Q5_K, Q6_K: 8 i32 lanes per super-block (lane k: elements 4k..4k+3 of every
 *     32-element group, times the group's scales), acc = fma(d·dy, lanes, acc) in 8 f32 lanes per
 *     (row, token), hsum at the end (ggml's order); Q2_K/Q5_K also summ = fma(dmin·dy, imin, summ)
 *     in scalar f32, as ggml's -march=native build contracts it, and the result is hsum - summ.
 *   - F32, F16, BF16 (plain rows, pack_k.h): dot_avx2.c's vec_dot_float, one chain of 8 f32 lanes
 *     per (row, token) over steps of 8 (llama.cpp's tinyBLAS order), see tile_float / gemv_float_rows.
 *
 * Speed: a row's quants are unpacked into registers once per super-block and reused for TT
 * activation rows; scales and mins come pre-expanded from the packed layout (no 6-bit unpacking).
 * Prefill (more than 8 tokens) of Q4_K and Q6_K has its own loops (gemm_q4_K_prefill, gemm_q6_K_prefill): a
 * super-block's quants rearranged once per chunk of tokens so that maddubs results of one scale
 * are summed in i16 before the madd by the scale (exact: the bounds are in their comments), which
 * cuts the multiplies (the AVX2 bottleneck here) by half (Q4_K) and a quarter (Q6_K) while every
 * integer and float value stays the GEMV's.
 */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#endif
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "../pack_k.h"

#if defined(__x86_64__)
#include "simd_avx2.h"   /* f16, loadu256/128, hsum_ps, shr_bytes */
#include "gemm_k_simd.h" /* scales16_to_2x8, scales8_to_16, imin8_k4 */

#define TT 8 /* activation rows per tile: each unpacked weight vector is used TT times (8 vs 4:
                   * ~12% fewer instructions per output at n_x = 64, callgrind) */

#define ALWAYS_INLINE inline __attribute__((always_inline))
#ifndef GEMV_K_PF_BYTES
#define GEMV_K_PF_BYTES 2048 /* decode (n_x = 1) prefetch distance */
#endif

/* Decode streams the weights once (groups lie back to back): before row r of block group bg is
 * read, its share of the bytes GEMV_K_PF_BYTES ahead is asked for, ceil(share / 64) lines from
 * its start (a share's last line, when missed, is the next row's first; an address past the
 * weights is never read: uintptr_t arithmetic, a hint only). */
static ALWAYS_INLINE void gemv_prefetch(const uint8_t *bg, int bg_bytes, int r) {
    const int share = bg_bytes / PK_R;
    const uintptr_t a = (uintptr_t)bg + GEMV_K_PF_BYTES + (uintptr_t)(r * share);
    for (int o = 0; o < share; o += 64) _mm_prefetch((const char *)(a + (uintptr_t)o), _MM_HINT_T0);
}

/* activation row j */
#define XROW(x, j, x_stride) ((const void *)((const uint8_t *)(x) + (size_t)(j) * (x_stride)))

/* Σ_s madd(maddubs(q[s], y[32s..]), sc[s]) over the 8 32-element groups of a super-block. The sum
 * is pinned per step (PIN_REG): unpinned, GCC's tree of the 8 products spilled; pinned,
 * `benchmarks/matmul.py -t 1 --packed-only --type Q5_K IQ4_XS -n 1 64`, 1536 x 4096, min of four
 * alternated rounds: Q5_K 0.301 / 8.84 -> 0.281 / 7.73 ms (n = 1 / 64), IQ4_XS 0.385 / 11.25 ->
 * 0.353 / 10.16 ms. */
static inline __m256i isum8(const __m256i *q, const __m256i *sc, const int8_t *q8) {
    __m256i isum = _mm256_setzero_si256();
    for (int s = 0; s < 8; s++) {
        const __m256i p = _mm256_maddubs_epi16(q[s], loadu256(q8 + 32 * s));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, sc[s]));
        PIN_REG(isum);
    }
    return isum;
}

/* isum8 with signed quants (IQ4_XS): the sign trick, as vec_dot_iq4_xs_q8_K_avx2's maddubs_i8_i8
 * (|pair| <= 2·127·128: no saturation) */
static inline __m256i isum8_i8(const __m256i *q, const __m256i *sc, const int8_t *q8) {
    __m256i isum = _mm256_setzero_si256();
    for (int s = 0; s < 8; s++) {
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q[s], q[s]), _mm256_sign_epi8(loadu256(q8 + 32 * s), q[s]));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, sc[s]));
        PIN_REG(isum);
    }
    return isum;
}

/* ---- Q4_K / Q6_K prefill (n_x > 8): quants rearranged once per (chunk of tokens, super-block) --------- */

#define TC 32  /* Q6_K: activation rows per chunk: a row's paired quants and scales are made once per
                * (chunk, super-block) and used for all TC rows; the accumulators (8 rows x TC vectors,
                * 8 KB) and one super-block of paired activations (TC x 8 vectors, 8 KB) stay in L1 */
#define TC4 64 /* Q4_K: activation rows per chunk: the transposed quants (2 KB per group) are made
                * once per (chunk, super-block); acc, accm: 2 vectors per (row, group), 8 KB */

/* 4 bytes at p in every i32 lane */
static ALWAYS_INLINE __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Q4_K, n_x > Q4K_SMALL_NX: the GEMV's float operations on the same values (acc, accm per token with the 8 rows
 * in lanes; the integers isum, imin are exact whatever their order), with the rows in the lanes of
 * the integer work too, so no per-token hsum8 and half the multiplies: per super-block the call's
 * quants (one or two groups) are transposed once per chunk into w[s][g][m] (lane r: quants 32g +
 * 4m .. + 3 of row r of group s), then per tile of K4_NT tokens and 32-group g, 8 steps of: the
 * two groups' w loaded, each token's 4 activation bytes broadcast once for both groups (the
 * broadcast, a load and a vector-pipe uop on Zen 3, was one per maddubs with one group per call),
 * maddubs summed in i16 (|Σ| <= 8·2·15·128 = 30720: exact), then one madd by the group's scales
 * (lane r: row r's) into the tile's i32 sums. `benchmarks/matmul.py -t 1 -n 64 --packed-only --type
 * Q4_K`, three alternated rounds, one group per call -> two: 1536 x 4096 5.23-5.42 -> 4.41-4.95 ms,
 * 2048 x 640 1.00-1.02 -> 0.87-0.94 ms; `llmrt bench -p 512`, alternated, t/s: 0.4b Q4_K_M 294-310
 * -> 337-348, 1.5b 91-92 -> 109-111. */
#define K4_NT 4 /* tokens per tile: 2 x 4 i16 sums + 2 weights + 1 broadcast in registers */

static ALWAYS_INLINE void q4k_tile(const int NS, const int NT, __m256i (*const w)[8][8], const __m256i (*scs)[8],
                                   const uint8_t *xi, size_t x_stride, __m256i (*isums)[K4_NT]) {
    __m256i is[2][K4_NT];
    for (int s = 0; s < NS; s++)
        for (int t = 0; t < NT; t++) is[s][t] = _mm256_setzero_si256();
    for (int g = 0; g < 8; g++) {
        const uint8_t *yq = xi + offsetof(block_q8_K, qs) + 32 * g;
        __m256i s16[2][K4_NT];
        for (int s = 0; s < NS; s++)
            for (int t = 0; t < NT; t++) s16[s][t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int m = 0; m < 8; m++) {
            __m256i wm[2];
            for (int s = 0; s < NS; s++) wm[s] = _mm256_load_si256(&w[s][g][m]);
            for (int t = 0; t < NT; t++) {
                const __m256i yv = bcast4((const int8_t *)(yq + (size_t)t * x_stride + 4 * m));
                for (int s = 0; s < NS; s++) MADDUBS_ADD16(s16[s][t], wm[s], yv);
            }
        }
        for (int s = 0; s < NS; s++)
            for (int t = 0; t < NT; t++) is[s][t] = _mm256_add_epi32(is[s][t], _mm256_madd_epi16(s16[s][t], scs[s][g]));
    }
    for (int s = 0; s < NS; s++)
        for (int t = 0; t < NT; t++) isums[s][t] = is[s][t];
}

static ALWAYS_INLINE void gemm_q4_K_prefill_ns(const int NS, int64_t K, const uint8_t *group, int n_rows,
                                               const uint8_t *x, size_t x_stride, int n_x, float *y, int64_t y_stride) {
    const int64_t nb = K / QK_K;
    const size_t gbytes = pk_group_bytes(nb, Q4K_BG);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i ones = _mm256_set1_epi16(1);
    _Alignas(32) __m256i w[2][8][8]; /* [group][32-group g][step m], 2 KB each: lane r = quants 32g + 4m .. + 3 of row r */
    __m256i scs[2][8];               /* [group][g]: lane r = row r's scale of g in both i16 halves */
    for (int c0 = 0; c0 < n_x; c0 += TC4) {
        const int nc = n_x - c0 < TC4 ? n_x - c0 : TC4;
        const uint8_t *xc = x + (size_t)c0 * x_stride;
        __m256 acc[2][TC4], accm[2][TC4]; /* lane r: row r */
        for (int s = 0; s < NS; s++)
            for (int t = 0; t < nc; t++) acc[s][t] = accm[s][t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *xi = xc + (size_t)i * sizeof(block_q8_K); /* token t's block i: xi + t * x_stride */
            __m256 d8[2], dmin8[2];
            __m256i mk[2][4]; /* lane r: (m_r[2k], m_r[2k+1]) as i16 */
            /* all 8 rows of a group are read (rows past the weight are zeros); lanes r >= n_rows are
             * computed and never stored */
            for (int s = 0; s < NS; s++) {
                const uint8_t *bg = group + (size_t)s * gbytes + i * Q4K_BG;
                for (int j = 0; j < 4; j++) { /* bytes 32j.. of each row: 32-groups 2j (low nibbles), 2j + 1 (high) */
                    __m256i lo[PK_R], hi[PK_R];
                    for (int r = 0; r < PK_R; r++) {
                        const __m256i q4 = loadu256(bg + Q4K_QS + 128 * r + 32 * j);
                        lo[r] = _mm256_and_si256(q4, m4);
                        hi[r] = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
                    }
                    transpose8_epi32(lo, w[s][2 * j]);
                    transpose8_epi32(hi, w[s][2 * j + 1]);
                }
                __m256i s32[PK_R]; /* lane g: row r's scale of 32-group g */
                for (int r = 0; r < PK_R; r++) s32[r] = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(bg + Q4K_SC + 8 * r)));
                transpose8_epi32(s32, scs[s]);
                for (int g = 0; g < 8; g++) scs[s][g] = _mm256_or_si256(scs[s][g], _mm256_slli_epi32(scs[s][g], 16));
                d8[s] = _mm256_cvtph_ps(loadu128(bg + Q4K_D));
                dmin8[s] = _mm256_cvtph_ps(loadu128(bg + Q4K_DMIN));
                for (int k = 0; k < 4; k++) mk[s][k] = _mm256_cvtepu8_epi16(loadu128(bg + Q4K_M + 16 * k));
            }
            for (int t0 = 0; t0 < nc; t0 += K4_NT) {
                const int nt = nc - t0 < K4_NT ? nc - t0 : K4_NT;
                const uint8_t *xt = xi + (size_t)t0 * x_stride;
                __m256i isums[2][K4_NT]; /* lane r: row r's Σ sc·q·y of the super-block */
                switch (nt) { /* constant token counts: the tile's sums stay in registers */
                case 4: q4k_tile(NS, 4, w, scs, xt, x_stride, isums); break;
                case 3: q4k_tile(NS, 3, w, scs, xt, x_stride, isums); break;
                case 2: q4k_tile(NS, 2, w, scs, xt, x_stride, isums); break;
                default: q4k_tile(NS, 1, w, scs, xt, x_stride, isums); break;
                }
                for (int t = 0; t < nt; t++) {
                    const block_q8_K *b = (const block_q8_K *)(xt + (size_t)t * x_stride);
                    /* imin8_k4 with the m vectors hoisted: pair sums pb of the bsums, lane r = Σ_k m·pb */
                    const __m256i pb = _mm256_madd_epi16(loadu256(b->bsums), ones);
                    const __m256i pb16 = _mm256_packs_epi32(pb, pb);
                    const __m256i p0 = _mm256_permutevar8x32_epi32(pb16, _mm256_set1_epi32(0));
                    const __m256i p1 = _mm256_permutevar8x32_epi32(pb16, _mm256_set1_epi32(1));
                    const __m256i p2 = _mm256_permutevar8x32_epi32(pb16, _mm256_set1_epi32(4));
                    const __m256i p3 = _mm256_permutevar8x32_epi32(pb16, _mm256_set1_epi32(5));
                    const __m256 dy = _mm256_set1_ps(b->d);
                    for (int s = 0; s < NS; s++) {
                        __m256i imin = _mm256_madd_epi16(mk[s][0], p0);
                        imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mk[s][1], p1));
                        imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mk[s][2], p2));
                        imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mk[s][3], p3));
                        acc[s][t0 + t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isums[s][t]), _mm256_mul_ps(d8[s], dy), acc[s][t0 + t]);
                        accm[s][t0 + t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin8[s], dy), accm[s][t0 + t]);
                    }
                }
            }
        }
        for (int t = 0; t < nc; t++) {
            float *yr = y + (int64_t)(c0 + t) * y_stride;
            for (int s = 0; s < NS; s++) {
                float out[PK_R];
                _mm256_storeu_ps(out, _mm256_sub_ps(acc[s][t], accm[s][t]));
                for (int r = 0; r < PK_R && s * PK_R + r < n_rows; r++) yr[s * PK_R + r] = out[r];
            }
        }
    }
}

static void gemm_q4_K_prefill(int64_t K, const uint8_t *group, int n_rows, const uint8_t *x, size_t x_stride,
                              int n_x, float *y, int64_t y_stride) {
    if (n_rows > PK_R) gemm_q4_K_prefill_ns(2, K, group, n_rows, x, x_stride, n_x, y, y_stride);
    else gemm_q4_K_prefill_ns(1, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}

/* ---- Q4_K: rows in lanes ------------------------------------------------------------------------ */

#ifndef Q4K_SMALL_NX
#define Q4K_SMALL_NX 8 /* up to this many tokens (decode, a batched decode step: one tile of TT) the GEMV
                        * below, each row's quants unpacked once for the tokens; more: gemm_q4_K_prefill,
                        * whose transposes a few tokens do not repay. With the weights in L3 on one thread
                        * the prefill loop is ahead from 5 tokens on, but a serving step reads them from
                        * memory on all threads: synthetic 0.4b Q4_K_M, `Model.eval_sessions` of 6 / 8
                        * sequences, 2 threads, 2 alternated rounds, the Q4_K matmuls (ms) 31.4-38.9 /
                        * 38.3-44.5 in the prefill loop, 21.0-28.5 / 30.9-32.7 here */
#endif

static void gemm_q4_K_avx2(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                           float *y, int64_t y_stride) {
    if (n_x > Q4K_SMALL_NX) {
        gemm_q4_K_prefill(K, (const uint8_t *)group, n_rows, (const uint8_t *)x, x_stride, n_x, y, y_stride);
        return;
    }
    if (n_rows > PK_R) { /* decode, two groups (gemm_groups = 2): one after the other */
        const size_t gbytes = pk_group_bytes(K / QK_K, Q4K_BG);
        gemm_q4_K_avx2(K, group, PK_R, x, x_stride, n_x, y, y_stride);
        gemm_q4_K_avx2(K, (const uint8_t *)group + gbytes, n_rows - PK_R, x, x_stride, n_x, y + PK_R, y_stride);
        return;
    }
    const int64_t nb = K / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int t0 = 0; t0 < n_x; t0 += TT) {
        const int nt = n_x - t0 < TT ? n_x - t0 : TT;
        __m256 acc[TT], accm[TT]; /* lane r: row r */
        for (int t = 0; t < nt; t++) acc[t] = accm[t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *bg = (const uint8_t *)group + i * Q4K_BG;
            const block_q8_K *yb[TT];
            for (int t = 0; t < nt; t++) yb[t] = (const block_q8_K *)XROW(x, t0 + t, x_stride) + i;
            __m256i isums[TT][PK_R]; /* (token, row): 8 lanes summing to the row's Σ sc·q·y */
            for (int r = 0; r < PK_R; r++) {
                if (r >= n_rows) {
                    for (int t = 0; t < nt; t++) isums[t][r] = _mm256_setzero_si256();
                    continue;
                }
                gemv_prefetch(bg, Q4K_BG, r); /* (n_x <= Q4K_SMALL_NX here: the weights stream once) */
                const uint8_t *qs = bg + Q4K_QS + 128 * r;
                const uint8_t *sc = bg + Q4K_SC + 8 * r;
                __m256i q[8], scv[8];
                for (int j = 0; j < 4; j++) {
                    const __m256i q4 = loadu256(qs + 32 * j);
                    q[2 * j] = _mm256_and_si256(q4, m4);
                    q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
                }
                scales8_to_16(sc, scv);
                for (int t = 0; t < nt; t++) isums[t][r] = isum8(q, scv, yb[t]->qs);
            }
            const __m256 d8 = _mm256_cvtph_ps(loadu128(bg + Q4K_D));
            const __m256 dmin8 = _mm256_cvtph_ps(loadu128(bg + Q4K_DMIN));
            for (int t = 0; t < nt; t++) {
                const __m256i isum = hsum8_i32(isums[t]);
                const __m256i imin = imin8_k4(bg + Q4K_M, yb[t]->bsums);
                const __m256 dy = _mm256_set1_ps(yb[t]->d);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d8, dy), acc[t]);
                accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin8, dy), accm[t]);
            }
        }
        for (int t = 0; t < nt; t++) {
            float out[PK_R];
            _mm256_storeu_ps(out, _mm256_sub_ps(acc[t], accm[t]));
            memcpy(y + (int64_t)(t0 + t) * y_stride, out, (size_t)n_rows * sizeof(float));
        }
    }
}

/* ---- Q2_K, Q3_K, Q5_K, Q6_K: 8 lanes per (row, token) ------------------------------------------- */

enum { KQ2, KQ3, KQ5, KQ6, KIQ4XS };

/* Unpacks row r of block group bg: q[s] (s = 0..7) the 32 quants of group s as bytes (Q3_K: 0..7
 * with value q - 4; Q6_K: 0..63 with value q - 32), sc[s] the i16 scales of its two halves. */
static ALWAYS_INLINE void unpack_row(int kind, const uint8_t *bg, int r, __m256i *q, __m256i *sc) {
    switch (kind) {
    case KQ2:
        scales16_to_2x8(_mm_and_si128(loadu128(bg + Q2K_SC + 16 * r), _mm_set1_epi8(0x0f)), 0, sc);
        unpack_q2k_row(bg, r, q);
        break;
    case KQ3:
        scales16_to_2x8(loadu128(bg + Q3K_SC + 16 * r), 1, sc);
        unpack_q3k_row(bg, r, q);
        break;
    case KQ5:
        scales8_to_16(bg + Q5K_SC + 8 * r, sc);
        unpack_q5k_row(bg, r, q);
        break;
    case KIQ4XS: /* q: the int8 levels (signed), sc[s]: 16 x ls of group s */
        unpack_iq4xs_row(bg, r, q);
        for (int s = 0; s < 8; s++) sc[s] = _mm256_set1_epi16((short)(int8_t)bg[IQ4XS_SC + 8 * r + s]);
        break;
    default: /* KQ6 */
        scales16_to_2x8(loadu128(bg + Q6K_SC + 16 * r), 1, sc);
        unpack_q6k_row(bg, r, q);
        break;
    }
}

#ifndef KL_STREAM_NX
#define KL_STREAM_NX 8 /* gemm_lanes: up to this many tokens (decode, a batched decode step: one tile of TT) the
                        * weights stream from memory once: prefetch them as the GEMV does. Q6_K takes gemm_lanes
                        * up to here too: `benchmarks/matmul.py -t 1 --packed-only --type Q6_K`, 4096 x 1536,
                        * min of 4 alternated rounds, gemm_lanes / gemm_q6_K_prefill ms: n = 5 0.71 / 1.01,
                        * n = 8 1.18 / 1.35, n = 16 2.32 / 2.29, n = 64 8.63 / 8.68 */
#endif

static ALWAYS_INLINE void gemm_lanes(int kind, int64_t K, const void *group, int n_rows, const void *x,
                                     size_t x_stride, int n_x, float *y, int64_t y_stride) {
    const int64_t nb = K / QK_K;
    const int bg_bytes = kind == KQ2 ? Q2K_BG : kind == KQ3 ? Q3K_BG : kind == KQ5 ? Q5K_BG
                       : kind == KQ6 ? Q6K_BG : IQ4XS_BG;
    const int o_d = kind == KQ2 ? Q2K_D : kind == KQ3 ? Q3K_D : kind == KQ5 ? Q5K_D : kind == KQ6 ? Q6K_D : IQ4XS_D;
    const __m256i four = _mm256_set1_epi8(4);
    for (int t0 = 0; t0 < n_x; t0 += TT) {
        const int nt = n_x - t0 < TT ? n_x - t0 : TT;
        __m256 acc[TT][PK_R]; /* (token, row): 8 f32 lanes */
        float summ[TT][PK_R]; /* Q2_K: Σ dmin·dy·imin */
        __m256 summ8[TT];     /* Q5_K: the same, lane r: row r */
        for (int t = 0; t < nt; t++) {
            summ8[t] = _mm256_setzero_ps();
            for (int r = 0; r < PK_R; r++) { acc[t][r] = _mm256_setzero_ps(); summ[t][r] = 0.0f; }
        }
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *bg = (const uint8_t *)group + i * bg_bytes;
            const block_q8_K *yb[TT];
            for (int t = 0; t < nt; t++) yb[t] = (const block_q8_K *)XROW(x, t0 + t, x_stride) + i;
            __m256i p4[TT][8]; /* Q3_K: maddubs(4, y) of each group, subtracted for the offset */
            if (kind == KQ3) {
                for (int t = 0; t < nt; t++) {
                    for (int s = 0; s < 8; s++) p4[t][s] = _mm256_maddubs_epi16(four, loadu256(yb[t]->qs + 32 * s));
                }
            }
            for (int r = 0; r < n_rows; r++) {
                __m256i q[8], sc[8];
                if (n_x <= KL_STREAM_NX) gemv_prefetch(bg, bg_bytes, r);
                unpack_row(kind, bg, r, q, sc);
                const float d = f16(((const llmrt_fp16_t *)(bg + o_d))[r]);
                __m256i sc16 = _mm256_setzero_si256(), mins16 = sc16; /* Q6_K scales / Q2_K mins, i16 */
                float dmin = 0.0f;
                if (kind == KQ6) sc16 = _mm256_cvtepi8_epi16(loadu128(bg + Q6K_SC + 16 * r));
                if (kind == KQ2) {
                    const __m128i scb = loadu128(bg + Q2K_SC + 16 * r);
                    mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(scb, 4), _mm_set1_epi8(0x0f)));
                    dmin = f16(((const llmrt_fp16_t *)(bg + Q2K_DMIN))[r]);
                }
                for (int t = 0; t < nt; t++) {
                    const int8_t *q8 = yb[t]->qs;
                    __m256i isum;
                    if (kind == KQ3) {
                        isum = _mm256_setzero_si256();
                        for (int s = 0; s < 8; s++) {
                            const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q[s], loadu256(q8 + 32 * s)), p4[t][s]);
                            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, sc[s]));
                            PIN_REG(isum);
                        }
                    } else {
                        isum = kind == KIQ4XS ? isum8_i8(q, sc, q8) : isum8(q, sc, q8);
                    }
                    if (kind == KQ6) {
                        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(_mm256_madd_epi16(loadu256(yb[t]->bsums), sc16), 5));
                    }
                    const float dy = yb[t]->d;
                    /* dot_avx2.c: Q2_K dall = dy·d, Q3_K d·dy, Q5_K d·dy, Q6_K dy·d (commutative: same bits) */
                    acc[t][r] = _mm256_fmadd_ps(_mm256_set1_ps(d * dy), _mm256_cvtepi32_ps(isum), acc[t][r]);
                    if (kind == KQ2) {
                        const int summs = hsum_i32(_mm256_madd_epi16(loadu256(yb[t]->bsums), mins16));
                        summ[t][r] = fmaf(dy * dmin, (float)summs, summ[t][r]);
                    }
                }
            }
            if (kind == KQ5) { /* the 8 rows in lanes: summ_r = fma(dmin_r·dy, imin_r, summ_r) */
                const __m256 dmin8 = _mm256_cvtph_ps(loadu128(bg + Q5K_DMIN));
                for (int t = 0; t < nt; t++) {
                    const __m256i imin = imin8_k4(bg + Q5K_M, yb[t]->bsums);
                    summ8[t] = _mm256_fmadd_ps(_mm256_mul_ps(dmin8, _mm256_set1_ps(yb[t]->d)), _mm256_cvtepi32_ps(imin),
                                               summ8[t]);
                }
            }
        }
        for (int t = 0; t < nt; t++) {
            float s5[PK_R];
            _mm256_storeu_ps(s5, summ8[t]);
            for (int r = 0; r < n_rows; r++) {
                float s = hsum_ps(acc[t][r]);
                if (kind == KQ2) s = s - summ[t][r];
                if (kind == KQ5) s = s - s5[r];
                y[(int64_t)(t0 + t) * y_stride + r] = s;
            }
        }
    }
}

/* word interleave of two 32-byte vectors: lo = (u.w0, v.w0, u.w2, v.w2, ...), hi = (u.w1, v.w1, u.w3, ...) */
static ALWAYS_INLINE void pair_words(__m256i u, __m256i v, __m256i *lo, __m256i *hi) {
    *lo = _mm256_blend_epi16(u, _mm256_slli_epi32(v, 16), 0xAA);
    *hi = _mm256_blend_epi16(_mm256_srli_epi32(u, 16), v, 0xAA);
}

/* Q6_K, n_x > KL_STREAM_NX: gemm_lanes' float operations on the same values (8 f32 lanes per (row, token),
 * acc = fma(d·dy, lanes, acc) per super-block, hsum at the end) and the same integer lanes (lane k:
 * Σ_g sc·Σ q·y over elements 4k..4k+3 of each 32-group g, minus 32·(bsums[2k]·sc[2k] +
 * bsums[2k+1]·sc[2k+1])), computed with fewer multiplies: groups are taken in pairs (g0, g1) =
 * (2p, 2p+1) with their words interleaved (pair_words) in the quants (per row, once per chunk and
 * super-block) and in the activations (per token, once per super-block), so that two maddubs summed
 * in i16 give in i32 lane k the two 4-element sums P(g0, k), P(g1, k) (|P| <= 4·63·128 = 32256:
 * exact), and one madd by (sc of g0, sc of g1) adds both scaled: 12 multiplies per (row, token,
 * super-block) instead of 16. The offset enters as the lanes' start value madd(bsums, -32·sc)
 * (= -(madd(bsums, sc) << 5): |32·sc| <= 4096 fits i16). Loops: per super-block, row by row over
 * all tokens of the chunk. */
static void gemm_q6_K_prefill(int64_t K, const uint8_t *group, int n_rows, const uint8_t *x, size_t x_stride,
                              int n_x, float *y, int64_t y_stride) {
    const int64_t nb = K / QK_K;
    __m256i ys[TC][8]; /* (token, 2p + half): the activations of group pair p, words interleaved, 8 KB */
    for (int c0 = 0; c0 < n_x; c0 += TC) {
        const int nc = n_x - c0 < TC ? n_x - c0 : TC;
        const uint8_t *xc = x + (size_t)c0 * x_stride;
        __m256 acc[PK_R][TC]; /* (row, token): 8 f32 lanes */
        for (int r = 0; r < n_rows; r++) for (int t = 0; t < nc; t++) acc[r][t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *bg = group + i * Q6K_BG;
            const uint8_t *xi = xc + (size_t)i * sizeof(block_q8_K); /* token t's block i: xi + t * x_stride */
            const uint8_t *yt = xi;
            for (int t = 0; t < nc; t++, yt += x_stride) {
                const block_q8_K *b = (const block_q8_K *)yt;
                for (int p = 0; p < 4; p++) {
                    pair_words(loadu256(b->qs + 64 * p), loadu256(b->qs + 64 * p + 32), &ys[t][2 * p], &ys[t][2 * p + 1]);
                }
            }
            for (int r = 0; r < n_rows; r++) {
                __m256i q[8], sc[8], qp[8], scp[4];
                unpack_row(KQ6, bg, r, q, sc);
                for (int p = 0; p < 4; p++) {
                    pair_words(q[2 * p], q[2 * p + 1], &qp[2 * p], &qp[2 * p + 1]);
                    scp[p] = _mm256_blend_epi16(sc[2 * p], sc[2 * p + 1], 0xAA); /* i16 2k + j: scale of group 2p + j */
                }
                const __m256i nsc32 = _mm256_sub_epi16(_mm256_setzero_si256(),
                                                       _mm256_slli_epi16(_mm256_cvtepi8_epi16(loadu128(bg + Q6K_SC + 16 * r)), 5));
                const float d = f16(((const llmrt_fp16_t *)(bg + Q6K_D))[r]);
                __m256 *ac = acc[r];
                yt = xi;
                for (int t = 0; t < nc; t++, yt += x_stride) {
                    const block_q8_K *b = (const block_q8_K *)yt;
                    __m256i isum = _mm256_madd_epi16(loadu256(b->bsums), nsc32);
                    for (int p = 0; p < 4; p++) {
                        const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(qp[2 * p], ys[t][2 * p]),
                                                           _mm256_maddubs_epi16(qp[2 * p + 1], ys[t][2 * p + 1]));
                        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(a, scp[p]));
                    }
                    ac[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * b->d), _mm256_cvtepi32_ps(isum), ac[t]);
                }
            }
        }
        for (int t = 0; t < nc; t++) {
            float *yr = y + (int64_t)(c0 + t) * y_stride;
            for (int r = 0; r < n_rows; r++) yr[r] = hsum_ps(acc[r][t]);
        }
    }
}

static void gemm_q2_K_avx2(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                           float *y, int64_t y_stride) {
    gemm_lanes(KQ2, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}
static void gemm_iq4_xs_avx2(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                             float *y, int64_t y_stride) {
    gemm_lanes(KIQ4XS, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}
static void gemm_q3_K_avx2(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                           float *y, int64_t y_stride) {
    gemm_lanes(KQ3, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}
static void gemm_q5_K_avx2(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                           float *y, int64_t y_stride) {
    gemm_lanes(KQ5, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}
static void gemm_q6_K_avx2(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                           float *y, int64_t y_stride) {
    /* a batched decode step (up to KL_STREAM_NX tokens, e.g. the output matrix of a serving step: one
     * row per sequence) takes the GEMV, which streams the weights with prefetches; the prefill loop
     * (same bits) has none and pairs the quants per call: the synthetic 0.4b's 49152 x 1536 output
     * matrix took 7.2 ms for 2 tokens there against 2.3 for one, 2.8 in the GEMV (benchmarks/README.md);
     * from about 16 tokens on the two measure the same (KL_STREAM_NX) */
    if (n_x > KL_STREAM_NX) {
        gemm_q6_K_prefill(K, (const uint8_t *)group, n_rows, (const uint8_t *)x, x_stride, n_x, y, y_stride);
        return;
    }
    gemm_lanes(KQ6, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}

/* ---- F32 / F16 / BF16 ------------------------------------------------------------------------------ */

/* dot_avx2.c's order (vec_dot_float), per (row, activation row), for F32, F16 and BF16: one chain
 * of 8 f32 lanes over steps of 8 (one fma each), hsum_ps, then the scalar tail (n % 8 elements) in
 * double. Prefill: tiles of FR rows x NT activation rows (FR·NT accumulators, FR + NT loads per FR·NT
 * fmas), each row and activation row streamed once per tile, front to back (llamafile's tinyBLAS
 * tile on AVX2). Decode: GV_R rows per pass, one accumulator each. */
enum { KIND_F32, KIND_F16, KIND_BF16 };
#define FR 4   /* rows per float tile */
#define GV_R 4 /* decode: rows per pass (one chain each: 4 independent fma chains) */

static ALWAYS_INLINE __m256 load8_ps(const void *p, int64_t i, int kind) {
    switch (kind) {
    case KIND_F16: return _mm256_cvtph_ps(loadu128((const llmrt_fp16_t *)p + i));
    case KIND_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(loadu128((const llmrt_bf16_t *)p + i)), 16));
    default: return _mm256_loadu_ps((const float *)p + i);
    }
}

static ALWAYS_INLINE float load1_ps(const void *p, int64_t i, int kind) {
    switch (kind) {
    case KIND_F16: return f16(((const llmrt_fp16_t *)p)[i]);
    case KIND_BF16: return llmrt_bf16_to_fp32(((const llmrt_bf16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* vec_dot_float's end: hsum_ps of the chain, then the scalar tail [i0, n) in double, w and a both
 * read as `kind` (a: the activation row itself, never its f32 widening) */
static ALWAYS_INLINE float float_finish(__m256 acc, const void *w, const void *a, int64_t i0, int64_t n, int kind) {
    double sum = hsum_ps(acc);
    for (int64_t i = i0; i < n; i++) sum += (double)(load1_ps(w, i, kind) * load1_ps(a, i, kind));
    return (float)sum;
}

/* out[r][t] = dot(row r of w (FR rows, row_bytes apart), activation a[t]) for t < NT. The vector
 * steps read a[t] as akind (the row itself or its exact f32 widening), the tail reads at[t] (kind).
 * NT == 3 is written out with named accumulators: 12 of them + 3 activations + 1 weight vector are
 * the 16 ymm registers, and with arrays GCC kept one accumulator in memory (a store-to-load chain
 * that halved the tile's speed). */
static ALWAYS_INLINE void tile_float(int kind, int akind, int NT, int64_t n, const uint8_t *w, size_t row_bytes,
                                     const void *const *a, const void *const *at, float out[FR][3]) {
    const size_t es = kind == KIND_F32 ? 4 : 2, aes = akind == KIND_F32 ? 4 : 2;
    const int64_t n8 = n - n % 8;
    __m256 s[FR][3];
    if (NT == 3) {
        const uint8_t *a0 = (const uint8_t *)a[0], *a1 = (const uint8_t *)a[1], *a2 = (const uint8_t *)a[2];
        const uint8_t *w0 = w, *w1 = w + row_bytes, *w2 = w + 2 * row_bytes, *w3 = w + 3 * row_bytes;
        __m256 s00 = _mm256_setzero_ps(), s01 = s00, s02 = s00, s10 = s00, s11 = s00, s12 = s00;
        __m256 s20 = s00, s21 = s00, s22 = s00, s30 = s00, s31 = s00, s32 = s00;
        for (int64_t i = 0; i < n8; i += 8) {
            const __m256 x0 = load8_ps(a0 + i * aes, 0, akind), x1 = load8_ps(a1 + i * aes, 0, akind),
                         x2 = load8_ps(a2 + i * aes, 0, akind);
            __m256 v = load8_ps(w0 + i * es, 0, kind);
            s00 = _mm256_fmadd_ps(v, x0, s00), s01 = _mm256_fmadd_ps(v, x1, s01), s02 = _mm256_fmadd_ps(v, x2, s02);
            v = load8_ps(w1 + i * es, 0, kind);
            s10 = _mm256_fmadd_ps(v, x0, s10), s11 = _mm256_fmadd_ps(v, x1, s11), s12 = _mm256_fmadd_ps(v, x2, s12);
            v = load8_ps(w2 + i * es, 0, kind);
            s20 = _mm256_fmadd_ps(v, x0, s20), s21 = _mm256_fmadd_ps(v, x1, s21), s22 = _mm256_fmadd_ps(v, x2, s22);
            v = load8_ps(w3 + i * es, 0, kind);
            s30 = _mm256_fmadd_ps(v, x0, s30), s31 = _mm256_fmadd_ps(v, x1, s31), s32 = _mm256_fmadd_ps(v, x2, s32);
        }
        s[0][0] = s00, s[0][1] = s01, s[0][2] = s02, s[1][0] = s10, s[1][1] = s11, s[1][2] = s12;
        s[2][0] = s20, s[2][1] = s21, s[2][2] = s22, s[3][0] = s30, s[3][1] = s31, s[3][2] = s32;
    } else {
        for (int r = 0; r < FR; r++) for (int t = 0; t < NT; t++) s[r][t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < n8; i += 8) {
            __m256 av[3];
            for (int t = 0; t < NT; t++) av[t] = load8_ps((const uint8_t *)a[t] + i * aes, 0, akind);
            for (int r = 0; r < FR; r++) {
                const __m256 wv = load8_ps(w + r * row_bytes + i * es, 0, kind);
                for (int t = 0; t < NT; t++) s[r][t] = _mm256_fmadd_ps(wv, av[t], s[r][t]);
            }
        }
    }
    for (int r = 0; r < FR; r++)
        for (int t = 0; t < NT; t++) out[r][t] = float_finish(s[r][t], w + r * row_bytes, at[t], n8, n, kind);
}

/* one activation row (decode): GV_R rows at a time, one chain each, so the weights stream through
 * once, the next GV_R rows prefetched at the same offsets (after the last ones, the next group's:
 * consecutive groups are consecutive in memory); then float_finish. The vector steps read the
 * activation from av (akind: the row itself or its exact f32 widening), the tail from a (kind). */
#define GEMV_KBUF 8192 /* an activation row of up to this many elements is widened to f32 once */

/* row r of a call's groups (pack_k.h: PK_R plain rows per group, groups group_bytes apart: the rows
 * rounded up to 64 bytes), as an address (rows past the call's groups are prefetched only) */
static ALWAYS_INLINE uintptr_t float_row(const void *group, int r, size_t row_bytes) {
    const size_t group_bytes = (PK_R * row_bytes + 63) & ~(size_t)63;
    return (uintptr_t)group + (size_t)(r / PK_R) * group_bytes + (size_t)(r % PK_R) * row_bytes;
}

static ALWAYS_INLINE void gemv_float_rows(int kind, int akind, int64_t n, const uint8_t *w, size_t row_bytes,
                                          int n_rows, const void *av, const void *a, float *y) {
    const size_t es = kind == KIND_F32 ? 4 : 2, aes = akind == KIND_F32 ? 4 : 2;
    const int64_t n8 = n - n % 8;
    for (int r0 = 0; r0 < n_rows; r0 += GV_R) { /* rows past n_rows are the group's zero padding */
        const uint8_t *w0 = (const uint8_t *)float_row(w, r0, row_bytes); /* GV_R rows of one group */
        const uint8_t *w1 = w0 + row_bytes, *w2 = w0 + 2 * row_bytes, *w3 = w0 + 3 * row_bytes;
        const uintptr_t next = float_row(w, r0 + GV_R, row_bytes); /* prefetch only */
        __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
        int64_t i = 0;
        for (; i + 32 <= n8; i += 32) { /* 32 elements: 64 bytes of F16 / BF16 per row, 128 of F32 */
            for (size_t b = 0; b < 32 * es; b += 64) {
                for (int r = 0; r < GV_R; r++)
                    _mm_prefetch((const char *)(next + r * row_bytes + (size_t)i * es + b), _MM_HINT_T0);
            }
            for (int64_t k = i; k < i + 32; k += 8) {
                const __m256 x = load8_ps((const uint8_t *)av + k * aes, 0, akind);
                c0 = _mm256_fmadd_ps(load8_ps(w0 + k * es, 0, kind), x, c0);
                c1 = _mm256_fmadd_ps(load8_ps(w1 + k * es, 0, kind), x, c1);
                c2 = _mm256_fmadd_ps(load8_ps(w2 + k * es, 0, kind), x, c2);
                c3 = _mm256_fmadd_ps(load8_ps(w3 + k * es, 0, kind), x, c3);
            }
        }
        for (; i < n8; i += 8) {
            const __m256 x = load8_ps((const uint8_t *)av + i * aes, 0, akind);
            c0 = _mm256_fmadd_ps(load8_ps(w0 + i * es, 0, kind), x, c0);
            c1 = _mm256_fmadd_ps(load8_ps(w1 + i * es, 0, kind), x, c1);
            c2 = _mm256_fmadd_ps(load8_ps(w2 + i * es, 0, kind), x, c2);
            c3 = _mm256_fmadd_ps(load8_ps(w3 + i * es, 0, kind), x, c3);
        }
        const __m256 c[GV_R] = { c0, c1, c2, c3 };
        for (int r = 0; r < GV_R && r0 + r < n_rows; r++)
            y[r0 + r] = float_finish(c[r], w0 + r * row_bytes, a, n8, n, kind);
    }
}

/* n elements of an activation row widened (exactly) to f32 */
static ALWAYS_INLINE void widen_row(int kind, const void *src, int64_t n, float *dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_ps(src, i, kind));
    for (; i < n; i++) dst[i] = load1_ps(src, i, kind);
}

static ALWAYS_INLINE void gemv_float(int kind, int64_t n, const uint8_t *w, size_t row_bytes, int n_rows, const void *a,
                                     float *y) {
    if (kind != KIND_F32 && n <= GEMV_KBUF) { /* widen once (exact), for every row of the call */
        float abuf[GEMV_KBUF] __attribute__((aligned(32)));
        widen_row(kind, a, n, abuf);
        gemv_float_rows(kind, KIND_F32, n, w, row_bytes, n_rows, abuf, a, y);
    } else {
        gemv_float_rows(kind, kind, n, w, row_bytes, n_rows, a, a, y);
    }
}

/* one FR x nt tile (nt = 1..3 tokens from t0, rows from r0 of the call) into y; a: the vector steps'
 * activation rows (akind), at: the rows themselves (the tails) */
static ALWAYS_INLINE void tile_float_to_y(int kind, int akind, int nt, int64_t K, const void *group, size_t row_bytes,
                                          int r0, int n_rows, const void *const *a, const void *const *at, int t0,
                                          float *y, int64_t y_stride) {
    const uint8_t *w = (const uint8_t *)float_row(group, r0, row_bytes); /* FR rows of one group */
    float out[FR][3];
    if (nt == 3) tile_float(kind, akind, 3, K, w, row_bytes, a, at, out);
    else if (nt == 2) tile_float(kind, akind, 2, K, w, row_bytes, a, at, out);
    else tile_float(kind, akind, 1, K, w, row_bytes, a, at, out);
    for (int r = 0; r < FR && r0 + r < n_rows; r++) {
        for (int t = 0; t < nt; t++) y[(int64_t)(t0 + t) * y_stride + r0 + r] = out[r][t];
    }
}

static ALWAYS_INLINE void gemm_float(int kind, int64_t K, const void *group, int n_rows, const void *x,
                                     size_t x_stride, int n_x, float *y, int64_t y_stride) {
    const size_t row_bytes = (size_t)K * (kind == KIND_F32 ? 4 : 2);
    if (n_x == 1) {
        gemv_float(kind, K, (const uint8_t *)group, row_bytes, n_rows, x, y);
        return;
    }
    if (kind == KIND_BF16 && K <= GEMV_KBUF) {
        /* BF16 activations widened to f32 once per 3 tokens for all rows of the call (exact: the same
         * values in the same fmas), so the tiles widen (zero-extend + shift: 2 ops) only the weights.
         * 0.4B shapes, 64 tokens, Zen 3, 1 thread: 5-10 % faster for BF16; for F16 (one vcvtph2ps)
         * 7-12 % slower (twice the activation bytes read per tile), so F16 keeps converting in the tile. */
        float abuf[3][GEMV_KBUF] __attribute__((aligned(32)));
        for (int t0 = 0; t0 < n_x; t0 += 3) {
            const int nt = n_x - t0 < 3 ? n_x - t0 : 3;
            const void *a[3] = { 0, 0, 0 }, *at[3] = { 0, 0, 0 }; /* the first nt are set */
            for (int t = 0; t < nt; t++) {
                at[t] = XROW(x, t0 + t, x_stride);
                widen_row(kind, at[t], K, abuf[t]);
                a[t] = abuf[t];
            }
            for (int r0 = 0; r0 < n_rows; r0 += FR) /* rows past n_rows are the group's zero padding */
                tile_float_to_y(kind, KIND_F32, nt, K, group, row_bytes, r0, n_rows, a, at, t0, y, y_stride);
        }
        return;
    }
    for (int r0 = 0; r0 < n_rows; r0 += FR) { /* rows past n_rows are the group's zero padding */
        for (int t0 = 0; t0 < n_x; t0 += 3) {
            const int nt = n_x - t0 < 3 ? n_x - t0 : 3;
            const void *a[3] = { 0, 0, 0 }; /* the first nt are set */
            for (int t = 0; t < nt; t++) a[t] = XROW(x, t0 + t, x_stride);
            tile_float_to_y(kind, kind, nt, K, group, row_bytes, r0, n_rows, a, a, t0, y, y_stride);
        }
    }
}

static void gemm_f32_avx2(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                          float *y, int64_t y_stride) {
    gemm_float(KIND_F32, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}
static void gemm_f16_avx2(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                          float *y, int64_t y_stride) {
    gemm_float(KIND_F16, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}
static void gemm_bf16_avx2(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride, int n_x,
                           float *y, int64_t y_stride) {
    gemm_float(KIND_BF16, K, group, n_rows, x, x_stride, n_x, y, y_stride);
}

/* The avx512_vnni level's K-quant / IQ4_XS gemms (gemm_kq_w.inc) give these kernels' bits: they run
 * them for decode and for a lone group, and reproduce them in 16 lanes for prefill. */
#define EXPORT_GEMM_AVX2(t)                                                                                \
    void llmrt_gemm_##t##_avx2(int64_t K, const void *group, int n_rows, const void *x, size_t x_stride,  \
                               int n_x, float *y, int64_t y_stride) {                                   \
        gemm_##t##_avx2(K, group, n_rows, x, x_stride, n_x, y, y_stride);                              \
    }
EXPORT_GEMM_AVX2(q2_K)
EXPORT_GEMM_AVX2(q3_K)
EXPORT_GEMM_AVX2(q4_K)
EXPORT_GEMM_AVX2(q5_K)
EXPORT_GEMM_AVX2(q6_K)
EXPORT_GEMM_AVX2(iq4_xs)
#undef EXPORT_GEMM_AVX2

#endif /* __x86_64__ */

void llmrt_register_gemm_k_kernels_avx2(llmrt_kernel_table *kt) {
#if defined(__x86_64__)
#define REG(T, fn) do { kt->gemm[LLMRT_TYPE_##T] = fn; kt->gemm_name[LLMRT_TYPE_##T] = #fn; } while (0)
    REG(Q2_K, gemm_q2_K_avx2);
    REG(Q3_K, gemm_q3_K_avx2);
    REG(Q4_K, gemm_q4_K_avx2);
    REG(Q5_K, gemm_q5_K_avx2);
    REG(Q6_K, gemm_q6_K_avx2);
    REG(IQ4_XS, gemm_iq4_xs_avx2);
    REG(F32, gemm_f32_avx2);
    REG(F16, gemm_f16_avx2);
    REG(BF16, gemm_bf16_avx2);
    /* decode widens the activation row once per call: 4 groups (32 rows) per call */
    kt->gemm_groups[LLMRT_TYPE_F32] = kt->gemm_groups[LLMRT_TYPE_F16] = kt->gemm_groups[LLMRT_TYPE_BF16] = 4;
    kt->gemm_groups[LLMRT_TYPE_Q4_K] = 2; /* the prefill tile's broadcasts serve two groups */
#undef REG
#else
    (void)kt;
#endif
}
