#!/usr/bin/env python3
"""llmrt's teacher-forced logits vs llama.cpp's on the synthetic MoE files, measured as
tests/test_fidelity.py measures them for the dense real models (top-1 agreement, KL5 over the
reference's top-5 tokens, mean |Δ next-token log-prob|; the functions are imported from there).

One fixed sequence: the first N (default 256) tokens of tests/data/ppl_text.txt, tokenized by
llama.cpp with the model's own vocabulary (add_special=True, parse_special=False). Logits at every
position from four runs:

  llama.cpp b1   n_batch = n_ubatch = 1, logits_all (token by token; the reference, as in
                 tools/make_references.py's "teacher_forced_nbatch1")
  llama.cpp bN   n_batch = n_ubatch = N, logits_all (one batch)
  llmrt batch    Model(path, n_threads=2)(ids) (one batched pass)
  llmrt tbt      model.new_session(ctx_size=512, n_keep=0), sess.eval([t]) for each t

llama.cpp runs in a child process of the reference venv (llama-cpp-python, never imported here),
which writes its ids and logits to /tmp/moe_fidelity_<file>.npz. Both sides: 2 threads, llama.cpp
with flash_attn off (as the references). Run with the project's python:

    PYTHONPATH=. python tools/moe_fidelity.py [FILE.gguf ...] [--n-tokens 256] [--no-repack]

--no-repack adds llama.cpp b1 with its CPU_REPACK buffer type off (use_extra_bufts=False), i.e. its
plain vec_dot kernels instead of the repacked ones (Q4_0 / IQ4_NL / Q4_K ... on AVX2), and compares
llama.cpp with itself and llmrt with it. Dense files work too.

Without FILE: synthetic-moe-0.5b-{q4_0,q8_0,q4_k_m}.gguf in ~/.cache/llmrt/synthetic.
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
REF_PY = os.environ.get("LLMRT_REF_PYTHON", "/work/ref/venv/bin/python")
SYN = Path(os.path.expanduser("~/.cache/llmrt/synthetic"))
DEFAULT_FILES = [SYN / f"synthetic-moe-0.5b-{q}.gguf" for q in ("q4_0", "q8_0", "q4_k_m")]
TEXT = ROOT / "tests" / "data" / "ppl_text.txt"
N_THREADS = 2
TOP_K = 5
ROUND = 6           # llama.cpp's log-probs rounded as in the committed references


# ---- llama.cpp side (run by the reference venv's python: --child) ------------------------------

def child(path, out, n_tokens, no_repack):
    import llama_cpp
    from llama_cpp import Llama

    import llama_cpp.llama_cpp as lc            # the module Llama() calls it through
    defaults = lc.llama_model_default_params

    def make(n_batch, repack=True):
        # Llama() has no use_extra_bufts argument (unknown keywords are swallowed): the CPU_REPACK
        # buffer type goes off through the default model parameters Llama() starts from
        def params():
            p = defaults()
            p.use_extra_bufts = repack
            return p
        lc.llama_model_default_params = params
        try:
            return Llama(model_path=path, n_ctx=max(512, n_tokens), n_batch=n_batch, n_ubatch=n_batch,
                         n_threads=N_THREADS, n_threads_batch=N_THREADS, seed=1234, logits_all=True,
                         flash_attn=False, verbose=False)
        finally:
            lc.llama_model_default_params = defaults

    def run(llm, ids):
        llm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
        t0 = time.perf_counter()
        llm.eval(ids)
        dt = time.perf_counter() - t0
        return np.array(llm.scores[: len(ids)], dtype=np.float32), dt

    text = TEXT.read_text(encoding="utf-8")[:8 * n_tokens + 1000]
    llm = make(1)
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)[:n_tokens]
    assert len(ids) == n_tokens, len(ids)
    b1, t1 = run(llm, ids)
    del llm
    llm = make(n_tokens)
    bn, tn = run(llm, ids)
    del llm
    extra = {}
    if no_repack:
        llm = make(1, repack=False)
        extra["p1"], _ = run(llm, ids)
        del llm
    np.savez(out, ids=np.array(ids, dtype=np.int32), b1=b1, bn=bn, t=np.array([t1, tn]), **extra)


# ---- llmrt side and the comparison -------------------------------------------------------------

def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def rows(logits, ids, rnd=False):
    """(top-5 ids, top-5 log-probs, next token's log-prob) per position, as test_fidelity's rows."""
    lp = log_softmax(logits)
    top = np.argsort(-lp, axis=-1, kind="stable")[:, :TOP_K]
    r = (lambda v: round(float(v), ROUND)) if rnd else float
    return [([int(i) for i in top[j]], [r(lp[j, i]) for i in top[j]],
             r(lp[j, ids[j + 1]]) if j + 1 < len(ids) else None) for j in range(len(ids))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", default=[str(f) for f in DEFAULT_FILES])
    ap.add_argument("--n-tokens", type=int, default=256)
    ap.add_argument("--no-repack", action="store_true",
                    help="also run llama.cpp b1 with its weight repacking off (use_extra_bufts=False: "
                         "ggml's plain vec_dot kernels) and compare both sides with it")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], args.n_tokens, args.no_repack)

    sys.path.insert(0, str(ROOT / "tests"))
    from test_fidelity import closeness         # the metric definitions of the dense tests
    from llmrt import runtime
    from llmrt.model import Model

    n = args.n_tokens
    table = []
    for path in args.files:
        name = Path(path).name
        out = f"/tmp/moe_fidelity_{Path(path).stem}.npz"
        t0 = time.perf_counter()
        subprocess.run([REF_PY, __file__, "--child", path, out, "--n-tokens", str(n)]
                       + (["--no-repack"] if args.no_repack else []), check=True)
        ref = np.load(out)
        ids = [int(i) for i in ref["ids"]]
        t_ref = time.perf_counter() - t0

        model = Model(path, n_threads=N_THREADS)
        t0 = time.perf_counter()
        batch = model(ids)
        t_batch = time.perf_counter() - t0
        sess = model.new_session(ctx_size=512, n_keep=0)
        t0 = time.perf_counter()
        tbt = np.stack([sess.eval([t]) for t in ids])
        t_tbt = time.perf_counter() - t0
        del sess, model

        b1 = rows(ref["b1"], ids, rnd=True)
        res = [("llama.cpp b%d vs b1" % n, closeness(b1, rows(ref["bn"], ids, rnd=True))),
               ("llmrt batch vs llama.cpp b1", closeness(b1, rows(batch, ids))),
               ("llmrt tbt   vs llama.cpp b1", closeness(b1, rows(tbt, ids))),
               ("llmrt tbt   vs llmrt batch", closeness(rows(batch, ids), rows(tbt, ids)))]
        if args.no_repack:
            p1 = rows(ref["p1"], ids, rnd=True)
            res += [("llama.cpp b1 no-repack vs b1", closeness(b1, p1)),
                    ("llmrt batch vs b1 no-repack", closeness(p1, rows(batch, ids))),
                    ("llmrt tbt   vs b1 no-repack", closeness(p1, rows(tbt, ids)))]
        table.append((name, res))
        print(f"{name}: {n} tokens (ids[:6] {ids[:6]}); llama.cpp b1 {ref['t'][0]:.1f}s, b{n} "
              f"{ref['t'][1]:.1f}s (child {t_ref:.1f}s in all); llmrt batch {t_batch:.1f}s, tbt "
              f"{t_tbt:.1f}s", file=sys.stderr, flush=True)

    print(f"llmrt ISA {runtime.isa()}, {N_THREADS} threads; {n} tokens of tests/data/ppl_text.txt; "
          f"metrics of tests/test_fidelity.py (reference = first of each pair)")
    print(f"{'file':34s} {'comparison':32s} {'top-1 %':>8s} {'KL5':>10s} {'|dlp|':>10s}")
    for name, res in table:
        for label, (agree, kl, dlp) in res:
            print(f"{name:34s} {label:32s} {100 * agree:8.2f} {kl:10.2e} {dlp:10.2e}")


if __name__ == "__main__":
    sys.exit(main())
