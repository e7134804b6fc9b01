"""Tiny random Hugging Face models written to GGUF (tests/hf_gguf.py) and run by llmrt: logits at
every position against transformers, and cached decoding against uncached evaluation."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is a test extra (pip install -e .[test])")
pytest.importorskip("transformers", reason="transformers is a test extra (pip install -e .[test])")

from hf_gguf import hf_logits, llamacpp_like_model, tiny_model, write_gguf  # noqa: E402

from llmrt import Model  # noqa: E402

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma3",
            "llama-rope-linear", "llama-rope-yarn", "llama-rope-llama3"]

# Relative error = max |llmrt - transformers| / max |transformers| over all positions and vocab.
# F32 weights with an f32 KV cache: only f32 summation order differs (issue 2 asks <= 1e-4).
TOL_F32 = 1e-4
# Gemma 3 against plain transformers: llmrt computes GELU as llama.cpp's CPU backend does (input
# rounded to f16, result looked up in an f16 table); llama.cpp itself is 6.1e-4 from transformers
# on these files (tools/check_tiny_llamacpp.py). Against a transformers model with the same GELU
# (hf_gguf.llamacpp_like_model) the error is scattered, not systematic: an f32 GELU input within
# noise of an f16 rounding boundary picks the neighbouring table entry (one f16 ulp of the GELU
# output), seen up to 2.6e-4 at single positions.
TOL_F32_GEMMA_VS_EXACT_GELU = 1e-3
TOL_F32_GEMMA_LLAMACPP_LIKE = 5e-4
# Against llamacpp_like_model (the same roundings as llama.cpp: f16 / q8_0 activations for the
# matmuls, f16-table GELU), F16 weights agree to f32 noise that flips an f16 rounding now and then.
TOL_F16_LLAMACPP_LIKE = 2e-3
# F16 weights: activations are converted to f16 for the dot product as llama.cpp does, and the
# weights themselves were rounded to f16 (2^-11 relative each) before comparing with the f32 model.
TOL_F16 = 1e-2
# Q8_0 weights and activations: 8-bit blocks on both sides, ~0.5% per dot product, compounding
# over layers of a random model.
TOL_Q8_0 = 5e-2
# The default f16 KV cache on F32 weights: K and V rounded to f16.
TOL_F32_KV_F16 = 5e-3
# Cached decoding vs one uncached pass of the same weights: same arithmetic per row, up to the
# order of f32 sums inside attention.
TOL_CACHED = 1e-5

N_TOKENS = 40  # longer than the tiny Gemma 3 sliding window (8), so local layers really slide


def _ids(n_vocab, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_vocab - 1, size=N_TOKENS).tolist()


def _rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(family, dtype) -> (gguf path, reference logits, ids), built once per module."""
    cache = {}

    def get(family, dtype):
        key = (family, dtype)
        if key not in cache:
            model, config = tiny_model(family, seed=0)
            ids = _ids(config.vocab_size)
            path = write_gguf(model, config, tmp_path_factory.mktemp(family) / f"{dtype}.gguf", dtype=dtype)
            like = hf_logits(llamacpp_like_model(model, config, dtype), ids)
            cache[key] = (path, hf_logits(model, ids), ids, like)
        return cache[key]
    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_f32_logits_match_transformers(tiny, family):
    path, ref, ids, like = tiny(family, "f32")
    ours = Model(path, n_threads=2, ctx_size=64, kv_dtype="f32")(ids)
    assert ours.shape == ref.shape
    if family == "gemma3":
        assert _rel_err(ours, like) <= TOL_F32_GEMMA_LLAMACPP_LIKE
        assert _rel_err(ours, ref) <= TOL_F32_GEMMA_VS_EXACT_GELU
    else:
        assert _rel_err(ours, ref) <= TOL_F32
        assert _rel_err(ours, like) <= TOL_F32


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_f32_logits_with_f16_cache(tiny, family):
    path, ref, ids, like = tiny(family, "f32")
    ours = Model(path, n_threads=2, ctx_size=64)(ids)
    assert _rel_err(ours, like) <= TOL_F32_KV_F16


@pytest.mark.parametrize("dtype,tol", [("f16", TOL_F16), ("q8_0", TOL_Q8_0)])
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma3"])
def test_quantized_logits_match_transformers(tiny, family, dtype, tol):
    path, ref, ids, like = tiny(family, dtype)
    ours = Model(path, n_threads=2, ctx_size=64)(ids)
    assert _rel_err(ours, ref) <= tol
    if dtype == "f16":
        assert _rel_err(ours, like) <= TOL_F16_LLAMACPP_LIKE
    # and the argmax agrees almost everywhere
    assert np.mean(ours.argmax(-1) == ref.argmax(-1)) >= 0.9


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma3"])
def test_prefill_then_decode_equals_uncached(tiny, family):
    path, _, ids, _ = tiny(family, "f32")
    model = Model(path, n_threads=2, ctx_size=64, kv_dtype="f32")
    full = model(ids)
    sess = model.new_session()
    k = 13
    pre = sess.eval(ids[:k], all_logits=True)
    np.testing.assert_allclose(pre, full[:k], rtol=0, atol=TOL_CACHED * np.abs(full).max())
    for i in range(k, len(ids)):
        step = sess.eval([ids[i]])
        np.testing.assert_allclose(step, full[i], rtol=0, atol=TOL_CACHED * np.abs(full).max())
    assert sess.n_past == len(ids)


def test_thread_counts_agree(tiny):
    path, _, ids, _ = tiny("llama", "q8_0")
    a = Model(path, n_threads=1, ctx_size=64)(ids)
    b = Model(path, n_threads=2, ctx_size=64)(ids)
    np.testing.assert_array_equal(a, b)
