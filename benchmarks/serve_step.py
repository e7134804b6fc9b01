#!/usr/bin/env python3
"""Time a serving decode step: one graph run of N tokens, one per sequence, with logits for each
(`Model.eval_sessions`, what `llmrt serve`'s engine runs every step), for N in --seqs.

    python benchmarks/serve_step.py MODEL.gguf [--seqs 1,2,4,8] [--steps 30] [--threads 2]
        [--prompt 40] [--profile]

Per N: N sessions (ctx --ctx-size) each prefilled with --prompt random ids, then --steps timed
steps of one random id per session after 3 untimed ones; prints the median and min ms per step
and, with --profile, the largest rows of thread 0's time per step by op and weight type
(llmrt.bench.profile_rows: mul_mat rows name their weight type). A step of N sequences reads the
weights once: compare its time with N x one sequence's. Speed is this machine's; alternate builds
and repeat (the hosts are noisy).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from llmrt.bench import profile_rows  # noqa: E402
from llmrt.model import Model  # noqa: E402


def step_times(model, n: int, steps: int, prompt: int, ctx: int, rng, profile: bool):
    sessions = [model.new_session(ctx_size=ctx) for _ in range(n)]
    for s in sessions:
        s.eval(rng.integers(0, model.n_vocab, prompt).tolist())
    ids = [[int(rng.integers(0, model.n_vocab))] for _ in range(n)]
    for _ in range(3):
        model.eval_sessions(sessions, ids)
    graphs = list(model._graphs.values())
    for g in graphs:
        g.set_profile(profile)
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter()
        model.eval_sessions(sessions, ids)
        ts.append((time.perf_counter() - t0) * 1e3)
    rows = profile_rows(graphs) if profile else []
    for g in graphs:
        g.set_profile(False)
    return ts, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--seqs", default="1,2,4,8", help="sequences per step, comma-separated")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=40, help="ids prefilled per session first")
    ap.add_argument("--ctx-size", type=int, default=512)
    ap.add_argument("--profile", action="store_true", help="also time every node (by op)")
    a = ap.parse_args()
    seqs = [int(v) for v in a.seqs.split(",")]
    if min(seqs) < 1 or a.steps < 1 or a.prompt < 1 or a.prompt + a.steps + 3 > a.ctx_size:
        ap.error("need --seqs >= 1, --steps >= 1, --prompt >= 1 and --prompt + --steps + 3 <= --ctx-size")
    model = Model(a.model, n_threads=a.threads)
    rng = np.random.default_rng(0)
    print(f"# {os.path.basename(a.model)}, {a.threads} threads, {a.steps} steps per N, prompt {a.prompt}")
    print("| sequences | step ms (median) | step ms (min) | ms per sequence (median) |")
    print("| ---: | ---: | ---: | ---: |")
    profiles = {}
    for n in seqs:
        ts, rows = step_times(model, n, a.steps, a.prompt, a.ctx_size, rng, a.profile)
        med = statistics.median(ts)
        print(f"| {n} | {med:.2f} | {min(ts):.2f} | {med / n:.2f} |", flush=True)
        profiles[n] = rows
    for n, rows in profiles.items():
        if rows:
            top = ", ".join(f"{(d['op'] + ' ' + d['type']).strip()} {d['ms_per_run']:.2f}" for d in rows[:6])
            print(f"# {n} sequences, ms per step by op: {top}")


if __name__ == "__main__":
    main()
