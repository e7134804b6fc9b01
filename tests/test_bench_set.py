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
