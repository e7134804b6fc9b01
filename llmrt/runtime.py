"""CPU dispatch: which ISA level's kernels run, and why.

``init()`` runs once when llmrt is imported. It probes the CPU (CPUID + XGETBV) and fills the
kernel table for the highest level that the CPU has and ``LLMRT_ISA`` allows
(``generic|avx2|avx512|avx512_vnni|amx``). Asking for more than the CPU has, or for an unknown
level, logs a warning on the ``llmrt`` logger and uses what the CPU can do.

    import llmrt.runtime as rt
    rt.isa(), rt.available_isas()         # ('avx2', ['generic', 'avx2']) on an AVX2 machine
    rt.set_isa("generic")                 # every kernel falls back to portable C
    rt.kernel_names()["dequant_row"]["Q4_0"]   # 'dequant_row_q4_0_generic'
"""
from __future__ import annotations

import logging
import os

from llmrt import _core

__all__ = ["init", "isa", "set_isa", "available_isas", "max_isa", "cpu_features", "kernel_names",
           "ISA_LEVELS"]

log = logging.getLogger("llmrt")

#: every level llmrt knows, lowest first; each implies the ones before it
ISA_LEVELS: tuple = tuple(_core.ISA_NAMES)

_initialized = False


def init() -> str:
    """Probe the CPU and pick kernels from LLMRT_ISA (once; later calls return the level)."""
    global _initialized
    if _initialized:
        return isa()
    level, capped_from, bad_env = _core.cpu_init()
    _initialized = True
    requested = os.environ.get("LLMRT_ISA", "")
    if bad_env:
        log.warning("LLMRT_ISA=%s is not a known ISA level (expected one of %s); using %s",
                    requested, "|".join(ISA_LEVELS), level)
    elif capped_from is not None:
        log.warning("LLMRT_ISA=%s requested but this CPU supports up to %s; using %s",
                    capped_from, max_isa(), level)
    return level


def isa() -> str:
    """Name of the ISA level whose kernels are in use."""
    return _core.isa_current()


def max_isa() -> str:
    """Highest level this CPU (and OS) can run."""
    return _core.isa_max_supported()


def available_isas() -> list:
    """Levels this CPU can run, lowest first (always starts with 'generic')."""
    top = ISA_LEVELS.index(max_isa())
    return list(ISA_LEVELS[: top + 1])


def set_isa(name: str) -> str:
    """Switch the kernel table to level ``name``, reduced to what the CPU has (with a warning).
    Returns the level in effect. ValueError for an unknown name. Not thread-safe: call it while
    no computation is running."""
    if not isinstance(name, str) or name.lower() not in ISA_LEVELS:
        raise ValueError(f"unknown ISA level {name!r}; expected one of {', '.join(ISA_LEVELS)}")
    level = _core.set_isa(name.lower())
    if level != name.lower():
        log.warning("ISA level %s requested but this CPU supports up to %s; using %s",
                    name.lower(), max_isa(), level)
    return level


def set_isa_emulated(name: str, bf16: bool = True) -> str:
    """Tests only: level ``name`` ("avx512" or "avx512_vnni") with every AVX-512 kernel written on
    the SIMD layer (csrc/kernels/x86/simdw.h) running on its AVX2 emulation, on any AVX2 CPU.
    ``bf16`` also emulates AVX512-BF16. Dispatch never does this; ``set_isa`` leaves it."""
    return _core.set_isa_emulated(name.lower(), bf16)


def isa_emulated() -> bool:
    """True while the kernel table is an emulated level (set_isa_emulated)."""
    return _core.isa_emulated()


def cpu_features() -> dict:
    """CPU feature flags as probed (after OS register-state checks), name -> bool."""
    return _core.cpu_features()


def kernel_names() -> dict:
    """{"dequant_row" | "quant_row" | "vec_dot" | "quant_act_row" | "gemm": {type name: kernel name}}
    for the current level ("gemm": the packed-weight matmul kernel of types repacked at load)."""
    return _core.kernel_names()


init()
