#!/usr/bin/env python3
"""StreamingLLM's experiment: perplexity on a text much longer than the cache, per eviction mode.

    python benchmarks/streaming_ppl.py [--models smollm2,gemma3] [--ctx 128] [--tokens 2048]
        [--modes dense,window,recompute,shift] [--sinks 0,1,4,8] [--batch 1] [--n-discard -1]
        [--json OUT]

For each model: the first --tokens tokens of the long text (below); "dense" is llama-perplexity's
protocol on them (chunks of --ctx, no eviction: the usual number); "window" streams them through
a cache of --ctx cells with no sinks; "recompute" and "shift" stream them with 0/1/4/8 sinks
(--n-discard -1, the default: half of the unpinned cells per eviction). Streaming is token by token
(--batch 1, as in the paper) unless --batch says otherwise. Prints one table row per run.

The long text: "Botchan (Master Darling)" by Natsume Soseki, translated by Yasotaro Morri (1919),
public domain, Project Gutenberg eBook #8868, as shipped in the sdist of the `sentencepiece`
package on PyPI (test/botchan.txt). `long_text()` fetches it once with
`pip download --no-deps --no-binary :all: sentencepiece==0.2.1` into the llmrt cache
($LLMRT_CACHE or ~/.cache/llmrt/texts/botchan.txt), keeping the body between the Gutenberg
header and footer (~255 KB, ~60k tokens). --text FILE uses another text.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
TEXT_PKG = "sentencepiece==0.2.1"
TEXT_MEMBER = "sentencepiece-0.2.1/test/botchan.txt"


def cache_dir() -> Path:
    return Path(os.environ.get("LLMRT_CACHE", Path.home() / ".cache" / "llmrt"))


def model_file(name: str) -> str:
    d = Path(os.environ.get("LLMRT_MODEL_DIR", cache_dir()))
    p = d / MODELS.get(name, name)
    if p.is_file():
        return str(p)
    if Path(name).is_file():
        return name
    raise SystemExit(f"model {name}: {p} not found (set LLMRT_MODEL_DIR)")


def clean_gutenberg(raw: str) -> str:
    """The body of a Gutenberg etext: between the START line and '--(THE END)--' (or END)."""
    lines = raw.lstrip("\ufeff").replace("\r\n", "\n").split("\n")
    s = next(i for i, ln in enumerate(lines) if ln.startswith("*** START"))
    e = next((i + 1 for i, ln in enumerate(lines) if ln.startswith("--(THE END)--")), None)
    if e is None:
        e = next(i for i, ln in enumerate(lines) if ln.startswith("*** END"))
    body = [ln.rstrip() for ln in lines[s + 1:e] if not ln.startswith("Produced by")]
    return "\n".join(body).strip() + "\n"


def long_text() -> str:
    """The full Botchan text (see the module doc), fetched from PyPI once and cached."""
    path = cache_dir() / "texts" / "botchan.txt"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            print(f"fetching the long text: pip download {TEXT_PKG} (sdist)", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "--no-build-isolation", "-q", TEXT_PKG, "-d", tmp], check=True)
            sdist = next(Path(tmp).glob("sentencepiece-*.tar.gz"))
            with tarfile.open(sdist) as tf:
                raw = tf.extractfile(TEXT_MEMBER).read().decode("utf-8")
        path.write_text(clean_gutenberg(raw), encoding="utf-8")
    return path.read_text(encoding="utf-8")


def cpu_name() -> str:
    try:
        for ln in open("/proc/cpuinfo"):
            if ln.startswith("model name"):
                return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--modes", default="dense,window,recompute,shift")
    ap.add_argument("--sinks", default="0,1,4,8")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--n-discard", type=int, default=-1, help="cells per eviction (-1: half)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", default=None, help="score this file instead of the Botchan text")
    ap.add_argument("--json", default=None, help="append one JSON line per run to this file")
    a = ap.parse_args()

    from llmrt.model import Model
    from llmrt.perplexity import perplexity

    text = Path(a.text).read_text(encoding="utf-8") if a.text else long_text()
    sinks = [int(s) for s in a.sinks.split(",") if s != ""]
    modes = a.modes.split(",")
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {cpu_name()}, {a.threads} threads; ctx {a.ctx}, "
          f"first {a.tokens} tokens of the text, streaming batch {a.batch}, n_discard "
          f"{'-1 (half)' if a.n_discard == -1 else a.n_discard}")
    print(f"| model | mode | sinks | ppl | +/- | tokens scored | evicted | seconds |")
    print(f"| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for name in a.models.split(","):
        m = Model(model_file(name), n_threads=a.threads, ctx_size=a.ctx)
        ids = m.tokenizer.encode(text, add_special=True)[:a.tokens]
        runs = []
        for mode in modes:
            if mode == "dense":
                runs.append(("dense", None))
            elif mode == "window":
                runs.append(("window", 0))
            else:
                # shift with 0 sinks is window by construction (Session forces n_keep 0 there)
                runs += [(mode, k) for k in sinks if not (mode == "shift" and k == 0 and "window" in modes)]
        for mode, k in runs:
            r = perplexity(m, ids, a.ctx, kv_mode=None if mode == "dense" else mode,
                           n_keep=k or 0, n_discard=a.n_discard, batch=a.batch, progress=None)
            ev = "-" if r.n_evicted is None else str(r.n_evicted)
            print(f"| {name} | {mode} | {'-' if k is None else k} | {r.ppl:.3f} | {r.ppl_err:.3f} | "
                  f"{r.n_tokens} | {ev} | {r.seconds:.0f} |", flush=True)
            if a.json:
                d = r.summary()
                d.update(model=name, tokens=a.tokens, date=time.strftime("%Y-%m-%d %H:%M"))
                with open(a.json, "a") as f:
                    f.write(json.dumps(d) + "\n")


if __name__ == "__main__":
    main()
