"""Shared pytest fixtures for llmrt's tests.

isa_level   parametrized over every ISA level llmrt knows, plus the AVX-512 levels emulated
            (ids "avx512-emu", "avx512_vnni-emu": their kernels on simdw.h's AVX2 backend, run on
            any AVX2 CPU, runtime.set_isa_emulated); switches the kernel table to that level for
            the test (skipping, with the reason, the levels this CPU lacks), yields the level's
            name (runtime.isa_emulated() tells the emulated ones apart) and restores the previous
            level afterwards.
rng         a numpy Generator with a fixed seed, so failures reproduce.
amx_model_backend
            MUL_MAT / MUL_MAT_ID prefill on the AMX software tile model for the test (graphs
            built during it get AMX copies of their weights); the previous setting afterwards.
"""
from __future__ import annotations

import numpy as np
import pytest

from llmrt import runtime

# how the skip reason names each level's hardware
_ISA_HARDWARE = {
    "avx2": "AVX2/FMA/F16C",
    "avx512": "AVX-512",
    "avx512_vnni": "AVX512-VNNI",
    "amx": "AMX",
}


def skip_unless_isa(name: str) -> None:
    """pytest.skip("CPU lacks <hardware>") unless this CPU can run ISA level `name`."""
    if name not in runtime.available_isas():
        pytest.skip(f"CPU lacks {_ISA_HARDWARE.get(name, name)}")


EMULATED_LEVELS = ("avx512", "avx512_vnni")
ISA_PARAMS = list(runtime.ISA_LEVELS) + [name + "-emu" for name in EMULATED_LEVELS]


def use_isa(param: str) -> str:
    """Switch to ISA_PARAMS entry `param` (skipping where this CPU cannot run it); returns the
    level's name. The caller restores the previous level (runtime.set_isa)."""
    if param.endswith("-emu"):
        name = param[:-len("-emu")]
        skip_unless_isa("avx2")   # the emulation is built on AVX2
        assert runtime.set_isa_emulated(name) == name
        return name
    skip_unless_isa(param)
    assert runtime.set_isa(param) == param
    return param


@pytest.fixture(params=ISA_PARAMS)
def isa_level(request):
    before = runtime.isa()
    try:
        yield use_isa(request.param)
    finally:
        runtime.set_isa(before)


@pytest.fixture
def amx_model_backend():
    from llmrt import _core
    before = _core.amx_matmul()
    assert _core.amx_set_matmul("model") == "model"
    try:
        yield
    finally:
        _core.amx_set_matmul(before)


@pytest.fixture
def rng():
    return np.random.default_rng(20240917)
