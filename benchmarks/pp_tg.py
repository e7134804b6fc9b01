"""End-to-end speed in llama-bench's terms: pp N (prompt of N tokens in one batch, tokens/s) and
tg N (N tokens decoded one at a time after it, tokens/s), for a GGUF model. Run the same command
with LLMRT_PACK=0 to time the plain vec_dot matmul path in the same build.

Run: python benchmarks/pp_tg.py MODEL [-t THREADS] [--pp 512] [--tg 128] [--reps 2]
"""
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import argparse
import time

import numpy as np

from llmrt import Model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    t0 = time.perf_counter()
    m = Model(a.model, n_threads=a.threads, ctx_size=a.pp + a.tg + 8)
    ids = list(np.random.default_rng(0).integers(100, m.n_vocab - 100, size=a.pp))
    s = m.new_session(ctx_size=a.pp + a.tg + 8)
    s.eval(ids[:8])                                  # builds the graphs (and packs the weights)
    s.eval(ids[:1])
    load = time.perf_counter() - t0
    pp, tg = [], []
    for _ in range(a.reps):
        s = m.new_session(ctx_size=a.pp + a.tg + 8)
        t = time.perf_counter()
        s.eval(ids)
        pp.append(a.pp / (time.perf_counter() - t))
        t = time.perf_counter()
        for i in range(a.tg):
            s.eval([ids[i % len(ids)]])
        tg.append(a.tg / (time.perf_counter() - t))
    print(f"{os.path.basename(a.model)}: load+warmup {load:.1f} s, pack={os.environ.get('LLMRT_PACK', '1')}, "
          f"{a.threads} threads: pp{a.pp} {max(pp):.1f} t/s, tg{a.tg} {max(tg):.1f} t/s "
          f"(best of {a.reps}; all pp {[round(v, 1) for v in pp]}, tg {[round(v, 1) for v in tg]})")


if __name__ == "__main__":
    main()
