#!/usr/bin/env python3
"""Per-token decode latency at steady state: a shift on every token vs rare shifts.

    python benchmarks/streaming_latency.py [--models smollm2,gemma3] [--ctx 100] [--n-keep 4]
        [--tokens 200] [--configs shift:1,shift:-1,recompute:-1] [--rounds 1]

A session of --ctx cells (kv_mode:n_discard per config) is first filled with text tokens (not
timed), so every timed token lands in a full cache: with n_discard 1 each token evicts one
cell and shifts the rest (one shift per token); with n_discard -1 half of the unpinned cells go
at once, so a shift happens every ~(ctx - n_keep)/2 tokens and most tokens pay none. Then
--tokens tokens are decoded one at a time (eval of one id, last logits only), each timed with
perf_counter. Prints median / mean / p90 ms per token and tokens/s; the ratio column is
tokens/s relative to the first config of the model. Teacher-forced text tokens are fed (no
sampling), so every config sees the same tokens. With --rounds R > 1 the configs run R times,
alternating (A B A B ...: a slow minute of a shared machine hits all of them), and a last line per
model gives each config's tokens/s relative to the first config's, round by round: min / median.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streaming_ppl import cpu_name, long_text, model_file  # noqa: E402


def run(m, ids, ctx, n_keep, mode, n_discard, n_tokens):
    s = m.new_session(ctx_size=ctx, n_keep=n_keep, n_discard=n_discard, kv_mode=mode)
    s.eval(ids[:ctx])                   # fill: prefill exactly ctx tokens, no eviction yet
    for t in ids[ctx:ctx + 8]:          # warm up the one-token graph (and the first eviction)
        s.eval([t])
    sh0 = getattr(s, "n_shifts", 0)
    dt = []
    for t in ids[ctx + 8:ctx + 8 + n_tokens]:
        t0 = time.perf_counter()
        s.eval([t])
        dt.append(time.perf_counter() - t0)
    return dt, getattr(s, "n_shifts", 0) - sh0     # latencies (s), evictions while timing


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--ctx", type=int, default=100)
    ap.add_argument("--n-keep", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--configs", default="shift:1,shift:-1",
                    help="comma-separated kv_mode:n_discard pairs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="alternated rounds of all configs")
    a = ap.parse_args()

    from llmrt.model import Model

    text = long_text()
    configs = [(c.split(":")[0], int(c.split(":")[1])) for c in a.configs.split(",")]
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {cpu_name()}, {a.threads} threads; ctx {a.ctx}, "
          f"n_keep {a.n_keep}, {a.tokens} timed one-token decodes in a full cache")
    print("| model | kv_mode | n_discard | evictions | median ms/token | mean ms | p90 ms | tokens/s | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for name in a.models.split(","):
        m = Model(model_file(name), n_threads=a.threads, ctx_size=a.ctx)
        ids = m.tokenizer.encode(text, add_special=True)
        ratios = {c: [] for c in configs[1:]}
        for _ in range(a.rounds):
            base = None
            for mode, nd in configs:
                dt, n_ev = run(m, ids, a.ctx, a.n_keep, mode, nd, a.tokens)
                tps = len(dt) / sum(dt)
                base = base or tps
                if (mode, nd) in ratios:
                    ratios[(mode, nd)].append(tps / base)
                q = sorted(dt)
                p90 = q[int(0.9 * (len(q) - 1))]
                print(f"| {name} | {mode} | {nd} | {n_ev} | {1e3 * statistics.median(dt):.1f} | "
                      f"{1e3 * statistics.mean(dt):.1f} | {1e3 * p90:.1f} | {tps:.1f} | {tps / base:.2f} |",
                      flush=True)
        if a.rounds > 1:
            m0, n0 = configs[0]
            for (mode, nd), r in ratios.items():
                print(f"# {name}: {m0}:{n0} vs {mode}:{nd}, tokens/s ratio over {a.rounds} rounds: "
                      f"min {1 / max(r):.3f}, median {1 / statistics.median(r):.3f}", flush=True)


if __name__ == "__main__":
    main()
