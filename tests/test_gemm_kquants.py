"""Packed GEMV/GEMM kernels for the K-quants (Q2_K..Q6_K) and the float types (F32, F16, BF16):
csrc/kernels/pack_k.h (layouts), gemm_k_generic.c, x86/gemm_k_avx2.c, x86/gemm_f_w.inc (512-bit levels: tests/test_gemm_float.py).

Two checks:
  (a) packing is lossless: the GGUF rows rebuilt here in numpy from the packed group bytes (the
      inverse of the layout pack_k.h documents) equal the original rows byte for byte, padding rows
      are zero, and their dequantized values equal the original's;
  (b) for every ISA level this CPU has, gemm over the packed groups == vec_dot on the plain rows,
      BIT-EXACT, for every (row, activation row), on odd shapes: M = 1, R-1, R+1, 37 rows,
      K = 256, 512, 2560 (and, for the float types, K that is not a multiple of any vector width),
      n_x = 1, 2, 3, 5, 17, 64 activation rows.

Weights are random blocks (every bit pattern of quants and scales, f16 scales of sane size), so
the packed scale/min expansion is exercised on all values; activations go through the activation
quantizer mul_mat uses (quant_act_row: Q8_K for the K-quants, F16 / BF16 / F32 for the floats).

Run: python -m pytest -q tests/test_gemm_kquants.py
"""
import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as T

import llmrt._core as core
from llmrt import runtime

from test_gemm import VEC_DOT_TYPE as Q32_ACT_TYPE  # noqa: E402
from test_gemm import assert_calls_of_several_groups, random_act  # noqa: E402
from test_gemm import random_rows as q32_rows  # noqa: E402

KQUANTS = (T.Q4_K, T.Q6_K, T.Q5_K, T.Q3_K, T.Q2_K, T.IQ4_XS)
FLOATS = (T.F32, T.F16, T.BF16)
VEC_DOT_TYPE = {T.Q2_K: T.Q8_K, T.Q3_K: T.Q8_K, T.Q4_K: T.Q8_K, T.Q5_K: T.Q8_K, T.Q6_K: T.Q8_K, T.IQ4_XS: T.Q8_K,
                T.F32: T.F32, T.F16: T.F16, T.BF16: T.BF16}
# Byte offsets of the f16 scale fields in each GGUF block (quant_blocks.h), set to sane values.
F16_FIELDS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
              T.IQ4_XS: (0,)}

K_QUANT = (256, 512, 2560)
K_FLOAT = (256, 512, 2560, 37, 1000, 2571)  # 37, 1000, 2571: tails past every vector width
N_X = (1, 2, 3, 4, 5, 17, 64)
R = 8  # rows per packed group (pack_k.h: PK_R)
M_SHAPES = (1, R - 1, R + 1, 37)


def row_bytes(t, k):
    be, bb = gguf.GGML_QUANT_SIZES[t]
    return k // be * bb


def random_rows(t, k, m, rng):
    """m rows of k elements of type t, uint8 [m, row_bytes]."""
    if t in FLOATS:
        w = (rng.standard_normal((m, k)) * 0.05).astype(np.float32)
        if t == T.F32:
            return w.view(np.uint8)
        if t == T.F16:
            return w.astype(np.float16).view(np.uint8)
        return gguf.quants.quantize(w, T.BF16).view(np.uint8)
    be, bb = gguf.GGML_QUANT_SIZES[t]
    nb = m * k // be
    b = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        d = rng.uniform(1e-3, 1e-2, size=nb) * rng.choice([-1, 1], size=nb)
        b[:, off:off + 2] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
    return b.reshape(m, -1)


def act_rows(t, k, n_x, rng):
    """n_x activation rows in t's vec_dot type, as mul_mat quantizes them: uint8 [n_x, bytes]."""
    at = VEC_DOT_TYPE[t]
    a = np.empty((n_x, row_bytes(at, k)), dtype=np.uint8)
    for j in range(n_x):
        mag = np.repeat(np.exp(rng.normal(0, 1, size=(k + 31) // 32)), 32)[:k]
        x = (rng.standard_normal(k) * mag).astype(np.float32)
        core.quantize_act_raw(x, a[j], int(at))
    return a


# ---- the inverse of pack_k.h's layouts -------------------------------------------------------------

def _f16s(bg, off):
    return bg[:, off:off + 16].reshape(-1, R, 2)  # [nb, R, 2 bytes]


def _k4_scales(sc, m):
    """get_scale_min_k4 inverted: 8 six-bit scales and mins per row -> the 12 GGUF bytes."""
    sc = sc.astype(np.uint16)
    m = m.astype(np.uint16)
    q = np.zeros(sc.shape[:-1] + (12,), dtype=np.uint16)
    q[..., 0:4] = sc[..., 0:4] | ((sc[..., 4:8] >> 4) << 6)
    q[..., 4:8] = m[..., 0:4] | ((m[..., 4:8] >> 4) << 6)
    q[..., 8:12] = (sc[..., 4:8] & 0x0f) | ((m[..., 4:8] & 0x0f) << 4)
    return q.astype(np.uint8)


def _q3_scales(sc):
    """unpack_scales_q3_k inverted: 16 scales (value - 32, int8) per row -> the 12 GGUF bytes."""
    v = (sc.astype(np.int16) + 32).astype(np.uint16)
    lo, hi = v & 0x0f, v >> 4
    q = np.zeros(sc.shape[:-1] + (12,), dtype=np.uint16)
    q[..., 0:8] = lo[..., 0:8] | (lo[..., 8:16] << 4)
    for j in range(16):
        q[..., 8 + j % 4] |= hi[..., j] << (2 * (j // 4))
    return q.astype(np.uint8)


def unpack_group(t, k, grp):
    """uint8 [R, row_bytes]: the R rows of one packed group in the plain GGUF layout."""
    if t in FLOATS:
        es = 4 if t == T.F32 else 2
        return grp[:R * k * es].reshape(R, k * es)
    nb = k // 256
    if t == T.Q4_K:
        bg = grp[:nb * 1184].reshape(nb, 1184)
        sc = bg[:, 32:96].reshape(nb, R, 8)
        m = bg[:, 96:160].reshape(nb, 4, R, 2).transpose(0, 2, 1, 3).reshape(nb, R, 8)
        parts = [_f16s(bg, 0), _f16s(bg, 16), _k4_scales(sc, m), bg[:, 160:].reshape(nb, R, 128)]
    elif t == T.Q5_K:
        bg = grp[:nb * 1440].reshape(nb, 1440)
        sc = bg[:, 32:96].reshape(nb, R, 8)
        m = bg[:, 96:160].reshape(nb, 4, R, 2).transpose(0, 2, 1, 3).reshape(nb, R, 8)
        parts = [_f16s(bg, 0), _f16s(bg, 16), _k4_scales(sc, m), bg[:, 160:416].reshape(nb, R, 32),
                 bg[:, 416:].reshape(nb, R, 128)]
    elif t == T.Q6_K:
        bg = grp[:nb * 1696].reshape(nb, 1696)
        parts = [bg[:, 160:1184].reshape(nb, R, 128), bg[:, 1184:].reshape(nb, R, 64),
                 bg[:, 32:160].reshape(nb, R, 16), _f16s(bg, 0)]
    elif t == T.Q3_K:
        bg = grp[:nb * 928].reshape(nb, 928)
        sc = bg[:, 32:160].copy().reshape(nb, R, 16).view(np.int8)
        parts = [bg[:, 160:416].reshape(nb, R, 32), bg[:, 416:].reshape(nb, R, 64), _q3_scales(sc),
                 _f16s(bg, 0)]
    elif t == T.IQ4_XS:
        bg = grp[:nb * 1120].reshape(nb, 1120)
        ls = (bg[:, 32:96].reshape(nb, R, 8).view(np.int8).astype(np.int16) + 32).astype(np.uint16)
        lo, hi = ls & 0x0f, ls >> 4
        sl = (lo[..., 0::2] | (lo[..., 1::2] << 4)).astype(np.uint8)          # scales_l[4]
        sh = np.zeros((nb, R), dtype=np.uint16)
        for ib in range(8):
            sh |= hi[..., ib] << (2 * ib)                                    # scales_h
        parts = [_f16s(bg, 0), sh.reshape(nb, R, 1).view(np.uint8), sl, bg[:, 96:].reshape(nb, R, 128)]
    else:  # Q2_K
        bg = grp[:nb * 672].reshape(nb, 672)
        parts = [bg[:, 32:160].reshape(nb, R, 16), bg[:, 160:].reshape(nb, R, 64), _f16s(bg, 0),
                 _f16s(bg, 16)]
    blocks = np.concatenate(parts, axis=2)  # [nb, R, block bytes]
    return blocks.transpose(1, 0, 2).reshape(R, -1)


def dequant(t, rows, k):
    if t == T.F32:
        return rows.view(np.float32).astype(np.float64)
    if t == T.F16:
        return rows.view(np.float16).astype(np.float64)
    return gguf.quants.dequantize(rows, t).reshape(rows.shape[0], k).astype(np.float64)


# ---- tests -----------------------------------------------------------------------------------------

def cases(types, ks):
    return [(t, k) for t in types for k in ks]


@pytest.mark.parametrize("t,k", cases(KQUANTS, K_QUANT) + cases(FLOATS, K_FLOAT),
                         ids=lambda v: v.name if isinstance(v, T) else str(v))
def test_pack_lossless(t, k, rng):
    assert core.pack_rows(int(t)) == R
    for m in M_SHAPES:
        w = random_rows(t, k, m, rng)
        pw = core.pack_weight(w, int(t), k, m)
        assert pw.n_groups == (m + R - 1) // R
        assert pw.group_bytes % 64 == 0
        back = np.concatenate([unpack_group(t, k, pw.group(g)) for g in range(pw.n_groups)])
        np.testing.assert_array_equal(back[:m], w)           # byte for byte
        assert not back[m:].any()                             # padding rows are zero
        np.testing.assert_array_equal(dequant(t, back[:m], k), dequant(t, w, k))
        # llmrt_unpack_group (C) agrees
        np.testing.assert_array_equal(np.concatenate([pw.unpack(g) for g in range(pw.n_groups)]), w)


def gemm_all(pw, a):
    """float32 [n_x, M]: gemm over every group of pw."""
    return np.concatenate([pw.gemm(g, a) for g in range(pw.n_groups)], axis=1)


def vec_dot_all(t, w, a, k):
    out = np.empty((a.shape[0], w.shape[0]), dtype=np.float32)
    for j in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[j, r] = core.vec_dot(int(t), w[r], a[j], k)
    return out


def assert_gemm_bits(pw, t, w, a, k, what):
    """gemm over every group of pw == vec_dot on the plain rows, bit for bit; returns vec_dot's."""
    got = gemm_all(pw, a)
    want = vec_dot_all(t, w, a, k)
    assert np.isfinite(want).all() and np.abs(want).max() > 0  # a real comparison
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, (f"{what}: {len(bad)} of {want.size} differ, first (j, r) = {tuple(bad[0])}: "
                           f"{got[tuple(bad[0])]!r} vs {want[tuple(bad[0])]!r}")
    return want


@pytest.mark.parametrize("n_x", N_X)
@pytest.mark.parametrize("t,k", cases(KQUANTS, K_QUANT) + cases(FLOATS, K_FLOAT),
                         ids=lambda v: v.name if isinstance(v, T) else str(v))
def test_gemm_bit_exact(isa_level, t, k, n_x, rng):
    names = core.kernel_names()
    if t.name not in names["gemm"]:
        # a level whose vec_dot has no matching gemm leaves it NULL (gemm.h); only allowed for
        # BF16 with vdpbf16ps
        assert t == T.BF16 and core.cpu_features()["avx512_bf16"], f"no gemm for {t.name} at {isa_level}"
        pytest.skip("BF16 vec_dot uses vdpbf16ps here: no packed gemm at this level")
    for m in M_SHAPES:
        w = random_rows(t, k, m, rng)
        a = act_rows(t, k, n_x, rng)
        pw = core.pack_weight(w, int(t), k, m)
        assert_gemm_bits(pw, t, w, a, k, f"{names['gemm'][t.name]} vs {names['vec_dot'][t.name]}, M={m}")


LEVEL_RANK = {lv: i for i, lv in enumerate(runtime.ISA_LEVELS)}


def test_gemm_kernel_names(isa_level):
    """The packed path exists for every K-quant and float type, and its kernel comes from the
    vec_dot's level or a higher one up to the active level (levels stack: a level keeps the
    kernels of the level below until it has a faster one of its own; a higher level's gemm may
    reproduce a lower level's vec_dot, which the bit-exactness tests here check), and from an
    emulated twin only at an emulated level."""
    names = core.kernel_names()
    emulated = runtime.isa_emulated()
    for t in KQUANTS + FLOATS:
        gemm, dot = names["gemm"][t.name], names["vec_dot"][t.name]
        assert gemm.startswith("gemm_" + t.name.lower().replace("_k", "_K") + "_")
        lg, ld = kernel_level(gemm), kernel_level(dot)
        assert LEVEL_RANK[ld.removesuffix("_emu")] <= LEVEL_RANK[lg.removesuffix("_emu")] \
            <= LEVEL_RANK[isa_level], (gemm, dot)
        assert emulated or not lg.endswith("_emu"), gemm
        if isa_level == "generic":
            assert lg == "generic"


def kernel_level(name):
    """The level suffix of a kernel name: gemm_q4_K_avx512_vnni_emu -> avx512_vnni_emu."""
    for lv in sorted(runtime.ISA_LEVELS, key=len, reverse=True):
        for suffix in (lv + "_emu", lv):
            if name.endswith("_" + suffix):
                return suffix
    raise AssertionError(f"{name}: no ISA level suffix")


# Q4_K / Q6_K prefill (gemm_k_avx2.c: from 9 tokens on, in chunks of TC = 32 activation rows; fewer:
# the GEMV over the tokens): token counts around that bound and around and past the chunk size, rows
# that do not fill the last group (M = 13)
N_X_PREFILL = (4, 5, 8, 9, 31, 32, 33, 65, 70)


@pytest.mark.parametrize("n_x", N_X_PREFILL)
@pytest.mark.parametrize("t", (T.Q4_K, T.Q6_K), ids=lambda v: v.name)
def test_gemm_prefill_chunks_bit_exact(isa_level, t, n_x, rng):
    k, m = 768, 13
    w = random_rows(t, k, m, rng)
    a = act_rows(t, k, n_x, rng)
    pw = core.pack_weight(w, int(t), k, m)
    want = assert_gemm_bits(pw, t, w, a, k, f"n_x={n_x}")
    # each group alone with fewer rows than it holds (n_rows < R): the same bits
    got5 = pw.gemm(0, a, n_rows=5)
    assert (got5.view(np.uint32) == want[:, :5].view(np.uint32)).all()


@pytest.mark.parametrize("k", (256, 768))
@pytest.mark.parametrize("t", KQUANTS, ids=lambda v: v.name)
def test_gemm_several_groups_per_call_kquants(isa_level, t, k, rng):
    """A K-quant gemm that takes gemm_groups() > 1 consecutive groups per call (the avx512_vnni
    level's 16-row Q4_K prefill, gemm_kq_w.inc) gives vec_dot's bits for every row it covers,
    whatever n_rows (R + 1 .. G·R, the last group partly real or zero-padded) and n_x (decode,
    tails of its 4-token steps and of its 64-token chunks)."""
    R = core.pack_rows(int(t))
    M = 3 * R + 1                                    # groups 0..2 full, group 3 one real row
    n_xs = (1, 2, 3, 4, 5, 17, 64, 70)
    w = random_rows(t, k, M, rng)
    a = act_rows(t, k, max(n_xs), rng)
    pw = core.pack_weight(w, int(t), k, M)
    G = pw.gemm_groups()
    if G < 2:
        pytest.skip(f"{t.name}'s gemm takes one group per call at {isa_level}")
    assert_calls_of_several_groups(pw, a, vec_dot_all(t, w, a, k), R, M, n_xs, f"{t.name} k={k}")


# every packed type whose avx512_vnni kernels keep the avx2 level's order (Q8_0 and Q4_1 have their own
# block order there: test_dot.py::test_block_order_from_avx512_vnni)
LEVEL_TYPES = (T.Q4_0, T.Q5_0, T.Q5_1, T.IQ4_NL) + KQUANTS


def _gemm_calls(pw, a, M):
    """Every output of pw through calls of gemm_groups() groups (the way MUL_MAT calls it)."""
    R, G = pw.R, pw.gemm_groups()
    out = np.zeros((a.shape[0], M), np.float32)
    for g in range(0, pw.n_groups, G):
        n_rows = min(G * R, M - g * R)
        out[:, g * R:g * R + n_rows] = pw.gemm(g, a, n_rows)
    return out


@pytest.mark.parametrize("t", LEVEL_TYPES, ids=lambda v: v.name)
def test_avx512_vnni_gemm_gives_the_avx2_bits(t, rng):
    """The avx512_vnni level's 16-lane prefill kernels (gemm_q32_w.inc, gemm_kq_w.inc) reproduce the
    AVX2 kernels' order: at that level, real where the CPU has it and emulated (simdw.h's AVX2
    backend) everywhere, every output of every call equals the AVX2 level's bit for bit, for decode
    and prefill token counts and a last call of fewer groups (Q4_0 and IQ4_NL in llama.cpp's repacked
    order at both levels; test_dot.py checks it against a numpy statement)."""
    from conftest import skip_unless_isa, use_isa
    skip_unless_isa("avx2")
    k = 512 if t in KQUANTS else 416
    M = 37
    w = random_rows(t, k, M, rng) if t in KQUANTS else q32_rows(t, k, M, rng)
    a = act_rows(t, k, 70, rng) if t in KQUANTS else random_act(Q32_ACT_TYPE[t], k, 70, rng)
    before, emulated = runtime.isa(), runtime.isa_emulated()
    try:
        outs = {}
        for level in ("avx2", "avx512_vnni-emu", "avx512_vnni"):
            if level == "avx512_vnni" and "avx512_vnni" not in runtime.available_isas():
                continue
            use_isa(level)
            pw = core.pack_weight(w, int(t), k, M)
            outs[level] = np.concatenate([_gemm_calls(pw, a[:n], M) for n in (1, 3, 70)])
        for level, y in outs.items():
            assert np.isfinite(y).all()
            np.testing.assert_array_equal(y.view(np.uint32), outs["avx2"].view(np.uint32), err_msg=level)
    finally:
        (runtime.set_isa_emulated if emulated else runtime.set_isa)(before)
