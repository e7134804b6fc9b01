"""`llmrt quantize IN.gguf OUT.gguf TYPE`: write a quantized GGUF that llama.cpp treats as its own.

    from llmrt.quantize import quantize_file
    quantize_file("model-f16.gguf", "model-q4_0.gguf", "q4_0", n_threads=2)

TYPE is q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k or q6_k. The per-tensor choices
follow llama-quantize (src/llama-quant.cpp: tensor_allows_quantization, llama_tensor_get_type,
tensor_type_fallback), without an importance matrix:
  - only 2-D and 3-D tensors (ggml_n_dims: a [K, 1] tensor is 1-D) whose name ends in "weight"
    are quantized, never "*_norm.weight" nor the MoE router "ffn_gate_inp.weight"; 1-D tensors
    (norms, biases, Qwen2-MoE's ffn_gate_inp_shexp) keep their type;
  - the output tensor (or token_embd when the model has no output.weight: tied embeddings)
    becomes Q6_K for every type but q8_0 (Q8_0 if its rows are not a multiple of the block size);
  - q2_k / q3_k / q4_k / q5_k are llama.cpp's mixtures Q2_K, Q3_K_M, Q4_K_M, Q5_K_M: attn_v,
    ffn_down, attn_output and attn_qkv get more bits in the same layers as llama.cpp;
  - MoE files (<arch>.expert_count): the 3-D experts blk.N.ffn_{gate,up,down}_exps ([K, M,
    n_expert]) are quantized row by row, every expert's M rows, with the rules of ffn_gate /
    ffn_up / ffn_down (llama.cpp matches "ffn_down" etc. as substrings; the shared experts
    ffn_*_shexp too), their layer taken from the name; with exactly 8 experts (Mixtral) attn_v
    and attn_k are Q8_0 whatever the type and attn_output Q5_K in q2_k / q3_k / q4_k;
  - the per-category counters run in llama.cpp's tensor order (by layer, then by name), and
    ffn_down's number of layers is block_count (not the number of ffn_down-like tensors);
  - a row length that is not a multiple of the block size falls back as llama.cpp does (Q2_K,
    Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; F16 if still not divisible, and F16
    for the 32-block types, as llama.cpp's tensor_type_fallback of llama-cpp-python 0.3.36);
  - general.file_type is set to llama.cpp's ftype and general.quantization_version to 2; every
    other key is copied; the alignment is kept.
Quantization uses the reference rounding (llmrt.quants = ggml's quantize_row_*_ref), so a q4_0
file's tensor bytes equal llama-quantize's. Sources may be F32 / F16 / BF16; quantized sources
are dequantized first (with a warning: that loses accuracy twice). The file is written to a
temporary name next to OUT and renamed at the end, so an error leaves nothing half-written.
"""
from __future__ import annotations

import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from llmrt import quants
from llmrt.atomic import atomic_file, writable_target
from llmrt.errors import ModelFormatError
from llmrt.gguf import GGUFFile, merged_expert_name
from llmrt.progress import Progress

log = logging.getLogger("llmrt")

# TYPE -> (default tensor type, llama_ftype: LLAMA_FTYPE_MOSTLY_* of llama.h)
QUANT_TYPES = {
    "q4_0": ("Q4_0", 2), "q4_1": ("Q4_1", 3), "q8_0": ("Q8_0", 7), "q5_0": ("Q5_0", 8),
    "q5_1": ("Q5_1", 9), "q2_k": ("Q2_K", 10), "q3_k": ("Q3_K", 12),  # Q3_K_M
    "q4_k": ("Q4_K", 15),  # Q4_K_M
    "q5_k": ("Q5_K", 17),  # Q5_K_M
    "q6_k": ("Q6_K", 18),
}
_ALIASES = {"q3_k_m": "q3_k", "q4_k_m": "q4_k", "q5_k_m": "q5_k"}   # llama-quantize's names
FLOAT_TYPES = {0, 1, 30}        # F32, F16, BF16
_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
ROWS_PER_TASK = 256


_NO_QUANT_SUBSTR = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight",
                    "indexer.k_proj.weight", "indexer.q_proj.weight", "attn_rel_b.weight",
                    ".position_embd", "time_mix_first.weight", "time_mix_w0.weight",
                    "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight",
                    "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
                    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
                    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
                    "time_mix_lerp_fused.weight")


def _n_dims(shape) -> int:
    """ggml_n_dims: the number of dimensions up to the last one > 1 (at least 1): a [K, 1]
    tensor counts as 1-D."""
    n = 1
    for i, d in enumerate(shape):
        if d > 1:
            n = i + 1
    return n


def _allows_quantization(name: str, shape) -> bool:
    """llama.cpp's tensor_allows_quantization: 2-D and 3-D (expert) tensors whose name ends in
    "weight", never norms, the MoE router (ffn_gate_inp.weight), position / token-type
    embeddings and a few small tensors of other architectures."""
    if _n_dims(shape) < 2 or not name.endswith("weight"):
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    return not any(s in name for s in _NO_QUANT_SUBSTR)


def _category(name: str) -> str:
    """llama.cpp's tensor_get_category: substring matches, in its order. `ffn_up` / `ffn_gate` /
    `ffn_down` also match the experts (ffn_gate_exps, ...) and the shared experts (ffn_down_shexp,
    ...); ffn_gate_inp (the router) is never quantized, so its category does not matter."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"),
                     ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"),
                     ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                     ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if key in name:
            return cat
    return "other"


_ATTN_V = ("attn_v", "attn_qkv", "attn_kv_b")      # llama.cpp's category_is_attn_v
_BLK = re.compile(r"blk\.(-?\d+)\.")
# (architecture, n_layer) that llama.cpp's load_hparams calls LLM_TYPE_70B (llama: only with GQA)
_TYPE_70B = {("llama", 80), ("deci", 80), ("olmo", 80), ("qwen2", 80), ("jais2", 68)}


def _blk(name: str) -> int:
    """sscanf(name, "blk.%d.") or -1."""
    m = _BLK.match(name)
    return int(m.group(1)) if m else -1


def _llama_order(name: str):
    """llama_model_loader's weights_map order (weight_name_comparer): by layer (-1 for the
    tensors outside the blocks), then by name. llama.cpp's per-category counters count in it."""
    return (_blk(name), name)


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _first(v, default: int = 0) -> int:
    """A hyperparameter that may be a per-layer array: its layer-0 value (llama.cpp's
    n_head(0), n_head_kv(0))."""
    if v is None:
        return default
    if np.ndim(v):
        return int(np.asarray(v).reshape(-1)[0]) if np.size(v) else default
    return int(v)


def plan_types(f: GGUFFile, qtype: str) -> Dict[str, str]:
    """{tensor name: output type name} as llama-quantize picks them for TYPE `qtype`
    (llama_tensor_get_type_impl of src/llama-quant.cpp for these ftypes, no imatrix).

    MoE (`<arch>.expert_count` > 1): the 3-D expert tensors blk.N.ffn_{gate,up,down}_exps and
    the shared experts ffn_{gate,up,down}_shexp take the category of ffn_gate / ffn_up /
    ffn_down (substring match) and their layer from their name; the router ffn_gate_inp (and
    the 1-D ffn_gate_inp_shexp) keep their type. With exactly 8 experts (Mixtral) attn_v and
    attn_k become Q8_0 for every type, attn_output Q5_K for q2_k / q3_k / q4_k.
    The counters run as llama.cpp's do: over the tensors in its order (by layer, then by name),
    i_attention_wv over the attn_v-like tensors, and ffn_down's layer count is block_count."""
    default, ftype = QUANT_TYPES[qtype]
    tensors = f.tensors
    arch = f.architecture
    tied = "output.weight" not in tensors
    n_head = _first(f.arch_get("attention.head_count"), 1)
    n_head_kv = f.arch_get("attention.head_count_kv")
    n_head_kv = n_head if n_head_kv is None else _first(n_head_kv)
    n_gqa = n_head // n_head_kv if n_head_kv else 0
    n_expert = _first(f.arch_get("expert_count"), 0)
    n_layer = _first(f.arch_get("block_count"), 0)
    if n_layer <= 0:                       # llama.cpp requires the key; count the blocks instead
        n_layer = len({_blk(n) for n in tensors if _blk(n) >= 0})
    is_70b = (arch, n_layer) in _TYPE_70B and not (arch == "llama" and n_head == n_head_kv)
    n_attention_wv = sum(1 for n in tensors if _category(n) in _ATTN_V)
    i_attention_wv = 0
    counter = {"ffn_down": 0, "ffn_gate": 0, "ffn_up": 0}

    def layer_info(cat: str, name: str):
        i = counter[cat]
        if max(1, n_expert) > 1:           # experts need not be consecutive: parse the name
            i = _blk(name)
            if not name.startswith("blk.") or i < 0 or i >= n_layer:
                raise ValueError(f"[quantize] {name}: cannot determine its layer in [0, {n_layer})")
        return i, n_layer

    plan = {}
    for name in sorted(tensors, key=_llama_order):
        t = tensors[name]
        if not _allows_quantization(name, t.shape):
            plan[name] = quants.type_name(t.type)
            continue
        cat = _category(name)
        new = default
        if cat == "output" or (tied and cat == "token_embd"):
            if arch == "falcon" or t.shape[0] % quants.block_size(default) != 0:
                new = "Q8_0"
            elif default != "Q8_0":
                new = "Q6_K"
        elif cat == "token_embd":
            pass
        elif cat in _ATTN_V:
            if ftype == 10:                                  # Q2_K
                new = "Q4_K" if n_gqa >= 4 else "Q3_K"
            elif ftype == 12:                                # Q3_K_M
                new = "Q5_K" if i_attention_wv < 2 else "Q4_K"
            elif ftype in (15, 17) and _use_more_bits(i_attention_wv, n_attention_wv):
                new = "Q6_K"                                 # Q4_K_M, Q5_K_M
            if is_70b and new in ("Q3_K", "Q4_K"):
                new = "Q5_K"
            if n_expert == 8:
                new = "Q8_0"
            i_attention_wv += 1
        elif cat == "attn_k":
            if n_expert == 8:
                new = "Q8_0"
        elif cat == "ffn_down":
            i, n = layer_info(cat, name)
            if ftype == 10:
                new = "Q3_K"
            elif ftype == 12:
                new = "Q5_K" if i < n // 16 else (
                    "Q4_K" if arch != "falcon" or _use_more_bits(i, n) else "Q3_K")
            elif ftype == 15:
                if arch == "falcon":
                    new = "Q6_K" if i < n // 16 else ("Q5_K" if _use_more_bits(i, n) else "Q4_K")
                elif _use_more_bits(i, n):
                    new = "Q6_K"
            elif ftype == 17 and _use_more_bits(i, n):
                new = "Q6_K"
            counter[cat] += 1
        elif cat == "attn_output":
            if arch != "falcon":
                if n_expert == 8:
                    if ftype in (10, 12, 15):
                        new = "Q5_K"
                elif ftype == 10:
                    new = "Q3_K"
                elif ftype == 12:
                    new = "Q4_K"
        elif cat in ("ffn_gate", "ffn_up"):
            layer_info(cat, name)          # only IQ3_XS changes these; llama.cpp still checks the layer
            counter[cat] += 1
        # incompatible row length: llama.cpp's tensor_type_fallback
        if t.shape[0] % quants.block_size(new) != 0:
            fb = _FALLBACK.get(new)
            if fb is None:
                if quants.block_size(new) > 32:
                    raise ValueError(f"{name}: rows of {t.shape[0]} elements are not a multiple of "
                                     f"the {new} block size ({quants.block_size(new)}) and llama.cpp "
                                     f"has no fallback type for {new}")
                fb = new                     # a 32-block type: F16 below, as llama.cpp does
            if t.shape[0] % quants.block_size(fb) != 0:
                fb = "F16"
            log.warning("llmrt: %s: %d columns not divisible by %d (%s): falling back to %s",
                        name, t.shape[0], quants.block_size(new), new, fb)
            new = fb
        plan[name] = new
    return {name: plan[name] for name in tensors}       # in the file's order


def tensor_f32(t) -> np.ndarray:
    """Rows of tensor t as float32, numpy order (..., ne0)."""
    if t.type == 0:
        return np.asarray(t.data)
    rows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
    raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(rows, -1)
    return quants.dequantize(raw, t.type).reshape(tuple(reversed(t.shape)))


def convert(src: np.ndarray, type_name: str, n_threads: int = 1,
            on_rows: Optional[Callable[[int], None]] = None) -> np.ndarray:
    """Float rows src (rows, k) -> bytes of type_name: uint8 (rows, row_bytes), or float16 /
    float32 arrays for F16 / F32, in ROWS_PER_TASK chunks on n_threads threads."""
    rows, k = src.shape
    if type_name in ("F32", "F16"):
        out = np.asarray(src, dtype=np.float32 if type_name == "F32" else np.float16)
        if on_rows:
            on_rows(rows)
        return out
    out = np.empty((rows, quants.row_size(type_name, k)), dtype=np.uint8)

    def work(r0):
        r1 = min(r0 + ROWS_PER_TASK, rows)
        out[r0:r1] = quants.quantize(src[r0:r1], type_name)
        return r1 - r0

    with ThreadPoolExecutor(max_workers=max(1, n_threads)) as pool:
        for n in pool.map(work, range(0, rows, ROWS_PER_TASK)):
            if on_rows:
                on_rows(n)
    return out


def write_gguf(f: GGUFFile, out_path: str, types: Dict[str, str], n_threads: int = 1,
               extra_kv: Optional[dict] = None, desc: str = "quantizing",
               progress: Optional[bool] = None) -> Tuple[int, int]:
    """Write f's keys (updated by extra_kv: {key: (value, GGUFValueType)}) and its tensors, each
    converted to types[name], to out_path (through a temporary file renamed at the end).
    Returns (bytes of tensor data in, out)."""
    from gguf import GGUFValueType, GGUFWriter, GGMLQuantizationType

    with atomic_file(out_path, prefix=".llmrt-quantize-", suffix=".gguf.tmp") as tmp:
        w = GGUFWriter(tmp, f.architecture)
        w.data_alignment = f.alignment
        extra_kv = dict(extra_kv or {})
        for key, value in f.metadata.items():
            if key == "general.architecture":
                continue
            if key in extra_kv:
                v, vt = extra_kv.pop(key)
                w.add_key_value(key, v, vt)
                continue
            vt = f.kv_types[key]
            if isinstance(vt, tuple):
                sub = GGUFValueType(vt[1])
                if isinstance(value, np.ndarray):
                    value = value.tolist()
                w.add_key_value(key, list(value), GGUFValueType.ARRAY, sub)
            else:
                w.add_key_value(key, value, GGUFValueType(vt))
        for key, (v, vt) in extra_kv.items():
            w.add_key_value(key, v, vt)
        for name, t in f.tensors.items():
            tn = types[name]
            tid = quants.type_id(tn)
            nbytes = quants.row_size(tn, t.shape[0]) * (t.n_elements // t.shape[0])
            shape = tuple(reversed(t.shape))
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes,
                              raw_dtype=GGMLQuantizationType(tid))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        n_in = n_out = 0
        total_rows = sum(t.n_elements // t.shape[0] for t in f.tensors.values())
        with Progress(total=total_rows, desc=desc, unit="rows", enabled=progress) as bar:
            for name, t in f.tensors.items():
                tn = types[name]
                rows = t.n_elements // t.shape[0]
                if tn == quants.type_name(t.type):        # kept as is: copy the bytes
                    data = np.ascontiguousarray(t.data)
                    bar.update(rows)
                else:
                    x = tensor_f32(t).reshape(rows, t.shape[0])
                    data = convert(x, tn, n_threads, bar.update)
                w.write_tensor_data(data)
                n_in += t.nbytes
                n_out += data.nbytes
        w.close()
    return n_in, n_out


@dataclass
class QuantizeResult:
    in_path: str
    out_path: str
    qtype: str
    plan: Dict[str, str]        # {tensor name: type written}
    bytes_in: int               # tensor data
    bytes_out: int
    seconds: float

    def summary(self) -> str:
        counts: Dict[str, int] = {}
        for tn in self.plan.values():
            counts[tn] = counts.get(tn, 0) + 1
        return (f"quantized {self.in_path} -> {self.out_path} ({self.qtype}): "
                f"{self.bytes_in / 1e6:.1f} MB -> {self.bytes_out / 1e6:.1f} MB in "
                f"{self.seconds:.1f} s; tensors: "
                + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))


def check_input(f: GGUFFile) -> None:
    """IN read as the loader reads a model of its architecture (hyperparameters, the tensors it
    needs and their shapes), so a file llmrt could not load is an error naming the key or tensor
    before any work, not an output that fails at load. An architecture llmrt does not run is
    quantized as it is (llama-quantize's rules need no more than the tensor names)."""
    from llmrt.model import check_tensors
    from llmrt.models import get_family

    try:
        family = get_family(f.architecture, where=str(f.path))
    except ModelFormatError:
        log.info("llmrt: architecture %r: quantized without llmrt's model checks", f.architecture)
        return
    hp = family.HParams.from_gguf(f)
    stacked: dict = {}          # old Mixtral files: the merged shape of each layer's experts
    for n, t in f.tensors.items():
        merged = merged_expert_name(n)
        if merged is not None:
            stacked.setdefault(merged, [tuple(t.shape), 0])[1] += 1
    check_tensors(f, family, hp, {k: shape + (n,) for k, (shape, n) in stacked.items()})


def quantize_file(in_path, out_path, qtype: str, n_threads: int = 1,
                  progress: Optional[bool] = None) -> QuantizeResult:
    """Quantize a GGUF file to TYPE `qtype` (see the module doc)."""
    from gguf import GGUFValueType

    q = str(qtype).lower()
    q = _ALIASES.get(q, q)
    if q not in QUANT_TYPES:
        raise ValueError(f"[quantize] TYPE must be one of {', '.join(QUANT_TYPES)}, got {qtype!r}")
    real_out = writable_target(out_path)   # before the work: a path it cannot write is an error
    if os.path.exists(real_out) and os.path.exists(in_path) and os.path.samefile(in_path, real_out):
        raise ValueError(f"[quantize] OUT is the same file as IN ({os.path.realpath(in_path)})")
    t0 = time.perf_counter()
    f = GGUFFile(in_path)
    try:
        check_input(f)
        plan = plan_types(f, q)
        requant = sorted({t.type_name for n, t in f.tensors.items()
                          if t.type not in FLOAT_TYPES and plan[n] != t.type_name})
        if requant:
            log.warning("llmrt: %s has quantized tensors (%s): they are dequantized and quantized "
                        "again, which loses accuracy twice; quantize from an F32/F16/BF16 file "
                        "when you can", os.path.basename(f.path), ", ".join(requant))
        for n, t in f.tensors.items():
            if not quants.can_dequantize(t.type) and plan[n] != t.type_name:
                raise ValueError(f"[quantize] {n}: cannot convert {t.type_name} tensors")
        ftype = QUANT_TYPES[q][1]
        extra = {"general.file_type": (ftype, GGUFValueType.UINT32),
                 "general.quantization_version": (2, GGUFValueType.UINT32)}
        n_in, n_out = write_gguf(f, out_path, plan, n_threads, extra, progress=progress)
    finally:
        f.close()
    r = QuantizeResult(os.fspath(in_path), os.fspath(out_path), q, plan, n_in, n_out,
                       time.perf_counter() - t0)
    log.info("llmrt: %s", r.summary())
    return r


def float_file(in_path, out_path, float_type: str = "F16", progress: Optional[bool] = None) -> None:
    """Dequantize every quantized tensor of a GGUF file to F16 (or F32 / ... ), keeping F32 / F16 /
    BF16 tensors as they are: a float model to test quantization with (tools/make_f16.py).
    general.file_type becomes 1 (MOSTLY_F16) or 0 (ALL_F32)."""
    from gguf import GGUFValueType

    f = GGUFFile(in_path)
    try:
        types = {n: (quants.type_name(t.type) if t.type in FLOAT_TYPES else float_type)
                 for n, t in f.tensors.items()}
        ftype = {"F32": 0, "F16": 1}[float_type]
        write_gguf(f, out_path, types, 1, {"general.file_type": (ftype, GGUFValueType.UINT32)},
                   desc="dequantizing", progress=progress)
    finally:
        f.close()
