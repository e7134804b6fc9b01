#!/usr/bin/env python3
"""Manual cross-check: tiny HF models -> GGUF (tests/hf_gguf.py) -> llama.cpp, vs transformers.

Proves that tests/hf_gguf.py writes files with llama.cpp's conventions (names, permutes, norm
offsets, hyperparameter keys, RoPE scaling, sliding windows): llama.cpp must reproduce the
transformers logits. Not a pytest test: llama-cpp-python is not a dependency of llmrt.

Two steps, in two interpreters:
  1. python tools/check_tiny_llamacpp.py write [--out /tmp/tiny]
     (system python: torch + transformers + gguf) writes <case>-<dtype>.gguf and <case>-<dtype>.npz
     with the token ids, transformers' logits at every position (`hf`) and `like` (below).
  2. /work/ref/venv/bin/python tools/check_tiny_llamacpp.py compare [--out /tmp/tiny]
     (a python with llama-cpp-python, numpy only) evaluates each GGUF with logits_all=True,
     n_threads=2 and prints max |llama.cpp - transformers| per case and dtype.
  python tools/check_tiny_llamacpp.py            runs both (step 2 through LLAMACPP_PYTHON,
                                                  default /work/ref/venv/bin/python).

Columns: rel(hf) = max |llama.cpp - transformers| / max |transformers logit|; rel(like) = the
same against `like`, transformers with llama.cpp's CPU roundings emulated (weights through the
file type, matmul inputs rounded to f16 / quantized to q8_0, Gemma's f16 GELU table); exact =
positions where rel(like) < 1e-5, i.e. llama.cpp's arithmetic reproduced to float noise.
llama.cpp runs with an f32 K/V cache. Measured (llama-cpp-python 0.3.36): every f32 case of
the SiLU families within 1.1e-6 of transformers; see TOL below for the rest.

MoE cases (mixtral, qwen2moe, qwen3moe, olmoe; `--cases moe` runs only those) get a second
table, also on hf_gguf.decisive_ids, against transformers in float64 on the file's weights at
the positions hf_gguf.gap_mask keeps. Measured: f32 within 9.4e-7 (all positions, random ids
too); f16 3.5e-4 .. 9.8e-4; q8_0 1.3e-2 .. 3.9e-2, with llama.cpp = llamacpp_like_model to
~3e-7 (routing, top-k weights and the experts' q8_0 activations included). On random ids, q8_0
rounding swaps experts near routing ties (qwen3moe: 1.3e-1 over all positions).
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = "/tmp/tiny"
LLAMACPP_PYTHON = os.environ.get("LLAMACPP_PYTHON", "/work/ref/venv/bin/python")

# case name -> (family, config overrides)
CASES = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "mistral": ("mistral", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "gemma3": ("gemma3", {}),
    # softcap 1.5 on logits of std ~1: tanh is far from linear, so a reader ignoring the key fails
    "gemma3-softcap": ("gemma3", {"final_logit_softcapping": 1.5}),
    "llama-rope-linear": ("llama-rope-linear", {}),
    "llama-rope-yarn": ("llama-rope-yarn", {}),
    "llama-rope-llama3": ("llama-rope-llama3", {}),
    # Mixture of Experts (hf_gguf.MOE_FAMILIES)
    "mixtral": ("mixtral", {}),
    "qwen2moe": ("qwen2moe", {}),
    "qwen3moe": ("qwen3moe", {}),
    "olmoe": ("olmoe", {}),
}
MOE_CASES = ("mixtral", "qwen2moe", "qwen3moe", "olmoe")
DTYPES = ["f32", "f16", "q8_0"]
# 24 tokens: longer than gemma3's sliding window of 8; positions up to 23
IDS = [17, 200, 5, 99, 42, 150, 7, 7, 250, 31, 64, 128, 3, 77, 190, 11, 240, 56, 88, 120, 9, 160, 33, 222]

# Pass marks on max |llama.cpp - like| / max |hf| ("like" = transformers with llama.cpp's
# roundings emulated, see hf_gguf.llamacpp_like_model). Where nothing rounds differently the two
# agree to ~3e-7; what is left comes from f32 summation-order noise (~1e-7) flipping a rounding
# near a tie: a Gemma GELU-table input (f32: up to 2e-4 measured), an f16 activation (f16: up to
# 2.2e-3) or a q8_0 activation step (q8_0: up to 1.5e-2, one or two positions).
TOL = {"f32": 3e-4, "f16": 5e-3, "q8_0": 3e-2}
# MoE cases: besides IDS (random tokens: some positions sit near a routing tie, where rounding
# may swap an expert), the same checks on hf_gguf.decisive_ids (router-logit gap >= 0.5 at
# every layer and position), against transformers in float64 on the file's weights (`ref64`),
# at the positions gap_mask keeps with hf_gguf.ROUTER_LOGIT_GAP_MIN (the thresholds
# tests/test_moe_hf.py uses, saved in the .npz as gap_min).
EXACT = 1e-5   # a position whose error is below this reproduced llama.cpp's arithmetic exactly
SWA_CASES = ("gemma3", "gemma3-softcap")


def step_write(out: Path) -> None:
    sys.path.insert(0, str(HERE.parent / "tests"))
    import hf_gguf

    out.mkdir(parents=True, exist_ok=True)
    for case, (family, ov) in CASES.items():
        model, config = hf_gguf.tiny_model(family, seed=0, **ov)
        hf = hf_gguf.hf_logits(model, IDS)
        extra = {}
        if case in SWA_CASES:
            # negative control: the same weights without a window (shows the window matters here)
            nowin, _ = hf_gguf.tiny_model(family, seed=0, **{**ov, "sliding_window": 4096})
            extra["nowin"] = hf_gguf.hf_logits(nowin, IDS)
        if case in MOE_CASES:
            extra["dids"] = np.array(hf_gguf.decisive_ids(model, len(IDS), seed=1), dtype=np.int32)
        for dt in DTYPES:
            path = out / f"{case}-{dt}.gguf"
            hf_gguf.write_gguf(model, config, path, dtype=dt, family=family)
            like_model = hf_gguf.llamacpp_like_model(model, config, dt)
            like = hf_gguf.hf_logits(like_model, IDS)
            moe = {}
            if case in MOE_CASES:
                ref = model if dt == "f32" else hf_gguf.roundtrip_model(model, config, dt)
                for tag, ids in (("r", IDS), ("d", extra["dids"].tolist())):
                    moe[f"ref64_{tag}"] = hf_gguf.hf_logits(ref, ids, float64=True)
                    moe[f"gap_{tag}"] = hf_gguf.router_gaps(ref, ids, kind="logit")
                    moe[f"like_{tag}"] = hf_gguf.hf_logits(like_model, ids)
                moe["gap_min"] = np.float64(hf_gguf.ROUTER_LOGIT_GAP_MIN[dt])
            np.savez(out / f"{case}-{dt}.npz", ids=np.array(IDS, dtype=np.int32), hf=hf, like=like,
                     window=np.int32(getattr(config, "sliding_window", None) or 0), **extra, **moe)
        print(f"wrote {case}: {', '.join(DTYPES)}")


def gap_mask(gaps, min_gap):
    """hf_gguf.gap_mask (numpy only: this runs in the llama-cpp-python interpreter)."""
    g = np.asarray(gaps)
    keep = g.min(axis=0) >= min_gap
    if g.shape[0] > 1:
        bad_early = (g[:-1] < min_gap).any(axis=0)
        if bad_early.any():
            keep[int(np.argmax(bad_early)) + 1:] = False
    return keep


def llamacpp_logits(path, ids):
    from llama_cpp import Llama

    # f32 K/V cache (GGML type 0): the default f16 cache alone costs ~5e-4 relative
    llm = Llama(model_path=str(path), n_ctx=64, n_batch=64, n_threads=2,
                logits_all=True, type_k=0, type_v=0, verbose=False)
    llm.eval(ids)
    got = np.array(llm.scores[: len(ids)], dtype=np.float32)
    del llm
    return got


def step_compare(out: Path) -> int:
    print(f"{'case':<18} {'dtype':<5} {'max|hf|':>7} {'rel(hf)':>9} {'rel(like)':>9} {'exact':>6} "
          f"{'argmax':>6}  verdict")
    n_bad = 0
    notes = []
    for case in CASES:
        for dt in DTYPES:
            d = np.load(out / f"{case}-{dt}.npz")
            ids = [int(i) for i in d["ids"]]
            got = llamacpp_logits(out / f"{case}-{dt}.gguf", ids)
            hf, like = d["hf"], d["like"]
            scale = float(np.abs(hf).max())
            rel_hf = float(np.abs(got - hf).max()) / scale
            err_pos = np.abs(got - like).max(axis=1) / scale
            rel_like = float(err_pos.max())
            n_exact = int((err_pos < EXACT).sum())
            agree = int((got.argmax(1) == like.argmax(1)).sum())
            ok = rel_like <= TOL[dt]
            n_bad += not ok
            print(f"{case:<18} {dt:<5} {scale:7.3f} {rel_hf:9.2e} {rel_like:9.2e} {n_exact:>3}/{len(ids):<2} "
                  f"{agree:>3}/{len(ids):<2}  {'ok' if ok else 'FAIL'}")
            if "nowin" in d.files and dt == "f32":
                w = int(d["window"])
                eff = np.abs(d["nowin"] - hf).max(axis=1) / scale
                dist = np.abs(got - d["nowin"]).max(axis=1) / scale
                notes.append(f"{case}: window {w}; without it transformers' logits move by "
                             f"{eff[:w].max():.1e} at positions < {w} and {eff[w:].max():.1e} at >= {w}; "
                             f"llama.cpp is {dist[w:].min():.1e}..{dist[w:].max():.1e} away from the "
                             f"windowless logits there")
    if any(c in CASES for c in MOE_CASES):
        print("\nMoE: rel = max |llama.cpp - X| / max |X| over the kept positions; X = ref64 (transformers "
              "float64 on the file's weights) or like; kept = hf_gguf.gap_mask(router-logit gaps, "
              "ROUTER_LOGIT_GAP_MIN[dtype]); all pos = rel(ref64) over every position")
        print(f"{'case':<10} {'dtype':<5} {'ids':<8} {'kept':>6} {'rel(ref64)':>10} {'rel(like)':>10} "
              f"{'all pos':>9} {'min gap':>8}")
        for case in MOE_CASES:
            if case not in CASES:
                continue
            for dt in DTYPES:
                d = np.load(out / f"{case}-{dt}.npz")
                for tag, ids in (("random", d["ids"]), ("decisive", d["dids"])):
                    t = tag[0]
                    got = llamacpp_logits(out / f"{case}-{dt}.gguf", [int(i) for i in ids])
                    ref, like, gap = d[f"ref64_{t}"], d[f"like_{t}"], d[f"gap_{t}"]
                    keep = gap_mask(gap, float(d["gap_min"]))
                    scale = float(np.abs(ref[keep]).max()) if keep.any() else 1.0
                    rel = float(np.abs(got - ref)[keep].max()) / scale if keep.any() else float("nan")
                    rel_like = float(np.abs(got - like)[keep].max()) / scale if keep.any() else float("nan")
                    rel_all = float(np.abs(got - ref).max()) / float(np.abs(ref).max())
                    # random ids: a swap near a routing tie early on may leave nothing to compare
                    ok = (rel_like <= TOL[dt] and keep.mean() >= 0.75) if tag == "decisive" \
                        else (not keep.any() or rel_like <= TOL[dt])
                    n_bad += not ok
                    print(f"{case:<10} {dt:<5} {tag:<8} {int(keep.sum()):>3}/{len(ids):<2} {rel:10.2e} "
                          f"{rel_like:10.2e} {rel_all:9.2e} {gap.min():8.4f}  {'ok' if ok else 'FAIL'}")
    for n in notes:
        print(n)
    print("all agree" if n_bad == 0 else f"{n_bad} case(s) FAIL")
    return 1 if n_bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", nargs="?", choices=["write", "compare", "all"], default="all")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--cases", default="all",
                    help="comma-separated case names, 'moe' (the MoE cases) or 'all' (default)")
    a = ap.parse_args()
    out = Path(a.out)
    if a.cases != "all":
        names = list(MOE_CASES) if a.cases == "moe" else a.cases.split(",")
        unknown = [n for n in names if n not in CASES]
        if unknown:
            ap.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
        for n in list(CASES):
            if n not in names:
                del CASES[n]
    if a.step == "write":
        step_write(out)
        return 0
    if a.step == "compare":
        return step_compare(out)
    step_write(out)
    return subprocess.call([LLAMACPP_PYTHON, __file__, "compare", "--out", str(out), "--cases", a.cases])


if __name__ == "__main__":
    sys.exit(main())
