"""`llmrt quantize` on MoE GGUFs (llmrt/quantize.py): llama-quantize's per-tensor choices for
the 3-D expert tensors, the router, the shared experts and the n_expert == 8 rules, checked on
small synthetic files (qwen3moe with 4 experts, a Mixtral-like llama with 8, a qwen2moe with a
shared expert) against the rules of llama.cpp's src/llama-quant.cpp written out here by hand;
the quantized 3-D tensors hold every expert's rows quantized row by row (gguf.quants.quantize for
Q4_0 / Q8_0, llmrt.quants' reference rounding for the K-quants).

Checked by hand against llama.cpp itself (llama-cpp-python 0.3.36's llama_model_quantize, every
TYPE, same files): tools/llamacpp_quantize_moe_check.py; llama_cpp is not a test dependency.
"""
from __future__ import annotations

import numpy as np
import pytest

from llmrt import quants
from llmrt.gguf import GGUFFile
from llmrt.quantize import plan_types, quantize_file

N_LAYER = 8
MORE = {0, 3, 6, 7}           # use_more_bits(i, 8): i < 1, i >= 7, (i - 1) % 3 == 2
DIM, FF, N_VOCAB = 256, 256, 64
BASE = {"q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q5_1": "Q5_1", "q8_0": "Q8_0",
        "q2_k": "Q2_K", "q3_k": "Q3_K", "q4_k": "Q4_K", "q5_k": "Q5_K", "q6_k": "Q6_K"}


def moe_tensors(arch: str, n_expert: int, shexp: bool = False, n_head: int = 4, n_head_kv: int = 2,
                gate_inp_shexp_2d: bool = False):
    """[(name, ggml shape, float32 values in numpy order)] of a small MoE model."""
    rng = np.random.default_rng(7)
    hd = DIM // n_head
    out = []

    def add(name, shape, ones=False):
        np_shape = tuple(reversed(shape))
        x = np.ones(np_shape, np.float32) if ones else \
            (rng.standard_normal(np_shape) / np.sqrt(shape[0])).astype(np.float32)
        out.append((name, shape, x))

    add("token_embd.weight", (DIM, N_VOCAB))
    for i in range(N_LAYER):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", (DIM,), True)
        add(b + "attn_q.weight", (DIM, DIM))
        add(b + "attn_k.weight", (DIM, hd * n_head_kv))
        add(b + "attn_v.weight", (DIM, hd * n_head_kv))
        add(b + "attn_output.weight", (DIM, DIM))
        if arch == "qwen3moe":
            add(b + "attn_q_norm.weight", (hd,), True)
            add(b + "attn_k_norm.weight", (hd,), True)
        add(b + "ffn_norm.weight", (DIM,), True)
        add(b + "ffn_gate_inp.weight", (DIM, n_expert))
        add(b + "ffn_gate_exps.weight", (DIM, FF, n_expert))
        add(b + "ffn_up_exps.weight", (DIM, FF, n_expert))
        add(b + "ffn_down_exps.weight", (FF, DIM, n_expert))
        if shexp:
            add(b + "ffn_gate_inp_shexp.weight", (DIM, 1) if gate_inp_shexp_2d else (DIM,))
            add(b + "ffn_gate_shexp.weight", (DIM, 2 * FF))
            add(b + "ffn_up_shexp.weight", (DIM, 2 * FF))
            add(b + "ffn_down_shexp.weight", (2 * FF, DIM))
    add("output_norm.weight", (DIM,), True)
    add("output.weight", (DIM, N_VOCAB))
    return out


def write_moe(path, arch: str, n_expert: int, n_used: int, shexp: bool = False, reverse: bool = False,
              n_head: int = 4, n_head_kv: int = 2, **kw):
    """An F16 MoE GGUF (norms, routers F32); reverse=True writes the tensors in reverse order."""
    import gguf
    tensors = moe_tensors(arch, n_expert, shexp, n_head, n_head_kv, **kw)
    if reverse:
        tensors = tensors[::-1]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(N_LAYER)
    w.add_context_length(256)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FF)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(FF)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for name, shape, x in tensors:
        f32 = x.ndim == 1 or "ffn_gate_inp" in name or "_norm" in name
        w.add_tensor(name, x if f32 else x.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {n: x for n, _, x in tensors}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    out = {}
    for key, args in {"qwen3moe": ("qwen3moe", 4, 2), "mixtral": ("llama", 8, 2),
                      "qwen2moe": ("qwen2moe", 4, 2, True)}.items():
        p = d / f"{key}.gguf"
        out[key] = (str(p), write_moe(p, *args))
    p = d / "qwen3moe-reversed.gguf"
    write_moe(p, "qwen3moe", 4, 2, reverse=True)
    out["qwen3moe-reversed"] = (str(p), None)
    return out


def expected(name: str, qtype: str, n_expert: int, n_gqa: int = 2) -> str:
    """llama-quantize's type for a tensor of the small MoE models (8 layers, rows of 256)."""
    base = BASE[qtype]
    if name.endswith("norm.weight") or "ffn_gate_inp" in name:
        return "F32"
    if name == "output.weight":
        return "Q8_0" if base == "Q8_0" else "Q6_K"
    if name == "token_embd.weight":
        return base
    i = int(name.split(".")[1])
    kind = name.split(".")[2]
    if kind == "attn_v":
        if n_expert == 8:
            return "Q8_0"
        if base == "Q2_K":
            return "Q4_K" if n_gqa >= 4 else "Q3_K"
        if base == "Q3_K":
            return "Q5_K" if i < 2 else "Q4_K"
        return "Q6_K" if base in ("Q4_K", "Q5_K") and i in MORE else base
    if kind == "attn_k":
        return "Q8_0" if n_expert == 8 else base
    if kind == "attn_output":
        if n_expert == 8:
            return "Q5_K" if base in ("Q2_K", "Q3_K", "Q4_K") else base
        return {"Q2_K": "Q3_K", "Q3_K": "Q4_K"}.get(base, base)
    if kind.startswith("ffn_down"):          # ffn_down_exps and ffn_down_shexp
        if base == "Q2_K":
            return "Q3_K"
        if base == "Q3_K":
            return "Q5_K" if i < N_LAYER // 16 else "Q4_K"
        return "Q6_K" if base in ("Q4_K", "Q5_K") and i in MORE else base
    return base                               # attn_q, ffn_gate/up (_exps, _shexp)


@pytest.mark.parametrize("qtype", list(BASE))
@pytest.mark.parametrize("model, n_expert", [("qwen3moe", 4), ("mixtral", 8), ("qwen2moe", 4)])
def test_plan_follows_llama_quantize(files, qtype, model, n_expert):
    f = GGUFFile(files[model][0])
    plan = plan_types(f, qtype)
    assert list(plan) == list(f.tensors)                  # the file's order
    for name, tn in plan.items():
        assert tn == expected(name, qtype, n_expert), (name, tn)


@pytest.mark.parametrize("qtype", ["q3_k", "q4_k"])
def test_plan_does_not_depend_on_the_file_order(files, qtype):
    """llama.cpp counts in its own order (by layer, then name) and takes an expert's layer from
    its name: writing the tensors in reverse order changes nothing."""
    a = plan_types(GGUFFile(files["qwen3moe"][0]), qtype)
    b = plan_types(GGUFFile(files["qwen3moe-reversed"][0]), qtype)
    assert a == b


def test_shared_expert_layers_count_blocks_not_tensors(files):
    """qwen2moe has two ffn_down-like tensors per layer (ffn_down_exps, ffn_down_shexp): llama.cpp's
    n_ffn_down is block_count (8), so both get Q6_K on layers 0, 3, 6, 7 in q4_k, not on the
    layers use_more_bits(i, 16) would give."""
    plan = plan_types(GGUFFile(files["qwen2moe"][0]), "q4_k")
    for i in range(N_LAYER):
        want = "Q6_K" if i in MORE else "Q4_K"
        assert plan[f"blk.{i}.ffn_down_exps.weight"] == want
        assert plan[f"blk.{i}.ffn_down_shexp.weight"] == want
        assert plan[f"blk.{i}.ffn_gate_inp_shexp.weight"] == "F32"


def test_gate_inp_shexp_of_shape_k_by_1_is_not_quantized(tmp_path):
    """ggml_n_dims of [K, 1] is 1: llama.cpp keeps such a tensor as it is."""
    p = tmp_path / "m.gguf"
    write_moe(p, "qwen2moe", 4, 2, shexp=True, gate_inp_shexp_2d=True)
    f = GGUFFile(str(p))
    assert f.tensors["blk.0.ffn_gate_inp_shexp.weight"].shape == (DIM, 1)
    assert plan_types(f, "q4_0")["blk.0.ffn_gate_inp_shexp.weight"] == "F32"


def test_expert_count_eight_with_four_way_gqa(tmp_path):
    """n_expert == 8 wins over the q2_k attn_v rule (Q4_K with n_gqa >= 4): Q8_0."""
    p = tmp_path / "m.gguf"
    write_moe(p, "llama", 8, 2, n_head=8, n_head_kv=2)
    plan = plan_types(GGUFFile(str(p)), "q2_k")
    assert {plan[f"blk.{i}.attn_v.weight"] for i in range(N_LAYER)} == {"Q8_0"}
    p4 = tmp_path / "m4.gguf"
    write_moe(p4, "qwen3moe", 4, 2, n_head=8, n_head_kv=2)
    plan = plan_types(GGUFFile(str(p4)), "q2_k")
    assert {plan[f"blk.{i}.attn_v.weight"] for i in range(N_LAYER)} == {"Q4_K"}


@pytest.mark.parametrize("qtype", ["q4_0", "q8_0", "q4_k"])
def test_expert_tensors_are_quantized_row_by_row(files, tmp_path, qtype):
    import gguf

    src_path, values = files["qwen3moe"]
    out = str(tmp_path / f"{qtype}.gguf")
    r = quantize_file(src_path, out, qtype, n_threads=2, progress=False)
    dst = GGUFFile(out)
    theirs = {t.name: t for t in gguf.GGUFReader(out).tensors}
    for i in (0, 1):
        for kind in ("gate", "up", "down"):
            name = f"blk.{i}.ffn_{kind}_exps.weight"
            t = dst.tensors[name]
            want_t = r.plan[name]
            assert t.type_name == want_t and theirs[name].tensor_type.name == want_t
            src = GGUFFile(src_path).tensors[name]
            assert t.shape == src.shape                                  # [K, M, n_expert]
            assert [int(x) for x in theirs[name].shape] == list(src.shape)
            x = np.asarray(src.data, np.float32)                          # F16 values, (E, M, K)
            rows = x.reshape(-1, x.shape[-1])
            got = np.asarray(t.data).reshape(rows.shape[0], -1)
            if want_t in ("Q4_0", "Q8_0"):
                ref = gguf.quants.quantize(rows, gguf.GGMLQuantizationType[want_t])
            else:
                ref = quants.quantize(rows, want_t)
            np.testing.assert_array_equal(got, ref.reshape(got.shape), err_msg=name)
            # and expert e's rows are expert e's: dequantized, expert 3 is close to the source's
            deq = gguf.quants.dequantize(np.asarray(theirs[name].data), theirs[name].tensor_type)
            deq = deq.reshape(x.shape)
            err = np.abs(deq[3] - x[3]).max() / np.abs(x[3]).max()
            assert err < 0.2, (name, err)
        router = f"blk.{i}.ffn_gate_inp.weight"
        assert dst.tensors[router].type_name == "F32"
        np.testing.assert_array_equal(np.asarray(dst.tensors[router].data), values[router])
