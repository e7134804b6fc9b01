"""Tiny random Mixture-of-Experts Hugging Face models (tests/hf_gguf.py: Mixtral as arch llama,
Qwen2-MoE, Qwen3-MoE, OLMoE) written to GGUF as llama.cpp's converter does and run by llmrt:
logits at every decisively routed position against transformers in float64, old per-expert
Mixtral files, cached decoding, a long streaming run, and broken files.

Routing and rounding: a position whose k-th and (k+1)-th router logits are nearly tied can pick
another expert under the file's rounding (F16 / Q8_0 weights, activations rounded for the
matmuls as ggml does), which changes its output by O(1) -- not an error of either side. So the
token ids come from hf_gguf.decisive_ids (router-logit gap >= IDS_MIN_GAP at every layer and
position of the f32 model) and positions are compared where hf_gguf.gap_mask keeps them
(router-logit gap of the file's weights >= hf_gguf.ROUTER_LOGIT_GAP_MIN[dtype], a few times the
measured rounding noise; see there). tools/check_tiny_llamacpp.py runs the same files through
llama.cpp: f32 within 9.4e-7 of transformers at every position, f16 within 9.8e-4 and q8_0
within 3.9e-2 of transformers float64 on the rounded weights (reproducing
hf_gguf.llamacpp_like_model to ~3e-7).
"""
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is a test extra (pip install -e .[test])")
pytest.importorskip("transformers", reason="transformers is a test extra (pip install -e .[test])")

import gguf  # noqa: E402

from hf_gguf import (MOE_FAMILIES, ROUTER_LOGIT_GAP_MIN, decisive_ids, gap_mask, hf_logits,  # noqa: E402
                     roundtrip_model, router_gaps, tiny_model, write_gguf)

from llmrt import Model  # noqa: E402
from llmrt.errors import ModelFormatError  # noqa: E402

FAMILIES = list(MOE_FAMILIES)
DTYPES = ["f32", "f16", "q8_0"]

# Relative error = max |llmrt - transformers| / max |transformers| over the compared positions
# (all vocab), transformers in float64 on the weights as the file holds them (roundtrip_model).
TOL = {
    # f32 summation order only: llama.cpp is within 9.4e-7 on these files (the dense families'
    # TOL_F32 in test_models_hf.py is the same 1e-4)
    "f32": 1e-4,
    # F16 weights: activations rounded to f16 for the matmuls as ggml does; llama.cpp 3.5e-4 ..
    # 9.8e-4, hf_gguf.llamacpp_like_model 3.4e-4 .. 1.4e-3 over 10 id sequences x 4 families
    "f16": 3e-3,
    # Q8_0 weights: activations quantized to 8 bits per block of 32 for every matmul (experts
    # included), ~0.5% per dot product over 2-3 layers. Measured on decisive ids: llama.cpp
    # 1.3e-2 .. 3.9e-2 (qwen3moe the largest: top-4 of 8 experts, tied Q8_0 output);
    # llamacpp_like_model over 10 id sequences: <= 2.2e-2 for mixtral/qwen2moe/olmoe, 2.2e-2 ..
    # 4.2e-2 for qwen3moe. 6e-2 leaves 1.4x over the largest.
    "q8_0": 6e-2,
}
# Q8_0: the argmax must still agree almost everywhere (as in test_models_hf.py)
MIN_ARGMAX_AGREE_Q8_0 = 0.9
# decisive_ids' router-logit gap on the f32 model; the masks' thresholds are <= 0.3, so after
# weight rounding nearly every position stays compared
IDS_MIN_GAP = 0.5
# the masks must keep most positions (they keep all of them on the current seeds)
MIN_KEPT = 0.75
# old per-expert Mixtral tensors vs merged: the same numbers in another layout
TOL_SPLIT = 1e-6
# cached decoding vs one uncached pass of the same weights: same arithmetic per row, up to the
# order of f32 sums inside attention
TOL_CACHED = 1e-5

N_TOKENS = 40


def _rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.fixture(scope="module", autouse=True)
def _torch_one_thread():
    # the tiny float64 forward passes run many times slower on 2 threads of a loaded machine
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """(family, dtype) -> namespace(path, ids, ref, keep, model, config, dir), built once per
    module: ref = transformers float64 logits on the file's weights, keep = gap_mask."""
    models = {}
    cache = {}

    def get(family, dtype):
        if family not in models:
            model, config = tiny_model(family, seed=0)
            ids = decisive_ids(model, N_TOKENS, seed=1, min_gap=IDS_MIN_GAP)
            models[family] = (model, config, ids, tmp_path_factory.mktemp(family))
        key = (family, dtype)
        if key not in cache:
            model, config, ids, d = models[family]
            ref_model = model if dtype == "f32" else roundtrip_model(model, config, dtype)
            path = write_gguf(model, config, d / f"{dtype}.gguf", dtype=dtype, family=family)
            keep = gap_mask(router_gaps(ref_model, ids, kind="logit"), ROUTER_LOGIT_GAP_MIN[dtype])
            cache[key] = types.SimpleNamespace(path=path, ids=ids, ref=hf_logits(ref_model, ids, float64=True),
                                               keep=keep, model=model, config=config, dir=d)
        return cache[key]
    return get


# ---------------------------------------------------------------------------------------------
# the files themselves (no llmrt): names, ggml shapes, types and values as the converter writes
# ---------------------------------------------------------------------------------------------

def _kv(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_moe_layout(moe, family, dtype):
    t = moe(family, dtype)
    cfg = t.config
    r = gguf.GGUFReader(t.path)
    arch = _kv(r, "general.architecture")
    assert arch == {"mixtral": "llama"}.get(family, family)
    n_expert = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    n_used = cfg.num_experts_per_tok
    n_ff = cfg.intermediate_size if family in ("mixtral", "olmoe") else cfg.moe_intermediate_size
    n_embd = cfg.hidden_size
    assert _kv(r, f"{arch}.expert_count") == n_expert
    assert _kv(r, f"{arch}.expert_used_count") == n_used
    if family in ("qwen2moe", "qwen3moe"):
        assert _kv(r, f"{arch}.expert_feed_forward_length") == n_ff
    assert _kv(r, f"{arch}.expert_shared_feed_forward_length") == (
        cfg.shared_expert_intermediate_size if family == "qwen2moe" else None)
    tensors = {x.name: x for x in r.tensors}
    q = gguf.GGMLQuantizationType.Q8_0 if dtype == "q8_0" else gguf.GGMLQuantizationType.F32
    F32 = gguf.GGMLQuantizationType.F32
    for il in range(cfg.num_hidden_layers):
        expect = {  # name: (ggml shape ne, type)
            "ffn_gate_inp": ([n_embd, n_expert], F32),
            "ffn_gate_exps": ([n_embd, n_ff, n_expert], q),
            "ffn_up_exps": ([n_embd, n_ff, n_expert], q),
            "ffn_down_exps": ([n_ff, n_embd, n_expert], q),
        }
        if family == "qwen2moe":
            n_sh = cfg.shared_expert_intermediate_size
            expect.update({"ffn_gate_inp_shexp": ([n_embd, 1], F32), "ffn_gate_shexp": ([n_embd, n_sh], q),
                           "ffn_up_shexp": ([n_embd, n_sh], q), "ffn_down_shexp": ([n_sh, n_embd], q)})
        if family in ("qwen3moe", "olmoe"):
            nq = cfg.head_dim if family == "qwen3moe" else cfg.num_attention_heads * cfg.head_dim
            nk = cfg.head_dim if family == "qwen3moe" else cfg.num_key_value_heads * cfg.head_dim
            expect.update({"attn_q_norm": ([nq], F32), "attn_k_norm": ([nk], F32)})
        for name, (shape, qt) in expect.items():
            x = tensors[f"blk.{il}.{name}.weight"]
            assert [int(n) for n in x.shape] == shape, name
            assert x.tensor_type == qt, name
        assert f"blk.{il}.ffn_gate.weight" not in tensors
    if dtype == "f32":
        # values: gate = first half of transformers' fused gate_up_proj rows, up = second half
        experts = t.model.model.layers[0].mlp.experts
        gu = experts.gate_up_proj.detach().numpy()
        np.testing.assert_array_equal(np.asarray(tensors["blk.0.ffn_gate_exps.weight"].data), gu[:, :n_ff])
        np.testing.assert_array_equal(np.asarray(tensors["blk.0.ffn_up_exps.weight"].data), gu[:, n_ff:])
        np.testing.assert_array_equal(np.asarray(tensors["blk.0.ffn_down_exps.weight"].data),
                                      experts.down_proj.detach().numpy())
        np.testing.assert_array_equal(np.asarray(tensors["blk.0.ffn_gate_inp.weight"].data),
                                      t.model.model.layers[0].mlp.gate.weight.detach().numpy())


def test_gguf_mixtral_split_experts_layout(moe, tmp_path):
    t = moe("mixtral", "f32")
    cfg = t.config
    path = write_gguf(t.model, cfg, tmp_path / "split.gguf", dtype="f32", family="mixtral", split_experts=True)
    tensors = {x.name: x for x in gguf.GGUFReader(path).tensors}
    merged = {x.name: x for x in gguf.GGUFReader(t.path).tensors}
    n_ff, n_embd = cfg.intermediate_size, cfg.hidden_size
    assert not any(n.endswith("_exps.weight") for n in tensors)
    for il in range(cfg.num_hidden_layers):
        for e in range(cfg.num_local_experts):
            for kind, shape in (("ffn_gate", [n_embd, n_ff]), ("ffn_up", [n_embd, n_ff]), ("ffn_down", [n_ff, n_embd])):
                x = tensors[f"blk.{il}.{kind}.{e}.weight"]
                assert [int(n) for n in x.shape] == shape
                whole = np.asarray(merged[f"blk.{il}.{kind}_exps.weight"].data)
                np.testing.assert_array_equal(np.asarray(x.data), whole[e])


# ---------------------------------------------------------------------------------------------
# llmrt against transformers
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(moe, family, dtype):
    t = moe(family, dtype)
    ours = Model(t.path, n_threads=2, ctx_size=64, kv_dtype="f32")(t.ids)
    assert ours.shape == t.ref.shape and ours.dtype == np.float32
    n = len(t.ids)
    print(f"{family} {dtype}: {n - int(t.keep.sum())} of {n} positions masked "
          f"(router-logit gap < {ROUTER_LOGIT_GAP_MIN[dtype]})")
    assert t.keep.mean() >= MIN_KEPT
    assert _rel_err(ours[t.keep], t.ref[t.keep]) <= TOL[dtype]
    if dtype == "q8_0":
        assert np.mean(ours[t.keep].argmax(-1) == t.ref[t.keep].argmax(-1)) >= MIN_ARGMAX_AGREE_Q8_0


def test_mixtral_split_experts_same_logits(moe, tmp_path):
    """Old Mixtral GGUFs: one 2-D tensor per expert (blk.N.ffn_gate.E.weight ...)."""
    t = moe("mixtral", "f32")
    split = write_gguf(t.model, t.config, tmp_path / "split.gguf", dtype="f32", family="mixtral",
                       split_experts=True)
    merged = Model(t.path, n_threads=2, ctx_size=64, kv_dtype="f32")(t.ids)
    ours = Model(split, n_threads=2, ctx_size=64, kv_dtype="f32")(t.ids)
    assert _rel_err(ours, merged) <= TOL_SPLIT


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_then_decode_equals_uncached(moe, family):
    t = moe(family, "f32")
    model = Model(t.path, n_threads=2, ctx_size=64, kv_dtype="f32")
    full = model(t.ids)
    sess = model.new_session(ctx_size=64)
    sess.eval(t.ids[:-1])
    last = sess.eval(t.ids[-1:])
    np.testing.assert_allclose(last, full[-1], rtol=0, atol=TOL_CACHED * np.abs(full).max())
    assert sess.n_past == len(t.ids)


def test_streaming_cache_long_run(moe):
    """~2000 tokens through a 32-cell streaming cache (4 sinks, 8 evicted at a time), a few
    tokens per batch: every logits vector finite, many evictions."""
    t = moe("qwen3moe", "q8_0")
    model = Model(t.path, n_threads=2, ctx_size=32)
    sess = model.new_session(ctx_size=32, n_keep=4, n_discard=8)
    rng = np.random.default_rng(7)
    n_vocab = t.config.vocab_size
    fed = 0
    while fed < 2000:
        batch = rng.integers(0, n_vocab - 1, size=int(rng.integers(1, 6))).tolist()
        out = sess.eval(batch, all_logits=True)
        assert out.shape == (len(batch), n_vocab)
        assert np.isfinite(out).all(), f"non-finite logits after {fed} tokens"
        fed += len(batch)
    assert sess.n_past <= 32
    assert sess.n_shifts > 50


# ---------------------------------------------------------------------------------------------
# broken files
# ---------------------------------------------------------------------------------------------

def _fuse_gate_up(tensors):
    """ffn_gate_exps + ffn_up_exps -> one ffn_gate_up_exps (the converter's --fuse-gate-up-exps
    layout, which llama.cpp's qwen2moe does not load either)."""
    d = dict(tensors)
    out = []
    for name, a in tensors:
        if name.endswith(".ffn_gate_exps.weight"):
            up = d[name.replace("ffn_gate_exps", "ffn_up_exps")]
            out.append((name.replace("ffn_gate_exps", "ffn_gate_up_exps"), np.concatenate([a, up], axis=1)))
        elif not name.endswith(".ffn_up_exps.weight"):
            out.append((name, a))
    return out


def _drop_last_expert(tensors):
    return [(n, a[:-1] if n == "blk.1.ffn_down_exps.weight" else a) for n, a in tensors]


@pytest.mark.parametrize("edit_tensors,edit_kv,match", [
    pytest.param(_fuse_gate_up, None, r"ffn_(gate_up|gate|up)_exps", id="fused-gate-up-only"),
    pytest.param(None, lambda w: w.add_expert_used_count(5), r"(?i)expert.?used", id="used-5-of-4-experts"),
    pytest.param(_drop_last_expert, None, r"blk\.1\.ffn_down_exps", id="down-exps-3-of-4-experts"),
])
def test_broken_moe_file_is_a_format_error(moe, tmp_path, edit_tensors, edit_kv, match):
    t = moe("qwen2moe", "f32")
    path = write_gguf(t.model, t.config, tmp_path / "broken.gguf", dtype="f32", family="qwen2moe",
                      edit_tensors=edit_tensors, edit_kv=edit_kv)
    with pytest.raises(ModelFormatError, match=match):   # at load (Model._check_graph), not at the first eval
        Model(path, n_threads=1, ctx_size=32)


def _flatten_gate_exps(tensors):
    return [(n, a.reshape(-1) if n == "blk.0.ffn_gate_exps.weight" else a) for n, a in tensors]


@pytest.mark.parametrize("split,edit_tensors,edit_kv,match", [
    # Mixtral has no expert_feed_forward_length: the expert size is read from this tensor's shape
    pytest.param(False, _flatten_gate_exps, None, r"blk\.0\.ffn_gate_exps\.weight has shape \(\d+,\)", id="1-d-exps"),
    # an absurd expert count against 4 per-expert tensors: an error, not a 300M-entry list
    pytest.param(True, None, lambda w: w.add_expert_count(300_000_000), r"experts \[0, 1, 2, 3\], expected 0\.\.299999999",
                 id="split-experts-count"),
])
def test_broken_mixtral_file_is_a_format_error(moe, tmp_path, split, edit_tensors, edit_kv, match):
    t = moe("mixtral", "f32")
    path = write_gguf(t.model, t.config, tmp_path / "broken.gguf", dtype="f32", split_experts=split,
                      edit_tensors=edit_tensors, edit_kv=edit_kv)
    with pytest.raises(ModelFormatError, match=match):
        Model(path, n_threads=1, ctx_size=32)
