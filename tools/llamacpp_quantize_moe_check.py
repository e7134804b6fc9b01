#!/usr/bin/env python3
"""`llmrt quantize` vs llama.cpp's llama_model_quantize on MoE files, tensor by tensor.

Run with the project's python (llmrt and gguf importable); llama.cpp's side runs in the reference
venv (/work/ref/venv/bin/python: llama-cpp-python, never an llmrt dependency):

    PYTHONPATH=. python tools/llamacpp_quantize_moe_check.py [--types q4_0,q4_k,...] [FILE.gguf ...]

Without FILE: the small synthetic MoE files of tests/test_quantize_moe.py (qwen3moe with 4
experts, a Mixtral-like llama with 8, a qwen2moe with a shared expert; 8 layers, F16) in every
TYPE. With FILE (an F16 / BF16 / F32 GGUF, e.g. ~/.cache/llmrt/synthetic/synthetic-moe-0.5b-f16.gguf):
that file in --types (default q4_0,q4_k); --ppl N adds llama.cpp's perplexity of both
quantized files (tools/llamacpp_perplexity.py, ctx 128, N tokens of tests/data/ppl_text.txt). For each (file, TYPE) it prints how many tensors have
the same type in llama.cpp's output as in llmrt.quantize.plan_types, and how many have identical
bytes in `llmrt quantize`'s file and llama.cpp's; every mismatch is listed. Exit 1 on a type
mismatch.
"""
import argparse
import os
import subprocess
import sys
import tempfile

from llamacpp_quantize_ref import _QUANTIZE, REF_PY, ROOT, llamacpp_ppl, tensor_hashes as tensors  # noqa: E402

FTYPE = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k": 12, "q4_k": 15,
         "q5_k": 17, "q6_k": 18}


def compare(src, qtype, workdir, bytes_too=True, ppl_tokens=0):
    from llmrt.gguf import GGUFFile
    from llmrt.quantize import plan_types, quantize_file
    theirs_path = os.path.join(workdir, f"llamacpp-{qtype}.gguf")
    p = subprocess.run([REF_PY, "-c", _QUANTIZE, src, theirs_path, str(FTYPE[qtype])],
                       capture_output=True, text=True)
    if p.returncode != 0:
        print(f"{os.path.basename(src)} {qtype}: llama.cpp failed:\n{p.stderr[-1500:]}")
        return False
    theirs = tensors(theirs_path)
    plan = plan_types(GGUFFile(src), qtype)
    bad_t = [(n, plan.get(n), theirs[n][0]) for n in theirs if plan.get(n) != theirs[n][0]]
    line = f"{os.path.basename(src)} {qtype}: types {len(theirs) - len(bad_t)}/{len(theirs)} equal"
    counts = {}
    for n, (tn, _) in theirs.items():
        counts[tn] = counts.get(tn, 0) + 1
    if bytes_too:
        ours_path = os.path.join(workdir, f"llmrt-{qtype}.gguf")
        quantize_file(src, ours_path, qtype, n_threads=2, progress=False)
        ours = tensors(ours_path)
        same = [n for n in theirs if ours.get(n) == theirs[n]]
        line += f", bytes {len(same)}/{len(theirs)} identical"
        diff_b = [n for n in theirs if ours.get(n) != theirs[n]]
        if ppl_tokens:
            a, b = llamacpp_ppl(ours_path, ppl_tokens), llamacpp_ppl(theirs_path, ppl_tokens)
            line += (f"; llama.cpp perplexity (ctx 128, {a['n_tokens']} tokens of tests/data/ppl_text.txt): "
                     f"llmrt's file {a['ppl']:.4f} +/- {a['ppl_err']:.4f}, llama.cpp's {b['ppl']:.4f} "
                     f"+/- {b['ppl_err']:.4f} ({a['ppl'] / b['ppl'] - 1:+.3%})")
        os.unlink(ours_path)
    print(line + " (llama.cpp: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) + ")", flush=True)
    for n, a, b in bad_t:
        print(f"    type differs: {n}: llmrt {a}, llama.cpp {b}")
    if bytes_too:
        for n in diff_b[:10]:
            print(f"    bytes differ: {n} ({theirs[n][0]})")
    os.unlink(theirs_path)
    return not bad_t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--types", default=None)
    ap.add_argument("--no-bytes", action="store_true", help="compare types only")
    ap.add_argument("--ppl", type=int, default=0, metavar="N",
                    help="also llama.cpp's perplexity of both files on N tokens (FILE mode)")
    a = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(dir=os.path.expanduser("~/.cache")) as d:
        if a.files:
            srcs, types = a.files, (a.types or "q4_0,q4_k").split(",")
        else:
            sys.path.insert(0, str(ROOT / "tests"))
            from test_quantize_moe import write_moe
            srcs = []
            for key, args in {"qwen3moe": ("qwen3moe", 4, 2), "mixtral": ("llama", 8, 2),
                              "qwen2moe": ("qwen2moe", 4, 2, True)}.items():
                p = os.path.join(d, f"{key}-f16.gguf")
                write_moe(p, *args)
                srcs.append(p)
            p = os.path.join(d, "mixtral-gqa4-f16.gguf")
            write_moe(p, "llama", 8, 2, n_head=8, n_head_kv=2)
            srcs.append(p)
            types = (a.types or ",".join(FTYPE)).split(",")
        for src in srcs:
            for q in types:
                ok &= compare(src, q, d, not a.no_bytes, a.ppl if a.files else 0)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
