"""Build llmrt's C core (csrc/) and its Cython wrapper (cysrc/) as one extension, llmrt._core.

No -march=native: each ISA file under csrc/kernels/x86/ selects its own target with
`#pragma GCC target(...)`, so one build runs on any x86-64 CPU and uses what the CPU has.

LLMRT_SANITIZE=1 builds with AddressSanitizer + UndefinedBehaviorSanitizer (used by .ci/run).
"""
import glob
import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

sources = ["cysrc/_core.pyx"] + sorted(glob.glob("csrc/**/*.c", recursive=True))
# Rebuild when a header or Cython include changes, not only a .c file.
depends = sorted(glob.glob("csrc/**/*.h", recursive=True) + glob.glob("csrc/**/*.inc", recursive=True)
                 + glob.glob("cysrc/*.pxi")
                 + glob.glob("cysrc/*.pxd"))

cflags = ["-std=gnu11", "-O3", "-fno-strict-aliasing", "-fPIC", "-Wall", "-Wno-unused-function",
          "-Wno-unknown-pragmas"]
ldflags = ["-pthread"]
if os.environ.get("LLMRT_SANITIZE"):
    cflags = [f for f in cflags if f != "-O3"] + [
        "-O1", "-g", "-fno-omit-frame-pointer",
        "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
    ]
    ldflags += ["-fsanitize=address,undefined"]

ext = Extension(
    "llmrt._core",
    sources=sources,
    depends=depends,
    include_dirs=["csrc/include", "csrc", np.get_include()],
    extra_compile_args=cflags,
    extra_link_args=ldflags,
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

setup(
    ext_modules=cythonize(
        [ext],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
        include_path=["cysrc"],
    ),
)
