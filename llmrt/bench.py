"""`llmrt bench`: llama-bench's two tests, timed the same way, plus the memory-bandwidth bound.

    pp<P>   P random token ids evaluated in one batch from an empty cache; only the last
            position's logits are computed (as llama-bench's prompt test)
    tg<N>   N tokens decoded one at a time from an empty cache (a fixed random token each step:
            no sampling, no tokenization, as llama-bench's generation test)

With a depth D > 0 (`-d`, llama-bench's --n-depth) each test starts from a cache that already
holds D random tokens, prefilled untimed before every run: "pp512 @ d1024", "tg128 @ d1024"
(llama-bench's names), what a prompt or a reply costs deep into a conversation, where attention
reads D cached keys and values per token and layer.

Each test runs once to warm up (graphs built, pages touched), then `reps` timed times; t/s is the
mean +- the sample standard deviation over the repetitions.

The bandwidth bound of decoding: every generated token reads every matmul weight once (the
output matrix included, the embedding table only for one row; of a MoE model's experts only the
expert_used_count it chose), so tokens/s can not exceed
bandwidth / weight_bytes_per_token. `bandwidth_bound()` measures the read bandwidth with the
same thread count (csrc/membw.c) and reports that bound; tg / bound is the fraction of it reached.
At a depth the cache's reads come on top (how many depends on each layer's window), so the bound
is given for depth 0 only.

With profile=True (`llmrt bench --profile`) the timed runs also time every graph node on thread 0
(csrc/graph.c: wall time in the node, the barrier before it included) and each result carries
the sums per op and weight type, per run: where a pp or a tg run spends its time.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import List, Optional

import numpy as np


@dataclass
class BenchResult:
    test: str                  # "pp512", "tg128"
    t_s: float                 # tokens per second, mean over the repetitions
    t_s_sd: float              # sample standard deviation
    n_threads: int
    isa: str
    model: str = ""
    n_prompt: int = 0
    n_gen: int = 0
    n_depth: int = 0           # tokens in the cache before each timed run
    reps: int = 0
    samples: List[float] = field(default_factory=list)
    profile: List[dict] = field(default_factory=list)   # with profile=True: see profile_rows()

    def to_dict(self) -> dict:
        return asdict(self)


def weight_bytes_per_token(model) -> int:
    """Bytes of weights one decoded token reads: every tensor that feeds a matmul (2-D and not
    the embedding table), plus the output matrix (the embedding table when the output is tied);
    norms and biases (1-D) are counted too, they are read as well. Experts (a MoE model's
    `*_exps` tensors, or an old file's per-expert ones) count for expert_used_count /
    expert_count of their bytes: a token reads only the experts it chose."""
    from llmrt.gguf import is_expert_tensor, merged_expert_name

    tensors = model.gguf.tensors
    replaced = getattr(model, "_replaced", None) or {}     # weights quantized at load
    hp = model.hparams
    frac = hp.n_expert_used / hp.n_expert if getattr(hp, "n_expert", 0) else 1.0

    def nbytes(name):
        r = replaced.get(name)
        b = int(r[0].nbytes) if r is not None else int(tensors[name].nbytes)
        return b * frac if is_expert_tensor(name) else b

    # the graph's weights: the file's tensors, an old file's per-expert ones as merged at load
    def merged_at_load(n):       # blk.N.ffn_gate.E.weight -> blk.N.ffn_gate_exps.weight
        return merged_expert_name(n) in replaced

    names = [n for n in tensors if not merged_at_load(n)]
    names += [n for n in replaced if n not in tensors]
    total = sum(nbytes(name) for name in names if name != "token_embd.weight")
    if "output.weight" not in tensors and "token_embd.weight" in tensors:
        total += nbytes("token_embd.weight")
    return int(total)


def _stats(samples: List[float]):
    mean = statistics.mean(samples)
    sd = statistics.stdev(samples) if len(samples) > 1 else 0.0
    return mean, sd


def profile_rows(graphs) -> List[dict]:
    """The profiles of `graphs` (llmrt._core.Graph, profiling on) summed per (op, weight type):
    [{"op", "type", "nodes", "ms_per_run", "wait_ms_per_run"}], largest first. mul_mat and
    mul_mat_id (MoE experts) rows name their weight type (e.g. "mul_mat Q5_0"); "barrier wait" is the part of ms spent waiting
    for the other threads before the node."""
    from llmrt import _core

    acc = {}
    for g in graphs:
        runs, rows = g.profile()
        if runs == 0:
            continue
        for _, op, wt, ns, wait in rows:
            tname = (_core.type_traits(wt) or ("?",))[0] if wt >= 0 else ""
            a = acc.setdefault((op, tname), [0, 0.0, 0.0])
            a[0] += 1
            a[1] += ns / runs / 1e6
            a[2] += wait / runs / 1e6
    out = [{"op": op, "type": t, "nodes": v[0], "ms_per_run": v[1], "wait_ms_per_run": v[2]}
           for (op, t), v in acc.items()]
    return sorted(out, key=lambda d: -d["ms_per_run"])


def format_profile(r: BenchResult) -> str:
    """A markdown table of r.profile (thread 0's time per run, by op)."""
    total = sum(d["ms_per_run"] for d in r.profile) or 1.0
    lines = [f"{r.test}: thread 0's time per run, by op (barrier waits included)", "",
             "| op | weight | nodes | ms / run | % | of which barrier wait ms |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for d in r.profile:
        lines.append(f"| {d['op']} | {d['type']} | {d['nodes']} | {d['ms_per_run']:.3f} | "
                     f"{100 * d['ms_per_run'] / total:.1f} | {d['wait_ms_per_run']:.3f} |")
    return "\n".join(lines)


def run(model, n_prompt: int = 512, n_gen: int = 128, reps: int = 5, seed: int = 0,
        progress=None, profile: bool = False, n_depth: int = 0) -> List[BenchResult]:
    """Run pp<n_prompt> (if > 0) and tg<n_gen> (if > 0) on `model` (an llmrt.Model), each from a
    cache holding n_depth random tokens (prefilled untimed before every run); profile: also time
    every graph node of the timed part (see the module doc)."""
    from llmrt import _core

    if reps < 1:
        raise ValueError(f"repetitions must be >= 1, got {reps}")
    if n_prompt < 0 or n_gen < 0 or n_prompt + n_gen == 0:
        raise ValueError(f"need a prompt or generation length > 0, got -p {n_prompt} -n {n_gen}")
    if n_depth < 0:
        raise ValueError(f"depth must be >= 0, got -d {n_depth}")
    rng = np.random.default_rng(seed)
    n_ctx = n_depth + max(n_prompt, n_gen, 1)
    sess = model.new_session(ctx_size=n_ctx, kv_mode="none")
    isa = _core.isa_current()
    name = getattr(model, "path", "")
    out: List[BenchResult] = []

    def graphs():
        return list(model._graphs.values())

    def start(timed: bool):
        """the cache holding n_depth random tokens, then (timed and profile) profiling on"""
        sess.reset()
        if n_depth:
            sess.eval(rng.integers(0, model.n_vocab, n_depth))
        if timed and profile:
            for g in graphs():
                g.set_profile(True)

    prof: dict = {}                             # (op, type) -> the timed runs' rows

    def stop(timed: bool):
        if timed and profile:
            for d in profile_rows(graphs()):
                prof.setdefault((d["op"], d["type"]), []).append(d)
            for g in graphs():
                g.set_profile(False)

    def mean_rows(k: int) -> List[dict]:
        """the profile rows averaged over the k timed runs (a row absent from a run counts 0)"""
        rows = [{"op": op, "type": t, "nodes": max(d["nodes"] for d in ds),
                 "ms_per_run": sum(d["ms_per_run"] for d in ds) / k,
                 "wait_ms_per_run": sum(d["wait_ms_per_run"] for d in ds) / k}
                for (op, t), ds in prof.items()]
        prof.clear()
        return sorted(rows, key=lambda d: -d["ms_per_run"])

    def pp(timed: bool) -> float:
        ids = rng.integers(0, model.n_vocab, n_prompt)
        start(timed)
        t0 = time.perf_counter()
        sess.eval(ids)
        dt = time.perf_counter() - t0
        stop(timed)
        return n_prompt / dt

    def tg(timed: bool) -> float:
        tok = [int(rng.integers(0, model.n_vocab))]
        start(timed)
        t0 = time.perf_counter()
        for _ in range(n_gen):
            sess.eval(tok)
        dt = time.perf_counter() - t0
        stop(timed)
        return n_gen / dt

    at = f" @ d{n_depth}" if n_depth else ""
    for test, fn, n in (("pp", pp, n_prompt), ("tg", tg, n_gen)):
        if n <= 0:
            continue
        fn(False)                               # warm-up
        samples = []
        for _ in range(reps):
            samples.append(fn(True))
            if progress is not None:
                progress(1)
        mean, sd = _stats(samples)
        out.append(BenchResult(f"{test}{n}{at}", mean, sd, model.n_threads, isa, name,
                               n_prompt if test == "pp" else 0, n_gen if test == "tg" else 0,
                               n_depth, reps, samples, mean_rows(reps) if profile else []))
    return out


def bandwidth_bound(model, n_threads: Optional[int] = None, nbytes: int = 512 << 20) -> dict:
    """Measured read bandwidth (bytes/s, n_threads threads) and the decode bound it implies."""
    from llmrt import _core

    n = n_threads or model.n_threads
    bw = _core.read_bandwidth(nbytes, n, 3)
    wb = weight_bytes_per_token(model)
    return {"read_bandwidth_gb_s": bw / 1e9, "weight_bytes_per_token": wb,
            "tg_bound_t_s": bw / wb, "n_threads": n}


def format_markdown(results: List[BenchResult], size_bytes: int, model_name: str) -> str:
    """llama-bench's table: model | size | threads | isa | test | t/s."""
    lines = ["| model | size | threads | isa | test | t/s |",
             "| --- | ---: | ---: | --- | ---: | ---: |"]
    for r in results:
        lines.append(f"| {model_name} | {size_bytes / 2**20:.2f} MiB | {r.n_threads} | {r.isa} | "
                     f"{r.test} | {r.t_s:.2f} ± {r.t_s_sd:.2f} |")
    return "\n".join(lines)
