"""attention_speed.py — prefill and decode speed of the real models (attention's share of a run).

Prints a Markdown table: for each model, the time of one 512-token prefill (random ids) into a
1024-cell cache, then of 128 single-token decode steps after it, as tokens per second. Each run
is repeated (--repeat) and the best time is kept: the machine is shared, so the minimum is the
least noisy estimate. Run from the repository root:

    python benchmarks/attention_speed.py --threads 2 --repeat 3

With --op, times the attention node alone (a graph of one attention over an f16 cache of
max(1024, prompt + 256) cells, random q/k/v) at the real models' shapes and the llama-shaped
synthetic models' (benchmarks/make_models.py: 12 query heads, 4 KV heads of 128): milliseconds
for the --prompt-token prefill and for one decode step after it (after 512: n_kv 768 cells, 513
used).

    python benchmarks/attention_speed.py --op --threads 2 --repeat 5 [--prompt 2048]
"""
import argparse
import os
import time

import numpy as np

from llmrt import Model

MODELS = {
    "SmolLM2-135M Q4_1": "/work/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "Gemma 3 270M Q4_K_M": "/work/models/gemma-3-270m-q4_k_m.gguf",
}


# name: (n_head, n_head_kv, head_dim, n_swa) of one attention layer
OP_SHAPES = {
    "SmolLM2-135M": (9, 3, 64, 0),
    "Gemma 3 270M local": (4, 1, 256, 512),
    "Gemma 3 270M global": (4, 1, 256, 0),
    "synthetic llama (0.4b-3b)": (12, 4, 128, 0),
}


def op_bench(a):
    import llmrt._core as core
    rng = np.random.default_rng(0)
    n = a.prompt
    n_ctx = max(1024, n + 256)
    print(f"| attention shape | pp{n} ms | decode step ms (after pp{n}) |")
    print("| --- | --- | --- |")
    for name, (nh, nkv, hd, n_swa) in OP_SHAPES.items():
        g = core.Graph(n, a.threads)
        tok = g.input_tokens()
        N = n + 1

        def act(heads):
            d = heads * hd
            w = g.weight(rng.standard_normal((N, d)).astype(np.float32), 0, (d, N))
            return g.reshape(g.get_rows(w, tok), (hd, heads))

        cache = core.KVCache(1, n_ctx, nkv, hd, hd, dtype="f16")
        y = g.attention(act(nh), act(nkv), act(nkv), cache, 0, 1.0 / np.sqrt(hd), n_swa=n_swa)
        g.set_output(y)
        g.build()
        best_p = best_d = float("inf")
        for _ in range(a.repeat):
            cache.truncate(0)
            t0 = time.perf_counter()
            g.run(np.arange(n), np.arange(n))
            t1 = time.perf_counter()
            for _ in range(8):
                g.run([n], [n])
                cache.truncate(n)
            t2 = time.perf_counter()
            best_p, best_d = min(best_p, t1 - t0), min(best_d, (t2 - t1) / 8)
        print(f"| {name} | {best_p * 1e3:.2f} | {best_d * 1e3:.3f} |", flush=True)


def run_once(model, n_prompt, n_gen, rng):
    sess = model.new_session(ctx_size=1024, kv_mode="none")
    ids = rng.integers(100, model.n_vocab - 100, size=n_prompt)
    t0 = time.perf_counter()
    sess.eval(ids)
    t1 = time.perf_counter()
    for t in rng.integers(100, model.n_vocab - 100, size=n_gen):
        sess.eval([int(t)])
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--model", choices=list(MODELS), action="append")
    ap.add_argument("--op", action="store_true", help="time the attention node alone")
    a = ap.parse_args()
    if a.op:
        op_bench(a)
        return
    rng = np.random.default_rng(0)
    print(f"| model | pp{a.prompt} t/s | tg{a.gen} t/s (after the prompt) |")
    print("| --- | --- | --- |")
    for name in a.model or MODELS:
        path = MODELS[name]
        if not os.path.exists(path):
            continue
        model = Model(path, n_threads=a.threads)
        run_once(model, 8, 2, rng)  # build the graphs once
        best_p, best_g = float("inf"), float("inf")
        for _ in range(a.repeat):
            tp, tg = run_once(model, a.prompt, a.gen, rng)
            best_p, best_g = min(best_p, tp), min(best_g, tg)
        print(f"| {name} | {a.prompt / best_p:.1f} | {a.gen / best_g:.1f} |", flush=True)


if __name__ == "__main__":
    main()
