# cython: language_level=3
"""llmrt._core — the one extension module: thin Cython over the C core in csrc/.

Design note
-----------
All maths lives in C (csrc/). This module only restates the C headers (cysrc/*.pxd), converts
numpy arrays to typed memoryviews, checks what C assumes (shapes, sizes, types) and releases the
GIL around every call that can take time. Each concern has its own include file:

    cpu.pxi     CPU features, ISA level, kernel table names
    quants.pxi  dequantize / quantize rows of GGUF block types
    dot.pxi     dot products of one weight row with one activation row (vec_dot kernels)
    gemm.pxi    packed weights (load-time repacking) and the gemm kernels over them
    graph.pxi   compute graph, thread pool, KV cache
    amx.pxi     AMX tile layer (software model / real instructions) and AMX GEMMs, test hooks
    gguf.pxi    the GGUF reader's hot loop (arrays of strings)
"""
import math

import numpy as np
cimport numpy as cnp

cnp.import_array()

include "cpu.pxi"
include "quants.pxi"
include "dot.pxi"
include "gemm.pxi"
include "amx.pxi"
include "graph.pxi"
include "gguf.pxi"
