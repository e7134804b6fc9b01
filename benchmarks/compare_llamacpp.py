"""llmrt vs llama.cpp on the same GGUF files, same CPU, same thread count, in one run.

    python benchmarks/compare_llamacpp.py MODEL.gguf [MODEL.gguf ...] [-t 2] [-p 512] [-n 128]
        [-r 5] [--rounds 2] [--llama-python /path/to/venv/bin/python]

For every model it runs `llmrt bench -o json` and benchmarks/llamacpp_bench.py (llama-cpp-python's
low-level API doing what llama-bench does) as separate processes, alternating them `--rounds`
times so that a slow minute of the machine hits both, and prints one markdown table of t/s and
ratios (llmrt / llama.cpp), with the date, the CPU and the load times. The decode column also gives
llmrt's tg as a fraction of the memory-bandwidth bound (weight bytes per token over the measured
read bandwidth; see llmrt/bench.py).

llama-cpp-python is never a dependency of llmrt: point --llama-python at an interpreter that has it
(tools/README in tests/data explains how the reference venv was built).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run_json(cmd) -> list:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def merge(runs: list) -> dict:
    """{test: row} over several rounds: t/s mean and sd over all samples of all rounds."""
    out = {}
    for rows in runs:
        for r in rows:
            d = out.setdefault(r["test"], dict(r, samples=[]))
            d["samples"] += r.get("samples") or [r["t_s"]]
            d["load_s"] = min(d.get("load_s", 1e9), r.get("load_s", 1e9))
    for d in out.values():
        s = d["samples"]
        d["t_s"] = statistics.mean(s)
        d["t_s_sd"] = statistics.stdev(s) if len(s) > 1 else 0.0
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", sys.executable))
    ap.add_argument("--json", metavar="FILE", help="also write every number to FILE")
    a = ap.parse_args(argv)

    common = ["-p", str(a.p), "-n", str(a.n), "-r", str(a.r)]
    table = []
    for model in a.models:
        ours, theirs = [], []
        for _ in range(a.rounds):
            theirs.append(run_json([a.llama_python, os.path.join(HERE, "llamacpp_bench.py"), model,
                                    "-t", str(a.threads)] + common))
            ours.append(run_json([sys.executable, "-m", "llmrt", "bench", model, "-o", "json",
                                  "-t", str(a.threads)] + common))
        table.append((os.path.basename(model), merge(ours), merge(theirs)))

    date = datetime.date.today().isoformat()
    print(f"{date}, {cpu_name()}, {os.cpu_count()} logical CPUs, {a.threads} threads, "
          f"{a.rounds} rounds x {a.r} repetitions\n")
    print("| model | test | llmrt t/s | llama.cpp t/s | ratio | note |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    dump = []
    for name, o, t in table:
        for test in o:
            if test not in t:
                continue
            r = o[test]["t_s"] / t[test]["t_s"]
            note = ""
            if "tg_bound_t_s" in o[test]:
                note = (f"{100 * o[test]['t_s'] / o[test]['tg_bound_t_s']:.0f} % of the bandwidth bound "
                        f"({o[test]['weight_bytes_per_token'] / 1e6:.0f} MB/token at "
                        f"{o[test]['read_bandwidth_gb_s']:.1f} GB/s = {o[test]['tg_bound_t_s']:.0f} t/s)")
            print(f"| {name} | {test} | {o[test]['t_s']:.1f} ± {o[test]['t_s_sd']:.1f} | "
                  f"{t[test]['t_s']:.1f} ± {t[test]['t_s_sd']:.1f} | {r:.2f}x | {note} |")
            dump.append({"model": name, "test": test, "llmrt": o[test], "llama.cpp": t[test], "ratio": r})
        lo = next(iter(o.values())).get("load_s")
        lt = next(iter(t.values())).get("load_s")
        print(f"| {name} | load | {lo:.2f} s | {lt:.2f} s | {lt / lo:.2f}x | time to a ready model |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": date, "cpu": cpu_name(), "threads": a.threads, "rows": dump}, f, indent=1)


if __name__ == "__main__":
    main()
