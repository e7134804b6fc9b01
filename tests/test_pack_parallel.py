"""Load-time packing on a thread pool (llmrt_pack_weight_mt, gemm.h) and the shared memory chunks
packed weights live in (gemm_generic.c: weights under 2 MB are cut from shared huge-page chunks).

  - packing on 2 or 3 threads gives the same bytes, group for group, as packing on one, for every
    type with a packed layout, on weights big enough to be split (several claims per thread) and
    with a last group padded with zero rows;
  - the packed groups unpack to the original GGUF rows (lossless) in both cases;
  - many small weights sharing chunks keep their bytes while others are freed and new ones are
    packed into the holes' chunks (no overlap, no use after free).
Weights are random bytes: packing only moves bytes (and re-encodes K-quant scales losslessly), so
any bit pattern must come back.

Run: python -m pytest -q tests/test_pack_parallel.py
"""
import gc

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as T

import llmrt._core as core

TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
         T.F16, T.F32, T.BF16)
# a weight is packed on the pool only from 128 KB of packed bytes on (PACK_MT_MIN_BYTES), in runs
# of 64 KB (PACK_CLAIM_BYTES): 2 MB gives every thread several runs, and 2 MB is also the size
# from which a weight gets memory of its own instead of a shared chunk (both kinds are tested)
MT_BYTES = 2 << 20


def row_bytes(t, K):
    be, bb = gguf.GGML_QUANT_SIZES[t]
    return K // be * bb


def random_weight(t, K, M, rng):
    return rng.integers(0, 256, size=(M, row_bytes(t, K)), dtype=np.uint8)


def all_groups(pw):
    return np.concatenate([pw.group(g) for g in range(pw.n_groups)])


def shape_for(t, nbytes):
    """(K, M): K = 4 super-blocks of 256, M rows to reach about nbytes, M not a multiple of 8."""
    K = 1024
    M = max(9, nbytes // row_bytes(t, K)) | 1
    return K, M


@pytest.mark.parametrize("nbytes", (MT_BYTES // 8, MT_BYTES), ids=("chunk", "own"))
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_parallel_pack_same_bytes(t, nbytes, rng):
    if core.pack_rows(int(t)) == 0:
        pytest.skip(f"{t.name} has no packed layout")
    K, M = shape_for(t, nbytes)
    w = random_weight(t, K, M, rng)
    serial = core.pack_weight(w, int(t), K, M)
    ref = all_groups(serial)
    assert serial.nbytes >= nbytes / 2, "the weight must be big enough to be split"
    for nt in (2, 3):
        pw = core.pack_weight(w, int(t), K, M, n_threads=nt)
        assert (pw.R, pw.n_groups, pw.group_bytes) == (serial.R, serial.n_groups, serial.group_bytes)
        np.testing.assert_array_equal(all_groups(pw), ref, err_msg=f"{t.name} on {nt} threads")
    # lossless: every real row comes back, first, middle and the padded last group
    R = serial.R
    for g in (0, serial.n_groups // 2, serial.n_groups - 1):
        rows = serial.unpack(g)
        np.testing.assert_array_equal(rows, w[g * R:g * R + rows.shape[0]], err_msg=f"{t.name} group {g}")


def test_pack_n_threads_checked():
    w = np.zeros((4, row_bytes(T.Q8_0, 32)), dtype=np.uint8)
    with pytest.raises(ValueError, match="n_threads"):
        core.pack_weight(w, int(T.Q8_0), 32, 4, n_threads=0)


def test_small_weights_share_chunks(rng):
    """Small weights (under 2 MB packed) share chunks: freeing some and packing more never
    changes the bytes of those still alive."""
    t = T.Q4_1
    items = []
    for i in range(40):
        K, M = 32 * int(rng.integers(1, 40)), int(rng.integers(1, 300))
        w = random_weight(t, K, M, rng)
        items.append((w, K, M, core.pack_weight(w, int(t), K, M)))
    for i in range(0, 40, 2):          # free every other weight
        items[i] = None
    gc.collect()
    for i in range(0, 40, 2):          # and pack new ones (they land after the live ones)
        K, M = 32 * int(rng.integers(1, 40)), int(rng.integers(1, 300))
        w = random_weight(t, K, M, rng)
        items[i] = (w, K, M, core.pack_weight(w, int(t), K, M))
    for w, K, M, pw in items:
        for g in range(pw.n_groups):
            rows = pw.unpack(g)
            np.testing.assert_array_equal(rows, w[g * pw.R:g * pw.R + rows.shape[0]])
