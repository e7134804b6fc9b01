"""F32 / F16 / BF16 weights at the 512-bit levels (csrc/kernels/x86/gemm_f_w.inc: gemm_f_avx512.c,
gemm_f_bf16_avx512.c with vdpbf16ps, and their emulated twins gemm_f_emu512.c / gemm_f_bf16_emu512.c).

  (a) where the CPU has the level: the real kernels and the emulated twins give identical bits, for
      vec_dot and for gemm (decode n_x = 1, prefill tiles of 6 and their tails), on K that fits no
      vector width;
  (b) at every level (emulated ones included): gemm over 1..gemm_groups() groups per call == vec_dot,
      bit for bit, whatever n_rows;
  (c) at every level: the result is within a derived bound of the float64 dot of the same values
      (weights, and activations as mul_mat's QUANTIZE node rounds them): each output is a sum of K
      exact products (fp32 fma, or vdpbf16ps on bf16 x bf16: exact in f32) added along a path of at
      most K / 8 + 8 roundings of 2^-24 (avx2: K / 8 steps into one lane of its one chain, 8 lanes
      summed in 3 adds; the 512-bit levels: K / 16 steps (fma) or K / 16 adds (vdpbf16ps: two per
      step of 32) into one lane of one chain, 16 lanes summed in 4 adds; a double tail), so
      |got - ref| <= (K / 8 + 8) · 2^-24 · Σ|w·a| (+ the final rounding to f32);
  (d) at the 512-bit levels (real and emulated): vec_dot is a numpy statement of the order
      gemm_f_w.inc documents (llamafile's tinyBLAS<16, __m512>: one chain of 16 lanes, GCC's
      _mm512_reduce_add_ps, a double tail; vdpbf16ps: odd then even product of each pair per lane),
      bit for bit, so (b) pins the packed kernels to it too.

Run: python -m pytest -q tests/test_gemm_float.py
"""
import numpy as np
import pytest

from gguf import GGMLQuantizationType as T

import llmrt._core as core
from llmrt import runtime
from test_dot import fma32             # a * b + c rounded once to f32 (through long double)

FLOATS = (T.F32, T.F16, T.BF16)
R = 8                                  # rows per packed group (pack_k.h: PK_R)
KS = (37, 1000, 1536, 2571)            # tails past every step: 16, 32 (bf16 pairs), 64, 128
N_XS = (1, 2, 5, 6, 7, 13, 64)         # decode, prefill tiles of 6 and their tails
U = 2.0 ** -24


def random_rows(t, k, m, rng):
    w = (rng.standard_normal((m, k)) * 0.05).astype(np.float32)
    if t == T.F32:
        return w.view(np.uint8)
    if t == T.F16:
        return w.astype(np.float16).view(np.uint8)
    return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)  # truncated to bf16


def act_rows(t, k, n_x, rng):
    """n_x activation rows as mul_mat's QUANTIZE node writes them (F32 / F16 / BF16)."""
    es = 4 if t == T.F32 else 2
    a = np.empty((n_x, k * es), dtype=np.uint8)
    for j in range(n_x):
        x = (rng.standard_normal(k) * np.exp(rng.normal(0, 1))).astype(np.float32)
        core.quantize_act_raw(x, a[j], int(t))
    return a


def values(t, rows, k):
    """float64 [n, k] values of F32 / F16 / BF16 rows."""
    if t == T.F32:
        return rows.view(np.float32).reshape(-1, k).astype(np.float64)
    if t == T.F16:
        return rows.view(np.float16).reshape(-1, k).astype(np.float64)
    return (rows.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(-1, k).astype(np.float64)


def gemm_all(pw, a):
    return np.concatenate([pw.gemm(g, a) for g in range(pw.n_groups)], axis=1)


def vec_dot_all(t, w, a, k):
    out = np.empty((a.shape[0], w.shape[0]), dtype=np.float32)
    for j in range(a.shape[0]):
        for r in range(w.shape[0]):
            out[j, r] = core.vec_dot(int(t), w[r], a[j], k)
    return out


def run_level(level, emulated, fn, bf16=None):
    """fn() at `level` (emulated: its simdw.h twin, with AVX512-BF16 emulated iff bf16, by default
    iff this CPU has it) -> (fn's result, the level's kernel names); the previous level after."""
    before = runtime.isa()
    if bf16 is None:
        bf16 = bool(runtime.cpu_features()["avx512_bf16"])
    try:
        if emulated:
            assert runtime.set_isa_emulated(level, bf16=bf16) == level
        else:
            assert runtime.set_isa(level) == level
        return fn(), core.kernel_names()
    finally:
        runtime.set_isa(before)


@pytest.mark.parametrize("level", ("avx512", "avx512_vnni"))
@pytest.mark.parametrize("t", FLOATS, ids=lambda v: v.name)
def test_real_equals_emulated(level, t, rng):
    if level not in runtime.available_isas():
        pytest.skip(f"CPU lacks {'AVX-512' if level == 'avx512' else 'AVX512-VNNI'}: nothing to compare with")
    M = 2 * R + 3
    for k in KS:
        w = random_rows(t, k, M, rng)
        a = act_rows(t, k, max(N_XS), rng)

        def compute():
            pw = core.pack_weight(w, int(t), k, M)
            return [vec_dot_all(t, w, a[:3], k)] + [gemm_all(pw, a[:n]) for n in N_XS]

        real, nr = run_level(level, False, compute)
        emu, ne = run_level(level, True, compute)
        for kind in ("vec_dot", "gemm"):  # the emulated twin of the very same kernel
            assert ne[kind][t.name] == nr[kind][t.name] + "_emu", (ne[kind][t.name], nr[kind][t.name])
        for what, x, y in zip(("vec_dot",) + tuple(f"gemm n_x={n}" for n in N_XS), real, emu):
            assert np.isfinite(x).all() and np.abs(x).max() > 0
            bad = np.argwhere(x.view(np.uint32) != y.view(np.uint32))
            assert bad.size == 0, f"{nr['gemm'][t.name]} k={k} {what}: {len(bad)} differ, first {tuple(bad[0])}"


@pytest.mark.parametrize("k", (37, 1000, 2571, 8200))  # 8200: past the avx2 prefill's widening buffer
@pytest.mark.parametrize("t", FLOATS, ids=lambda v: v.name)
def test_several_groups_per_call(isa_level, t, k, rng):
    """gemm over up to gemm_groups() consecutive groups per call (4 for the float types from the
    avx2 level up: decode widens the activation once per call) == vec_dot for every row, whatever
    n_rows (the last group partly real or zero-padded) and n_x."""
    M = 4 * R + 3
    w = random_rows(t, k, M, rng)
    a = act_rows(t, k, max(N_XS), rng)
    pw = core.pack_weight(w, int(t), k, M)
    G = pw.gemm_groups()
    if G < 2:
        pytest.skip(f"{t.name}'s gemm takes one group per call at {isa_level}")
    ref = vec_dot_all(t, w, a, k)
    for g in (0, 1, pw.n_groups - G):
        real = min(G * R, M - g * R)
        for n_rows in sorted({1, R + 1, G * R - 1, real}):
            if n_rows > G * R or g + -(-n_rows // R) > pw.n_groups:
                continue
            for n_x in N_XS:
                y = pw.gemm(g, a[:n_x], n_rows)
                want = np.zeros((n_x, n_rows), np.float32)
                kk = min(n_rows, real)
                want[:, :kk] = ref[:n_x, g * R:g * R + kk]
                np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32),
                                              err_msg=f"{t.name} k={k} g={g} n_rows={n_rows} n_x={n_x}")


@pytest.mark.parametrize("t", FLOATS, ids=lambda v: v.name)
def test_close_to_float64(isa_level, t, rng):
    M = R + 3
    for k in KS:
        w = random_rows(t, k, M, rng)
        a = act_rows(t, k, 7, rng)
        pw = core.pack_weight(w, int(t), k, M)
        got = gemm_all(pw, a).astype(np.float64)                 # [n_x, M]
        wv, av = values(t, w, k), values(t, a, k)
        ref = av @ wv.T
        mag = np.abs(av) @ np.abs(wv).T
        tol = (k / 8 + 8) * U * mag + U * np.abs(ref)           # derived above, + the f32 result
        bad = np.argwhere(np.abs(got - ref) > tol)
        assert bad.size == 0, (f"{core.kernel_names()['gemm'][t.name]} k={k}: {len(bad)} outside, first "
                               f"{tuple(bad[0])}: {got[tuple(bad[0])]!r} vs {ref[tuple(bad[0])]!r}")
        assert (tol < 1e-3 * mag).all()                           # the bound is not vacuous


def test_bf16_uses_vdpbf16ps_where_the_cpu_has_it():
    """At the 512-bit levels BF16 weights run vdpbf16ps iff the CPU has AVX512-BF16; F16 stays on
    fp32 fmas (its 11-bit significands would be rounded to bf16's 8)."""
    for level in ("avx512", "avx512_vnni"):
        for emulated in (False, True):
            if not emulated and level not in runtime.available_isas():
                continue
            _, names = run_level(level, emulated, lambda: None)
            dp = bool(runtime.cpu_features()["avx512_bf16"])
            suffix = "avx512" + ("_emu" if emulated else "")  # registered at avx512, kept above
            assert names["gemm"]["BF16"] == ("gemm_bf16_dp_" if dp else "gemm_bf16_") + suffix
            assert names["vec_dot"]["BF16"] == ("vec_dot_bf16_dp_" if dp else "vec_dot_bf16_") + suffix
            assert names["gemm"]["F16"] == "gemm_f16_" + suffix


def reduce16(acc):
    """GCC's _mm512_reduce_add_ps (simdw.h's w_reduce_add_ps): 8 + 8, 4 + 4, (0,1) + (2,3), 0 + 1."""
    s8 = (acc[:8] + acc[8:]).astype(np.float32)
    s4 = (s8[:4] + s8[4:]).astype(np.float32)
    s2 = (s4[:2] + s4[2:]).astype(np.float32)
    return np.float32(s2[0] + s2[1])


def dot512_statement(x, y, dp):
    """gemm_f_w.inc's order for one (row, activation) pair of float64 values exact in f32."""
    n = x.shape[0]
    step = 32 if dp else 16
    nv = n - n % step
    acc = np.zeros(16, np.float32)
    for i in range(0, nv, step):
        for j in range(16):
            if dp:  # vdpbf16ps: lane j adds the odd pair's product, then the even one's (both exact)
                a = fma32(x[i + 2 * j + 1], y[i + 2 * j + 1], acc[j])
                acc[j] = fma32(x[i + 2 * j], y[i + 2 * j], a)
            else:
                acc[j] = fma32(x[i + j], y[i + j], acc[j])
    s = float(reduce16(acc))
    for i in range(nv, n):
        s += float(np.float32(x[i] * y[i]))
    return np.float32(s)


@pytest.mark.parametrize("level", ("avx512", "avx512_vnni"))
@pytest.mark.parametrize("emulated", (False, True), ids=("real", "emulated"))
@pytest.mark.parametrize("t", FLOATS, ids=lambda v: v.name)
def test_512_bit_order_is_one_chain(level, emulated, t, rng):
    if not emulated and level not in runtime.available_isas():
        pytest.skip(f"CPU lacks {'AVX-512' if level == 'avx512' else 'AVX512-VNNI'}")
    cpu_bf16 = bool(runtime.cpu_features()["avx512_bf16"])
    # emulated BF16: the vdpbf16ps kernel and the fma one; otherwise the kernel of this CPU
    for bf16 in ((False, True) if emulated and t == T.BF16 else (cpu_bf16,)):
        for k in (1, 15, 16, 17, 31, 32, 33, 100, 1000):
            w = random_rows(t, k, 3, rng)
            a = act_rows(t, k, 2, rng)
            got, names = run_level(level, emulated, lambda: vec_dot_all(t, w, a, k), bf16=bf16)
            dp = "_dp_" in names["vec_dot"][t.name]
            assert dp == (t == T.BF16 and bf16)
            wv, av = values(t, w, k), values(t, a, k)
            for j in range(a.shape[0]):
                for r in range(w.shape[0]):
                    want = dot512_statement(wv[r], av[j], dp)
                    assert got[j, r] == want, (names["vec_dot"][t.name], k, j, r, got[j, r], want)
