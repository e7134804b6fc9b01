"""Packed weights (csrc/include/llmrt/gemm.h): load-time repacking and the gemm kernels over it.

For every type with a packed path and every ISA level this CPU can run:
  - gemm over a packed group == vec_dot on the plain rows, BIT-EXACT, for every (row, token), on odd
    shapes: M = 1, R - 1, R + 1, 37 rows; K = one block, several blocks, a K that fits no tile;
    n_x = 1 (decode), 2, 3, 5, 17, 64 activation rows;
  - pack is lossless: unpacking a group gives back the original GGUF bytes, and the zero rows that
    pad the last group give 0.
Weights are random bytes with sane f16 scales (every nibble / bit pattern, Q8_0 -128 included);
activations random Q8_0 / Q8_1 blocks with quants in [-127, 127] (what ggml's quantizers produce).

Run: python -m pytest -q tests/test_gemm.py
"""
import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as T

import llmrt._core as core

PACKED_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL)
VEC_DOT_TYPE = {T.Q4_0: T.Q8_0, T.Q5_0: T.Q8_0, T.Q8_0: T.Q8_0, T.Q4_1: T.Q8_1, T.Q5_1: T.Q8_1, T.IQ4_NL: T.Q8_0}
# byte offsets of the f16 fields (d, and m for the _1 types) in a GGUF block
F16_FIELDS = {T.Q4_0: (0,), T.Q5_0: (0,), T.Q8_0: (0,), T.Q4_1: (0, 2), T.Q5_1: (0, 2), T.IQ4_NL: (0,)}
KS = (32, 96, 416)            # one block, three, thirteen (no tile of 2 / 4 / 8 blocks divides it)
N_XS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64)


def nbytes(t, n):
    be, bb = gguf.GGML_QUANT_SIZES[t]
    return n // be * bb


def random_rows(t, K, M, rng):
    """M rows of random blocks of type t, f16 fields set to scales of random sign and magnitude."""
    be, bb = gguf.GGML_QUANT_SIZES[t]
    b = rng.integers(0, 256, size=(M * K // be, bb), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        d = rng.uniform(1e-3, 1e-1, size=b.shape[0]) * rng.choice([-1, 1], size=b.shape[0])
        b[:, off:off + 2] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
    return b.reshape(M, -1)


def random_act(at, K, n, rng):
    """n activation rows of type at (Q8_0 / Q8_1): quants in [-127, 127], scales of varied size."""
    nb = n * K // 32
    qs = rng.integers(-127, 128, size=(nb, 32)).astype(np.int8)
    d = np.exp(rng.normal(-4, 1.5, size=nb)).astype(np.float16)
    head = [d.reshape(-1, 1).view(np.uint8)]
    if at == T.Q8_1:
        s = (qs.astype(np.float32).sum(axis=1) * d.astype(np.float32)).astype(np.float16)
        head.append(s.reshape(-1, 1).view(np.uint8))
    return np.concatenate(head + [qs.view(np.uint8)], axis=1).reshape(n, -1)


def gemm_all(pw, x):
    """y [n_x, M] from every group of pw, as MUL_MAT's driver assembles it."""
    return np.concatenate([pw.gemm(g, x) for g in range(pw.n_groups)], axis=1)


@pytest.mark.parametrize("K", KS)
@pytest.mark.parametrize("t", PACKED_TYPES, ids=lambda t: t.name)
def test_gemm_matches_vec_dot(isa_level, t, K, rng):
    if core.kernel_names()["gemm"].get(t.name) is None:
        pytest.skip(f"{t.name} has no gemm at {isa_level} (its vec_dot runs on the plain rows)")
    R = core.pack_rows(int(t))
    Mmax, nmax = 37, max(N_XS)
    w = random_rows(t, K, Mmax, rng)
    x = random_act(VEC_DOT_TYPE[t], K, nmax, rng)
    ref = np.array([[core.vec_dot(int(t), w[m], x[j], K) for m in range(Mmax)] for j in range(nmax)],
                   dtype=np.float32)
    for M in sorted({1, R - 1, R + 1, Mmax} - {0}):
        pw = core.pack_weight(w[:M], int(t), K, M)
        assert (pw.R, pw.n_groups, pw.group_bytes % 64) == (R, -(-M // R), 0)
        for n_x in N_XS:
            y = gemm_all(pw, x[:n_x])
            np.testing.assert_array_equal(y.view(np.uint32), ref[:n_x, :M].view(np.uint32),
                                          err_msg=f"{t.name} K={K} M={M} n_x={n_x} {isa_level}")


@pytest.mark.parametrize("t", PACKED_TYPES, ids=lambda t: t.name)
def test_gemm_partial_rows(isa_level, t, rng):
    """n_rows < R writes only the first n_rows outputs of each token; padded rows give 0."""
    if core.kernel_names()["gemm"].get(t.name) is None:
        pytest.skip(f"{t.name} has no gemm at {isa_level}")
    R, K = core.pack_rows(int(t)), 64
    w = random_rows(t, K, R + 1, rng)
    x = random_act(VEC_DOT_TYPE[t], K, 3, rng)
    pw = core.pack_weight(w, int(t), K, R + 1)
    full = pw.gemm(0, x)
    for n_rows in range(1, R + 1):
        np.testing.assert_array_equal(pw.gemm(0, x, n_rows).view(np.uint32), full[:, :n_rows].view(np.uint32))
    last = pw.gemm(1, x, R)                         # row R of w, then R - 1 zero rows
    assert np.all(last[:, 1:] == 0)
    ref = [core.vec_dot(int(t), w[R], x[j], K) for j in range(3)]
    np.testing.assert_array_equal(last[:, 0], np.array(ref, dtype=np.float32))



@pytest.mark.parametrize("t", (T.Q4_0, T.IQ4_NL, T.Q8_0), ids=lambda v: v.name)
def test_repacked_order_decode_rows_past_the_staging(isa_level, t, rng):
    """The avx2 decode GEMV (n_x <= X8_SMALL_NX = 8, IQ4_NL 6: one token, or passes of 2 token pairs,
    an odd last token staged twice) stages a token's 8·Σy and d_y for up to 1024 blocks at once and runs
    longer rows in chunks of that many blocks (at avx512_vnni Q4_0's 2-4 tokens run the same GEMV with
    vpdpbusd sums, and Q8_0's the one-token GEMV staged the same way, q8x_gemm's 2 to 16 tokens in
    chunks of 256 blocks): a row of 1030 blocks (K = 32960) still has vec_dot's bits, for 1 to 8
    tokens. (An odd last block: K = 32, 96 and 416 in the tests above.)"""
    K, R = 32 * 1030, core.pack_rows(int(t))
    M = 2 * R + 1
    w = random_rows(t, K, M, rng)
    x = random_act(T.Q8_0, K, 8, rng)
    ref = np.array([[core.vec_dot(int(t), w[m], x[j], K) for m in range(M)] for j in range(8)],
                   dtype=np.float32)
    pw = core.pack_weight(w, int(t), K, M)
    n_rows = min(M, pw.gemm_groups() * R)          # one call (the generic level: one group)
    for n_x in range(1, 9):
        y = pw.gemm(0, x[:n_x], n_rows)
        np.testing.assert_array_equal(y.view(np.uint32), ref[:n_x, :n_rows].view(np.uint32),
                                      err_msg=f"{t.name} n_x={n_x}")


def assert_calls_of_several_groups(pw, x, ref, R, M, n_xs, what):
    """Calls of gemm_groups() = G groups from group 0, 1 and the last G (n_rows 1, R + 1, 2R + 1, G·R - 1 and
    all real rows, n_x in n_xs) give ref[token, row] bit for bit (zero past the real rows)."""
    G = pw.gemm_groups()
    for g in (0, 1, pw.n_groups - G):
        real = min(G * R, M - g * R)
        for n_rows in sorted({1, R + 1, 2 * R + 1, G * R - 1, real}):
            if n_rows > G * R or g + -(-n_rows // R) > pw.n_groups:
                continue
            for n_x in n_xs:
                y = pw.gemm(g, x[:n_x], n_rows)
                want = np.zeros((n_x, n_rows), np.float32)
                k = min(n_rows, real)
                want[:, :k] = ref[:n_x, g * R:g * R + k]
                np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32),
                                              err_msg=f"{what} g={g} n_rows={n_rows} n_x={n_x}")


@pytest.mark.parametrize("K", KS)
@pytest.mark.parametrize("t", PACKED_TYPES, ids=lambda t: t.name)
def test_gemm_several_groups_per_call(isa_level, t, K, rng):
    """A call over gemm_groups() consecutive groups (gemm.h; the AVX2 level's 8-row prefill tile)
    gives the bits of vec_dot for every row it covers, whatever n_rows (R + 1 .. G·R, the last
    group partly real or zero-padded) and n_x are."""
    if core.kernel_names()["gemm"].get(t.name) is None:
        pytest.skip(f"{t.name} has no gemm at {isa_level}")
    R = core.pack_rows(int(t))
    G = core.pack_weight(random_rows(t, K, R, rng), int(t), K, R).gemm_groups()
    if G < 2:
        pytest.skip(f"{t.name}'s gemm takes one group per call at {isa_level}")
    M, nmax = (G + 2) * R + 1, max(N_XS)            # G + 2 full groups, the last one real row
    w = random_rows(t, K, M, rng)
    x = random_act(VEC_DOT_TYPE[t], K, nmax, rng)
    ref = np.array([[core.vec_dot(int(t), w[m], x[j], K) for m in range(M)] for j in range(nmax)],
                   dtype=np.float32)
    pw = core.pack_weight(w, int(t), K, M)
    assert_calls_of_several_groups(pw, x, ref, R, M, N_XS, f"{t.name} K={K}")
    with pytest.raises(ValueError, match="must be in"):
        pw.gemm(0, x[:1], G * R + 1)
    with pytest.raises(ValueError, match="past the last group"):
        pw.gemm(pw.n_groups - 1, x[:1], R + 1)

@pytest.mark.parametrize("K", KS)
@pytest.mark.parametrize("t", PACKED_TYPES, ids=lambda t: t.name)
def test_pack_round_trip(t, K, rng):
    """Packing is lossless: every group unpacks to the original GGUF bytes (and so dequantizes to
    the original values), at any M."""
    R = core.pack_rows(int(t))
    for M in (1, R - 1, R + 1, 37):
        w = random_rows(t, K, M, rng)
        pw = core.pack_weight(w, int(t), K, M)
        back = np.concatenate([pw.unpack(g) for g in range(pw.n_groups)])
        np.testing.assert_array_equal(back, w)
        np.testing.assert_array_equal(gguf.quants.dequantize(back, t), gguf.quants.dequantize(w, t))


def test_pack_layout_same_at_every_level():
    """The layout is registered by the generic level only, so it is the same whatever the ISA."""
    before = core.isa_current()
    rng = np.random.default_rng(1)
    try:
        packs = {}
        for level in core.ISA_NAMES:
            got = core.set_isa(level)
            for t in PACKED_TYPES:
                w = random_rows(t, 96, 6, np.random.default_rng(int(t)))
                pw = core.pack_weight(w, int(t), 96, 6)
                packs.setdefault(t, []).append((got, core.pack_rows(int(t)), pw.group(0).tobytes()))
        for t, seen in packs.items():
            assert len({(r, b) for _, r, b in seen}) == 1, t.name
    finally:
        core.set_isa(before)
    del rng


def test_pack_errors():
    with pytest.raises(ValueError, match="no packed layout"):
        core.pack_weight(np.zeros(2 * 36, np.uint8), int(T.Q8_1), 64, 1)  # an activation type: none
    with pytest.raises(ValueError, match="multiple of the block size"):
        core.pack_weight(np.zeros(34, np.uint8), int(T.Q8_0), 48, 1)
    with pytest.raises(ValueError, match="bytes"):
        core.pack_weight(np.zeros(33, np.uint8), int(T.Q8_0), 32, 1)
    pw = core.pack_weight(np.zeros(34, np.uint8), int(T.Q8_0), 32, 1)
    with pytest.raises(IndexError):
        pw.gemm(1, np.zeros((1, 34), np.uint8))
    with pytest.raises(ValueError, match="n_x"):
        pw.gemm(0, np.zeros((1, 36), np.uint8))


@pytest.mark.parametrize("t", (T.Q4_0, T.IQ4_NL), ids=lambda v: v.name)
@pytest.mark.parametrize("K", (2048, 4160))   # one transposed chunk of 64 blocks; 64 + 64 + 2
def test_repacked_order_long_rows(isa_level, t, K, rng):
    """The avx2 Q4_0 / IQ4_NL prefill (gemm_avx2.c's gemm_x8_avx2) transposes rows of up to 64
    blocks once per call and longer ones chunk by chunk once per 64 tokens: every output still has
    vec_dot's bits, for token counts below, at and past 64 and every n_rows of a call."""
    R = core.pack_rows(int(t))
    G = core.pack_weight(random_rows(t, K, R, rng), int(t), K, R).gemm_groups()
    M = (G + 2) * R + 1                             # G + 2 full groups, the last one real row
    w = random_rows(t, K, M, rng)
    x = random_act(T.Q8_0, K, 70, rng)
    ref = np.array([[core.vec_dot(int(t), w[m], x[j], K) for m in range(M)] for j in range(70)],
                   dtype=np.float32)
    pw = core.pack_weight(w, int(t), K, M)
    assert_calls_of_several_groups(pw, x, ref, R, M, (1, 5, 64, 70), f"{core.kernel_names()['gemm'][t.name]} K={K}")


def _mul_mat_graph(w, t, K, M, n, threads, pack):
    """One MUL_MAT node y = W x (x: rows of a fixed random F32 table, quantized by the graph)."""
    g = core.Graph(n, threads, pack=pack)
    emb = np.random.default_rng(1).standard_normal((64, K)).astype(np.float32)
    x = g.get_rows(g.weight(emb, int(T.F32), (K, 64)), g.input_tokens())
    g.set_output(g.mul_mat(g.weight(w, int(t), (K, M)), x))
    g.single_thread_work = 0   # every node on every thread: the decode split runs
    g.build()
    return g


@pytest.mark.parametrize("t", (T.Q4_1, T.Q4_0, T.Q8_0), ids=lambda v: v.name)
@pytest.mark.parametrize("M", (12, 52, 203, 1037))
def test_decode_split_same_bits_for_any_thread_count(isa_level, t, M, rng):
    """MUL_MAT of up to 4 tokens splits the packed groups into one contiguous range per thread and a
    claimed tail (csrc/ops/mul_mat.c), in units of gemm_align groups where the level's gemm is a tile
    of several (avx512_vnni's Q4_1 and Q8_0: 4): with 2, 3 and 5 threads every output keeps the bits of the
    plain rows' vec_dot (pack=False), whatever M leaves for the last call (a lone group, a partial
    unit, rows past the last group)."""
    K = 96
    w = random_rows(t, K, M, rng)
    for n in (1, 3, 4):
        tok = rng.integers(0, 64, n).astype(np.int32)
        pos = np.arange(n, dtype=np.int32)
        want = np.array(_mul_mat_graph(w, t, K, M, n, 1, False).run(tok, pos), copy=True)
        assert np.isfinite(want).all() and want.shape[-1] == M
        for threads in (2, 3, 5):
            got = _mul_mat_graph(w, t, K, M, n, threads, True).run(tok, pos)
            np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32),
                                          err_msg=f"{t.name} M={M} n={n} threads={threads} ({isa_level})")
