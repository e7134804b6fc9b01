"""The weight-only quantization flags on the CLI, and `llmrt quantize` (llmrt/quantize.py):
the file it writes is read back by llmrt's reader and by gguf.GGUFReader with llama-quantize's
type choices, keys copied, errors leave nothing behind, and (slow) its q4_0 of an F16 SmolLM2 is
tensor for tensor llama.cpp's own q4_0 (tests/data/quantize_ref.json, tools/llamacpp_quantize_ref.py).
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

import llmrt.model
from fake_lm import FakeModel
from llmrt import quants
from llmrt.cli import main
from llmrt.gguf import GGUFFile
from llmrt.model import Model

HERE = os.path.dirname(__file__)


def run(args, input=None):
    return CliRunner().invoke(main, args, input=input, catch_exceptions=False)


# ---- flags on the commands that load a model ----------------------------------------------------

@pytest.fixture
def models(monkeypatch):
    made = []

    class M(FakeModel):
        def __init__(self, path, **kw):
            super().__init__(path, reply="ok", **{k: v for k, v in kw.items()
                                                  if k in ("n_threads", "ctx_size")})
            self.kw = kw
            made.append(self)

    monkeypatch.setattr(llmrt.model, "Model", M)
    return made


@pytest.fixture
def fake_gguf(tmp_path):
    p = tmp_path / "fake.gguf"
    p.write_bytes(b"GGUF")
    return str(p)


@pytest.mark.parametrize("cmd", [["generate", "-p", "Hi", "-n", "2", "--temp", "0"],
                                 ["chat", "--temp", "0"]])
def test_wq_flags_reach_the_model(models, fake_gguf, cmd):
    args = [cmd[0], fake_gguf, *cmd[1:], "--weight-dtype", "int8", "--group-size", "-1",
            "--scheme", "asym", "--compute-dtype", "bf16"]
    r = run(args, input="Hello\n")
    assert r.exit_code == 0, r.output
    kw = models[0].kw
    assert (kw["weight_dtype"], kw["group_size"], kw["scheme"], kw["compute_dtype"]) == \
        ("int8", -1, "asym", "bf16")
    assert "rounding" not in kw and "quantize_output" not in kw      # unset: Model's defaults


def test_wq_rounding_and_output_flags_reach_the_model(models, fake_gguf):
    r = run(["generate", fake_gguf, "-p", "Hi", "-n", "1", "--temp", "0", "--weight-dtype", "int4",
             "--rounding", "minmax", "--quantize-output"])
    assert r.exit_code == 0, r.output
    kw = models[0].kw
    assert (kw["weight_dtype"], kw["rounding"], kw["quantize_output"]) == ("int4", "minmax", True)


def test_wq_flags_default_to_off(models, fake_gguf):
    assert run(["generate", fake_gguf, "-p", "Hi", "-n", "1", "--temp", "0"]).exit_code == 0
    assert "weight_dtype" not in models[0].kw


@pytest.mark.parametrize("flag, value", [("--weight-dtype", "int2"), ("--group-size", "16"),
                                         ("--scheme", "nf4"), ("--compute-dtype", "fp16"),
                                         ("--rounding", "gptq")])
def test_wq_flags_reject_bad_values(models, fake_gguf, flag, value):
    r = run(["generate", fake_gguf, "-p", "Hi", flag, value])
    assert r.exit_code == 2 and "Invalid value" in r.output


def test_perplexity_has_wq_flags():
    r = run(["perplexity", "--help"])
    for flag in ("--weight-dtype", "--group-size", "--scheme", "--compute-dtype", "--rounding",
                 "--quantize-output"):
        assert flag in r.output


# ---- llmrt quantize on a tiny model -----------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama in F32 with rows of 256 (so the K-quants apply) and F16 (tied embeddings)."""
    pytest.importorskip("transformers")
    from hf_gguf import tiny_model, write_gguf
    d = tmp_path_factory.mktemp("quant")
    model, config = tiny_model("llama", seed=3, hidden_size=256, intermediate_size=512,
                               head_dim=64, num_hidden_layers=8)
    f32 = str(write_gguf(model, config, d / "f32.gguf", dtype="f32"))
    model, config = tiny_model("llama", seed=4, tie_word_embeddings=True)
    f16_tied = str(write_gguf(model, config, d / "f16-tied.gguf", dtype="f16"))
    return {"f32": f32, "f16_tied": f16_tied}


def _types(path):
    import gguf
    ours = {n: t.type_name for n, t in GGUFFile(path).tensors.items()}
    theirs = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert ours == theirs
    return ours


# expected type per tensor kind, llama-quantize's choices for an 8-layer model with 2-way GQA
# (use_more_bits(i, 8) is true for layers 0, 3, 6, 7: i < 1, i >= 7, (i - 1) % 3 == 2)
@pytest.mark.parametrize("qtype, base, ftype", [
    ("q4_0", "Q4_0", 2), ("q4_1", "Q4_1", 3), ("q5_0", "Q5_0", 8), ("q5_1", "Q5_1", 9),
    ("q8_0", "Q8_0", 7), ("q2_k", "Q2_K", 10), ("q3_k", "Q3_K", 12), ("q4_k", "Q4_K", 15),
    ("q5_k", "Q5_K", 17), ("q6_k", "Q6_K", 18)])
def test_quantize_types_and_keys(tiny, tmp_path, qtype, base, ftype):
    out = str(tmp_path / f"{qtype}.gguf")
    r = run(["quantize", tiny["f32"], out, qtype, "-t", "2"])
    assert r.exit_code == 0, r.output
    assert f"({qtype})" in r.stderr
    types = _types(out)
    src = GGUFFile(tiny["f32"])
    for name, t in src.tensors.items():
        if len(t.shape) == 1:
            assert types[name] == "F32", name                          # norms stay F32
    assert types["output.weight"] == ("Q8_0" if base == "Q8_0" else "Q6_K")
    assert types["token_embd.weight"] == base                         # untied: the base type
    assert types["blk.4.attn_q.weight"] == base
    more = {0, 3, 6, 7}
    for i in range(8):
        v, down, o = (types[f"blk.{i}.{k}.weight"] for k in ("attn_v", "ffn_down", "attn_output"))
        want_v = {"Q2_K": "Q3_K", "Q3_K": "Q5_K" if i < 2 else "Q4_K"}.get(
            base, "Q6_K" if base in ("Q4_K", "Q5_K") and i in more else base)
        want_down = {"Q2_K": "Q3_K", "Q3_K": "Q5_K" if i < 8 // 16 else "Q4_K"}.get(
            base, "Q6_K" if base in ("Q4_K", "Q5_K") and i in more else base)
        want_o = {"Q2_K": "Q3_K", "Q3_K": "Q4_K"}.get(base, base)
        assert (v, down, o) == (want_v, want_down, want_o), i
    # keys: every key copied, file_type and quantization_version set
    dst = GGUFFile(out)
    assert dst.metadata["general.file_type"] == ftype
    assert dst.metadata["general.quantization_version"] == 2
    for k, v in src.metadata.items():
        if k != "general.file_type":
            assert np.array_equal(dst.metadata[k], v) if isinstance(v, np.ndarray) else dst.metadata[k] == v, k
    assert dst.alignment == src.alignment
    # and the tensors hold the reference quantization of the source
    x = src.tensors["blk.4.attn_q.weight"].data
    np.testing.assert_array_equal(dst.tensors["blk.4.attn_q.weight"].data, quants.quantize(x, base))


# max |logit diff| / max |logit| of the quantized tiny model (8 layers, dim 256, random weights:
# no structure to spare, so the errors are large) vs f32, measured: q8_0 0.023, q6_k 0.062,
# q4_0 0.27 (q5_0 0.11, q4_k 0.17, q3_k 0.33, q2_k 0.63); bounds ~2.2x.
QUANT_LOGIT_RTOL = {"q8_0": 0.05, "q6_k": 0.15, "q4_0": 0.6}


def test_quantized_files_run(tiny, tmp_path):
    ids = [1, 2, 3, 50, 60, 70, 100, 7]
    ref = Model(tiny["f32"], n_threads=2, ctx_size=32)(ids)
    errs = {}
    for qtype, tol in QUANT_LOGIT_RTOL.items():
        out = str(tmp_path / f"{qtype}.gguf")
        assert run(["quantize", tiny["f32"], out, qtype]).exit_code == 0
        got = Model(out, n_threads=2, ctx_size=32)(ids)
        errs[qtype] = float(np.abs(got - ref).max() / np.abs(ref).max())
        assert 0 < errs[qtype] < tol, (qtype, errs[qtype])
    assert errs["q8_0"] < errs["q6_k"] < errs["q4_0"]     # more bits, less error


def test_tied_embeddings_and_fallback(tiny, tmp_path):
    """No output.weight: token_embd is the output, Q6_K's 256-block does not divide rows of 64 ->
    Q8_0 (llama.cpp's output rule); q4_k's other tensors fall back to Q5_0 (tensor_type_fallback)."""
    out = str(tmp_path / "q4_k.gguf")
    assert run(["quantize", tiny["f16_tied"], out, "q4_k"]).exit_code == 0
    types = _types(out)
    assert "output.weight" not in types and types["token_embd.weight"] == "Q8_0"
    assert types["blk.0.attn_q.weight"] == "Q5_0"
    out0 = str(tmp_path / "q4_0.gguf")
    assert run(["quantize", tiny["f16_tied"], out0, "q4_0"]).exit_code == 0
    assert _types(out0)["token_embd.weight"] == "Q8_0"      # Q6_K -> Q8_0: rows of 64


# ---- errors -----------------------------------------------------------------------------------

def test_quantize_errors(tiny, tmp_path):
    r = run(["quantize", tiny["f32"], str(tmp_path / "x.gguf"), "q7_0"])
    assert r.exit_code == 2 and "Invalid value" in r.output
    r = run(["quantize", str(tmp_path / "missing.gguf"), str(tmp_path / "x.gguf"), "q4_0"])
    assert r.exit_code == 1 and "no such file" in r.stderr
    r = run(["quantize", tiny["f32"], tiny["f32"], "q4_0"])
    assert r.exit_code == 1 and "OUT is the same file as IN" in r.stderr
    r = run(["quantize", tiny["f32"], str(tmp_path), "q4_0"])
    assert r.exit_code == 1 and "not a regular file" in r.stderr
    r = run(["quantize", tiny["f32"], str(tmp_path / "missing" / "x.gguf"), "q4_0"])
    assert r.exit_code == 1 and "no such directory" in r.stderr


def test_quantize_never_writes_over_its_input_through_a_link(tiny, tmp_path):
    """IN a symlink to OUT (or OUT a link to IN) passed the same-path check, and the quantized
    file replaced the float original."""
    src = tmp_path / "copy.gguf"
    src.write_bytes(open(tiny["f32"], "rb").read())
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    (tmp_path / "link.gguf").symlink_to("copy.gguf")
    for a, b in (("link.gguf", "copy.gguf"), ("copy.gguf", "link.gguf")):
        r = run(["quantize", str(tmp_path / a), str(tmp_path / b), "q4_0"])
        assert r.exit_code == 1 and "OUT is the same file as IN" in r.stderr
    assert hashlib.sha256(src.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.gguf", "link.gguf"]


def test_quantize_output_mode_and_llamacpp_type_names(tiny, tmp_path):
    """OUT was created 0600 (the temporary file's mode) whatever the umask; llama-quantize's
    names Q4_K_M etc. were refused."""
    umask = os.umask(0o022)
    try:
        r = run(["quantize", tiny["f32"], str(tmp_path / "m.gguf"), "Q4_K_M"])
    finally:
        os.umask(umask)
    assert r.exit_code == 0, r.output
    assert (os.stat(tmp_path / "m.gguf").st_mode & 0o777) == 0o644
    assert _types(tmp_path / "m.gguf") == _types_of_q4_k(tiny, tmp_path)


def _types_of_q4_k(tiny, tmp_path):
    r = run(["quantize", tiny["f32"], str(tmp_path / "k.gguf"), "q4_k"])
    assert r.exit_code == 0, r.output
    return _types(tmp_path / "k.gguf")


def test_quantize_stopped_by_sigterm_leaves_no_file(tiny, tmp_path):
    """SIGTERM (kill, timeout, systemd) left the hidden temporary file behind (SIGINT did not);
    now both leave the directory as it was and the exit code says which signal."""
    import signal
    import subprocess
    import sys
    import time
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.Popen([sys.executable, "-c",
                          "import sys, time, llmrt.quantize as q\n"
                          "real = q.quants.quantize\n"
                          "def slow(x, t):\n"
                          "    time.sleep(0.05)\n"
                          "    return real(x, t)\n"
                          "q.quants.quantize = slow\n"
                          "from llmrt.cli import main\n"
                          "sys.argv = ['llmrt', 'quantize', sys.argv[1], sys.argv[2], 'q4_0', '-t', '1']\n"
                          "main()\n", tiny["f32"], str(out / "q.gguf")],
                         stderr=subprocess.PIPE, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    deadline = time.time() + 60
    while time.time() < deadline and not any(out.iterdir()):
        time.sleep(0.05)                             # the temporary file exists: writing began
    assert any(out.iterdir())
    p.send_signal(signal.SIGTERM)
    assert p.wait(60) == 128 + signal.SIGTERM
    assert list(out.iterdir()) == []


def test_failure_leaves_nothing(tiny, tmp_path, monkeypatch):
    from llmrt import quantize as qmod
    calls = []

    def boom(x, t):
        calls.append(t)
        if len(calls) > 3:
            raise ValueError("disk on fire")
        return quants.quantize(x, t)

    monkeypatch.setattr(qmod.quants, "quantize", boom)
    out = tmp_path / "out" / "q.gguf"
    out.parent.mkdir()
    with pytest.raises(ValueError, match="disk on fire"):
        qmod.quantize_file(tiny["f32"], out, "q4_0", progress=False)
    assert list(out.parent.iterdir()) == []          # no OUT, no temporary file


def test_requantize_warns(tiny, tmp_path, caplog):
    from llmrt.quantize import quantize_file
    q8 = str(tmp_path / "q8.gguf")
    quantize_file(tiny["f32"], q8, "q8_0", progress=False)
    with caplog.at_level("WARNING", logger="llmrt"):
        quantize_file(q8, str(tmp_path / "q4.gguf"), "q4_0", progress=False)
    assert "dequantized and quantized again" in caplog.text
    assert _types(str(tmp_path / "q4.gguf"))["blk.0.attn_q.weight"] == "Q4_0"


# ---- slow: llama.cpp's own q4_0 -----------------------------------------------------------------

@pytest.mark.slow
def test_q4_0_matches_llamacpp(tmp_path):
    """`llmrt quantize` q4_0 of SmolLM2 dequantized to F16 == llama.cpp's q4_0 of the same F16,
    tensor for tensor (types and sha256 of the bytes; tests/data/quantize_ref.json). Identical
    bytes: llama.cpp reads our file with the perplexity of its own (both recorded in the json)."""
    import gguf
    from llmrt.quantize import float_file, quantize_file
    ref = json.load(open(os.path.join(HERE, "data", "quantize_ref.json")))
    src = os.path.join(os.environ.get("LLMRT_MODEL_DIR", "/work/models"), ref["source"])
    if not os.path.exists(src):
        pytest.skip(f"real model not found: {src}")
    f16, out = str(tmp_path / "f16.gguf"), str(tmp_path / "q4_0.gguf")
    float_file(src, f16, "F16", progress=False)
    quantize_file(f16, out, "q4_0", n_threads=2, progress=False)
    got = {t.name: [t.tensor_type.name, hashlib.sha256(t.data.tobytes()).hexdigest()]
           for t in gguf.GGUFReader(out).tensors}
    assert got == ref["tensors"]
    assert ref["llamacpp_ppl_of_llmrt_q4_0"]["ppl"] == ref["llamacpp_ppl_of_llamacpp_q4_0"]["ppl"]


def test_ctrl_c_exits_130_with_one_line(tiny, tmp_path, monkeypatch):
    """quantize, perplexity and bench printed click's bare "Aborted!" and exited 1 on Ctrl-C
    (generate: "interrupted", 130); now every command exits as generate does."""
    import llmrt.quantize as qmod

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(qmod, "quantize_file", interrupted)
    r = run(["quantize", tiny["f32"], str(tmp_path / "q.gguf"), "q4_0"])
    assert r.exit_code == 130 and r.stderr.strip() == "interrupted"


def test_perplexity_checks_its_outputs_before_the_run(tiny, tmp_path):
    """--nll-csv in a missing directory failed only after the whole evaluation."""
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 50)
    r = run(["perplexity", tiny["f32"], "-f", str(text), "-c", "32",
             "--nll-csv", str(tmp_path / "missing" / "nll.csv")])
    assert r.exit_code == 1 and "no such directory" in r.stderr and "text:" not in r.stderr


def test_a_reader_that_goes_away_ends_output_quietly(tmp_path):
    """`llmrt generate ... | head -c 10` printed `error: [Errno 32] Broken pipe` and exited 1:
    now it stops quietly with 141 (128 + SIGPIPE), as a Unix tool killed by the pipe."""
    import subprocess
    import sys

    from fake_lm import real_model_path
    p = subprocess.Popen([sys.executable, "-m", "llmrt", "generate", real_model_path("smollm2-135m-instruct"),
                          "-p", "Once upon a time", "-n", "400", "--ignore-eos", "--temp", "0", "-t", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert len(p.stdout.read(10)) == 10
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(120) == 141, err
    assert "error" not in err and "Traceback" not in err and "Exception ignored" not in err


def test_text_that_is_not_utf8_is_named_where_it_came_from():
    """Bytes that are not UTF-8 on stdin or in -p / -s reached the tokenizer as lone surrogates
    ("unpaired UTF-16 surrogate at character 19" of the rendered template), and one such line
    ended a piped conversation: now the source and the byte are named, and the line is skipped."""
    import subprocess
    import sys

    from fake_lm import real_model_path
    base = [sys.executable, "-m", "llmrt"]
    model = real_model_path("smollm2-135m-instruct")
    r = subprocess.run(base + ["chat", model, "-n", "4", "--temp", "0", "-t", "2"],
                       input=b"caf\xe9 \xff hi\nhello\n", capture_output=True, timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "error: stdin line 1 is not UTF-8 text (byte 0xe9 at offset 3): skipped" in err
    assert r.stdout.strip()                             # line 2 was answered
    r = subprocess.run(base + ["generate", model, "-p", b"caf\xe9", "-n", "2"], capture_output=True, timeout=120)
    assert r.returncode == 1 and r.stderr.decode().strip() == "error: -p PROMPT is not UTF-8 text (byte 0xe9 at offset 3)"
    r = subprocess.run(base + ["chat", model, "-s", b"\xff"], input=b"", capture_output=True, timeout=120)
    assert r.returncode == 1 and "error: -s SYSTEM is not UTF-8 text (byte 0xff at offset 0)" in r.stderr.decode()


@pytest.mark.parametrize("cmd", [["generate", "-p", "x"], ["chat"], ["serve"]])
def test_n_predict_below_minus_one_is_a_usage_error(cmd):
    """-n -2 ran as -n -1 (no limit): llama.cpp's -n takes -1 (infinite) or a count."""
    r = run(cmd + ["-n", "-2"])
    assert r.exit_code == 2 and "-2 is not in the range x>=-1" in r.output
