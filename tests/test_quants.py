"""llmrt.quants (csrc/kernels/generic.c, x86/avx2.c, x86/avx512.c) against independent references.

- dequantize vs gguf.quants.dequantize (numpy) on random blocks with NaN-free random f16 scales
  (zeros, negatives, subnormals and large values included), for every type, at every ISA level;
- quantize vs gguf.quants.quantize, bit-exact, where gguf implements the type (llama.cpp's
  reference rounding); Q8_1, Q8_K and IQ4_NL vs numpy re-implementations written below from the
  ggml definitions (gguf.quants has no quantizer for them);
- block sizes, shape conventions and errors.
"""
from __future__ import annotations

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as T

from llmrt import quants

# Relative max error allowed for dequantize vs gguf: max|ours - gguf| <= REL_TOL * max|gguf| per
# array. Both evaluate the same f32 expression (in practice the results are bit-identical); 2e-6
# (~16 ulp of the largest value) only leaves room for a kernel that reorders that expression.
REL_TOL = 2e-6

ALL_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
             "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS"]
NO_GGUF_DEQUANT = {"Q8_1", "Q8_K"}           # activation types: gguf.quants cannot decode them
GGUF_QUANT_TYPES = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]

# (elements per block, bytes per block) from ggml-common.h's block structs and static_asserts
EXPECTED_SIZES = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
    "Q8_0": (32, 34), "Q8_1": (32, 36),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176),
    "Q6_K": (256, 210), "Q8_K": (256, 292), "IQ4_NL": (32, 18), "IQ4_XS": (256, 136),
}

# byte offsets of the f16 scale fields inside one block (quant_blocks.h / ggml-common.h)
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q8_1": [0, 2],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_NL": [0], "IQ4_XS": [0],
}


# ---- random input ----------------------------------------------------------------------------

def finite_f16_bits(rng, n):
    """n random finite half-precision bit patterns: any sign, zero, subnormal, up to 65504."""
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    exp = (bits >> 10) & 0x1F
    bits[exp == 0x1F] &= np.uint16(0xBFFF)  # inf/nan -> exponent 0x0F (a normal value)
    return bits


def edge_f16_scales(rng, n):
    """Scales that exercise the edges: random finite f16 bits, with every 4th block zero, every
    4th negative, every 4th subnormal (2^-24 .. 2^-15)."""
    bits = finite_f16_bits(rng, n)
    bits[0::4] = 0
    bits[1::4] |= np.uint16(0x8000)
    bits[2::4] = rng.integers(1, 0x400, len(bits[2::4]), dtype=np.uint16)
    return bits


def random_blocks(rng, qtype, n_blocks):
    """Random raw data for n_blocks blocks of qtype (shape (n_blocks, type_size) uint8) whose
    float fields are finite."""
    name = qtype
    _, ts = EXPECTED_SIZES[name]
    raw = rng.integers(0, 256, (n_blocks, ts), dtype=np.uint8)
    if name == "F32":
        vals = (rng.standard_normal(n_blocks) * 10.0 ** rng.uniform(-40, 30, n_blocks)).astype(np.float32)
        vals[::7] = 0.0
        return vals.view(np.uint8).reshape(n_blocks, 4)
    if name == "F16":
        return edge_f16_scales(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if name == "BF16":
        bits = raw.view(np.uint16).reshape(-1).copy()
        exp = (bits >> 7) & 0xFF
        bits[exp == 0xFF] &= np.uint16(0xBFFF)  # inf/nan -> finite
        return bits.view(np.uint8).reshape(n_blocks, 2)
    if name == "Q8_K":
        d = (rng.standard_normal(n_blocks) * 10.0 ** rng.uniform(-30, 30, n_blocks)).astype(np.float32)
        d[::4] = 0.0
        raw[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
        return raw
    for off in F16_FIELDS[name]:
        raw[:, off:off + 2] = edge_f16_scales(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    raw[-1, :] = 0  # an all-zero block
    return raw


def quant_inputs(rng, n=512):
    """Rows of float32 activations/weights with the cases the reference rounding is sensitive to.
    n is a multiple of 256 so every type's blocks tile it."""
    rows = {}
    rows["gauss"] = rng.standard_normal(n)
    rows["zeros"] = np.zeros(n)
    neg = rng.standard_normal(n)
    for b in range(0, n, 32):  # the largest magnitude of every 32-block is negative
        j = b + int(np.argmax(np.abs(neg[b:b + 32])))
        neg[j] = -2.0 * abs(neg[j])
    rows["negmax"] = neg
    # ties: with max |x| = 127, d = 1 for Q8_0/Q8_1 and x*id lands exactly on .5
    ties = rng.integers(-126, 126, n) + 0.5
    ties[::32] = 127.0
    ties[1::64] = -127.0
    rows["ties"] = ties
    rows["denormal"] = rng.standard_normal(n) * 1e-39          # f32 subnormals; f16 scale -> 0
    rows["tiny"] = rng.standard_normal(n) * 1e-6               # f16 scale subnormal
    rows["large"] = rng.standard_normal(n) * 3e4               # f16 values overflow to inf
    rows["wide"] = rng.standard_normal(n) * 10.0 ** rng.uniform(-20, 4, n)
    rows["const"] = np.full(n, 0.75)                           # Q4_1/Q5_1: max == min
    rows["sparse"] = np.where(rng.random(n) < 0.05, rng.standard_normal(n), 0.0)
    names = list(rows)
    return names, np.stack([rows[k] for k in names]).astype(np.float32)


# ---- numpy references for the types gguf.quants does not quantize --------------------------------

def np_roundf(v):
    """C roundf (half away from zero), exactly (in float64, where |v| + 0.5 is exact)."""
    v = v.astype(np.float64)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def ref_quantize_q8_1(x):
    """ggml quantize_row_q8_1_ref: d = amax/127, q = roundf(x/d), s = d * sum(q)."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    with np.errstate(invalid="ignore"):
        v = (blocks * inv[:, None]).astype(np.float32)
    # d subnormal -> inv = inf -> v = inf/nan: ggml's (int8_t) cast gives 0 on x86
    q = np.where(np.isfinite(v), np_roundf(v), 0).astype(np.int8)
    s = (q.astype(np.int32).sum(axis=1).astype(np.float32) * d).astype(np.float32)
    out = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(-1, 2),
                          s.astype(np.float16).view(np.uint8).reshape(-1, 2),
                          q.view(np.uint8)], axis=1)
    return out.reshape(*x.shape[:-1], -1)


def ref_quantize_q8_K(x):
    """ggml quantize_row_q8_K_ref: signed max (first of the largest |x|), iscale = -127/max,
    q = min(127, nearest_int(iscale*x)) with ties to even, bsums over 16, d = 1/iscale (f32).
    An all-zero block is all zero (ggml leaves its bsums unwritten; llmrt zeroes them)."""
    blocks = x.reshape(-1, 256).astype(np.float32)
    nb = blocks.shape[0]
    mx = blocks[np.arange(nb), np.abs(blocks).argmax(axis=1)]
    zero = mx == 0
    with np.errstate(divide="ignore"):
        iscale = np.where(zero, np.float32(0), np.float32(-127) / mx).astype(np.float32)
    with np.errstate(invalid="ignore"):
        v = (blocks * iscale[:, None]).astype(np.float32)
    # max subnormal -> iscale = -inf -> v = inf/nan: ggml's nearest_int + int8 store gives 0
    q = np.where(np.isfinite(v), np.minimum(np.rint(v), 127), 0).astype(np.int8)
    bsums = q.reshape(nb, 16, 16).astype(np.int16).sum(axis=2, dtype=np.int16)
    with np.errstate(divide="ignore"):
        d = np.where(zero, np.float32(0), np.float32(1) / iscale).astype(np.float32)
    out = np.concatenate([d.view(np.uint8).reshape(nb, 4), q.view(np.uint8),
                          bsums.view(np.uint8).reshape(nb, 32)], axis=1)
    return out.reshape(*x.shape[:-1], -1)


KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                         dtype=np.float32)


def ref_quantize_iq4_nl(x):
    """ggml quantize_row_iq4_nl_ref (the impl with ntry = -1, no imatrix): levels from
    d0 = max / -127 (nearest level, the upper one on a midpoint), then d = sum(w*q*x) / sum(w*q*q)
    with w = x^2, accumulated in f32 in element order."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    nb = blocks.shape[0]
    mx = blocks[np.arange(nb), np.abs(blocks).argmax(axis=1)]
    amax = np.abs(mx)
    small = amax < np.float32(1e-15)
    with np.errstate(divide="ignore", invalid="ignore"):
        d0 = (mx / np.float32(-127)).astype(np.float32)
        inv = (np.float32(1) / d0).astype(np.float32)
    L = np.zeros((nb, 32), dtype=np.int64)
    sumqx = np.zeros(nb, np.float32)
    sumq2 = np.zeros(nb, np.float32)
    kv = KVALUES_IQ4NL
    for j in range(32):
        with np.errstate(invalid="ignore"):
            v = (inv * blocks[:, j]).astype(np.float32)
        hi = np.clip(np.searchsorted(kv, v, side="right"), 1, 15)
        lo = hi - 1
        pick_lo = (v - kv[lo]).astype(np.float32) < (kv[hi] - v).astype(np.float32)
        idx = np.where(pick_lo, lo, hi)
        idx = np.where(v <= kv[0], 0, np.where(v >= kv[15], 15, idx))
        L[:, j] = idx
        q = kv[idx]
        w = (blocks[:, j] * blocks[:, j]).astype(np.float32)
        sumqx = (sumqx + ((w * q).astype(np.float32) * blocks[:, j]).astype(np.float32)).astype(np.float32)
        sumq2 = (sumq2 + ((w * q).astype(np.float32) * q).astype(np.float32)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(sumq2 > 0, sumqx / sumq2, np.float32(0)).astype(np.float32)
    d[small] = 0
    L[small] = 0
    qs = (L[:, :16] | (L[:, 16:] << 4)).astype(np.uint8)
    out = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(nb, 2), qs], axis=1)
    return out.reshape(*x.shape[:-1], -1)


def ref_dequantize(raw, name):
    if name == "Q8_1":
        blocks = raw.reshape(-1, 36)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        return (blocks[:, 4:].view(np.int8).astype(np.float32) * d).reshape(*raw.shape[:-1], -1)
    if name == "Q8_K":
        blocks = raw.reshape(-1, 292)
        d = blocks[:, 0:4].copy().view(np.float32)
        return (blocks[:, 4:260].view(np.int8).astype(np.float32) * d).reshape(*raw.shape[:-1], -1)
    return gguf.quants.dequantize(raw, T[name])


def assert_rel_close(got, want, tol=REL_TOL):
    assert got.shape == want.shape
    fin = np.isfinite(want)
    np.testing.assert_array_equal(got[~fin], want[~fin])  # infinities in the same places
    got, want = got[fin], want[fin]
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    err = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
    assert err <= tol * scale, f"max abs error {err:g} vs max |ref| {scale:g}"


# ---- sizes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL_TYPES)
def test_block_sizes(name):
    bs, ts = EXPECTED_SIZES[name]
    assert quants.block_size(name) == bs
    assert quants.type_size(name) == ts
    assert quants.row_size(name, 4 * bs) == 4 * ts
    if name not in NO_GGUF_DEQUANT:
        assert gguf.GGML_QUANT_SIZES[T[name]] == (bs, ts)


def test_qtype_forms_agree():
    assert quants.type_id(T.Q4_K) == quants.type_id("q4_k") == quants.type_id(12) == 12
    assert quants.type_size(T.Q6_K) == quants.type_size("Q6_K") == quants.type_size(14) == 210


# ---- dequantize ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL_TYPES)
def test_dequantize_matches_reference(isa_level, rng, name):
    bs, ts = EXPECTED_SIZES[name]
    n_blocks = 64 if bs > 1 else 4096
    raw = random_blocks(rng, name, n_blocks).reshape(8, -1)   # 8 rows of n_blocks/8 blocks
    got = quants.dequantize(raw, name)
    assert got.dtype == np.float32 and got.shape == (8, n_blocks // 8 * bs)
    assert_rel_close(got, ref_dequantize(raw, name))


@pytest.mark.parametrize("name", ["F16", "Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K", "Q2_K"])
def test_dequantize_unaligned_rows(isa_level, rng, name):
    """A row may start at any byte address (blocks are read bytewise, vectors unaligned)."""
    bs, ts = EXPECTED_SIZES[name]
    raw = random_blocks(rng, name, 16 if bs > 1 else 256).reshape(-1)
    buf = np.empty(raw.size + 1, np.uint8)
    buf[1:] = raw
    assert buf[1:].ctypes.data % 2 == 1
    np.testing.assert_array_equal(quants.dequantize(buf[1:], name), quants.dequantize(raw, name))


# ---- quantize --------------------------------------------------------------------------------

def _gguf_quantize(x, name):
    out = gguf.quants.quantize(x, T[name])
    return np.ascontiguousarray(out).view(np.uint8)


# gguf's numpy code warns (overflow/invalid cast) on the subnormal and huge rows; expected.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", GGUF_QUANT_TYPES)
def test_quantize_bit_exact_vs_gguf(isa_level, rng, name):
    cases, x = quant_inputs(rng)
    got = quants.quantize(x, name)
    want = _gguf_quantize(x, name)
    assert got.shape == want.shape
    for i, case in enumerate(cases):
        np.testing.assert_array_equal(got[i], want[i], err_msg=f"{name} row {case!r}")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name,ref", [("Q8_1", ref_quantize_q8_1), ("Q8_K", ref_quantize_q8_K),
                                      ("IQ4_NL", ref_quantize_iq4_nl)])
def test_quantize_bit_exact_vs_numpy_reference(isa_level, rng, name, ref):
    cases, x = quant_inputs(rng)
    got = quants.quantize(x, name)
    want = ref(x)
    assert got.shape == want.shape == (len(cases), quants.row_size(name, x.shape[1]))
    for i, case in enumerate(cases):
        np.testing.assert_array_equal(got[i], want[i], err_msg=f"{name} row {case!r}")


def test_q8_rounding_ties_go_away_from_zero(isa_level):
    # amax 127 -> d = 1 exactly; 2.5 -> 3, -2.5 -> -3, 0.5 -> 1, -0.5 -> -1 (roundf), while Q8_K
    # uses nearest_int (ties to even): with max = -127, iscale = -127/max = 1, 2.5 -> 2, 1.5 -> 2.
    x = np.zeros(256, np.float32)
    x[:6] = [127.0, 2.5, -2.5, 0.5, -0.5, 1.5]
    q8_0 = quants.quantize(x, "Q8_0")[2:2 + 6].view(np.int8)
    np.testing.assert_array_equal(q8_0, [127, 3, -3, 1, -1, 2])
    q8_1 = quants.quantize(x, "Q8_1")[4:4 + 6].view(np.int8)
    np.testing.assert_array_equal(q8_1, [127, 3, -3, 1, -1, 2])
    x[0] = -127.0
    q8_k = quants.quantize(x, "Q8_K")[4:4 + 6].view(np.int8)
    np.testing.assert_array_equal(q8_k, [-127, 2, -2, 0, 0, 2])


def test_q8_1_sum_and_q8_K_bsums(rng):
    x = rng.standard_normal(256).astype(np.float32)
    b = quants.quantize(x, "Q8_1").reshape(8, 36)
    d = (np.abs(x.reshape(8, 32)).max(axis=1) / np.float32(127)).astype(np.float32)  # f32, unrounded
    s = b[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
    qsum = b[:, 4:].view(np.int8).astype(np.float32).sum(axis=1)
    np.testing.assert_array_equal(s, (qsum * d).astype(np.float16).astype(np.float32))
    k = quants.quantize(x, "Q8_K")
    q = k[4:260].view(np.int8).astype(np.int32)
    np.testing.assert_array_equal(k[260:292].view(np.int16), q.reshape(16, 16).sum(axis=1))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q8_K", "IQ4_NL",
                                  "F16", "BF16", "F32"])
def test_roundtrip_error_is_bounded(rng, name):
    # |x - dequant(quant(x))| <= step/2 per block, up to the f16 rounding of the scale; as a
    # coarse, format-derived bound: relative to the block's max |x|, 2^-(bits) (+1 bit of slack).
    bits = {"Q4_0": 3, "Q4_1": 4, "Q5_0": 4, "Q5_1": 5, "Q8_0": 7, "Q8_1": 7, "Q8_K": 7,
            "IQ4_NL": 3, "F16": 11, "BF16": 8, "F32": 30}[name]
    x = rng.standard_normal((4, 256)).astype(np.float32)
    y = quants.dequantize(quants.quantize(x, name), name)
    err = np.abs(y - x).max()
    assert err <= 2.0 ** -(bits - 1) * np.abs(x).max()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", ["F16", "BF16"])
@pytest.mark.parametrize("n", [1, 7, 13, 37])
def test_f16_bf16_vector_tails(isa_level, rng, name, n):
    """Lengths that are not a multiple of the vector width go through the scalar tail."""
    x = (rng.standard_normal((3, n)) * 10.0 ** rng.uniform(-8, 5, (3, n))).astype(np.float32)
    np.testing.assert_array_equal(quants.quantize(x, name), _gguf_quantize(x, name))
    raw = _gguf_quantize(x, name)
    assert_rel_close(quants.dequantize(raw, name), gguf.quants.dequantize(raw, T[name]))


# ---- K-quant reference quantizers (gguf.quants has none) --------------------------------------
# Their scale search (make_qkx2_quants / make_q3_quants / make_qx_quants) was checked during
# development against ggml's 2023 k_quants.c (identical d/dmin/scales bytes on 512 random
# super-blocks); here: round-trip error and the final "nearest level under the stored scales" step.

# RMS error of dequantize(quantize(x)) relative to RMS(x) for standard-normal x. Bounds are 1.5x
# what this reference achieves on the test's data (Q2_K 0.30, Q3_K 0.154, Q4_K 0.072,
# Q5_K 0.037, Q6_K 0.018), so a broken scale search or packing fails while rounding noise passes.
K_RMSE_BOUND = {"Q2_K": 0.45, "Q3_K": 0.23, "Q4_K": 0.11, "Q5_K": 0.055, "Q6_K": 0.027}


@pytest.mark.parametrize("name", sorted(K_RMSE_BOUND))
def test_kquant_roundtrip_error(rng, name):
    x = rng.standard_normal((4, 1024)).astype(np.float32)
    raw = quants.quantize(x, name)
    assert raw.shape == (4, quants.row_size(name, 1024))
    y = gguf.quants.dequantize(raw, T[name])  # decoded by an independent implementation
    rel = np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x ** 2))
    assert rel <= K_RMSE_BOUND[name]
    z = quants.quantize(np.zeros((1, 256), np.float32), name)
    np.testing.assert_array_equal(gguf.quants.dequantize(z, T[name]), 0.0)


def test_q6_K_levels_are_nearest_under_stored_scales(rng):
    x = rng.standard_normal(256 * 8).astype(np.float32)
    blocks = quants.quantize(x, "Q6_K").reshape(8, 210)
    d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)            # (8, 1)
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)                       # (8, 16)
    dsub = (d * sc).astype(np.float32)[:, :, None]                                 # (8, 16, 1)
    want = np.clip(np.rint((x.reshape(8, 16, 16) / dsub).astype(np.float32)), -32, 31)
    got = gguf.quants.dequantize(blocks, T.Q6_K).reshape(8, 16, 16) / dsub
    np.testing.assert_array_equal(np.rint(got), want)


def test_q4_K_levels_are_nearest_under_stored_scales(rng):
    x = rng.standard_normal(256 * 8).astype(np.float32)
    blocks = quants.quantize(x, "Q4_K").reshape(8, 144)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16])
    dsub = (d * sc.astype(np.float32)).astype(np.float32)[:, :, None]             # (8, 8, 1)
    msub = (dmin * m.astype(np.float32)).astype(np.float32)[:, :, None]
    want = np.clip(np.rint(((x.reshape(8, 8, 32) + msub).astype(np.float32) / dsub).astype(np.float32)), 0, 15)
    qs = blocks[:, 16:].reshape(8, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    got = (qs & 0x0F).reshape(8, 8, 32)
    np.testing.assert_array_equal(got, want)


# ---- shapes and errors -------------------------------------------------------------------------

def test_shapes_follow_gguf_conventions(rng):
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    raw = quants.quantize(x, "Q8_0")
    assert raw.shape == (2, 3, 68) and raw.dtype == np.uint8
    assert quants.dequantize(raw, "Q8_0").shape == (2, 3, 64)
    assert quants.quantize(np.zeros((0, 64), np.float32), "Q4_0").shape == (0, 36)
    assert quants.dequantize(np.zeros((0, 36), np.uint8), "Q4_0").shape == (0, 64)
    # a non-contiguous float64 input is converted, a typed array is read as its bytes
    xt = rng.standard_normal((64, 4))
    np.testing.assert_array_equal(quants.quantize(xt.T, "Q8_0"),
                                  quants.quantize(np.ascontiguousarray(xt.T, np.float32), "Q8_0"))
    h = rng.standard_normal(16).astype(np.float16)
    np.testing.assert_array_equal(quants.dequantize(h, "F16"), h.astype(np.float32))


def test_errors_name_the_function():
    with pytest.raises(ValueError, match=r"\[dequantize\].*35 bytes.*Q4_0"):
        quants.dequantize(np.zeros(35, np.uint8), "Q4_0")
    with pytest.raises(ValueError, match=r"\[quantize\].*48 elements.*Q4_0"):
        quants.quantize(np.zeros(48, np.float32), "Q4_0")
    with pytest.raises(ValueError, match=r"\[dequantize\].*IQ2_XXS"):
        quants.dequantize(np.zeros(66, np.uint8), T.IQ2_XXS)
    with pytest.raises(ValueError, match=r"\[quantize\].*I32"):
        quants.quantize(np.zeros(4, np.float32), "I32")
    with pytest.raises(ValueError, match=r"\[quantize\].*IQ4_XS"):
        quants.quantize(np.zeros(256, np.float32), "IQ4_XS")
    with pytest.raises(ValueError, match=r"\[quantize\].*'q9_9'"):
        quants.quantize(np.zeros(32, np.float32), "q9_9")
    with pytest.raises(ValueError, match=r"\[row_size\].*Q6_K"):
        quants.row_size("Q6_K", 100)


# ---- activation quantizers (kernel table quant_act_row, used by mul_mat) ------------------------------
#
# mul_mat quantizes activations as ggml's CPU backend does at run time, which is not the reference
# rounding above: on x86 AVX2, quantize_row_q8_0 / q8_1 multiply by id = 127 / amax and round to
# nearest with ties to EVEN (_mm256_round_ps), and Q8_1's s is fp16(d * Σq). The generic level
# (ggml's scalar path) and Q8_K use the reference quantizers.

def ggml_avx2_quantize_q8(x, with_sum):
    """numpy emulation of ggml's AVX2 quantize_row_q8_0 (with_sum False) / q8_1 (True) -> bytes."""
    xb = np.asarray(x, np.float32).reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        iv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint((xb * iv[:, None]).astype(np.float32)).astype(np.int64)   # rint: ties to even
    head = [d.astype(np.float16).reshape(-1, 1).view(np.uint8)]
    if with_sum:
        s = (d * q.sum(axis=1).astype(np.float32)).astype(np.float32)
        head.append(s.astype(np.float16).reshape(-1, 1).view(np.uint8))
    return np.concatenate(head + [q.astype(np.int8).view(np.uint8)], axis=1).reshape(-1)


def quantize_act(x, t):
    from llmrt import _core
    _, be, bb, _, _ = _core.type_traits(int(t))   # llmrt's (ggml's) block sizes: Q8_1 is 36 bytes
    out = np.zeros(x.size // be * bb, np.uint8)
    _core.quantize_act_raw(np.ascontiguousarray(x, np.float32), out, int(t))
    return out


def act_inputs(rng):
    x = (rng.standard_normal(32 * 40) * np.repeat(np.exp(rng.normal(0, 2, 40)), 32)).astype(np.float32)
    # ties: amax = 127 makes id = 1, so x = k + 0.5 is an exact half (even vs away-from-zero)
    x[:32] = np.float32(127)
    x[1:8] = np.array([2.5, -2.5, 3.5, -0.5, 0.5, 1.5, 126.5], np.float32)
    x[32:64] = 0.0                                                  # an all-zero block
    return x


@pytest.mark.parametrize("t", [T.Q8_0, T.Q8_1])
def test_activation_quantizer_is_ggml_runtime_rounding(isa_level, rng, t):
    x = act_inputs(rng)
    got = quantize_act(x, t)
    if isa_level == "generic":   # ggml's scalar quantize_row_q8_*: the reference
        want = (ref_quantize_q8_1(x) if t == T.Q8_1 else
                np.asarray(quants.quantize(x.reshape(1, -1), t)).reshape(-1).view(np.uint8))
    else:
        want = ggml_avx2_quantize_q8(x, t == T.Q8_1)
    np.testing.assert_array_equal(got, want)


def test_activation_quantizer_ties_to_even_on_avx2(rng):
    from llmrt import runtime
    if "avx2" not in runtime.available_isas():
        pytest.skip("CPU lacks avx2")
    before = runtime.isa()
    runtime.set_isa("avx2")
    try:
        got = quantize_act(act_inputs(rng), T.Q8_0)[:34]
    finally:
        runtime.set_isa(before)
    qs = got[2:].view(np.int8)
    assert qs[:8].tolist() == [127, 2, -2, 4, 0, 0, 2, 126]   # the reference gives 3, -3, 4, -1, 1, 2, 127
