"""Tests of tests/hf_gguf.py: tiny HF models written to GGUF as llama.cpp's converter does.

The expectations here are written out independently of the helper (explicit HF -> GGUF name
tables, explicit key values, the inverse permute, Gemma's +1), so a wrong convention in the
helper fails here rather than in every model test that uses it. That the conventions are the
ones llama.cpp *runs* with is checked by tools/check_tiny_llamacpp.py against llama.cpp itself.
"""
import math

import numpy as np
import pytest

import gguf

torch = pytest.importorskip("torch", reason="torch is a test dependency of the HF->GGUF helper")
pytest.importorskip("transformers", reason="transformers is a test dependency of the HF->GGUF helper")

import hf_gguf  # noqa: E402  (tests/ is on sys.path under pytest's default rootdir import mode)

F32, F16, Q8_0 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.Q8_0

# |x - f16(x)| <= 2^-11 |x| (round to nearest, 11-bit significand) for normal f16 values; our
# weights are far from the f16 subnormal range (smallest ~1e-6 vs 6e-5 only for a few): allow
# an absolute floor of half the smallest subnormal step.
F16_REL = 2.0 ** -11
F16_ABS = 2.0 ** -25
# Q8_0 block of 32: d = amax/127 stored as f16, q = round(x/d): |x - q*d| <= d/2 from rounding
# plus |q| * |d - f16(d)| <= 127 * 2^-11 * d from the f16 scale; in units of amax:
Q8_0_REL_OF_AMAX = (0.5 + 127 * 2.0 ** -11) / 127 * 1.0001

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma3",
            "llama-rope-linear", "llama-rope-yarn", "llama-rope-llama3"]
DTYPES = ["f32", "f16", "q8_0"]

ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3",
        "llama-rope-linear": "llama", "llama-rope-yarn": "llama", "llama-rope-llama3": "llama"}

# HF name -> GGUF name, written out by hand from gguf-py's tensor_mapping.py
GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def gguf_name(hf_name, arch):
    if hf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf_name]
    _, _, bid, rest = hf_name.split(".", 3)
    if rest == "post_attention_layernorm.weight":
        # llama/qwen: the norm before the FFN; gemma3: the norm after attention
        new = "post_attention_norm.weight" if arch == "gemma3" else "ffn_norm.weight"
    else:
        new = LAYER_NAMES[rest]
    return f"blk.{bid}.{new}"


_models = {}


def get_model(family, **overrides):
    key = (family, tuple(sorted(overrides.items())))
    if key not in _models:
        _models[key] = hf_gguf.tiny_model(family, seed=0, **overrides)
    return _models[key]


def kv(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def file_values(t):
    """float32 numpy array (row-major, HF orientation) of a GGUFReader tensor."""
    if t.tensor_type in (F32, F16):
        return np.asarray(t.data, dtype=np.float32).reshape([int(n) for n in reversed(t.shape)])
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)


def inverse_permute(w, n_head):
    # llama.cpp stores rows of a head as pairs (x0, y0, x1, y1, ...); HF as (x0, x1, ..., y0, y1, ...)
    d = w.shape[0] // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------------------------------------

def test_tiny_vocab_is_consistent():
    tokens, toktypes, merges, eos = hf_gguf.tiny_vocab(300)
    assert len(tokens) == len(toktypes) == 300 and len(set(tokens)) == 300
    assert eos == 299 and tokens[eos] == hf_gguf.EOS_TEXT and toktypes[eos] == gguf.TokenType.CONTROL
    b2u = hf_gguf.bytes_to_unicode()
    assert sorted(b2u) == list(range(256)) and len(set(b2u.values())) == 256
    assert tokens[10] == b2u[10] == "\u010a"        # "\n" is a token: llama.cpp looks it up at load
    vocab = set(tokens)
    assert len(merges) == 300 - 257
    for i, m in enumerate(merges):
        a, b = m.split(" ")
        assert a in vocab and b in vocab and tokens[256 + i] == a + b


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_model_logits_are_not_degenerate(family):
    model, config = get_model(family)
    ids = list(range(3, 23))
    logits = hf_gguf.hf_logits(model, ids)
    assert logits.shape == (20, config.vocab_size) and logits.dtype == np.float32
    # default transformers init gives a spread ~0.1 and near-uniform attention; we want O(1)
    assert logits.std(axis=1).min() > 0.5
    assert len(set(logits.argmax(axis=1).tolist())) >= 8   # the prediction changes along the sequence


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_tensors_match_hf_weights(family, dtype, tmp_path):
    model, config = get_model(family)
    arch = ARCH[family]
    path = hf_gguf.write_gguf(model, config, tmp_path / "m.gguf", dtype=dtype, family=family)
    r = gguf.GGUFReader(path)
    assert kv(r, "general.architecture") == arch
    got = {t.name: t for t in r.tensors}

    tied = config.tie_word_embeddings
    expected_names = set()
    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads
    for hf_name, p in model.state_dict().items():
        if hf_name == "lm_head.weight" and tied:
            continue
        name = gguf_name(hf_name, arch)
        expected_names.add(name)
        t = got[name]
        w = p.detach().numpy().astype(np.float32)
        assert [int(n) for n in reversed(t.shape)] == list(w.shape), name

        is_norm_or_1d = w.ndim == 1 or name.endswith("_norm.weight")
        want_type = F32 if is_norm_or_1d else {"f32": F32, "f16": F16, "q8_0": Q8_0}[dtype]
        assert t.tensor_type == want_type, name

        val = file_values(t)
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_q.bias")):
            val = inverse_permute(val, n_head)
        if arch == "llama" and name.endswith(("attn_k.weight", "attn_k.bias")):
            val = inverse_permute(val, n_kv)
        if arch == "gemma3" and hf_name.endswith("norm.weight"):
            val = val - np.float32(1.0)       # the converter stores 1 + w
            assert name.endswith("_norm.weight")
            np.testing.assert_allclose(val, w, rtol=0, atol=1e-6)   # (w + 1) - 1 in f32
            continue
        if t.tensor_type == F32:
            np.testing.assert_array_equal(val, w, err_msg=name)
        elif t.tensor_type == F16:
            assert np.all(np.abs(val - w) <= F16_REL * np.abs(w) + F16_ABS), name
        else:
            blocks = w.reshape(-1, 32)
            amax = np.abs(blocks).max(axis=1, keepdims=True)
            err = np.abs(val.reshape(-1, 32) - blocks)
            assert np.all(err <= Q8_0_REL_OF_AMAX * amax), name
            assert err.max() > 0                             # it really is quantized

    extra = {"rope_freqs.weight"} if family == "llama-rope-llama3" else set()
    assert set(got) == expected_names | extra
    assert ("output.weight" in got) == (not tied)


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_types_are_bit_identical_to_gguf_quants(dtype, tmp_path):
    """The file holds exactly gguf.quants.quantize of the (converted) weights: the converter's
    own code path, so the bytes equal what convert_hf_to_gguf.py --outtype writes."""
    model, config = get_model("qwen3")
    r = gguf.GGUFReader(hf_gguf.write_gguf(model, config, tmp_path / "m.gguf", dtype=dtype))
    t = {t.name: t for t in r.tensors}["blk.1.ffn_down.weight"]
    w = model.state_dict()["model.layers.1.mlp.down_proj.weight"].numpy()
    qt = F16 if dtype == "f16" else Q8_0
    np.testing.assert_array_equal(np.asarray(t.data).view(np.uint8).reshape(-1),
                                  gguf.quants.quantize(w, qt).view(np.uint8).reshape(-1))


# expected metadata per family (values the tiny configs set; None = key must be absent)
def expected_keys(family, config):
    a = ARCH[family]
    hd = config.head_dim
    e = {
        f"{a}.block_count": config.num_hidden_layers,
        f"{a}.context_length": config.max_position_embeddings,
        f"{a}.embedding_length": 64,
        f"{a}.feed_forward_length": 128,
        f"{a}.attention.head_count": 4,
        f"{a}.attention.head_count_kv": 2,
        f"{a}.attention.key_length": hd,
        f"{a}.attention.value_length": hd,
        f"{a}.attention.layer_norm_rms_epsilon": config.rms_norm_eps,
        f"{a}.attention.sliding_window": None,
        f"{a}.final_logit_softcapping": None,
        f"{a}.rope.scaling.type": None,
        f"{a}.rope.freq_base_swa": None,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.bos_token_id": config.vocab_size - 1,
        "tokenizer.ggml.eos_token_id": config.vocab_size - 1,
        "tokenizer.ggml.add_bos_token": False,
        "general.quantization_version": 2,
    }
    if a == "llama":   # LlamaModel adds these two; Qwen/Gemma converters do not
        e[f"{a}.vocab_size"] = config.vocab_size
        e[f"{a}.rope.dimension_count"] = hd
    else:
        e[f"{a}.vocab_size"] = None
        e[f"{a}.rope.dimension_count"] = None
    theta = {"llama": 1e4, "mistral": 1e5, "qwen2": 1e6, "qwen3": 1e6, "gemma3": 1e6}.get(family, 1e4)
    e[f"{a}.rope.freq_base"] = theta
    if family == "gemma3":
        e[f"{a}.attention.sliding_window"] = 8
        e[f"{a}.rope.freq_base_swa"] = 1e4
    if family == "llama-rope-linear":
        e[f"{a}.rope.scaling.type"] = "linear"
        e[f"{a}.rope.scaling.factor"] = 2.0
    if family == "llama-rope-yarn":
        e[f"{a}.rope.scaling.type"] = "yarn"
        e[f"{a}.rope.scaling.factor"] = 4.0
        e[f"{a}.rope.scaling.original_context_length"] = 128
    return e


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_metadata_keys(family, dtype, tmp_path):
    model, config = get_model(family)
    r = gguf.GGUFReader(hf_gguf.write_gguf(model, config, tmp_path / "m.gguf", dtype=dtype))
    for key, want in expected_keys(family, config).items():
        got = kv(r, key)
        if want is None:
            assert got is None, key
        elif isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-7), key   # stored as f32
        else:
            assert got == want, key
    assert kv(r, "general.file_type") == {"f32": 0, "f16": 1, "q8_0": 7}[dtype]
    assert len(kv(r, "tokenizer.ggml.tokens")) == config.vocab_size
    assert len(kv(r, "tokenizer.ggml.token_type")) == config.vocab_size


def test_gemma3_softcapping_key_written_when_set(tmp_path):
    model, config = get_model("gemma3", final_logit_softcapping=30.0)
    r = gguf.GGUFReader(hf_gguf.write_gguf(model, config, tmp_path / "m.gguf"))
    assert kv(r, "gemma3.final_logit_softcapping") == pytest.approx(30.0)


def test_gemma3_window_is_crossed_and_one_layer_is_global():
    _, config = get_model("gemma3")
    assert config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]   # llama.cpp's pattern 6
    assert config.sliding_window == 8 < 20          # tests use sequences of ~20 tokens
    assert config.query_pre_attn_scalar == config.head_dim == 32


def test_llama3_rope_freqs_match_transformers(tmp_path):
    """llama.cpp divides each RoPE frequency by rope_freqs[i]; that must reproduce transformers'
    llama3 inv_freq (computed here by transformers itself)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model, config = get_model("llama-rope-llama3")
    r = gguf.GGUFReader(hf_gguf.write_gguf(model, config, tmp_path / "m.gguf"))
    t = {t.name: t for t in r.tensors}["rope_freqs.weight"]
    assert t.tensor_type == F32 and list(t.shape) == [8]
    factors = file_values(t)
    inv_llama3, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    base = 1e4 ** -(np.arange(0, 16, 2, dtype=np.float64) / 16)
    np.testing.assert_allclose(base / factors, inv_llama3.numpy(), rtol=1e-6)
    assert factors.min() == 1.0 and factors.max() == 8.0 and 1.0 < np.median(np.unique(factors)) <= 8.0


def rope_neox(x, pos, theta):
    """HF rotate-half RoPE on one head vector x [d]: dims i and i + d/2 rotate together."""
    d = x.shape[0]
    f = theta ** -(np.arange(0, d, 2) / d) * pos
    c, s = np.cos(f), np.sin(f)
    x1, x2 = x[: d // 2], x[d // 2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s])


def rope_norm(x, pos, theta):
    """llama.cpp LLAMA_ROPE_TYPE_NORM on one head vector: pairs (2i, 2i+1) rotate together."""
    d = x.shape[0]
    f = theta ** -(np.arange(0, d, 2) / d) * pos
    c, s = np.cos(f), np.sin(f)
    out = np.empty_like(x)
    out[0::2] = x[0::2] * c - x[1::2] * s
    out[1::2] = x[1::2] * c + x[0::2] * s
    return out


def test_llama_permute_turns_hf_rope_into_llamacpp_rope(tmp_path):
    """q·k after RoPE is the same whether computed HF-style from the HF weights or
    llama.cpp-style (pair rotation) from the permuted GGUF weights."""
    model, config = get_model("llama")
    r = gguf.GGUFReader(hf_gguf.write_gguf(model, config, tmp_path / "m.gguf"))
    got = {t.name: file_values(t) for t in r.tensors}
    sd = model.state_dict()
    x = np.random.default_rng(1).standard_normal(64)
    hd = 16
    for h, hk in [(0, 0), (3, 1)]:                       # GQA: q head 3 uses kv head 1
        q_hf = (sd["model.layers.0.self_attn.q_proj.weight"].numpy() @ x)[h * hd:(h + 1) * hd]
        k_hf = (sd["model.layers.0.self_attn.k_proj.weight"].numpy() @ x)[hk * hd:(hk + 1) * hd]
        q_gg = (got["blk.0.attn_q.weight"] @ x)[h * hd:(h + 1) * hd]
        k_gg = (got["blk.0.attn_k.weight"] @ x)[hk * hd:(hk + 1) * hd]
        assert not np.allclose(q_hf, q_gg)               # the rows really are reordered
        for pq, pk in [(5, 2), (17, 0), (40, 39)]:
            s_hf = rope_neox(q_hf, pq, 1e4) @ rope_neox(k_hf, pk, 1e4)
            s_gg = rope_norm(q_gg, pq, 1e4) @ rope_norm(k_gg, pk, 1e4)
            assert s_gg == pytest.approx(s_hf, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_roundtrip_model_holds_the_file_weights(dtype, tmp_path):
    model, config = get_model("llama")
    m2 = hf_gguf.roundtrip_model(model, config, dtype)
    r = gguf.GGUFReader(hf_gguf.write_gguf(model, config, tmp_path / "m.gguf", dtype=dtype))
    got = {t.name: file_values(t) for t in r.tensors}
    sd2 = m2.state_dict()
    np.testing.assert_array_equal(sd2["model.embed_tokens.weight"].numpy(), got["token_embd.weight"])
    np.testing.assert_array_equal(sd2["model.layers.2.self_attn.q_proj.weight"].numpy(),
                                  inverse_permute(got["blk.2.attn_q.weight"], 4))
    np.testing.assert_array_equal(sd2["model.layers.0.input_layernorm.weight"].numpy(),
                                  got["blk.0.attn_norm.weight"])
    assert not np.array_equal(sd2["lm_head.weight"].numpy(), model.state_dict()["lm_head.weight"].numpy())


def test_refuses_what_llamacpp_cannot_represent(tmp_path):
    _, c = hf_gguf.tiny_model("gemma3", query_pre_attn_scalar=64)
    m, _ = get_model("gemma3")
    with pytest.raises(ValueError, match="query_pre_attn_scalar"):
        hf_gguf.write_gguf(m, c, tmp_path / "a.gguf")
    m, c = hf_gguf.tiny_model("mistral", sliding_window=4)
    with pytest.raises(ValueError, match="sliding window"):
        hf_gguf.write_gguf(m, c, tmp_path / "b.gguf")
    with pytest.raises(ValueError, match="dtype"):
        hf_gguf.write_gguf(m, c, tmp_path / "c.gguf", dtype="q4_0")
    with pytest.raises(ValueError, match="unknown family"):
        hf_gguf.tiny_model("gpt2")


def test_same_seed_same_weights_other_seed_other_weights():
    a, _ = hf_gguf.tiny_model("qwen2", seed=3)
    b, _ = hf_gguf.tiny_model("qwen2", seed=3)
    c, _ = hf_gguf.tiny_model("qwen2", seed=4)
    wa, wb, wc = (m.state_dict()["model.layers.0.self_attn.q_proj.bias"] for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert math.isclose(float(wa.std()), hf_gguf.BIAS_STD, rel_tol=0.5)


def test_llamacpp_like_model_roundings():
    """The emulated ggml roundings used by tools/check_tiny_llamacpp.py."""
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(2)) * 3
    # f32 file, SiLU family: no rounding added, same logits as the HF model
    model, config = get_model("qwen3")
    ids = list(range(3, 15))
    np.testing.assert_array_equal(hf_gguf.hf_logits(hf_gguf.llamacpp_like_model(model, config, "f32"), ids),
                                  hf_gguf.hf_logits(model, ids))
    # q8_0 activations: per block of 32, integers |q| <= 127 times f16(amax/127); equal to gguf's
    # reference quantizer except where x*127/amax and x/(amax/127) straddle a rounding tie
    y = hf_gguf._round_act_q8_0(x).numpy()
    ref = gguf.quants.dequantize(gguf.quants.quantize(x.numpy(), Q8_0), Q8_0)
    d16 = (np.abs(x.numpy().reshape(-1, 32)).max(axis=1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    q = y.reshape(-1, 32) / d16
    np.testing.assert_array_equal(q, np.round(q))
    assert np.abs(q).max() == 127
    assert np.all(np.abs(y - ref).reshape(-1, 32) <= d16 * 1.0001)
    assert (y == ref).mean() > 0.99
    # f16 GELU table: output is f16-representable and close to the exact tanh-GELU
    g = hf_gguf.gelu_f16_table()(x)
    np.testing.assert_array_equal(g.numpy(), g.numpy().astype(np.float16).astype(np.float32))
    exact = torch.nn.functional.gelu(x, approximate="tanh")
    assert float((g - exact).abs().max()) <= 2 * F16_REL * float(x.abs().max())
