"""Shared pytest fixtures for llmrt's tests.

isa_level   parametrized over every ISA level llmrt knows; switches the kernel table to that level
            for the test (skipping, with the reason, the levels this CPU lacks) and restores the
            previous level afterwards.
rng         a numpy Generator with a fixed seed, so failures reproduce.
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


@pytest.fixture(params=list(runtime.ISA_LEVELS))
def isa_level(request):
    name = request.param
    skip_unless_isa(name)
    before = runtime.isa()
    assert runtime.set_isa(name) == name
    try:
        yield name
    finally:
        runtime.set_isa(before)


@pytest.fixture
def rng():
    return np.random.default_rng(20240917)
