"""The AMX path inside MUL_MAT, end to end, on machines without AMX: with the software tile model
switched on (amx_set_matmul("model")), a model's prefill matmuls of Q8_0 / Q4_1 weights run
through llmrt_amx_gemm_int8 on AMX-packed copies made at load, and the logits agree with the
default (AVX2 / generic) path to f32 rounding; F32 / F16 / BF16 weights run through
llmrt_amx_gemm_bf16 (bf16 tiles, activations rounded to bf16), BF16 to f32 rounding of the
default path (which rounds the activations to bf16 too), F32 / F16 to bf16 rounding of their
weights. Decode-sized runs (< 16 tokens) keep the default kernels. tests/test_amx.py checks the
tile layer and the GEMMs themselves bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from hf_gguf import tiny_model, write_gguf
from llmrt import _core
from llmrt.model import Model

# The AMX GEMM sums whole 32-block integer dots with fmaf (amx.h), the AVX2 kernels sum per-lane
# partial products: the two orders differ by f32 rounding (~1e-7 relative) per matmul. Most
# positions' logits stay that close (measured <= 1e-7 of the logits' scale): TYPICAL_RTOL. But the
# next matmul requantizes its input to int8, and a value that sits at a rounding midpoint of
# x / d can flip by one step of d (1/127 of its block's max) on a 1e-7 change: that position's
# logits then move by up to ~1e-2 of their scale (measured 1.5e-2 at one of 24 positions for
# Q4_1): FLIP_RTOL bounds it; a wrong GEMM moves every position by far more.
TYPICAL_RTOL = 1e-5
FLIP_RTOL = 5e-2
# F32 / F16 weights on bf16 tiles: weights and activations rounded to bf16 (unit roundoff
# u = 2^-9 ~ 2e-3) in each of the 15 matmuls of a 2-layer model: a matmul's output moves by ~2u of
# its scale (two rounded operands per product, random signs), independent across matmuls, so
# ~sqrt(15) * 2u ~ 1.5e-2 of the logits' scale at worst; measured 3e-3 .. 6.6e-3 (3 seeds). A
# wrong tile layout or a missed token block moves the logits by their own scale.
BF16_WEIGHT_RTOL = 2.5e-2
N_TOKENS = 24                       # >= LLMRT_AMX_MIN_TOKENS (16): prefill takes the AMX path
N_TOKENS_BF16 = 40                  # float weights: > 32, two token blocks (MM_AMX_TOKENS)


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory):
    from llmrt.quantize import quantize_file

    d = tmp_path_factory.mktemp("amx_mm")
    model, config = tiny_model("llama", num_hidden_layers=2)
    q8 = write_gguf(model, config, d / "tiny-q8_0.gguf", "q8_0")
    f32 = write_gguf(model, config, d / "tiny-f32.gguf", "f32")
    f16 = write_gguf(model, config, d / "tiny-f16.gguf", "f16")
    bf16 = write_gguf(model, config, d / "tiny-bf16.gguf", "bf16")
    quantize_file(str(f32), str(d / "tiny-q4_1.gguf"), "q4_1", n_threads=1)
    return {"q8_0": str(q8), "q4_1": str(d / "tiny-q4_1.gguf"), "f32": str(f32), "f16": str(f16),
            "bf16": str(bf16)}


def _logits(path, ids):
    return Model(path, n_threads=2, ctx_size=64)(ids)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_1", "bf16", "f16", "f32"])
def test_prefill_on_the_amx_model_matches_the_default_path(tiny_paths, qtype, rng):
    path = tiny_paths[qtype]
    before = _core.amx_matmul()
    _core.amx_set_matmul(None)
    try:
        ids = rng.integers(0, 200, N_TOKENS if qtype.startswith("q") else N_TOKENS_BF16).tolist()
        ref = _logits(path, ids)
        _core.amx_set_matmul("model")
        calls = _core.amx_matmul_calls()
        got = _logits(path, ids)
        n_amx = _core.amx_matmul_calls() - calls
    finally:
        _core.amx_set_matmul(before)
    assert n_amx >= 2 * 7              # q, k, v, o, gate, up, down in each of the 2 layers
    row_err = np.abs(got - ref).max(axis=1) / np.abs(ref).max()
    if qtype in ("f16", "f32"):        # their weights rounded to bf16 on the tile path
        assert row_err.max() <= BF16_WEIGHT_RTOL, f"{qtype}: max row error {row_err.max():.2e}"
        assert row_err.max() > 0       # (the tiles did round: not the default path in disguise)
        return
    assert np.median(row_err) <= TYPICAL_RTOL, f"{qtype}: median row error {np.median(row_err):.2e}"
    assert row_err.max() <= FLIP_RTOL, f"{qtype}: max row error {row_err.max():.2e}"


def test_decode_sized_runs_keep_the_default_kernels(tiny_paths, amx_model_backend, rng):
    m = Model(tiny_paths["q8_0"], n_threads=2, ctx_size=64)
    sess = m.new_session(ctx_size=64, kv_mode="none")
    calls = _core.amx_matmul_calls()
    sess.eval(rng.integers(0, 200, 8).tolist())       # < 16 tokens
    sess.eval([5])
    assert _core.amx_matmul_calls() == calls
    sess.eval(rng.integers(0, 200, 20).tolist())      # >= 16 tokens
    assert _core.amx_matmul_calls() > calls


def test_switch_values():
    before = _core.amx_matmul()
    try:
        assert _core.amx_set_matmul(None) is None
        assert _core.amx_set_matmul("model") == "model"
        hw = _core.amx_set_matmul("hw")               # refused (off) where AMX is not granted
        assert hw == ("hw" if _core.amx_hw_available()[0] else None)
        with pytest.raises(ValueError):
            _core.amx_set_matmul("fast")
    finally:
        _core.amx_set_matmul(before)
