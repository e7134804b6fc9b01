"""Dot-product kernels (csrc/kernels/dot_generic.c, csrc/kernels/x86/dot_*.c), one weight row x one
activation row, for every weight type and every ISA level this CPU can run.

For each (type, ISA level, size) three checks:
  (a) the kernel equals a numpy re-implementation of llama.cpp's integer formula (integer sums per
      block times the block scales), up to f32 rounding;
  (b) the ISA kernel equals the generic kernel, up to f32 rounding;
  (c) the result is close to the float dot of gguf.quants.dequantize(w) with the f32 activations,
      within a bound computed from the activation's own quantization error.

The activation blocks (Q8_0, Q8_1, Q8_K, F16, BF16) are built here in numpy from ggml's
definitions (quantize_row_q8_*_ref), so these tests do not depend on llmrt's own quantizers.

Run: python -m pytest -q tests/test_dot.py
"""
import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as T

import llmrt._core as core

# ---- tolerances ------------------------------------------------------------------------------------
# Kernel vs exact formula, relative to the sum of |terms| (every partial sum any summation order can
# form is bounded by it). Each f32 rounding adds at most 2^-24 = 6e-8 of that; the longest chain of
# roundings in any variant here is < 80 (at most 64 blocks / 2053 floats, 8+ accumulator lanes, plus
# reductions), so 80 * 6e-8 = 4.8e-6 per kernel: 1e-5 covers two kernels compared with each other.
DOT_RTOL = 1e-5
# Absolute floor for results that are exactly 0 (all-zero scales): f32 rounding of nothing.
DOT_ATOL = 1e-30

ISA_LEVELS = ("generic", "avx2", "avx512", "avx512_vnni")

# Weight type -> the activation type its dot product reads (csrc/types.c).
VEC_DOT_TYPE = {
    T.F32: T.F32, T.F16: T.F16, T.BF16: T.BF16,
    T.Q4_0: T.Q8_0, T.Q5_0: T.Q8_0, T.Q8_0: T.Q8_0, T.IQ4_NL: T.Q8_0,
    T.Q4_1: T.Q8_1, T.Q5_1: T.Q8_1,
    T.Q2_K: T.Q8_K, T.Q3_K: T.Q8_K, T.Q4_K: T.Q8_K, T.Q5_K: T.Q8_K, T.Q6_K: T.Q8_K,
    T.IQ4_XS: T.Q8_K,
}
WEIGHT_TYPES = tuple(VEC_DOT_TYPE)
FLOAT_TYPES = (T.F32, T.F16, T.BF16)
# Types gguf.quants.quantize implements; the others get random blocks with sane scales.
GGUF_QUANTIZES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                         dtype=np.int64)


def block_size(t):
    return gguf.GGML_QUANT_SIZES[t]  # (elements, bytes) per block


def row_bytes(t, n):
    be, bb = block_size(t)
    assert n % be == 0
    return n // be * bb


# ---- small numpy helpers ---------------------------------------------------------------------------

def f16_at(blocks, off):
    """f16 field at byte offset `off` of each block, as float64 (exact)."""
    return blocks[:, off:off + 2].copy().view(np.float16)[:, 0].astype(np.float64)


def f32_at(blocks, off):
    return blocks[:, off:off + 4].copy().view(np.float32)[:, 0].astype(np.float64)


def i8(blocks, lo, hi):
    return blocks[:, lo:hi].view(np.int8).astype(np.int64)


def u8(blocks, lo, hi):
    return blocks[:, lo:hi].astype(np.int64)


def nibbles_32(qs):
    """(nb, 16) bytes -> (nb, 32): low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def roundf(x):
    """C roundf: halves away from zero (numpy's round is half-to-even)."""
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


# ---- activation blocks (ggml's quantize_row_q8_0/q8_1/q8_K_ref) -------------------------------------

def make_q8_0(qs, d):
    """qs (nb, 32) int8, d (nb,) -> Q8_0 bytes."""
    nb = qs.shape[0]
    out = np.zeros((nb, 34), np.uint8)
    out[:, 0:2] = np.asarray(d, np.float16).reshape(nb, 1).view(np.uint8)
    out[:, 2:] = qs.astype(np.int8).view(np.uint8)
    return out.reshape(-1)


def make_q8_1(qs, d, s):
    nb = qs.shape[0]
    out = np.zeros((nb, 36), np.uint8)
    out[:, 0:2] = np.asarray(d, np.float16).reshape(nb, 1).view(np.uint8)
    out[:, 2:4] = np.asarray(s, np.float16).reshape(nb, 1).view(np.uint8)
    out[:, 4:] = qs.astype(np.int8).view(np.uint8)
    return out.reshape(-1)


def make_q8_K(qs, d):
    """qs (nb, 256) int8, d (nb,) f32 -> Q8_K bytes, bsums = sums of 16 consecutive qs."""
    nb = qs.shape[0]
    out = np.zeros((nb, 292), np.uint8)
    out[:, 0:4] = np.asarray(d, np.float32).reshape(nb, 1).view(np.uint8)
    out[:, 4:260] = qs.astype(np.int8).view(np.uint8)
    bsums = qs.astype(np.int64).reshape(nb, 16, 16).sum(axis=2).astype(np.int16)
    out[:, 260:] = bsums.view(np.uint8)
    return out.reshape(-1)


def quantize_q8_0(a):
    return gguf.quants.quantize(a.reshape(1, -1), T.Q8_0).reshape(-1)


def quantize_q8_1(a):
    x = a.astype(np.float32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    qs = roundf(x * inv[:, None]).astype(np.int64)
    s = qs.sum(axis=1).astype(np.float32) * d  # s uses the f32 d, before d is rounded to f16
    return make_q8_1(qs, d, s)


def quantize_q8_K(a):
    x = a.astype(np.float32).reshape(-1, 256)
    idx = np.argmax(np.abs(x), axis=1)  # first index of the largest |x|, as ggml's strict '>'
    mx = x[np.arange(x.shape[0]), idx]
    assert np.all(mx != 0)
    iscale = (np.float32(-127) / mx).astype(np.float32)
    qs = np.minimum(127, np.rint(x * iscale[:, None])).astype(np.int64)  # nearest_int: half-to-even
    d = (np.float32(1) / iscale).astype(np.float32)
    return make_q8_K(qs, d)


def quantize_act(at, a):
    """f32 activations -> bytes of type `at`."""
    if at == T.F32:
        return a.astype(np.float32).view(np.uint8)
    if at == T.F16:
        return a.astype(np.float16).view(np.uint8)
    if at == T.BF16:
        return gguf.quants.quantize(a.reshape(1, -1), T.BF16).reshape(-1).view(np.uint8)
    if at == T.Q8_0:
        return quantize_q8_0(a)
    if at == T.Q8_1:
        return quantize_q8_1(a)
    if at == T.Q8_K:
        return quantize_q8_K(a)
    raise AssertionError(at)


def act_values(at, ab):
    """Activation bytes -> (integer quants or floats (n,), per-element scale (n,), extra) where the
    activation's value is quants * scale. extra is the Q8_1 s field per block, else None."""
    if at == T.F32:
        v = ab.view(np.float32).astype(np.float64)
        return v, np.ones_like(v), None
    if at == T.F16:
        v = ab.view(np.float16).astype(np.float64)
        return v, np.ones_like(v), None
    if at == T.BF16:
        v = (ab.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return v, np.ones_like(v), None
    if at == T.Q8_0:
        b = ab.reshape(-1, 34)
        return i8(b, 2, 34).reshape(-1), np.repeat(f16_at(b, 0), 32), None
    if at == T.Q8_1:
        b = ab.reshape(-1, 36)
        return i8(b, 4, 36).reshape(-1), np.repeat(f16_at(b, 0), 32), f16_at(b, 2)
    if at == T.Q8_K:
        b = ab.reshape(-1, 292)
        return i8(b, 4, 260).reshape(-1), np.repeat(f32_at(b, 0), 256), None
    raise AssertionError(at)


# ---- weight blocks -> integer quants, integer scales, float scales -----------------------------------
#
# unpack(t, w) returns a list of "parts"; the dot is the sum over parts of
#     Σ_i  fscale_i · iscale_i · q_i · a_i
# where q_i and iscale_i are integers (the kernel's exact integer sums) and fscale_i is the product of
# the f16/f32 block scales. Q4_1/Q5_1 have a second part m·a (computed by the kernel from Q8_1's s),
# the K-quants with mins a second part -dmin·m·a (computed from Q8_K's bsums).

def _k4_scales_mins(sc12):
    """Q4_K/Q5_K: 12 packed bytes -> 8 6-bit scales, 8 6-bit mins (get_scale_min_k4)."""
    q = sc12.astype(np.int64)
    sc = np.concatenate([q[:, 0:4] & 63, (q[:, 8:12] & 0x0F) | ((q[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([q[:, 4:8] & 63, (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)], axis=1)
    return sc, mn


def unpack(t, w):
    """Weight bytes of type t -> list of (q (nb, be), iscale (nb, be), fscale (nb, be)) parts."""
    be, bb = block_size(t)
    b = w.reshape(-1, bb)
    nb = b.shape[0]
    one = np.ones((nb, be), np.int64)

    def rep(x, k):  # (nb, be/k) -> (nb, be), each value repeated k times
        return np.repeat(x, k, axis=1)

    def per_block(x):  # (nb,) -> (nb, be)
        return np.repeat(x[:, None], be, axis=1)

    if t == T.Q4_0:
        return [(nibbles_32(u8(b, 2, 18)) - 8, one, per_block(f16_at(b, 0)))]
    if t == T.Q4_1:
        return [(nibbles_32(u8(b, 4, 20)), one, per_block(f16_at(b, 0))),
                (one, one, per_block(f16_at(b, 2)))]
    if t in (T.Q5_0, T.Q5_1):
        off = 2 if t == T.Q5_0 else 4
        qh = b[:, off:off + 4].copy().view(np.uint32)[:, 0].astype(np.int64)
        hbits = (qh[:, None] >> np.arange(32)) & 1
        q = nibbles_32(u8(b, off + 4, off + 20)) | (hbits << 4)
        if t == T.Q5_0:
            return [(q - 16, one, per_block(f16_at(b, 0)))]
        return [(q, one, per_block(f16_at(b, 0))), (one, one, per_block(f16_at(b, 2)))]
    if t == T.Q8_0:
        return [(i8(b, 2, 34), one, per_block(f16_at(b, 0)))]
    if t == T.IQ4_NL:
        return [(KVALUES_IQ4NL[nibbles_32(u8(b, 2, 18))], one, per_block(f16_at(b, 0)))]

    e = np.arange(256)
    if t == T.Q2_K:
        # scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
        sc = u8(b, 0, 16)
        byte = 32 * (e // 128) + e % 32
        shift = 2 * ((e % 128) // 32)
        q = (u8(b, 16, 80)[:, byte] >> shift) & 3
        return [(q, rep(sc & 0x0F, 16), per_block(f16_at(b, 80))),
                (one, rep(sc >> 4, 16), -per_block(f16_at(b, 82)))]
    if t == T.Q3_K:
        # hmask[32], qs[64], scales[12], d
        byte = 32 * (e // 128) + e % 32
        shift = 2 * ((e % 128) // 32)
        low = (u8(b, 32, 96)[:, byte] >> shift) & 3
        high = (u8(b, 0, 32)[:, e % 32] >> (e // 32)) & 1
        q = low - 4 * (1 - high)
        s12 = u8(b, 96, 108)
        j = np.arange(16)
        lo = np.where(j < 8, s12[:, j % 8] & 0x0F, s12[:, j % 8] >> 4)
        hi = (s12[:, 8 + j % 4] >> (2 * (j // 4))) & 3
        sc = (lo | (hi << 4)) - 32
        return [(q, rep(sc, 16), per_block(f16_at(b, 108)))]
    if t in (T.Q4_K, T.Q5_K):
        # d, dmin, scales[12], (Q5_K: qh[32]), qs[128]
        sc, mn = _k4_scales_mins(b[:, 4:16])
        qoff = 16 if t == T.Q4_K else 48
        byte = 32 * (e // 64) + e % 32
        shift = 4 * ((e % 64) // 32)
        q = (u8(b, qoff, qoff + 128)[:, byte] >> shift) & 0x0F
        if t == T.Q5_K:
            q = q | (((u8(b, 16, 48)[:, e % 32] >> (e // 32)) & 1) << 4)
        return [(q, rep(sc, 32), per_block(f16_at(b, 0))),
                (one, rep(mn, 32), -per_block(f16_at(b, 2)))]
    if t == T.Q6_K:
        # ql[128], qh[64], scales[16] int8, d
        h, g, l = e // 128, (e % 128) // 32, e % 32
        ql = u8(b, 0, 128)[:, 64 * h + l + 32 * (g % 2)] >> (4 * (g // 2)) & 0x0F
        qh = (u8(b, 128, 192)[:, 32 * h + l] >> (2 * g)) & 3
        q = (ql | (qh << 4)) - 32
        return [(q, rep(i8(b, 192, 208), 16), per_block(f16_at(b, 208)))]
    if t == T.IQ4_XS:
        # d, scales_h (u16), scales_l[4], qs[128]
        sh = b[:, 2:4].copy().view(np.uint16)[:, 0].astype(np.int64)
        sl = u8(b, 4, 8)
        ib = np.arange(8)
        ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 0x0F) | (((sh[:, None] >> (2 * ib)) & 3) << 4)
        qs = u8(b, 8, 136)
        idx = (qs[:, 16 * (e // 32) + e % 16] >> (4 * ((e % 32) // 16))) & 0x0F
        return [(KVALUES_IQ4NL[idx], rep(ls - 32, 32), per_block(f16_at(b, 0)))]
    raise AssertionError(t)


def weight_values(t, w):
    """Weight bytes -> float64 (n,) values."""
    if t == T.F32:
        return w.view(np.float32).astype(np.float64)
    if t == T.F16:
        return w.view(np.float16).astype(np.float64)
    if t == T.BF16:
        return (w.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return sum((q * isc * fsc).reshape(-1) for q, isc, fsc in unpack(t, w))


def reference_dot(t, w, ab):
    """(value, scale): llama.cpp's formula in exact integer / float64 arithmetic, and Σ|terms|."""
    at = VEC_DOT_TYPE[t]
    if t in FLOAT_TYPES:
        x = weight_values(t, w)
        y, _, _ = act_values(at, ab)
        prod = (x.astype(np.float32) * y.astype(np.float32)).astype(np.float64)  # f32 products
        return float(prod.sum()), float(np.abs(prod).sum())
    be = block_size(t)[0]
    qa, sa, s_q81 = act_values(at, ab)
    qa = qa.reshape(-1, be)
    sa = sa.reshape(-1, be)
    value = 0.0
    scale = 0.0
    parts = unpack(t, w)
    for k, (q, isc, fsc) in enumerate(parts):
        if k == 1 and at == T.Q8_1:
            # m · s: the kernel takes Σ_j dy·qy_j from Q8_1's s field, not from the quants
            m = fsc[:, 0]
            terms = m * s_q81
        else:
            terms = (fsc * sa * (isc * q * qa).astype(np.float64))
        value += float(terms.sum())
        scale += float(np.abs(terms).sum())
    return value, scale


# ---- random rows ---------------------------------------------------------------------------------

# Byte offsets of the f16 scale fields of each block, for random blocks.
F16_FIELDS = {
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_NL: (0,), T.IQ4_XS: (0,),
}


def random_weights(t, n, rng):
    w = (rng.standard_normal(n) * rng.uniform(0.01, 0.1)).astype(np.float32)
    if t == T.F32:
        return w.view(np.uint8)
    if t == T.F16:
        return w.astype(np.float16).view(np.uint8)
    if t == T.BF16:
        return gguf.quants.quantize(w.reshape(1, -1), T.BF16).reshape(-1).view(np.uint8)
    if t in GGUF_QUANTIZES:
        return gguf.quants.quantize(w.reshape(1, -1), t).reshape(-1).view(np.uint8)
    be, bb = block_size(t)
    b = rng.integers(0, 256, size=(n // be, bb), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        d = (rng.uniform(1e-3, 1e-2, size=n // be) * rng.choice([-1, 1], size=n // be))
        b[:, off:off + 2] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
    return b.reshape(-1)


def random_activations(n, rng):
    # blocks of different magnitudes, so per-block scales differ
    mag = np.repeat(np.exp(rng.normal(0, 1, size=(n + 31) // 32)), 32)[:n]
    return (rng.standard_normal(n) * mag).astype(np.float32)


def type_id(t):
    return int(t)


def kernel_name(t):
    return core.kernel_names()["vec_dot"][t.name]


# ---- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(params=ISA_LEVELS)
def isa(request):
    """Run the test at ISA level `request.param` (skipped above what the CPU has), then restore."""
    name = request.param
    if ISA_LEVELS.index(name) > ISA_LEVELS.index(core.isa_max_supported()):
        pytest.skip("CPU lacks AVX-512" if name.startswith("avx512") else f"CPU lacks {name}")
    before = core.isa_current()
    assert core.set_isa(name) == name
    yield name
    core.set_isa(before)


def dot_at(level, t, w, ab, n):
    prev = core.isa_current()
    core.set_isa(level)
    try:
        return core.vec_dot(type_id(t), w, ab, n)
    finally:
        core.set_isa(prev)


def sizes_for(t):
    be = block_size(t)[0]
    if t in FLOAT_TYPES:
        # tails: not multiples of 8, 16 or 32 floats
        return (1, 7, 8, 15, 16, 17, 31, 33, 64, 100, 2053)
    if be == 32:
        return (32, 7 * 32, 64 * 32)
    return (256, 3 * 256, 8 * 256)


CASES = [pytest.param(t, n, id=f"{t.name}-n{n}") for t in WEIGHT_TYPES for n in sizes_for(t)]


def check_close(got, want, scale, rtol, what):
    assert np.isfinite(got), what
    assert abs(got - want) <= rtol * scale + DOT_ATOL, (
        f"{what}: got {got!r}, want {want!r}, |diff| {abs(got - want):.3g} > "
        f"{rtol:g} * {scale:.3g}")


# ---- tests ---------------------------------------------------------------------------------------

def test_every_weight_type_has_a_kernel_per_level(isa):
    names = core.kernel_names()["vec_dot"]
    for t in WEIGHT_TYPES:
        assert t.name in names, t.name
        if isa == "generic":
            assert names[t.name].endswith("_generic"), names[t.name]
        else:
            # every type has a SIMD kernel from the AVX2 level up
            assert not names[t.name].endswith("_generic"), names[t.name]
    if isa == "avx2":
        assert all(names[t.name].endswith("_avx2") for t in WEIGHT_TYPES), names


@pytest.mark.parametrize("t, n", CASES)
def test_dot_random(isa, t, n):
    rng = np.random.default_rng(1000 * type_id(t) + n)
    at = VEC_DOT_TYPE[t]
    w = random_weights(t, n, rng)
    a = random_activations(n, rng)
    ab = quantize_act(at, a)
    got = core.vec_dot(type_id(t), w, ab, n)

    # (a) exact formula
    want, scale = reference_dot(t, w, ab)
    check_close(got, want, scale, DOT_RTOL, f"{kernel_name(t)} vs exact formula")

    # (b) same as the generic kernel
    if isa != "generic":
        gen = dot_at("generic", t, w, ab, n)
        check_close(got, gen, scale, DOT_RTOL, f"{kernel_name(t)} vs generic")

    # (c) close to the float dot: the kernel computes Σ w·â exactly (up to rounding) where â is the
    # quantized activation; so |got - Σ w·a| <= Σ |w|·|a - â| (+ Q8_1's s rounding, + rounding).
    if t in FLOAT_TYPES:
        wf = weight_values(t, w)
    else:
        wf = gguf.quants.dequantize(w.reshape(1, -1), t).reshape(-1).astype(np.float64)
    qa, sa, s_q81 = act_values(at, ab)
    ahat = qa * sa
    bound = float(np.sum(np.abs(wf) * np.abs(a.astype(np.float64) - ahat)))
    if at == T.Q8_1:
        # the min part uses s = f16(d·Σq) instead of f16(d)·Σq: |m| · |s - f16(d)·Σq| per block
        parts = unpack(t, w)
        m = parts[1][2][:, 0]
        sum_ahat = ahat.reshape(-1, 32).sum(axis=1)
        bound += float(np.sum(np.abs(m) * np.abs(s_q81 - sum_ahat)))
    ref = float(np.dot(wf, a.astype(np.float64)))
    assert abs(got - ref) <= bound + DOT_RTOL * scale, (
        f"{kernel_name(t)} vs float dot: got {got!r}, want {ref!r}, bound {bound:.3g}")
    assert bound < 0.05 * float(np.sum(np.abs(wf * a))), "the bound must not be vacuous"


def test_reference_unpack_matches_gguf_dequantize():
    """The test's own unpacking of every quant type reproduces gguf's independent dequantizer
    (same f32 values), so the 'exact formula' above reads the blocks as ggml does."""
    rng = np.random.default_rng(7)
    for t in WEIGHT_TYPES:
        if t in FLOAT_TYPES:
            continue
        n = 2 * block_size(t)[0]
        w = random_weights(t, n, rng)
        ours = weight_values(t, w)
        theirs = gguf.quants.dequantize(w.reshape(1, -1), t).reshape(-1).astype(np.float64)
        # gguf computes in f32 (products of up to three factors): 3 roundings of 2^-24
        np.testing.assert_allclose(ours, theirs, rtol=3 * 2.0**-24, atol=0, err_msg=t.name)


def extreme_weight_rows(t, n):
    """Weight rows whose quants sit at the ends of their range (all-zero, all-one bits and
    alternating nibbles), with every f16 block scale 1/64: worst cases for saturating int8/int16
    SIMD arithmetic."""
    be, bb = block_size(t)
    nb = n // be
    one64 = np.array([1 / 64], np.float16).view(np.uint8)
    offs = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
            **F16_FIELDS}[t]
    rows = []
    for fill in (0x00, 0xFF, 0x0F, 0xF0, 0x80, 0x7F):
        b = np.full((nb, bb), fill, np.uint8)
        for off in offs:
            b[:, off:off + 2] = one64
        rows.append(b.reshape(-1))
    return rows


def extreme_act_rows(at, n):
    """Activation rows at the ends of Q8's range [-127, 127] (what the quantizers produce)."""
    rows = []
    alt = np.where(np.arange(n) % 2 == 0, 127, -127)
    for qs in (np.full(n, 127), np.full(n, -127), alt):
        if at == T.Q8_0:
            rows.append(make_q8_0(qs.reshape(-1, 32), np.full(n // 32, 0.5)))
        elif at == T.Q8_1:
            q = qs.reshape(-1, 32)
            rows.append(make_q8_1(q, np.full(n // 32, 0.5), 0.5 * q.sum(axis=1)))
        else:
            rows.append(make_q8_K(qs.reshape(-1, 256), np.full(n // 256, 0.5)))
    return rows


@pytest.mark.parametrize("t", [t for t in WEIGHT_TYPES if t not in FLOAT_TYPES], ids=lambda t: t.name)
def test_dot_extreme_values(isa, t):
    n = 2 * block_size(t)[0]
    at = VEC_DOT_TYPE[t]
    for w in extreme_weight_rows(t, n):
        for ab in extreme_act_rows(at, n):
            got = core.vec_dot(type_id(t), w, ab, n)
            want, scale = reference_dot(t, w, ab)
            check_close(got, want, scale, DOT_RTOL, f"{kernel_name(t)} w[{w[:4]}] vs exact formula")


@pytest.mark.parametrize("t", FLOAT_TYPES, ids=lambda t: t.name)
def test_float_tail_reads_only_the_row(isa, t):
    """Tails: a row that ends right before garbage (NaNs) gives the same result as a clean copy, so
    the kernel reads exactly n elements (ASan in CI checks the memory side)."""
    rng = np.random.default_rng(3)
    for n in (1, 3, 9, 13, 27, 45, 67):
        w = random_weights(t, n, rng)
        ab = quantize_act(t, random_activations(n, rng))
        esz = w.nbytes // n
        nan = np.full(64 * esz, 0xFF, np.uint8)  # NaN in f32/f16/bf16
        got = core.vec_dot(type_id(t), np.concatenate([w, nan])[:w.nbytes],
                           np.concatenate([ab, nan])[:ab.nbytes], n)
        want, scale = reference_dot(t, w, ab)
        check_close(got, want, scale, DOT_RTOL, f"{kernel_name(t)} n={n}")


def test_vec_dot_validates_arguments():
    rng = np.random.default_rng(0)
    w = random_weights(T.Q4_0, 64, rng)
    ab = quantize_act(T.Q8_0, random_activations(64, rng))
    with pytest.raises(ValueError, match="block size"):
        core.vec_dot(type_id(T.Q4_0), w, ab, 48)
    with pytest.raises(ValueError, match="block size"):
        core.vec_dot(type_id(T.Q4_0), w, ab, 0)
    with pytest.raises(ValueError, match="weight row has"):
        core.vec_dot(type_id(T.Q4_0), w[:-1], ab, 64)
    with pytest.raises(ValueError, match="activation row has"):
        core.vec_dot(type_id(T.Q4_0), w, ab[:-2], 64)
    with pytest.raises(ValueError, match="unknown type"):
        core.vec_dot(5, w, ab, 64)  # 4 and 5 are retired Q4_2/Q4_3
    with pytest.raises(ValueError, match="no dot-product kernel"):
        core.vec_dot(type_id(T.I8), w, ab, 64)


# ---- bit-exact: ggml's own f32 order on AVX2 ---------------------------------------------------------
#
# For the kernels llama.cpp runs for one token (vec_dot, and ggml_gemv_q4_K_8x8_q8_K for the
# repacked Q4_K weights) the AVX2 kernels reproduce ggml's arithmetic order exactly, so llmrt's
# logits equal llama.cpp's bit for bit (tests/test_real_models.py). Here each is compared for
# equality with a numpy emulation of that order: f32 lanes, exact integer lane sums, fused
# multiply-adds (emulated in long double: the product of two floats is exact there, so only the
# final rounding to f32 remains), and ggml's horizontal sums.

F32 = np.float32


def fma32(a, b, c):
    ld = np.longdouble
    return F32(ld(F32(a)) * ld(F32(b)) + ld(F32(c)))


def hsum_float_8(v):
    """ggml's hsum_float_8: (hi + lo) over 4 lanes, then movehl, then movehdup."""
    v = np.asarray(v, F32)
    r = (v[4:] + v[:4]).astype(F32)
    r2 = (r[:2] + r[2:]).astype(F32)
    return F32(r2[0] + r2[1])


def lanes8(prod):
    """(nblocks, 32) exact integer products -> (nblocks, 8) lane sums (lane k: elements 4k..4k+3)."""
    return prod.reshape(prod.shape[0], 8, 4).sum(axis=2)


def ggml_dot_q8_0_like(dx, qx, dy, qy):
    """Q8_0 / Q5_0 / Q4_0 x Q8_0 on AVX2: acc = fma(dx·dy, lanes, acc) per block; hsum."""
    acc = np.zeros(8, F32)
    lanes = lanes8(qx * qy)
    for ib in range(qx.shape[0]):
        d = F32(F32(dx[ib]) * F32(dy[ib]))
        acc = np.array([fma32(d, F32(lanes[ib, k]), acc[k]) for k in range(8)], F32)
    return hsum_float_8(acc)


def ggml_dot_q4_1(dx, mx, qx, dy, sy, qy):
    acc = np.zeros(8, F32)
    summs = F32(0)
    lanes = lanes8(qx * qy)
    for ib in range(qx.shape[0]):
        summs = fma32(mx[ib], sy[ib], summs)                 # contracted by ggml's build
        d = F32(F32(dx[ib]) * F32(dy[ib]))
        acc = np.array([fma32(d, F32(lanes[ib, k]), acc[k]) for k in range(8)], F32)
    return F32(hsum_float_8(acc) + summs)


def ggml_dot_q6_K(d, sc, q, dy, qy):
    """q (nb, 256) unsigned 0..63, sc (nb, 16), qy (nb, 256)."""
    acc = np.zeros(8, F32)
    for i in range(q.shape[0]):
        prod = (q[i] * qy[i] * np.repeat(sc[i], 16)).reshape(8, 32)     # 8 groups of 32
        lanes = prod.reshape(8, 8, 4).sum(axis=(0, 2))                  # lane k over all groups
        bsums = qy[i].reshape(16, 16).sum(axis=1)
        lanes = lanes - 32 * (bsums * sc[i]).reshape(8, 2).sum(axis=1)
        dd = F32(F32(dy[i]) * F32(d[i]))
        acc = np.array([fma32(dd, F32(lanes[k]), acc[k]) for k in range(8)], F32)
    return hsum_float_8(acc)


def ggml_gemv_q4_K(d, dmin, sc, mn, q, dy, qy):
    """One row of ggml_gemv_q4_K_8x8_q8_K: whole-block integer sums, two f32 fma chains."""
    acc = acc_min = F32(0)
    for i in range(q.shape[0]):
        isum = int((q[i] * qy[i] * np.repeat(sc[i], 32)).sum())
        imin = int((qy[i].reshape(8, 32).sum(axis=1) * mn[i]).sum())
        acc = fma32(F32(isum), F32(F32(d[i]) * F32(dy[i])), acc)
        acc_min = fma32(F32(imin), F32(F32(dmin[i]) * F32(dy[i])), acc_min)
    return F32(acc - acc_min)


def tinyblas_dot_float(x, y):
    """llama.cpp's prefill dot for F16 / BF16 / F32 weights on AVX2 (llamafile's tinyBLAS<8, __m256>:
    one accumulator of 8 lanes over steps of 8, then its hsum: halves, movehl, movehdup), which
    llmrt's avx2 vec_dot[F16 / BF16 / F32] and their packed GEMV / GEMM follow; tinyBLAS needs
    n % 8 == 0, llmrt adds the tail (n % 8 elements) in double, one f32 product at a time.
    x, y: values exact in f32 (fma32 rounds once from long double: the fma for F16 / BF16 products,
    which are exact in f32)."""
    x = x.astype(F32)
    y = y.astype(F32)
    n = x.shape[0]
    n8 = n & ~7
    acc = np.zeros(8, F32)
    for i in range(0, n8, 8):
        acc = np.array([fma32(x[i + k], y[i + k], acc[k]) for k in range(8)], F32)
    s = float(hsum_float_8(acc))
    for i in range(n8, n):
        s += float(F32(x[i] * y[i]))
    return F32(s)


def ggml_dot_f16(x, y):
    """ggml_vec_dot_f16 on AVX2: 4 x 8 lanes over steps of 32, reduce, then a double tail (the
    order of llmrt's avx2 attention dot, core.attn_dot)."""
    x = x.astype(F32)
    y = y.astype(F32)
    n = x.shape[0]
    np_ = n & ~31
    acc = np.zeros((4, 8), F32)
    for i in range(0, np_, 32):
        for j in range(4):
            for k in range(8):
                acc[j, k] = fma32(x[i + 8 * j + k], y[i + 8 * j + k], acc[j, k])
    a0 = ((acc[0] + acc[2]).astype(F32) + (acc[1] + acc[3]).astype(F32)).astype(F32)
    t0 = (a0[:4] + a0[4:]).astype(F32)
    s = float(F32(F32(t0[0] + t0[1]) + F32(t0[2] + t0[3])))
    for i in range(np_, n):
        s += float(F32(x[i] * y[i]))
    return F32(s)


EXACT_CASES = [pytest.param(t, n, id=f"{t.name}-n{n}")
               for t, ns in ((T.Q8_0, (32, 7 * 32, 24 * 32)), (T.Q5_0, (32, 7 * 32)), (T.Q4_1, (32, 7 * 32, 24 * 32)),
                             (T.Q6_K, (256, 3 * 256)), (T.Q4_K, (256, 3 * 256)), (T.F16, (8, 64, 70, 256, 300)))
               for n in ns]


@pytest.mark.parametrize("t,n", EXACT_CASES)
def test_avx2_dot_is_ggml_order_bit_exact(t, n):
    """F16: llama.cpp's prefill order (tinyBLAS); the others: its batch-1 vec_dot's."""
    if ISA_LEVELS.index("avx2") > ISA_LEVELS.index(core.isa_max_supported()):
        pytest.skip("CPU lacks avx2")
    rng = np.random.default_rng(1000 + n + int(t))
    at = VEC_DOT_TYPE[t]
    for _ in range(3):
        w = random_weights(t, n, rng)
        a = random_activations(n, rng)
        ab = quantize_act(at, a)
        got = F32(dot_at("avx2", t, w, ab, n))
        if t == T.F16:
            want = tinyblas_dot_float(w.view(np.float16), ab.view(np.float16))
        else:
            be, bb = block_size(t)
            b = w.reshape(-1, bb)
            qa, sa, s_q81 = act_values(at, ab)
            qa = qa.reshape(-1, be)
            dy = sa.reshape(-1, be)[:, 0]
            parts = unpack(t, w)
            if t in (T.Q8_0, T.Q5_0):
                want = ggml_dot_q8_0_like(parts[0][2][:, 0], parts[0][0], dy, qa)
            elif t == T.Q4_1:
                want = ggml_dot_q4_1(parts[0][2][:, 0], parts[1][2][:, 0], parts[0][0], dy, s_q81, qa)
            elif t == T.Q6_K:
                want = ggml_dot_q6_K(f16_at(b, 208), i8(b, 192, 208), parts[0][0] + 32, dy, qa)
            else:  # Q4_K
                sc, mn = _k4_scales_mins(b[:, 4:16])
                want = ggml_gemv_q4_K(f16_at(b, 0), f16_at(b, 2), sc, mn, parts[0][0], dy, qa)
        assert got == want, (t.name, n, got, want)


def ggml_dot_f32_4x8(x, y):
    """The f32 analogue the avx2 attention dot uses for an F32 cache: 4 chains of 8 lanes over steps
    of 32, then steps of 8 into chain 0, hsum((c0 + c1) + (c2 + c3)) in double, a double tail."""
    n = x.shape[0]
    acc = np.zeros((4, 8), F32)
    i = 0
    while i + 32 <= n:
        for j in range(4):
            acc[j] = [fma32(x[i + 8 * j + k], y[i + 8 * j + k], acc[j, k]) for k in range(8)]
        i += 32
    while i + 8 <= n:
        acc[0] = [fma32(x[i + k], y[i + k], acc[0, k]) for k in range(8)]
        i += 8
    s = float(hsum_float_8(((acc[0] + acc[1]).astype(F32) + (acc[2] + acc[3]).astype(F32)).astype(F32)))
    for k in range(i, n):
        s += float(F32(x[k] * y[k]))
    return F32(s)


@pytest.mark.parametrize("n", (8, 64, 70, 256, 300))
def test_avx2_attention_dot_is_ggml_vec_dot_f16_order(n):
    """Attention keeps ggml_vec_dot_f16's order at avx2 (its scores and P.V kernels reproduce
    core.attn_dot, tests/test_attention_dots.py), while vec_dot[F16] for weights took tinyBLAS's;
    an F32 cache, the 4-chain f32 analogue."""
    if ISA_LEVELS.index("avx2") > ISA_LEVELS.index(core.isa_max_supported()):
        pytest.skip("CPU lacks avx2")
    rng = np.random.default_rng(2000 + n)
    prev = core.isa_current()
    core.set_isa("avx2")
    try:
        for _ in range(3):
            x = rng.standard_normal(n).astype(np.float16)
            y = (rng.standard_normal(n) * 3).astype(np.float16)
            assert F32(core.attn_dot(x, y)) == ggml_dot_f16(x, y)
            xf, yf = x.astype(np.float32), (y.astype(np.float32) * F32(1.1)).astype(np.float32)
            assert F32(core.attn_dot(xf, yf)) == ggml_dot_f32_4x8(xf, yf)
    finally:
        core.set_isa(prev)


@pytest.mark.parametrize("t", (T.F32, T.BF16), ids=lambda v: v.name)
@pytest.mark.parametrize("n", (8, 64, 70, 256, 300))
def test_avx2_float_dot_is_tinyblas_order(t, n):
    """F32 and BF16 weights take the F16 weights' order at avx2 (one chain, tinyBLAS's)."""
    if ISA_LEVELS.index("avx2") > ISA_LEVELS.index(core.isa_max_supported()):
        pytest.skip("CPU lacks avx2")
    rng = np.random.default_rng(3000 + n + int(t))
    for _ in range(3):
        w = random_weights(t, n, rng)
        ab = quantize_act(VEC_DOT_TYPE[t], random_activations(n, rng))
        got = F32(dot_at("avx2", t, w, ab, n))
        want = tinyblas_dot_float(weight_values(t, w), act_values(VEC_DOT_TYPE[t], ab)[0])
        assert got == want, (t.name, n, got, want)


def ggml_repacked_dot(dx, qx, dy, qy):
    """Q4_0 / IQ4_NL x Q8_0 as llama.cpp runs them on AVX2 and AVX-512 (its q4_0_8x8 / iq4_nl_8x8
    repack, every batch size): per block the whole integer sum, acc = fma(isum, dx·dy, acc) in one
    f32 chain, no hsum."""
    acc = F32(0)
    for ib in range(qx.shape[0]):
        isum = int((qx[ib] * qy[ib]).sum())
        acc = fma32(F32(isum), F32(F32(dx[ib]) * F32(dy[ib])), acc)
    return F32(acc)


def llmrt_q4_1_block_dot(dx, mx, qx, dy, sy, qy):
    """Q4_1 x Q8_1 in llmrt's block order (the avx512_vnni level): per block the whole integer sum,
    acc = fma(isum, dx·dy, acc), then acc = fma(mx, sy, acc), one f32 chain."""
    acc = F32(0)
    for ib in range(qx.shape[0]):
        isum = int((qx[ib] * qy[ib]).sum())
        acc = fma32(F32(isum), F32(F32(dx[ib]) * F32(dy[ib])), acc)
        acc = fma32(F32(mx[ib]), F32(sy[ib]), acc)
    return F32(acc)


@pytest.mark.parametrize("t", (T.Q8_0, T.Q4_1), ids=lambda v: v.name)
@pytest.mark.parametrize("n", (32, 7 * 32, 24 * 32, 128 * 32))
def test_block_order_from_avx512_vnni(t, n):
    """vec_dot[Q8_0] and vec_dot[Q4_1] at avx512_vnni (emulated here, real where the CPU has it) are
    the block order (ggml_repacked_dot, llmrt_q4_1_block_dot: one exact integer per block, one fma;
    Q4_1 then the fma of m·s), the level's own; the avx2 level keeps llama.cpp's lane order
    (ggml_dot_q8_0_like, ggml_dot_q4_1). The packed kernels of each level give its vec_dot's bits
    (tests/test_gemm.py)."""
    if ISA_LEVELS.index("avx2") > ISA_LEVELS.index(core.isa_max_supported()):
        pytest.skip("CPU lacks avx2")
    from llmrt import runtime
    from conftest import use_isa
    rng = np.random.default_rng(4100 + n + (0 if t == T.Q8_0 else 7))
    at = VEC_DOT_TYPE[t]
    levels = ["avx512_vnni-emu"] + (["avx512_vnni"] if "avx512_vnni" in runtime.available_isas() else [])
    before, emulated = runtime.isa(), runtime.isa_emulated()
    differ = 0
    try:
        for _ in range(3):
            w = random_weights(t, n, rng)
            ab = quantize_act(at, random_activations(n, rng))
            qa, sa, s_q81 = act_values(at, ab)
            qa, dy = qa.reshape(-1, 32), sa.reshape(-1, 32)[:, 0]
            parts = unpack(t, w)
            qx, dx = parts[0][0], parts[0][2][:, 0]
            if t == T.Q8_0:
                want, lane = ggml_repacked_dot(dx, qx, dy, qa), ggml_dot_q8_0_like(dx, qx, dy, qa)
            else:
                mx = parts[1][2][:, 0]
                want = llmrt_q4_1_block_dot(dx, mx, qx, dy, s_q81, qa)
                lane = ggml_dot_q4_1(dx, mx, qx, dy, s_q81, qa)
            differ += want != lane
            use_isa("avx2")
            assert F32(core.vec_dot(int(t), w, ab, n)) == lane, "avx2"
            for level in levels:
                use_isa(level)
                assert F32(core.vec_dot(int(t), w, ab, n)) == want, level
    finally:
        (runtime.set_isa_emulated if emulated else runtime.set_isa)(before)
    if n >= 24 * 32:
        assert differ, "the block and the lane order should round differently somewhere"


@pytest.mark.parametrize("t", (T.Q4_0, T.IQ4_NL), ids=lambda v: v.name)
@pytest.mark.parametrize("n", (32, 7 * 32, 24 * 32, 128 * 32))
def test_repacked_dot_order(t, n):
    """vec_dot[Q4_0] and vec_dot[IQ4_NL] are llama.cpp's repacked order at avx2 and at avx512_vnni
    (emulated here, real where the CPU has it); the packed kernels of both levels give the same bits
    (tests/test_gemm.py, test_gemm_kquants.py)."""
    if ISA_LEVELS.index("avx2") > ISA_LEVELS.index(core.isa_max_supported()):
        pytest.skip("CPU lacks avx2")
    from llmrt import runtime
    from conftest import use_isa
    rng = np.random.default_rng(4000 + n + int(t))
    levels = ["avx2", "avx512_vnni-emu"] + (["avx512_vnni"] if "avx512_vnni" in runtime.available_isas() else [])
    before, emulated = runtime.isa(), runtime.isa_emulated()
    differ = 0
    try:
        for _ in range(3):
            w = random_weights(t, n, rng)
            ab = quantize_act(T.Q8_0, random_activations(n, rng))
            qa, sa, _ = act_values(T.Q8_0, ab)
            qa, dy = qa.reshape(-1, 32), sa.reshape(-1, 32)[:, 0]
            parts = unpack(t, w)
            qx, dx = parts[0][0], parts[0][2][:, 0]
            want = ggml_repacked_dot(dx, qx, dy, qa)
            differ += want != ggml_dot_q8_0_like(dx, qx, dy, qa)
            for level in levels:
                use_isa(level)
                assert F32(core.vec_dot(int(t), w, ab, n)) == want, level
    finally:
        (runtime.set_isa_emulated if emulated else runtime.set_isa)(before)
    if n >= 24 * 32:
        assert differ, "the repacked and the plain order should round differently somewhere"
