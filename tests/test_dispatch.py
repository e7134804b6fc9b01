"""CPU dispatch (csrc/cpu.c, llmrt/runtime.py): LLMRT_ISA capping at import, set_isa, and the
kernel table's names following the level in effect.

LLMRT_ISA is read once when llmrt is imported, so those cases run in a fresh interpreter."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from llmrt import runtime

LEVELS = list(runtime.ISA_LEVELS)
PROBE = ("import json, llmrt.runtime as rt; "
         "print(json.dumps({'isa': rt.isa(), 'max': rt.max_isa(), 'kernels': rt.kernel_names()}))")


def run_with_isa(value):
    """Import llmrt in a subprocess with LLMRT_ISA=value (None: unset); returns (info, stderr)."""
    env = dict(os.environ)
    env.pop("LLMRT_ISA", None)
    if value is not None:
        env["LLMRT_ISA"] = value
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def kernel_suffixes_ok(kernels, level):
    """Every kernel name ends with the suffix of a level <= `level`."""
    allowed = LEVELS[: LEVELS.index(level) + 1]
    emulated = runtime.isa_emulated()       # emulated AVX-512 kernels: the level's name + "_emu"
    bad = [name for table in kernels.values() for name in table.values()
           if not any(name.endswith("_" + lv) or (emulated and name.endswith("_" + lv + "_emu"))
                      for lv in allowed)]
    return bad


def test_available_isas_match_cpu_features():
    f = runtime.cpu_features()
    avail = runtime.available_isas()
    assert avail[0] == "generic"
    assert avail == LEVELS[: LEVELS.index(runtime.max_isa()) + 1]
    assert ("avx2" in avail) == (f["avx2"] and f["fma"] and f["f16c"])
    assert ("avx512" in avail) == (f["avx512f"] and f["avx512bw"] and f["avx512vl"] and f["avx512dq"])


def test_unset_env_uses_max_level_without_warning():
    info, err = run_with_isa(None)
    assert info["isa"] == info["max"] == runtime.max_isa()
    assert "LLMRT_ISA" not in err


def test_env_generic_picks_generic_kernels():
    info, err = run_with_isa("generic")
    assert info["isa"] == "generic"
    assert "LLMRT_ISA" not in err
    assert info["kernels"]["dequant_row"]["Q4_0"] == "dequant_row_q4_0_generic"
    assert info["kernels"]["quant_row"]["Q8_K"] == "quant_row_q8_K_generic"
    assert kernel_suffixes_ok(info["kernels"], "generic") == []


def test_env_above_cpu_is_capped_with_warning():
    top = runtime.max_isa()
    if top == LEVELS[-1]:
        pytest.skip(f"CPU supports the highest level ({top}); nothing to cap")
    above = LEVELS[LEVELS.index(top) + 1:]
    want = "avx512" if "avx512" in above else above[0]  # on this machine: avx512 -> avx2
    info, err = run_with_isa(want)
    assert info["isa"] == top
    assert f"LLMRT_ISA={want} requested but this CPU supports up to {top}; using {top}" in err


def test_env_unknown_name_warns_and_uses_max():
    info, err = run_with_isa("pentium4")
    assert info["isa"] == runtime.max_isa()
    assert "LLMRT_ISA=pentium4 is not a known ISA level" in err


def test_env_is_case_insensitive():
    info, err = run_with_isa("GENERIC")
    assert info["isa"] == "generic" and "LLMRT_ISA" not in err


def test_set_isa_reduces_above_max_requests(caplog):
    before = runtime.isa()
    top = runtime.max_isa()
    try:
        with caplog.at_level(logging.WARNING, logger="llmrt"):
            got = runtime.set_isa(LEVELS[-1])
        assert got == top == runtime.isa()
        if top != LEVELS[-1]:
            assert f"supports up to {top}" in caplog.text
        assert runtime.set_isa("generic") == "generic" == runtime.isa()
    finally:
        runtime.set_isa(before)


def test_set_isa_rejects_unknown_names():
    before = runtime.isa()
    with pytest.raises(ValueError, match="unknown ISA level"):
        runtime.set_isa("sse9")
    assert runtime.isa() == before


def test_kernel_names_follow_the_level(isa_level):
    kernels = runtime.kernel_names()
    assert kernel_suffixes_ok(kernels, isa_level) == []
    # every type llmrt reads can be dequantized at every level
    for name in ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                 "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]:
        assert name in kernels["dequant_row"]
    # the vectorized kernels are the ones picked above generic
    expect = "generic" if isa_level == "generic" else ("avx2" if isa_level == "avx2" else "avx512")
    # an emulated level has the emulated twins of the AVX-512 kernels written on simdw.h and the
    # AVX2 kernels where an AVX-512 one has no twin yet
    ok = ({f"_{expect}_emu", "_avx2"} if runtime.isa_emulated() else {f"_{expect}"})
    for name in ["F16", "Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"]:
        assert kernels["dequant_row"][name] in {f"dequant_row_{name.lower().replace('_k', '_K')}{x}" for x in ok}
    for name in ["F16", "BF16", "Q8_0", "Q8_1", "Q8_K"]:
        assert kernels["quant_row"][name] in {f"quant_row_{name.lower().replace('_k', '_K')}{x}" for x in ok}
