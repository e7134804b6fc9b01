"""`llmrt bench` (llmrt/bench.py): the llama-bench-shaped tests on a tiny real GGUF model, the
JSON and markdown outputs, the weight-bytes count behind the bandwidth bound, and bad arguments.
No timing is asserted (speed is measured by benchmarks/, never by tests): only that the numbers
are there, positive and consistent."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hf_gguf import tiny_model, write_gguf
from llmrt import _core, bench
from llmrt.cli import main
from llmrt.model import Model


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    model, config = tiny_model("llama", num_hidden_layers=2)
    return str(write_gguf(model, config, tmp_path_factory.mktemp("bench") / "tiny.gguf", "q8_0"))


def run(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_bench_json_has_the_llama_bench_fields(tiny_path):
    r = run(["bench", tiny_path, "-p", "16", "-n", "4", "-r", "2", "-t", "1", "-o", "json"])
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert [d["test"] for d in rows] == ["pp16", "tg4"]
    for d in rows:
        assert d["t_s"] > 0 and d["t_s_sd"] >= 0
        assert len(d["samples"]) == 2
        assert d["n_threads"] == 1
        assert d["isa"] == _core.isa_current()
        mean = sum(d["samples"]) / 2
        assert d["t_s"] == pytest.approx(mean, rel=1e-12)
    tg = rows[1]
    assert tg["tg_bound_t_s"] == pytest.approx(
        tg["read_bandwidth_gb_s"] * 1e9 / tg["weight_bytes_per_token"], rel=1e-9)
    assert tg["bound_fraction"] == pytest.approx(tg["t_s"] / tg["tg_bound_t_s"], rel=1e-9)


def test_bench_markdown_table(tiny_path):
    r = run(["bench", tiny_path, "-p", "8", "-n", "0", "-r", "1", "-t", "1"])
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "| model | size | threads | isa | test | t/s |"
    assert sum("| pp8 |" in line for line in lines) == 1
    assert not any("tg" in line for line in lines)


@pytest.mark.parametrize("args, message", [
    (["-r", "0"], "'-r' / '--repetitions': 0 is not in the range x>=1"),
    (["-p", "0", "-n", "0"], "nothing to measure: give -p or -n a length > 0"),
    (["-p", "-5", "-n", "4"], "'-p' / '--n-prompt': -5 is not in the range x>=0"),
])
def test_bench_bad_arguments(tiny_path, args, message, monkeypatch):
    """Usage errors (exit 2) before the model loads (they came after the load, exit 1, and -p -5
    was reported as "need a prompt or generation length")."""
    import llmrt.cli
    monkeypatch.setattr(llmrt.cli, "_load_model", lambda *a, **kw: pytest.fail("loaded the model"))
    r = run(["bench", tiny_path, "-t", "1", *args])
    assert r.exit_code == 2
    assert message in r.stderr


def test_weight_bytes_per_token_counts_the_tied_output_once(tiny_path):
    m = Model(tiny_path, n_threads=1, ctx_size=32)
    t = m.gguf.tensors
    expect = sum(v.nbytes for k, v in t.items() if k != "token_embd.weight")
    if "output.weight" not in t:
        expect += t["token_embd.weight"].nbytes
    assert bench.weight_bytes_per_token(m) == expect


def test_read_bandwidth_is_positive_and_rejects_bad_arguments():
    assert _core.read_bandwidth(1 << 20, 1, 1) > 1e6     # any machine reads > 1 MB/s
    with pytest.raises(MemoryError):
        _core.read_bandwidth(1 << 20, 0, 1)


def test_weight_bytes_per_token_counts_weights_quantized_at_load(tmp_path):
    model, config = tiny_model("llama", num_hidden_layers=1)
    path = str(write_gguf(model, config, tmp_path / "tiny-f32.gguf", "f32"))
    f32 = bench.weight_bytes_per_token(Model(path, n_threads=1, ctx_size=32))
    q8 = bench.weight_bytes_per_token(Model(path, n_threads=1, ctx_size=32, weight_dtype="int8"))
    # matmul weights go from 4 bytes to 34/32 bytes per value; norms stay f32
    assert q8 < f32 * 0.5


def test_bench_profile_accounts_for_the_run(tiny_path):
    """--profile: every node of the 2-layer model is timed; per run, the ops' time adds up to no
    more than the run's wall time, and to most of it (the rest is Python around the graph)."""
    m = Model(tiny_path, n_threads=2)
    res = bench.run(m, n_prompt=32, n_gen=8, reps=2, profile=True)
    for r in res:
        ops = {(d["op"], d["type"]): d for d in r.profile}
        assert ops[("mul_mat", "Q8_0")]["nodes"] == 2 * 7 + 1      # 7 projections per layer + output
        assert ops[("rms_norm", "")]["nodes"] == 2 * 2 + 1
        assert ops[("attention", "")]["nodes"] == 2
        ms = sum(d["ms_per_run"] for d in r.profile)
        per_run_ms = 1e3 * (r.n_prompt or 1) / r.t_s      # pp: one run of n_prompt; tg: one per token
        assert 0 < ms <= per_run_ms * (1 + PROFILE_SLACK)
        for d in r.profile:
            assert 0 <= d["wait_ms_per_run"] <= d["ms_per_run"]
    r = run(["bench", tiny_path, "-p", "8", "-n", "2", "-r", "1", "-t", "1", "--profile"])
    assert r.exit_code == 0, r.stderr
    assert "pp8: thread 0's time per run, by op" in r.stdout
    assert "| mul_mat | Q8_0 | 15 |" in r.stdout


def test_bench_at_depth_times_only_the_runs_after_the_cached_tokens(tiny_path, monkeypatch):
    """-d D (llama-bench's --n-depth): every timed run starts from a cache holding D tokens; the
    tests are named "pp32 @ d48" and "tg8 @ d48"; the profile holds the timed runs' graph only
    (the depth prefill's graph, profiled too, would double every node count: 48 tokens run on the
    graph of up to 128, the prompt's 32 on that of 32, a decoded token on that of 1)."""
    from llmrt.model import Session

    m = Model(tiny_path, n_threads=2)
    seen = []                       # (tokens cached, tokens evaluated) of every eval
    eval_ = Session.eval

    def spy(sess, ids, *a, **kw):
        seen.append((sess.n_past, len(ids)))
        return eval_(sess, ids, *a, **kw)

    monkeypatch.setattr(Session, "eval", spy)
    res = bench.run(m, n_prompt=32, n_gen=8, reps=2, profile=True, n_depth=48)
    assert [r.test for r in res] == ["pp32 @ d48", "tg8 @ d48"]
    assert [r.n_depth for r in res] == [48, 48]
    # (cached, new) per eval: 3 pp runs (warm-up + 2), then 3 tg runs of 8 single tokens, each run
    # after a prefill of 48 from an empty cache
    pp_run = [(0, 48), (48, 32)]
    tg_run = [(0, 48)] + [(48 + i, 1) for i in range(8)]
    assert seen == pp_run * 3 + tg_run * 3
    for r in res:
        ops = {(d["op"], d["type"]): d for d in r.profile}
        assert ops[("mul_mat", "Q8_0")]["nodes"] == 2 * 7 + 1
        assert ops[("attention", "")]["nodes"] == 2
    r = run(["bench", tiny_path, "-p", "8", "-n", "4", "-d", "16", "-r", "1", "-t", "1", "-o", "json"])
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert [(d["test"], d["n_depth"]) for d in rows] == [("pp8 @ d16", 16), ("tg4 @ d16", 16)]
    assert "tg_bound_t_s" not in rows[1]          # the cache's reads add to the weights': no bound
    r = run(["bench", tiny_path, "-p", "0", "-n", "4", "-d", "-1", "-t", "1"])
    assert r.exit_code == 2 and "'-d' / '--n-depth': -1 is not in the range x>=0" in r.stderr


# mean t/s over runs vs the mean of per-run times: the per-run sums may exceed 1 / mean(t/s)
# by the spread of the samples (two runs of 10 and 50 ms: 1 / mean(t/s) = 16.7 ms, mean time
# 30 ms, +80 %); a machine shared with a compiler sees such spreads, so 3x: still far below what a
# profile counting a node twice or timing the whole run per node would give (x the node count).
PROFILE_SLACK = 2.0
