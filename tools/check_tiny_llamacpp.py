#!/usr/bin/env python3
"""Manual cross-check: tiny HF models -> GGUF (tests/hf_gguf.py) -> llama.cpp, vs transformers.

Proves that tests/hf_gguf.py writes files with llama.cpp's conventions (names, permutes, norm
offsets, hyperparameter keys, RoPE scaling, sliding windows): llama.cpp must reproduce the
transformers logits. Not a pytest test: llama-cpp-python is not a dependency of llmrt.

Two steps, in two interpreters:
  1. python tools/check_tiny_llamacpp.py write [--out /tmp/tiny]
     (system python: torch + transformers + gguf) writes <case>-<dtype>.gguf and <case>-<dtype>.npz
     with the token ids, transformers' logits at every position (`hf`), and the logits of the
     same model with its weights rounded through the file's type (`rt`, see roundtrip_model).
  2. /work/ref/venv/bin/python tools/check_tiny_llamacpp.py compare [--out /tmp/tiny]
     (a python with llama-cpp-python, numpy only) evaluates each GGUF with logits_all=True,
     n_threads=2 and prints max |llama.cpp - transformers| per case and dtype.
  python tools/check_tiny_llamacpp.py            runs both (step 2 through LLAMACPP_PYTHON,
                                                  default /work/ref/venv/bin/python).

Relative error = max abs difference / max |logit|. Expected: f32 ~1e-6..1e-4 (float summation
order); f16 / q8_0 files are compared to `rt` too: llama.cpp rounds the activations to f16 /
q8_0 for those matmuls, which costs ~1e-3 / ~1e-2 relative.
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
}
DTYPES = ["f32", "f16", "q8_0"]
# 24 tokens: longer than gemma3's sliding window of 8; positions up to 23
IDS = [17, 200, 5, 99, 42, 150, 7, 7, 250, 31, 64, 128, 3, 77, 190, 11, 240, 56, 88, 120, 9, 160, 33, 222]

# Pass marks on the relative error (see the module docstring for where the sizes come from).
TOL = {"f32": 1e-4, "f16": 5e-3, "q8_0": 3e-2}


def step_write(out: Path) -> None:
    sys.path.insert(0, str(HERE.parent / "tests"))
    import hf_gguf

    out.mkdir(parents=True, exist_ok=True)
    for case, (family, ov) in CASES.items():
        model, config = hf_gguf.tiny_model(family, seed=0, **ov)
        hf = hf_gguf.hf_logits(model, IDS)
        for dt in DTYPES:
            path = out / f"{case}-{dt}.gguf"
            hf_gguf.write_gguf(model, config, path, dtype=dt, family=family)
            rt = hf if dt == "f32" else hf_gguf.hf_logits(hf_gguf.roundtrip_model(model, config, dt), IDS)
            like = hf_gguf.hf_logits(hf_gguf.llamacpp_like_model(model, config, dt), IDS)
            np.savez(out / f"{case}-{dt}.npz", ids=np.array(IDS, dtype=np.int32), hf=hf, rt=rt, like=like)
        print(f"wrote {case}: {', '.join(DTYPES)}")


def step_compare(out: Path) -> int:
    from llama_cpp import Llama

    print(f"{'case':<20} {'dtype':<5} {'max|hf|':>8} {'abs(hf)':>10} {'rel(hf)':>10} {'rel(rt)':>10} "
          f"{'argmax':>7}  verdict")
    n_bad = 0
    for case in CASES:
        for dt in DTYPES:
            d = np.load(out / f"{case}-{dt}.npz")
            ids = [int(i) for i in d["ids"]]
            # f32 K/V cache (GGML type 0): the default f16 cache alone costs ~5e-4 relative
            llm = Llama(model_path=str(out / f"{case}-{dt}.gguf"), n_ctx=64, n_batch=64, n_threads=2,
                        logits_all=True, type_k=0, type_v=0, verbose=False)
            llm.eval(ids)
            got = np.array(llm.scores[: len(ids)], dtype=np.float32)
            del llm
            hf, rt = d["hf"], d["rt"]
            scale = float(np.abs(hf).max())
            abs_hf = float(np.abs(got - hf).max())
            rel_hf = abs_hf / scale
            rel_rt = float(np.abs(got - rt).max()) / scale
            agree = int((got.argmax(1) == rt.argmax(1)).sum())
            ok = rel_rt <= TOL[dt]
            n_bad += not ok
            print(f"{case:<20} {dt:<5} {scale:8.3f} {abs_hf:10.2e} {rel_hf:10.2e} {rel_rt:10.2e} "
                  f"{agree:>3}/{len(ids):<3}  {'ok' if ok else 'FAIL'}")
    print("all agree" if n_bad == 0 else f"{n_bad} case(s) FAIL")
    return 1 if n_bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", nargs="?", choices=["write", "compare", "all"], default="all")
    ap.add_argument("--out", default=DEFAULT_OUT)
    a = ap.parse_args()
    out = Path(a.out)
    if a.step == "write":
        step_write(out)
        return 0
    if a.step == "compare":
        return step_compare(out)
    step_write(out)
    return subprocess.call([LLAMACPP_PYTHON, __file__, "compare", "--out", str(out)])


if __name__ == "__main__":
    sys.exit(main())
