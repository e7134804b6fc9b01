"""Multi-sequence batches (continuous batching): one graph run for several sessions, each token
attending only to its own session's cache (Graph.run_seqs over csrc/graph.c
llmrt_graph_run_seqs, Model.eval_sessions).

The contract is exact: a batched row is the same bits as the same session evaluated alone, at
every ISA level (the matmul kernels are exact per (row, token) whatever the batch: gemm.h; the
attention of a token reads only its own cache, through the same per-token kernel). So a greedy
request answers the same at any load. Models: tiny random Hugging Face models written to GGUF
(tests/hf_gguf.py), the four dense families (Gemma 3 with its sliding window) and a MoE one.

Run: python -m pytest -q tests/test_batching.py
"""
import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is a test extra (pip install -e .[test])")
pytest.importorskip("transformers", reason="transformers is a test extra (pip install -e .[test])")

from hf_gguf import tiny_model, write_gguf  # noqa: E402

from llmrt import Model, _core  # noqa: E402

N_VOCAB_IDS = 250


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    made = {}

    def get(family, dtype="f32"):
        key = (family, dtype)
        if key not in made:
            model, config = tiny_model(family, seed=0)
            d = tmp_path_factory.mktemp(family)
            made[key] = write_gguf(model, config, d / f"{dtype}.gguf", dtype=dtype)
        return made[key]
    return get


def _ids(n, seed):
    return np.random.default_rng(seed).integers(0, N_VOCAB_IDS, size=n).tolist()


def _alone(m, prompt, steps, **sess_kw):
    """Logits of each decode step of one session evaluated alone: [steps, n_vocab]."""
    s = m.new_session(**sess_kw)
    s.eval(prompt)
    return np.stack([s.eval([7 + t % 50]).copy() for t in range(steps)])


@pytest.mark.parametrize("family,dtype", [("llama", "f32"), ("qwen2", "f16"), ("qwen3", "q8_0"),
                                          ("gemma3", "f16"), ("olmoe", "f32")])
def test_batched_decode_equals_each_alone(gguf_path, isa_level, family, dtype):
    """4 sessions of different lengths (and a small streaming cache that shifts during the
    steps) decoded together: every row the same bits as that session decoded alone."""
    m = Model(gguf_path(family, dtype), n_threads=2, kv_dtype="f16")
    prompts = [_ids(n, seed=n) for n in (3, 11, 30, 47)]
    kw = dict(ctx_size=40, n_keep=2, n_discard=5)
    steps = 24
    ref = [_alone(m, p, steps, **kw) for p in prompts]
    sessions = [m.new_session(**kw) for _ in prompts]
    for s, p in zip(sessions, prompts):
        s.eval(p)
    got = np.stack([m.eval_sessions(sessions, [[7 + t % 50]] * 4) for t in range(steps)], axis=1)
    assert sum(s.n_shifts for s in sessions) >= 4          # shifts happened inside the batch
    for i in range(4):
        np.testing.assert_array_equal(got[i], ref[i], err_msg=f"session {i} ({isa_level})")


@pytest.mark.parametrize("dtype", ["q8_0", "f16"])
def test_decode_same_bits_for_any_thread_count(tmp_path, dtype):
    """A run of up to 4 tokens splits each packed matmul into one contiguous range of groups per
    thread plus a tail claimed in small chunks (csrc/ops/mul_mat.c, mul_mat_packed): 2, 3 and 5
    threads give the bits of 1 thread, for 1- and 3-token runs, every step. (Hidden size 256:
    the FFN and output matmuls are large enough to run on every thread, SINGLE_THREAD_WORK.)"""
    model, config = tiny_model("llama", seed=0, hidden_size=256, intermediate_size=512)
    path = write_gguf(model, config, tmp_path / f"{dtype}.gguf", dtype=dtype)
    prompt = _ids(9, seed=3)
    got = {}
    for nt in (1, 2, 3, 5):
        m = Model(path, n_threads=nt, kv_dtype="f16")
        s = m.new_session(ctx_size=64)
        s.eval(prompt)
        got[nt] = np.stack([s.eval([7 + t]).copy() for t in range(6)] + [s.eval([1, 2, 3]).copy()])
        assert np.isfinite(got[nt]).all()
    for nt in (2, 3, 5):
        np.testing.assert_array_equal(got[nt], got[1], err_msg=f"{dtype}, {nt} threads")


def test_batch_of_chunks_equals_each_alone(gguf_path):
    """Several tokens per session in one batch (prefill chunks next to decode tokens), sessions
    of different cache sizes and modes: the last row of each equals its session alone."""
    m = Model(gguf_path("llama"), n_threads=2, kv_dtype="f16")
    cfgs = [dict(ctx_size=64), dict(ctx_size=32, kv_mode="recompute", n_keep=1),
            dict(ctx_size=128, n_keep=0, kv_mode="window"), dict(ctx_size=64, kv_mode="none")]
    chunks = [[_ids(5, 1), _ids(3, 2)], [_ids(9, 3), _ids(1, 4)], [_ids(1, 5), _ids(20, 6)],
              [_ids(2, 7), _ids(2, 8)]]
    ref = []
    for cfg, ch in zip(cfgs, chunks):
        s = m.new_session(**cfg)
        ref.append([s.eval(c).copy() for c in ch])
    sessions = [m.new_session(**cfg) for cfg in cfgs]
    for step in range(2):
        got = m.eval_sessions(sessions, [ch[step] for ch in chunks])
        for i in range(4):
            np.testing.assert_array_equal(got[i], ref[i][step], err_msg=f"session {i}, step {step}")
    assert [len(s.tokens) for s in sessions] == [8, 10, 21, 4]


def test_batched_prefill_fills_each_cache_as_alone(gguf_path):
    """All logits of a batched prefill chunk are not kept (one row per session), so the
    per-position check runs through the cache: after the batch, each session's next decode
    equals the decode of a session that prefilled alone."""
    m = Model(gguf_path("qwen2", "f16"), n_threads=2)
    prompts = [_ids(17, 11), _ids(33, 12)]
    alone = []
    for p in prompts:
        s = m.new_session(ctx_size=64)
        s.eval(p)
        alone.append(s.eval([5]).copy())
    sessions = [m.new_session(ctx_size=64) for _ in prompts]
    m.eval_sessions(sessions, prompts)
    for s, a in zip(sessions, alone):
        np.testing.assert_array_equal(s.eval([5]), a)


def test_eval_sessions_errors(gguf_path):
    m = Model(gguf_path("llama"), n_threads=2)
    other = Model(gguf_path("llama"), n_threads=2)
    a, b = m.new_session(ctx_size=16), m.new_session(ctx_size=16)
    with pytest.raises(ValueError, match="appears twice"):
        m.eval_sessions([a, a], [[1], [2]])
    with pytest.raises(ValueError, match="another model"):
        m.eval_sessions([a, other.new_session(ctx_size=16)], [[1], [2]])
    with pytest.raises(ValueError, match="2 sessions and 1"):
        m.eval_sessions([a, b], [[1]])
    with pytest.raises(ValueError, match="more than one batch"):
        m.eval_sessions([m.new_session(ctx_size=600), b], [[1] * 512, [2]])
    with pytest.raises(ValueError, match="out of range"):
        m.eval_sessions([a, b], [[1], [10 ** 6]])
    with pytest.raises(ValueError, match="cannot fit at once"):
        m.eval_sessions([a, b], [[1] * 17, [2]])
    # no eviction needed: the ids fit as they are, whatever n_keep leaves free for an eviction
    pinned = m.new_session(ctx_size=16, n_keep=15)
    m.eval_sessions([pinned, b], [[1] * 10, [2]])
    assert pinned.n_past == 10 and pinned.n_shifts == 0
    pinned.reset()
    b.reset()
    full = m.new_session(ctx_size=4, kv_mode="none")
    full.eval([1, 2, 3, 4])
    with pytest.raises(ValueError, match="context full"):
        m.eval_sessions([full, b], [[1], [2]])
    assert a.n_past == 0 and b.n_past == 0                  # nothing was half-done


def test_run_seqs_validation(gguf_path):
    """Graph.run_seqs refuses what would write out of bounds, and leaves no reservation."""
    m = Model(gguf_path("llama"), n_threads=2)
    g = m._graph(3, False, n_out=2)
    hp = m.hparams
    shapes = hp.kv_shapes()

    def cache(n_ctx=8, dtype="f16"):
        return _core.KVCache(hp.n_layer, n_ctx, [s[0] for s in shapes], [s[1] for s in shapes],
                             [s[2] for s in shapes], dtype=dtype)

    c1, c2 = cache(), cache()
    tok, pos = np.array([1, 2, 3], np.int32), np.array([0, 1, 0], np.int32)
    rows = np.array([1, 2], np.int32)
    with pytest.raises(ValueError, match="appears twice"):
        g.run_seqs(tok, pos, rows, [c1, c1], [2, 1])
    with pytest.raises(ValueError, match="counts sum to 4"):
        g.run_seqs(tok, pos, rows, [c1, c2], [2, 2])
    with pytest.raises(ValueError, match=">= 1 token"):
        g.run_seqs(tok, pos, rows, [c1, c2], [3, 0])
    with pytest.raises(ValueError, match="same dtype"):
        g.run_seqs(tok, pos, rows, [c1, cache(dtype="f32")], [2, 1])
    with pytest.raises(ValueError, match="out_rows must be in"):
        g.run_seqs(tok, pos, np.array([1, 3], np.int32), [c1, c2], [2, 1])
    with pytest.raises(ValueError, match="do not fit"):
        g.run_seqs(tok, pos, rows, [c1, cache(n_ctx=1)], [1, 2])
    assert c1.n_pending == 0 and c2.n_pending == 0           # the failed prepare left nothing
    out = g.run_seqs(tok, pos, rows, [c1, c2], [2, 1])
    assert out.shape == (2, m.n_vocab) and np.isfinite(out).all()
    assert (c1.n_used, c2.n_used) == (2, 1)


def test_graph_kinds_do_not_collide(gguf_path):
    """Every-row graphs, last-row graphs and multi-sequence graphs of one bucket are distinct
    (a key of True and one of 1 are the same dict key in Python)."""
    m = Model(gguf_path("llama"), n_threads=2)
    ids = _ids(5, seed=1)
    full = m(ids)                                   # bucket 8, every row
    s = m.new_session(ctx_size=16)
    last = s.eval(ids)                              # bucket 8, the last row
    assert full.shape == (5, m.n_vocab) and last.shape == (m.n_vocab,)
    np.testing.assert_allclose(last, full[-1], rtol=1e-5, atol=1e-5)
    two = m.eval_sessions([m.new_session(ctx_size=16), m.new_session(ctx_size=16)], [ids, ids[:3]])
    assert two.shape == (2, m.n_vocab)
    assert len({id(g) for g in m._graphs.values()}) == len(m._graphs) == 3
