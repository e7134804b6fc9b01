"""Weight-only quantization at load (neural-speed's knobs) for F32 / F16 / BF16 GGUF models.

    model = Model("model-f16.gguf", weight_dtype="int4", group_size=32, scheme="sym",
                  compute_dtype="int8")

Every matmul weight (2-D `*.weight` tensors that feed mul_mat: the projections, the output
head, and token_embd when it is the tied output) is quantized once, at load, in C
(csrc/wquant.c); 1-D tensors (norms, biases) and an untied token_embd (it only feeds get_rows)
stay as they are. The graph does not change: the result is a tensor of a block type that has
kernels already.

The output head (output.weight, or the tied token_embd) is kept at int8 (same scheme and compute)
when weight_dtype is int4, as llama.cpp never gives it 4 bits (Q6_K / Q8_0 in
llama_tensor_get_type): int4 on the head costs most of int4's perplexity on small models
(README, Weight-only quantization). quantize_output=True gives it int4 too.

rounding "imatrix" (default): a calibration pass first (llmrt/imatrix.py: the F16 model run once
over CALIB_TOKENS tokens of a built-in text, E[a_j^2] at every matmul input), then each int4
group's scale (and min) is searched to minimize its importance-weighted squared error
sum_j E[a_j^2] (x_j - q_j)^2 (csrc/wquant.c: candidate scales, least-squares refit), never worse
than min/max under that error; "search": the same search, unweighted (no calibration pass);
"minmax": ggml's reference quantizer (group 32: its exact bytes, the same as `llmrt quantize`).
int8 is always min/max (its rounding error is already small).

    weight_dtype  scheme   compute int8         compute fp32 / bf16
    int4          sym      Q4_0  (x Q8_0)       WQ_Q4_0_F32 / WQ_Q4_0_BF16
    int4          asym     Q4_1  (x Q8_1)       WQ_Q4_1_F32 / WQ_Q4_1_BF16
    int8          sym      Q8_0  (x Q8_0)       WQ_Q8_0_F32 / WQ_Q8_0_BF16
    int8          asym     WQ_Q8A (x Q8_1)      WQ_Q8A_F32  / WQ_Q8A_BF16

group_size 32 | 64 | 128 | -1 (one group per output channel, i.e. per row): one scale (and min)
per group, written into each 32-block of the group, so the values are exactly group-wise
quantization. Memory: the scale is repeated per 32-block, so every group size costs what group
32 costs (int4 sym 4.5 bits per weight, int4 asym 5, int8 sym 8.5, int8 asym 9). A row whose
length is not a multiple of 32 keeps its float type (logged). The WQ_* ids are llmrt-private
(llmrt.h) and never written to a file.

compute_dtype: int8 quantizes the activations to int8 blocks (Q8_0 / Q8_1, integer dots);
fp32 keeps them f32 and dequantizes each weight block inside the dot; bf16 rounds them to
bf16 first (at the AVX-512 levels of a CPU with AVX512-BF16 the dots run on vdpbf16ps: a block's
integer quants are exact in bf16, the scale and min are applied per block in f32).

A model whose matmul weights are already quantized raises ValueError (re-quantizing a quantized
model at load would only lose accuracy; use `llmrt quantize` to make a new file).
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from llmrt import _core
from llmrt.checks import is_int
from llmrt.progress import Progress

log = logging.getLogger("llmrt")

WEIGHT_DTYPES = ("int4", "int8")
GROUP_SIZES = (32, 64, 128, -1)
SCHEMES = ("sym", "asym")
ROUNDINGS = ("imatrix", "search", "minmax")
COMPUTE_DTYPES = ("int8", "fp32", "bf16")
FLOAT_TYPES = {0: "F32", 1: "F16", 30: "BF16"}

# (weight_dtype, scheme) -> {compute_dtype: type name}
_TYPES = {
    ("int4", "sym"): {"int8": "Q4_0", "fp32": "WQ_Q4_0_F32", "bf16": "WQ_Q4_0_BF16"},
    ("int4", "asym"): {"int8": "Q4_1", "fp32": "WQ_Q4_1_F32", "bf16": "WQ_Q4_1_BF16"},
    ("int8", "sym"): {"int8": "Q8_0", "fp32": "WQ_Q8_0_F32", "bf16": "WQ_Q8_0_BF16"},
    ("int8", "asym"): {"int8": "WQ_Q8A", "fp32": "WQ_Q8A_F32", "bf16": "WQ_Q8A_BF16"},
}
_NAME_TO_ID = {tt[0]: i for i in range(256) if (tt := _core.type_traits(i)) is not None}
ROWS_PER_TASK = 64      # rows quantized per C call (progress granularity, thread work unit)


@dataclass(frozen=True)
class WQConfig:
    weight_dtype: str               # int4 | int8
    group_size: int                 # 32 | 64 | 128 | -1 (per output channel)
    scheme: str                     # sym | asym
    compute_dtype: str              # int8 | fp32 | bf16
    rounding: str = "imatrix"       # imatrix | search | minmax (int4 scales; int8: min/max)
    quantize_output: bool = False   # int4: the output head int4 too (else int8)

    @property
    def type_name(self) -> str:
        return _TYPES[(self.weight_dtype, self.scheme)][self.compute_dtype]

    @property
    def type_id(self) -> int:
        return _NAME_TO_ID[self.type_name]

    @property
    def output_type_name(self) -> str:
        """Type of the output head: int8 (same scheme, compute) for int4 unless quantize_output."""
        wd = self.weight_dtype if self.quantize_output else "int8"
        return _TYPES[(wd, self.scheme)][self.compute_dtype]

    def describe(self) -> str:
        g = "per-channel" if self.group_size == -1 else str(self.group_size)
        head = "" if self.output_type_name == self.type_name else f", output {self.output_type_name}"
        rnd = f", {self.rounding} rounding" if self.weight_dtype == "int4" else ""
        return (f"{self.weight_dtype} {self.scheme}, group {g}, compute {self.compute_dtype} "
                f"({self.type_name} blocks{head}{rnd})")


def make_config(weight_dtype: Optional[str] = None, group_size: Optional[int] = None,
                scheme: Optional[str] = None, compute_dtype: Optional[str] = None,
                rounding: Optional[str] = None,
                quantize_output: Optional[bool] = None) -> Optional[WQConfig]:
    """Validate the knobs. None when weight_dtype is None (no quantization at load); defaults
    group 32, sym, int8 compute (DESIGN.md §3), imatrix rounding, output head int8.
    ValueError naming the allowed values."""
    if weight_dtype is None:
        given = [n for n, v in (("group_size", group_size), ("scheme", scheme),
                                ("compute_dtype", compute_dtype), ("rounding", rounding),
                                ("quantize_output", quantize_output)) if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} needs weight_dtype (one of "
                             f"{', '.join(WEIGHT_DTYPES)}): quantization at load is off without it")
        return None
    wd = str(weight_dtype).lower()
    if wd not in WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype must be one of {', '.join(WEIGHT_DTYPES)} (or None), "
                         f"got {weight_dtype!r}")
    gs = 32 if group_size is None else group_size
    if not is_int(gs):   # 32.9 is not 32
        gs = None
    if gs not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {', '.join(map(str, GROUP_SIZES))} "
                         f"(-1: per output channel), got {group_size!r}")
    sc = _choice("scheme", scheme, "sym", SCHEMES)
    cd = _choice("compute_dtype", compute_dtype, "int8", COMPUTE_DTYPES)
    rd = _choice("rounding", rounding, "imatrix", ROUNDINGS)
    if wd == "int8" and rounding is not None and rd != "minmax":
        raise ValueError(f"rounding {rd!r} is for int4 scales: int8 is always min/max "
                         "(leave rounding unset, or 'minmax')")
    if quantize_output is not None and not isinstance(quantize_output, (bool, np.bool_)):
        raise TypeError(f"quantize_output must be True or False (or None), got {quantize_output!r}")
    return WQConfig(wd, int(gs), sc, cd, rd, bool(quantize_output))


def _choice(name: str, value, default: str, allowed) -> str:
    """value (None: default), lower-cased, one of allowed; else ValueError naming them."""
    v = default if value is None else str(value).lower()
    if v not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return v


def matmul_weight_names(tensors) -> list:
    """Names of the weights that feed mul_mat / mul_mat_id: every 2-D `*.weight` and 3-D expert
    tensor (`*_exps.weight`) except an untied token_embd (get_rows only) and the MoE routers
    (`ffn_gate_inp*`: kept at their precision, a rounded router picks other experts).
    `tensors`: {name: TensorInfo}."""
    tied = "output.weight" not in tensors
    out = []
    for name, t in tensors.items():
        if not name.endswith(".weight") or ".ffn_gate_inp" in name:
            continue
        if len(t.shape) != 2 and not (len(t.shape) == 3 and "_exps." in name):
            continue
        if name == "token_embd.weight" and not tied:
            continue
        out.append(name)
    return out


def output_weight_name(tensors) -> str:
    """The output head: output.weight, or token_embd.weight when it is the tied output."""
    return "output.weight" if "output.weight" in tensors else "token_embd.weight"


def rows_f32(data: np.ndarray, type_id: int) -> np.ndarray:
    """Rows of an F32 / F16 / BF16 (raw uint16 bits) tensor view as contiguous float32."""
    if type_id == 30:
        return (data.astype(np.uint32) << 16).view(np.float32)
    return np.ascontiguousarray(data, dtype=np.float32)


def quantize_tensor(x: np.ndarray, type_id: int, group_size: int, rounding: str = "search",
                    importance: Optional[np.ndarray] = None) -> np.ndarray:
    """Group-wise quantize float rows x (rows, k) into (rows, k/32*type_size) uint8 blocks.
    importance (k,): per-column weights of the search's squared error (None: all equal)."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    ts = _core.type_traits(type_id)[2]
    out = np.empty((x.shape[0], x.shape[1] // 32 * ts), dtype=np.uint8)
    imp = None if importance is None else np.ascontiguousarray(importance, dtype=np.float32)
    _core.wq_quantize_rows(x, out, type_id, group_size, rounding != "minmax", imp)
    return out


def _importance_of(importance, name: str, k: int) -> Optional[np.ndarray]:
    """The search's per-column weights of `name` (k,), scaled to mean 1 (the weighted error's
    minimum does not depend on the scale; this keeps the C sums in range), or None (unweighted)
    when there are none, or they are not finite / all zero."""
    v = None if importance is None else importance.get(name)
    if v is None:
        return None
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    if v.shape[0] != k or not np.isfinite(v).all() or (v < 0).any() or not v.max() > 0:
        log.warning("llmrt: %s: unusable importance weights: unweighted search", name)
        return None
    return np.ascontiguousarray(v / v.mean(), dtype=np.float32)


def _expert_importance(importance, name: str, k: int, n_exp: int) -> list:
    """Per expert (one entry for a 2-D weight) the search's column weights of `name`: the
    calibration pass gives an expert tensor one row of E[a^2] per expert ([n_exp, k]; an expert
    no calibration token chose gets None: unweighted)."""
    v = None if importance is None else importance.get(name)
    if n_exp == 1 or v is None:
        return [_importance_of(importance, name, k)] * n_exp
    v = np.asarray(v)
    if v.shape != (n_exp, k):
        log.warning("llmrt: %s: importance of shape %s, expected %s: unweighted search", name,
                    v.shape, (n_exp, k))
        return [None] * n_exp
    return [_importance_of({name: v[e]}, name, k) if v[e].max() > 0 else None for e in range(n_exp)]


def require_float_weights(gguf) -> list:
    """The names of gguf's matmul weights; ValueError if one of them is already quantized
    (checked before any work at load: the importance pass of int4's imatrix rounding too)."""
    names = matmul_weight_names(gguf.tensors)
    bad = [(n, gguf.tensors[n].type_name) for n in names if gguf.tensors[n].type not in FLOAT_TYPES]
    if bad:
        kinds = sorted({k for _, k in bad})
        raise ValueError(
            f"weight_dtype needs an F32/F16/BF16 model, but {gguf.path} has {len(bad)} quantized "
            f"matmul weights ({', '.join(kinds)}; e.g. {bad[0][0]}): load it without weight_dtype "
            f"(or quantize a float model with `llmrt quantize`)")
    return names


def quantize_weights(gguf, cfg: WQConfig, n_threads: int = 1, progress: Optional[bool] = None,
                     importance: Optional[Dict[str, np.ndarray]] = None,
                     ) -> Tuple[Dict[str, Tuple[np.ndarray, int, tuple]], str]:
    """Quantize gguf's matmul weights per cfg. Returns ({name: (blocks uint8, type_id, shape)}
    for the graph (shape in ggml order), a one-line summary for logs). ValueError if a matmul
    weight is already quantized."""
    names = require_float_weights(gguf)
    t0 = time.perf_counter()
    todo, skipped = [], []
    for n in names:
        t = gguf.tensors[n]
        (todo if t.shape[0] % 32 == 0 else skipped).append(t)
    for t in skipped:
        log.warning("llmrt: %s: rows of %d elements are not a multiple of 32: kept as %s",
                    t.name, t.shape[0], t.type_name)
    head = output_weight_name(gguf.tensors)
    search = cfg.rounding != "minmax"
    if cfg.output_type_name != cfg.type_name:
        log.info("llmrt: %s kept at int8 (%s; quantize_output=True for %s)", head,
                 cfg.output_type_name, cfg.weight_dtype)
    total_rows = sum(int(np.prod(t.shape[1:])) for t in todo)
    out: Dict[str, Tuple[np.ndarray, int, tuple]] = {}
    bytes_before = sum(t.nbytes for t in todo)
    with Progress(total=total_rows, desc="quantizing", unit="rows", enabled=progress) as bar, \
            ThreadPoolExecutor(max_workers=max(1, n_threads)) as pool:
        for t in todo:
            k, m = t.shape[0], t.shape[1]
            n_exp = t.shape[2] if len(t.shape) == 3 else 1     # experts: each with its importance
            rows = m * n_exp
            tid = _NAME_TO_ID[cfg.output_type_name if t.name == head else cfg.type_name]
            ts = _core.type_traits(tid)[2]
            blocks = np.empty((rows, k // 32 * ts), dtype=np.uint8)
            src = t.data.reshape(rows, k)
            imps = _expert_importance(importance, t.name, k, n_exp)
            tasks = [(e * m + r0, e * m + min(r0 + ROWS_PER_TASK, m), imps[e])
                     for e in range(n_exp) for r0 in range(0, m, ROWS_PER_TASK)]

            def work(task, t=t, src=src, blocks=blocks, tid=tid):
                r0, r1, imp = task
                x = rows_f32(src[r0:r1], t.type)
                _core.wq_quantize_rows(x, blocks[r0:r1], tid, cfg.group_size, search, imp)
                return r1 - r0

            for n in pool.map(work, tasks):
                bar.update(n)
            out[t.name] = (blocks, tid, tuple(t.shape))
    bytes_after = sum(v[0].nbytes for v in out.values())
    summary = (f"quantized {len(out)} weights at load: {cfg.describe()}; {bytes_before / 1e6:.1f} MB "
               f"-> {bytes_after / 1e6:.1f} MB in {time.perf_counter() - t0:.2f} s")
    log.info("llmrt: %s", summary)
    return out, summary
