"""Sampler: each step of llama.cpp's chain against a plain reference, the whole chain's
distribution against a reference computed step by step, seeds, and validation."""
from __future__ import annotations

import math

import numpy as np
import pytest

from llmrt.sampling import (Sampler, min_p_filter, top_k_filter, top_p_filter,
                            top_p_min_p_filter)

N_VOCAB = 5000          # > 1024: top_p's "256 most probable first" path is taken
N_DRAWS = 10000
SIGMAS = 5.0            # empirical frequency within 5 binomial standard deviations (+ 1 draw)


def _logits(rng, n=N_VOCAB, scale=3.0):
    return (rng.standard_normal(n) * scale).astype(np.float32)


# ---- references: straightforward loops, float64 ---------------------------------------------

def ref_penalties(logits, prev, penalty, last_n, freq=0.0, pres=0.0):
    x = [float(v) for v in logits]
    window = list(prev) if last_n < 0 else (list(prev)[-last_n:] if last_n > 0 else [])
    counts = {}
    for t in window:
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        x[t] = x[t] * penalty if x[t] <= 0 else x[t] / penalty
        x[t] -= c * freq + pres
    return np.array(x)


def ref_top_k(logits, k):
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    return set(order if k <= 0 else order[:k])


def ref_probs(logits, ids):
    m = max(logits[i] for i in ids)
    e = {i: math.exp(logits[i] - m) for i in ids}
    z = sum(e.values())
    return {i: v / z for i, v in e.items()}


def ref_top_p(logits, ids, p):
    if p >= 1.0:
        return set(ids)
    probs = ref_probs(logits, ids)
    kept, cum = set(), 0.0
    for i in sorted(ids, key=lambda i: -probs[i]):
        kept.add(i)
        cum += probs[i]
        if cum >= p:
            break
    return kept


def ref_min_p(logits, ids, p):
    if p <= 0:
        return set(ids)
    probs = ref_probs(logits, ids)
    pmax = max(probs.values())
    return {i for i in ids if probs[i] >= p * pmax}


def ref_chain_probs(logits, prev, s: Sampler):
    """The distribution the chain samples from: {id: probability}."""
    logits = logits.astype(np.float64).copy()
    for i, b in s.logit_bias.items():                 # first, as llama.cpp's chain
        logits[i] += b
    x = ref_penalties(logits, prev, s.repeat_penalty, s.repeat_last_n)
    ids = ref_top_k(x, s.top_k)
    ids = ref_top_p(x, ids, s.top_p)
    ids = ref_min_p(x, ids, s.min_p)
    return ref_probs(x / s.temperature, ids)


# ---- steps -------------------------------------------------------------------------------------

def test_greedy_is_argmax(rng):
    s = Sampler(temperature=0.0, top_k=5, top_p=0.5, min_p=0.2)
    for _ in range(20):
        x = _logits(rng)
        assert s.sample(x) == int(np.argmax(x))


def test_greedy_uses_penalized_logits():
    x = np.array([1.0, 3.0, 2.5, -1.0], dtype=np.float32)
    s = Sampler(temperature=0.0, repeat_penalty=1.5)
    assert s.sample(x, [1]) == 2            # 3.0 / 1.5 = 2.0 < 2.5
    assert s.sample(x, [0]) == 1


@pytest.mark.parametrize("k", [1, 3, 40, 4999, 5000, 0, -1])
def test_top_k_matches_reference(rng, k):
    x = _logits(rng)
    ids, lg = top_k_filter(x, k)
    assert set(ids.tolist()) == ref_top_k(x, k)
    np.testing.assert_array_equal(lg, x[ids])


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.95, 0.999, 1.0])
@pytest.mark.parametrize("scale", [0.3, 3.0, 8.0], ids=["flat", "normal", "peaked"])
def test_top_p_matches_reference(rng, p, scale):
    # flat: the 256 most probable do not reach p, so the full sort is used
    x = _logits(rng, scale=scale)
    all_ids = np.arange(N_VOCAB)
    ids, lg = top_p_filter(all_ids, x, p)
    assert set(ids.tolist()) == ref_top_p(x, range(N_VOCAB), p)
    np.testing.assert_array_equal(lg, x[ids])


def test_top_p_keeps_the_token_that_crosses_p():
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05])).astype(np.float32)
    ids, _ = top_p_filter(np.arange(4), x, 0.7)
    assert ids.tolist() == [0, 1]           # 0.5 < 0.7 <= 0.8
    ids, _ = top_p_filter(np.arange(4), x, 0.1)
    assert ids.tolist() == [0]


@pytest.mark.parametrize("p", [0.0, 0.01, 0.05, 0.3, 1.0])
def test_min_p_matches_reference(rng, p):
    x = _logits(rng)
    ids, lg = min_p_filter(np.arange(N_VOCAB), x, p)
    assert set(ids.tolist()) == ref_min_p(x, range(N_VOCAB), p)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_min_p_above_one_keeps_the_argmax(rng, top_p):
    """min_p > 1 wants p_i > p_max: nothing; llama.cpp keeps min_keep = 1 candidate, the argmax
    (the filter once returned nothing and the draw raised an IndexError)."""
    x = _logits(rng)
    for min_p in (1.0, 1.5, 2.0 ** 40):
        ids, _ = top_p_min_p_filter(np.arange(N_VOCAB), x, top_p, min_p)
        assert ids.tolist() == [int(np.argmax(x))]
    assert Sampler(temperature=0.7, top_p=top_p, min_p=1.5, seed=1).sample(x, []) == int(np.argmax(x))


@pytest.mark.parametrize("top_p, min_p", [(0.95, 0.05), (0.5, 0.0), (1.0, 0.1), (0.99, 0.001),
                                          (0.2, 0.5)])
@pytest.mark.parametrize("scale", [0.3, 3.0], ids=["flat", "normal"])
def test_fused_top_p_min_p_is_top_p_then_min_p(rng, top_p, min_p, scale):
    x = _logits(rng, scale=scale)
    ids, _ = top_p_min_p_filter(np.arange(N_VOCAB), x, top_p, min_p)
    want = ref_min_p(x, ref_top_p(x, range(N_VOCAB), top_p), min_p)
    assert set(ids.tolist()) == want


@pytest.mark.parametrize("penalty", [1.0, 1.1, 1.5, 0.8])
@pytest.mark.parametrize("last_n", [64, 3, -1, 0])
def test_repeat_penalty_as_llama_cpp(rng, penalty, last_n):
    x = _logits(rng, n=50)
    prev = rng.integers(0, 50, size=100).tolist()
    s = Sampler(repeat_penalty=penalty, repeat_last_n=last_n)
    got = s.apply_penalties(x, prev)
    np.testing.assert_allclose(got, ref_penalties(x, prev, penalty, last_n), rtol=1e-6)


def test_repeat_penalty_divides_positive_multiplies_negative():
    x = np.array([2.0, -2.0, 0.0, 1.0], dtype=np.float32)
    got = Sampler(repeat_penalty=2.0).apply_penalties(x, [0, 1, 2, 0])
    np.testing.assert_array_equal(got, [1.0, -4.0, 0.0, 1.0])
    np.testing.assert_array_equal(x, [2.0, -2.0, 0.0, 1.0])     # caller's array untouched


def test_frequency_and_presence_penalties():
    x = np.zeros(4, dtype=np.float32)
    got = Sampler(frequency_penalty=0.5, presence_penalty=0.25).apply_penalties(x, [1, 1, 2])
    np.testing.assert_allclose(got, [0.0, -1.25, -0.75, 0.0])


def test_penalty_ignores_out_of_range_ids():
    x = np.ones(4, dtype=np.float32)
    got = Sampler(repeat_penalty=2.0).apply_penalties(x, [-1, 7, 3])
    np.testing.assert_array_equal(got, [1, 1, 1, 0.5])


# ---- the whole chain -------------------------------------------------------------------------

@pytest.mark.parametrize("params", [
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),          # llama.cpp defaults
    dict(temperature=1.5, top_k=0, top_p=0.9, min_p=0.0),
    dict(temperature=0.5, top_k=6, top_p=1.0, min_p=0.1, repeat_penalty=1.3),
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.3,
         logit_bias={"3": 2.5, 0: -1.0, 5: float("-inf")}),
], ids=["defaults", "top_p", "top_k-min_p-penalty", "logit_bias"])
def test_chain_distribution_matches_reference(params):
    rng = np.random.default_rng(7)
    x = _logits(rng, n=12, scale=1.5)
    prev = [int(np.argmax(x)), 3]
    s = Sampler(seed=123, **params)
    want = ref_chain_probs(x, prev, s)
    counts = np.bincount([s.sample(x, prev) for _ in range(N_DRAWS)], minlength=12)
    for i in range(12):
        p = want.get(i, 0.0)
        sd = math.sqrt(N_DRAWS * p * (1 - p))
        assert abs(counts[i] - N_DRAWS * p) <= SIGMAS * sd + 1, (i, counts[i], N_DRAWS * p)


def test_min_p_applies_before_temperature():
    # p = [0.6, 0.3, 0.1]: min_p 0.2 drops id 2 (0.1 < 0.12) whatever the temperature.
    x = np.log(np.array([0.6, 0.3, 0.1])).astype(np.float32)
    s = Sampler(temperature=100.0, top_k=0, top_p=1.0, min_p=0.2, seed=0)
    assert 2 not in {s.sample(x) for _ in range(500)}


def test_seed_reproducible(rng):
    x = _logits(rng, scale=0.5)
    a = Sampler(seed=42)
    b = Sampler(seed=42)
    c = Sampler(seed=43)
    sa = [a.sample(x) for _ in range(50)]
    assert sa == [b.sample(x) for _ in range(50)]
    assert sa != [c.sample(x) for _ in range(50)]


def test_single_candidate_needs_no_draw():
    s = Sampler(top_k=1, seed=0)
    state = s.rng.bit_generator.state
    assert s.sample(np.array([0.0, 5.0, 1.0], dtype=np.float32)) == 1
    assert s.rng.bit_generator.state == state


def test_bad_input():
    with pytest.raises(ValueError, match="1-D"):
        Sampler().sample(np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="repeat_penalty"):
        Sampler(repeat_penalty=0.0)
    with pytest.raises(ValueError, match="NaN"):
        Sampler(top_p=float("nan"))


# ---- extreme values (found by fuzzing the server) ------------------------------------------------

def test_non_finite_logits_are_a_clear_error():
    """A broken model (a NaN router row, an inf embedding) gave NaN logits: greedy returned id 0
    every step and the default chain an IndexError from the top-p cut."""
    x = np.zeros(8, np.float32)
    for bad in (np.nan, np.inf):
        x[3] = bad
        for s in (Sampler(temperature=0.0), Sampler(seed=0), Sampler(top_k=0, top_p=1.0, min_p=0.0, seed=0)):
            with pytest.raises(ValueError, match="logits are not finite"):
                s.sample(x, [])
    with pytest.raises(ValueError, match="logits are not finite"):
        Sampler(seed=0).sample(np.full(8, -np.inf, np.float32), [])


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324])
def test_a_tiny_temperature_is_greedy(temperature):
    """lg / T overflowed float32 (inf, then NaN in the softmax) and sampled a wrong token."""
    x = np.random.default_rng(3).normal(size=500).astype(np.float32) * 4
    with np.errstate(over="raise", invalid="raise", divide="raise"):   # no inf / NaN on the way
        got = {Sampler(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=s).sample(x, [])
               for s in range(20)}
    assert got == {int(np.argmax(x))}


def test_extreme_penalties_saturate_instead_of_overflowing():
    """repeat_penalty 1e-300 divided a positive logit by zero in float32 (inf, then NaN)."""
    x = np.array([1.0, 2.0, 0.5, -1.0], np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        s = Sampler(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1e-300, seed=0)
        out = s.apply_penalties(x, [2, 3])
        assert np.isfinite(out).all() and out[2] == np.finfo(np.float32).max
        assert out[3] == np.float32(-1e-300)     # negative: multiplied, tends to 0
        assert {s.sample(x, [2, 3]) for _ in range(20)} == {2}
        big = Sampler(temperature=0.8, frequency_penalty=3e38, presence_penalty=3e38, seed=0)
        assert np.isfinite(big.apply_penalties(x, [1, 1])).all()


# ---- logit_bias ----------------------------------------------------------------------------------

def test_logit_bias_adds_then_penalties_apply():
    x = np.array([1.0, 3.0, 2.5, -1.0], dtype=np.float32)
    s = Sampler(temperature=0.0, logit_bias={3: 5.0, 1: float("-inf")})
    np.testing.assert_array_equal(s.apply_logit_bias(x), [1.0, -np.inf, 2.5, 4.0])
    np.testing.assert_array_equal(x, [1.0, 3.0, 2.5, -1.0])          # caller's array untouched
    assert s.sample(x) == 3
    # the bias comes first: id 3 at 4.0, then divided by the repeat penalty 2 -> 2.0 < 2.5
    assert Sampler(temperature=0.0, repeat_penalty=2.0, logit_bias={3: 5.0}).sample(x, [3]) == 1
    assert Sampler(temperature=0.0, logit_bias=[(1, -3.0)]).sample(x) == 2      # (id, bias) pairs
    huge = Sampler(logit_bias={0: 3e38}).apply_logit_bias(np.full(4, 3e38, dtype=np.float32))
    assert np.isfinite(huge).all()                                      # saturates, no inf


@pytest.mark.parametrize("bias,err,msg", [
    ({-1: 1.0}, ValueError, "token ids"), ({"x": 1.0}, ValueError, "token ids"), ({1.5: 1.0}, ValueError, "token ids"),
    ({2 ** 64: 1.0}, ValueError, "token ids"), ({"\u00b2": 1.0}, ValueError, "token ids"),
    ({"9" * 5000: 1.0}, ValueError, "token ids"),
    ({1: float("nan")}, ValueError, "must be a number"), ({1: float("inf")}, ValueError, "must be a number"),
    ({1: "2"}, ValueError, "must be a number"), (5, TypeError, "must be a dict"), ([1, 2], TypeError, "must be a dict"),
])
def test_logit_bias_bad_input(bias, err, msg):
    with pytest.raises(err, match=msg):
        Sampler(logit_bias=bias)


def test_logit_bias_past_the_vocabulary_and_every_token_banned():
    x = np.zeros(4, dtype=np.float32)
    with pytest.raises(ValueError, match="logit_bias token id 9 is out of range for a vocabulary of 4"):
        Sampler(logit_bias={9: 1.0}).sample(x)
    with pytest.raises(ValueError, match="out of range"):
        Sampler(logit_bias={9: 1.0}).check_vocab(4)
    with pytest.raises(ValueError, match="bans every token"):
        Sampler(logit_bias={i: float("-inf") for i in range(4)}).sample(x)
    with pytest.raises(ValueError, match="bans every token"):
        Sampler(logit_bias={i: float("-inf") for i in range(4)}).check_vocab(4)
    assert Sampler(logit_bias={" 3 ": 1.0}).logit_bias == {3: 1.0}        # (a JSON key's spelling)
