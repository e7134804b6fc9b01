#!/usr/bin/env python3
"""llama.cpp's own q4_0 of an F16 SmolLM2, for tests/data/quantize_ref.json.

Run with the system python (llmrt and gguf importable); it calls the reference venv
(/work/ref/venv/bin/python: llama-cpp-python) for llama.cpp's side:

    PYTHONPATH=. python tools/llamacpp_quantize_ref.py [--max-tokens 512]

1. dequantizes /work/models/SmolLM2-135M-Instruct.Q4_1.gguf to F16 (llmrt.quantize.float_file,
   as tools/make_f16.py);
2. llama.cpp quantizes that F16 file to q4_0 (llama_cpp.llama_model_quantize, ftype
   MOSTLY_Q4_0, default params: no imatrix) and `llmrt quantize` does the same;
3. records the type and sha256 of every tensor of llama.cpp's file (gguf.GGUFReader) and the
   perplexity llama.cpp measures (tools/llamacpp_perplexity.py, ctx 128) on BOTH files.
tests/test_quantize_cli.py checks that llmrt's q4_0 of the same F16 has exactly these tensors.
Not a pytest test and not an llmrt dependency.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REF_PY = os.environ.get("LLMRT_REF_PYTHON", "/work/ref/venv/bin/python")
SRC = Path(os.environ.get("LLMRT_MODEL_DIR", "/work/models")) / "SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_FTYPE_MOSTLY_Q4_0 = 2

_QUANTIZE = """
import ctypes, sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = int(sys.argv[3]); p.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))
"""


def tensor_hashes(path):
    import gguf
    r = gguf.GGUFReader(path)
    return {t.name: [t.tensor_type.name, hashlib.sha256(t.data.tobytes()).hexdigest()] for t in r.tensors}


def llamacpp_ppl(model, max_tokens):
    out = subprocess.run([REF_PY, str(ROOT / "tools" / "llamacpp_perplexity.py"), str(model), "-c", "128",
                          "--max-tokens", str(max_tokens), "--json"], check=True, capture_output=True, text=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"ppl": r["ppl"], "ppl_err": r["ppl_err"], "n_tokens": r["n_tokens"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=512)
    a = ap.parse_args()
    from llmrt.quantize import float_file, quantize_file
    with tempfile.TemporaryDirectory() as d:
        f16, ours, theirs = Path(d) / "f16.gguf", Path(d) / "llmrt-q4_0.gguf", Path(d) / "llamacpp-q4_0.gguf"
        float_file(SRC, f16, "F16", progress=False)
        subprocess.run([REF_PY, "-c", _QUANTIZE, str(f16), str(theirs), str(LLAMA_FTYPE_MOSTLY_Q4_0)],
                       check=True, capture_output=True)
        quantize_file(f16, ours, "q4_0", n_threads=2, progress=False)
        ref = tensor_hashes(theirs)
        mine = tensor_hashes(ours)
        same = sum(1 for n in ref if mine.get(n) == ref[n])
        out = {
            "about": "llama.cpp's q4_0 (llama-cpp-python llama_model_quantize, ftype MOSTLY_Q4_0, "
                     "default params) of SmolLM2-135M-Instruct dequantized to F16 by "
                     "llmrt.quantize.float_file; made by tools/llamacpp_quantize_ref.py",
            "source": SRC.name,
            "ppl_ctx": 128, "ppl_max_tokens": a.max_tokens, "ppl_text": "tests/data/ppl_text.txt",
            "llamacpp_ppl_of_llamacpp_q4_0": llamacpp_ppl(theirs, a.max_tokens),
            "llamacpp_ppl_of_llmrt_q4_0": llamacpp_ppl(ours, a.max_tokens),
            "llmrt_tensors_identical": f"{same}/{len(ref)}",
            "tensors": ref,
        }
    path = ROOT / "tests" / "data" / "quantize_ref.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}: {same}/{len(ref)} tensors identical; llama.cpp ppl own q4_0 "
          f"{out['llamacpp_ppl_of_llamacpp_q4_0']['ppl']:.4f}, llmrt q4_0 "
          f"{out['llamacpp_ppl_of_llmrt_q4_0']['ppl']:.4f}", file=sys.stderr)


if __name__ == "__main__":
    main()
