import os, sys; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
"""Decode / prefill speed of F16 / BF16 / F32 matmuls on weights that do not fit in cache: a chain of
llama-shaped 0.4B FFN pairs (1536 -> 4096 -> 1536, --pairs of them, ~25 MB each in F16), so decode
streams every weight from memory as a real model's decode does. The ISA levels given are run in one
process, alternating (A B A B ...), and the min / median ms per run and GB/s of weights are printed.

Run: python benchmarks/float_stream.py [--type F16] [-n 1] [--levels avx2,avx512_vnni] [--rounds 5]
"""
import argparse
import time

import numpy as np
from gguf import GGMLQuantizationType as T

from llmrt import _core, runtime


def weights(t, K, M, rng):
    w = (rng.standard_normal((M, K)) / np.sqrt(K)).astype(np.float32)
    if t == T.F16:
        return w.astype(np.float16).view(np.uint8)
    if t == T.BF16:
        return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return w.view(np.uint8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--type", default="F16")
    ap.add_argument("-n", type=int, default=1, help="tokens per run (1: decode)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--dim", type=int, default=1536)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--levels", default="avx2,default")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5, help="timed runs per round")
    a = ap.parse_args()
    t = T[a.type]
    rng = np.random.default_rng(0)
    levels = [runtime.max_isa() + lv[len("default"):] if lv.startswith("default") else lv for lv in a.levels.split(",")]
    ws = [(weights(t, a.dim, a.ffn, rng), weights(t, a.ffn, a.dim, rng)) for _ in range(a.pairs)]
    nbytes = sum(w1.nbytes + w2.nbytes for w1, w2 in ws)
    times = {lv: [] for lv in levels}
    bw = []
    tok = np.arange(a.n, dtype=np.int32) % 64
    pos = np.arange(a.n, dtype=np.int32)
    for _ in range(a.rounds):
        bw.append(_core.read_bandwidth(256 << 20, a.threads, 3))
        for lv in levels:
            name, _, env = lv.partition(":")  # "level:VAR=value": VAR set while the table is filled
            if env:
                os.environ[env.split("=")[0]] = env.split("=")[1]
            runtime.set_isa(name)
            if env:
                del os.environ[env.split("=")[0]]
            g = _core.Graph(a.n, a.threads, pack=True)
            emb = np.random.default_rng(1).standard_normal((64, a.dim)).astype(np.float32)
            x = g.get_rows(g.weight(emb, int(T.F32), (a.dim, 64)), g.input_tokens())
            for w1, w2 in ws:
                h = g.mul_mat(g.weight(w1, int(t), (a.dim, a.ffn)), x)
                x = g.mul_mat(g.weight(w2, int(t), (a.ffn, a.dim)), h)
            g.set_output(x)
            g.single_thread_work = 0
            g.build()
            g.run(tok, pos)
            for _ in range(a.reps):
                t0 = time.perf_counter()
                g.run(tok, pos)
                times[lv].append(time.perf_counter() - t0)
            del g
    print(f"{a.type}, n = {a.n}, {a.threads} threads, {nbytes / 1e6:.0f} MB of weights, {a.rounds} rounds x {a.reps}")
    print(f"memory read bandwidth ({a.threads} threads, llmrt bench's probe): best {max(bw) / 1e9:.1f} GB/s, "
          f"median {np.median(bw) / 1e9:.1f} GB/s")
    for lv in levels:
        ts = np.array(times[lv])
        print(f"{lv:12s} min {ts.min() * 1e3:8.2f} ms  median {np.median(ts) * 1e3:8.2f} ms  "
              f"best {nbytes / ts.min() / 1e9:6.1f} GB/s  median {nbytes / np.median(ts) / 1e9:6.1f} GB/s  "
              f"{a.n / ts.min():8.1f} tok/s")


if __name__ == "__main__":
    main()
