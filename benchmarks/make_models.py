"""Build the synthetic benchmark set: llama-shaped GGUFs with random weights, deterministically
(fixed seeds, same bytes on every run and machine) and without downloads.

    python benchmarks/make_models.py [--out ~/.cache/llmrt/synthetic] [--sizes 0.4b,1.5b,3b]
        [--types q4_0,q4_k_m,q8_0,f16,bf16] [--check] [--force] [-t THREADS]

Sizes (vocab 49152, the tokenizer copied from SmolLM2-135M so that every tool can load them):

    0.4b   dim 1536, 16 layers, ffn 4096, 12 heads, 4 KV heads   0.40 B in the blocks, 0.55 B in all
    1.5b   dim 2048, 30 layers, ffn 5632, 32 heads, 4 KV heads   (TinyLlama's shape, 30 layers
           instead of 22 to reach 1.5 B)                          1.32 B in the blocks, 1.52 B in all
    3b     dim 3072, 26 layers, ffn 8192, 24 heads, 8 KV heads   2.62 B in the blocks, 2.92 B in all

The output matrix is untied (a separate `output.weight`, as in most llama models), so Q4_K_M
gives it Q6_K as llama-quantize does.

Types: f16 and bf16 are written here (same random values, rounded to each format); q4_0, q8_0
and q4_k_m (llama.cpp's Q4_K_M mixture) are made from the F16 file with `llmrt quantize`, which
picks each tensor's type as llama-quantize does. The F16 file is an intermediate when f16 is not
asked for: it is deleted at the end (when this run made it). Files that exist are kept (use --force to rebuild).
Default: every size in every type the benchmark set uses (0.4b and 1.5b: all five; 3b: q4_0
and q4_k_m).

Weights: normal, std 1/sqrt(fan_in) for the input projections (q, k, v, gate, up), so that a
normalized input gives unit-variance outputs; the two projections that write into the residual
stream (attn_output, ffn_down) are scaled down by a further 1/sqrt(2 * n_layers) (GPT-2's
residual scaling), so that after all layers the stream's variance has grown by about 2x, not by
2 * n_layers; token embeddings std 1; every norm weight 1; the output matrix std 2/sqrt(dim),
so logits have a std of about 2 (far from a saturated softmax). Measured (float64 numpy forward of
the 0.4b weights on 32 tokens): the residual stream's rms goes 1.01 after block 0, 1.10 after
block 10, 1.14 after block 15; each block adds about 0.08 (attention) and 0.11 (FFN) rms;
final logits std 2.00, max |logit| about 10, top probability about 0.04. --check runs each file
through llmrt and through llama.cpp (/work/ref/venv/bin/python, or --llama-python) on 16 tokens
and prints the logits' std, max |logit| and the top probability; it fails on a non-finite logit,
on llama.cpp refusing the file, or on a top probability above 0.99 (a saturated model).

Disk (GB, --types default): 0.4b f16 1.1, bf16 1.1, q8_0 0.6, q4_0 0.3, q4_k_m 0.35;
1.5b f16 3.0, bf16 3.0, q8_0 1.6, q4_0 0.9, q4_k_m 0.95; 3b q4_0 1.7, q4_k_m 1.8, with its F16
intermediate 5.8 GB while quantizing. About 20 GB at the peak for the whole set.
"""
import argparse
import os
import subprocess
import sys
import time
import zlib

import numpy as np

SMOL = os.path.expanduser("~/.cache/llmrt/SmolLM2-135M-Instruct.Q4_1.gguf")
SEED = 20261124

SIZES = {
    "0.4b": dict(dim=1536, n_layers=16, ffn=4096, n_heads=12, n_kv_heads=4),
    "1.5b": dict(dim=2048, n_layers=30, ffn=5632, n_heads=32, n_kv_heads=4),
    "3b": dict(dim=3072, n_layers=26, ffn=8192, n_heads=24, n_kv_heads=8),
}
DEFAULT_TYPES = {"0.4b": ["q4_0", "q4_k_m", "q8_0", "f16", "bf16"],
                 "1.5b": ["q4_0", "q4_k_m", "q8_0", "f16", "bf16"],
                 "3b": ["q4_0", "q4_k_m"]}
QUANT = {"q4_0": "q4_0", "q8_0": "q8_0", "q4_k_m": "q4_k"}   # our name -> `llmrt quantize` TYPE
ALL_TYPES = ["q4_0", "q4_k_m", "q8_0", "f16", "bf16"]


def file_name(size: str, qtype: str) -> str:
    return f"synthetic-{size}-{qtype}.gguf"


def tensor_plan(cfg: dict, n_vocab: int):
    """[(name, numpy shape (rows, cols) or (n,), std or None for a norm weight of ones)]."""
    d, f, L = cfg["dim"], cfg["ffn"], cfg["n_layers"]
    hd = d // cfg["n_heads"]
    kv = hd * cfg["n_kv_heads"]
    res = 1.0 / np.sqrt(2 * L)
    plan = [("token_embd.weight", (n_vocab, d), 1.0)]
    for i in range(L):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", (d,), None),
                 (b + "attn_q.weight", (d, d), 1 / np.sqrt(d)),
                 (b + "attn_k.weight", (kv, d), 1 / np.sqrt(d)),
                 (b + "attn_v.weight", (kv, d), 1 / np.sqrt(d)),
                 (b + "attn_output.weight", (d, d), res / np.sqrt(d)),
                 (b + "ffn_norm.weight", (d,), None),
                 (b + "ffn_gate.weight", (f, d), 1 / np.sqrt(d)),
                 (b + "ffn_up.weight", (f, d), 1 / np.sqrt(d)),
                 (b + "ffn_down.weight", (d, f), res / np.sqrt(f))]
    plan += [("output_norm.weight", (d,), None), ("output.weight", (n_vocab, d), 2 / np.sqrt(d))]
    return plan


def make_tensor(name: str, shape, std) -> np.ndarray:
    """float32 values of one tensor: a generator seeded by (SEED, crc32(name)), so every tensor
    is the same whatever the size of the others, in every run."""
    if std is None:
        return np.ones(shape, np.float32)
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= np.float32(std)
    return x


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even (values are finite)."""
    u = x.view(np.uint32)
    return ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)


def write_float_gguf(path: str, cfg: dict, dtype: str):
    import gguf

    src = gguf.GGUFReader(SMOL)
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(path + ".part", "llama")
    name = os.path.basename(path)[:-5]
    w.add_name(name)
    w.add_context_length(4096)
    w.add_embedding_length(cfg["dim"])
    w.add_block_count(cfg["n_layers"])
    w.add_feed_forward_length(cfg["ffn"])
    w.add_head_count(cfg["n_heads"])
    w.add_head_count_kv(cfg["n_kv_heads"])
    w.add_rope_dimension_count(cfg["dim"] // cfg["n_heads"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.MOSTLY_BF16)
    for key, field in src.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vt = field.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), vt, sub_type=field.types[-1])
        else:
            w.add_key_value(key, field.contents(), vt)
    plan = tensor_plan(cfg, n_vocab)
    for tname, shape, std in plan:
        n = int(np.prod(shape))
        if std is None:                                       # norms stay F32
            w.add_tensor_info(tname, shape, np.dtype(np.float32), 4 * n)
        elif dtype == "f16":
            w.add_tensor_info(tname, shape, np.dtype(np.float16), 2 * n)
        else:
            w.add_tensor_info(tname, shape, np.dtype(np.uint16), 2 * n,
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for tname, shape, std in plan:
        x = make_tensor(tname, shape, std)
        if std is not None:
            x = x.astype(np.float16) if dtype == "f16" else to_bf16(x)
        w.write_tensor_data(x)
    w.close()
    os.replace(path + ".part", path)


def n_params(cfg: dict, n_vocab: int = 49152):
    plan = tensor_plan(cfg, n_vocab)
    tot = sum(int(np.prod(s)) for _, s, _ in plan)
    blocks = sum(int(np.prod(s)) for n, s, _ in plan if n.startswith("blk."))
    return blocks, tot


CHECK_LLAMA = r"""
import sys, numpy as np, llama_cpp
llama_cpp.llama_backend_init()
m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_batch=64, n_threads=int(sys.argv[2]),
                    logits_all=True, verbose=False)
ids = list(range(100, 116))
m.eval(ids)
x = np.array(m.scores[:len(ids)], dtype=np.float64)
print(repr([float(np.isfinite(x).all()), float(x.std()), float(np.abs(x).max())]))
"""


def logit_stats(x: np.ndarray) -> str:
    x = np.asarray(x, np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
    return x, f"std {x.std():.2f}, max |logit| {np.abs(x).max():.1f}, top p mean {p.max(-1).mean():.3f} max {p.max():.3f}"


def check(path: str, threads: int, llama_python: str) -> bool:
    from llmrt import Model

    ok = True
    m = Model(path, n_threads=threads, ctx_size=64)
    x, s = logit_stats(m(list(range(100, 116))))
    good = bool(np.isfinite(x).all())
    z = x - x.max(axis=-1, keepdims=True)
    top = (np.exp(z) / np.exp(z).sum(-1, keepdims=True)).max()
    if not good or top > 0.99:
        ok = False
    print(f"  llmrt     {os.path.basename(path)}: {s}{'' if good and top <= 0.99 else '  BAD'}", flush=True)
    del m
    if llama_python and os.path.exists(llama_python):
        p = subprocess.run([llama_python, "-c", CHECK_LLAMA, path, str(threads)], capture_output=True, text=True)
        if p.returncode != 0:
            print(f"  llama.cpp {os.path.basename(path)}: FAILED to load/eval\n{p.stderr[-1500:]}")
            ok = False
        else:
            fin, std, mx = eval(p.stdout.strip().splitlines()[-1])
            print(f"  llama.cpp {os.path.basename(path)}: loads, logits finite {bool(fin)}, std {std:.2f}, "
                  f"max |logit| {mx:.1f}", flush=True)
            ok = ok and bool(fin)
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.expanduser("~/.cache/llmrt/synthetic"))
    ap.add_argument("--sizes", default="0.4b,1.5b,3b", help="comma list of " + ",".join(SIZES))
    ap.add_argument("--types", default=None,
                    help="comma list of " + ",".join(ALL_TYPES) + " (default: the set's types per size)")
    ap.add_argument("--check", action="store_true", help="load each file in llmrt and llama.cpp, check logits")
    ap.add_argument("--force", action="store_true", help="rebuild files that exist")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", "/work/ref/venv/bin/python"))
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    failed = []
    for size in a.sizes.split(","):
        if size not in SIZES:
            sys.exit(f"unknown size {size!r}: choose from {', '.join(SIZES)}")
        cfg = SIZES[size]
        types = a.types.split(",") if a.types else DEFAULT_TYPES[size]
        for t in types:
            if t not in ALL_TYPES:
                sys.exit(f"unknown type {t!r}: choose from {', '.join(ALL_TYPES)}")
        blocks, tot = n_params(cfg)
        print(f"{size}: {cfg}, {blocks / 1e9:.2f} B parameters in the blocks, {tot / 1e9:.2f} B in all", flush=True)
        f16 = os.path.join(a.out, file_name(size, "f16"))
        made_f16 = False
        for t in types:
            path = os.path.join(a.out, file_name(size, t))
            if os.path.exists(path) and not a.force:
                print(f"  {path}: exists, kept", flush=True)
            else:
                t0 = time.time()
                if t in ("f16", "bf16"):
                    write_float_gguf(path, cfg, t)
                    made_f16 |= t == "f16"
                else:
                    if not os.path.exists(f16) or (a.force and not made_f16):
                        write_float_gguf(f16, cfg, "f16")
                        made_f16 = True
                    p = subprocess.run([sys.executable, "-m", "llmrt", "quantize", f16, path + ".part",
                                        QUANT[t], "-t", str(a.threads)], capture_output=True, text=True)
                    if p.returncode != 0:
                        sys.exit(f"llmrt quantize failed for {path}:\n{p.stderr[-2000:]}")
                    os.replace(path + ".part", path)
                print(f"  {path}: {os.path.getsize(path) / 1e9:.2f} GB in {time.time() - t0:.0f} s", flush=True)
            if a.check and not check(path, a.threads, a.llama_python):
                failed.append(path)
        if "f16" not in types and made_f16 and os.path.exists(f16):
            os.remove(f16)                                   # an intermediate only
            print(f"  {f16}: intermediate, deleted", flush=True)
    if failed:
        print("FAIL: " + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
