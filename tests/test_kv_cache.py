"""The streaming KV cache at the cache level (csrc/kv_cache.c, csrc/ops/rope_shift.c): eviction
after the sinks, shift-RoPE from the pre-RoPE master keys, and no drift after 1000 shifts.

The graph used here stores K = RoPE(E_k[token], pos) and V = E_v[token]: keys and values depend on
the token and its position only, so after any eviction the shifted cache must hold EXACTLY what a
fresh run of the kept tokens at their new positions stores (bit-identical, f16 and f32 caches),
and its keys must match a float64 numpy RoPE of the master keys to the rounding of the cache type.

Run: python -m pytest -q tests/test_kv_cache.py
"""
import numpy as np
import pytest

import llmrt._core as core

# float64 numpy RoPE vs the cache's f32 keys, positions < 64: the angle p * theta_i is built by
# repeated f32 multiplication (as ggml does), ~hd/2 roundings of 2^-24 relative -> < 64 * 8 *
# 6e-8 = 3e-5 rad on O(1) values; observed ~4e-6.
ROPE_F32_ATOL = 5e-5
# f16 cache: plus one f16 rounding of values |x| < 4 (half an ulp: 2^-11 * 4 = 2e-3).
ROPE_F16_ATOL = 2e-3 + ROPE_F32_ATOL
# The same cells attended in another cell order (a shifted cache's new tokens fill holes): the
# softmax sum and P.V reassociate, ~n_cells (< 32) roundings of 2^-24 relative on outputs of two
# layers' weighted means of |v| <= ~4: 32 * 6e-8 * 8 = 1.5e-5 (f32 cache). With an f16 cache the
# probabilities are rounded to f16, and one that moved by that much may round to the other
# neighbour (2^-11 relative): up to 2 layers * |v| 4 * 2^-11 = 4e-3.
SUM_ORDER_ATOL = {"f32": 2e-5, "f16": 4e-3}

VOCAB, HD, NKV, NH = 19, 16, 2, 4


def _ropes():
    """(id, rope kwargs, freq_factors or None): both layouts, partial rotary, YaRN, factors."""
    ff = (1.0 + np.arange(HD // 4, dtype=np.float32) * 0.37).astype(np.float32)
    return [
        ("normal", dict(n_rot=HD, mode=0, freq_base=10000.0), None),
        ("neox", dict(n_rot=HD, mode=2, freq_base=1e6), None),
        ("partial-normal", dict(n_rot=HD // 2, mode=0, freq_base=10000.0), None),
        ("partial-neox", dict(n_rot=HD // 2, mode=2, freq_base=500.0), None),
        ("yarn", dict(n_rot=HD, mode=0, freq_base=10000.0, freq_scale=0.25, ext_factor=1.0,
                      attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=16), None),
        ("freq-factors", dict(n_rot=HD // 2, mode=2, freq_base=10000.0), ff),
    ]


ROPES = _ropes()


class KGraph:
    """Two layers: layer 0 uses rope `kw`, layer 1 the same layout with another base (a
    per-layer base, as Gemma 3's local / global layers)."""

    def __init__(self, rng, kw, ff, n_threads=1):
        self.kw, self.ff = kw, ff
        self.ek = [(rng.standard_normal((VOCAB, NKV * HD))).astype(np.float32) for _ in range(2)]
        self.ev = [(rng.standard_normal((VOCAB, NKV * HD))).astype(np.float32) for _ in range(2)]
        self.graphs = {}
        self.n_threads = n_threads

    def layer_kw(self, il):
        kw = dict(self.kw)
        if il == 1:
            kw["freq_base"] = kw["freq_base"] * 7.0
        return kw

    def graph(self, n):
        g = self.graphs.get(n)
        if g is None:
            g = core.Graph(n, self.n_threads)
            tok, pos = g.input_tokens(), g.input_positions()
            ffw = g.weight(self.ff, 0, (len(self.ff),)) if self.ff is not None else None
            outs = None
            for il in range(2):
                k = g.reshape(g.get_rows(g.weight(self.ek[il], 0, (NKV * HD, VOCAB)), tok), (HD, NKV))
                v = g.reshape(g.get_rows(g.weight(self.ev[il], 0, (NKV * HD, VOCAB)), tok), (HD, NKV))
                kw = self.layer_kw(il)
                k = g.rope(k, pos, freq_factors=ffw, **kw)
                q = g.reshape(g.get_rows(g.weight(self.ek[il], 0, (NKV * HD, VOCAB)), tok), (HD, NKV))
                a = g.attention(q, k, v, None, il, 0.25)
                outs = a if outs is None else g.add(outs, a)
            g.set_output(outs)
            g.build()
            self.graphs[n] = g
        return g

    def cache(self, n_ctx, dtype, shift=True):
        c = core.KVCache(2, n_ctx, NKV, HD, HD, dtype=dtype)
        if shift:
            c.enable_shift()
        return c

    def run(self, cache, tokens, first_pos):
        tokens = np.asarray(tokens, dtype=np.int32)
        pos = np.arange(first_pos, first_pos + len(tokens), dtype=np.int32)
        return self.graph(len(tokens)).run(tokens, pos, cache=cache)

    def rope_ref(self, il, x, pos):
        """float64 RoPE of x [n, NKV, HD] at positions pos [n] (ggml_rope_ext's formula)."""
        kw = self.layer_kw(il)
        n_rot, mode, base = kw["n_rot"], kw["mode"], kw["freq_base"]
        scale, ext = kw.get("freq_scale", 1.0), kw.get("ext_factor", 0.0)
        i = np.arange(n_rot // 2)
        theta = np.asarray(pos, np.float64)[:, None] * base ** (-2.0 * i / n_rot)
        if self.ff is not None:
            theta = theta / self.ff[: n_rot // 2].astype(np.float64)
        mscale = 1.0
        th = scale * theta
        if ext:
            def corr(nr):
                return n_rot * np.log(kw["n_ctx_orig"] / (nr * 2 * np.pi)) / (2 * np.log(base))
            lo = max(0.0, np.floor(corr(kw["beta_fast"])))
            hi = min(n_rot - 1.0, np.ceil(corr(kw["beta_slow"])))
            ramp = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0, 1)
            mix = ramp * ext
            th = scale * theta * (1 - mix) + theta * mix
            mscale *= 1.0 + 0.1 * np.log(1.0 / scale)
        c, s = np.cos(th)[:, None, :] * mscale, np.sin(th)[:, None, :] * mscale
        a, b = (i, i + n_rot // 2) if mode == 2 else (2 * i, 2 * i + 1)
        y = x.astype(np.float64).copy()
        y[..., a] = x[..., a] * c - x[..., b] * s
        y[..., b] = x[..., a] * s + x[..., b] * c
        return y


def _assert_same_cells(a, b):
    assert a.n_used == b.n_used
    np.testing.assert_array_equal(a.positions(), b.positions())
    for il in range(2):
        np.testing.assert_array_equal(a.k(il), b.k(il))
        np.testing.assert_array_equal(a.v(il), b.v(il))
        np.testing.assert_array_equal(a.k_pre(il), b.k_pre(il))


@pytest.mark.parametrize("dtype", ["f16", "f32"])
@pytest.mark.parametrize("rid,kw,ff", ROPES, ids=[r[0] for r in ROPES])
def test_shift_equals_fresh_run(rng, rid, kw, ff, dtype):
    kg = KGraph(rng, kw, ff)
    toks = rng.integers(0, VOCAB, size=20).tolist()
    c = kg.cache(32, dtype)
    kg.run(c, toks, 0)
    np.testing.assert_array_equal(c.k_pre(0).reshape(20, -1), kg.ek[0][toks])   # master = pre-RoPE
    assert c.rope_params(1)["freq_base"] == np.float32(kw["freq_base"] * 7.0)
    c.shift(3, 5)
    kept = toks[:3] + toks[8:]
    assert c.n_used == 15
    # the sinks turned forward by 5 instead of the 12 later keys back by 5: positions are the
    # contiguous ones of llama.cpp's shift plus pos_offset (same differences, same attention)
    assert c.pos_offset == 5
    np.testing.assert_array_equal(c.positions(), np.arange(15) + 5)
    assert sorted(c.order().tolist()) == [0, 1, 2] + list(range(8, 20))   # no cell moved
    fresh = kg.cache(32, dtype)
    kg.run(fresh, kept, 5)
    _assert_same_cells(c, fresh)
    # and both are RoPE of the master at the new positions, per layer base
    tol = ROPE_F16_ATOL if dtype == "f16" else ROPE_F32_ATOL
    for il in range(2):
        ref = kg.rope_ref(il, c.k_pre(il), np.arange(15) + 5)
        np.testing.assert_allclose(c.k(il).astype(np.float64), ref, rtol=0, atol=tol)
    # the next run attends over the shifted cache as over the fresh one: the same cells in
    # another order (the new tokens fill the holes), so the same sums up to f32 reassociation
    # (a few ulp of the outputs, |out| <= ~2 here); once compacted into token order, bit for bit
    d = kg.cache(32, dtype)
    d.copy_from(c)
    y = kg.run(c, [1, 2], 20)
    assert c.order().tolist()[-2:] == [3, 4]
    y_fresh = kg.run(fresh, [1, 2], 20)
    np.testing.assert_allclose(y, y_fresh, rtol=0, atol=SUM_ORDER_ATOL[dtype])
    d.compact()
    np.testing.assert_array_equal(d.order(), np.arange(15))
    np.testing.assert_array_equal(kg.run(d, [1, 2], 20), y_fresh)


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_no_drift_after_1000_shifts(rng, dtype):
    """1000 evictions of one cell in a cache of 8 (3 sinks): every moved key has been
    re-rotated hundreds of times, yet the cache equals a fresh run of the kept tokens."""
    kg = KGraph(rng, dict(n_rot=HD, mode=2, freq_base=10000.0), None)
    toks = rng.integers(0, VOCAB, size=1008).tolist()
    c = kg.cache(8, dtype)
    kg.run(c, toks[:8], 0)
    kept = list(toks[:8])
    offsets = set()
    for t in toks[8:]:
        c.shift(3, 1)
        del kept[3]
        offsets.add(c.pos_offset)
        kg.run(c, [t], 7 + c.pos_offset)
        kept.append(t)
    assert offsets == set(range(8))      # pos_offset went round: 1..7, then everything re-roped
    fresh = kg.cache(8, dtype)
    kg.run(fresh, kept, c.pos_offset)
    _assert_same_cells(c, fresh)


def test_rerope_once_is_a_fixed_point(rng):
    kg = KGraph(rng, dict(n_rot=HD // 2, mode=0, freq_base=10000.0), None)
    c = kg.cache(16, "f16")
    kg.run(c, rng.integers(0, VOCAB, size=12), 0)
    c.shift(2, 4)
    d = kg.cache(16, "f16")
    d.copy_from(c)
    d.rerope()             # every cell, sinks included, once from the master
    _assert_same_cells(c, d)


def test_evict_moves_cells_and_positions(rng):
    kg = KGraph(rng, dict(n_rot=HD, mode=0, freq_base=10000.0), None)
    c = kg.cache(16, "f32")
    toks = rng.integers(0, VOCAB, size=10).tolist()
    kg.run(c, toks, 0)
    k0, v0 = c.k(0), c.v(0)
    c.evict(2, 3)
    assert c.n_used == 7
    np.testing.assert_array_equal(c.positions(), np.arange(7))
    np.testing.assert_array_equal(c.v(0), np.concatenate([v0[:2], v0[5:]]))
    np.testing.assert_array_equal(c.k(0), np.concatenate([k0[:2], k0[5:]]))   # not re-rotated


def test_cache_without_shift_has_no_master_and_costs_nothing_more(rng):
    kg = KGraph(rng, dict(n_rot=HD, mode=0, freq_base=10000.0), None)
    plain, shifting = kg.cache(16, "f16", shift=False), kg.cache(16, "f16")
    assert not plain.has_shift and shifting.has_shift
    kv_bytes = 2 * 16 * 2 * NKV * HD * 2            # layers * cells * (K + V) * kv_dim * f16
    # + per cell: position, token order (int32), live and compaction marks (u8); + one f32 key
    # cell of compaction buffer
    assert plain.nbytes == kv_bytes + 16 * (4 + 4 + 1 + 1) + NKV * HD * 4
    assert shifting.nbytes >= plain.nbytes + 2 * 16 * NKV * HD * 4   # + f32 master keys
    kg.run(plain, [1, 2, 3], 0)                      # runs fine without a master copy
    plain.evict(1, 1)
    with pytest.raises(ValueError, match="enable_shift"):
        plain.shift(1, 1)
    with pytest.raises(ValueError, match="enable_shift"):
        plain.rerope()


def test_validation(rng):
    kg = KGraph(rng, dict(n_rot=HD, mode=0, freq_base=10000.0), None)
    c = kg.cache(8, "f32")
    kg.run(c, [1, 2, 3, 4], 0)
    with pytest.raises(ValueError, match="n_keep"):
        c.shift(3, 2)                       # 3 + 2 > n_used 4
    with pytest.raises(ValueError, match="n_discard"):
        c.evict(0, 0)
    with pytest.raises(ValueError, match="n_keep"):
        c.evict(-1, 1)
    with pytest.raises(ValueError, match="empty"):
        c2 = kg.cache(8, "f32", shift=False)
        kg.run(c2, [1], 0)
        c2.enable_shift()
    with pytest.raises(ValueError, match="rerope"):
        c.rerope(2, 9)
    with pytest.raises(ValueError, match="copy_from"):
        kg.cache(8, "f16").copy_from(c)
    c.prepare(1)
    with pytest.raises(ValueError, match="reserved"):
        c.shift(1, 1)


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_state_image_keeps_cells_cell_major(rng, dtype):
    """The cache is head-major in memory ([head][cell][hd], kv_cache.h) while its state image
    keeps K and V cell-major ([cell][head][hd]), the layout images had before: each layer's K
    and V blocks of the image are the cells' bytes in that order (KVCache.k / v, token order ==
    cell order here), and the image loads back into an equal cache."""
    kg = KGraph(rng, dict(n_rot=HD, mode=2, freq_base=10000.0), None)
    c = kg.cache(16, dtype, shift=False)
    n = 11
    kg.run(c, rng.integers(0, VOCAB, size=n).tolist(), 0)
    img = c.state()
    pad4 = lambda x: (x + 3) // 4 * 4                          # noqa: E731
    at = 4 * 8 + 2 * 12 + n * 4 + n * 4 + pad4(n)              # header, shapes, pos, order, live
    cell = NKV * HD * (2 if dtype == "f16" else 4)
    for il in range(2):
        for arr in (c.k(il), c.v(il)):
            assert arr.shape == (n, NKV, HD)
            assert img[at:at + n * cell] == arr.tobytes()
            at += pad4(n * cell)
    assert at == len(img)
    d = kg.cache(16, dtype, shift=False)
    d.load_state(img)
    for il in range(2):
        np.testing.assert_array_equal(d.k(il), c.k(il))
        np.testing.assert_array_equal(d.v(il), c.v(il))
    assert d.state() == img


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_holes_fill_then_compaction(rng, dtype):
    """Evicted cells become holes: the next run goes into the first hole that holds it, else
    after the highest live cell, else the cache compacts into token order first. At every step
    the cache holds the kept tokens' cells exactly as a fresh run of them (token order), and
    truncate frees the dropped tokens' cells for reuse."""
    kg = KGraph(rng, dict(n_rot=HD, mode=2, freq_base=10000.0), None)
    toks = rng.integers(0, VOCAB, size=40).tolist()
    c = kg.cache(10, dtype)
    kept = toks[:10]
    kg.run(c, kept, 0)
    c.shift(2, 3)                                    # tokens 2..4 go: cells 2, 3, 4 free
    del kept[2:5]
    assert c.n_cells == 10 and c.prepare(3) == 2     # the hole holds the 3 new tokens
    c.truncate(c.n_used)                             # (drop the reservation)
    kg.run(c, toks[10:13], 7 + c.pos_offset)
    kept += toks[10:13]
    assert c.order().tolist() == [0, 1, 5, 6, 7, 8, 9, 2, 3, 4]
    c.shift(1, 2)                                    # tokens 1, 2 -> cells 1 and 5: two 1-cell holes
    del kept[1:3]
    assert c.prepare(2) == 8                         # no hole of 2, no room above: compacted
    np.testing.assert_array_equal(c.order(), np.arange(8))
    c.truncate(c.n_used)
    kg.run(c, toks[13:15], 8 + c.pos_offset)
    kept += toks[13:15]
    fresh = kg.cache(10, dtype)
    kg.run(fresh, kept, c.pos_offset)
    _assert_same_cells(c, fresh)
    np.testing.assert_array_equal(c.order(), np.arange(10))
    c.truncate(6)                                    # the last 4 tokens' cells are free again
    assert c.n_used == 6 and c.n_cells == 6 and c.prepare(4) == 6
