"""Attention (csrc/ops/attention.c + the attn_qk / attn_pv kernels) against a numpy reference of
llama.cpp's non-flash formula, on odd shapes, and bit-for-bit invariances of the fast path.

The reference: q rounded to f16 (f16 cache), s_c = scale * K[c].q, softcap, softmax over the
visible cells (position <= the query's, within the sliding window), probabilities rounded to f16
(f16 cache), out = p.V. The cache starts with NaN garbage in every cell that is not yet used (a
run of NaN keys and values, then truncated away): unused cells lie inside the padded n_kv range
the kernel walks, and must not leak. Bit exactness against llama.cpp itself is
tests/test_real_models.py.

Run: python -m pytest -q tests/test_attention.py
"""
import numpy as np
import pytest

import llmrt._core as core

# f32 arithmetic vs the float64 reference: dots of <= 256 products of values ~1 (|err| <= 256 *
# 2^-24 * 4 ~ 6e-5 on a score in the worst case, ~1e-6 typically, times scale <= 1/8), ggml's
# vector exp (<= 2 ulp), a weighted sum of |v| <= ~4.5 with weights summing to 1 -> 2e-5 is above
# what f32 rounding gives here (observed max ~3e-6) and far below any wrong cell or weight (>= 1e-3).
ATTN_ATOL = 2e-5
# The probabilities' f16 rounding can go either way when the kernel's f32 probability and the
# reference's straddle an f16 rounding midpoint; they agree to ~2^-16 relative (the score error
# above), so a probability within that of a midpoint may round to either neighbour: the reference
# adds |f16 up - f16 down| * |V| of those cells to the tolerance.
P_REL_UNCERTAINTY = 2.0 ** -16

CASES = {
    # id: (n_head, n_head_kv, hd, n_swa, softcap, n_prefill, n_decode)
    "mha-hd64": (4, 4, 64, 0, 0.0, 60, 6),
    "gqa3-hd64-swa20": (9, 3, 64, 20, 0.0, 90, 8),
    "gqa4-hd80-softcap": (8, 2, 80, 0, 5.0, 45, 5),
    "gqa4-hd256-swa70": (4, 1, 256, 70, 0.0, 140, 6),
    "gqa3-hd64-past256": (9, 3, 64, 0, 0.0, 250, 12),  # n_kv goes 256 -> 512 during decode
    # groups the kernels take in more than one batch of rows (4 + 2), and a group larger than a
    # chunk's 8 heads (8 + 2)
    "gqa6-hd64-swa40": (12, 2, 64, 40, 0.0, 70, 4),
    "gqa10-hd32": (10, 1, 32, 0, 0.0, 50, 4),
    # head size 128 (the llama-shaped models): the scores' ends of 8 cells at once for groups of up
    # to 3 query heads (attn_avx2.c), here groups of 3 and 2
    "gqa3-hd128": (12, 4, 128, 0, 0.0, 75, 5),
    "gqa2-hd128-swa60": (4, 2, 128, 60, 0.0, 100, 4),
}


def f16_round(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


class AttnGraph:
    """One attention node over a cache; q/k/v rows are picked by token id from [N, heads, hd]
    arrays (the ids index the rows, the positions are separate)."""

    def __init__(self, q, k, v, cache, scale, n_swa, softcap, n_threads):
        N = q.shape[0]
        self.g = g = core.Graph(N, n_threads)
        if n_threads > 1:
            g.single_thread_work = 0  # share every node, however small: test the chunking
        tok = g.input_tokens()

        def act(a):
            d = a.shape[1] * a.shape[2]
            w = g.weight(np.ascontiguousarray(a.reshape(N, d), dtype=np.float32), 0, (d, N))
            return g.reshape(g.get_rows(w, tok), (a.shape[2], a.shape[1]))

        y = g.attention(act(q), act(k), act(v), cache, 0, scale, n_swa=n_swa, softcap=softcap)
        g.set_output(y)
        g.build()

    def run(self, ids, positions):
        return self.g.run(np.asarray(ids, np.int32), np.asarray(positions, np.int32))


def reference(q, kc, vc, cell_pos, q_pos, scale, n_swa, softcap, f16):
    """q [n, nh, hd]; kc, vc [cells, nkv, hd] as stored -> (out [n, nh * hd], slack [n, nh * hd])."""
    if f16:
        q = f16_round(q)
    q, kc, vc = (np.asarray(a, np.float64) for a in (q, kc, vc))
    n, nh, _ = q.shape
    nkv = kc.shape[1]
    grp = nh // nkv
    out = np.zeros((n, nh, vc.shape[2]))
    slack = np.zeros_like(out)
    for i in range(n):
        ok = cell_pos <= q_pos[i]
        if n_swa:
            ok &= (q_pos[i] - cell_pos) < n_swa
        k_i = np.repeat(kc[ok], grp, axis=1)  # [cells, nh, hd]
        v_i = np.repeat(vc[ok], grp, axis=1)
        s = np.einsum("chd,hd->hc", k_i, q[i]) * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        if f16:
            p32 = p.astype(np.float32)
            up = f16_round(p32 * (1 + P_REL_UNCERTAINTY)).astype(np.float64)
            down = f16_round(p32 * (1 - P_REL_UNCERTAINTY)).astype(np.float64)
            p = f16_round(p32).astype(np.float64)
            slack[i] = np.einsum("hc,chd->hd", up - down, np.abs(v_i))
        out[i] = np.einsum("hc,chd->hd", p, v_i)
    return out.reshape(n, -1), slack.reshape(n, -1)


def setup_case(rng, case, dtype, n_threads):
    nh, nkv, hd, n_swa, softcap, n_pre, n_dec = CASES[case]
    n_tot = n_pre + n_dec
    n_ctx = n_tot + 3
    N = n_tot + n_ctx  # rows: the real tokens, then NaN rows for the garbage run
    q = rng.standard_normal((N, nh, hd)).astype(np.float32)
    k = rng.standard_normal((N, nkv, hd)).astype(np.float32)
    v = rng.standard_normal((N, nkv, hd)).astype(np.float32)
    k[n_tot:] = np.nan
    v[n_tot:] = np.nan
    cache = core.KVCache(1, n_ctx, nkv, hd, hd, dtype=dtype)
    scale = 1.0 / np.sqrt(hd)
    g = AttnGraph(q, k, v, cache, scale, n_swa, softcap, n_threads)
    # garbage: fill every cell with NaN keys and values, then drop them
    g.run(np.arange(n_tot, N), np.arange(n_ctx))
    cache.truncate(0)
    return g, cache, (q, k, v), (n_swa, softcap, scale, n_pre, n_dec)


@pytest.mark.parametrize("dtype", ["f16", "f32"])
@pytest.mark.parametrize("case", list(CASES))
def test_attention_matches_reference(rng, isa_level, case, dtype):
    g, cache, (q, k, v), (n_swa, softcap, scale, n_pre, n_dec) = setup_case(rng, case, dtype, 2)
    n_tot = n_pre + n_dec
    pos = np.arange(n_tot, dtype=np.int32) * 2 + 5  # positions are not the cell indices
    outs = [g.run(np.arange(n_pre), pos[:n_pre])]
    for i in range(n_pre, n_tot):
        outs.append(g.run([i], pos[i:i + 1]))
    y = np.concatenate(outs)
    assert np.isfinite(y).all()
    kc, vc = cache.k(0), cache.v(0)  # as stored (f16 or f32)
    ref, slack = reference(q[:n_tot], kc, vc, pos, pos, scale, n_swa, softcap, dtype == "f16")
    err = np.abs(y - ref)
    assert (err <= ATTN_ATOL + slack).all(), f"max err {err.max():.3g}"


@pytest.mark.parametrize("dtype", ["f16", "f32"])
@pytest.mark.parametrize("case", ["mha-hd64", "gqa3-hd64-swa20", "gqa4-hd256-swa70", "gqa4-hd80-softcap",
                                  "gqa6-hd64-swa40", "gqa10-hd32", "gqa3-hd128", "gqa2-hd128-swa60"])
def test_attention_batch_equals_decode_bit_for_bit(rng, case, dtype):
    """While every run walks the same padded n_kv (256), a token's output cannot depend on how the
    tokens were batched, nor on the thread count: the fast path must keep each float operation.
    With an f16 cache the batched runs take the tiled prefill path (token blocks of 32 // group,
    attn_dots over V transposed; chunks of at least 8 rows) and the one-token runs the per-token
    path, so the two are compared bit for bit (GQA ratios 1, 2, 3, 4, 6, 10)."""
    nh, nkv, hd, n_swa, softcap, n_pre, n_dec = CASES[case]
    seed = int(rng.integers(1 << 30))
    n_tot = n_pre + n_dec
    pos = np.arange(n_tot, dtype=np.int32) + 3
    ys = []
    for n_threads, batches in [(1, [n_tot]), (2, [n_tot]), (2, [1] * n_tot), (1, [7, 1, 30, n_tot - 38])]:
        g, cache, _, _ = setup_case(np.random.default_rng(seed), case, dtype, n_threads)
        out, c0 = [], 0
        for m in batches:
            out.append(g.run(np.arange(c0, c0 + m), pos[c0:c0 + m]))
            c0 += m
        ys.append(np.concatenate(out))
    for y in ys[1:]:
        np.testing.assert_array_equal(y, ys[0])


@pytest.mark.parametrize("case", ["gqa3-hd64-swa20", "gqa4-hd80-softcap"])
def test_attention_levels_stack(rng, isa_level, case):
    """Levels stack: the AVX-512 levels widen vec_dot[F16] but register no attention kernels of
    their own, so they must keep the AVX2 level's attention whole: a prefill (the tiled path) and
    decode steps give the AVX2 level's bits at every level above it. (Before this held, a wider
    vec_dot[F16] switched attention to its column-by-column path: other bits, and 16x slower.)"""
    from llmrt import runtime
    from conftest import use_isa
    if isa_level in ("generic", "avx2"):
        pytest.skip("compares the levels above avx2 with avx2")
    seed = int(rng.integers(1 << 30))
    nh, nkv, hd, n_swa, softcap, n_pre, n_dec = CASES[case]
    pos = np.arange(n_pre + n_dec, dtype=np.int32) + 3

    def run():
        g, _, _, _ = setup_case(np.random.default_rng(seed), case, "f16", 2)
        out = [g.run(np.arange(n_pre), pos[:n_pre])]
        out += [g.run([i], pos[i:i + 1]) for i in range(n_pre, n_pre + n_dec)]
        return np.concatenate(out)

    y = run()
    level, emulated = runtime.isa(), runtime.isa_emulated()
    use_isa("avx2")
    try:
        y2 = run()
    finally:
        (runtime.set_isa_emulated if emulated else runtime.set_isa)(level)
    np.testing.assert_array_equal(y, y2)
