"""Mixture-of-experts FFN shared by the families (llama.cpp's build_moe_ffn).

    logits = ffn_gate_inp · h                               # [n_expert, n]
    probs  = softmax(logits)                                # per token
    chosen = top-k(probs)                                   # k = expert_used_count
    w      = probs[chosen]  (/ Σ w when the family renormalises: Mixtral, Qwen3-MoE)
    y      = Σ_s w_s · down_s(silu(gate_s · h) ⊙ up_s · h)   # one MUL_MAT_ID per projection
    y     += sigmoid(ffn_gate_inp_shexp · h) · shared(h)    # Qwen2-MoE's shared expert

Expert weights are merged 3-D tensors `ffn_{gate,up,down}_exps` ([n_embd, n_ff_exp, n_expert] /
[n_ff_exp, n_embd, n_expert] in ggml order); old Mixtral files hold one 2-D tensor per expert
(`ffn_gate.E.weight`, ...), which `stack_split_experts` copies into the merged form at load.
Whatever MoE feature a file asks for that llmrt does not run (merged gate+up experts, a
selection bias, sigmoid gating, leading dense layers) is a ModelFormatError naming it.
"""
import numpy as np

from llmrt.errors import ModelFormatError
from llmrt.gguf import SPLIT_EXPERT

PROJ = ("gate", "up", "down")
# tensors of MoE variants llmrt does not run (llama.cpp names)
_UNSUPPORTED_TENSORS = {
    "ffn_gate_up_exps": "experts with merged gate+up tensors",
    "exp_probs_b": "an expert selection bias (exp_probs_b)",
    "ffn_gate_chexp": "chunked experts",
}


def read_moe_hparams(r, f, fields: dict, norm: bool, required: bool = False) -> dict:
    """The MoE fields of a family's HParams from `{arch}.expert_*` keys (and tensor shapes),
    checked; {} keeps a dense model dense (a ModelFormatError when the architecture is MoE
    only: `required`)."""
    n_expert = r.get("expert_count", 0, kind=int)
    n_used = r.get("expert_used_count", 0, kind=int)
    if n_expert == 0:
        if required:
            raise ModelFormatError(f"{r.where}: {r.arch} needs {r.arch}.expert_count (got none)")
        if n_used:
            raise ModelFormatError(f"{r.where}: {r.arch}.expert_used_count is {n_used} but there "
                                   f"is no {r.arch}.expert_count")
        return {}
    if not 1 <= n_used <= n_expert:
        raise ModelFormatError(f"{r.where}: {r.arch}.expert_used_count ({n_used}) must be in "
                               f"[1, expert_count = {n_expert}]")
    for t in f.tensors:
        part = t.split(".")[2] if t.count(".") >= 2 else ""
        if part in _UNSUPPORTED_TENSORS:
            raise ModelFormatError(f"{r.where}: tensor {t}: {_UNSUPPORTED_TENSORS[part]} is not "
                                   f"supported by llmrt (architecture {r.arch})")
    gating = r.get("expert_gating_func", 0, kind=int)
    if gating not in (0, 1):   # llama.cpp: 1 softmax, 2 sigmoid, 3 softmax over the chosen
        raise ModelFormatError(f"{r.where}: {r.arch}.expert_gating_func = {gating} (not softmax) "
                               f"is not supported by llmrt for architecture {r.arch}")
    if r.get("leading_dense_block_count", 0, kind=int):
        raise ModelFormatError(f"{r.where}: {r.arch}.leading_dense_block_count: dense layers before "
                               f"the MoE layers are not supported by llmrt for architecture {r.arch}")
    n_ff_exp = r.get("expert_feed_forward_length", 0, kind=int)
    if n_ff_exp == 0:           # Mixtral, OLMoE: the expert size is the FFN size (or the tensor's)
        name = next((n for n in ("blk.0.ffn_gate_exps.weight", "blk.0.ffn_gate.0.weight") if n in f.tensors), None)
        n_ff_exp = _dim(f, name, 1) if name is not None else fields["n_ff"]
    n_ff_shexp = r.get("expert_shared_feed_forward_length", 0, kind=int)
    if n_ff_shexp == 0:         # sized by the first layer that has one (then every layer must)
        shexp = sorted((t for t in f.tensors if "_shexp." in t), key=_block_order)
        gate = next((t for t in shexp if t.endswith(".ffn_gate_shexp.weight")), None)
        if gate is not None:
            n_ff_shexp = _dim(f, gate, 1)
        elif shexp:
            raise ModelFormatError(f"{r.where}: tensor {shexp[0]} belongs to a shared expert, but "
                                   "no layer has its ffn_gate_shexp.weight")
    if n_ff_exp <= 0:
        raise ModelFormatError(f"{r.where}: no expert FFN size ({r.arch}.expert_feed_forward_length)")
    return dict(n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp, n_ff_shexp=n_ff_shexp,
                expert_norm=norm)


def _block_order(name: str):
    """blk.10.x after blk.9.x (then by name)."""
    parts = name.split(".")
    return (int(parts[1]) if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() else -1, name)


def _dim(f, name: str, i: int) -> int:
    """Dimension i (ggml order) of tensor `name`, with a clear error when it has fewer."""
    shape = tuple(f.tensors[name].shape)
    if len(shape) <= i:
        raise ModelFormatError(f"{f.path}: tensor {name} has shape {shape}: expected at least {i + 1} dimensions")
    return int(shape[i])


def required_tensors(hp, b: str) -> list:
    names = [b + "ffn_gate_inp.weight"] + [b + f"ffn_{p}_exps.weight" for p in PROJ]
    if hp.n_ff_shexp:
        names += [b + "ffn_gate_inp_shexp.weight"] + [b + f"ffn_{p}_shexp.weight" for p in PROJ]
    return names


def tensor_shapes(hp) -> dict:
    """Per-layer tensor suffix -> expected shape (ggml order) of the MoE tensors."""
    e, d, f, s = hp.n_expert, hp.n_embd, hp.n_ff_exp, hp.n_ff_shexp
    shapes = {"ffn_gate_inp.weight": (d, e), "ffn_gate_exps.weight": (d, f, e),
              "ffn_up_exps.weight": (d, f, e), "ffn_down_exps.weight": (f, d, e)}
    if s:
        shapes.update({"ffn_gate_inp_shexp.weight": (d,), "ffn_gate_shexp.weight": (d, s),
                       "ffn_up_shexp.weight": (d, s), "ffn_down_shexp.weight": (s, d)})
    return shapes


def split_importance(importance: dict, stacked: dict) -> dict:
    """The calibration pass's importance of merged experts ((n_expert, K) per merged name) as
    the per-expert tensors of an old file name them ({"blk.N.ffn_gate.E.weight": (K,)})."""
    out = {}
    for merged, v in importance.items():
        if merged in stacked and np.ndim(v) == 2:
            il, proj = merged.split(".")[1], merged.split(".")[2][len("ffn_"):-len("_exps")]
            for e in range(v.shape[0]):
                out[f"blk.{il}.ffn_{proj}.{e}.weight"] = v[e]
    return out


def stack_split_experts(f, hp, replaced=None) -> dict:
    """Old Mixtral files (one 2-D tensor per expert): {merged name: (data, type id, shape)} with
    the experts' rows copied into one 3-D tensor per layer and projection; {} otherwise.
    `replaced` ({name: (blocks, type id, shape)}, weights quantized at load): merge those instead
    of the file's tensors (only the merged tensors whose experts are all in it are returned)."""
    if not getattr(hp, "n_expert", 0):
        return {}
    split = {}
    for name in f.tensors:
        m = SPLIT_EXPERT.match(name)
        if m:
            split.setdefault((int(m.group(1)), m.group(2)), {})[int(m.group(3))] = f.tensors[name]
    out = {}
    for (il, proj), parts in sorted(split.items()):
        merged = f"blk.{il}.ffn_{proj}_exps.weight"
        if merged in f.tensors:
            raise ModelFormatError(f"{f.path}: layer {il} has both {merged} and per-expert ffn_{proj} tensors")
        if len(parts) != hp.n_expert or sorted(parts) != list(range(len(parts))):
            raise ModelFormatError(f"{f.path}: layer {il} has per-expert ffn_{proj} tensors for experts "
                                   f"{sorted(parts)}, expected 0..{hp.n_expert - 1}")
        if replaced is not None:
            names = [f"blk.{il}.ffn_{proj}.{e}.weight" for e in range(hp.n_expert)]
            if all(n in replaced for n in names):
                r0 = replaced[names[0]]
                data = np.concatenate([replaced[n][0].reshape(-1).view(np.uint8) for n in names])
                out[merged] = (data, r0[1], tuple(r0[2]) + (hp.n_expert,))
            continue
        first = parts[0]
        for e, t in parts.items():
            if t.type != first.type or tuple(t.shape) != tuple(first.shape):
                raise ModelFormatError(f"{f.path}: blk.{il}.ffn_{proj}.{e}.weight is {t.type_name} "
                                       f"{tuple(t.shape)}, expert 0 is {first.type_name} {tuple(first.shape)}")
        data = np.concatenate([parts[e].data.reshape(-1).view(np.uint8) for e in range(hp.n_expert)])
        if first.data.dtype != np.uint8:
            data = data.view(first.data.dtype)
        out[merged] = (data, first.type, tuple(first.shape) + (hp.n_expert,))
    return out


def moe_ffn(g, hp, w, b: str, h):
    """The MoE FFN of layer prefix b on the normalized input h [n_embd, n] -> [n_embd, n]."""
    logits = g.mul_mat(w(b + "ffn_gate_inp.weight"), h)                      # [n_expert, n]
    route = g.moe_route(logits, hp.n_expert_used, "softmax", hp.expert_norm)  # [2k, n]
    f = g.mul_mat_id(w(b + "ffn_gate_exps.weight"), h, route, up=w(b + "ffn_up_exps.weight"),
                     act="silu")                                              # [n_ff_exp, k, n]
    y = g.mul_mat_id(w(b + "ffn_down_exps.weight"), f, route)                 # [n_embd, k, n]
    if not hp.n_ff_shexp:
        return g.moe_sum(y, route)
    s = g.glu(g.mul_mat(w(b + "ffn_gate_shexp.weight"), h), g.mul_mat(w(b + "ffn_up_shexp.weight"), h), "silu")
    s = g.mul_mat(w(b + "ffn_down_shexp.weight"), s)                         # [n_embd, n]
    sg = g.mul_mat(w(b + "ffn_gate_inp_shexp.weight"), h)                    # [1, n]
    return g.moe_sum(y, route, s, sg)
