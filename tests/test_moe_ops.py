"""The mixture-of-experts ops (csrc/ops/moe.c) through the Graph API.

  moe_route   top-k experts and weights per token against a float64 numpy router (softmax and
              sigmoid gating, renormalised or not, with a selection bias and a scale).
  mul_mat_id  each (token, slot) row equals MUL_MAT of the chosen expert's 2-D slice BIT FOR BIT
              (same activation conversion, same kernel), for every weight type with a packed path
              and plain, at every ISA level (emulated AVX-512 ones included); shapes cross the op's
              chunk edges (more than 64 rows per expert and per token block) and leave experts unchosen.
              The fused gate/up form equals act(gate) * up of the unfused products.
  moe_sum     the weighted sum of a token's experts (+ the sigmoid-gated shared expert) against numpy.
"""
import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as T

import llmrt._core as core
from test_gemm import F16_FIELDS as Q32_F16_FIELDS  # noqa: F401  (documented layouts)
from test_gemm import random_rows as q32_rows
from test_gemm_kquants import random_rows as k_rows

# weight types a MoE file holds experts in (every type with a packed path, and two without)
TYPES = (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL,
         T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS)
K_QUANTS = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS)
FLOATS = (T.F32, T.F16, T.BF16)

E, TOPK = 5, 2          # one expert is left unchosen by the router below
M = 72                  # > 64 rows: two row chunks; a multiple of every pack_rows (4, 8)
N = 100                 # > 64 rows for the busiest experts: two token blocks


def expert_rows(t, K, m, rng):
    if t in FLOATS or t in K_QUANTS:
        return k_rows(t, K, m, rng)
    return q32_rows(t, K, m, rng)


def _np_dtype(t):
    return {T.F32: np.float32, T.F16: np.float16, T.BF16: np.uint16}.get(t, np.uint8)


def _weight(g, rows, t, shape):
    return g.weight(np.ascontiguousarray(rows).reshape(-1).view(np.uint8).view(_np_dtype(t)), int(t), shape)


def _router(K, rng):
    """Router weights that never pick expert E-1 (its logit row is very negative)."""
    r = rng.standard_normal((E, K)).astype(np.float32) * 0.3
    r[E - 1] = -5.0 * np.abs(r[E - 1]) - 1.0
    return r


def _emb(K, n_vocab, rng):
    return np.abs(rng.standard_normal((n_vocab, K))).astype(np.float32) * 0.5 + 0.1


def _graph(n_cap, build, pack=True, n_threads=2):
    g = core.Graph(n_cap, n_threads, pack=pack)
    g.single_thread_work = 0          # every node shared by both threads
    out = build(g)
    g.set_output(out)
    g.build()
    return g


def _run(g, n):
    return g.run(np.arange(n) % 97, np.arange(n))


def _route_ids(emb, router, n, k=TOPK):
    def build(g):
        x = g.get_rows(g.weight(emb, 0, emb.shape[::-1]), g.input_tokens())
        return g.moe_route(g.mul_mat(g.weight(router, 0, router.shape[::-1]), x), k)
    r = _run(_graph(128, build), n)
    return r[:, :k], r[:, k:].astype(np.int64)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "plain"])
def test_mul_mat_id_gives_mul_mat_bits(isa_level, t, pack, rng):
    K = 256
    emb, router = _emb(K, 97, rng), _router(K, rng)
    w = expert_rows(t, K, E * M, rng)               # [E * M, row bytes]: expert e = rows e*M..
    _, ids = _route_ids(emb, router, N)
    assert set(np.unique(ids)) == set(range(E - 1)), "the router must leave expert E-1 unchosen"
    assert np.bincount(ids.ravel()).max() > 64

    def build_id(g):
        x = g.get_rows(g.weight(emb, 0, emb.shape[::-1]), g.input_tokens())
        r = g.moe_route(g.mul_mat(g.weight(router, 0, router.shape[::-1]), x), TOPK)
        return g.mul_mat_id(_weight(g, w, t, (K, M, E)), x, r)
    got = _run(_graph(128, build_id, pack), N)      # [N, k, M]
    for e in range(E - 1):
        def build_dense(g, e=e):
            x = g.get_rows(g.weight(emb, 0, emb.shape[::-1]), g.input_tokens())
            return g.mul_mat(_weight(g, w[e * M:(e + 1) * M], t, (K, M)), x)
        dense = _run(_graph(128, build_dense, pack), N)   # [N, M]
        tok, slot = np.nonzero(ids == e)
        np.testing.assert_array_equal(got[tok, slot], dense[tok], err_msg=f"expert {e}")
    # decode: one token, k experts
    one = _run(_graph(1, build_id, pack), 1)
    np.testing.assert_array_equal(one[0], got[0])


@pytest.mark.parametrize("t", (T.Q4_0, T.Q8_0, T.Q4_K, T.F16), ids=lambda t: t.name)
def test_fused_gate_up_and_down(t, rng):
    """act(gate x) * (up x) fused == the unfused products through glu; down over [K, k, n] rows."""
    K, F = 256, 64
    emb, router = _emb(K, 97, rng), _router(K, rng)
    wg, wu = expert_rows(t, K, E * F, rng), expert_rows(t, K, E * F, rng)
    wd = expert_rows(T.Q8_0 if t != T.F16 else T.F16, F, E * K, rng)
    td = T.Q8_0 if t != T.F16 else T.F16

    def build(fused, act):
        def b(g):
            x = g.get_rows(g.weight(emb, 0, emb.shape[::-1]), g.input_tokens())
            r = g.moe_route(g.mul_mat(g.weight(router, 0, router.shape[::-1]), x), TOPK)
            G, U = _weight(g, wg, t, (K, F, E)), _weight(g, wu, t, (K, F, E))
            if fused:
                f = g.mul_mat_id(G, x, r, up=U, act=act)
            else:
                f = g.glu(g.mul_mat_id(G, x, r), g.mul_mat_id(U, x, r), act)
            return g.mul_mat_id(_weight(g, wd, td, (F, K, E)), f, r)
        return b
    for act in ("silu", "gelu"):
        for n in (1, 7, N):
            a = _run(_graph(128, build(True, act)), n)
            b = _run(_graph(128, build(False, act)), n)
            np.testing.assert_array_equal(a, b)
            assert np.isfinite(a).all() and np.abs(a).max() > 0


@pytest.mark.parametrize("t", (T.Q4_0, T.Q8_0, T.Q4_K, T.F16), ids=lambda t: t.name)
def test_mul_mat_id_decode_same_bits_for_any_thread_count(t, rng):
    """Runs where no expert has more than 4 rows (decode, a batched decode step) split each expert
    matmul into one contiguous range of 64-row chunks per thread plus a tail claimed in turn
    (csrc/ops/moe.c): with 1, 2, 3 and 5 threads, 1, 3 and 4 tokens, every (token, slot) row equals
    MUL_MAT of the chosen expert, and the fused gate/up gives the bits of 1 thread. (640 rows per
    expert: 10 chunks each, so the ranges end inside experts and the tail is not empty.)"""
    K, F = 256, 640
    emb, router = _emb(K, 97, rng), _router(K, rng)
    wg, wu = expert_rows(t, K, E * F, rng), expert_rows(t, K, E * F, rng)

    def build_id(fused):
        def b(g):
            x = g.get_rows(g.weight(emb, 0, emb.shape[::-1]), g.input_tokens())
            r = g.moe_route(g.mul_mat(g.weight(router, 0, router.shape[::-1]), x), TOPK)
            if not fused:
                return g.mul_mat_id(_weight(g, wg, t, (K, F, E)), x, r)
            return g.mul_mat_id(_weight(g, wg, t, (K, F, E)), x, r, up=_weight(g, wu, t, (K, F, E)), act="silu")
        return b

    def build_dense(e):
        def b(g):
            x = g.get_rows(g.weight(emb, 0, emb.shape[::-1]), g.input_tokens())
            return g.mul_mat(_weight(g, wg[e * F:(e + 1) * F], t, (K, F)), x)
        return b

    for n in (1, 3, 4):
        _, ids = _route_ids(emb, router, n)
        assert np.bincount(ids.ravel()).max() <= 4
        dense = {e: _run(_graph(8, build_dense(e), n_threads=1), n) for e in np.unique(ids)}   # [n, F]
        fused_1 = None
        for nt in (1, 2, 3, 5):
            got = _run(_graph(8, build_id(False), n_threads=nt), n)         # [n, k, F]
            for e, want in dense.items():
                tok, slot = np.nonzero(ids == e)
                np.testing.assert_array_equal(got[tok, slot], want[tok], err_msg=f"{n} tokens, {nt} threads, expert {e}")
            fused = _run(_graph(8, build_id(True), n_threads=nt), n)
            assert np.isfinite(fused).all() and np.abs(fused).max() > 0
            if fused_1 is None:
                fused_1 = fused
            np.testing.assert_array_equal(fused, fused_1, err_msg=f"fused, {n} tokens, {nt} threads")


def _np_route(logits, k, gating, norm, scale, bias):
    l64 = logits.astype(np.float64)
    if gating == "softmax":
        p = np.exp(l64 - l64.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
    else:
        p = 1 / (1 + np.exp(-l64))
    sel = p + (bias if bias is not None else 0)
    ids = np.argsort(-sel, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, axis=1)
    if norm:
        w /= w.sum(axis=1, keepdims=True)
    return w * scale, ids


# float32 router arithmetic against float64: a few ulps of the probabilities
TOL_ROUTE = 1e-6


@pytest.mark.parametrize("gating,norm,scale,with_bias", [
    ("softmax", True, 1.0, False), ("softmax", False, 1.0, False), ("sigmoid", True, 2.5, True),
    ("sigmoid", False, 1.0, False), ("softmax", False, 0.5, True)])
def test_moe_route(gating, norm, scale, with_bias, rng):
    n_exp, k, K = 16, 4, 32
    emb = rng.standard_normal((97, K)).astype(np.float32)
    router = rng.standard_normal((n_exp, K)).astype(np.float32) * 0.5
    bias = (rng.standard_normal(n_exp) * 0.1).astype(np.float32) if with_bias else None

    def build(g):
        x = g.get_rows(g.weight(emb, 0, emb.shape[::-1]), g.input_tokens())
        lg = g.mul_mat(g.weight(router, 0, router.shape[::-1]), x)
        b = g.weight(bias, 0, (n_exp,)) if bias is not None else None
        return g.moe_route(lg, k, gating, norm, scale, bias=b)
    out = _run(_graph(128, build), 90)
    logits = (emb[np.arange(90) % 97] @ router.T)
    w, ids = _np_route(logits, k, gating, norm, scale, bias)
    # positions whose k-th and (k+1)-th selection scores are within rounding may pick either
    sel = np.sort(logits, axis=1)[:, ::-1]
    clear = np.abs(sel[:, k - 1] - sel[:, k]) > 1e-4
    np.testing.assert_array_equal(out[clear, k:].astype(np.int64), ids[clear])
    np.testing.assert_allclose(out[clear, :k], w[clear], rtol=TOL_ROUTE, atol=TOL_ROUTE)
    assert clear.mean() > 0.9


def test_moe_sum_with_shared_expert(rng):
    K, F, n = 64, 32, 9
    emb, router = _emb(K, 97, rng), _router(K, rng)
    wd = rng.standard_normal((E * K, F)).astype(np.float32) * 0.2
    wf = rng.standard_normal((E * F, K)).astype(np.float32) * 0.2
    ws = rng.standard_normal((K, K)).astype(np.float32) * 0.2
    wsg = rng.standard_normal(K).astype(np.float32) * 0.2

    def build(g):
        x = g.get_rows(g.weight(emb, 0, emb.shape[::-1]), g.input_tokens())
        r = g.moe_route(g.mul_mat(g.weight(router, 0, router.shape[::-1]), x), TOPK)
        f = g.mul_mat_id(g.weight(wf, 0, (K, F, E)), x, r)
        y = g.mul_mat_id(g.weight(wd, 0, (F, K, E)), f, r)
        sh = g.mul_mat(g.weight(ws, 0, (K, K)), x)
        sg = g.mul_mat(g.weight(wsg, 0, (K,)), x)
        return g.moe_sum(y, r, sh, sg)
    out = _run(_graph(16, build), n)
    x = emb[np.arange(n) % 97].astype(np.float64)
    w, ids = _np_route(x @ router.T.astype(np.float64), TOPK, "softmax", True, 1.0, None)
    want = np.zeros((n, K))
    for t in range(n):
        for s in range(TOPK):
            e = ids[t, s]
            h = wf[e * F:(e + 1) * F].astype(np.float64) @ x[t]
            want[t] += w[t, s] * (wd[e * K:(e + 1) * K].astype(np.float64) @ h)
        want[t] += (ws.astype(np.float64) @ x[t]) / (1 + np.exp(-(wsg @ x[t])))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_moe_op_errors(rng):
    K = 32
    g = core.Graph(4, 1)
    x = g.get_rows(g.weight(_emb(K, 97, rng), 0, (K, 97)), g.input_tokens())
    lg = g.mul_mat(g.weight(_router(K, rng), 0, (K, E)), x)
    with pytest.raises(ValueError, match=r"\[moe_route\] k \(6\) must be in \[1, n_expert = 5\]"):
        g.moe_route(lg, 6)
    with pytest.raises(ValueError, match="gating must be"):
        g.moe_route(lg, 2, "relu")
    r = g.moe_route(lg, 2)
    w3 = g.weight(np.zeros(K * 8 * 4, np.float32), 0, (K, 8, 4))
    with pytest.raises(ValueError, match="the router has 5 experts, w has 4"):
        g.mul_mat_id(w3, x, r)
    w5 = g.weight(np.zeros(K * 8 * E, np.float32), 0, (K, 8, E))
    with pytest.raises(ValueError, match="route must be a moe_route tensor"):
        g.mul_mat_id(w5, x, lg)
    with pytest.raises(ValueError, match="act needs up"):
        g.mul_mat_id(w5, x, r, act="silu")
    with pytest.raises(ValueError, match=r"w must be 3-D"):
        g.mul_mat_id(g.weight(np.zeros(K * 8, np.float32), 0, (K, 8)), x, r)
    y = g.mul_mat_id(w5, x, r)
    with pytest.raises(ValueError, match="shared and shared_gate go together"):
        g.moe_sum(y, r, shared=x)


@pytest.mark.parametrize("t", (T.Q8_0, T.Q4_1, T.F16), ids=lambda t: t.name)
def test_mul_mat_id_on_amx_tiles(t, rng, amx_model_backend):
    """Prefill of experts on the AMX tile GEMM (software tile model): a chunk of >= 16 tokens of
    one expert gives the bits of MUL_MAT of that expert's slice on the tile GEMM; smaller chunks
    and decode keep the level's kernels (the bits of MUL_MAT without AMX)."""
    K, Mx = 256, 64
    emb, router = _emb(K, 97, rng), _router(K, rng)
    w = expert_rows(t, K, E * Mx, rng)
    _, ids = _route_ids(emb, router, N)

    def build_id(g):
        x = g.get_rows(g.weight(emb, 0, emb.shape[::-1]), g.input_tokens())
        r = g.moe_route(g.mul_mat(g.weight(router, 0, router.shape[::-1]), x), TOPK)
        return g.mul_mat_id(_weight(g, w, t, (K, Mx, E)), x, r)
    calls = core.amx_matmul_calls()
    got = _run(_graph(128, build_id), N)
    assert core.amx_matmul_calls() > calls, "no expert took the AMX path"
    for e in range(E - 1):
        def build_dense(g, e=e):
            x = g.get_rows(g.weight(emb, 0, emb.shape[::-1]), g.input_tokens())
            return g.mul_mat(_weight(g, w[e * Mx:(e + 1) * Mx], t, (K, Mx)), x)
        dense_amx = _run(_graph(128, build_dense), N)            # N >= 16 tokens: tiles
        core.amx_set_matmul(None)
        dense_avx = _run(_graph(128, build_dense), N)
        core.amx_set_matmul("model")
        tok, slot = np.nonzero(ids == e)                          # token order = the op's order
        for b0 in range(0, len(tok), 64):                         # the op's token blocks
            tb, sb = tok[b0:b0 + 64], slot[b0:b0 + 64]
            want = dense_amx[tb] if len(tb) >= 16 else dense_avx[tb]
            np.testing.assert_array_equal(got[tb, sb], want, err_msg=f"expert {e}, block at {b0}")
    one = _run(_graph(1, build_id), 1)                            # decode: never on tiles
    np.testing.assert_array_equal(one[0], _run(_graph(128, build_id), 1)[0])


def test_route_ids_stay_distinct_with_infinite_bias(rng):
    """A selection bias of -inf on all but 2 of 8 experts, k = 3: the third choice is still an
    expert not chosen yet (the lowest id), so no expert gets a token twice and MUL_MAT_ID's
    decode-sized chunks (many rows, few tokens) stay inside its buffers (ASan run in CI)."""
    n_exp, k, K, F = 8, 3, 64, 256
    emb = rng.standard_normal((97, K)).astype(np.float32)
    router = rng.standard_normal((n_exp, K)).astype(np.float32)
    bias = np.full(n_exp, -np.inf, dtype=np.float32)
    bias[[2, 5]] = 0.0
    w = rng.standard_normal((n_exp * F, K)).astype(np.float32)

    def build(out_route):
        def b(g):
            x = g.get_rows(g.weight(emb, 0, (K, 97)), g.input_tokens())
            r = g.moe_route(g.mul_mat(g.weight(router, 0, (K, n_exp)), x), k,
                            bias=g.weight(bias, 0, (n_exp,)))
            return r if out_route else g.mul_mat_id(g.weight(w, 0, (K, F, n_exp)), x, r)
        return b
    for n in (1, 4):
        r = _run(_graph(8, build(True)), n)
        ids = r[:, k:].astype(np.int64)
        assert all(sorted(row) == [0, 2, 5] for row in ids.tolist())
        y = _run(_graph(8, build(False)), n)
        x = emb[np.arange(n) % 97]
        for t in range(n):
            for s in range(k):
                e = ids[t, s]
                np.testing.assert_allclose(y[t, s], w[e * F:(e + 1) * F] @ x[t], rtol=1e-5, atol=1e-4)
