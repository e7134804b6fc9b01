"""The calibration pass of int4 quantization at load (llmrt/imatrix.py).

- the eager numpy evaluation of a family's graph builder gives the runtime's logits (tiny HF
  models of every family llmrt builds, random weights): the activations it measures are the
  model's;
- E[a^2] per matmul input: shapes, positivity, and equal to a direct numpy computation for the
  first layer's q/k/v input;
- int4 at load with the default rounding runs the pass and changes the blocks vs the unweighted
  search; rounding="search" skips it.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from llmrt import imatrix, wquant
from llmrt.model import Model

sys.path.insert(0, os.path.dirname(__file__))

# max |eager logits - runtime logits| / max |logit| (f32 weights, f32 KV cache; the eager pass is
# f32/f64 numpy in other summation orders): measured 4e-7..7e-7 (llama, qwen2, qwen3, linear
# RoPE), 4.3e-4 on gemma3 (the runtime's GELU is ggml's f16 table, the eager pass the tanh
# formula); bound ~25x the largest. A wrong op (RoPE pairs, window, GQA) gives O(1).
EAGER_RTOL = 1e-2

FAMILIES = ["llama", "qwen2", "qwen3", "gemma3", "llama-rope-linear"]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hf_gguf import tiny_model, write_gguf
    d = tmp_path_factory.mktemp("imatrix")
    out = {}
    for fam in FAMILIES:
        model, config = tiny_model(fam, seed=3)
        out[fam] = str(write_gguf(model, config, d / f"{fam}.gguf", dtype="f32"))
    return out


IDS = [1, 5, 9, 33, 100, 7, 250, 3, 64, 17, 2, 11, 40, 41, 42, 8]


@pytest.mark.parametrize("family", FAMILIES)
def test_eager_pass_matches_runtime(tiny_models, family):
    m = Model(tiny_models[family], n_threads=2, ctx_size=64, kv_dtype="f32")
    ref = m(IDS)
    g = imatrix._Eager(IDS, skip=())
    m.family.build_graph(g, m.hparams, imatrix._Weights(m.gguf), None, True)
    err = np.abs(g.output - ref).max() / np.abs(ref).max()
    assert err < EAGER_RTOL, err
    assert (g.output.argmax(1) == ref.argmax(1)).all()


def test_calibrate_importance(tiny_models):
    m = Model(tiny_models["llama"], n_threads=2, ctx_size=64)
    head = wquant.output_weight_name(m.gguf.tensors)
    imp = imatrix.calibrate(m.gguf, m.family, m.hparams, IDS, skip={head}, progress=False)
    names = set(wquant.matmul_weight_names(m.gguf.tensors))
    assert set(imp) == names                      # every matmul input, the head's too
    for n, v in imp.items():
        assert v.dtype == np.float32 and v.shape == (m.gguf.tensors[n].shape[0],)
        assert np.isfinite(v).all() and (v >= 0).all() and v.max() > 0
    # layer 0's q/k/v input: rms_norm(token_embd[ids]) * attn_norm, squared, mean over tokens
    emb = wquant.rows_f32(m.gguf.tensors["token_embd.weight"].data, 0)[IDS].astype(np.float64)
    gam = wquant.rows_f32(m.gguf.tensors["blk.0.attn_norm.weight"].data, 0).astype(np.float64)
    h = emb / np.sqrt((emb ** 2).mean(1, keepdims=True) + m.hparams.norm_eps) * gam
    want = (h ** 2).mean(0)
    for n in ("attn_q", "attn_k", "attn_v"):
        np.testing.assert_allclose(imp[f"blk.0.{n}.weight"], want, rtol=1e-5)


def test_calibration_text_is_not_the_evaluation_text():
    with open(imatrix.CALIB_TEXT, encoding="utf-8") as fh:
        calib = fh.read()
    with open(os.path.join(os.path.dirname(__file__), "data", "ppl_text.txt"), encoding="utf-8") as fh:
        ev = fh.read()
    assert len(calib) > 2000
    lines = [ln.strip() for ln in calib.splitlines() if len(ln.strip()) > 30]
    assert not any(ln in ev for ln in lines)


def test_int4_default_runs_the_calibration_pass(tiny_models, caplog):
    path = tiny_models["llama"]
    with caplog.at_level("INFO", logger="llmrt"):
        a = Model(path, n_threads=2, ctx_size=64, weight_dtype="int4", scheme="asym")
    assert a.wq.rounding == "imatrix"
    assert any("calibration pass" in r.getMessage() for r in caplog.records)
    assert "imatrix rounding" in a.wq_summary
    b = Model(path, n_threads=2, ctx_size=64, weight_dtype="int4", scheme="asym", rounding="search")
    n = "blk.1.ffn_down.weight"
    assert a._replaced[n][1] == b._replaced[n][1]          # same Q4_1 blocks type
    assert not np.array_equal(a._replaced[n][0], b._replaced[n][0])
    # the head stays int8 min/max either way (the pass never weights it)
    np.testing.assert_array_equal(a._replaced["output.weight"][0], b._replaced["output.weight"][0])
