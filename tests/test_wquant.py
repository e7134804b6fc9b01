"""Weight-only quantization at load (llmrt/wquant.py, csrc/wquant.c, csrc/kernels/wq_*.c).

- group-wise min/max quantization against a numpy reference written here (scales, zero points,
  quants, values) for every weight_dtype x group_size x scheme;
- the int4 rounding search: never a larger squared error than min/max, per group;
- the private WQ_* kernels (int8 asym x Q8_1, fp32 / bf16 compute) against numpy, at every ISA
  level this CPU has;
- a tiny model quantized at load vs the unquantized model (named tolerances), the output head
  kept int8 under int4, and int4 sym group 32 min/max at load == the same weights stored as
  Q4_0 in the file (bit for bit);
- error cases;
- slow: F16 versions of the real models keep their perplexity (the issue's done-when numbers).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from llmrt import _core, quants, runtime, wquant
from llmrt.model import Model

sys.path.insert(0, os.path.dirname(__file__))

DTYPES = ("int4", "int8")
GROUPS = (32, 64, 128, -1)
SCHEMES = ("sym", "asym")
LAYOUT = {("int4", "sym"): "Q4_0", ("int4", "asym"): "Q4_1", ("int8", "sym"): "Q8_0",
          ("int8", "asym"): "WQ_Q8A"}
F32 = np.float32


# ---- numpy reference ------------------------------------------------------------------------

def _roundf(v):
    """C roundf (half away from zero), exact in float32."""
    t = np.trunc(v)
    return t + np.sign(v) * (np.abs(v - t) >= F32(0.5))


def _inv(d):
    with np.errstate(divide="ignore"):
        return np.where(d != 0, F32(1) / d, F32(0)).astype(F32)


def ref_group_quant(x, weight_dtype, scheme, group):
    """Group-wise quantization of rows x (rows, k), float32 arithmetic as the C code does it.
    Returns per-element (q, d, m): q the integer quant (unsigned for Q4_0/Q4_1/WQ_Q8A, signed
    for Q8_0), d and m the group's scale and min as stored (f16), and the dequantized values."""
    rows, k = x.shape
    g = k if group == -1 else group
    q = np.zeros((rows, k), np.int32)
    d_el = np.zeros((rows, k), F32)
    m_el = np.zeros((rows, k), F32)
    for g0 in range(0, k, g):
        xs = x[:, g0:g0 + g]
        if (weight_dtype, scheme) == ("int4", "sym"):
            idx = np.argmax(np.abs(xs), axis=1)
            d = (xs[np.arange(rows), idx] / F32(-8)).astype(F32)[:, None]
            qq = np.minimum(15, np.trunc(xs * _inv(d) + F32(8.5)))
            m = np.zeros_like(d)
        elif (weight_dtype, scheme) == ("int8", "sym"):
            d = (np.abs(xs).max(axis=1) / F32(127)).astype(F32)[:, None]
            qq = _roundf(xs * _inv(d))
            m = np.zeros_like(d)
        else:
            lo, hi = xs.min(axis=1)[:, None], xs.max(axis=1)[:, None]
            top = 15 if weight_dtype == "int4" else 255
            d = ((hi - lo) / F32(top)).astype(F32)
            qq = np.minimum(top, np.trunc((xs - lo) * _inv(d) + F32(0.5)))
            m = lo
        q[:, g0:g0 + g] = qq
        d_el[:, g0:g0 + g] = d.astype(np.float16).astype(F32)
        m_el[:, g0:g0 + g] = m.astype(np.float16).astype(F32)
    if (weight_dtype, scheme) == ("int4", "sym"):
        val = (q - 8).astype(F32) * d_el
    elif (weight_dtype, scheme) == ("int8", "sym"):
        val = q.astype(F32) * d_el
    else:
        val = q.astype(F32) * d_el + m_el
    return q, d_el, m_el, val


def parse_blocks(raw, layout, k):
    """(q, d, m) per element from the bytes of `layout` blocks, rows x (k/32 blocks)."""
    rows = raw.shape[0]
    bs = quants.type_size(layout)
    b = raw.reshape(rows, k // 32, bs)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(F32)
    m = np.zeros_like(d)
    if layout in ("Q4_0", "Q4_1"):
        off = 2 if layout == "Q4_0" else 4
        if layout == "Q4_1":
            m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(F32)
        qs = b[..., off:off + 16].astype(np.int32)
        q = np.concatenate([qs & 15, qs >> 4], axis=-1)
    elif layout == "Q8_0":
        q = b[..., 2:34].copy().view(np.int8).astype(np.int32)
    else:  # WQ_Q8A: stored q - 128
        m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(F32)
        q = b[..., 4:36].copy().view(np.int8).astype(np.int32) + 128
    rep = lambda a: np.repeat(a, 32, axis=1)  # noqa: E731
    return q.reshape(rows, k), rep(d), rep(m)


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: f"g{g}")
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("weight_dtype", DTYPES)
def test_group_quant_matches_numpy_reference(weight_dtype, scheme, group, rng):
    """rounding="minmax": the reference quantizer's arithmetic over each group."""
    # k = 352 = 2.75 groups of 128, 5.5 of 64: the last group is shorter (still whole blocks)
    x = (rng.standard_normal((7, 352)) * rng.uniform(0.01, 3, (7, 1))).astype(F32)
    x[3, 10] = 25.0                     # an outlier: its group's scale is large
    x[5, :] = 0.0                       # an all-zero row: d = 0, id = 0
    layout = LAYOUT[(weight_dtype, scheme)]
    cfg = wquant.make_config(weight_dtype, group, scheme)
    raw = wquant.quantize_tensor(x, cfg.type_id, cfg.group_size, rounding="minmax")
    q, d, m = parse_blocks(raw, layout, x.shape[1])
    rq, rd, rm, rval = ref_group_quant(x, weight_dtype, scheme, group)
    np.testing.assert_array_equal(d, rd)           # the group's scale in every block
    np.testing.assert_array_equal(m, rm)           # and its min (asym)
    np.testing.assert_array_equal(q, rq)
    np.testing.assert_array_equal(quants.dequantize(raw, layout), rval)
    # one scale per group: blocks of one group share it
    g = x.shape[1] if group == -1 else group
    for g0 in range(0, x.shape[1], g):
        assert (d[:, g0:g0 + g] == d[:, g0:g0 + 1]).all()


@pytest.mark.parametrize("layout", ["Q4_0", "Q4_1", "Q8_0"])
def test_group32_equals_ggml_reference(layout, rng):
    """group 32 min/max: the bytes of ggml's quantize_row_*_ref (llmrt.quants = gguf.quants)."""
    import gguf
    x = rng.standard_normal((5, 256)).astype(F32)
    raw = wquant.quantize_tensor(x, quants.type_id(layout), 32, rounding="minmax")
    np.testing.assert_array_equal(raw, quants.quantize(x, layout))
    np.testing.assert_array_equal(raw, gguf.quants.quantize(x, gguf.GGMLQuantizationType[layout]))


def _group_sq_err(x, raw, layout, group):
    """Squared error of the dequantized values per group: (rows, k / group), float64."""
    v = quants.dequantize(raw, layout).reshape(x.shape).astype(np.float64)
    e = (v - x.astype(np.float64)) ** 2
    g = x.shape[1] if group == -1 else group
    return e.reshape(x.shape[0], x.shape[1] // g, g).sum(axis=2)


def _test_groups(rng, rows, k):
    """Rows of different kinds: gaussian at many scales, heavy tails, one outlier, skewed
    (all positive), tiny values (f16 subnormal scales), a constant row, an all-zero row."""
    x = (rng.standard_normal((rows, k)) * np.exp(rng.uniform(-6, 2, (rows, 1)))).astype(F32)
    x[0] = rng.standard_t(2, k)
    x[1, 5] = 40.0
    x[2] = np.abs(x[2]) + 0.3
    x[3] *= F32(1e-6)
    x[4] = 0.75
    x[5] = 0.0
    return x


# The search's gain over min/max: mean over the gaussian rows' groups of (squared error, searched
# / min/max), measured here: Q4_0 0.81-0.89, Q4_1 0.81-0.85 by group size (real weights of
# Gemma 3 270M, whole tensors: 0.66-0.93). A search that returned min/max would give 1.0.
SEARCH_GAIN_MAX = 0.92


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: f"g{g}")
@pytest.mark.parametrize("layout", ["Q4_0", "Q4_1"])
def test_search_never_worse_than_minmax(layout, group, rng):
    x = _test_groups(rng, 48, 384)         # 384: g-1 and 3 groups of 128 per row
    tid = quants.type_id(layout)
    mm = _group_sq_err(x, wquant.quantize_tensor(x, tid, group, rounding="minmax"), layout, group)
    raw = wquant.quantize_tensor(x, tid, group, rounding="search")
    se = _group_sq_err(x, raw, layout, group)
    # per group: never larger (the C code keeps min/max when the search does not beat it; the
    # sums here are in another order, so equal errors may differ in the last bits)
    assert (se <= mm * (1 + 1e-12) + 1e-30).all(), np.argwhere(se > mm * (1 + 1e-12) + 1e-30)[:5]
    assert se[4:6].sum() == 0                       # constant and zero rows stay exact
    assert (se[6:] / mm[6:]).mean() < SEARCH_GAIN_MAX  # the gaussian rows, every group
    # one scale (and min) per group, in every block of the group
    q, d, m = parse_blocks(raw, layout, x.shape[1])
    g = x.shape[1] if group == -1 else group
    for g0 in range(0, x.shape[1], g):
        assert (d[:, g0:g0 + g] == d[:, g0:g0 + 1]).all() and (m[:, g0:g0 + g] == m[:, g0:g0 + 1]).all()


@pytest.mark.parametrize("tname", ["WQ_Q4_0_F32", "WQ_Q4_1_BF16", "Q8_0", "WQ_Q8A"])
def test_search_same_blocks_for_private_ids_int8_unchanged(tname, rng):
    """The private fp32/bf16 ids get the same int4 blocks as Q4_0 / Q4_1; int8 is min/max."""
    x = _test_groups(rng, 8, 128)
    tid = quants.type_id(tname)
    raw = wquant.quantize_tensor(x, tid, 64, rounding="search")
    layout = quants.type_name(_core.wq_layout(tid))
    if layout.startswith("Q4"):
        np.testing.assert_array_equal(raw, wquant.quantize_tensor(x, quants.type_id(layout), 64))
    else:
        np.testing.assert_array_equal(raw, wquant.quantize_tensor(x, tid, 64, rounding="minmax"))


def _weighted_group_err(x, raw, layout, group, w):
    """sum_j w_j (x_j - xq_j)^2 per group: (rows, k / group), float64."""
    v = quants.dequantize(raw, layout).reshape(x.shape).astype(np.float64)
    e = w.astype(np.float64)[None, :] * (v - x.astype(np.float64)) ** 2
    g = x.shape[1] if group == -1 else group
    return e.reshape(x.shape[0], x.shape[1] // g, g).sum(axis=2)


def _importance(rng, k):
    """Per-column importance as activations give it: log-normal over ~3 decades, a few columns
    100x the rest (the outlier channels of real models), some zero."""
    w = np.exp(rng.normal(0, 1.5, k)).astype(F32)
    w[rng.choice(k, 4, replace=False)] *= 100
    w[rng.choice(k, 3, replace=False)] = 0
    return w


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: f"g{g}")
@pytest.mark.parametrize("layout", ["Q4_0", "Q4_1"])
def test_weighted_search_equal_weights_is_unweighted(layout, group, rng):
    """Weights all equal to 1 (or 4: a power of two scales every weighted sum exactly) give
    the bytes of the unweighted search, bit for bit."""
    x = _test_groups(rng, 24, 384)
    tid = quants.type_id(layout)
    want = wquant.quantize_tensor(x, tid, group)
    for c in (1.0, 4.0):
        got = wquant.quantize_tensor(x, tid, group, importance=np.full(x.shape[1], c, F32))
        np.testing.assert_array_equal(got, want)


# The weighted search's gain over min/max in weighted error, mean over the gaussian rows' groups,
# measured (seed 1234): Q4_1 0.56-0.63, Q4_0 0.64-0.69 by group size, while the unweighted
# search scores 0.85-1.09 on that weighted error. A search that ignored the weights would fail.
WSEARCH_GAIN_MAX = 0.80


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: f"g{g}")
@pytest.mark.parametrize("layout", ["Q4_0", "Q4_1"])
def test_weighted_search_never_worse_than_minmax(layout, group, rng):
    """Per group, the weighted error of the weighted search is never larger than min/max's,
    and lower than the unweighted search's on average (it optimizes what it is scored on)."""
    x = _test_groups(rng, 48, 384)
    w = _importance(rng, x.shape[1])
    tid = quants.type_id(layout)
    mm = _weighted_group_err(x, wquant.quantize_tensor(x, tid, group, rounding="minmax"), layout, group, w)
    un = _weighted_group_err(x, wquant.quantize_tensor(x, tid, group), layout, group, w)
    raw = wquant.quantize_tensor(x, tid, group, importance=w)
    we = _weighted_group_err(x, raw, layout, group, w)
    assert (we <= mm * (1 + 1e-12) + 1e-30).all(), np.argwhere(we > mm * (1 + 1e-12) + 1e-30)[:5]
    assert we[4:6].sum() == 0                       # constant and zero rows stay exact
    assert (we[6:] / mm[6:]).mean() < WSEARCH_GAIN_MAX
    assert we[6:].sum() < un[6:].sum()
    # min/max ignores the weights
    np.testing.assert_array_equal(
        wquant.quantize_tensor(x, tid, group, rounding="minmax", importance=w),
        wquant.quantize_tensor(x, tid, group, rounding="minmax"))


def test_weighted_search_bad_weights_raise(rng):
    x = _test_groups(rng, 8, 64)
    tid = quants.type_id("Q4_1")
    for bad, msg in ((np.ones(32, F32), "one value per column"),
                     (np.full(64, -1.0, F32), "finite and >= 0"),
                     (np.full(64, np.nan, F32), "finite and >= 0")):
        with pytest.raises(ValueError, match=msg):
            wquant.quantize_tensor(x, tid, 32, importance=bad)


def test_importance_scaled_to_mean_1_or_dropped(caplog):
    """quantize_weights' per-tensor weights: scaled to mean 1; unusable ones (NaN, inf from an
    overflowing calibration pass, all zero, wrong length) fall back to the unweighted search
    with a warning instead of failing the load."""
    v = wquant._importance_of({"w": np.array([1.0, 3.0, 0.0, 4.0], F32)}, "w", 4)
    np.testing.assert_array_equal(v, np.array([0.5, 1.5, 0.0, 2.0], F32))
    assert wquant._importance_of(None, "w", 4) is None
    assert wquant._importance_of({"x": np.ones(4, F32)}, "w", 4) is None
    for bad in (np.array([1, np.nan, 1, 1], F32), np.array([1, np.inf, 1, 1], F32), np.zeros(4, F32),
                np.ones(3, F32), np.array([1, -1, 1, 1], F32)):
        with caplog.at_level("WARNING", logger="llmrt"):
            assert wquant._importance_of({"w": bad}, "w", 4) is None
    assert sum("unusable importance" in r.getMessage() for r in caplog.records) == 5


# ---- kernels of the private types ----------------------------------------------------------------

# f32 sums of n products in two different orders: |error| <= n * eps * sum|terms| is the bound;
# 1e-5 relative to sum|terms| covers n <= 1024 with room (eps = 6e-8).
DOT_RTOL = 1e-5


def _bf16_bits(a):
    u = a.astype(F32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("n", [32, 96, 1024])
@pytest.mark.parametrize("layout", ["Q4_0", "Q4_1", "Q8_0", "Q8A"])
@pytest.mark.parametrize("compute", ["F32", "BF16"])
def test_vec_dot_dequant_kernels(compute, layout, n, isa_level, rng):
    tname = f"WQ_{layout}_{compute}"
    tid = quants.type_id(tname)
    w = rng.standard_normal(n).astype(F32)
    a = rng.standard_normal(n).astype(F32)
    raw = wquant.quantize_tensor(w[None], tid, 64 if n % 64 == 0 else 32)[0]
    wd = quants.dequantize(raw, tname).astype(np.float64)
    if compute == "F32":
        act, av = a.view(np.uint8), a.astype(np.float64)
    else:
        bits = _bf16_bits(a)
        act = bits.view(np.uint8)
        av = (bits.astype(np.uint32) << 16).view(F32).astype(np.float64)
    got = _core.vec_dot(tid, raw, act, n)
    want = float(np.sum(wd * av))
    assert abs(got - want) <= DOT_RTOL * float(np.sum(np.abs(wd * av)))


@pytest.mark.parametrize("n", [32, 160, 1024])
def test_vec_dot_q8a_q8_1(n, isa_level, rng):
    tid = quants.type_id("WQ_Q8A")
    w = (rng.standard_normal(n) + 0.7).astype(F32)
    a = rng.standard_normal(n).astype(F32)
    raw = wquant.quantize_tensor(w[None], tid, 32)[0]
    act = quants.quantize(a[None], "Q8_1")[0]
    q, d, m = parse_blocks(raw[None], "WQ_Q8A", n)
    ab = act.reshape(n // 32, 36)
    da = ab[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float64)
    sa = ab[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float64)
    qa = ab[:, 4:].copy().view(np.int8).astype(np.int64)
    qw = (q[0] - 128).reshape(n // 32, 32).astype(np.int64)
    dw, mw = d[0, ::32].astype(np.float64), m[0, ::32].astype(np.float64)
    terms = dw * da * (qw * qa).sum(axis=1) + (mw + 128 * dw) * sa
    got = _core.vec_dot(tid, raw, act, n)
    assert abs(got - terms.sum()) <= DOT_RTOL * float(np.abs(terms).sum() + 1e-30)


def test_vec_dot_q8a_extremes_do_not_saturate(isa_level):
    """q_w = -128 (unsigned 0) against q_a = 127 everywhere: maddubs pairs 2*128*127 = 32512 fit
    in i16, so the integer sum is exact: 32 * -128 * 127 per block."""
    n = 64
    w = np.zeros((n // 32, 36), np.uint8)
    w[:, 0:2] = np.array([1.0], np.float16).view(np.uint8)         # d = 1, m = 0
    w[:, 4:] = np.array([-128], np.int8).view(np.uint8)
    a = np.zeros((n // 32, 36), np.uint8)
    a[:, 0:2] = np.array([1.0], np.float16).view(np.uint8)         # d = 1, s = 0
    a[:, 4:] = 127
    got = _core.vec_dot(quants.type_id("WQ_Q8A"), w.ravel(), a.ravel(), n)
    assert got == n * -128 * 127


PACKED_WQ = ["WQ_Q8A"] + [f"WQ_{L}_{c}" for c in ("F32", "BF16") for L in ("Q4_0", "Q4_1", "Q8_0", "Q8A")]


def _wq_act(tname, K, n, rng):
    """n activation rows for a private type: Q8_1 blocks (WQ_Q8A), f32, or bf16 bits."""
    from test_gemm import random_act
    from gguf import GGMLQuantizationType as T
    if tname == "WQ_Q8A":
        return random_act(T.Q8_1, K, n, rng)
    a = (rng.standard_normal((n, K)) * np.exp(rng.normal(0, 1, (n, 1)))).astype(F32)
    return (_bf16_bits(a) if tname.endswith("BF16") else a).view(np.uint8).reshape(n, -1)


@pytest.mark.parametrize("K", [32, 416, 1056])
@pytest.mark.parametrize("tname", PACKED_WQ)
def test_packed_wq_gemm_gives_vec_dot_bits(tname, K, isa_level, rng):
    """The private types keep the packed layout of the 32-block type they share (csrc/kernels/
    gemm_q32.h; WQ_Q8A: Q8_0's quants with Q4_1's d and m): packing is lossless, and every gemm
    call (decode, prefill of 2..70 tokens, calls of gemm_groups() groups, a last group with one
    real row) gives the level's vec_dot bits, the extreme int8 quant -128 included. K = 1056 spans
    more than one of the AVX2 kernel's dequantized chunks (16 blocks) and ends inside one."""
    from test_gemm import assert_calls_of_several_groups
    tid = quants.type_id(tname)
    R = _core.pack_rows(tid)
    M, n_xs = 4 * R + 1, (1, 2, 3, 5, 17, 64, 70)
    w = (rng.standard_normal((M, K)) * rng.uniform(0.01, 2.0, (M, 1)) + rng.uniform(-1, 1, (M, 1))).astype(F32)
    raw = wquant.quantize_tensor(w, tid, 32)
    bs = raw.shape[1] // (K // 32)
    if "Q8" in tname:
        raw[0].reshape(K // 32, bs)[:, bs - 32:] = np.array([-128], np.int8).view(np.uint8)  # every quant -128
    x = _wq_act(tname, K, max(n_xs), rng)
    ref = np.array([[_core.vec_dot(tid, raw[m], x[j], K) for m in range(M)] for j in range(max(n_xs))], F32)
    assert np.isfinite(ref).all()
    pw = _core.pack_weight(raw, tid, K, M)
    np.testing.assert_array_equal(np.concatenate([pw.unpack(g) for g in range(pw.n_groups)]), raw)
    for n_x in n_xs:
        y = np.concatenate([pw.gemm(g, x[:n_x]) for g in range(pw.n_groups)], axis=1)[:, :M]
        np.testing.assert_array_equal(y.view(np.uint32), ref[:n_x].view(np.uint32), err_msg=f"n_x={n_x}")
    if pw.gemm_groups() > 1:
        assert_calls_of_several_groups(pw, x, ref, R, M, n_xs, f"{tname} K={K}")


WQ_BF16 = [f"WQ_{L}_BF16" for L in ("Q4_0", "Q4_1", "Q8_0", "Q8A")]


@pytest.mark.parametrize("level", ["avx512", "avx512_vnni"])
def test_wq_bf16_uses_vdpbf16ps_where_the_cpu_has_it(level):
    """compute_dtype "bf16" runs vdpbf16ps (csrc/kernels/x86/wq_w.inc) at the 512-bit levels iff the
    CPU has AVX512-BF16; without it the AVX2 fp32 kernels stay (levels stack)."""
    from test_gemm_float import run_level
    runs = [(True, True, "_dp_avx512_emu"), (True, False, None)]
    if level in runtime.available_isas():
        runs.append((False, None, "_dp_avx512" if runtime.cpu_features()["avx512_bf16"] else None))
    for emulated, bf16, suffix in runs:
        _, names = run_level(level, emulated, lambda: None, bf16=bf16)
        for tname in WQ_BF16:
            t = tname.lower()[3:]                          # q4_0_bf16 ...
            want_dot = f"vec_dot_wq_{t}{suffix}" if suffix else f"vec_dot_{t}_avx2"
            want_gemm = f"gemm_wq_{t}{suffix}" if suffix else f"gemm_wq_{t}_avx2"
            assert names["vec_dot"][tname] == want_dot, (emulated, bf16, names["vec_dot"][tname])
            assert names["gemm"][tname] == want_gemm, (emulated, bf16, names["gemm"][tname])


@pytest.mark.parametrize("tname", WQ_BF16)
def test_wq_bf16_real_equals_emulated(tname, rng):
    """Where the CPU has AVX512-BF16: the real vdpbf16ps kernels and their emulated twins give the
    same bits (vec_dot, decode, prefill)."""
    if "avx512" not in runtime.available_isas() or not runtime.cpu_features()["avx512_bf16"]:
        pytest.skip("CPU lacks AVX512-BF16: nothing to compare with")
    from test_gemm_float import run_level
    tid = quants.type_id(tname)
    K, M, n_xs = 1056, 4 * _core.pack_rows(tid) + 1, (1, 2, 5, 70)
    w = (rng.standard_normal((M, K)) + rng.uniform(-1, 1, (M, 1))).astype(F32)
    raw = wquant.quantize_tensor(w, tid, 32)
    x = _wq_act(tname, K, max(n_xs), rng)

    def compute():
        pw = _core.pack_weight(raw, tid, K, M)
        dots = np.array([[_core.vec_dot(tid, raw[m], x[j], K) for m in range(M)] for j in range(3)], F32)
        return [dots] + [np.concatenate([pw.gemm(g, x[:n]) for g in range(pw.n_groups)], axis=1) for n in n_xs]

    real, nr = run_level("avx512", False, compute)
    emu, ne = run_level("avx512", True, compute)
    assert ne["gemm"][tname] == nr["gemm"][tname] + "_emu"
    for what, a, b in zip(["vec_dot"] + [f"gemm n_x={n}" for n in n_xs], real, emu):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=f"{tname} {what}")


# ---- models ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hf_gguf import tiny_model, write_gguf
    model, config = tiny_model("llama", seed=0)
    return str(write_gguf(model, config, tmp_path_factory.mktemp("wq") / "f32.gguf", dtype="f32"))


IDS = [1, 5, 9, 33, 100, 7, 250, 3, 64, 17, 2, 300]
# max |logit diff| / max |logit| of the tiny llama (3 layers, dim 64, ff 128, random weights)
# quantized at load vs f32, measured over every scheme x group x compute: int8 0.010-0.023,
# int4 0.17-0.21 with min/max rounding and the head int4 (random weights have no outliers to
# spare: int4 is coarse); bounds ~2.2x that.
LOGIT_RTOL = {"int8": 0.05, "int4": 0.45}


@pytest.mark.parametrize("compute", ["int8", "fp32", "bf16"])
@pytest.mark.parametrize("group", [32, 64, -1], ids=lambda g: f"g{g}")
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("weight_dtype", DTYPES)
def test_tiny_model_quantized_at_load(tiny_f32, weight_dtype, scheme, group, compute):
    ref = Model(tiny_f32, n_threads=2, ctx_size=64)(IDS)
    m = Model(tiny_f32, n_threads=2, ctx_size=64, weight_dtype=weight_dtype, group_size=group,
              scheme=scheme, compute_dtype=compute)
    got = m(IDS)
    assert m.wq.type_name == wquant._TYPES[(weight_dtype, scheme)][compute]
    # every matmul weight is replaced, nothing else (the untied token_embd feeds get_rows only)
    names = set(m._replaced)
    assert "output.weight" in names and "token_embd.weight" not in names
    # the output head is int8 (same scheme and compute) under int4 too, the rest weight_dtype
    assert m._replaced["output.weight"][1] == quants.type_id(wquant._TYPES[("int8", scheme)][compute])
    assert m._replaced["blk.1.ffn_up.weight"][1] == m.wq.type_id
    assert all(n.endswith(".weight") and len(m.gguf.tensors[n].shape) == 2 for n in names)
    assert "blk.0.attn_q.weight" in names and "blk.2.ffn_down.weight" in names
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert 0 < err < LOGIT_RTOL[weight_dtype]


# max |logit diff| / max |logit| of compute_dtype "bf16" vs "fp32" on the same quantized weights:
# the activations rounded to bf16 (2^-9 relative each) account for all of it; measured 4.2e-3 to
# 4.5e-3 at avx2 and at the emulated vdpbf16ps level (whose other rounding differences can move an
# activation across a bf16 rounding boundary: the two levels then differ by up to ~4e-3 themselves).
BF16_COMPUTE_RTOL = 1.5e-2


@pytest.mark.parametrize("weight_dtype,scheme", [("int4", "sym"), ("int4", "asym"), ("int8", "sym"), ("int8", "asym")])
def test_bf16_compute_close_to_fp32_compute_at_every_level(tiny_f32, weight_dtype, scheme, isa_level):
    """compute_dtype "bf16" through a whole model, at every level (vdpbf16ps at the 512-bit levels,
    emulated here where the CPU lacks it): prefill and decode stay within the bf16-activation
    bound of compute_dtype "fp32" on the same weights."""
    kw = dict(n_threads=2, ctx_size=64, weight_dtype=weight_dtype, scheme=scheme)
    fp32 = Model(tiny_f32, compute_dtype="fp32", **kw)(IDS)
    m = Model(tiny_f32, compute_dtype="bf16", **kw)
    s = m.new_session(ctx_size=64)
    for got in (m(IDS), np.stack([s.eval([t]) for t in IDS])):
        err = np.abs(got - fp32).max() / np.abs(fp32).max()
        assert 0 < err < BF16_COMPUTE_RTOL


def test_int4_sym_g32_equals_q4_0_file(tiny_f32, tmp_path):
    """int4 sym group 32 int8-compute, min/max rounding, head int4 too, at load == the matmul
    weights written as Q4_0 in a file (the reference quantizer; same kernels): bit for bit."""
    from llmrt.gguf import GGUFFile
    from llmrt.quantize import write_gguf
    f = GGUFFile(tiny_f32)
    names = set(wquant.matmul_weight_names(f.tensors))
    types = {n: ("Q4_0" if n in names else quants.type_name(t.type)) for n, t in f.tensors.items()}
    out = tmp_path / "q4_0.gguf"
    write_gguf(f, str(out), types, progress=False)
    f.close()
    a = Model(tiny_f32, n_threads=2, ctx_size=64, weight_dtype="int4", rounding="minmax",
              quantize_output=True)(IDS)
    b = Model(str(out), n_threads=2, ctx_size=64)(IDS)
    np.testing.assert_array_equal(a, b)
    c = Model(tiny_f32, n_threads=2, ctx_size=64, weight_dtype="int4", quantize_output=True)(IDS)
    assert not np.array_equal(a, c)                 # the search changes the blocks


def test_bf16_model(tiny_f32, tmp_path):
    """A BF16 model (matmul weights stored BF16) quantized at load: same bound vs the f32 model."""
    from llmrt.gguf import GGUFFile
    from llmrt.quantize import write_gguf
    f = GGUFFile(tiny_f32)
    names = set(wquant.matmul_weight_names(f.tensors)) | {"token_embd.weight"}
    types = {n: ("BF16" if n in names else quants.type_name(t.type)) for n, t in f.tensors.items()}
    out = str(tmp_path / "bf16.gguf")
    write_gguf(f, out, types, progress=False)
    f.close()
    m = Model(out, n_threads=2, ctx_size=64, weight_dtype="int8", compute_dtype="fp32")
    assert m.gguf.tensors["blk.0.attn_q.weight"].type_name == "BF16" and len(m._replaced) > 0
    ref = Model(tiny_f32, n_threads=2, ctx_size=64)(IDS)
    err = np.abs(m(IDS) - ref).max() / np.abs(ref).max()
    assert 0 < err < LOGIT_RTOL["int8"]


def test_tied_token_embd_is_quantized(tmp_path):
    pytest.importorskip("transformers")
    from hf_gguf import tiny_model, write_gguf
    model, config = tiny_model("llama", seed=1, tie_word_embeddings=True)
    path = str(write_gguf(model, config, tmp_path / "tied.gguf", dtype="f16"))
    m = Model(path, n_threads=2, ctx_size=64, weight_dtype="int8")
    assert "token_embd.weight" in m._replaced
    ref = Model(path, n_threads=2, ctx_size=64)(IDS)
    err = np.abs(m(IDS) - ref).max() / np.abs(ref).max()
    assert err < LOGIT_RTOL["int8"]
    # int4: the tied head stays int8 (logged), unless quantize_output
    m4 = Model(path, n_threads=2, ctx_size=64, weight_dtype="int4", scheme="asym")
    assert m4._replaced["token_embd.weight"][1] == quants.type_id("WQ_Q8A")
    assert m4._replaced["blk.0.attn_q.weight"][1] == quants.type_id("Q4_1")
    assert "output WQ_Q8A" in m4.wq_summary
    m4q = Model(path, n_threads=2, ctx_size=64, weight_dtype="int4", scheme="asym", quantize_output=True)
    assert m4q._replaced["token_embd.weight"][1] == quants.type_id("Q4_1")


# ---- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    (dict(weight_dtype="int2"), "weight_dtype must be one of int4, int8"),
    (dict(weight_dtype="int4", group_size=16), "group_size must be one of 32, 64, 128, -1"),
    (dict(weight_dtype="int4", scheme="nf4"), "scheme must be one of sym, asym"),
    (dict(weight_dtype="int8", compute_dtype="fp16"), "compute_dtype must be one of int8, fp32, bf16"),
    (dict(group_size=64), "group_size needs weight_dtype"),
    (dict(scheme="asym", compute_dtype="fp32"), "scheme, compute_dtype needs weight_dtype"),
    (dict(weight_dtype="int4", rounding="gptq"), "rounding must be one of imatrix, search, minmax"),
    (dict(quantize_output=True), "quantize_output needs weight_dtype"),
    (dict(weight_dtype="int8", rounding="search"), "rounding 'search' is for int4 scales"),
    (dict(weight_dtype="int8", rounding="imatrix"), "rounding 'imatrix' is for int4 scales"),
])
def test_invalid_knobs(kw, match):
    with pytest.raises(ValueError, match=match):
        Model("/nonexistent.gguf", **kw)      # checked before the file is opened


def test_int8_takes_minmax_rounding_only():
    """int8 is always min/max: rounding="search" was accepted and ignored; "minmax" says what
    int8 does and is accepted, as is no rounding at all."""
    assert wquant.make_config("int8", rounding="minmax").rounding == "minmax"
    assert wquant.make_config("int8").weight_dtype == "int8"


def test_defaults():
    c = wquant.make_config("int4")
    assert (c.group_size, c.scheme, c.compute_dtype, c.type_name) == (32, "sym", "int8", "Q4_0")
    assert (c.rounding, c.quantize_output, c.output_type_name) == ("imatrix", False, "Q8_0")
    assert wquant.make_config(None) is None


def test_quantized_model_rejected():
    path = "/work/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    if not os.path.exists(path):
        pytest.skip(f"real model not found: {path}")
    with pytest.raises(ValueError, match="needs an F32/F16/BF16 model.*Q4_1"):
        Model(path, weight_dtype="int8")


def test_wq_quantize_rows_checks():
    x = np.zeros((2, 64), F32)
    with pytest.raises(ValueError, match="multiple of 32"):
        _core.wq_quantize_rows(x, np.zeros((2, 36), np.uint8), quants.type_id("Q4_0"), 48)
    with pytest.raises(ValueError, match="not a weight-only type"):
        _core.wq_quantize_rows(x, np.zeros((2, 36), np.uint8), quants.type_id("IQ4_NL"), 32)


# ---- slow: the done-when numbers on F16 versions of the real models ------------------------

MODEL_DIR = os.environ.get("LLMRT_MODEL_DIR", "/work/models")
REAL = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
PPL_CTX, PPL_TOKENS = 128, 512     # 4 chunks of 128, 256 scored tokens: about a minute per model
# Issue 4's done-when: int8 within 0.5 %, int4 asym group 32 within 3 % of the F16 model's
# perplexity. Measured here (ctx 128, 512 tokens; also at 2048 tokens; int4 with the defaults:
# rounding imatrix = calibration pass + weighted search, output head int8) -- NOT all met:
#   config (group 32)       SmolLM2 512 / 2048 tok    Gemma 3 270M 512 / 2048 tok
#   int8 asym, int8         +0.10 / +0.07 %           -0.08 %
#   int8 sym, fp32          +0.38 / +0.29 %           (not run)
#   int8 sym, int8          +0.93 / +0.84 %           -0.13 %   llama.cpp's own Q8_0 of the same
#                                                               F16: +0.54 % on SmolLM2 (2048 tok)
#   int4 asym, int8         +0.22 / +0.20 %        +5.76 / +4.33 %
#     rounding search       -0.75 / -0.06 %           +8.91 / +14.06 % (no calibration pass)
#     min/max, head int4    +13.7 / +8.1 %            +21.6 / +25.3 %  (llama.cpp's own Q4_1 of
#                                                               the Gemma F16: +19.1 %, 512 tok)
# int4 misses 3 % on Gemma: its F16 weights are dequantized Q5_0 (ffn_gate/up, attn_q/k/v) and
# Q6_K (half of ffn_down) blocks, 32- and 64-level grids that 16 levels per group of 32 cannot
# hold (README, Weight-only quantization). The bounds below are the measurements with a margin,
# so a regression fails; the done-when bounds are the ones marked.
PPL_RTOL = {
    "smollm2": {("int8", "asym", "int8"): 0.005,       # done-when
                ("int8", "sym", "fp32"): 0.005,        # done-when
                ("int8", "sym", "int8"): 0.015,
                ("int4", "asym", "int8"): 0.03},       # done-when
    "gemma3": {("int8", "asym", "int8"): 0.005,        # done-when
               ("int8", "sym", "int8"): 0.005,         # done-when
               ("int4", "asym", "int8"): 0.07},
}


@pytest.fixture(scope="session")
def f16_models(tmp_path_factory):
    from llmrt.quantize import float_file
    out = {}
    d = tmp_path_factory.mktemp("f16")
    for name, fn in REAL.items():
        src = os.path.join(MODEL_DIR, fn)
        if not os.path.exists(src):
            pytest.skip(f"real model not found: {src}")
        out[name] = str(d / f"{name}-f16.gguf")
        float_file(src, out[name], "F16", progress=False)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REAL))
def test_f16_model_keeps_perplexity(f16_models, name):
    from llmrt.perplexity import perplexity, read_text
    text = read_text(os.path.join(os.path.dirname(__file__), "data", "ppl_text.txt"))

    def ppl(**kw):
        m = Model(f16_models[name], n_threads=2, ctx_size=PPL_CTX, **kw)
        ids = m.tokenizer.encode(text, add_special=True, parse_special=False)
        return perplexity(m, ids, PPL_CTX, max_tokens=PPL_TOKENS, progress=False).ppl

    base = ppl()
    for (wd, sc, cd), tol in PPL_RTOL[name].items():
        p = ppl(weight_dtype=wd, scheme=sc, group_size=32, compute_dtype=cd)
        print(f"{name}: f16 ppl {base:.4f}; {wd} {sc} g32 {cd}: {p:.4f} ({100 * (p / base - 1):+.2f} %)")
        assert abs(p / base - 1) < tol
