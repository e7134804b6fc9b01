/*
 * wquant.c — group-wise weight-only quantization at load (neural-speed's knobs, llmrt/wquant.py).
 *
 * A row x[k] is cut into groups of `group` elements (group = -1 / <= 0: one group per row, i.e. per
 * output channel). Each group gets ONE scale (and, for asym, one minimum), written into every
 * 32-element block of the group. So the result is a plain GGUF-layout tensor (Q4_0 / Q4_1 / Q8_0,
 * or the private WQ_Q8A) that every existing kernel runs, holding exactly the group-wise
 * quantized values.
 *
 * LLMRT_WQ_MINMAX: the scale (and min) computed as ggml's reference quantizer computes it for a
 * 32-block, but over the whole group (group = 32: the bytes of ggml's quantize_row_*_ref):
 *
 *   int4 sym  -> Q4_0    d = v / -8 (v: the value of largest |v|), q = min(15, trunc(x/d + 8.5))
 *   int4 asym -> Q4_1    d = (max - min) / 15, m = min,            q = min(15, trunc((x-m)/d + 0.5))
 *   int8 sym  -> Q8_0    d = amax / 127,                           q = round(x/d)
 *   int8 asym -> WQ_Q8A  d = (max - min) / 255, m = min,           q = min(255, trunc((x-m)/d + 0.5)) - 128
 * (each with id = 1/d, or 0 when d == 0; d and m are stored as f16).
 * LLMRT_WQ_SEARCH: int4 scales (and mins) searched for the least squared error of the group
 * (search_q4 below), never worse than min/max; int8 stays min/max. Memory cost: the scale is
 * repeated per 32-block, so every group size costs what group 32 costs (Q4_0 4.5 bits/weight,
 * Q4_1 5, Q8_0 8.5, WQ_Q8A 9).
 */
#include "llmrt/llmrt.h"

#include <float.h>
#include <math.h>

int llmrt_wq_layout(int type) {
    switch (type) {
    case LLMRT_TYPE_WQ_Q4_0_F32: case LLMRT_TYPE_WQ_Q4_0_BF16: return LLMRT_TYPE_Q4_0;
    case LLMRT_TYPE_WQ_Q4_1_F32: case LLMRT_TYPE_WQ_Q4_1_BF16: return LLMRT_TYPE_Q4_1;
    case LLMRT_TYPE_WQ_Q8_0_F32: case LLMRT_TYPE_WQ_Q8_0_BF16: return LLMRT_TYPE_Q8_0;
    case LLMRT_TYPE_WQ_Q8A_F32: case LLMRT_TYPE_WQ_Q8A_BF16: return LLMRT_TYPE_WQ_Q8A;
    default: return type;
    }
}

/* How one group is written: stored scale d and min m (f16-rounded when written), and the
 * assignment the quants come from: q = rounding of (x - ma) * ida (ma = m, ida = 1/d, except that
 * the min/max reference divides by its unrounded d and subtracts its unrounded min, as ggml does). */
typedef struct {
    float d, m;         /* stored (Q4_0 / Q8_0: m = 0) */
    float ma, ida;      /* assignment */
} wq_params;

static inline float f16_round(float v) { return llmrt_fp16_to_fp32(llmrt_fp32_to_fp16(v)); }

/* Min/max parameters of one group x[n], as the 32-block reference computes them. */
static void group_params(int layout, const float *x, int64_t n, wq_params *p) {
    float d, m;
    if (layout == LLMRT_TYPE_Q4_0) {
        float amax = 0.0f, vmax = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            if (amax < fabsf(x[i])) { amax = fabsf(x[i]); vmax = x[i]; }
        }
        d = vmax / -8.0f;
        m = 0.0f;
    } else if (layout == LLMRT_TYPE_Q8_0) {
        float amax = 0.0f;
        for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
        d = amax / 127.0f;
        m = 0.0f;
    } else { /* Q4_1, WQ_Q8A: min / max */
        float lo = FLT_MAX, hi = -FLT_MAX;
        for (int64_t i = 0; i < n; i++) {
            if (x[i] < lo) lo = x[i];
            if (x[i] > hi) hi = x[i];
        }
        d = (hi - lo) / (layout == LLMRT_TYPE_Q4_1 ? 15.0f : 255.0f);
        m = lo;
    }
    p->d = d;
    p->m = m;
    p->ma = m;
    p->ida = d != 0.0f ? 1.0f / d : 0.0f;
}

/* (int)v with v first clamped to [lo, hi] (NaN -> lo): the same integer as ggml's casts for every
 * in-range value, and no undefined float -> int conversion when d is tiny and 1/d overflows. */
static inline int to_int_clamped(float v, float lo, float hi) {
    v = v > lo ? v : lo;
    v = v < hi ? v : hi;
    return (int)v;
}

/* The int4 quant of x (Q4_0: 0..15 for q - 8; Q4_1: 0..15), the same expression quant_block
 * writes. */
static inline int q4_of(int layout, float x, const wq_params *p) {
    return layout == LLMRT_TYPE_Q4_0 ? to_int_clamped(x * p->ida + 8.5f, 0.0f, 15.0f)
                                     : to_int_clamped((x - p->ma) * p->ida + 0.5f, 0.0f, 15.0f);
}

/* ---- int4 rounding search ------------------------------------------------------------------------
 * Min/max (the reference) spends levels on the extremes of a group; a slightly different scale
 * that clips the largest value or moves the grid often lowers the group's squared error. For
 * each candidate inverse scale around the min/max one (WQ_NSTEP + 1 of them, the range widened and
 * narrowed as ggml's make_qkx2_quants does for Q4_K), the quants L are rounded and ranked by the
 * error of their unrounded least-squares (d, m) (closed form from the sums, no division); the
 * best two are refitted with (d, m) rounded to f16. The best is then refined: re-round L to the
 * stored (d, m), refit, while the error drops (at most WQ_NITER times). Last, the result's real
 * error is compared with the min/max reference's and the better kept, so the search never does
 * worse than min/max (tests/test_wquant.py checks it). Same block layouts, so the kernels do not
 * change. */
/* Candidate inverse scales (nmax + WQ_T0 + WQ_TSTEP * is) / range, is = 0..WQ_NSTEP: nmax - 1 to
 * nmax + 3 levels over the min/max range. Measured on SmolLM2 135M + Gemma 3 270M F16 weights
 * (/tmp bench of 42 tensors, MSE vs 21 candidates in steps of 1/5): 9 candidates in steps of 1/2
 * +0.2..0.8 % (asym), +0.15..0.2 % (sym); 5 in steps of 1 +2.4..3.3 % (asym). Going past nmax + 2
 * (clipping more) helps per-channel groups (Q4_0 0.70 -> 0.69). */
#define WQ_NSTEP 8
#define WQ_T0 (-1.0f)
#define WQ_TSTEP 0.5f
#define WQ_NITER 4

/* The weighted search's grid: the same by default. Settable for measurements only
 * (llmrt_wq_set_weighted_grid; process-wide, not while a quantization runs): 25 candidates from
 * nmax - 3 to nmax + 3 in steps of 1/4 measured +4.28 % vs +4.47 % perplexity on Gemma 3 270M
 * (README) for 1.8x the search time. */
static float wq_w_t0 = WQ_T0, wq_w_tstep = WQ_TSTEP;
static int wq_w_nstep = WQ_NSTEP;

void llmrt_wq_set_weighted_grid(float t0, float tstep, int nstep) {
    /* keep every candidate's inverse scale positive and its quants well inside int range */
    if (nstep >= 0 && nstep <= 256 && isfinite(t0) && isfinite(tstep) && t0 > -7.0f &&
        t0 + tstep * (float)nstep > -7.0f && t0 < 16.0f && t0 + tstep * (float)nstep < 16.0f) {
        wq_w_t0 = t0, wq_w_tstep = tstep, wq_w_nstep = nstep;
    }
}

typedef struct { double sl, sll, slx; } lsums;  /* sum L, sum L^2, sum L x over a group */

/* The hot loops below keep WQ_LANES independent partial sums (j = i % WQ_LANES), so the compiler
 * vectorizes them without reassociating anything; n is a multiple of 32. */
#define WQ_LANES 8

/* The search's loops are compiled twice, for AVX2 and for the x86-64 baseline (SSE2), the
 * version picked at load (GCC ifunc). "avx2" without "fma": no contraction, so both versions
 * compute the same floats and pick the same quants on every CPU. */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones) && !defined(LLMRT_NO_TARGET_CLONES)
#define WQ_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef WQ_CLONES
#define WQ_CLONES
#endif

/* int4 quant of v = (x - c) a + b once v is known to lie well inside int range: the same integer
 * as to_int_clamped(v, 0, 15) (trunc, then clamp; for -1 < v < 0 both give 0), in integer
 * arithmetic, which the compiler vectorizes (a float clamp with NaN semantics it does not). */
static inline int q4_int(float v) {
    int q = (int)v;
    q = q < 0 ? 0 : q;
    return q > 15 ? 15 : q;
}

/* The quant assignment of a params set: L = q4((x - c) a + b) - off. */
typedef struct { float c, a, b, off; int fast; } wq_assign;

static wq_assign assign_of(int layout, const wq_params *p, float lo, float hi) {
    wq_assign q;
    q.c = layout == LLMRT_TYPE_Q4_0 ? 0.0f : p->ma;
    q.a = p->ida;
    q.b = layout == LLMRT_TYPE_Q4_0 ? 8.5f : 0.5f;
    q.off = layout == LLMRT_TYPE_Q4_0 ? 8.0f : 0.0f;
    /* (x - c) a + b is monotonic in x: bounded by its values at lo and hi */
    q.fast = fabsf((lo - q.c) * q.a) < 1e9f && fabsf((hi - q.c) * q.a) < 1e9f;
    return q;
}

/* One pass over a group with assignment q and stored (d, m): the real squared error of the values
 * the blocks hold (L d + m, as dequantized), and the sums of the quants for a refit. f32 lane
 * sums (sl, sll are integers < 2^24: exact; the error and sum L x to ~1e-5 relative): they rank;
 * pass_q4_exact decides. */
WQ_CLONES
static float pass_q4(const float *x, const float *w, int64_t n, const wq_assign *q, float d, float m,
                     lsums *s) {
    const float c = q->c, a = q->a, b = q->b, off = q->off;
    float err[WQ_LANES] = {0}, sl[WQ_LANES] = {0}, sll[WQ_LANES] = {0}, slx[WQ_LANES] = {0};
/* WI: the element's weight (1.0f unweighted: x * 1.0f is x, so that version computes exactly the
 * unweighted sums) */
#define PASS_LOOP(QOF, WI)                                                                        \
    for (int64_t i = 0; i < n; i += WQ_LANES) {                                                   \
        for (int j = 0; j < WQ_LANES; j++) {                                                      \
            const float v = (x[i + j] - c) * a + b;                                               \
            const float l = (float)(QOF) - off;                                                   \
            const float e = (l * d + m) - x[i + j];                                               \
            const float wl = (WI) * l;                                                            \
            err[j] += (WI) * e * e;                                                               \
            sl[j] += wl;                                                                          \
            sll[j] += wl * l;                                                                     \
            slx[j] += wl * x[i + j];                                                              \
        }                                                                                         \
    }
    if (w == NULL) {
        if (q->fast) {
            PASS_LOOP(q4_int(v), 1.0f)
        } else {
            PASS_LOOP(to_int_clamped(v, 0.0f, 15.0f), 1.0f)
        }
    } else {
        if (q->fast) {
            PASS_LOOP(q4_int(v), w[i + j])
        } else {
            PASS_LOOP(to_int_clamped(v, 0.0f, 15.0f), w[i + j])
        }
    }
#undef PASS_LOOP
    float e = 0.0f;
    s->sl = s->sll = s->slx = 0.0;
    for (int j = 0; j < WQ_LANES; j++) e += err[j], s->sl += sl[j], s->sll += sll[j], s->slx += slx[j];
    return e;
}

/* The same error summed in double (decides between the search and min/max, so that the result is
 * never worse than min/max in any summation order to ~1e-15). */
static double pass_q4_exact(const float *x, const float *w, int64_t n, const wq_assign *q, float d,
                            float m) {
    double err[WQ_LANES] = {0};
    for (int64_t i = 0; i < n; i += WQ_LANES) {
        for (int j = 0; j < WQ_LANES; j++) {
            const float v = (x[i + j] - q->c) * q->a + q->b;
            const float l = (float)(q->fast ? q4_int(v) : to_int_clamped(v, 0.0f, 15.0f)) - q->off;
            const double e = (double)(l * d + m) - (double)x[i + j];
            err[j] += (w == NULL ? 1.0 : (double)w[i + j]) * e * e;
        }
    }
    double e = 0.0;
    for (int j = 0; j < WQ_LANES; j++) e += err[j];
    return e;
}

/* Sums of the quants L = q4_int((x - c) a + b) - off of a candidate scale (f32 partial sums:
 * they only rank the candidates). The candidates keep |(x - c) a| <= 19 for x in the group. */
WQ_CLONES
static void cand_sums(const float *x, const float *w, int64_t n, float c, float a, float b, float off,
                      lsums *s) {
    float sl[WQ_LANES] = {0}, sll[WQ_LANES] = {0}, slx[WQ_LANES] = {0};
#define CAND_LOOP(WI)                                                                             \
    for (int64_t i = 0; i < n; i += WQ_LANES) {                                                   \
        for (int j = 0; j < WQ_LANES; j++) {                                                      \
            const float l = (float)q4_int((x[i + j] - c) * a + b) - off;                          \
            const float wl = (WI) * l;                                                            \
            sl[j] += wl;                                                                          \
            sll[j] += wl * l;                                                                     \
            slx[j] += wl * x[i + j];                                                              \
        }                                                                                         \
    }
    if (w == NULL) {
        CAND_LOOP(1.0f)
    } else {
        CAND_LOOP(w[i + j])
    }
#undef CAND_LOOP
    s->sl = s->sll = s->slx = 0.0;
    for (int j = 0; j < WQ_LANES; j++) s->sl += sl[j], s->sll += sll[j], s->slx += slx[j];
}

/* Least-squares (d, m) for fixed quants (weighted sums s over values of total weight n (their
 * count, unweighted) with sum w x = sx), rounded to f16; its weighted squared error for those
 * quants (sxx = sum w x^2). 0 when no fit (all L equal / d <= 0). */
static int refit(int layout, const lsums *s, double n, double sx, double sxx, wq_params *p,
                 double *err) {
    double d, m = 0.0;
    if (layout == LLMRT_TYPE_Q4_0) {
        if (s->sll <= 0.0) return 0;
        d = s->slx / s->sll;
    } else {
        const double det = (double)n * s->sll - s->sl * s->sl;
        if (det <= 0.0) return 0;
        d = ((double)n * s->slx - s->sl * sx) / det;
        m = (s->sll * sx - s->sl * s->slx) / det;
    }
    const float d16 = f16_round((float)d), m16 = f16_round((float)m);
    if (layout == LLMRT_TYPE_Q4_0 ? d16 == 0.0f : !(d16 > 0.0f)) return 0;
    p->d = d16, p->m = m16, p->ma = m16, p->ida = 1.0f / d16;
    *err = (double)d16 * d16 * s->sll + 2.0 * d16 * m16 * s->sl + (double)n * m16 * m16 -
           2.0 * d16 * s->slx - 2.0 * m16 * sx + sxx;
    return 1;
}

/* Group statistics: total weight (n unweighted), sum w x, sum w x^2 (f32 lanes), extremes. */
WQ_CLONES
static void group_stats(const float *x, const float *w, int64_t n, double *sw, double *sx,
                        double *sxx, float *lo, float *hi) {
    float s0[WQ_LANES] = {0}, s1[WQ_LANES] = {0}, s2[WQ_LANES] = {0}, mn[WQ_LANES], mx[WQ_LANES];
    for (int j = 0; j < WQ_LANES; j++) mn[j] = mx[j] = x[j];
#define STATS_LOOP(WI)                                                                            \
    for (int64_t i = 0; i < n; i += WQ_LANES) {                                                   \
        for (int j = 0; j < WQ_LANES; j++) {                                                      \
            const float v = x[i + j], wv = (WI) * v;                                              \
            s0[j] += (WI);                                                                        \
            s1[j] += wv;                                                                          \
            s2[j] += wv * v;                                                                      \
            mn[j] = v < mn[j] ? v : mn[j];                                                        \
            mx[j] = v > mx[j] ? v : mx[j];                                                        \
        }                                                                                         \
    }
    if (w == NULL) {
        STATS_LOOP(1.0f)
    } else {
        STATS_LOOP(w[i + j])
    }
#undef STATS_LOOP
    *sx = *sxx = 0.0;
    double s = 0.0;
    float l = mn[0], h = mx[0];
    for (int j = 0; j < WQ_LANES; j++) {
        s += s0[j], *sx += s1[j], *sxx += s2[j];
        l = mn[j] < l ? mn[j] : l;
        h = mx[j] > h ? mx[j] : h;
    }
    *sw = w == NULL ? (double)n : s;
    *lo = l, *hi = h;
}

/* Replace p (the min/max params of x[n]) by the searched ones when their error is lower: the
 * squared error, or with w (n importance weights >= 0, one per element) the weighted squared
 * error sum w (x - xq)^2. */
static void search_q4(int layout, const float *x, const float *w, int64_t n, wq_params *p) {
    double sw, sx, sxx;
    float lo, hi;
    group_stats(x, w, n, &sw, &sx, &sxx, &lo, &hi);
    if (!isfinite(sxx) || !isfinite(sx) || !(sw > 0.0) || !isfinite(sw) || !(hi > lo) ||
        !isfinite(hi - lo)) {
        return;     /* inf / NaN, no weight, or constant: keep min/max */
    }
    /* the value of largest |x| (first such, as group_params found it): d = vmax / -8 exactly */
    const float vmax = layout == LLMRT_TYPE_Q4_0 ? p->d * -8.0f : 0.0f;
    lsums s;
    const wq_assign ra = assign_of(layout, p, lo, hi);
    const float ref_err = pass_q4(x, w, n, &ra, f16_round(p->d), f16_round(p->m), &s);
    if (!(ref_err > 0.0f)) {
        if (pass_q4_exact(x, w, n, &ra, f16_round(p->d), f16_round(p->m)) == 0.0) return; /* exact already */
    }
    wq_params best = *p, c;
    double e;
    /* Q4_1: L = round((x - lo) * is) in 0..15; Q4_0: L = round(x * is) in -8..7, with vmax on
     * the 8-level side (-8) or on the 7-level side. Each candidate's L is ranked by how much its
     * unrounded least-squares fit lowers the error, num^2 / den (Q4_1: sxx - sx^2/n - that / n;
     * Q4_0: sxx - that), compared by cross-multiplying (no division); only the best two get the
     * f16-rounded refit. */
    const int nfam = layout == LLMRT_TYPE_Q4_0 ? 2 : 1;
    double rn[2] = {0.0, 0.0}, rd[2] = {1.0, 1.0};   /* best two scores num^2 / den, best first */
    lsums rs[2];
    int nbest = 0;
    for (int fam = 0; fam < nfam; fam++) {
        const int nstep = w == NULL ? WQ_NSTEP : wq_w_nstep;
        for (int is = 0; is <= nstep; is++) {
            const float t = w == NULL ? WQ_T0 + WQ_TSTEP * (float)is : wq_w_t0 + wq_w_tstep * (float)is;
            float iscale;
            if (layout == LLMRT_TYPE_Q4_0) {
                iscale = fam == 0 ? -(8.0f + t) / vmax : (7.0f + t) / vmax;
            } else {
                iscale = (15.0f + t) / (hi - lo);
            }
            if (!(iscale > 0.0f || iscale < 0.0f) || !isfinite(iscale)) continue;
            lsums cs;
            double num, den;
            if (layout == LLMRT_TYPE_Q4_0) {
                cand_sums(x, w, n, 0.0f, iscale, 8.5f, 8.0f, &cs);
                num = cs.slx, den = cs.sll;
            } else {
                cand_sums(x, w, n, lo, iscale, 0.5f, 0.0f, &cs);
                num = sw * cs.slx - cs.sl * sx, den = sw * cs.sll - cs.sl * cs.sl;
                if (!(num > 0.0)) continue;                 /* d <= 0 */
            }
            if (!(den > 0.0)) continue;
            const double nn = num * num;
            if (nbest == 0 || nn * rd[0] > rn[0] * den) {
                rn[1] = rn[0], rd[1] = rd[0], rs[1] = rs[0];
                rn[0] = nn, rd[0] = den, rs[0] = cs;
                nbest = nbest < 2 ? nbest + 1 : 2;
            } else if (nbest == 1 || nn * rd[1] > rn[1] * den) {
                rn[1] = nn, rd[1] = den, rs[1] = cs;
                nbest = 2;
            }
        }
    }
    double best_err = INFINITY;
    for (int k = 0; k < nbest; k++) {
        if (refit(layout, &rs[k], sw, sx, sxx, &c, &e) && e < best_err) best = c, best_err = e;
    }
    if (best_err == INFINITY) return;
    /* refine: quants nearest to the stored grid, refit, while the error drops */
    wq_assign ba = assign_of(layout, &best, lo, hi);
    float bf = pass_q4(x, w, n, &ba, best.d, best.m, &s);
    for (int it = 0; it < WQ_NITER; it++) {
        if (!refit(layout, &s, sw, sx, sxx, &c, &e)) break;
        lsums cs;
        const wq_assign ca = assign_of(layout, &c, lo, hi);
        const float ce = pass_q4(x, w, n, &ca, c.d, c.m, &cs);
        if (!(ce < bf)) break;
        best = c, bf = ce, s = cs, ba = ca;
    }
    /* clearly better (the f32 sums are good to ~1e-5): take it; close: decide in double */
    if (bf < ref_err * 0.999f) {
        *p = best;
    } else if (bf < ref_err * 1.001f &&
               pass_q4_exact(x, w, n, &ba, best.d, best.m) <
                   pass_q4_exact(x, w, n, &ra, f16_round(p->d), f16_round(p->m))) {
        *p = best;
    }
}

/* One 32-block x[32] with the group's params. */
static void quant_block(int layout, const float *x, void *blk, const wq_params *p) {
    const float id = p->ida, m = p->ma;
    if (layout == LLMRT_TYPE_Q4_0) {
        block_q4_0 *b = blk;
        b->d = llmrt_fp32_to_fp16(p->d);
        for (int j = 0; j < 16; j++) {
            const int q0 = q4_of(layout, x[j], p);
            const int q1 = q4_of(layout, x[j + 16], p);
            b->qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    } else if (layout == LLMRT_TYPE_Q4_1) {
        block_q4_1 *b = blk;
        b->d = llmrt_fp32_to_fp16(p->d);
        b->m = llmrt_fp32_to_fp16(p->m);
        for (int j = 0; j < 16; j++) {
            const int q0 = q4_of(layout, x[j], p);
            const int q1 = q4_of(layout, x[j + 16], p);
            b->qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    } else if (layout == LLMRT_TYPE_Q8_0) {
        block_q8_0 *b = blk;
        b->d = llmrt_fp32_to_fp16(p->d);
        for (int j = 0; j < 32; j++) b->qs[j] = (int8_t)to_int_clamped(roundf(x[j] * id), -127.0f, 127.0f);
    } else { /* WQ_Q8A */
        block_q8a *b = blk;
        b->d = llmrt_fp32_to_fp16(p->d);
        b->m = llmrt_fp32_to_fp16(p->m);
        for (int j = 0; j < 32; j++) {
            b->qs[j] = (int8_t)(to_int_clamped((x[j] - m) * id + 0.5f, 0.0f, 255.0f) - 128);
        }
    }
}

int llmrt_wq_quantize_row(const float *x, void *y, int64_t k, int type, int64_t group, int rounding) {
    return llmrt_wq_quantize_row_w(x, NULL, y, k, type, group, rounding);
}

int llmrt_wq_quantize_row_w(const float *x, const float *w, void *y, int64_t k, int type, int64_t group,
                            int rounding) {
    const int layout = llmrt_wq_layout(type);
    if (layout != LLMRT_TYPE_Q4_0 && layout != LLMRT_TYPE_Q4_1 && layout != LLMRT_TYPE_Q8_0 &&
        layout != LLMRT_TYPE_WQ_Q8A) {
        return LLMRT_EUNSUPPORTED;
    }
    if (k < 0 || k % 32 != 0) return LLMRT_EINVAL;
    if (rounding != LLMRT_WQ_MINMAX && rounding != LLMRT_WQ_SEARCH) return LLMRT_EINVAL;
    if (group <= 0) group = k;
    if (group % 32 != 0) return LLMRT_EINVAL;
    const size_t bs = llmrt_type_traits_get(layout)->type_size;
    char *out = y;
    for (int64_t g0 = 0; g0 < k; g0 += group) {
        const int64_t n = g0 + group <= k ? group : k - g0;
        wq_params p;
        group_params(layout, x + g0, n, &p);
        if (rounding == LLMRT_WQ_SEARCH && (layout == LLMRT_TYPE_Q4_0 || layout == LLMRT_TYPE_Q4_1)) {
            search_q4(layout, x + g0, w != NULL ? w + g0 : NULL, n, &p);
        }
        for (int64_t i = g0; i < g0 + n; i += 32) {
            quant_block(layout, x + i, out + (size_t)(i / 32) * bs, &p);
        }
    }
    return LLMRT_OK;
}
