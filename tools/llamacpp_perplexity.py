#!/usr/bin/env python3
"""llama-perplexity's protocol run by llama.cpp itself (llama-cpp-python), for tests/data/ppl_ref.json.

llama-cpp-python ships no perplexity binary, so this re-implements tools/perplexity's
`perplexity()` (default settings, no --ppl-stride) on the llama_cpp API: the file read as
`-f` reads it (one trailing newline dropped), tokenized once with add_special=True /
parse_special=False (BOS when the vocab adds BOS), n_chunk = n_tokens // n_ctx chunks (or
fewer with --max-tokens), each chunk from a cleared KV cache with its first token replaced by
BOS when the vocab adds BOS, logits at first = n_ctx/2 .. n_ctx-2 scoring the next token,
NLL = max + log(sum exp(l - max)) - l[tok] with the sum in double. The +/- is llama.cpp's.

Not a pytest test and not an llmrt dependency. Run it with the reference venv:

    /work/ref/venv/bin/python tools/llamacpp_perplexity.py MODEL -f tests/data/ppl_text.txt -c 128 \
        [--max-tokens N] [--json]
    /work/ref/venv/bin/python tools/llamacpp_perplexity.py --write-ref [--max-tokens 2048]
        (both real models at ctx 128 -> tests/data/ppl_ref.json)
"""
import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

import llama_cpp
from llama_cpp import Llama

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL_DIR = Path(os.environ.get("LLMRT_MODEL_DIR", "/work/models"))
REF_MODELS = {   # name in ppl_ref.json -> file in MODEL_DIR
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}
N_THREADS = 2
FLASH_ATTN = False   # the classic softmax(QK^T)V path, f16 KV cache (llama.cpp's default types)


def read_text(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return text[:-1] if text.endswith("\n") else text


def token_nll(logits, targets):
    mx = logits.max(axis=1)
    s = np.exp(logits - mx[:, None]).sum(axis=1, dtype=np.float64)
    lt = logits[np.arange(len(targets)), targets]
    return -((lt - mx).astype(np.float64) - np.log(s))


def run(model_path, text_path, n_ctx, max_tokens=None, log=sys.stderr):
    llm = Llama(model_path=str(model_path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                n_threads=N_THREADS, n_threads_batch=N_THREADS, logits_all=True,
                flash_attn=FLASH_ATTN, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    assert not llama_cpp.llama_vocab_get_add_eos(vocab)
    bos = llama_cpp.llama_vocab_bos(vocab)
    text = read_text(text_path)
    toks = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)   # add_special=True
    n_all = len(toks)
    if max_tokens:
        toks = toks[:max_tokens]
    if len(toks) < 2 * n_ctx:
        raise SystemExit(f"need at least {2 * n_ctx} tokens, have {len(toks)}")
    toks = np.array(toks, dtype=np.int64)
    n_chunk = len(toks) // n_ctx
    first = n_ctx // 2
    nll, running = [], []
    t0 = time.perf_counter()
    for i in range(n_chunk):
        start = i * n_ctx
        ids = toks[start:start + n_ctx].copy()
        if add_bos:
            ids[0] = bos
        llm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
        llm.eval(ids.tolist())
        logits = np.array(llm.scores[:n_ctx], dtype=np.float32)
        nll.append(token_nll(logits[first:n_ctx - 1], toks[start + first + 1:start + n_ctx]))
        allv = np.concatenate(nll)
        running.append(math.exp(allv.mean()))
        print(f"[{i + 1}]{running[-1]:.4f}", end="," if i + 1 < n_chunk else "\n", file=log, flush=True)
    v = np.concatenate(nll)
    mean = float(v.mean())
    ppl = math.exp(mean)
    var = float((v * v).mean()) - mean * mean
    err = ppl * math.sqrt(var / (len(v) - 1))
    return {"ppl": ppl, "ppl_err": err, "nll_mean": mean, "n_tokens": int(len(v)), "n_chunks": n_chunk,
            "ctx_size": n_ctx, "add_bos": add_bos, "n_text_tokens": n_all,
            "max_tokens": max_tokens, "running": [round(x, 6) for x in running],
            "seconds": round(time.perf_counter() - t0, 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("-f", "--file", default=str(ROOT / "tests" / "data" / "ppl_text.txt"))
    ap.add_argument("-c", "--ctx-size", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write-ref", action="store_true",
                    help="run both real models and write tests/data/ppl_ref.json")
    a = ap.parse_args()
    if a.write_ref:
        out = {"about": "llama-perplexity's protocol run by llama.cpp (llama-cpp-python "
                        f"{llama_cpp.__version__}) via tools/llamacpp_perplexity.py; "
                        f"n_threads {N_THREADS}, flash_attn {FLASH_ATTN}, f16 KV cache",
               "file": "tests/data/ppl_text.txt", "machine": platform.processor() or platform.machine(),
               "models": {}}
        for name, fn in REF_MODELS.items():
            r = run(MODEL_DIR / fn, ROOT / "tests" / "data" / "ppl_text.txt", a.ctx_size, a.max_tokens)
            r["model_file"] = fn
            out["models"][name] = r
            print(f"{name}: ppl {r['ppl']:.4f} +/- {r['ppl_err']:.4f} over {r['n_tokens']} tokens",
                  file=sys.stderr)
        path = ROOT / "tests" / "data" / "ppl_ref.json"
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)
        return
    if not a.model:
        ap.error("MODEL is required (or --write-ref)")
    r = run(a.model, a.file, a.ctx_size, a.max_tokens)
    print(f"Final estimate: PPL = {r['ppl']:.4f} +/- {r['ppl_err']:.5f}")
    if a.json:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
