"""Everything else on MoE models (tests/test_moe_hf.py checks the logits against transformers):
weight-only quantization at load (experts quantized per expert, the router kept), an old
Mixtral file's per-expert tensors, the decode bandwidth bound counting only the chosen experts,
and the CLI (`info`, `generate`, `perplexity`, `bench --profile`) on a MoE file."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("torch", reason="torch is a test extra (pip install -e .[test])")
pytest.importorskip("transformers", reason="transformers is a test extra (pip install -e .[test])")

from hf_gguf import tiny_model, write_gguf  # noqa: E402

from llmrt import Model, _core  # noqa: E402
from llmrt.bench import weight_bytes_per_token  # noqa: E402
from llmrt.cli import main  # noqa: E402

IDS = [1, 5, 9, 33, 100, 7, 250, 3, 64, 17, 2, 200, 11, 40]
# Weight-only quantization at load of the tiny MoE models vs their F32 logits (max |diff| /
# max |logit|): as the dense tiny llama of test_wquant.py (int8 0.010-0.023, int4 0.17-0.21),
# plus the tokens whose experts change when a router input moves: measured int8 0.012-0.023,
# int4 0.24-0.35 (mixtral, qwen3moe); the dense bounds of test_wquant.py hold.
LOGIT_RTOL = {"int8": 0.05, "int4": 0.45}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe_model")
    out = {}
    for fam in ("mixtral", "qwen3moe", "qwen2moe"):
        m, c = tiny_model(fam, seed=0)
        out[fam] = str(write_gguf(m, c, d / f"{fam}.gguf", dtype="f32"))
    m, c = tiny_model("mixtral", seed=0)
    out["mixtral-split"] = str(write_gguf(m, c, d / "mixtral-split.gguf", dtype="f32", split_experts=True))
    return out


@pytest.mark.parametrize("fam", ["mixtral", "qwen3moe", "qwen2moe"])
@pytest.mark.parametrize("weight_dtype", ["int8", "int4"])
def test_quantized_at_load(files, fam, weight_dtype):
    ref = Model(files[fam], n_threads=2, ctx_size=64)(IDS)
    m = Model(files[fam], n_threads=2, ctx_size=64, weight_dtype=weight_dtype)
    hp = m.hparams
    e = m._replaced["blk.0.ffn_gate_exps.weight"]                  # experts: 3-D, quantized
    assert e[1] == m.wq.type_id and tuple(e[2]) == (hp.n_embd, hp.n_ff_exp, hp.n_expert)
    assert not any("ffn_gate_inp" in n for n in m._replaced)       # routers stay F32
    err = np.abs(m(IDS) - ref).max() / np.abs(ref).max()
    assert 0 < err < LOGIT_RTOL[weight_dtype]


@pytest.mark.parametrize("weight_dtype", [None, "int8", "int4"])
def test_split_expert_file_equals_merged(files, weight_dtype):
    """An old Mixtral file (ffn_gate.E.weight per expert) runs as the merged one, quantized at
    load too (the per-expert tensors quantized, then merged; calibration per expert)."""
    kw = {} if weight_dtype is None else {"weight_dtype": weight_dtype}
    a = Model(files["mixtral"], n_threads=2, ctx_size=64, **kw)(IDS)
    b = Model(files["mixtral-split"], n_threads=2, ctx_size=64, **kw)(IDS)
    np.testing.assert_array_equal(a, b)


def test_bandwidth_bound_counts_chosen_experts(files):
    m = Model(files["qwen3moe"], n_threads=1, ctx_size=64)
    hp = m.hparams
    t = m.gguf.tensors
    experts = sum(t[f"blk.{i}.ffn_{p}_exps.weight"].nbytes for i in range(hp.n_layer) for p in ("gate", "up", "down"))
    rest = sum(x.nbytes for n, x in t.items() if "_exps." not in n and n != "token_embd.weight")
    if "output.weight" not in t:                       # tied: the output matrix is read whole
        rest += t["token_embd.weight"].nbytes
    assert weight_bytes_per_token(m) == int(rest + experts * hp.n_expert_used / hp.n_expert)
    s = Model(files["mixtral-split"], n_threads=1, ctx_size=64)
    assert weight_bytes_per_token(s) == weight_bytes_per_token(Model(files["mixtral"], n_threads=1, ctx_size=64))


def _cli(*args):
    before = _core.isa_current()
    try:
        return CliRunner().invoke(main, list(args), catch_exceptions=False)
    finally:
        _core.set_isa(before)


def test_cli_on_a_moe_model(files, tmp_path):
    r = _cli("info", files["qwen2moe"])
    assert r.exit_code == 0, r.output
    m = Model(files["qwen2moe"], n_threads=1, ctx_size=64)
    hp = m.hparams
    assert (f"experts: {hp.n_expert}, {hp.n_expert_used} used per token, a shared expert "
            f"(ffn {hp.n_ff_shexp})") in r.output

    r = _cli("generate", files["qwen3moe"], "-p", "abc", "-n", "40", "--temp", "0", "-c", "16",
             "--ignore-eos", "-t", "2")
    assert r.exit_code == 0, r.output

    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 20)
    r = _cli("perplexity", files["mixtral"], "-f", str(text), "-c", "64", "--json", "-t", "2")
    assert r.exit_code == 0, r.output
    ppl = json.loads(r.output.strip().splitlines()[-1])["ppl"]
    assert np.isfinite(ppl) and ppl > 1

    r = _cli("bench", files["qwen3moe"], "-p", "32", "-n", "4", "-r", "1", "--profile", "-t", "2",
             "--no-bandwidth", "-o", "json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.output.strip().splitlines()[-1])
    for test in res:                                   # the experts' matmuls are their own rows
        ops = {(d["op"], d["type"]) for d in test["profile"]}
        assert ("mul_mat_id", "F32") in ops and ("moe_route", "") in ops
