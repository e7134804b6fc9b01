import os, sys; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
"""Matmul micro-benchmark: one mul_mat node (y = W x) on the packed gemm path vs the plain
vec_dot path, for the real models' weight types and shapes. Prints a Markdown table of the best
of several runs (ms per run and GB/s of weights streamed for decode; tokens/s for prefill).

Run: python benchmarks/matmul.py [-t THREADS] [--reps N]
"""
import argparse
import time

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

from llmrt import _core

# (type, K, M): SmolLM2 (Q4_1 layers, Q8_0 tied output), Gemma 3 (Q5_0 / Q8_0 layers, Q8_0 output)
# Gemma 3 270M Q4_K_M: Q5_0 attn_q/k/v (640 x 1024 / 256) and ffn_gate/up (640 x 2048), Q4_K
# attn_output (1024 x 640) and ffn_down (2048 x 640), Q6_K ffn_down in some layers (2048 x 640)
SHAPES = [(T.Q4_1, 576, 1536), (T.Q4_1, 1536, 576), (T.Q8_0, 576, 49152), (T.Q5_0, 640, 2048),
          (T.Q8_0, 640, 65536), (T.Q4_0, 576, 1536), (T.Q5_1, 576, 1536),
          (T.Q5_0, 640, 1024), (T.Q4_K, 1024, 640), (T.Q4_K, 2048, 640), (T.Q6_K, 2048, 640)]
# llama-shaped 0.4B (dim 1536, ffn 4096, 4 KV heads of 128) in F16 / BF16: attn_q/o, attn_k/v, ffn_gate/up,
# ffn_down (select with --type F16 BF16 F32)
SHAPES += [(t, K, M) for t in (T.F16, T.BF16) for K, M in ((1536, 1536), (1536, 512), (1536, 4096), (4096, 1536))]
SHAPES += [(T.F32, 1536, 1536)]
# the same 0.4B's ffn_gate/up (1536 x 4096) and ffn_down (4096 x 1536) in the quantized types (select
# with --type, e.g. --type Q4_0 Q8_0 Q4_K IQ4_XS -n 1 64)
SHAPES += [(t, 1536, 4096) for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL, T.Q4_K, T.Q5_K, T.IQ4_XS)]
SHAPES += [(T.Q6_K, 4096, 1536)]


def weight(t, K, M, rng):
    if t in (T.F32, T.F16, T.BF16):  # values of a trained layer's scale, in the type's own bits
        w = (rng.standard_normal((M, K)) / np.sqrt(K)).astype(np.float32)
        if t == T.F16:
            return w.astype(np.float16).view(np.uint8)
        if t == T.BF16:
            return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return w.view(np.uint8)
    be, bb = gguf.GGML_QUANT_SIZES[t]
    b = rng.integers(0, 256, size=(M * K // be, bb), dtype=np.uint8)
    d = (rng.uniform(1e-3, 1e-2, size=b.shape[0])).astype(np.float16)
    b[:, 0:2] = d.reshape(-1, 1).view(np.uint8)
    if t in (T.Q4_1, T.Q5_1):
        b[:, 2:4] = d.reshape(-1, 1).view(np.uint8)
    return b.reshape(M, -1)


def graph(w, t, K, M, n, threads, pack):
    g = _core.Graph(n, threads, pack=pack)
    emb = np.random.default_rng(1).standard_normal((64, K)).astype(np.float32)
    e = g.weight(emb, int(T.F32), (K, 64))
    tok = g.input_tokens()
    x = g.get_rows(e, tok)
    y = g.mul_mat(g.weight(w, int(t), (K, M)), x)
    g.set_output(y)
    g.single_thread_work = 0
    g.build()
    return g


def best(g, n, reps):
    tok = np.arange(n, dtype=np.int32) % 64
    pos = np.arange(n, dtype=np.int32)
    g.run(tok, pos)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        g.run(tok, pos)
        ts.append(time.perf_counter() - t0)
    return min(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("-n", type=int, nargs="*", default=[1, 512])
    ap.add_argument("--type", nargs="*", default=None, help="only these types (e.g. Q5_0 Q4_K)")
    ap.add_argument("--packed-only", action="store_true", help="skip the plain vec_dot path")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"isa {_core.isa_current()}, {a.threads} threads, best of {a.reps}")
    print("| type | K x M | n | plain ms | packed ms | speedup | packed GB/s (weights) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for t, K, M in SHAPES:
        if a.type and t.name not in a.type:
            continue
        w = weight(t, K, M, rng)
        for n in a.n:
            reps = a.reps if n == 1 else max(2, a.reps // 4)
            tp = float("nan") if a.packed_only else best(graph(w, t, K, M, n, a.threads, False), n, reps)
            tq = best(graph(w, t, K, M, n, a.threads, True), n, reps)
            print(f"| {t.name} | {K} x {M} | {n} | {tp * 1e3:.3f} | {tq * 1e3:.3f} | {tp / tq:.2f} | "
                  f"{w.nbytes / tq / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
