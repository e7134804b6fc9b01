#!/usr/bin/env python3
"""Peak memory (RSS) of streaming N tokens through a fixed cache: 500 vs 4000 vs 20000 tokens.

    python benchmarks/streaming_memory.py [--models smollm2] [--ctx 100] [--n-keep 4]
        [--tokens 500,4000,20000] [--batch 16] [--kv-mode shift]

Each (model, N) runs in a fresh child process (peak RSS, ru_maxrss, only ever grows within a
process): load the model, open one session of --ctx cells, feed the first N tokens of the long
text (benchmarks/streaming_ppl.py) --batch tokens per eval (last logits only, as generation
does; the cache evicts half its unpinned cells whenever it is full), then report peak RSS and
the RSS after load and after every 10% of the stream. Flat memory means: the last column
(growth from 10% to 100% of the stream) stays near 0 and peak RSS does not depend on N.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streaming_ppl import cpu_name, long_text, model_file  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1]) / 1024
    return float("nan")


def child(a):
    """One run, in this process: prints one JSON line."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from llmrt.model import Model

    text = long_text()
    m = Model(model_file(a.models), n_threads=a.threads, ctx_size=a.ctx)
    ids = m.tokenizer.encode(text, add_special=True)
    n = a.child
    while len(ids) < n:                 # longer than the text: go round again (no BOS inside)
        ids = ids + ids[1:]
    ids = ids[:n]
    rss_load = rss_mb()
    s = m.new_session(ctx_size=a.ctx, n_keep=a.n_keep, n_discard=-1, kv_mode=a.kv_mode)
    marks, t0 = [], time.perf_counter()
    step = max(1, n // 10)
    for i in range(0, n, a.batch):
        s.eval(ids[i:i + a.batch])
        if (i // step) != ((i + a.batch) // step) or i + a.batch >= n:
            marks.append(round(rss_mb(), 1))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"n": n, "peak_mb": round(peak, 1), "rss_load_mb": round(rss_load, 1),
                      "rss_marks_mb": marks, "n_evicted": s.n_evicted, "n_shifts": s.n_shifts,
                      "seconds": round(time.perf_counter() - t0, 1)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2")
    ap.add_argument("--ctx", type=int, default=100)
    ap.add_argument("--n-keep", type=int, default=4)
    ap.add_argument("--tokens", default="500,4000,20000")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--kv-mode", default="shift")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)

    long_text()    # fetch once, before the children
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {cpu_name()}, {a.threads} threads; ctx {a.ctx}, "
          f"n_keep {a.n_keep}, kv_mode {a.kv_mode}, n_discard -1, {a.batch} tokens per eval")
    print("| model | tokens | evictions | peak RSS MB | RSS after load MB | RSS at 10% MB | "
          "RSS at 100% MB | growth 10%->100% MB | seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for name in a.models.split(","):
        for n in [int(x) for x in a.tokens.split(",")]:
            cmd = [sys.executable, __file__, "--child", str(n), "--models", name, "--ctx", str(a.ctx),
                   "--n-keep", str(a.n_keep), "--batch", str(a.batch), "--kv-mode", a.kv_mode,
                   "--threads", str(a.threads)]
            env = dict(os.environ, LLMRT_PROGRESS="0")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
            d = json.loads(out.strip().splitlines()[-1])
            mk = d["rss_marks_mb"]
            print(f"| {name} | {n} | {d['n_shifts']} | {d['peak_mb']:.1f} | {d['rss_load_mb']:.1f} | "
                  f"{mk[0]:.1f} | {mk[-1]:.1f} | {mk[-1] - mk[0]:+.1f} | {d['seconds']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
