"""The AMX path (llmrt/amx.h: csrc/kernels/amx_model.c, amx_pack.c, amx_gemm.h, x86/amx.c).

(a) the software tile model vs a numpy statement of each instruction (TDPBSSD/SUD/USD/UUD with
    int32 wraparound, TDPBF16PS with bf16 specials, DAZ and FTZ);
(b) the AMX GEMMs run through the tile model vs a numpy reference of the same blocked arithmetic,
    bit for bit, and vs the existing vec_dot kernels / a float64 matmul within named tolerances,
    on odd shapes (token and weight-row tails, K tails for bf16, K chunking, row sub-ranges);
(c) the real instructions vs the model, bit for bit (skipped with "CPU lacks AMX" elsewhere).

The fused multiply-adds of the reference use the C library's fmaf (exactly rounded) through
ctypes, so the reference rounds exactly as the documented order says.

Run: python -m pytest -q tests/test_amx.py
"""
import ctypes
import ctypes.util

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as T

import llmrt._core as core

# ---- tolerances ----------------------------------------------------------------------------------
# AMX int8 GEMM vs the vec_dot kernel of the same weight type: both sum the same exact integers
# times the same f32 scales, in different orders. Relative to Σ|terms| each f32 rounding adds
# at most 2^-24 = 6e-8; the longest chain here (256 / 32 = 8 blocks, two terms each with a min,
# plus 8 SIMD lanes and their reduction in vec_dot) is < 40 roundings per side: 80 * 6e-8 < 1e-5.
AMX_VS_DOT_RTOL = 1e-5
# AMX bf16 GEMM vs float64 matmul of the same bf16 values: products exact, one f32 rounding per
# accumulation, K_pad <= 128 accumulations: 128 * 2^-24 = 7.6e-6 of Σ|a·b|, rounded up.
BF16_VS_F64_RTOL = 1e-5

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.fmaf.restype = ctypes.c_float
_libm.fmaf.argtypes = (ctypes.c_float, ctypes.c_float, ctypes.c_float)
_fmaf_u = np.frompyfunc(lambda a, b, c: _libm.fmaf(a, b, c), 3, 1)


def fmaf(a, b, c):
    """Elementwise exactly rounded f32 fused multiply-add (the C library's fmaf)."""
    a, b, c = np.broadcast_arrays(np.float32(a), np.float32(b), np.float32(c))
    with np.errstate(over="ignore", invalid="ignore"):  # inf / NaN results are expected
        return np.asarray(_fmaf_u(a.astype(float), b.astype(float), c.astype(float)),
                          dtype=np.float64).astype(np.float32)


def flush_denormals(x):
    """f32 with denormals replaced by zero of the same sign (DAZ / FTZ)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).copy()
    den = (u & 0x7F800000) == 0
    u[den] &= 0x80000000
    return u.view(np.float32)


def bf16_bits(x):
    """f32 -> bf16 bits, round to nearest even, NaN stays NaN (llmrt_fp32_to_bf16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r[nan] = (u[nan] >> 16) | 64
    return r.astype(np.uint16)


def bf16_to_f32(h):
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def same_bits(x, y):
    """Equal bit patterns, any NaN matching any NaN (payloads may differ)."""
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.float32)
    both_nan = np.isnan(x) & np.isnan(y)
    return bool(np.all(both_nan | (x.view(np.uint32) == y.view(np.uint32))))


def need_hw(bf16=False):
    int8_ok, bf16_ok = core.amx_hw_available()
    if not int8_ok:
        pytest.skip("CPU lacks AMX")
    if bf16 and not bf16_ok:
        pytest.skip("CPU lacks AMX-BF16")


# ---- (a) tile instructions ----------------------------------------------------------------------

INT8_OPS = {  # op -> (A signed, B signed)
    "dpbssd": (True, True), "dpbsud": (True, False), "dpbusd": (False, True), "dpbuud": (False, False),
}


def ref_dpb(op, c, a, b):
    """numpy TDPB**D: C[m][n] += Σ_k Σ_i A[m][4k+i]·B[k][4n+i], int32 wrapping."""
    sa, sb = INT8_OPS[op]
    av = (a.view(np.int8) if sa else a).astype(np.int64)              # (m, 4K)
    K, n4 = b.shape
    bm = (b.view(np.int8) if sb else b).astype(np.int64)
    bm = bm.reshape(K, n4 // 4, 4).transpose(0, 2, 1).reshape(4 * K, n4 // 4)  # (4K, n)
    return ((c.astype(np.int64) + av @ bm) % (1 << 32)).astype(np.uint32).view(np.int32)


def ref_dpbf16ps(c, a, b):
    """numpy TDPBF16PS: per k, per i in (0, 1): C = ftz(fma(A[2k+i], B[2k+i], C)), inputs DAZ."""
    m, ka = a.shape
    K, n4 = b.shape
    n = n4 // 4
    av = flush_denormals(bf16_to_f32(a.view(np.uint16)))              # (m, 2K)
    bv = flush_denormals(bf16_to_f32(b.view(np.uint16).reshape(K, n, 2)))  # (K, n, 2)
    acc = flush_denormals(c)
    for k in range(K):
        for i in range(2):
            acc = flush_denormals(fmaf(av[:, 2 * k + i][:, None], bv[k, :, i][None, :], acc))
    return acc


TILE_SHAPES = [(16, 16, 64), (1, 1, 4), (3, 5, 12), (16, 7, 32), (9, 16, 64), (15, 13, 60)]


@pytest.mark.parametrize("shape", TILE_SHAPES, ids=lambda s: "m%d-n%d-ka%d" % s)
@pytest.mark.parametrize("op", list(INT8_OPS))
def test_model_int8_dot_matches_numpy(op, shape, rng):
    m, n, ka = shape
    a = rng.integers(0, 256, size=(m, ka), dtype=np.uint8)
    b = rng.integers(0, 256, size=(ka // 4, 4 * n), dtype=np.uint8)
    a[0, :] = 0x80  # -128 / 128: the extreme products
    b[:, :4] = 0x80
    c = rng.integers(-2**31, 2**31, size=(m, n), dtype=np.int64).astype(np.int32)
    c[0, 0] = 2**31 - 1  # wraps on any positive sum
    got = core.amx_dp_once(op, c, a, b)
    np.testing.assert_array_equal(got, ref_dpb(op, c, a, b))


def test_model_int8_wraparound():
    # 64 products of 255·255 = 4161600 onto INT32_MAX - 10 wraps to a negative int32
    a = np.full((1, 64), 255, np.uint8)
    b = np.full((16, 4), 255, np.uint8)
    c = np.array([[2**31 - 11]], np.int32)
    got = core.amx_dp_once("dpbuud", c, a, b)
    assert got[0, 0] == np.int32(((2**31 - 11 + 64 * 255 * 255) % 2**32) - 2**32)
    # the same bytes as signed: 64 · (-1)·(-1) = 64
    assert core.amx_dp_once("dpbssd", np.zeros((1, 1), np.int32), a, b)[0, 0] == 64
    assert core.amx_dp_once("dpbsud", np.zeros((1, 1), np.int32), a, b)[0, 0] == -64 * 255
    assert core.amx_dp_once("dpbusd", np.zeros((1, 1), np.int32), a, b)[0, 0] == -64 * 255


def _bf16_pairs(vals_a, vals_b, c0=0.0):
    """A = one row of bf16 pairs, B = one column, C = 1 x 1."""
    a = bf16_bits(np.array(vals_a, np.float32)).view(np.uint8).reshape(1, -1)
    b = bf16_bits(np.array(vals_b, np.float32)).view(np.uint8).reshape(-1, 4)
    return np.array([[c0]], np.float32), a, b


@pytest.mark.parametrize("shape", TILE_SHAPES, ids=lambda s: "m%d-n%d-ka%d" % s)
def test_model_bf16_dot_matches_numpy(shape, rng):
    m, n, ka = shape
    a = bf16_bits(rng.standard_normal((m, ka // 2)).astype(np.float32)).view(np.uint8)
    b = bf16_bits(rng.standard_normal((ka // 4, 2 * n)).astype(np.float32)).view(np.uint8)
    c = rng.standard_normal((m, n)).astype(np.float32)
    got = core.amx_dp_once("dpbf16ps", c, a, b)
    assert same_bits(got, ref_dpbf16ps(c, a, b))


def test_model_bf16_random_bit_patterns(rng):
    # every bf16 class: ±0, denormals, normals, ±inf, NaNs (random 16-bit patterns)
    a = rng.integers(0, 256, size=(16, 64), dtype=np.uint8)
    b = rng.integers(0, 256, size=(16, 64), dtype=np.uint8)
    c = rng.integers(0, 2**32, size=(16, 16), dtype=np.uint64).astype(np.uint32).view(np.float32)
    got = core.amx_dp_once("dpbf16ps", c, a, b)
    ref = ref_dpbf16ps(c, a, b)
    assert same_bits(got, ref)
    assert np.isnan(got).any() and np.isinf(got).any()  # the specials were exercised


def test_model_bf16_specials():
    tiny = float(np.float32(2.0**-63))
    cases = [
        # (A pair, B pair, C, expected)
        ((np.inf, 0.0), (0.0, 1.0), 0.0, np.nan),            # inf · 0
        ((np.inf, 1.0), (1.0, 0.0), -np.inf, np.nan),        # inf + -inf
        ((np.nan, 1.0), (1.0, 1.0), 1.0, np.nan),
        ((2.0**127, 0.0), (2.0**127, 0.0), 0.0, np.inf),     # overflow
        ((-2.0**127, 0.0), (2.0**127, 0.0), 0.0, -np.inf),
        ((3.0, 5.0), (7.0, 11.0), 1.0, 1.0 + 21.0 + 55.0),
    ]
    for va, vb, c0, want in cases:
        got = core.amx_dp_once("dpbf16ps", *_bf16_pairs(va, vb, c0))[0, 0]
        if np.isnan(want):
            assert np.isnan(got), (va, vb, c0)
        else:
            assert got == want, (va, vb, c0, got)
    # DAZ on A/B: a denormal bf16 (0x0001 = 2^-133) times 2^127 would be 2^-6, but reads as 0
    c, a, b = _bf16_pairs((0.0, 0.0), (2.0**127, 0.0), 1.0)
    a[0, 0:2] = np.array([1], np.uint16).view(np.uint8)
    assert core.amx_dp_once("dpbf16ps", c, a, b)[0, 0] == 1.0
    # DAZ on C: C = 2^-127 (denormal) + 2^-63·2^-63 = 2^-126 exactly, not 1.5·2^-126
    c, a, b = _bf16_pairs((tiny, 0.0), (tiny, 0.0))
    c[0, 0] = np.float32(2.0**-127)
    assert core.amx_dp_once("dpbf16ps", c, a, b)[0, 0] == np.float32(2.0**-126)
    # FTZ on the output: 1.5·2^-126 - 2^-126 = 2^-127 (denormal) flushes to +0
    c, a, b = _bf16_pairs((tiny * 1.5, -tiny), (tiny, tiny))
    got = core.amx_dp_once("dpbf16ps", c, a, b)[0, 0]
    assert got == 0.0 and not np.signbit(got)
    # the two products of a pair round separately: 1 + 2^-24 + 2^-24 -> 1 (each tie to even) ...
    c, a, b = _bf16_pairs((2.0**-12, 2.0**-12), (2.0**-12, 2.0**-12), 1.0)
    assert core.amx_dp_once("dpbf16ps", c, a, b)[0, 0] == 1.0
    # ... while a single product of 2^-23 would be kept
    c, a, b = _bf16_pairs((2.0**-12, 0.0), (2.0**-11, 0.0), 1.0)
    assert core.amx_dp_once("dpbf16ps", c, a, b)[0, 0] == np.float32(1.0 + 2.0**-23)


def test_dp_once_rejects_bad_shapes():
    with pytest.raises(ValueError):
        core.amx_dp_once("dpbssd", np.zeros((2, 2), np.int32), np.zeros((2, 8), np.uint8),
                         np.zeros((3, 8), np.uint8))
    with pytest.raises(ValueError):  # ka = 68 > 64 bytes per tile row
        core.amx_dp_once("dpbssd", np.zeros((1, 1), np.int32), np.zeros((1, 68), np.uint8),
                         np.zeros((17, 4), np.uint8))
    with pytest.raises(ValueError):
        core.amx_dp_once("tdpfoo", np.zeros((1, 1), np.int32), np.zeros((1, 4), np.uint8),
                         np.zeros((1, 4), np.uint8))


# ---- (b) GEMMs on the model ---------------------------------------------------------------------

INT8_TYPES = (T.Q8_0, T.Q4_0, T.Q5_0, T.Q4_1, T.Q5_1)
ACT_TYPE = {T.Q8_0: T.Q8_0, T.Q4_0: T.Q8_0, T.Q5_0: T.Q8_0, T.Q4_1: T.Q8_1, T.Q5_1: T.Q8_1}
# bytes per 32-block of the activation types as llmrt (and today's ggml) store them: f16 d [, f16 s],
# 32 int8 (gguf.GGML_QUANT_SIZES still lists Q8_1 with f32 d and s)
ACT_BLOCK_BYTES = {T.Q8_0: 34, T.Q8_1: 36}
# (n tokens, M weight rows, K)
GEMM_SHAPES = [(16, 16, 32), (17, 15, 96), (33, 17, 64), (100, 40, 256), (1, 1, 32),
               (16, 1, 64), (17, 40, 32), (33, 16, 128)]


def f16_to_f32(raw2):
    return np.ascontiguousarray(raw2).view(np.float16).astype(np.float32)[..., 0]


def unpack_weights(raw, wtype, K):
    """GGUF rows -> q (M, nkb, 32) int64 with the offset removed, d and m (M, nkb) float32."""
    M = raw.shape[0]
    nkb = K // 32
    bb = gguf.GGML_QUANT_SIZES[wtype][1]
    blk = raw.reshape(M, nkb, bb)
    d = f16_to_f32(blk[..., 0:2])
    m = np.zeros_like(d)
    if wtype == T.Q8_0:
        return blk[..., 2:].view(np.int8).astype(np.int64), d, m
    if wtype in (T.Q4_1, T.Q5_1):
        m = f16_to_f32(blk[..., 2:4])
    if wtype in (T.Q4_0, T.Q4_1):
        qs = blk[..., 2:18] if wtype == T.Q4_0 else blk[..., 4:20]
        q = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.int64)
        return q - (8 if wtype == T.Q4_0 else 0), d, m
    qh_at, qs_at = (2, 6) if wtype == T.Q5_0 else (4, 8)
    qh = np.ascontiguousarray(blk[..., qh_at:qh_at + 4]).view(np.uint32).astype(np.int64)  # (M, nkb, 1)
    qs = blk[..., qs_at:qs_at + 16].astype(np.int64)
    j = np.arange(16)
    lo = (qs & 15) | (((qh >> j) & 1) << 4)
    hi = (qs >> 4) | (((qh >> (j + 16)) & 1) << 4)
    return np.concatenate([lo, hi], axis=-1) - (16 if wtype == T.Q5_0 else 0), d, m


def unpack_act(act, atype, K):
    """Q8_0 / Q8_1 rows -> q (n, nkb, 32) int64, d and s (n, nkb) float32."""
    n = act.shape[0]
    nkb = K // 32
    if atype == T.Q8_0:
        blk = act.reshape(n, nkb, 34)
        return blk[..., 2:].view(np.int8).astype(np.int64), f16_to_f32(blk[..., 0:2]), None
    blk = act.reshape(n, nkb, 36)
    return (blk[..., 4:].view(np.int8).astype(np.int64), f16_to_f32(blk[..., 0:2]),
            f16_to_f32(blk[..., 2:4]))


def quantize_act(x, atype):
    n, K = x.shape
    out = np.empty((n, K // 32 * ACT_BLOCK_BYTES[atype]), np.uint8)
    for t in range(n):
        core.quantize_act_raw(np.ascontiguousarray(x[t], np.float32), out[t], int(atype))
    return out


def ref_gemm_int8(raw, wtype, act, K):
    """The documented order: acc = fmaf((float)ci, dw·dx, acc) [; acc = fmaf(mw, sx, acc)] per block.
    Also returns Σ_k |xq·wq|·|d| (+ |mw·sx|) per output: the size of any partial sum any
    summation order can form (vec_dot converts per-lane partial integer sums to f32), so the scale
    of rounding differences between orders."""
    wq, dw, mw = unpack_weights(raw, wtype, K)
    xq, dx, sx = unpack_act(act, ACT_TYPE[wtype], K)
    n, M = act.shape[0], raw.shape[0]
    acc = np.zeros((n, M), np.float32)
    mag = np.zeros((n, M), np.float64)
    for kb in range(K // 32):
        ci = (xq[:, kb, :] @ wq[:, kb, :].T).astype(np.float32)          # exact: |ci| < 2^24
        d = dw[None, :, kb] * dx[:, None, kb]                             # f32 product
        acc = fmaf(ci, d, acc)
        mag += (np.abs(xq[:, kb, :]) @ np.abs(wq[:, kb, :]).T) * np.abs(d.astype(np.float64))
        if wtype in (T.Q4_1, T.Q5_1):
            acc = fmaf(mw[None, :, kb], sx[:, None, kb], acc)
            mag += np.abs(mw[None, :, kb].astype(np.float64) * sx[:, None, kb])
    return acc, mag


def make_int8_case(rng, wtype, n, M, K):
    w = rng.standard_normal((M, K)).astype(np.float32)
    raw = gguf.quants.quantize(w, wtype)
    x = rng.standard_normal((n, K)).astype(np.float32)
    return raw, quantize_act(x, ACT_TYPE[wtype])


@pytest.mark.parametrize("wtype", INT8_TYPES, ids=lambda t: t.name)
def test_unpack_reference_matches_gguf(wtype, rng):
    # the test's own unpacker (used by the references below) agrees with gguf's dequantize
    raw, _ = make_int8_case(rng, wtype, 1, 5, 96)
    q, d, m = unpack_weights(raw, wtype, 96)
    want = gguf.quants.dequantize(raw, wtype)
    got = (q * d[..., None] + m[..., None]).reshape(5, 96)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("wtype", INT8_TYPES, ids=lambda t: t.name)
def test_pack_int8_layout(wtype, rng):
    M, K = 17, 64
    raw, _ = make_int8_case(rng, wtype, 1, M, K)
    p = core.AmxPacked(int(wtype), raw, M, K)
    assert (p.kind, p.M, p.K, p.nkb, p.act_type) == ("int8", M, K, 2, int(ACT_TYPE[wtype]))
    data = p.data()                                       # (ngroups, nkb, blk_bytes)
    assert data.shape == (2, 2, 640 if wtype in (T.Q4_1, T.Q5_1) else 576)
    q, d, m = unpack_weights(raw, wtype, K)
    qp = np.zeros((32, 2, 32), np.int64)
    qp[:M] = q
    # q[kk][n][i] = weight row 16g+n, element 32kb+4kk+i
    want = qp.reshape(2, 16, 2, 8, 4).transpose(0, 2, 3, 1, 4).reshape(2, 2, 512)
    np.testing.assert_array_equal(data[..., :512].view(np.int8), want)
    dp = np.zeros((32, 2), np.float32)
    dp[:M] = d
    np.testing.assert_array_equal(
        np.ascontiguousarray(data[..., 512:576]).view(np.float32),
        dp.reshape(2, 16, 2).transpose(0, 2, 1))
    if wtype in (T.Q4_1, T.Q5_1):
        mp = np.zeros((32, 2), np.float32)
        mp[:M] = m
        np.testing.assert_array_equal(
            np.ascontiguousarray(data[..., 576:640]).view(np.float32),
            mp.reshape(2, 16, 2).transpose(0, 2, 1))


@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=lambda s: "n%d-M%d-K%d" % s)
@pytest.mark.parametrize("wtype", INT8_TYPES, ids=lambda t: t.name)
def test_gemm_int8_model_bit_exact(wtype, shape, rng):
    n, M, K = shape
    raw, act = make_int8_case(rng, wtype, n, M, K)
    p = core.AmxPacked(int(wtype), raw, M, K)
    y = p.gemm_int8(act, n)
    ref, mag = ref_gemm_int8(raw, wtype, act, K)
    np.testing.assert_array_equal(y.view(np.uint32), ref.view(np.uint32))

    # vs the runtime's vec_dot of the same rows (llama.cpp's order on this ISA level)
    dot = np.array([[core.vec_dot(int(wtype), raw[r], act[t], K) for r in range(M)]
                    for t in range(n)], np.float32)
    assert np.all(np.abs(y - dot) <= AMX_VS_DOT_RTOL * mag), np.abs(y - dot).max()


@pytest.mark.parametrize("kc", [1, 3, 8])
@pytest.mark.parametrize("wtype", (T.Q4_0, T.Q4_1), ids=lambda t: t.name)
def test_gemm_int8_k_chunks_do_not_change_bits(wtype, kc, rng):
    n, M, K = 33, 40, 256
    raw, act = make_int8_case(rng, wtype, n, M, K)
    p = core.AmxPacked(int(wtype), raw, M, K)
    whole = p.gemm_int8(act, n)
    chunked = p.gemm_int8(act, n, kc=kc)
    np.testing.assert_array_equal(chunked.view(np.uint32), whole.view(np.uint32))


def test_gemm_int8_row_ranges_split_the_work(rng):
    # threads split M at multiples of 32: the pieces write disjoint columns, same bits as one call
    n, M, K = 17, 72, 64
    raw, act = make_int8_case(rng, T.Q8_0, n, M, K)
    p = core.AmxPacked(int(T.Q8_0), raw, M, K)
    whole = p.gemm_int8(act, n)
    parts = [p.gemm_int8(act, n, row0=r0, row1=r1) for r0, r1 in ((0, 32), (32, 64), (64, 72))]
    for (r0, r1), y in zip(((0, 32), (32, 64), (64, 72)), parts):
        np.testing.assert_array_equal(y[:, r0:r1].view(np.uint32), whole[:, r0:r1].view(np.uint32))
        assert not y[:, :r0].any() and not y[:, r1:].any()
    with pytest.raises(ValueError):  # row0 not a multiple of 32
        p.gemm_int8(act, n, row0=16, row1=32)


def test_pack_rejects_bad_input():
    with pytest.raises(ValueError):  # K not a multiple of 32
        core.AmxPacked(int(T.Q8_0), np.zeros((1, 34), np.uint8), 1, 16)
    with pytest.raises(ValueError):  # row too short for K
        core.AmxPacked(int(T.Q8_0), np.zeros((1, 34), np.uint8), 1, 64)
    with pytest.raises(RuntimeError):  # Q4_K has no AMX packing
        core.AmxPacked(int(T.Q4_K), np.zeros((1, 144), np.uint8), 1, 256)


# bf16 ---------------------------------------------------------------------------------------------

FLOAT_TYPES = (T.F32, T.F16, T.BF16)
BF16_SHAPES = [(16, 16, 32), (17, 15, 33), (33, 17, 31), (100, 40, 100), (1, 1, 1), (16, 40, 64),
               (20, 33, 128)]


def float_rows(w, wtype):
    if wtype == T.F32:
        return w.astype(np.float32).view(np.uint8)
    if wtype == T.F16:
        return w.astype(np.float16).view(np.uint8)
    return bf16_bits(w).view(np.uint8)


def weights_as_bf16(w, wtype):
    if wtype == T.F16:
        w = w.astype(np.float16).astype(np.float32)
    return bf16_bits(w)


def ref_gemm_bf16(wb, xb):
    """TDPBF16PS order over the padded K: for each pair, two fused accumulations with FTZ."""
    a = flush_denormals(bf16_to_f32(xb))     # (n, K_pad)
    b = flush_denormals(bf16_to_f32(wb))     # (M, K_pad)
    acc = np.zeros((a.shape[0], b.shape[0]), np.float32)
    for k in range(a.shape[1]):
        acc = flush_denormals(fmaf(a[:, k][:, None], b[:, k][None, :], acc))
    return acc


def test_act_bf16_rounds_to_nearest_even_and_pads(rng):
    x = rng.standard_normal((3, 40)).astype(np.float32)
    x[0, :4] = [np.inf, -0.0, np.float32(1 + 2**-8), np.float32(1 + 3 * 2**-8)]  # ties -> even
    xb = core.amx_act_bf16(x)
    assert xb.shape == (3, 64)
    np.testing.assert_array_equal(xb[:, :40], bf16_bits(x))
    assert not xb[:, 40:].any()
    assert bf16_to_f32(xb[0, 2]) == 1.0 and bf16_to_f32(xb[0, 3]) == np.float32(1 + 4 * 2**-8)


@pytest.mark.parametrize("shape", BF16_SHAPES, ids=lambda s: "n%d-M%d-K%d" % s)
@pytest.mark.parametrize("wtype", FLOAT_TYPES, ids=lambda t: t.name)
def test_gemm_bf16_model_bit_exact(wtype, shape, rng):
    n, M, K = shape
    w = rng.standard_normal((M, K)).astype(np.float32)
    x = rng.standard_normal((n, K)).astype(np.float32)
    p = core.AmxPacked(int(wtype), float_rows(w, wtype), M, K)
    assert p.kind == "bf16" and p.act_type == -1
    xb = core.amx_act_bf16(x)
    y = p.gemm_bf16(xb)
    K_pad = xb.shape[1]
    wb = np.zeros((M, K_pad), np.uint16)
    wb[:, :K] = weights_as_bf16(w, wtype)
    ref = ref_gemm_bf16(wb, xb)
    np.testing.assert_array_equal(y.view(np.uint32), ref.view(np.uint32))

    # vs float64 of the same bf16 values
    a64 = bf16_to_f32(xb).astype(np.float64)
    b64 = bf16_to_f32(wb).astype(np.float64)
    exact = a64 @ b64.T
    mag = np.abs(a64) @ np.abs(b64).T
    assert np.all(np.abs(y - exact) <= BF16_VS_F64_RTOL * mag)

    if wtype == T.BF16 and K % 32 == 0:  # vs the BF16·BF16 vec_dot kernel
        dot = np.array([[core.vec_dot(int(T.BF16), float_rows(w, wtype)[r], xb[t].view(np.uint8), K)
                         for r in range(M)] for t in range(n)], np.float32)
        assert np.all(np.abs(y - dot) <= 2 * BF16_VS_F64_RTOL * mag)


def test_gemm_bf16_row_ranges(rng):
    n, M, K = 17, 40, 64
    w = rng.standard_normal((M, K)).astype(np.float32)
    p = core.AmxPacked(int(T.F32), float_rows(w, T.F32), M, K)
    xb = core.amx_act_bf16(rng.standard_normal((n, K)).astype(np.float32))
    whole = p.gemm_bf16(xb)
    lo, hi = p.gemm_bf16(xb, row0=0, row1=32), p.gemm_bf16(xb, row0=32, row1=40)
    np.testing.assert_array_equal(np.concatenate([lo[:, :32], hi[:, 32:]], axis=1), whole)


# ---- (c) real instructions vs the model ---------------------------------------------------------

def test_hw_reports_unsupported_without_amx(rng):
    if core.amx_hw_available()[0]:
        pytest.skip("CPU has AMX: the hw path is compared with the model below")
    with pytest.raises(RuntimeError, match="AMX is not available"):
        core.amx_dp_once("dpbssd", np.zeros((1, 1), np.int32), np.zeros((1, 4), np.uint8),
                         np.zeros((1, 4), np.uint8), backend="hw")
    raw, act = make_int8_case(rng, T.Q8_0, 16, 16, 32)
    with pytest.raises(RuntimeError, match="AMX is not available"):
        core.AmxPacked(int(T.Q8_0), raw, 16, 32).gemm_int8(act, 16, backend="hw")


@pytest.mark.parametrize("op", list(INT8_OPS) + ["dpbf16ps"])
def test_hw_tile_dot_matches_model(op, rng):
    need_hw(bf16=op == "dpbf16ps")
    for m, n, ka in TILE_SHAPES:
        a = rng.integers(0, 256, size=(m, ka), dtype=np.uint8)
        b = rng.integers(0, 256, size=(ka // 4, 4 * n), dtype=np.uint8)
        if op == "dpbf16ps":
            c = rng.standard_normal((m, n)).astype(np.float32)
            assert same_bits(core.amx_dp_once(op, c, a, b, backend="hw"),
                             core.amx_dp_once(op, c, a, b))
        else:
            c = rng.integers(-2**31, 2**31, size=(m, n), dtype=np.int64).astype(np.int32)
            np.testing.assert_array_equal(core.amx_dp_once(op, c, a, b, backend="hw"),
                                          core.amx_dp_once(op, c, a, b))


@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=lambda s: "n%d-M%d-K%d" % s)
@pytest.mark.parametrize("wtype", INT8_TYPES, ids=lambda t: t.name)
def test_hw_gemm_int8_matches_model(wtype, shape, rng):
    need_hw()
    n, M, K = shape
    raw, act = make_int8_case(rng, wtype, n, M, K)
    p = core.AmxPacked(int(wtype), raw, M, K)
    np.testing.assert_array_equal(p.gemm_int8(act, n, backend="hw").view(np.uint32),
                                  p.gemm_int8(act, n).view(np.uint32))


@pytest.mark.parametrize("shape", BF16_SHAPES, ids=lambda s: "n%d-M%d-K%d" % s)
def test_hw_gemm_bf16_matches_model(shape, rng):
    need_hw(bf16=True)
    n, M, K = shape
    w = rng.standard_normal((M, K)).astype(np.float32)
    p = core.AmxPacked(int(T.F32), float_rows(w, T.F32), M, K)
    xb = core.amx_act_bf16(rng.standard_normal((n, K)).astype(np.float32))
    assert same_bits(p.gemm_bf16(xb, backend="hw"), p.gemm_bf16(xb))
