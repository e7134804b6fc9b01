"""attn_dots (csrc/kernels/x86/attn_avx2.c, attn_generic.c): attention's many dots, out[j, i] =
dot(n, x[i], y[j]), checked bit for bit against the same level's attention dot (attn_pv_dot[F16]:
ggml_vec_dot_f16's order at avx2, vec_dot_f16_generic's at generic) one pair at a time, on shapes that cut every tile and block: n with and without a tail past the last 32
(the kernel's double tail), nx not a multiple of the 4-row tile nor of the 8-result finish, ny not a
multiple of the 3-row tile. The attention paths that use it (tiled prefill vs per-token decode) are
compared bit for bit in tests/test_attention.py.

Run: python -m pytest -q tests/test_attention_dots.py
"""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import llmrt._core as core

SHAPES = [  # (n, nx, ny)
    (32, 1, 1),
    (64, 8, 3),
    (256, 25, 4),      # Gemma 3's head dim; 25 rows = 6 tiles of 4 + 1, 3 blocks of 8 + 1
    (80, 13, 7),       # tail of 16 past 64
    (7, 5, 2),         # tail only
    (288, 50, 5),      # P.V-like: cells, head dim 50, 5 rows
    (544, 3, 11),
]


@pytest.mark.parametrize("n,nx,ny", SHAPES, ids=[f"n{n}-x{nx}-y{ny}" for n, nx, ny in SHAPES])
def test_attn_dots_equals_the_attention_dot_bit_for_bit(rng, isa_level, n, nx, ny):
    """attn_dots == the level's attention dot (core.attn_dot: attn_pv_dot[F16], the dot the scores
    and P.V kernels reproduce too). At avx2 that is ggml_vec_dot_f16's order (4 chains), no longer
    vec_dot[F16], which took llama.cpp's prefill order for F16 weights (test_dot.py checks both)."""
    x = (rng.standard_normal((nx, n)) * 2).astype(np.float16)
    y = rng.standard_normal((ny, n)).astype(np.float16)
    y[:, ::5] = 0  # exact zeros, as the probabilities of masked cells
    got, name = core.attn_dots(x, y)  # at the 512-bit levels still the avx2 kernel (levels stack)
    want = np.array([[core.attn_dot(x[i], y[j]) for i in range(nx)] for j in range(ny)], dtype=np.float32)
    np.testing.assert_array_equal(got, want)


def test_attn_dots_rejects_mismatched_rows():
    with pytest.raises(ValueError, match=r"\[attn_dots\]"):
        core.attn_dots(np.zeros((2, 8), np.float16), np.zeros((2, 9), np.float16))
