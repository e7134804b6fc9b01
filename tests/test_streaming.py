"""The streaming session (llmrt/model.py Session over csrc/kv_cache.c): n_keep sinks, n_discard
eviction, shift-RoPE vs recompute, no drift after 1000 evictions, unbounded generation in flat
memory, validation, window mode, the recompute fallback, chat with --n-keep auto, and the CLI.

Models: tiny random Hugging Face models written to GGUF (tests/hf_gguf.py), f32 weights.

Why shift and recompute differ, and where they must not: after an eviction, "shift" keeps every
surviving token's K and V as they were computed (with the evicted tokens still in context) and
only re-rotates K to the new position; "recompute" re-evaluates the kept tokens with the evicted
ones gone, so from layer 1 on their K/V change. Layer 0's K and V depend on the token and its
position only, so (1) in a one-layer model shift and recompute must agree to f32 rounding, and
(2) in any model, layer 0 of both caches must agree. And in any model, shift must equal a cache
whose surviving keys were re-roped ONCE from their pre-RoPE master copies: bit-identical.

Run: python -m pytest -q tests/test_streaming.py
"""
import os
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is a test extra (pip install -e .[test])")
pytest.importorskip("transformers", reason="transformers is a test extra (pip install -e .[test])")

from hf_gguf import tiny_model, write_gguf  # noqa: E402

from llmrt import Model  # noqa: E402
from llmrt.chat import ChatSession, encode_chat  # noqa: E402

# One-layer model, shift vs recompute: the same attention in exact arithmetic, but (1) recompute
# re-evaluates the kept tokens in one batch, shift evaluated them one by one: f32 matmuls summed
# in another order, ~1e-7 relative; (2) shift turns the sinks forward instead of the window back
# (kv_cache.h), so every key is rotated at a position up to pos_offset < ctx_size (24) higher:
# the f32 angle p * theta_i (built by i repeated f32 products, as ggml does) differs by up to
# ~(hd / 2) * 2^-24 * 2 * ctx = 16 * 6e-8 * 48 = 4.6e-5 rad, which moves keys, scores and so the
# logits by about that much relative; (3) the cells are summed in another order (new tokens fill
# the holes), ~n_ctx * 2^-24. Observed <= 2e-5 (Gemma 3's local layer).
TOL_ONE_LAYER = 1e-4
# Layer 0 of a deeper model, shift vs recompute caches (f32): the pre-RoPE master keys and the
# values are position-free: only (1) above, per element on O(1) keys and values; observed ~1e-6.
TOL_LAYER0 = 1e-5
# Chunked all_logits eval vs token-by-token eval with the same eviction schedule: batch vs
# single-row f32 arithmetic only; observed ~1e-6 relative.
TOL_BATCH = 1e-5
# f16 cache keys vs a float64 numpy RoPE of the f32 master keys: one f16 rounding (half an ulp,
# 2^-11 relative, keys |k| < 16 -> 8e-3) plus f32 angle error (< 1e-4 rad at positions < 64).
ROPE_F16_ATOL_REL = 2.0 ** -11 + 1e-4
# f32 cache keys vs that float64 RoPE: the f32 angle error only.
ROPE_F32_REL = 1e-4
# Process RSS growth allowed over 2000 streamed tokens once warm: allocator noise (numpy
# temporaries, Python ints); a leak of one logits row per token would be 2000 * 4 * n_vocab
# = 2.5 MB and one K/V cell per token far more.
RSS_SLACK_BYTES = 1 << 20

N_VOCAB_IDS = 300


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    made = {}

    def get(family, **overrides):
        key = (family, tuple(sorted(overrides.items())))
        if key not in made:
            model, config = tiny_model(family, seed=0, **overrides)
            d = tmp_path_factory.mktemp(family)
            made[key] = write_gguf(model, config, d / "f32.gguf", dtype="f32")
        return made[key]
    return get


def _model(path, kv_dtype="f32", patch=None):
    m = Model(path, n_threads=2, ctx_size=256, kv_dtype=kv_dtype)
    if patch:
        patch(m)
    return m


def _ids(n, seed=3, vocab=N_VOCAB_IDS):
    return np.random.default_rng(seed).integers(0, vocab - 1, size=n).tolist()


def _partial(m):
    m.hparams.rope.n_rot = m.hparams.head_dim_k // 2     # partial rotary: half the head dims


def _global(m):
    m.hparams.n_swa = 0                                   # Gemma 3: every layer global (base 1e6)


ONE_LAYER = [
    ("llama", {}, None),                 # NORM pairs, GQA 4/2
    ("qwen2", {}, None),                 # NeoX, biases
    ("qwen3", {}, None),                 # NeoX, q/k norm
    ("gemma3", {}, None),                # NeoX, local layer: base 10000, sliding window 8
    ("gemma3", {}, _global),             # global layer: rope.freq_base 1e6
    ("llama-rope-yarn", {}, None),       # YaRN
    ("llama", {}, _partial),             # partial rotary (n_rot = head_dim / 2)
]


@pytest.mark.parametrize("family,over,patch", ONE_LAYER,
                         ids=["llama", "qwen2", "qwen3", "gemma3-local", "gemma3-global",
                              "llama-yarn", "llama-partial-rotary"])
def test_one_layer_shift_equals_recompute(gguf_path, family, over, patch):
    m = _model(gguf_path(family, num_hidden_layers=1, **over), patch=patch)
    sh = m.new_session(ctx_size=24, n_keep=4, n_discard=5, kv_mode="shift")
    rc = m.new_session(ctx_size=24, n_keep=4, n_discard=5, kv_mode="recompute")
    worst = 0.0
    for t in _ids(90):
        a, b = sh.eval([t]), rc.eval([t])
        worst = max(worst, _rel(a, b))
    assert sh.n_shifts == rc.n_shifts >= 10 and sh.tokens == rc.tokens
    assert worst <= TOL_ONE_LAYER


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_shift_equals_keys_reroped_once(gguf_path, family):
    """Deep models, default f16 cache: after many evictions the shifted cache gives exactly the
    logits of a copy whose keys were all recomputed once from the masters."""
    m = _model(gguf_path(family), kv_dtype="f16")
    sh = m.new_session(ctx_size=20, n_keep=4, n_discard=3)
    ids = _ids(120)
    for t in ids[:-1]:
        sh.eval([t])
    assert sh.n_shifts > 20
    ref = m.new_session(ctx_size=20, n_keep=4, n_discard=3)
    ref.cache.copy_from(sh.cache)
    ref.tokens = list(sh.tokens)
    ref.cache.rerope()
    for il in range(m.hparams.n_layer):
        np.testing.assert_array_equal(sh.cache.k(il), ref.cache.k(il))
    np.testing.assert_array_equal(sh.eval([ids[-1]]), ref.eval([ids[-1]]))


def test_gemma3_per_layer_rope_bases(gguf_path):
    m = _model(gguf_path("gemma3"), kv_dtype="f16")
    s = m.new_session(ctx_size=16, n_keep=2, n_discard=5)
    for t in _ids(40):
        s.eval([t])
    bases = [s.cache.rope_params(il)["freq_base"] for il in range(6)]
    assert bases == [10000.0] * 5 + [1e6]            # local layers 0-4, global layer 5
    pos = s.cache.positions()
    np.testing.assert_array_equal(pos, np.arange(s.n_past) + s.cache.pos_offset)
    for il in (0, 5):                                  # shifted keys = RoPE(master) at new pos
        rp = s.cache.rope_params(il)
        x = s.cache.k_pre(il).astype(np.float64)
        i = np.arange(rp["n_rot"] // 2)
        th = pos[:, None, None] * rp["freq_base"] ** (-2.0 * i / rp["n_rot"])
        a, b = i, i + rp["n_rot"] // 2
        y = x.copy()
        y[..., a] = x[..., a] * np.cos(th) - x[..., b] * np.sin(th)
        y[..., b] = x[..., a] * np.sin(th) + x[..., b] * np.cos(th)
        err = np.max(np.abs(s.cache.k(il) - y)) / np.max(np.abs(y))
        assert err <= ROPE_F16_ATOL_REL


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_layer0_shift_equals_recompute(gguf_path, family):
    m = _model(gguf_path(family))
    sh = m.new_session(ctx_size=20, n_keep=4, kv_mode="shift")
    rc = m.new_session(ctx_size=20, n_keep=4, kv_mode="recompute")
    for t in _ids(70):
        sh.eval([t])
        rc.eval([t])
    assert sh.n_shifts >= 5 and sh.tokens == rc.tokens
    # the same positions up to the shift's common offset (its keys: test_no_drift_*)
    np.testing.assert_array_equal(sh.cache.positions() - sh.cache.pos_offset, rc.cache.positions())
    # recompute's keys vs shift's master keys rotated (float64) at recompute's positions
    k_ref = _rope64(sh.cache.k_pre(0), rc.cache.positions(), sh.cache.rope_params(0))
    assert _rel(rc.cache.k(0), k_ref) <= TOL_LAYER0 + ROPE_F32_REL
    assert _rel(sh.cache.v(0), rc.cache.v(0)) <= TOL_LAYER0
    # deeper layers differ: shift kept K/V computed with the evicted context
    assert _rel(sh.cache.v(1), rc.cache.v(1)) > TOL_LAYER0


def _rope64(x, pos, rp):
    """float64 RoPE of keys x [n, n_head_kv, hd] at positions pos [n] (NORM or NeoX pairs)."""
    x = np.asarray(x, np.float64)
    i = np.arange(rp["n_rot"] // 2)
    th = np.asarray(pos, np.float64)[:, None, None] * rp["freq_base"] ** (-2.0 * i / rp["n_rot"])
    a, b = (i, i + rp["n_rot"] // 2) if rp["mode"] == 2 else (2 * i, 2 * i + 1)
    y = x.copy()
    y[..., a] = x[..., a] * np.cos(th) - x[..., b] * np.sin(th)
    y[..., b] = x[..., a] * np.sin(th) + x[..., b] * np.cos(th)
    return y


def _rope_err(s, il):
    """max |K - RoPE64(master)| / max |K| of layer il (NORM pairs, the llama family)."""
    rp = s.cache.rope_params(il)
    x = s.cache.k_pre(il).astype(np.float64)
    pos = s.cache.positions().astype(np.float64)
    i = np.arange(rp["n_rot"] // 2)
    th = pos[:, None, None] * rp["freq_base"] ** (-2.0 * i / rp["n_rot"])
    y = x.copy()
    y[..., 2 * i] = x[..., 2 * i] * np.cos(th) - x[..., 2 * i + 1] * np.sin(th)
    y[..., 2 * i + 1] = x[..., 2 * i] * np.sin(th) + x[..., 2 * i + 1] * np.cos(th)
    return float(np.max(np.abs(s.cache.k(il) - y)) / np.max(np.abs(y)))


def test_no_drift_after_1000_evictions(gguf_path):
    m = _model(gguf_path("llama"), kv_dtype="f16")
    s = m.new_session(ctx_size=12, n_keep=4, n_discard=1)
    ids = _ids(1030, seed=5)
    errs = {}
    for j, t in enumerate(ids[:-1]):
        s.eval([t])
        if s.n_evicted in (10, 1000) and s.n_evicted not in errs:
            errs[s.n_evicted] = max(_rope_err(s, il) for il in range(m.hparams.n_layer))
    assert s.n_evicted >= 1000 and s.n_shifts == s.n_evicted
    # error vs an exact rotation stays at one f16 rounding: it does not grow with the shifts
    assert errs[10] <= ROPE_F16_ATOL_REL and errs[1000] <= ROPE_F16_ATOL_REL
    ref = m.new_session(ctx_size=12, n_keep=4, n_discard=1)
    ref.cache.copy_from(s.cache)
    ref.tokens = list(s.tokens)
    ref.cache.rerope()
    np.testing.assert_array_equal(s.eval([ids[-1]]), ref.eval([ids[-1]]))


def test_unbounded_generation(gguf_path):
    m = _model(gguf_path("llama"), kv_dtype="f16")
    prompt = _ids(10)
    sess = m.new_session(ctx_size=32, n_keep=4)
    out = m.generate(prompt, max_new_tokens=400, ignore_eos=True, temperature=0.0, session=sess)
    assert len(out) == 410 and out[:10] == prompt
    assert sess.n_past <= 32 and sess.n_evicted >= 400 - 32
    assert sess.tokens[:4] == prompt[:4]                 # the sinks survive
    assert sess.tokens[-5:] == out[-6:-1]                # the last sampled id is not evaluated


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_memory_flat_over_2000_tokens(gguf_path):
    m = _model(gguf_path("llama"), kv_dtype="f16")
    s = m.new_session(ctx_size=48, n_keep=4)
    ids = _ids(2300, seed=7)
    for t in ids[:300]:
        s.eval([t])
    nbytes, rss = s.cache.nbytes, _rss()
    for t in ids[300:]:
        s.eval([t])
    assert s.n_past <= 48 and s.n_shifts > 50
    assert s.cache.nbytes == nbytes
    assert _rss() - rss <= RSS_SLACK_BYTES


def test_all_logits_across_evictions(gguf_path):
    m = _model(gguf_path("llama"))
    ids = _ids(50)
    a = m.new_session(ctx_size=16, n_keep=4)
    rows = a.eval(ids, all_logits=True)
    b = m.new_session(ctx_size=16, n_keep=4)
    one = np.stack([b.eval([t]) for t in ids])
    assert rows.shape == (50, m.n_vocab) and a.tokens == b.tokens and a.n_shifts == b.n_shifts
    assert _rel(rows, one) <= TOL_BATCH


def test_validation(gguf_path):
    m = _model(gguf_path("llama"))
    with pytest.raises(ValueError, match=r"n_keep \(4\).*ctx_size \(4\)"):
        m.new_session(ctx_size=4, n_keep=4)
    with pytest.raises(ValueError, match="n_discard"):
        m.new_session(ctx_size=16, n_keep=4, n_discard=0)
    with pytest.raises(ValueError, match=r"n_discard.*ctx_size \(16\) - n_keep \(4\)"):
        m.new_session(ctx_size=16, n_keep=4, n_discard=13)
    m.new_session(ctx_size=16, n_keep=4, n_discard=12)          # all the unpinned cells: ok
    with pytest.raises(ValueError, match="kv_mode"):
        m.new_session(ctx_size=16, kv_mode="sliding")
    s = m.new_session(ctx_size=16, n_keep=4, n_discard=10)
    with pytest.raises(ValueError, match="n_discard"):
        s.n_keep = 8                                             # 10 > 16 - 8
    with pytest.raises(ValueError, match="n_keep"):
        s.n_keep = 16
    s.n_keep = 6
    assert s.n_keep == 6
    assert m.new_session(ctx_size=4, kv_mode="none").n_keep == 3   # no eviction: n_keep moot
    strict = m.new_session(ctx_size=8, n_keep=0, kv_mode="none")
    strict.eval(_ids(8))
    with pytest.raises(ValueError, match="context full"):
        strict.eval([1])


def test_window_mode_has_no_sinks(gguf_path):
    m = _model(gguf_path("llama"))
    w = m.new_session(ctx_size=16, n_keep=4, kv_mode="window")
    s0 = m.new_session(ctx_size=16, n_keep=0, kv_mode="shift")
    assert w.n_keep == 0
    w.n_keep = 5
    assert w.n_keep == 0
    ids = _ids(60)
    for t in ids:
        a, b = w.eval([t]), s0.eval([t])
    np.testing.assert_array_equal(a, b)
    assert w.tokens == ids[-w.n_past:] and w.n_shifts > 0


def test_family_that_cannot_shift_recomputes(gguf_path, caplog):
    m = _model(gguf_path("llama", num_hidden_layers=2))
    fam = m.family
    m.family = types.SimpleNamespace(can_shift=False, build_graph=fam.build_graph)
    with caplog.at_level("WARNING", logger="llmrt"):
        s = m.new_session(ctx_size=16, n_keep=4)
    assert "cannot be shifted" in caplog.text and "recompute" in s.describe()
    assert not s.cache.has_shift
    r = m.new_session(ctx_size=16, n_keep=4, kv_mode="recompute")
    for t in _ids(40):
        a, b = s.eval([t]), r.eval([t])
    np.testing.assert_array_equal(a, b)
    assert s.n_shifts > 0


# ---- chat --------------------------------------------------------------------------------------

def test_chat_many_turns_pins_the_system_prompt(gguf_path):
    m = _model(gguf_path("llama"), kv_dtype="f16")
    system = "You are a test model."    # ~30 tokens with the template (the tiny vocab is bytes)
    cs = ChatSession(m, system=system, ctx_size=128, max_new_tokens=12, temperature=0.0)
    for i in range(14):
        cs.send(f"turn {i}")
    sess = cs.session
    sys_ids = encode_chat(m.tokenizer, cs.template.render(
        [{"role": "system", "content": system}], add_generation_prompt=False))
    assert sess.n_keep == len(sys_ids) > 4                     # --n-keep auto: the system prompt
    assert sess.n_shifts >= 3 and sess.n_past <= 128
    assert sess.tokens[:sess.n_keep] == sys_ids                # still first after the evictions
    assert len(cs.messages) == 1 + 2 * 14


def test_chat_turn_longer_than_context_is_a_clear_error(gguf_path):
    m = _model(gguf_path("llama"), kv_dtype="f16")
    cs = ChatSession(m, system="Be brief.", ctx_size=128, max_new_tokens=4, temperature=0.0)
    cs.send("hello")
    with pytest.raises(ValueError, match="shorten the message or raise --ctx-size"):
        cs.send("word " * 200)
    assert cs.send("hello again") is not None                  # the conversation goes on


# ---- CLI ---------------------------------------------------------------------------------------

def test_cli_generate_streams_past_the_context(gguf_path):
    from click.testing import CliRunner

    from llmrt.cli import main
    r = CliRunner().invoke(main, ["generate", str(gguf_path("llama")), "-p", "hello world",
                                  "-n", "150", "-c", "32", "--ignore-eos", "--temp", "0",
                                  "--n-keep", "2", "--n-discard", "8", "-t", "1"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "kv cache: mode shift, ctx 32, n_keep 2, n_discard 8" in r.stderr
    assert "generated 150" in r.stderr


def test_cli_bad_keep(gguf_path):
    from click.testing import CliRunner

    from llmrt.cli import main
    r = CliRunner().invoke(main, ["generate", str(gguf_path("llama")), "-p", "hi", "-c", "8",
                                  "--keep", "8"])
    assert r.exit_code == 1 and "n_keep (8) + 1 must be <= ctx_size (8)" in r.stderr
    r = CliRunner().invoke(main, ["generate", str(gguf_path("llama")), "-p", "hi", "--keep", "x"])
    assert r.exit_code == 2 and "integer or 'auto'" in r.output


# ---- real model --------------------------------------------------------------------------------

@pytest.mark.slow
def test_real_gemma3_shift_uses_each_layers_base():
    """Gemma 3 (the model users see garbage from after shifts elsewhere): local layers shift
    with base 10000, global ones with rope.freq_base, and the shifted cache equals the keys
    re-roped once from their masters."""
    from fake_lm import real_model
    m = real_model("gemma3-270m")
    hp = m.hparams
    ids = m.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 6, add_special=True)
    s = m.new_session(ctx_size=32, n_keep=4)
    for t in ids[:-1]:
        s.eval([t])
    assert s.n_shifts >= 2
    for il in range(hp.n_layer):
        want = hp.rope_freq_base_swa if hp.is_swa(il) else hp.rope.freq_base
        assert s.cache.rope_params(il)["freq_base"] == np.float32(want)
    assert {hp.is_swa(il) for il in range(hp.n_layer)} == {True, False}
    ref = m.new_session(ctx_size=32, n_keep=4)
    ref.cache.copy_from(s.cache)
    ref.tokens = list(s.tokens)
    ref.cache.rerope()
    np.testing.assert_array_equal(s.eval([ids[-1]]), ref.eval([ids[-1]]))
