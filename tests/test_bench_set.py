"""benchmarks/make_models.py and the helpers of benchmarks/compare_llamacpp.py (no timing is
asserted: the scripts measure speed, the tests check what they build and count)."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import compare_llamacpp as cmp  # noqa: E402
import make_models as mm  # noqa: E402

TINY = dict(dim=64, n_layers=2, ffn=256, n_heads=4, n_kv_heads=2)
needs_smol = pytest.mark.skipif(not os.path.exists(mm.SMOL),
                                reason=f"the synthetic models copy the tokenizer of {mm.SMOL}, not downloaded")


def test_parameter_counts_match_the_documented_sizes():
    # blocks / all, in billions, as the docstring and benchmarks/README.md state them
    want = {"0.4b": (0.40, 0.55), "1.5b": (1.32, 1.52), "3b": (2.62, 2.92)}
    for size, (blocks, total) in want.items():
        b, t = mm.n_params(mm.SIZES[size])
        assert round(b / 1e9, 2) == blocks and round(t / 1e9, 2) == total, size


def test_tensors_are_deterministic_and_have_the_planned_std():
    plan = mm.tensor_plan(mm.SIZES["0.4b"], 49152)
    for name, shape, std in plan[:12]:
        a, b = mm.make_tensor(name, shape, std), mm.make_tensor(name, shape, std)
        assert np.array_equal(a, b)
        if std is None:
            assert (a == 1).all()
            continue
        n = a.size
        # the sample std of n normals has relative sd 1/sqrt(2n): allow 6 of those
        assert abs(a.std() / std - 1) < 6 / np.sqrt(2 * n), name
    # two tensors of the same shape differ (each has its own seed)
    q0 = mm.make_tensor("blk.0.attn_q.weight", (64, 64), 1.0)
    q1 = mm.make_tensor("blk.1.attn_q.weight", (64, 64), 1.0)
    assert not np.array_equal(q0, q1)


def test_residual_projections_are_scaled_down_by_the_depth():
    cfg = mm.SIZES["1.5b"]
    std = {n: s for n, _, s in mm.tensor_plan(cfg, 49152)}
    d, f, L = cfg["dim"], cfg["ffn"], cfg["n_layers"]
    assert std["blk.0.attn_q.weight"] == pytest.approx(1 / np.sqrt(d), rel=1e-12)
    assert std["blk.0.attn_output.weight"] == pytest.approx(1 / np.sqrt(d * 2 * L), rel=1e-12)
    assert std["blk.0.ffn_down.weight"] == pytest.approx(1 / np.sqrt(f * 2 * L), rel=1e-12)


def test_bf16_rounding_is_round_to_nearest_even():
    torch = pytest.importorskip("torch", reason="torch gives the reference bf16 rounding")
    x = np.random.default_rng(1).standard_normal(100000).astype(np.float32)
    x[:4] = [1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 65504.0]   # ties go to even
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(mm.to_bf16(x), ref)


@needs_smol
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_written_file_holds_the_planned_values_and_loads(tmp_path, dtype):
    import gguf

    from llmrt import Model

    path = str(tmp_path / f"tiny-{dtype}.gguf")
    mm.write_float_gguf(path, TINY, dtype)
    r = gguf.GGUFReader(path)
    tensors = {t.name: t for t in r.tensors}
    plan = mm.tensor_plan(TINY, 49152)
    assert list(tensors) == [n for n, _, _ in plan]
    for name, shape, std in plan:
        want = mm.make_tensor(name, shape, std)
        got = np.asarray(tensors[name].data)
        if std is None:
            assert np.array_equal(got.reshape(shape), want)
        elif dtype == "f16":
            assert np.array_equal(got.reshape(shape), want.astype(np.float16))
        else:
            assert np.array_equal(got.view(np.uint16).reshape(shape), mm.to_bf16(want))
    embd = int(tensors["token_embd.weight"].n_bytes)
    assert cmp.bytes_per_token(path) == sum(int(t.n_bytes) for t in r.tensors) - embd
    m = Model(path, n_threads=1, ctx_size=32)
    x = np.asarray(m(list(range(100, 108))), np.float64)
    assert x.shape == (8, 49152) and np.isfinite(x).all()
    # output std 2/sqrt(dim) over a normalized hidden state: logits' std about 2 (the final
    # norm makes each row's rms 1; 8 rows x 49152 logits: a sample std far tighter than 10 %)
    assert abs(x.std() - 2.0) < 0.2


def test_type_names_from_file_names():
    assert cmp.type_name("/x/synthetic-1.5b-q4_k_m.gguf") == "Q4_K_M"
    assert cmp.type_name("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert cmp.type_name("synthetic-0.4b-bf16.gguf") == "BF16"
    assert cmp.type_name("synthetic-0.4b-f16.gguf") == "F16"
    assert cmp.type_name("model.gguf") == "?"


# ---- the MoE set ----------------------------------------------------------------------------

TINY_MOE = dict(arch="qwen3moe", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32,
                n_expert=8, n_expert_used=2, ffn_exp=32)


def test_moe_parameter_counts_match_the_documented_sizes():
    # (blocks, all) and active per token (blocks, with the output matrix), in billions
    want = {"moe-0.5b": ((0.47, 0.58), (0.059, 0.109)), "moe-2b": ((1.89, 2.04), (0.303, 0.379))}
    for size, ((blocks, total), (ab, at)) in want.items():
        b, t = mm.n_params(mm.SIZES[size])
        assert round(b / 1e9, 2) == blocks and round(t / 1e9, 2) == total, size
        b, t = mm.n_active_params(mm.SIZES[size])
        assert round(b / 1e9, 3) == ab and round(t / 1e9, 3) == at, size
    assert mm.SETS["moe"] == ["moe-0.5b", "moe-2b"] and "moe-0.5b" not in mm.SETS["dense"]
    assert mm.file_name("moe-0.5b", "q4_0") == "synthetic-moe-0.5b-q4_0.gguf"


def test_moe_tensor_plan_shapes():
    cfg = TINY_MOE
    plan = {n: (s, sd) for n, s, sd in mm.tensor_plan(cfg, 100)}
    E, f, d, hd = cfg["n_expert"], cfg["ffn_exp"], cfg["dim"], cfg["head_dim"]
    assert plan["blk.1.ffn_gate_inp.weight"] == ((E, d), pytest.approx(1 / np.sqrt(d)))
    assert plan["blk.1.ffn_gate_exps.weight"][0] == (E, f, d)        # ggml [d, f, E]
    assert plan["blk.1.ffn_up_exps.weight"][0] == (E, f, d)
    assert plan["blk.1.ffn_down_exps.weight"][0] == (E, d, f)
    assert plan["blk.1.attn_q.weight"][0] == (cfg["n_heads"] * hd, d)
    assert plan["blk.1.attn_output.weight"][0] == (d, cfg["n_heads"] * hd)
    assert plan["blk.1.attn_q_norm.weight"] == ((hd,), None)
    assert not any(n.startswith("blk.0.ffn_gate.") or n == "blk.0.ffn_down.weight" for n in plan)


def test_moe_forward_spreads_the_load():
    """The router's scale spreads tokens over the experts: layer 0 of the tiny MoE on 128 random
    tokens uses every expert, none gets more than 2.5x its share."""
    ids = np.random.default_rng(0).integers(0, 100, 128)
    r = mm.moe_forward(TINY_MOE, ids, n_layers=2, n_vocab=100)
    load = r["load"]
    assert load.shape == (2, 8) and (load.sum(1) == 128 * 2).all()
    assert (load[0] > 0).all() and load[0].max() < 2.5 * load[0].mean()
    assert all(np.isfinite(r["rms"])) and 0.5 < r["rms"][-1] < 2


def _write_raw_moe(path, n_expert=8, n_used=2):
    """A tokenizer-less MoE GGUF (only what bytes_per_token reads)."""
    import gguf
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(1)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_tensor("token_embd.weight", np.zeros((100, 64), np.float16))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.zeros(64, np.float32))
    w.add_tensor("blk.0.ffn_gate_inp.weight", np.zeros((n_expert, 64), np.float32))
    w.add_tensor("blk.0.ffn_gate_exps.weight", np.zeros((n_expert, 32, 64), np.float16))
    w.add_tensor("blk.0.ffn_down_exps.weight", np.zeros((n_expert, 64, 32), np.float16))
    w.add_tensor("output.weight", np.zeros((100, 64), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_bytes_per_token_counts_only_the_used_experts(tmp_path):
    p = tmp_path / "moe.gguf"
    _write_raw_moe(p, 8, 2)
    dense = 64 * 64 * 2 + 64 * 4 + 8 * 64 * 4 + 100 * 64 * 2       # q, norm, router (whole), output
    experts = 2 * (8 * 32 * 64 * 2)                                 # gate_exps + down_exps, F16
    assert cmp.bytes_per_token(str(p)) == dense + experts * 2 // 8
    p1 = tmp_path / "moe-all.gguf"
    _write_raw_moe(p1, 8, 8)                                        # every expert used: all of it
    assert cmp.bytes_per_token(str(p1)) == dense + experts


@needs_smol
def test_written_moe_file_holds_the_planned_tensors(tmp_path):
    import gguf

    path = str(tmp_path / "tiny-moe-f16.gguf")
    mm.write_float_gguf(path, TINY_MOE, "f16")
    r = gguf.GGUFReader(path)
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.")}
    assert f["general.architecture"] == "qwen3moe"
    assert (f["qwen3moe.expert_count"], f["qwen3moe.expert_used_count"],
            f["qwen3moe.expert_feed_forward_length"]) == (8, 2, 32)
    assert f["qwen3moe.attention.key_length"] == f["qwen3moe.attention.value_length"] == 32
    assert f["qwen3moe.feed_forward_length"] == 2 * 32
    tensors = {t.name: t for t in r.tensors}
    plan = mm.tensor_plan(TINY_MOE, 49152)
    assert list(tensors) == [n for n, _, _ in plan]
    for name, shape, std in plan:
        t = tensors[name]
        assert [int(x) for x in t.shape] == list(reversed(shape)), name     # ggml order
        want = mm.make_tensor(name, shape, std)
        got = np.asarray(t.data).reshape(shape)
        if mm.keeps_f32(name, std):
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, name
            assert np.array_equal(got, want), name
        else:
            assert t.tensor_type == gguf.GGMLQuantizationType.F16, name
            assert np.array_equal(got, want.astype(np.float16)), name
