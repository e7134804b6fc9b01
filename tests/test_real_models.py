"""llmrt against llama.cpp on the two real models, token by token.

The references (tests/data/ref_{smollm2,gemma3}.json, made by tools/make_references.py with
llama-cpp-python) hold llama.cpp's teacher-forced top-5 log-probs and greedy continuations twice:
at n_batch = 512 ("teacher_forced", "greedy") and at n_batch = n_ubatch = 1
("teacher_forced_nbatch1", "greedy_nbatch1"). llama.cpp itself is not consistent across batch
sizes (its batch kernels, llamafile sgemm and repacked gemm, sum in other orders), so llmrt
targets the single-token path: it reproduces ggml's CPU numerics (activation quantization, dot
product order, exp/silu approximations, softmax and attention roundings, RoPE's fused ops), and
these tests assert the agreement against the n_batch = 1 references. Agreement against the
n_batch = 512 references is printed (pytest -s), not asserted.

Everything here is fed one token at a time (teacher forcing and greedy alike), as the references.
Run as a script to print every metric: python tests/test_real_models.py
"""
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from fake_lm import real_model_path  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")
MODELS = {"smollm2": "smollm2-135m-instruct", "gemma3": "gemma3-270m"}
N_THREADS = 2

# The references were made by llama.cpp's AVX2 build, and llmrt's AVX2 level (and the avx512 level,
# see EXACT_LEVELS) reproduces its single-token numerics bit for bit, so there (run wherever the CPU
# has the level) the bounds are those of bit-identical logits:
#   - top-1 identical at every position, all 32 greedy tokens identical on all 8 prompts;
#   - mean NLL and every top-5 log-prob equal up to the references' rounding to 6 decimals
#     (|error| <= 5e-7; llmrt's log-softmax is taken here in float64 from the same f32 logits).
# Measured (avx2, avx512, and avx512_vnni before its Q8_0 block order, 2026-11-24): both models
# 100 % top-1, 8/8 prompts x 32 tokens, NLL rel. diff ~1e-8. Closeness to llama.cpp's batched path
# and to itself across batch sizes, for any numerics: tests/test_fidelity.py.
EXACT = dict(min_top1=1.0, max_nll_rel=1e-6, greedy_prefix=32, min_greedy_prompts=8, logprob_atol=1e-6)
# Without AVX2 the tests skip: llmrt's generic kernels follow ggml's scalar build (reference
# activation rounding, sequential sums, libm exp), a different numerics from the AVX2 build that
# made the references (measured at the generic level: SmolLM2 94.7 % top-1, 6/8 prompts >= 24).
GREEDY_PREFIX = 24  # reported: prompts whose first 24 greedy tokens match


def load_ref(name):
    with open(os.path.join(DATA, f"ref_{name}.json"), encoding="utf-8") as f:
        return json.load(f)


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def logits_token_by_token(model, ids):
    sess = model.new_session(ctx_size=max(256, len(ids) + 8))
    return np.stack([sess.eval([t]) for t in ids])


def greedy_token_by_token(model, prompt_ids, n_predict):
    sess = model.new_session(ctx_size=max(256, len(prompt_ids) + n_predict + 8))
    for t in prompt_ids[:-1]:
        sess.eval([t])
    logits = sess.eval([prompt_ids[-1]])
    out = []
    for _ in range(n_predict):
        tok = int(np.argmax(logits))
        out.append(tok)
        logits = sess.eval([tok])
    return out


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# The levels compared: AVX2 and the AVX-512 levels above it. At avx512 the kernels for these models'
# weight types (Q4_1, Q8_0, Q4_K, Q5_0, Q6_K) reproduce the AVX2 ones' bits (levels stack), so the
# EXACT bounds hold there. avx512_vnni keeps them for every type but Q8_0 (SmolLM2's tied output
# head, Gemma 3's attn_v) and Q4_1 (the rest of SmolLM2), which it sums in llmrt's block order
# (csrc/kernels/x86/gemm_q32_w.inc: one exact integer and one fma per block where llama.cpp sums 8
# f32 lanes; Q8_0 prefill twice as fast, Q4_1 batched steps and prefill 1.7x): there the one-token
# path is held to the fidelity bounds of tests/test_fidelity.py (as close to llama.cpp's n_batch-1
# run as its own n_batch-512 run is), and its greedy continuations must match at least as many
# prompts for GREEDY_PREFIX tokens as llama.cpp's n_batch-512 ones do. Measured (Zen 4, 2026-11-28,
# avx512_vnni, `pytest -s tests/test_real_models.py -k "single_token and avx512_vnni"`): SmolLM2
# top-1 95.07 %, KL5 1.43e-3, 4/8 prompts (llama.cpp's own 96.05 %, 1.07e-3, 4/8; with Q4_1 still in
# the lane order 100 %, 3.0e-9, 8/8; 95.07 % is 289 of 304 positions, the least that
# test_fidelity.TOP1_POINTS allows); Gemma 3 97.73 %, KL5 2.09e-3, 6/8 (llama.cpp's own 98.48 %,
# 3.36e-3, 6/8).
# The amx level is not here: its int8 tiles sum whole blocks (tests/test_amx_matmul.py).
LEVELS = ("avx2", "avx512", "avx512_vnni")
EXACT_LEVELS = ("avx2", "avx512")


def need_level(lvl):
    from llmrt import runtime
    if lvl not in runtime.available_isas():
        pytest.skip(f"CPU lacks {lvl}: the references come from llama.cpp's AVX2 build, which llmrt "
                    f"reproduces at its AVX2 level and above")


def run_model(name, lvl="avx2"):
    """llmrt's teacher-forced log-probs and greedy continuations for the reference inputs."""
    from llmrt import runtime
    from llmrt.model import Model
    path = real_model_path(MODELS[name])
    before = runtime.isa()
    runtime.set_isa(lvl)
    try:
        model = Model(path, n_threads=N_THREADS)
        ref = load_ref(name)
        tf = [log_softmax(logits_token_by_token(model, e["ids"])) for e in ref["teacher_forced_nbatch1"]]
        greedy = [greedy_token_by_token(model, e["prompt_ids"], e["n_predict"])
                  for e in ref["greedy_nbatch1"]]
    finally:
        runtime.set_isa(before)
    return ref, tf, greedy


def max_top5_logprob_error(tf_ref, tf):
    """max |llmrt's log-prob - llama.cpp's| over every position's reference top-5 tokens."""
    err = 0.0
    for e, lp in zip(tf_ref, tf):
        top = np.array(e["top_ids"])
        got = np.take_along_axis(lp, top, axis=1)
        err = max(err, float(np.abs(got - np.array(e["top_logprobs"])).max()))
    return err


def metrics(tf_ref, greedy_ref, tf, greedy):
    """(top-1 agreement, llmrt mean NLL, reference mean NLL, greedy prefix lengths)."""
    agree = total = 0
    nll, nll_ref = [], []
    for e, lp in zip(tf_ref, tf):
        ids = e["ids"]
        assert lp.shape[0] == len(ids)
        agree += int((lp.argmax(axis=-1) == np.array([t[0] for t in e["top_ids"]])).sum())
        total += len(ids)
        nll += (-lp[np.arange(len(ids) - 1), ids[1:]]).tolist()
        nll_ref += [-v for v in e["target_logprob"]]
    prefixes = [common_prefix(g, e["ids"]) for e, g in zip(greedy_ref, greedy)]
    return agree / total, float(np.mean(nll)), float(np.mean(nll_ref)), prefixes


def report(name, ref, tf, greedy, lvl="avx2"):
    lines = []
    for label, tk, gk in (("n_batch=1", "teacher_forced_nbatch1", "greedy_nbatch1"),
                          ("n_batch=512", "teacher_forced", "greedy")):
        top1, nll, nll_ref, pre = metrics(ref[tk], ref[gk], tf, greedy)
        lines.append(f"{name} vs llama.cpp {label:11s} [{lvl}]: top-1 {100 * top1:6.2f} %, mean NLL "
                     f"{nll:.6f} (ref {nll_ref:.6f}, rel {abs(nll - nll_ref) / nll_ref:.2e}), max top-5 "
                     f"log-prob error {max_top5_logprob_error(ref[tk], tf):.2e}, greedy prefixes {pre} "
                     f"({sum(p >= GREEDY_PREFIX for p in pre)}/{len(pre)} >= {GREEDY_PREFIX})")
    return lines


_CACHE = {}


def results(name, lvl="avx2"):
    if (name, lvl) not in _CACHE:
        _CACHE[(name, lvl)] = run_model(name, lvl)
    return _CACHE[(name, lvl)]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("lvl", LEVELS)
def test_matches_llama_cpp_single_token_path(name, lvl):
    need_level(lvl)
    ref, tf, greedy = results(name, lvl)
    for line in report(name, ref, tf, greedy, lvl):
        print(line)
    top1, nll, nll_ref, pre = metrics(ref["teacher_forced_nbatch1"], ref["greedy_nbatch1"], tf, greedy)
    if lvl not in EXACT_LEVELS:   # Q8_0 / Q4_1 in llmrt's block order: closeness (the LEVELS comment)
        from test_fidelity import assert_as_close, closeness, lp_rows, ref_rows
        b1 = ref_rows(ref["teacher_forced_nbatch1"])
        own = closeness(b1, ref_rows(ref["teacher_forced"]))
        got = closeness(b1, [r for e, lp in zip(ref["teacher_forced_nbatch1"], tf) for r in lp_rows(e["ids"], lp)])
        own_pre = [common_prefix(g["ids"], g1["ids"]) for g, g1 in zip(ref["greedy"], ref["greedy_nbatch1"])]
        print(f"{name} [{lvl}] one token at a time vs llama.cpp n_batch 1: top-1 {100 * got[0]:.2f} %, "
              f"KL5 {got[1]:.2e}, |dlp| {got[2]:.2e}, greedy prefixes {pre}; llama.cpp n_batch 512 vs 1: "
              f"{100 * own[0]:.2f} %, {own[1]:.2e}, {own[2]:.2e}, {own_pre}")
        assert_as_close(got, own, f"{name} [{lvl}], one token at a time")
        assert sum(p >= GREEDY_PREFIX for p in pre) >= sum(p >= GREEDY_PREFIX for p in own_pre), (name, pre, own_pre)
        return
    b = EXACT
    assert top1 >= b["min_top1"], (name, top1)
    assert abs(nll - nll_ref) / nll_ref <= b["max_nll_rel"], (name, nll, nll_ref)
    assert sum(p >= b["greedy_prefix"] for p in pre) >= b["min_greedy_prompts"], (name, pre)
    if b["logprob_atol"] is not None:
        assert max_top5_logprob_error(ref["teacher_forced_nbatch1"], tf) <= b["logprob_atol"], name


if __name__ == "__main__":
    for n in sys.argv[1:] or sorted(MODELS):
        for line in report(n, *results(n)):
            print(line, flush=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("lvl", LEVELS)
def test_prompt_batch_equals_token_by_token(name, lvl):
    """llmrt's batched prompt path computes every row with the same single-row float operations
    (the prefill kernels, 16-lane ones included, keep the GEMV's order) and attention pads n_kv to
    a multiple of 256 (masked cells add exact zeros), so a whole prompt in one batch gives the same
    logits, bit for bit, as feeding it token by token, at every level."""
    from llmrt import runtime
    from llmrt.model import Model
    need_level(lvl)
    path = real_model_path(MODELS[name])
    ids = load_ref(name)["teacher_forced_nbatch1"][0]["ids"]
    before = runtime.isa()
    runtime.set_isa(lvl)
    try:
        model = Model(path, n_threads=N_THREADS)
        sess = model.new_session(ctx_size=512)
        batched = sess.eval(ids, all_logits=True)
        one_by_one = logits_token_by_token(model, ids)
    finally:
        runtime.set_isa(before)
    np.testing.assert_array_equal(batched, one_by_one)
