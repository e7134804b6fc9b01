"""Graph ops (csrc/ops/*.c through llmrt._core.Graph) against numpy references written from the
definitions, and from ggml's formulas where its exact semantics matter (RoPE incl. NeoX, partial
rotary, YaRN and freq_factors; GELU through an f16 table).

Activations enter a graph as rows of an F32 "embedding" weight picked by get_rows with tokens
0..n-1, so any numpy array can be fed to any op. Shapes are odd on purpose (not multiples of 8,
16 or the mul_mat row block).

Run: python -m pytest -q tests/test_ops.py
"""
import math

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import llmrt._core as core
from llmrt import quants, runtime

# ---- tolerances --------------------------------------------------------------------------------
# f32 kernels vs float64 references of elementwise maths: a few f32 roundings (2^-24 = 6e-8 each)
# plus libm's expf/tanhf (<= 2 ulp) -> 1e-6 relative is comfortably above, far below any bug.
F32_RTOL = 1e-6
F32_ATOL = 1e-7
# rms_norm: sum of squares in double, one sqrtf, one division and one product in f32.
NORM_RTOL = 1e-6
# GELU goes through an f16 table (ggml's GGML_GELU_FP16): vs our numpy replica of the table, the
# only difference is tanhf vs np.tanh in f32 (1-2 ulp), which can flip one f16 rounding: one f16
# ulp = 2^-10 relative.
GELU_TABLE_RTOL = 2.0 ** -10
GELU_ATOL = 1e-6
# Vs the exact formula: the input is rounded to f16 (|dx| <= 2^-11 |x|) and gelu's slope is at
# most GELU_MAX_SLOPE (1.13 at x ~ 2.4), then the output is rounded to f16 (2^-11 |y|).
GELU_MAX_SLOPE = 1.13
F16_HALF_ULP = 2.0 ** -11
# RoPE vs a numpy replica of ggml's f32 arithmetic (theta by repeated f32 multiplication, cosf,
# sinf): only libm differences (1-2 ulp of cos/sin), times |x| ~ 3.
ROPE_RTOL = 1e-5
ROPE_ATOL = 2e-6
# RoPE vs the float64 definition at small positions (p < 40): the repeated f32 multiplication of
# theta drifts by <= n_rot/2 * 2^-24 relative, times p <= 40 rad -> < 1e-4 absolute in the angle.
ROPE_DEF_ATOL = 3e-4
# mul_mat: the f32 dot products themselves (relative to sum |w x|), see tests/test_dot.py.
DOT_RTOL = 1e-5
# attention with an f32 cache vs float64: dot products of hd <= 40 floats, exp, a weighted sum.
ATTN_F32_ATOL = 2e-5
# f16 cache: the reference uses the same f16-rounded K/V, and rounds q and the probabilities to
# f16 before their products as the kernel does (llama.cpp's non-flash path), so only f32
# arithmetic remains (the fixed seed keeps every probability away from an f16 rounding tie).
ATTN_F16_ATOL = 2e-5


def f16_round(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


class Builder:
    """A graph plus a way to feed numpy arrays in as activations.

    act(a): a is [n, ...per-token dims] (numpy order); returns a Tensor [...reversed, n]."""

    def __init__(self, max_tokens, n_threads=1):
        self.g = core.Graph(max_tokens, n_threads)
        if n_threads > 1:
            self.g.single_thread_work = 0  # share every node, however small: test the chunking
        self.max_tokens = max_tokens
        self.tok = self.g.input_tokens()
        self._pos = None

    @property
    def pos(self):
        if self._pos is None:
            self._pos = self.g.input_positions()
        return self._pos

    def act(self, a):
        a = np.ascontiguousarray(a, dtype=np.float32)
        n = a.shape[0]
        assert n == self.max_tokens, "activations are fed as one row per token"
        per_tok = a.shape[1:]
        d = int(np.prod(per_tok))
        w = self.g.weight(a.reshape(n, d), 0, (d, n))
        x = self.g.get_rows(w, self.tok)
        if len(per_tok) > 1:
            x = self.g.reshape(x, tuple(reversed(per_tok)))
        return x

    def weight(self, a, type_id=0):
        """A float weight from a numpy array in numpy order (ne reversed)."""
        ne = tuple(reversed(a.shape))
        if type_id == int(T.F16):
            a = np.ascontiguousarray(a, dtype=np.float16)
        elif type_id == int(T.BF16):
            a = np.ascontiguousarray(gguf.quants.quantize(np.asarray(a, np.float32), T.BF16))
        else:
            a = np.ascontiguousarray(a, dtype=np.float32)
        return self.g.weight(a, type_id, ne)

    def run(self, y, n=None, positions=None, **kw):
        n = self.max_tokens if n is None else n
        self.g.set_output(y)
        self.g.build()
        pos = np.arange(n, dtype=np.int32) if positions is None else positions
        return self.g.run(np.arange(n, dtype=np.int32), pos, **kw)


# ---- elementwise -------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(5, 37), (4, 3, 13), (1, 1)], ids=["2d", "3d-per-head", "1x1"])
def test_rms_norm(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32) * 3
    b = Builder(shape[0])
    y = b.run(b.g.rms_norm(b.act(x), 1e-5))
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, rtol=NORM_RTOL, atol=F32_ATOL)


def rms_norm_ggml(x, eps):
    """ggml_compute_forward_rms_norm_f32 step by step: a sequential double sum of the f32
    squares, mean and scale in f32, y = x * scale."""
    x = np.asarray(x, np.float32)
    y = np.empty_like(x)
    for r in np.ndindex(x.shape[:-1]):
        s = 0.0                                   # a Python float is a double: ggml_float
        for v in (x[r] * x[r]).astype(np.float32):
            s += float(v)
        mean = np.float32(s / x.shape[-1])
        scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
        y[r] = x[r] * scale
    return y


@pytest.mark.parametrize("n_threads", [1, 2])
def test_rms_norm_is_ggml_bit_exact(rng, n_threads):
    """9 rows (two chunks of 4 summed side by side, one row alone) of odd length, values over
    many magnitudes: equal to ggml's sequence bit for bit, every row with its own sum and scale."""
    x = (rng.standard_normal((9, 301)) * np.exp(rng.uniform(-8, 8, (9, 301)))).astype(np.float32)
    b = Builder(9, n_threads)
    y = b.run(b.g.rms_norm(b.act(x), 1e-6))
    np.testing.assert_array_equal(y, rms_norm_ggml(x, 1e-6))


@pytest.mark.parametrize("shape", [(5, 37), (4, 3, 13)], ids=["2d", "3d-per-head"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_rms_norm_times_weight_is_fused_and_bit_exact(rng, shape, n_threads):
    """rms_norm(x) * w (an F32 weight over ne0) runs as one node (graph.c fuses it) and gives
    the two nodes' results bit for bit; a norm read twice, or a weight of another shape or type,
    keeps its own MUL node."""
    x = rng.standard_normal(shape).astype(np.float32) * 3
    w = rng.standard_normal(shape[-1]).astype(np.float32)

    def build(kind):
        b = Builder(shape[0], n_threads)
        n = b.g.rms_norm(b.act(x), 1e-6)
        if kind == "fused":
            y = b.g.mul(n, b.weight(w))
        elif kind == "norm-read-twice":                 # y = n * w + n: n has two readers
            y = b.g.add(b.g.mul(n, b.weight(w)), n)
        else:                                           # an f16 weight: not fused
            y = b.g.mul(n, b.weight(w, int(T.F16)))
        out = b.run(y)
        return out, b.g.n_nodes

    y, nodes = build("fused")
    twice, nodes_twice = build("norm-read-twice")
    f16, nodes_f16 = build("f16-weight")
    # unfused references: the norm alone, times w in numpy (one f32 rounding, as the MUL node)
    b = Builder(shape[0], n_threads)
    normed = b.run(b.g.rms_norm(b.act(x), 1e-6))
    np.testing.assert_array_equal(y, normed * w)
    np.testing.assert_array_equal(twice, normed * w + normed)
    np.testing.assert_array_equal(f16, normed * w.astype(np.float16).astype(np.float32))
    assert nodes == nodes_f16 - 1                       # the MUL folded into the norm
    assert nodes_twice == nodes_f16 + 1                 # MUL and ADD both kept


@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("bkind", ["act", "vec-f32", "vec-f16", "vec-bf16", "scalar-f32",
                                   "per-head-f32"])
def test_binary(rng, op, bkind):
    n, nh, d = 5, 3, 11
    a = rng.standard_normal((n, nh, d)).astype(np.float32)
    bl = Builder(n)
    ta = bl.act(a)
    if bkind == "act":
        bv = rng.standard_normal((n, nh, d)).astype(np.float32)
        tb = bl.act(bv)
    elif bkind == "scalar-f32":
        bv = rng.standard_normal((1,)).astype(np.float32)
        tb = bl.weight(bv)
    elif bkind == "per-head-f32":
        bv = rng.standard_normal((nh, d)).astype(np.float32)   # [d, nh] weight: broadcast over n
        tb = bl.weight(bv)
    else:
        tid = {"vec-f32": int(T.F32), "vec-f16": int(T.F16), "vec-bf16": int(T.BF16)}[bkind]
        bv = rng.standard_normal((d,)).astype(np.float32)
        tb = bl.weight(bv, tid)
        if tid == int(T.F16):
            bv = f16_round(bv)
        elif tid == int(T.BF16):
            bv = gguf.quants.dequantize(gguf.quants.quantize(bv, T.BF16), T.BF16)
    y = bl.run(getattr(bl.g, op)(ta, tb))
    ref = a.astype(np.float64) + bv if op == "add" else a.astype(np.float64) * bv
    np.testing.assert_allclose(y, ref, rtol=F32_RTOL, atol=F32_ATOL)


@pytest.mark.parametrize("op", ["scale", "silu", "softcap"])
def test_unary(rng, op):
    x = (rng.standard_normal((7, 29)) * 6).astype(np.float32)
    b = Builder(7)
    tx = b.act(x)
    x64 = x.astype(np.float64)
    if op == "scale":
        y, ref = b.run(b.g.scale(tx, 0.37)), x64 * np.float32(0.37)
    elif op == "silu":
        y, ref = b.run(b.g.silu(tx)), x64 / (1 + np.exp(-x64))
    else:
        y, ref = b.run(b.g.softcap(tx, 5.0)), 5.0 * np.tanh(x64 / 5.0)
    np.testing.assert_allclose(y, ref, rtol=F32_RTOL, atol=F32_ATOL)


GELU_A = np.float32(0.044715)
SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)


def gelu_formula(x):
    x = np.asarray(x, dtype=np.float32)
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(SQRT_2_OVER_PI * x * (np.float32(1) + GELU_A * x * x)))


def gelu_ggml(x):
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: saturate outside [-10, 10], else the f16 table."""
    x = np.asarray(x, dtype=np.float32)
    y = f16_round(gelu_formula(f16_round(x)))
    y = np.where(x >= 10, x, y)
    return np.where(x <= -10, np.float32(0), y)


def test_gelu_matches_ggml_table(rng):
    x = np.concatenate([rng.standard_normal(200) * 4, [-12, -10, -9.99, 0, 1e-3, 9.99, 10, 25]])
    x = x.astype(np.float32)[None, :]
    b = Builder(1)
    y = b.run(b.g.gelu(b.act(x)))
    np.testing.assert_allclose(y, gelu_ggml(x), rtol=GELU_TABLE_RTOL, atol=GELU_ATOL)
    exact = gelu_formula(x.astype(np.float64))
    bound = F16_HALF_ULP * (GELU_MAX_SLOPE * np.abs(x) + np.abs(exact)) * 1.01 + GELU_ATOL
    assert (np.abs(y - exact) <= bound).all()
    assert y[0, -1] == 25.0 and y[0, 200] == 0.0  # the saturated ends (x = 25, x = -12)


@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_glu(rng, act):
    gate = (rng.standard_normal((3, 41)) * 3).astype(np.float32)
    up = rng.standard_normal((3, 41)).astype(np.float32)
    b = Builder(3)
    y = b.run(b.g.glu(b.act(gate), b.act(up), act))
    if act == "silu":
        ref = gate / (1 + np.exp(-gate.astype(np.float64))) * up
        np.testing.assert_allclose(y, ref, rtol=F32_RTOL, atol=F32_ATOL)
    else:
        np.testing.assert_allclose(y, gelu_ggml(gate) * up, rtol=GELU_TABLE_RTOL, atol=GELU_ATOL)


# ---- weights: random blocks for every type ------------------------------------------------------

# Byte offsets of the f16 scale fields in one block (csrc/include/llmrt/quant_blocks.h), for types
# gguf.quants cannot quantize: random bytes with these fields set to sane scales.
F16_FIELDS = {
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_NL: (0,), T.IQ4_XS: (0,),
}
GGUF_QUANTIZES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
FLOAT_TYPES = (T.F32, T.F16, T.BF16)
ALL_TYPES = FLOAT_TYPES + GGUF_QUANTIZES + tuple(F16_FIELDS)


def random_weight(rng, t, rows, k):
    """(raw data for g.weight, dequantized float32 [rows, k])."""
    x = rng.standard_normal((rows, k)).astype(np.float32)
    if t == T.F32:
        return x, x
    if t == T.F16:
        h = x.astype(np.float16)
        return h, h.astype(np.float32)
    if t in GGUF_QUANTIZES or t == T.BF16:
        raw = gguf.quants.quantize(x, t)
    else:
        be, bb = gguf.GGML_QUANT_SIZES[t]
        raw = rng.integers(0, 256, size=(rows, k // be, bb), dtype=np.uint8)
        for off in F16_FIELDS[t]:
            d = rng.uniform(0.002, 0.02, size=(rows, k // be)).astype(np.float16)
            raw[:, :, off:off + 2] = d.view(np.uint8).reshape(rows, k // be, 2)
        raw = raw.reshape(rows, -1)
    raw = np.ascontiguousarray(raw)
    return raw, gguf.quants.dequantize(raw, t).astype(np.float32)


def k_for(t):
    be = gguf.GGML_QUANT_SIZES[t][0]
    return 2 * 256 if be == 256 else 3 * 32  # 2 super-blocks, or 3 blocks: odd counts


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_get_rows(rng, t):
    k, rows = k_for(t), 11
    raw, deq = random_weight(rng, t, rows, k)
    g = core.Graph(6, 1)
    w = g.weight(raw, int(t), (k, rows))
    g.set_output(g.get_rows(w, g.input_tokens()))
    g.build()
    ids = np.array([3, 0, 10, 3, 7, 1], dtype=np.int32)
    y = g.run(ids, np.arange(6))
    np.testing.assert_array_equal(y, deq[ids])  # dequantization is exact in f32


def test_get_rows_f32_and_reshape(rng):
    x = rng.standard_normal((6, 4, 5)).astype(np.float32)
    b = Builder(6)
    tx = b.act(x)                                            # [5, 4, n]
    flat = b.g.reshape(tx, (20,))                            # [20, n]
    picked = b.g.get_rows_f32(flat, b.g.input_out_rows(3))   # [20, 3]
    y = b.run(picked, out_rows=np.array([5, 0, 5], dtype=np.int32))
    np.testing.assert_array_equal(y, x.reshape(6, 20)[[5, 0, 5]])


# ---- mul_mat ------------------------------------------------------------------------------------

VEC_DOT_TYPE = {
    T.F32: T.F32, T.F16: T.F16, T.BF16: T.BF16,
    T.Q4_0: T.Q8_0, T.Q5_0: T.Q8_0, T.Q8_0: T.Q8_0, T.IQ4_NL: T.Q8_0,
    T.Q4_1: T.Q8_1, T.Q5_1: T.Q8_1,
    T.Q2_K: T.Q8_K, T.Q3_K: T.Q8_K, T.Q4_K: T.Q8_K, T.Q5_K: T.Q8_K, T.Q6_K: T.Q8_K,
    T.IQ4_XS: T.Q8_K,
}


def activation_error_bound(w, x, vt):
    """Bound on |x @ w.T computed with x converted to vt - the exact product| per output [n, M].

    int8 block types store q = round(x / d) with d = amax / 127 (f16 d for Q8_0/Q8_1), so each
    element is off by at most d/2 + 127 * d * 2^-11 (the f16 rounding of d) < 0.57 d. Q8_1 also
    stores s = d * sum(q) in f16, used with the weight block's min m (|m| <= max|w| of the block):
    2^-11 * max|w_b| * sum_b |x|. F16 / BF16 round each x by 2^-11 / 2^-8 relative. On top, f32
    accumulation: DOT_RTOL * sum |w| |x|."""
    n, k = x.shape
    aw, ax = np.abs(w.astype(np.float64)), np.abs(x.astype(np.float64))
    bound = DOT_RTOL * ax @ aw.T
    if vt in (T.F16, T.BF16):
        return bound + (2.0 ** -11 if vt == T.F16 else 2.0 ** -8) * ax @ aw.T
    if vt == T.F32:
        return bound
    be = gguf.GGML_QUANT_SIZES[vt][0]
    nb = k // be
    d = np.abs(x.reshape(n, nb, be)).max(axis=2) / 127.0           # [n, nb]
    e = np.repeat(0.57 * d, be, axis=1)                             # [n, k] per-element error
    bound = bound + e @ aw.T
    if vt == T.Q8_1:
        wmax = aw.reshape(-1, nb, be).max(axis=2)                  # [M, nb]
        xs = ax.reshape(n, nb, be).sum(axis=2)                      # [n, nb]
        bound = bound + 2.0 ** -11 * xs @ wmax.T
    return bound


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_threads", [1, 2])
def test_mul_mat(rng, t, n_threads, isa_level):
    """Every weight type, at every ISA level this CPU runs (the isa_level fixture switches the
    kernel table; levels the CPU lacks are skipped with the reason)."""
    k, m, n = k_for(t), 37, 5
    raw, wdeq = random_weight(rng, t, m, k)
    x = rng.standard_normal((n, k)).astype(np.float32)
    b = Builder(n, n_threads)
    y = b.run(b.g.mul_mat(b.g.weight(raw, int(t), (k, m)), b.act(x)))
    assert y.shape == (n, m)
    # 1. Against the math: x @ dequantize(w).T, within the activation-quantization bound.
    ref = x.astype(np.float64) @ wdeq.astype(np.float64).T
    err = np.abs(y - ref)
    bound = activation_error_bound(wdeq, x, VEC_DOT_TYPE[t]) + 1e-30
    assert (err <= bound).all(), f"max err/bound {np.max(err / bound):.3g}"
    # 2. Against the kernels one row at a time: the graph must give the kernel's exact result.
    vt = VEC_DOT_TYPE[t]
    wbytes = np.ascontiguousarray(raw).view(np.uint8).reshape(m, -1)
    for j in (0, n - 1):
        xq = x[j].view(np.uint8) if vt == T.F32 else quants.quantize(x[j], int(vt))
        for i in (0, 17, m - 1):
            assert y[j, i] == np.float32(core.vec_dot(int(t), wbytes[i], xq, k))


def test_mul_mat_shares_activation_conversion(rng):
    """Three projections of the same x to Q8_0-dot types quantize x once (one hidden node)."""
    k, n = 64, 3
    b = Builder(n)
    x = b.act(rng.standard_normal((n, k)).astype(np.float32))
    ws = [b.g.weight(random_weight(rng, T.Q8_0, 16, k)[0], int(T.Q8_0), (k, 16)) for _ in range(3)]
    nodes0 = b.g.n_nodes
    ys = [b.g.mul_mat(w, x) for w in ws]
    assert b.g.n_nodes - nodes0 == 1 + 3  # one quantize + three mul_mat
    b.run(b.g.add(b.g.add(ys[0], ys[1]), ys[2]))


# ---- rope -------------------------------------------------------------------------------------

def rope_ggml_ref(x, pos, n_rot, mode, freq_base, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0,
                  beta_fast=32.0, beta_slow=1.0, n_ctx_orig=0, freq_factors=None):
    """ggml_compute_forward_rope (f32, forward) replicated in numpy float32, step by step:
    x [n, n_head, hd], pos [n] -> [n, n_head, hd]."""
    f32 = np.float32
    x = np.asarray(x, dtype=np.float32)
    out = x.copy()

    def corr_dim(nr):
        with np.errstate(divide="ignore"):
            return f32(n_rot) * f32(np.log(f32(n_ctx_orig) / (f32(nr) * f32(2) * f32(math.pi)))) / (
                f32(2) * f32(np.log(f32(freq_base))))

    start = np.floor(corr_dim(beta_fast))
    end = np.ceil(corr_dim(beta_slow))
    corr = (f32(max(0.0, start)), f32(min(n_rot - 1.0, end)))
    # libm functions of f32 arguments rounded once to f32, as glibc's powf/logf/cosf/sinf give
    # (numpy's float32 versions are SIMD approximations that differ with the CPU's vector width:
    # one ulp of theta_scale is 2e-4 rad at position 3000)
    def libm(fn, *a):
        return f32(fn(*(np.float64(f32(v)) for v in a)))

    theta_scale = libm(np.power, f32(freq_base), f32(-2.0) / f32(n_rot))
    for i, p in enumerate(pos):
        theta = f32(p)
        cs = []
        for i0 in range(0, n_rot, 2):
            ff = f32(1) if freq_factors is None else f32(freq_factors[i0 // 2])
            t_ext = f32(theta / ff)
            t_int = f32(f32(freq_scale) * t_ext)
            th, ms = t_int, f32(attn_factor)
            if ext_factor != 0.0:
                y = f32(f32(i0 // 2) - corr[0]) / max(f32(0.001), f32(corr[1] - corr[0]))
                ramp = f32(1) - min(f32(1), max(f32(0), y))
                mix = f32(ramp * f32(ext_factor))
                th = f32(t_int * (f32(1) - mix) + t_ext * mix)
                ms = f32(ms * f32(f32(1) + f32(0.1) * libm(np.log, f32(1) / f32(freq_scale))))
            cs.append((libm(np.cos, th) * ms, libm(np.sin, th) * ms))
            theta = f32(theta * theta_scale)
        for h in range(x.shape[1]):
            for j, (c, s) in enumerate(cs):
                a, b_ = (j, j + n_rot // 2) if mode == 2 else (2 * j, 2 * j + 1)
                x0, x1 = x[i, h, a], x[i, h, b_]
                out[i, h, a] = x0 * c - x1 * s
                out[i, h, b_] = x0 * s + x1 * c
    return out


def rope_definition(x, pos, n_rot, mode, freq_base, freq_factors=None):
    """The plain float64 definition (no YaRN): pair i rotated by p * base^(-2i/n_rot) / ff_i."""
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    i = np.arange(n_rot // 2)
    inv = freq_base ** (-2.0 * i / n_rot)
    if freq_factors is not None:
        inv = inv / np.asarray(freq_factors, dtype=np.float64)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]      # [n, n_rot/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a = i if mode == 2 else 2 * i
    b = i + n_rot // 2 if mode == 2 else 2 * i + 1
    x0, x1 = x[..., a], x[..., b]
    out[..., a] = x0 * c - x1 * s
    out[..., b] = x0 * s + x1 * c
    return out


ROPE_CASES = {
    "normal": dict(n_rot=14, mode=0, freq_base=10000.0),
    "neox": dict(n_rot=14, mode=2, freq_base=1e6),
    "normal-partial": dict(n_rot=6, mode=0, freq_base=10000.0),
    "neox-partial": dict(n_rot=8, mode=2, freq_base=500.0),
    "yarn": dict(n_rot=14, mode=2, freq_base=10000.0, freq_scale=0.25, ext_factor=1.0,
                 attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=64),
    "yarn-normal-attn": dict(n_rot=10, mode=0, freq_base=10000.0, freq_scale=0.5, ext_factor=0.7,
                             attn_factor=0.9, beta_fast=16.0, beta_slow=2.0, n_ctx_orig=32),
    "linear-scale": dict(n_rot=14, mode=0, freq_base=10000.0, freq_scale=0.5),
    "freq-factors": dict(n_rot=14, mode=0, freq_base=500000.0),
}


@pytest.mark.parametrize("case", list(ROPE_CASES))
@pytest.mark.parametrize("n_threads", [1, 2])
def test_rope(rng, case, n_threads):
    kw = dict(ROPE_CASES[case])
    n, nh, hd = 5, 3, 14
    x = rng.standard_normal((n, nh, hd)).astype(np.float32)
    pos = np.array([0, 1, 7, 3000, 31], dtype=np.int32)
    ff = None
    b = Builder(n, n_threads)
    tff = None
    if case == "freq-factors":
        ff = rng.uniform(1.0, 8.0, kw["n_rot"] // 2).astype(np.float32)
        tff = b.weight(ff)
    y = b.run(b.g.rope(b.act(x), b.pos, freq_factors=tff, **kw), positions=pos)
    y = y.reshape(n, nh, hd)
    ref = rope_ggml_ref(x, pos, freq_factors=ff, **kw)
    np.testing.assert_allclose(y, ref, rtol=ROPE_RTOL, atol=ROPE_ATOL)
    n_rot = kw["n_rot"]
    np.testing.assert_array_equal(y[..., n_rot:], x[..., n_rot:])  # pass-through dims
    if kw.get("ext_factor", 0.0) == 0.0 and kw.get("freq_scale", 1.0) == 1.0:
        small = pos < 40
        d = rope_definition(x, pos, n_rot, kw["mode"], kw["freq_base"], ff)
        np.testing.assert_allclose(y[small], d[small], atol=ROPE_DEF_ATOL)


def test_rope_neox_is_rotate_half(rng):
    """NeoX mode is Hugging Face's rotate_half: q * cos + rotate_half(q) * sin, cos/sin of
    concatenated [freqs, freqs]."""
    n, nh, hd = 3, 2, 8
    x = rng.standard_normal((n, nh, hd)).astype(np.float32)
    pos = np.array([1, 2, 5], dtype=np.int32)
    b = Builder(n)
    y = b.run(b.g.rope(b.act(x), b.pos, hd, 2, 10000.0), positions=pos).reshape(n, nh, hd)
    inv = 10000.0 ** (-np.arange(0, hd, 2) / hd)
    emb = np.concatenate([pos[:, None] * inv] * 2, axis=1)[:, None, :]
    rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], axis=-1)
    np.testing.assert_allclose(y, x * np.cos(emb) + rot * np.sin(emb), atol=ROPE_DEF_ATOL)


# ---- attention ------------------------------------------------------------------------------------

def attention_ref(q, kc, vc, cell_pos, q_pos, scale, n_swa=0, softcap=0.0, f16=False):
    """q [n, nh, hd], kc [cells, nkv, hd], vc [cells, nkv, hdv] (as stored), positions of cells
    and queries -> [n, nh * hdv], float64. With f16 (an f16 cache), q and the probabilities are
    rounded to f16 before their products with K and V, as llama.cpp's non-flash path does."""
    if f16:
        q = f16_round(q)
    q, kc, vc = (np.asarray(a, dtype=np.float64) for a in (q, kc, vc))
    n, nh, _ = q.shape
    nkv = kc.shape[1]
    out = np.zeros((n, nh, vc.shape[2]))
    for i in range(n):
        ok = cell_pos <= q_pos[i]
        if n_swa:
            ok &= (q_pos[i] - cell_pos) < n_swa
        for h in range(nh):
            kh = h // (nh // nkv)
            s = kc[ok, kh] @ q[i, h] * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            p = p / p.sum()
            if f16:
                p = f16_round(p.astype(np.float32)).astype(np.float64)
            out[i, h] = p @ vc[ok, kh]
    return out.reshape(n, -1)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("variant", ["mha", "gqa", "swa", "softcap", "hdv"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_attention_prefill(rng, dtype, variant, n_threads):
    n, nh, nkv, hd, hdv = 7, 6, 2, 10, 10
    n_swa, softcap = 0, 0.0
    if variant == "mha":
        nkv = nh
    elif variant == "swa":
        n_swa = 3
    elif variant == "softcap":
        softcap = 2.0
    elif variant == "hdv":
        hdv = 6
    q = rng.standard_normal((n, nh, hd)).astype(np.float32)
    k = rng.standard_normal((n, nkv, hd)).astype(np.float32)
    v = rng.standard_normal((n, nkv, hdv)).astype(np.float32)
    pos = np.arange(n, dtype=np.int32) + 4
    cache = core.KVCache(1, 16, nkv, hd, hdv, dtype=dtype)
    b = Builder(n, n_threads)
    a = b.g.attention(b.act(q), b.act(k), b.act(v), cache, 0, 0.4, n_swa=n_swa, softcap=softcap)
    y = b.run(a, positions=pos)
    kc, vc = (k, v) if dtype == "f32" else (f16_round(k), f16_round(v))
    ref = attention_ref(q, kc, vc, pos, pos, 0.4, n_swa, softcap, f16=dtype == "f16")
    np.testing.assert_allclose(y, ref, atol=ATTN_F32_ATOL if dtype == "f32" else ATTN_F16_ATOL)
    assert cache.n_used == n
    np.testing.assert_array_equal(cache.positions(), pos)
    np.testing.assert_array_equal(cache.k(0), kc)  # what was stored, in the cache's type
    np.testing.assert_array_equal(cache.v(0), vc)


# ---- ggml's vector exp / silu, bit for bit ---------------------------------------------------------
#
# SILU and SwiGLU use the kernel table's vec_silu / vec_swiglu: on AVX2, ggml_v_silu with its
# exp approximation (ggml_v_expf) over blocks of 8 and libm expf for the tail; generic, libm expf
# everywhere (ggml_silu_f32). numpy emulations of both, compared for equality.

import ctypes  # noqa: E402

_LIBM = ctypes.CDLL("libm.so.6")
_LIBM.expf.restype = ctypes.c_float
_LIBM.expf.argtypes = [ctypes.c_float]


def _fma32(a, b, c):
    ld = np.longdouble  # the product of two floats is exact in long double; one rounding to f32
    return (ld(a) * ld(b) + ld(c)).astype(np.float32)


def H(s):
    """A C hex float literal (0x1.8p23f) as float32."""
    return np.float32(float.fromhex(s))


def v_expf_ggml(x):
    """ggml_v_expf (AVX2 + FMA) for |x| small enough that no lane takes its |n| > 126 path."""
    f = np.float32
    x = np.asarray(x, f)
    r = H("0x1.8p23")
    z = _fma32(x, H("0x1.715476p+0"), r)
    n = (z - r).astype(f)
    b = _fma32(-n, H("0x1.7f7d1cp-20"), _fma32(-n, H("0x1.62e4p-1"), x))
    e = (z.view(np.int32).astype(np.int64) << 23).astype(np.uint32).astype(np.int64)
    k = ((e + int(np.array(1.0, f).view(np.int32))) & 0xFFFFFFFF).astype(np.uint32).view(f)
    assert (np.abs(n) <= 126).all()
    u = (b * b).astype(f)
    j = _fma32(_fma32(_fma32(H("0x1.0e4020p-7"), b, H("0x1.573e2ep-5")), u,
                      _fma32(H("0x1.555e66p-3"), b, H("0x1.fffdb6p-2"))), u, (H("0x1.ffffecp-1") * b).astype(f))
    return _fma32(j, k, k)


def silu_ggml(x, level):
    f = np.float32
    x = np.asarray(x, f)
    out = np.empty_like(x)
    nv = x.shape[-1] // 8 * 8 if level != "generic" else 0
    xv = x[..., :nv]
    out[..., :nv] = (xv / (f(1) + v_expf_ggml((f(0) - xv).astype(f))).astype(f)).astype(f)
    tail = x[..., nv:]
    ex = np.vectorize(lambda v: _LIBM.expf(float(-v)), otypes=[f])(tail) if tail.size else tail
    out[..., nv:] = (tail / (f(1) + ex).astype(f)).astype(f)
    return out


def test_swiglu_and_silu_are_ggml_bit_exact(isa_level, rng):
    gate = (rng.standard_normal((3, 45)) * 4).astype(np.float32)   # 5 blocks of 8 + a tail of 5
    up = rng.standard_normal((3, 45)).astype(np.float32)
    b = Builder(3)
    y = b.run(b.g.glu(b.act(gate), b.act(up), "silu"))
    want_silu = silu_ggml(gate, isa_level)
    np.testing.assert_array_equal(y, (want_silu * up).astype(np.float32))
    b = Builder(3)
    np.testing.assert_array_equal(b.run(b.g.silu(b.act(gate))), want_silu)


# ---- GELU / GeGLU through the f16 table, bit for bit at every level --------------------------------
#
# vec_gelu / vec_geglu: AVX2 rounds 8 inputs to f16 with F16C and gathers the table; generic looks
# each value up in turn (ggml_vec_gelu_f32 / ggml_vec_geglu_f32 with GGML_GELU_FP16). Both read the
# same table at the same index, so every level equals the generic one exactly, including the
# saturated ends (x <= -10: 0; x >= 10: x, or x * up), infinities and half-way rounding cases.

def _gelu_inputs(rng):
    special = [-np.inf, -1e30, -10.0001, -10.0, -9.9999, -1e-8, -0.0, 0.0, 1e-8, 9.9999, 10.0, 10.0001,
               1e30, np.inf, 65504.0, 65520.0, -65520.0]
    # exact f16 midpoints (ties to even vs away decide the table index)
    h = rng.integers(0, 0x7bff, 60).astype(np.uint16).view(np.float16).astype(np.float32)
    mid = ((h.astype(np.float64) + np.nextafter(h.astype(np.float16), np.float16(np.inf)).astype(np.float64)) / 2)
    x = np.concatenate([rng.standard_normal(300) * 5, special, mid, -mid]).astype(np.float32)
    return x[None, :]                                    # 437 values: blocks of 8 and a tail of 5


def test_gelu_and_geglu_bit_exact_vs_generic(isa_level, rng):
    x = _gelu_inputs(rng)
    up = rng.standard_normal(x.shape).astype(np.float32)

    def run_both():
        b = Builder(1)
        y = b.run(b.g.gelu(b.act(x)))
        b = Builder(1)
        return y, b.run(b.g.glu(b.act(x), b.act(up), "gelu"))

    y, z = run_both()
    runtime.set_isa("generic")
    try:
        y_ref, z_ref = run_both()
    finally:
        runtime.set_isa(isa_level)
    np.testing.assert_array_equal(y.view(np.uint32), y_ref.view(np.uint32))
    np.testing.assert_array_equal(z.view(np.uint32), z_ref.view(np.uint32))
    with np.errstate(over="ignore", invalid="ignore"):   # the formula at +-1e30, inf: saturated anyway
        want = gelu_ggml(x)
    np.testing.assert_allclose(y_ref, want, rtol=GELU_TABLE_RTOL, atol=GELU_ATOL)
    assert (y_ref[x <= -10] == 0).all() and (y_ref[x >= 10] == x[x >= 10]).all()
    assert (z_ref[x <= -10] == 0).all() and (z_ref[x >= 10] == (x * up)[x >= 10]).all()


@pytest.mark.parametrize("n_threads", [1, 2])
def test_rope_nodes_sharing_a_table_equal_lone_ropes(rng, n_threads):
    """Rope nodes with the same parameters share one cos/sin table per run (graph.c): the first
    fills it, later ones (after a barrier) read it. A chain rope -> add -> rope -> rope (the
    second and third in one barrier segment: one reads, one may compute its own) equals the
    same ropes run one graph at a time, bit for bit; and so do decode-sized runs."""
    n, nh, hd = 12, 3, 16
    x = rng.standard_normal((n, nh, hd)).astype(np.float32)
    x2 = rng.standard_normal((n, nh, hd)).astype(np.float32)
    pos = rng.permutation(100)[:n].astype(np.int32)

    def lone(a, p):
        b = Builder(len(a), n_threads)
        return b.run(b.g.rope(b.act(a), b.pos, hd, 2, 10000.0), positions=p).reshape(a.shape)

    for m in (n, 1):                                     # prefill (tables) and decode (own caches)
        b = Builder(m, n_threads)
        r1 = b.g.rope(b.act(x[:m]), b.pos, hd, 2, 10000.0)
        s = b.g.add(r1, b.act(x2[:m]))
        y = b.run(b.g.add(b.g.rope(s, b.pos, hd, 2, 10000.0), b.g.rope(s, b.pos, hd, 2, 10000.0)),
                  positions=pos[:m]).reshape(m, nh, hd)
        want1 = lone(x[:m], pos[:m])
        want2 = lone((want1 + x2[:m]).astype(np.float32), pos[:m])
        np.testing.assert_array_equal(y, want2 + want2)
