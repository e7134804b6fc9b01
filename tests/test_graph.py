"""The graph runtime as a whole (csrc/graph.c, csrc/threadpool.c, csrc/kv_cache.c): a tiny
two-layer transformer built from the ops, checked against numpy; prefill + decodes through the
KV cache vs one big prefill; the same graph reused with different n vs fresh graphs; 1 vs 2
threads; arena reuse; the KV cache's bookkeeping; and the validation errors.

Every op computes each output element in one fixed order, whatever the thread count, the batch
size or the arena layout, so several checks here are exact (assert_array_equal).

Run: python -m pytest -q tests/test_graph.py
"""
import os
import select
import signal
import threading

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import llmrt._core as core

# ---- tolerances --------------------------------------------------------------------------------
# The tiny model in f32 (weights, cache) vs a float64 numpy model, positions < 10: RoPE angles
# drift by < p * (hd/2) * 2^-24 = 2e-6 rad (f32 theta by repeated multiplication, see
# test_ops.py), plus some hundred f32 roundings (6e-8 each) on O(1) values through 2 layers;
# logits are O(1). Observed: 1.5e-6.
MODEL_F32_ATOL = 2e-5


# ---- a tiny transformer -------------------------------------------------------------------------

class Tiny:
    """Llama-like: 2 layers, GQA (4 heads, 2 kv heads), RoPE (layer 0 normal, layer 1 NeoX with a
    sliding window of 4), SwiGLU, separate output matrix. Odd sizes for F32 weights."""
    vocab, d, nh, nkv, hd, ff, n_layer = 23, 24, 4, 2, 6, 20, 2
    eps = 1e-5
    swa = (0, 4)
    rope_mode = (0, 2)

    def __init__(self, rng, wtype=T.F32):
        def r(*shape, s=0.3):
            return (rng.standard_normal(shape) * s).astype(np.float32)

        self.wtype = wtype
        if wtype != T.F32:  # the K of every matrix must be a multiple of the block size, 32
            self.d, self.hd, self.ff = 32, 8, 64
        self.emb = r(self.vocab, self.d, s=1.0)
        self.out = r(self.vocab, self.d)
        self.norm_out = 1 + r(self.d, s=0.1)
        self.layers = []
        for _ in range(self.n_layer):
            self.layers.append(dict(
                n1=1 + r(self.d, s=0.1), n2=1 + r(self.d, s=0.1),
                wq=r(self.nh * self.hd, self.d), wk=r(self.nkv * self.hd, self.d),
                wv=r(self.nkv * self.hd, self.d), wo=r(self.d, self.nh * self.hd),
                wg=r(self.ff, self.d), wu=r(self.ff, self.d), wd=r(self.d, self.ff)))

    def _w(self, g, a):
        """Matrices in self.wtype (quantized with gguf when not F32), vectors in F32."""
        ne = tuple(reversed(a.shape))
        if a.ndim == 2 and self.wtype != T.F32:
            return g.weight(np.ascontiguousarray(gguf.quants.quantize(a, self.wtype)), int(self.wtype), ne)
        return g.weight(a, 0, ne)

    def build(self, g, cache=None, last_only=False):
        tok, pos = g.input_tokens(), g.input_positions()
        x = g.get_rows(self._w(g, self.emb), tok)
        for il, L in enumerate(self.layers):
            h = g.mul(g.rms_norm(x, self.eps), self._w(g, L["n1"]))
            q = g.reshape(g.mul_mat(self._w(g, L["wq"]), h), (self.hd, self.nh))
            k = g.reshape(g.mul_mat(self._w(g, L["wk"]), h), (self.hd, self.nkv))
            v = g.reshape(g.mul_mat(self._w(g, L["wv"]), h), (self.hd, self.nkv))
            q = g.rope(q, pos, self.hd, self.rope_mode[il], 10000.0)
            k = g.rope(k, pos, self.hd, self.rope_mode[il], 10000.0)
            a = g.attention(q, k, v, cache, il, 1.0 / np.sqrt(self.hd), n_swa=self.swa[il])
            x = g.add(x, g.mul_mat(self._w(g, L["wo"]), a))
            h = g.mul(g.rms_norm(x, self.eps), self._w(g, L["n2"]))
            f = g.glu(g.mul_mat(self._w(g, L["wg"]), h), g.mul_mat(self._w(g, L["wu"]), h), "silu")
            x = g.add(x, g.mul_mat(self._w(g, L["wd"]), f))
        if last_only:
            x = g.get_rows_f32(x, g.input_out_rows(1))
        x = g.mul(g.rms_norm(x, self.eps), self._w(g, self.norm_out))
        g.set_output(g.mul_mat(self._w(g, self.out), x))
        g.build()
        return g

    def graph(self, max_tokens, n_threads=1, last_only=False, share_all=False):
        g = core.Graph(max_tokens, n_threads)
        if share_all:  # the tiny model's nodes are all "small": force them onto every thread
            g.single_thread_work = 0
        return self.build(g, last_only=last_only)

    def cache(self, n_ctx=32, dtype="f32"):
        return core.KVCache(self.n_layer, n_ctx, self.nkv, self.hd, self.hd, dtype=dtype)

    # numpy float64 reference of the whole model, from an empty cache
    def reference(self, tokens, positions):
        def rms(x, w):
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

        def rope(x, mode):  # x [n, heads, hd]
            i = np.arange(self.hd // 2)
            ang = positions[:, None, None] * 10000.0 ** (-2.0 * i / self.hd)
            c, s = np.cos(ang), np.sin(ang)
            a, b = (i, i + self.hd // 2) if mode == 2 else (2 * i, 2 * i + 1)
            y = x.copy()
            y[..., a] = x[..., a] * c - x[..., b] * s
            y[..., b] = x[..., a] * s + x[..., b] * c
            return y

        n = len(tokens)
        positions = np.asarray(positions, dtype=np.float64)
        x = self.emb[tokens].astype(np.float64)
        for il, L in enumerate(self.layers):
            h = rms(x, L["n1"])
            q = rope((h @ L["wq"].T).reshape(n, self.nh, self.hd), self.rope_mode[il])
            k = rope((h @ L["wk"].T).reshape(n, self.nkv, self.hd), self.rope_mode[il])
            v = (h @ L["wv"].T).reshape(n, self.nkv, self.hd)
            a = np.zeros((n, self.nh, self.hd))
            for i in range(n):
                ok = positions <= positions[i]
                if self.swa[il]:
                    ok &= positions[i] - positions < self.swa[il]
                for hh in range(self.nh):
                    kh = hh // (self.nh // self.nkv)
                    s = k[ok, kh] @ q[i, hh] / np.sqrt(self.hd)
                    p = np.exp(s - s.max())
                    a[i, hh] = p @ v[ok, kh] / p.sum()
            x = x + a.reshape(n, -1) @ L["wo"].T
            h = rms(x, L["n2"])
            gt = h @ L["wg"].T
            x = x + (gt / (1 + np.exp(-gt)) * (h @ L["wu"].T)) @ L["wd"].T
        return rms(x, self.norm_out) @ self.out.T


@pytest.fixture
def tiny(rng):
    return Tiny(rng)


def run(g, tokens, positions, cache, out_rows=None):
    return g.run(np.asarray(tokens, np.int32), np.asarray(positions, np.int32), out_rows, cache=cache)


def test_tiny_model_matches_numpy(rng, tiny):
    toks = rng.integers(0, tiny.vocab, 9)
    pos = np.arange(9)
    y = run(tiny.graph(9), toks, pos, tiny.cache())
    assert y.shape == (9, tiny.vocab)
    np.testing.assert_allclose(y, tiny.reference(toks, pos), atol=MODEL_F32_ATOL)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("wtype", [T.F32, T.Q8_0], ids=["F32", "Q8_0"])
def test_prefill_then_decode_equals_one_prefill(rng, dtype, wtype):
    """Prefill 5 tokens, then decode 6 one at a time through the cache (crossing the sliding
    window): the logits equal those of one 11-token prefill, bit for bit."""
    m = Tiny(rng, wtype)
    toks = rng.integers(0, m.vocab, 11)
    full = run(m.graph(11), toks, np.arange(11), m.cache(dtype=dtype))

    cache = m.cache(dtype=dtype)
    pre = m.graph(8, last_only=False)
    dec = m.graph(1, last_only=True)
    got = [run(pre, toks[:5], np.arange(5), cache)]
    for i in range(5, 11):
        got.append(run(dec, toks[i:i + 1], [i], cache, out_rows=[0]))
    assert cache.n_used == 11
    np.testing.assert_array_equal(np.concatenate(got), full)


def test_last_row_output(rng, tiny):
    toks = rng.integers(0, tiny.vocab, 6)
    full = run(tiny.graph(6), toks, np.arange(6), tiny.cache())
    g = tiny.graph(6, last_only=True)
    y = run(g, toks, np.arange(6), tiny.cache(), out_rows=[5])
    assert y.shape == (1, tiny.vocab)
    np.testing.assert_array_equal(y[0], full[5])
    # out_rows=None keeps every row (allowed while n <= max_out = 1)
    y1 = run(g, toks[:1], [0], tiny.cache())
    np.testing.assert_array_equal(y1[0], full[0])


def test_graph_reuse_has_no_state_leaks(rng, tiny):
    """One graph run with n = 7, 2, 8, 1, 7 (each from a fresh cache) equals fresh graphs."""
    g = tiny.graph(8)
    for n in (7, 2, 8, 1, 7):
        toks = rng.integers(0, tiny.vocab, n)
        pos = np.arange(n) + 3
        y = run(g, toks, pos, tiny.cache())
        fresh = run(tiny.graph(n), toks, pos, tiny.cache())
        np.testing.assert_array_equal(y, fresh)


@pytest.mark.parametrize("n", [7, 1])
def test_threads_agree(rng, tiny, n):
    toks = rng.integers(0, tiny.vocab, n)
    want = run(tiny.graph(n, n_threads=1), toks, np.arange(n), tiny.cache(dtype="f16"))
    for n_threads, share_all in ((2, False), (2, True), (3, True)):
        g = tiny.graph(n, n_threads=n_threads, share_all=share_all)
        for _ in range(3):  # chunk claiming differs from run to run; the result must not
            y = run(g, toks, np.arange(n), tiny.cache(dtype="f16"))
            np.testing.assert_array_equal(y, want)


def test_barrier_plan(rng, tiny):
    """Small nodes run on thread 0 without barriers between them; sharing everything needs
    more barriers; treating everything as small leaves only those around attention."""
    toks = rng.integers(0, tiny.vocab, 1)
    counts = {}
    for work in (0, 32768, 2**62):
        g = tiny.graph(1, n_threads=2)
        g.single_thread_work = work
        run(g, toks, [0], tiny.cache())
        counts[work] = g.n_barriers
        assert 0 < g.n_barriers < g.n_nodes
    assert counts[0] > counts[32768] >= counts[2**62]
    assert counts[2**62] == 2 * tiny.n_layer  # before each attention and after it


def test_concurrent_runs_from_python_threads(rng, tiny):
    """Two graphs sharing one pool, run from two Python threads at once (the GIL is released):
    runs are serialized and both results are right."""
    toks = rng.integers(0, tiny.vocab, 6)
    want = run(tiny.graph(6), toks, np.arange(6), tiny.cache())
    graphs = [tiny.graph(6, n_threads=2, share_all=True) for _ in range(2)]
    results = [[], []]

    def work(i):
        for _ in range(10):
            results[i].append(run(graphs[i], toks, np.arange(6), tiny.cache()))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for r in results[0] + results[1]:
        np.testing.assert_array_equal(r, want)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_run_in_forked_child(rng, tiny):
    """A child process has no pool workers: its runs fall back to one thread, same result."""
    toks = rng.integers(0, tiny.vocab, 5)
    g = tiny.graph(5, n_threads=2, share_all=True)
    want = run(g, toks, np.arange(5), tiny.cache())
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        ok = 0
        try:
            ok = int(np.array_equal(run(g, toks, np.arange(5), tiny.cache()), want))
        finally:
            os.write(wfd, bytes([ok]))
            os._exit(0)
    os.close(wfd)
    ready, _, _ = select.select([rfd], [], [], 120)
    if not ready:  # a run waiting for workers that do not exist in the child
        os.kill(pid, signal.SIGKILL)
    got = os.read(rfd, 1) if ready else b""
    os.close(rfd)
    os.waitpid(pid, 0)
    assert got == b"\x01", "the forked child's run hung or gave a different result"


def test_reevaluation_after_truncate(rng, tiny):
    toks = rng.integers(0, tiny.vocab, 8)
    cache = tiny.cache()
    g = tiny.graph(8)
    first = run(g, toks, np.arange(8), cache)
    cache.truncate(5)
    assert cache.n_used == 5
    np.testing.assert_array_equal(cache.positions(), np.arange(5))
    again = run(g, toks[5:], np.arange(5, 8), cache)
    np.testing.assert_array_equal(again, first[5:])


def test_attention_uses_cell_positions_not_indices(rng):
    """Cells hold positions 10, 11, 12, then a decode at position 20; and a batch whose positions
    are out of order: the causal mask follows the stored positions."""
    nh, hd = 2, 4
    q = rng.standard_normal((3, nh, hd)).astype(np.float32)
    k = rng.standard_normal((3, nh, hd)).astype(np.float32)
    v = rng.standard_normal((3, nh, hd)).astype(np.float32)

    def graph(n):
        g = core.Graph(n, 1)
        tok = g.input_tokens()
        ts = []
        for a in (q, k, v):
            w = g.weight(np.ascontiguousarray(a[:n].reshape(n, -1)), 0, (nh * hd, n))
            ts.append(g.reshape(g.get_rows(w, tok), (hd, nh)))
        g.set_output(g.attention(*ts, None, 0, 0.5))
        g.build()
        return g

    cache = core.KVCache(1, 8, nh, hd, hd, dtype="f32")
    pos = np.array([12, 10, 11], dtype=np.int32)
    y = graph(3).run(np.arange(3), pos, cache=cache)
    np.testing.assert_array_equal(cache.positions(), pos)
    for i in range(3):
        ok = pos <= pos[i]
        for h in range(nh):
            s = k[ok, h] @ q[i, h] * 0.5
            p = np.exp(s - s.max())
            np.testing.assert_allclose(y[i, h * hd:(h + 1) * hd], p @ v[ok, h] / p.sum(), atol=1e-6)


def test_arena_reuses_memory_in_a_deep_chain(rng):
    n, d, depth = 4, 64, 60
    emb = rng.standard_normal((n, d)).astype(np.float32)
    b = core.Graph(n, 1)
    x0 = x = b.get_rows(b.weight(emb, 0, (d, n)), b.input_tokens())
    ref = emb.astype(np.float64)
    for i in range(depth):
        x = b.silu(x) if i % 2 else b.scale(x, 0.9)
        ref = ref / (1 + np.exp(-ref)) if i % 2 else ref * np.float32(0.9)
    b.set_output(b.add(x, x0))  # x0 stays alive through the whole chain
    b.build()
    one = d * n * 4
    assert b.tensor_bytes >= (depth + 2) * one
    assert b.arena_bytes <= 3 * one  # x0, the previous and the current tensor
    for _ in range(2):  # the same plan twice
        np.testing.assert_allclose(b.run(np.arange(n), np.arange(n)), ref + emb, rtol=1e-5, atol=1e-6)


def test_arena_smaller_than_sum_for_the_tiny_model(tiny):
    g = tiny.graph(16)
    assert 0 < g.arena_bytes < g.tensor_bytes / 4
    assert g.n_nodes > 30


def test_output_shape_3d(rng):
    data = rng.standard_normal((3, 12)).astype(np.float32)
    g = core.Graph(3, 1)
    x = g.reshape(g.get_rows(g.weight(data, 0, (12, 3)), g.input_tokens()), (4, 3))
    g.set_output(g.scale(x, 2.0))
    g.build()
    y = g.run([0, 1, 2], [0, 1, 2])
    assert y.shape == (3, 3, 4)  # [n, ne1, ne0]
    np.testing.assert_array_equal(y, 2 * data.reshape(3, 3, 4))


# ---- KV cache ---------------------------------------------------------------------------------

def test_kv_cache_bookkeeping():
    c = core.KVCache(3, 10, [1, 2, 1], [4, 8, 4], [4, 8, 2], dtype="f16")
    assert (c.n_layer, c.n_ctx, c.n_used, c.n_pending) == (3, 10, 0, 0)
    assert c.layer_shape(1) == (2, 8, 8) and c.layer_shape(2) == (1, 4, 2)
    assert c.prepare(6) == 0 and c.n_pending == 6
    with pytest.raises(ValueError, match="do not fit"):
        c.prepare(11)
    c.truncate(0)
    assert c.n_pending == 0
    c.clear()
    assert c.positions().shape == (0,) and c.k(0).shape == (0, 1, 4)
    with pytest.raises(ValueError, match="n_head_kv has 2 entries"):
        core.KVCache(3, 10, [1, 2], 4, 4)
    with pytest.raises(ValueError, match="dtype"):
        core.KVCache(1, 10, 1, 4, 4, dtype="q8_0")
    with pytest.raises(ValueError, match="truncate"):
        c.truncate(1)


def test_cache_full_raises(rng, tiny):
    cache = tiny.cache(n_ctx=6)
    g = tiny.graph(4)
    run(g, [1, 2, 3, 4], np.arange(4), cache)
    with pytest.raises(ValueError, match="do not fit"):
        run(g, [1, 2, 3], np.arange(4, 7), cache)
    assert cache.n_used == 4
    run(g, [1, 2], np.arange(4, 6), cache)
    assert cache.n_used == 6


# ---- validation --------------------------------------------------------------------------------

def test_validation_messages(rng):
    g = core.Graph(4, 1)
    tok = g.input_tokens()
    pos = g.input_positions()
    w = g.weight(rng.standard_normal((10, 32)).astype(np.float32), 0, (32, 10))
    x = g.get_rows(w, tok)
    w64 = g.weight(rng.standard_normal((3, 64)).astype(np.float32), 0, (64, 3))
    with pytest.raises(ValueError, match=r"\[mul_mat\] w.ne0 \(64\) != x.ne0 \(32\)"):
        g.mul_mat(w64, x)
    with pytest.raises(ValueError, match=r"\[weight\] arr.nbytes"):
        g.weight(np.zeros(10, np.float32), 0, (4, 3))
    with pytest.raises(ValueError, match=r"\[weight\] a Q8_0 weight needs dtype uint8"):
        g.weight(np.zeros(17, np.float32), int(T.Q8_0), (32, 2))
    with pytest.raises(ValueError, match=r"\[weight\] ne0 \(33\) must be a multiple"):
        g.weight(np.zeros(34 * 2, np.uint8), int(T.Q8_0), (33, 2))
    w5 = g.weight(np.zeros((5, 32), np.float32), 0, (32, 5))
    with pytest.raises(ValueError, match=r"\[add\] shapes differ"):
        g.add(x, g.mul_mat(w5, x))
    with pytest.raises(ValueError, match=r"\[mul\] b.ne0 \(5\) must be 1 or a.ne0 \(32\)"):
        g.mul(x, g.weight(np.zeros(5, np.float32), 0, (5,)))
    with pytest.raises(ValueError, match=r"\[reshape\] ne \(5, 7\) holds 35"):
        g.reshape(x, (5, 7))
    q = g.reshape(x, (8, 4))
    with pytest.raises(ValueError, match=r"\[rope\] n_rot \(10\) must be even"):
        g.rope(q, pos, 10, 0, 10000.0)
    with pytest.raises(ValueError, match=r"\[rope\] mode"):
        g.rope(q, pos, 8, 1, 10000.0)
    with pytest.raises(ValueError, match=r"\[rope\] pos must be the graph's input_positions"):
        g.rope(q, tok, 8, 0, 10000.0)
    k3 = g.reshape(g.mul_mat(g.weight(np.zeros((24, 32), np.float32), 0, (32, 24)), x), (8, 3, -1))
    with pytest.raises(ValueError, match=r"\[attention\] n_head \(4\) is not a multiple"):
        g.attention(q, k3, k3, None, 0, 1.0)
    with pytest.raises(ValueError, match=r"\[attention\] layer 5 out of range"):
        g.attention(q, q, q, core.KVCache(2, 8, 4, 8, 8), 5, 1.0)
    with pytest.raises(ValueError, match=r"\[attention\] layer 0: k/v need"):
        g.attention(q, q, q, core.KVCache(2, 8, 2, 8, 8), 0, 1.0)
    with pytest.raises(ValueError, match=r"\[glu\] act"):
        g.glu(x, x, "relu")
    other = core.Graph(4, 1)
    with pytest.raises(ValueError, match=r"\[silu\] x must be a Tensor of this graph"):
        other.silu(x)
    with pytest.raises(ValueError, match=r"\[get_rows\] w must be a weight"):
        g.get_rows(x, tok)
    with pytest.raises(RuntimeError, match=r"\[run\] call build\(\) first"):
        g.run([0], [0])
    with pytest.raises(ValueError, match=r"\[build\] no output"):
        g.build()
    a = g.attention(q, q, q, None, 0, 1.0)
    g.set_output(a)
    g.build()
    with pytest.raises(RuntimeError, match=r"\[silu\] the graph is already built"):
        g.silu(x)
    with pytest.raises(ValueError, match=r"\[run\] the graph has attention: a KVCache is required"):
        g.run([0], [0])
    cache = core.KVCache(1, 8, 4, 8, 8)
    with pytest.raises(ValueError, match=r"\[run\] n \(5\) must be in \[1, max_tokens = 4\]"):
        g.run([0] * 5, [0] * 5, cache=cache)
    with pytest.raises(ValueError, match=r"\[run\] tokens has 2 entries, expected 3"):
        g.run([0, 1], [0, 1, 2], cache=cache)
    with pytest.raises(ValueError, match=r"\[run\] token ids must be in \[0, 10\)"):
        g.run([0, 10], [0, 1], cache=cache)
    with pytest.raises(ValueError, match=r"\[run\] out_rows given but the graph has no"):
        g.run([0], [0], [0], cache=cache)
    with pytest.raises(ValueError, match=r"\[run\] layer 0: k/v need"):
        g.run([0], [0], cache=core.KVCache(1, 8, 2, 8, 8))
    cache.prepare(2)
    with pytest.raises(ValueError, match=r"\[run\] the cache has 2 cells prepared"):
        g.run([0], [0], cache=cache)
    y = g.run([0, 1], [0, 1], cache=cache)
    assert y.shape == (2, 32) and cache.n_used == 2


def test_out_rows_validation(rng):
    g = core.Graph(4, 1)
    emb = rng.standard_normal((10, 8)).astype(np.float32)
    x = g.get_rows(g.weight(emb, 0, (8, 10)), g.input_tokens())
    g.set_output(g.get_rows_f32(x, g.input_out_rows(2)))
    g.build()
    with pytest.raises(ValueError, match=r"\[run\] out_rows must be in \[0, n = 3\)"):
        g.run([0, 1, 2], [0, 1, 2], [3])
    with pytest.raises(ValueError, match=r"\[run\] out_rows has 3 entries"):
        g.run([0, 1, 2], [0, 1, 2], [0, 1, 2])
    with pytest.raises(ValueError, match=r"out_rows=None keeps all 3 rows"):
        g.run([0, 1, 2], [0, 1, 2])
    y = g.run([4, 5, 6], [0, 1, 2], [2, 0])
    assert y.shape == (2, 8)
    np.testing.assert_array_equal(y, emb[[6, 4]])
