"""llama.cpp's side of benchmarks/compare_llamacpp.py: llama-bench's pp/tg tests through
llama-cpp-python's low-level API, printed as the same JSON list `llmrt bench -o json` prints.

    python benchmarks/llamacpp_bench.py MODEL.gguf [-p 512] [-n 128] [-d 0] [-r 5] [-t 2]

pp<P>: P random tokens in one batch (n_batch = n_ubatch = P), logits of the last one only, from an
empty cache. tg<N>: N tokens decoded one at a time from an empty cache. With -d D (llama-bench's
--n-depth) each run first prefills D random tokens, untimed (in one batch: n_batch = n_ubatch =
max(P, D)), and the tests are named "pp<P> @ d<D>", "tg<N> @ d<D>". One warm-up run of each first,
as llama-bench does. Needs llama-cpp-python (never a dependency of llmrt)."""
import argparse
import json
import statistics
import sys
import time

import llama_cpp
import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-d", type=int, default=0, help="tokens in the cache before each timed run")
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("-t", type=int, default=2)
    a = ap.parse_args(argv)
    if a.d < 0:
        ap.error(f"-d must be >= 0, got {a.d}")

    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    t0 = time.perf_counter()
    model = llama_cpp.llama_model_load_from_file(a.model.encode(), mp)
    load_s = time.perf_counter() - t0
    if not model:
        sys.exit(f"llama.cpp could not load {a.model}")
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = a.d + max(a.p, a.n) + 16
    cp.n_batch = cp.n_ubatch = max(a.p, a.d, 1)
    cp.n_threads = cp.n_threads_batch = a.t
    ctx = llama_cpp.llama_init_from_model(model, cp)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    mem = llama_cpp.llama_get_memory(ctx)
    rng = np.random.default_rng(0)

    def decode(ids, pos0):
        b = llama_cpp.llama_batch_init(len(ids), 0, 1)
        b.n_tokens = len(ids)
        for i, t in enumerate(ids):
            b.token[i] = int(t)
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = i == len(ids) - 1
        rc = llama_cpp.llama_decode(ctx, b)
        llama_cpp.llama_batch_free(b)
        if rc != 0:
            sys.exit(f"llama_decode failed: {rc}")

    def start():
        """the cache cleared, then holding a.d random tokens (untimed)"""
        llama_cpp.llama_memory_clear(mem, True)
        if a.d:
            decode(rng.integers(0, n_vocab, a.d), 0)
            llama_cpp.llama_synchronize(ctx)

    def pp():
        ids = rng.integers(0, n_vocab, a.p)
        start()
        t = time.perf_counter()
        decode(ids, a.d)
        llama_cpp.llama_synchronize(ctx)
        return a.p / (time.perf_counter() - t)

    def tg():
        start()
        t = time.perf_counter()
        tok = int(rng.integers(0, n_vocab))
        for i in range(a.n):
            decode([tok], a.d + i)
            llama_cpp.llama_synchronize(ctx)
        return a.n / (time.perf_counter() - t)

    at = f" @ d{a.d}" if a.d else ""
    out = []
    for name, fn, n in (("pp", pp, a.p), ("tg", tg, a.n)):
        if n <= 0:
            continue
        fn()  # warm-up
        runs = [fn() for _ in range(a.r)]
        out.append({"test": f"{name}{n}{at}", "n_depth": a.d, "t_s": statistics.mean(runs),
                    "t_s_sd": statistics.stdev(runs) if len(runs) > 1 else 0.0,
                    "n_threads": a.t, "backend": "llama.cpp " + llama_cpp.__version__,
                    "load_s": load_s})
    print(json.dumps(out))
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()
