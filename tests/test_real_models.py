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

# Bounds against llama.cpp at n_batch = 1 (the task's floor: top-1 >= 97 %, mean NLL within 1 %,
# >= 24 identical greedy tokens on >= 6 of 8 prompts) made stricter where llmrt is bit-exact.
# Measured (AVX2 level, this commit): SmolLM2 100 % top-1, NLL rel. diff ~1e-7 (the references
# keep 6 decimals), 8/8 prompts identical for all 32 tokens; see the per-model table below.
MIN_TOP1 = {"smollm2": 1.0, "gemma3": 0.97}
MAX_NLL_REL = {"smollm2": 1e-5, "gemma3": 0.01}
GREEDY_PREFIX = 24                      # tokens that must match on a "matching" prompt
MIN_GREEDY_PROMPTS = {"smollm2": 8, "gemma3": 6}


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


def run_model(name):
    """llmrt's teacher-forced log-probs and greedy continuations for the reference inputs."""
    from llmrt.model import Model
    model = Model(real_model_path(MODELS[name]), n_threads=N_THREADS)
    ref = load_ref(name)
    tf = [log_softmax(logits_token_by_token(model, e["ids"])) for e in ref["teacher_forced_nbatch1"]]
    greedy = [greedy_token_by_token(model, e["prompt_ids"], e["n_predict"]) for e in ref["greedy_nbatch1"]]
    return ref, tf, greedy


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


def report(name, ref, tf, greedy):
    lines = []
    for label, tk, gk in (("n_batch=1", "teacher_forced_nbatch1", "greedy_nbatch1"),
                          ("n_batch=512", "teacher_forced", "greedy")):
        top1, nll, nll_ref, pre = metrics(ref[tk], ref[gk], tf, greedy)
        lines.append(f"{name} vs llama.cpp {label:11s}: top-1 {100 * top1:6.2f} %, mean NLL {nll:.6f} "
                     f"(ref {nll_ref:.6f}, rel {abs(nll - nll_ref) / nll_ref:.2e}), greedy prefixes "
                     f"{pre} ({sum(p >= GREEDY_PREFIX for p in pre)}/{len(pre)} >= {GREEDY_PREFIX})")
    return lines


_CACHE = {}


def results(name):
    if name not in _CACHE:
        _CACHE[name] = run_model(name)
    return _CACHE[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_matches_llama_cpp_single_token_path(name):
    ref, tf, greedy = results(name)
    for line in report(name, ref, tf, greedy):
        print(line)
    top1, nll, nll_ref, pre = metrics(ref["teacher_forced_nbatch1"], ref["greedy_nbatch1"], tf, greedy)
    assert top1 >= MIN_TOP1[name], (name, top1)
    assert abs(nll - nll_ref) / nll_ref <= MAX_NLL_REL[name], (name, nll, nll_ref)
    assert sum(p >= GREEDY_PREFIX for p in pre) >= MIN_GREEDY_PROMPTS[name], (name, pre)


if __name__ == "__main__":
    for n in sys.argv[1:] or sorted(MODELS):
        for line in report(n, *results(n)):
            print(line, flush=True)
