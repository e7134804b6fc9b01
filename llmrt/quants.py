"""Dequantize / quantize GGUF tensor data with llmrt's C kernels.

Same shape conventions as ``gguf.quants``: the last axis is bytes on the quantized side and
elements on the float side (``n_bytes = n_elements / block_size * type_size``); leading axes are
kept. Quantization uses llama.cpp's reference rounding (``quantize_row_*_ref``): the bytes equal
``gguf.quants.quantize`` for F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0; Q8_1, Q8_K and IQ4_NL
follow the ggml reference code; Q2_K..Q6_K follow ggml's reference (no importance matrix),
evaluated without fused multiply-adds. IQ4_XS can be dequantized but not quantized.

    >>> import numpy as np
    >>> from llmrt import quants
    >>> raw = quants.quantize(np.ones((4, 64), np.float32), "Q8_0")      # (4, 68) uint8
    >>> quants.dequantize(raw, "q8_0").shape
    (4, 64)

``qtype`` may be a ``gguf.GGMLQuantizationType``, its name (case-insensitive) or its integer id.
"""
from __future__ import annotations

import numpy as np

from llmrt import _core

__all__ = ["dequantize", "quantize", "block_size", "type_size", "row_size", "type_id", "type_name",
           "can_dequantize", "can_quantize"]

# name -> ggml type id, for every type that has traits in csrc/types.c
_NAME_TO_ID = {tt[0]: i for i in range(256) if (tt := _core.type_traits(i)) is not None}


def type_id(qtype, _fn: str = "type_id") -> int:
    """ggml type id of ``qtype`` (GGMLQuantizationType, name, or int). ValueError if llmrt does not
    know the type."""
    if isinstance(qtype, str):
        tid = _NAME_TO_ID.get(qtype.upper())
        if tid is None:
            raise ValueError(f"[{_fn}] unknown tensor type {qtype!r}; known: {', '.join(_NAME_TO_ID)}")
        return tid
    try:
        tid = int(qtype)  # IntEnum (GGMLQuantizationType) or int
    except (TypeError, ValueError):
        raise ValueError(f"[{_fn}] tensor type must be a GGMLQuantizationType, name or int, "
                         f"not {qtype!r}") from None
    if not 0 <= tid < 256 or _core.type_traits(tid) is None:
        label = getattr(qtype, "name", None) or f"id {tid}"
        raise ValueError(f"[{_fn}] tensor type {label} is not supported by llmrt")
    return tid


def type_name(qtype) -> str:
    return _core.type_traits(type_id(qtype))[0]


def block_size(qtype) -> int:
    """Elements per block (1 for F32/F16/BF16, 32 for Q4_0.., 256 for K-quants)."""
    return _core.type_traits(type_id(qtype, "block_size"))[1]


def type_size(qtype) -> int:
    """Bytes per block."""
    return _core.type_traits(type_id(qtype, "type_size"))[2]


def row_size(qtype, n: int) -> int:
    """Bytes of a row of ``n`` elements. ValueError if ``n`` is not a multiple of the block size."""
    tid = type_id(qtype, "row_size")
    name, bs, ts = _core.type_traits(tid)[:3]
    if n < 0 or n % bs != 0:
        raise ValueError(f"[row_size] {n} elements is not a multiple of the {name} block size ({bs})")
    return n // bs * ts


def can_dequantize(qtype) -> bool:
    return _core.has_kernel("dequant_row", type_id(qtype))


def can_quantize(qtype) -> bool:
    return _core.has_kernel("quant_row", type_id(qtype))


def dequantize(raw: np.ndarray, qtype) -> np.ndarray:
    """Dequantize ``raw`` (uint8 blocks, or any array viewed as bytes, last axis = bytes of a row)
    to float32 with the last axis in elements."""
    tid = type_id(qtype, "dequantize")
    name, bs, ts = _core.type_traits(tid)[:3]
    if not _core.has_kernel("dequant_row", tid):
        raise ValueError(f"[dequantize] type {name} is not supported")
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        # gguf-style: a typed array (e.g. float16 for F16) is reinterpreted as its bytes
        raw = np.ascontiguousarray(raw).view(np.uint8)
    if raw.ndim == 0:
        raise ValueError("[dequantize] expected an array with at least one axis")
    nbytes = raw.shape[-1]
    if nbytes % ts != 0:
        raise ValueError(f"[dequantize] last axis has {nbytes} bytes, not a multiple of the "
                         f"{name} block size ({ts} bytes per {bs} elements)")
    n_row = nbytes // ts * bs
    out_shape = (*raw.shape[:-1], n_row)
    out = np.empty(out_shape, dtype=np.float32)
    if out.size:
        src = np.ascontiguousarray(raw).reshape(-1)
        _core.dequantize_raw(src, out.reshape(-1), tid)
    return out


def quantize(x: np.ndarray, qtype) -> np.ndarray:
    """Quantize float ``x`` (last axis = elements of a row) to uint8 blocks of ``qtype`` with the
    last axis in bytes."""
    tid = type_id(qtype, "quantize")
    name, bs, ts = _core.type_traits(tid)[:3]
    if not _core.has_kernel("quant_row", tid):
        raise ValueError(f"[quantize] type {name} is not supported")
    x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError("[quantize] expected an array with at least one axis")
    n = x.shape[-1]
    if n % bs != 0:
        raise ValueError(f"[quantize] last axis has {n} elements, not a multiple of the "
                         f"{name} block size ({bs})")
    out = np.empty((*x.shape[:-1], n // bs * ts), dtype=np.uint8)
    if out.size:
        src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        _core.quantize_raw(src, out.reshape(-1), tid)
    return out
