"""`llmrt info`: CPU features, ISA levels and kernel names; a model's summary; one-line errors."""
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, quants

from llmrt import _core
from llmrt.cli import main
from test_gguf import model_path


@pytest.fixture(autouse=True)
def restore_isa():
    """`info` re-initializes the kernel table from LLMRT_ISA; put back what other tests use."""
    before = _core.isa_current()
    yield
    _core.set_isa(before)


def run(*args, env=None):
    r = CliRunner().invoke(main, ["info", *args], env=env or {"LLMRT_ISA": None})
    return r


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    w = GGUFWriter(str(path), arch="qwen2")
    w.add_name("tiny-qwen")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "c"])
    w.add_chat_template("{{ messages }}")
    w.add_tensor("token_embd.weight", np.zeros((3, 64), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight",
                 quants.quantize(np.ones((64, 64), dtype=np.float32), T.Q8_0), raw_dtype=T.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_info_cpu():
    r = run()
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert f"isa max: {_core.isa_max_supported()}\n" in out
    assert f"isa in use: {_core.isa_current()}\n" in out
    feats = [k for k, v in _core.cpu_features().items() if v]
    assert all(k in out for k in feats)
    kn = _core.kernel_names()
    rows = {ln.split()[0]: ln.split()[1:] for ln in out.split("kernels:")[1].splitlines()[1:]}
    assert rows.pop("type") == list(kn)
    assert set(rows) == {t for per_type in kn.values() for t in per_type}
    for col, (table, per_type) in enumerate(kn.items()):
        for tname, cells in rows.items():   # each type's row names the kernel of each table
            assert cells[col] == per_type.get(tname, "-"), (table, tname)


def test_info_isa_env():
    r = run(env={"LLMRT_ISA": "generic"})
    assert r.exit_code == 0, r.output
    assert "isa in use: generic (LLMRT_ISA=generic)" in r.stdout
    assert all(k.endswith("_generic") for t in _core.kernel_names().values() for k in t.values())
    r = run(env={"LLMRT_ISA": "bogus"})
    assert r.exit_code == 0 and "'bogus' is not a known level" in r.stdout
    if _core.isa_max_supported() != "amx":
        r = run(env={"LLMRT_ISA": "amx"})
        assert f"isa in use: {_core.isa_max_supported()} (LLMRT_ISA=amx asks for amx" in r.stdout


def test_info_model(tiny):
    r = run(str(tiny))
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "  architecture: qwen2\n" in out and "  name: tiny-qwen\n" in out
    assert "    block_count = 2\n" in out and "    embedding_length = 64\n" in out
    assert "F32 x1" in out and "Q8_0 x1" in out
    assert f"params: 0.0 M ({3 * 64 + 64 * 64})" in out
    assert "tokenizer: gpt2, vocab 3, chat template: yes" in out


@pytest.mark.slow
def test_info_real_model():
    p = model_path("gemma-3-270m-q4_k_m.gguf")
    r = run(str(p))
    assert r.exit_code == 0, r.output
    assert "  architecture: gemma3\n" in r.stdout and "    block_count = 18\n" in r.stdout
    assert "vocab 262144" in r.stdout and "Q4_K x" in r.stdout


def _one_error_line(r):
    assert r.exit_code == 1, r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output
    assert r.stdout == ""   # the model is parsed before anything is printed
    return lines[0]


def test_info_corrupt(tiny, tmp_path):
    data = Path(tiny).read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[:100])
    line = _one_error_line(run(str(bad)))
    assert "bad.gguf" in line and "truncated" in line


def test_info_errors(tmp_path):
    assert "no such file" in _one_error_line(run(str(tmp_path / "nope.gguf")))
    assert "directory" in _one_error_line(run(str(tmp_path)))
    z = tmp_path / "model.safetensors"
    z.write_bytes((20).to_bytes(8, "little") + b'{"__metadata__":{}}')
    assert "safetensors" in _one_error_line(run(str(z)))
