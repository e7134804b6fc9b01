"""llmrt vs llama.cpp on the same GGUF files, same CPU, same thread count, in one run, at every
ISA level of llmrt the machine has above generic.

    python benchmarks/compare_llamacpp.py MODEL.gguf [MODEL.gguf ...] [-t 2] [-p 512] [-n 128] [-d 0] [-r 5]
    python benchmarks/compare_llamacpp.py --set synthetic [--synthetic-dir DIR] [--levels default,avx2]
        [--llama-python /work/ref/venv/bin/python] [--margin 0.03] [--json FILE]

`--set synthetic` is the benchmark set of issue 11: the files of benchmarks/make_models.py
(0.4b and 1.5b in Q4_0, Q4_K_M, Q8_0, F16, BF16; 3b in Q4_0 and Q4_K_M; run make_models.py
first, files that are missing are skipped with a note) plus the two real models SmolLM2-135M
Q4_1 and Gemma 3 270M Q4_K_M from ~/.cache/llmrt. `--set moe` is the MoE set (make_models.py
--set moe: moe-0.5b and moe-2b, qwen3moe, in Q4_0, Q4_K_M, Q8_0, F16). Models given by path are
added to the set.

Every repetition (-r) starts one fresh process per program: llama.cpp (benchmarks/llamacpp_bench.py
under --llama-python: llama-cpp-python's low-level API doing what llama-bench does) and `llmrt
bench` once per level (no LLMRT_ISA for the default level, the CPU's highest; LLMRT_ISA=<level>
for each level below it down to avx2). Each process loads the model, runs each test once to warm
up and once timed. The order of the programs rotates from one repetition to the next, so that a
slow minute of a shared machine hits all of them. The table gives the median and the best (the
minimum time) of the repetitions, the ratios llmrt / llama.cpp of the medians, and decode as a
fraction of the memory-bandwidth bound:

    bound (t/s) = bandwidth / bytes read per token

bytes read per token = every tensor of the file except the embedding table (the projections, the
output matrix, the norms; the embedding table itself when the output is tied to it): what one
decoded token reads. In a MoE file the expert tensors (ffn_*_exps) count expert_used_count /
expert_count of their bytes (one token reads its top-k experts' slices; router and norms whole). bandwidth = the highest read rate of a numpy streaming reduction over 1 GiB
with the same number of threads, measured before and after the runs (both printed; each the best
of 5 runs of two reductions; the bound uses the higher reading, the one closest to what the
memory can deliver: on a shared machine a single reading can be low).

Checks (the issue's targets, at every level): a row misses a target when pp < 2x llama.cpp,
tg < 1.3x llama.cpp, or, for files of 1 GB and more, tg < 75 % of the bound; the misses are named
in the last column. The run FAILS (a FAIL line, exit status 1) when the default level is slower
than LLMRT_ISA=avx2 on any row, pp or tg, by more than --margin (default 3 % of the avx2 median):
medians of alternated runs of the same program move by 1-2 % on a quiet machine, so 3 % is
beyond that noise. On a loaded machine use more repetitions (-r 5 or more) before trusting a FAIL.

-d D runs both programs' tests at depth D (llama-bench's --n-depth: the cache holds D random tokens
before every timed run, "pp512 @ d1024", "tg128 @ d1024"): a reply deep into a conversation,
where attention reads D cached keys and values per token and layer. The bound then counts only
the weights, so it is not printed and its target not checked; the ratio targets and the level
check still apply.

llama-cpp-python is never a dependency of llmrt: point --llama-python at an interpreter that has
it (default: $LLAMA_PYTHON, else /work/ref/venv/bin/python when it exists, else this Python).
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.expanduser("~/.cache/llmrt")
REAL = [os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf"), os.path.join(CACHE, "gemma-3-270m-q4_k_m.gguf")]
SYNTHETIC = [("0.4b", t) for t in ("q4_0", "q4_k_m", "q8_0", "f16", "bf16")] + \
            [("1.5b", t) for t in ("q4_0", "q4_k_m", "q8_0", "f16", "bf16")] + \
            [("3b", t) for t in ("q4_0", "q4_k_m")]
MOE = [(size, t) for size in ("moe-0.5b", "moe-2b") for t in ("q4_0", "q4_k_m", "q8_0", "f16")]
TARGET_PP, TARGET_TG, TARGET_BOUND = 2.0, 1.3, 0.75


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def default_llama_python() -> str:
    if os.environ.get("LLAMA_PYTHON"):
        return os.environ["LLAMA_PYTHON"]
    ref = "/work/ref/venv/bin/python"
    return ref if os.path.exists(ref) else sys.executable


def read_bandwidth(threads: int, mib: int = 1024, reps: int = 5) -> float:
    """Bytes/s: the best of `reps` streaming reductions (max over float32, or over int64) of a
    `mib` MiB array split over `threads` threads (numpy releases the GIL in reductions)."""
    best = 0.0
    for dt, fn in ((np.float32, np.maximum.reduce), (np.int64, np.bitwise_or.reduce)):
        a = np.ones(mib * 2**20 // np.dtype(dt).itemsize, dt)
        parts = np.array_split(a, threads)
        for _ in range(reps):
            ts = [threading.Thread(target=fn, args=(p,)) for p in parts]
            t = time.perf_counter()
            for x in ts:
                x.start()
            for x in ts:
                x.join()
            best = max(best, a.nbytes / (time.perf_counter() - t))
        del a, parts
    return best


def bytes_per_token(path: str) -> int:
    """Bytes one decoded token reads (llmrt.gguf.decode_bytes_per_token): every tensor but the
    embedding table (which only gives one row), plus the table when there is no output matrix
    (tied); in a MoE file the expert tensors count for expert_used_count / expert_count of their
    bytes (a token reads only its experts' slices; router, shared experts and norms whole)."""
    from llmrt.gguf import GGUFFile, decode_bytes_per_token

    with GGUFFile(path) as f:
        return decode_bytes_per_token(f)


def type_name(path: str) -> str:
    m = re.search(r"(iq\d_[a-z]+|q\d_k_[sml]|q\d_k|q\d_\d|bf16|f16|f32)", os.path.basename(path).lower())
    return m.group(1).upper() if m else "?"


def levels_above_generic() -> list:
    """The llmrt levels this machine runs, highest first, without generic: ['avx512_vnni', ...]."""
    p = subprocess.run([sys.executable, "-c", "from llmrt import runtime; print(' '.join(runtime.available_isas()))"],
                       capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "LLMRT_ISA"})
    if p.returncode != 0:
        sys.exit(f"could not import llmrt:\n{p.stderr[-2000:]}")
    return [lv for lv in reversed(p.stdout.split()) if lv != "generic"]


def run_json(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        print(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}", file=sys.stderr)
        return None
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"no JSON from: {' '.join(cmd)}\n{p.stdout[-1000:]}", file=sys.stderr)
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--set", choices=["synthetic", "moe"],
                    help="the benchmark set: synthetic (dense + the two real models) or moe (see above)")
    ap.add_argument("--synthetic-dir", default=os.path.join(CACHE, "synthetic"))
    ap.add_argument("--levels", default=None,
                    help="comma list: 'default' and/or llmrt levels (default: default + every level "
                         "below the highest down to avx2)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-d", type=int, default=0,
                    help="depth: both programs' tests start from a cache holding this many tokens "
                         "(llama-bench's -d); the bound and its target are then not applied")
    ap.add_argument("-r", type=int, default=5, help="repetitions, each a fresh process per program")
    ap.add_argument("--margin", type=float, default=0.03,
                    help="default level slower than avx2 by more than this fraction: FAIL [0.03]")
    ap.add_argument("--llama-python", default=default_llama_python())
    ap.add_argument("--json", metavar="FILE", help="also write every number to FILE")
    a = ap.parse_args(argv)
    if a.d < 0:
        ap.error("-d must be >= 0")

    models = []
    if a.set == "synthetic":
        for size, t in SYNTHETIC:
            models.append(os.path.join(a.synthetic_dir, f"synthetic-{size}-{t}.gguf"))
        models += REAL
    elif a.set == "moe":
        for size, t in MOE:
            models.append(os.path.join(a.synthetic_dir, f"synthetic-{size}-{t}.gguf"))
    models += a.models
    if not models:
        ap.error("give model files or --set synthetic / --set moe")
    missing = [m for m in models if not os.path.exists(m)]
    for m in missing:
        print(f"note: {m} missing, skipped (python benchmarks/make_models.py makes the synthetic ones)",
              file=sys.stderr)
    models = [m for m in models if m not in missing]

    avail = levels_above_generic()            # highest first
    top = avail[0]
    if a.levels:
        levels = a.levels.split(",")
        for lv in levels:
            if lv != "default" and lv not in avail:
                sys.exit(f"level {lv!r} not available here (this machine: {', '.join(avail)})")
    else:
        levels = ["default"] + avail[1:]
    if "avx2" not in avail:
        print("note: this CPU has no avx2 level: nothing to check the default level against", file=sys.stderr)

    at = f" @ d{a.d}" if a.d else ""
    bw = read_bandwidth(a.threads)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{date}, {cpu_name()}, {os.cpu_count()} logical CPUs, {a.threads} threads, "
          f"llmrt levels: default = {top}, {', '.join(avail[1:]) or '-'}; pp{a.p} / tg{a.n}{at}, "
          f"{a.r} alternated repetitions per program (median, best in parentheses)")
    print(f"memory read bandwidth (numpy streaming reduction, {a.threads} threads, 1 GiB): {bw / 1e9:.1f} GB/s\n",
          flush=True)

    base_env = {k: v for k, v in os.environ.items() if k != "LLMRT_ISA"}
    common = ["-p", str(a.p), "-n", str(a.n), "-d", str(a.d), "-r", "1", "-t", str(a.threads)]
    tests = [f"pp{a.p}{at}"] * (a.p > 0) + [f"tg{a.n}{at}"] * (a.n > 0)
    results = []
    for model in models:
        progs = ["llama.cpp"] + levels
        samples = {pr: {t: [] for t in tests} for pr in progs}
        for rep in range(a.r):
            k = rep % len(progs)
            for pr in progs[k:] + progs[:k]:
                if pr == "llama.cpp":
                    out = run_json([a.llama_python, os.path.join(HERE, "llamacpp_bench.py"), model] + common)
                else:
                    env = dict(base_env)
                    if pr != "default":
                        env["LLMRT_ISA"] = pr
                    out = run_json([sys.executable, "-m", "llmrt", "bench", model, "-o", "json",
                                    "--no-bandwidth"] + common, env=env)
                for row in out or []:
                    want = top if pr in ("default", "llama.cpp") else pr
                    if pr != "llama.cpp" and row.get("isa") != want:
                        print(f"warning: {os.path.basename(model)} at {pr} ran at level {row.get('isa')}",
                              file=sys.stderr)
                    if row["test"] in samples[pr]:
                        samples[pr][row["test"]] += row.get("samples") or [row["t_s"]]
        print(f"  done: {os.path.basename(model)}", file=sys.stderr, flush=True)
        results.append((model, samples))

    def med(s):
        return statistics.median(s) if s else float("nan")

    def cell(s):
        return f"{med(s):.1f} ({max(s):.1f})" if s else "error"

    bw_end = read_bandwidth(a.threads)
    print(f"memory read bandwidth measured again after the runs: {bw_end / 1e9:.1f} GB/s; the bound uses "
          f"the higher of the two, {max(bw, bw_end) / 1e9:.1f} GB/s\n")
    bw = max(bw, bw_end)
    pp, tg = tests[0] if a.p > 0 else None, tests[-1] if a.n > 0 else None
    print("| model | GB | type | level | llmrt pp t/s | llmrt tg t/s | llama.cpp pp t/s | llama.cpp tg t/s "
          "| pp ratio | tg ratio | tg / bound: llmrt, llama.cpp | misses |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    fails, dump = [], []
    for model, s in results:
        gb = os.path.getsize(model) / 1e9
        bpt = bytes_per_token(model)
        bound = bw / bpt
        lc = s["llama.cpp"]
        for lv in levels:
            o = s[lv]
            label = f"default ({top})" if lv == "default" else lv
            rp = med(o[pp]) / med(lc[pp]) if pp else float("nan")
            rt = med(o[tg]) / med(lc[tg]) if tg else float("nan")
            fo = med(o[tg]) / bound if tg and not a.d else float("nan")   # (at a depth the cache's
            fl = med(lc[tg]) / bound if tg and not a.d else float("nan")  # reads add: no bound)
            miss = []
            if pp and not rp >= TARGET_PP:
                miss.append(f"pp<{TARGET_PP:g}x")
            if tg and not rt >= TARGET_TG:
                miss.append(f"tg<{TARGET_TG:g}x")
            if tg and gb >= 1.0 and not a.d and not fo >= TARGET_BOUND:
                miss.append(f"bound<{TARGET_BOUND:.0%}")
            print(f"| {os.path.basename(model)} | {gb:.2f} | {type_name(model)} | {label} | "
                  f"{cell(o[pp]) if pp else '-'} | {cell(o[tg]) if tg else '-'} | "
                  f"{cell(lc[pp]) if pp else '-'} | {cell(lc[tg]) if tg else '-'} | "
                  f"{rp:.2f}x | {rt:.2f}x | {fo:.0%}, {fl:.0%} | {' '.join(miss) or 'ok'} |")
            dump.append({"model": os.path.basename(model), "gb": gb, "type": type_name(model), "level": label,
                         "llmrt": o, "llama.cpp": lc, "pp_ratio": rp, "tg_ratio": rt,
                         "bytes_per_token": bpt, "bound_t_s": bound, "tg_bound_fraction": fo, "misses": miss})
        if "default" in levels and "avx2" in levels and top != "avx2":
            for t in (pp, tg):
                if t is None:
                    continue
                d, v = med(s["default"][t]), med(s["avx2"][t])
                if not d >= v * (1 - a.margin):
                    fails.append(f"{os.path.basename(model)} {t}: default ({top}) {d:.1f} t/s < avx2 {v:.1f} t/s "
                                 f"({d / v - 1:+.1%}, margin {a.margin:.0%})")
    print(f"\nbytes per token = the file's tensors but the embedding table (MoE experts: the used fraction); bound = {bw / 1e9:.1f} GB/s / those "
          f"bytes. Targets: pp >= {TARGET_PP:g}x, tg >= {TARGET_TG:g}x llama.cpp, tg >= {TARGET_BOUND:.0%} "
          f"of the bound for files >= 1 GB.")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": date, "cpu": cpu_name(), "threads": a.threads, "bandwidth_gb_s": bw / 1e9,
                       "levels": levels, "top": top, "rows": dump, "fails": fails}, f, indent=1)
    if fails:
        print("\n" + "\n".join(f"FAIL: the default level is slower than avx2: {x}" for x in fails))
        print(f"FAIL: {len(fails)} check(s) failed")
        sys.exit(1)
    if "default" in levels and "avx2" in levels and top != "avx2":
        print(f"\ncheck passed: the default level ({top}) is nowhere slower than avx2 by more than {a.margin:.0%}")


if __name__ == "__main__":
    main()
