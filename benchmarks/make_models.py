"""Build the synthetic benchmark set: llama-shaped GGUFs with random weights, deterministically
(fixed seeds, same bytes on every run and machine) and without downloads.

    python benchmarks/make_models.py [--out ~/.cache/llmrt/synthetic] [--set dense|moe|all]
        [--sizes 0.4b,1.5b,3b,moe-0.5b,moe-2b] [--types q4_0,q4_k_m,q8_0,f16,bf16]
        [--check [both|llmrt|llama.cpp]] [--force] [-t THREADS]

Without --set / --sizes: the dense set (0.4b, 1.5b, 3b). `--set moe`: the MoE set (moe-0.5b,
moe-2b), `--set all`: both; --sizes overrides --set.

Sizes (vocab 49152, the tokenizer copied from SmolLM2-135M so that every tool can load them):

    0.4b   dim 1536, 16 layers, ffn 4096, 12 heads, 4 KV heads   0.40 B in the blocks, 0.55 B in all
    1.5b   dim 2048, 30 layers, ffn 5632, 32 heads, 4 KV heads   (TinyLlama's shape, 30 layers
           instead of 22 to reach 1.5 B)                          1.32 B in the blocks, 1.52 B in all
    3b     dim 3072, 26 layers, ffn 8192, 24 heads, 8 KV heads   2.62 B in the blocks, 2.92 B in all

MoE sizes (architecture "qwen3moe", the keys and tensors llama.cpp's converter writes for
Qwen3-MoE: every layer MoE, no shared expert, per-head q/k RMS norms, NeoX rope, rope base 1e6,
rms eps 1e-6; softmax router, top-k renormalised: llama.cpp's qwen3moe graph always normalises
the top-k weights, there is no key for it):

    moe-0.5b  dim 1024, 8 layers, 16 heads x 64, 4 KV heads, 48 experts, top-4, expert ffn 384
              0.47 B in the blocks, 0.58 B in all; active per token 0.059 B in the blocks,
              0.109 B with the output matrix (and one embedding row)
    moe-2b    dim 1536, 12 layers, 12 heads x 128, 4 KV heads, 64 experts, top-8, expert ffn 512
              1.89 B in the blocks, 2.04 B in all; active per token 0.303 B in the blocks,
              0.379 B with the output matrix

Keys: qwen3moe.{context_length 4096, embedding_length, block_count, feed_forward_length (=
expert_used_count x expert_feed_forward_length: the dense intermediate_size real Qwen3-MoE files
carry, no tensor has it), attention.head_count, attention.head_count_kv, rope.freq_base,
attention.layer_norm_rms_epsilon, expert_used_count, attention.key_length, attention.value_length
(= head_dim), expert_count, expert_feed_forward_length}; no rope.dimension_count (llama.cpp:
head_dim), no vocab_size. Tensors per layer (ggml order [ne0, ne1, ne2]): attn_norm [dim],
attn_q [dim, heads*hd], attn_k / attn_v [dim, kv_heads*hd], attn_output [heads*hd, dim],
attn_q_norm / attn_k_norm [hd], ffn_norm [dim], ffn_gate_inp [dim, n_expert] (F32 in every
file), ffn_gate_exps / ffn_up_exps [dim, expert_ffn, n_expert], ffn_down_exps [expert_ffn, dim,
n_expert]; norms F32.

The output matrix is untied (a separate `output.weight`, as in most llama models), so Q4_K_M
gives it Q6_K as llama-quantize does.

Types: f16 and bf16 are written here (same random values, rounded to each format); q4_0, q8_0
and q4_k_m (llama.cpp's Q4_K_M mixture) are made from the F16 file with `llmrt quantize`, which
picks each tensor's type as llama-quantize does. The F16 file is an intermediate when f16 is not
asked for: it is deleted at the end (when this run made it). Files that exist are kept (use --force to rebuild).
Default: every size in every type the benchmark set uses (0.4b and 1.5b: all five; 3b: q4_0
and q4_k_m; moe-0.5b and moe-2b: q4_0, q4_k_m, q8_0, f16).

Weights: normal, std 1/sqrt(fan_in) for the input projections (q, k, v, gate, up), so that a
normalized input gives unit-variance outputs; the two projections that write into the residual
stream (attn_output, ffn_down) are scaled down by a further 1/sqrt(2 * n_layers) (GPT-2's
residual scaling), so that after all layers the stream's variance has grown by about 2x, not by
2 * n_layers; token embeddings std 1; every norm weight 1; the output matrix std 2/sqrt(dim),
so logits have a std of about 2 (far from a saturated softmax). Measured (float64 numpy forward of
the 0.4b weights on 32 tokens): the residual stream's rms goes 1.01 after block 0, 1.10 after
block 10, 1.14 after block 15; each block adds about 0.08 (attention) and 0.11 (FFN) rms;
final logits std 2.00, max |logit| about 10, top probability about 0.04. --check runs each file
through llmrt and through llama.cpp (/work/ref/venv/bin/python, or --llama-python) on 16 tokens,
each in a process of its own, and prints the logits' std, max |logit| and the top probability;
it fails on a non-finite logit, on a program refusing the file, or on a top probability above
0.99 (a saturated model). The two programs' failures are reported apart (`FAIL (llmrt): ...`,
`FAIL (llama.cpp): ...`), and one failing does not stop the other's check; `--check llama.cpp`
(or `--check llmrt`) runs one side only.

MoE weights: as above (experts like the dense FFN with fan-in dim / expert ffn, ffn_down_exps
scaled by 1/sqrt(2 * n_layers)); the router std ROUTER_SCALE / sqrt(dim) = 1 / sqrt(dim), so
router logits of a normalised input have std 1 (a softmax neither flat nor saturated). Measured
by moe_forward (float64 numpy forward of qwen3moe, the unrounded weights, 256 random token ids,
default_rng(0)): moe-0.5b, layer 0: all 48 experts used, tokens per expert 9 to 32 (mean 21.3 =
256 x 4 / 48, max / mean 1.50, coefficient of variation 0.24, what independent uniform choices
give: 0.22); the same over the 8 layers (max / mean 1.41 to 1.92, cv 0.20 to 0.27); the top
expert's renormalised weight 0.38 on average (of 4); residual rms 1.005 after block 0, 1.038
after block 7. moe-2b, layer 0: all 64 experts used, 18 to 44 tokens per expert (mean 32, max /
mean 1.38, cv 0.18), top weight 0.25 (of 8). llama.cpp on the moe-0.5b files (--check): logits
std 2.00, max |logit| 10.3 to 10.6, top probability at most 0.10.

Disk (GB, --types default): 0.4b f16 1.1, bf16 1.1, q8_0 0.6, q4_0 0.3, q4_k_m 0.35;
1.5b f16 3.0, bf16 3.0, q8_0 1.6, q4_0 0.9, q4_k_m 0.95; 3b q4_0 1.7, q4_k_m 1.8, with its F16
intermediate 5.8 GB while quantizing. About 20 GB at the peak for the whole set.
MoE: moe-0.5b f16 1.15, q8_0 0.61, q4_k_m 0.39, q4_0 0.34; moe-2b f16 4.08, q8_0 2.17,
q4_k_m 1.25, q4_0 1.17 (9.5 GB for the MoE set; `--set moe --check llama.cpp` took 10 minutes
on 2 shared cores, the moe-2b Q4_K_M 5 of them). moe-0.5b's expert ffn of 384 is not a multiple
of 256: in q4_k_m its ffn_down_exps fall back as in llama-quantize (Q4_K -> Q5_0 on layers 1, 2,
4, 5, Q6_K -> Q8_0 on 0, 3, 6, 7); its other experts are Q4_K.
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
    # Qwen3-MoE shaped (arch qwen3moe): every layer MoE, no shared expert
    "moe-0.5b": dict(arch="qwen3moe", dim=1024, n_layers=8, n_heads=16, n_kv_heads=4, head_dim=64,
                     n_expert=48, n_expert_used=4, ffn_exp=384),
    "moe-2b": dict(arch="qwen3moe", dim=1536, n_layers=12, n_heads=12, n_kv_heads=4, head_dim=128,
                   n_expert=64, n_expert_used=8, ffn_exp=512),
}
SETS = {"dense": ["0.4b", "1.5b", "3b"], "moe": ["moe-0.5b", "moe-2b"]}
SETS["all"] = SETS["dense"] + SETS["moe"]
DEFAULT_TYPES = {"0.4b": ["q4_0", "q4_k_m", "q8_0", "f16", "bf16"],
                 "1.5b": ["q4_0", "q4_k_m", "q8_0", "f16", "bf16"],
                 "3b": ["q4_0", "q4_k_m"],
                 "moe-0.5b": ["q4_0", "q4_k_m", "q8_0", "f16"],
                 "moe-2b": ["q4_0", "q4_k_m", "q8_0", "f16"]}
ROUTER_SCALE = 1.0      # router rows: std ROUTER_SCALE / sqrt(dim)
QUANT = {"q4_0": "q4_0", "q8_0": "q8_0", "q4_k_m": "q4_k"}   # our name -> `llmrt quantize` TYPE
ALL_TYPES = ["q4_0", "q4_k_m", "q8_0", "f16", "bf16"]


def file_name(size: str, qtype: str) -> str:
    return f"synthetic-{size}-{qtype}.gguf"


def is_moe(cfg: dict) -> bool:
    return cfg.get("arch", "llama") == "qwen3moe"


def head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["dim"] // cfg["n_heads"]


def keeps_f32(name: str, std) -> bool:
    """Norm weights (std None) and the MoE router are written as F32 in every file."""
    return std is None or name.endswith("ffn_gate_inp.weight")


def tensor_plan(cfg: dict, n_vocab: int):
    """[(name, numpy shape (rows, cols), (n_expert, rows, cols) or (n,), std or None for a norm
    weight of ones)]. numpy shapes are ggml's reversed: ffn_gate_exps (n_expert, ffn_exp, dim)
    is ggml [dim, ffn_exp, n_expert]."""
    d, L = cfg["dim"], cfg["n_layers"]
    hd = head_dim(cfg)
    q, kv = hd * cfg["n_heads"], hd * cfg["n_kv_heads"]
    res = 1.0 / np.sqrt(2 * L)
    plan = [("token_embd.weight", (n_vocab, d), 1.0)]
    for i in range(L):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", (d,), None),
                 (b + "attn_q.weight", (q, d), 1 / np.sqrt(d)),
                 (b + "attn_k.weight", (kv, d), 1 / np.sqrt(d)),
                 (b + "attn_v.weight", (kv, d), 1 / np.sqrt(d)),
                 (b + "attn_output.weight", (d, q), res / np.sqrt(q))]
        if is_moe(cfg):
            E, f = cfg["n_expert"], cfg["ffn_exp"]
            plan += [(b + "attn_q_norm.weight", (hd,), None),
                     (b + "attn_k_norm.weight", (hd,), None),
                     (b + "ffn_norm.weight", (d,), None),
                     (b + "ffn_gate_inp.weight", (E, d), ROUTER_SCALE / np.sqrt(d)),
                     (b + "ffn_gate_exps.weight", (E, f, d), 1 / np.sqrt(d)),
                     (b + "ffn_up_exps.weight", (E, f, d), 1 / np.sqrt(d)),
                     (b + "ffn_down_exps.weight", (E, d, f), res / np.sqrt(f))]
        else:
            f = cfg["ffn"]
            plan += [(b + "ffn_norm.weight", (d,), None),
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
    arch = cfg.get("arch", "llama")
    w = gguf.GGUFWriter(path + ".part", arch)
    name = os.path.basename(path)[:-5]
    w.add_name(name)
    w.add_context_length(4096)
    w.add_embedding_length(cfg["dim"])
    w.add_block_count(cfg["n_layers"])
    if is_moe(cfg):
        # the keys llama.cpp's converter writes for Qwen3-MoE (no rope.dimension_count, no
        # vocab_size); feed_forward_length is the HF config's dense intermediate_size, which no
        # tensor has (Qwen3-30B-A3B: 6144 = 8 x 768 = experts used x expert ffn, as here)
        w.add_feed_forward_length(cfg["n_expert_used"] * cfg["ffn_exp"])
        w.add_head_count(cfg["n_heads"])
        w.add_head_count_kv(cfg["n_kv_heads"])
        w.add_rope_freq_base(1000000.0)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_expert_used_count(cfg["n_expert_used"])
        w.add_key_length(head_dim(cfg))
        w.add_value_length(head_dim(cfg))
        w.add_expert_count(cfg["n_expert"])
        w.add_expert_feed_forward_length(cfg["ffn_exp"])
    else:
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
        if keeps_f32(tname, std):                             # norms and routers stay F32
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
        if not keeps_f32(tname, std):
            x = x.astype(np.float16) if dtype == "f16" else to_bf16(x)
        w.write_tensor_data(x)
        del x
    w.close()
    os.replace(path + ".part", path)


def n_params(cfg: dict, n_vocab: int = 49152):
    plan = tensor_plan(cfg, n_vocab)
    tot = sum(int(np.prod(s)) for _, s, _ in plan)
    blocks = sum(int(np.prod(s)) for n, s, _ in plan if n.startswith("blk."))
    return blocks, tot


def n_active_params(cfg: dict, n_vocab: int = 49152):
    """Parameters one token uses: (in the blocks, in all). The experts count n_expert_used /
    n_expert of theirs (router and norms fully); "all" adds the output matrix and one row of the
    embedding table."""
    plan = tensor_plan(cfg, n_vocab)
    frac = cfg["n_expert_used"] / cfg["n_expert"] if is_moe(cfg) else 1.0
    blocks = sum(int(np.prod(s)) * (frac if n.endswith("_exps.weight") else 1.0)
                 for n, s, _ in plan if n.startswith("blk."))
    rest = sum(int(np.prod(s)) for n, s, _ in plan if not n.startswith("blk.") and n != "token_embd.weight")
    return int(round(blocks)), int(round(blocks)) + rest + cfg["dim"]


def _rms_norm(x):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)


def _rope_neox(x, pos, base):
    """x (n_tok, n_head, hd): NeoX rotation (dims i and i + hd/2 rotate together)."""
    hd = x.shape[-1]
    inv = base ** (-np.arange(0, hd // 2, dtype=np.float64) * 2 / hd)
    ang = pos[:, None] * inv[None, :]
    c, s_ = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :hd // 2], x[..., hd // 2:]
    return np.concatenate([a * c - b * s_, a * s_ + b * c], axis=-1)


def moe_forward(cfg: dict, ids, n_layers: int = 1, n_vocab: int = 49152) -> dict:
    """float64 numpy forward of the first `n_layers` blocks of a qwen3moe cfg (the weights
    make_tensor gives, not rounded to F16) on token ids at positions 0..: llama.cpp's qwen3moe
    graph (RMS norms, q/k norm, NeoX rope base 1e6, causal GQA attention, softmax router, top-k,
    renormalised weights, SiLU experts). Returns {"load": [n_layers, n_expert] token counts
    per expert, "rms": residual rms after each block, "top_w": mean largest routing weight}."""
    d, E, k = cfg["dim"], cfg["n_expert"], cfg["n_expert_used"]
    hd, nh, nkv = head_dim(cfg), cfg["n_heads"], cfg["n_kv_heads"]
    std = {n: sd for n, _, sd in tensor_plan(cfg, n_vocab)}
    shp = {n: sh for n, sh, _ in tensor_plan(cfg, n_vocab)}

    def W(n):
        return make_tensor(n, shp[n], std[n]).astype(np.float64)

    ids = np.asarray(ids)
    x = W("token_embd.weight")[ids]
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    mask = np.triu(np.full((n, n), -np.inf), 1)
    out = {"load": [], "rms": [], "top_w": []}
    for il in range(n_layers):
        b = f"blk.{il}."
        h = _rms_norm(x)
        q = (h @ W(b + "attn_q.weight").T).reshape(n, nh, hd)
        kk = (h @ W(b + "attn_k.weight").T).reshape(n, nkv, hd)
        v = (h @ W(b + "attn_v.weight").T).reshape(n, nkv, hd)
        q, kk = _rope_neox(_rms_norm(q), pos, 1e6), _rope_neox(_rms_norm(kk), pos, 1e6)
        rep = nh // nkv
        kk, v = np.repeat(kk, rep, axis=1), np.repeat(v, rep, axis=1)
        att = np.einsum("qhd,khd->hqk", q, kk) / np.sqrt(hd) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", att, v).reshape(n, nh * hd)
        x = x + o @ W(b + "attn_output.weight").T
        h = _rms_norm(x)
        logits = h @ W(b + "ffn_gate_inp.weight").T                     # (n, E)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        sel = np.argsort(-p, axis=-1)[:, :k]
        w = np.take_along_axis(p, sel, -1)
        w /= w.sum(-1, keepdims=True)
        gate, up, down = (W(b + f"ffn_{t}_exps.weight") for t in ("gate", "up", "down"))
        y = np.zeros_like(x)
        for e in range(E):
            tok, slot = np.nonzero(sel == e)
            if len(tok) == 0:
                continue
            g, u = h[tok] @ gate[e].T, h[tok] @ up[e].T
            y[tok] += w[tok, slot][:, None] * (((g / (1 + np.exp(-g))) * u) @ down[e].T)
        x = x + y
        out["load"].append(np.bincount(sel.ravel(), minlength=E))
        out["rms"].append(float(np.sqrt((x * x).mean())))
        out["top_w"].append(float(w[:, 0].mean()))
    out["load"] = np.array(out["load"])
    return out


CHECK_LLAMA = r"""
import sys, numpy as np, llama_cpp
llama_cpp.llama_backend_init()
m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_batch=64, n_threads=int(sys.argv[2]),
                    logits_all=True, verbose=False)
ids = list(range(100, 116))
m.eval(ids)
x = np.array(m.scores[:len(ids)], dtype=np.float64)
z = x - x.max(axis=-1, keepdims=True)
p = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
print(repr([float(np.isfinite(x).all()), float(x.std()), float(np.abs(x).max()), float(p.max())]))
"""

CHECK_LLMRT = r"""
import sys, numpy as np
from llmrt import Model
m = Model(sys.argv[1], n_threads=int(sys.argv[2]), ctx_size=64)
x = np.asarray(m(list(range(100, 116))), np.float64)
z = x - x.max(axis=-1, keepdims=True)
p = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
print(repr([float(np.isfinite(x).all()), float(x.std()), float(np.abs(x).max()), float(p.max(-1).mean()),
            float(p.max())]))
"""


def check(path: str, threads: int, llama_python: str, sides=("llmrt", "llama.cpp")) -> dict:
    """Load `path` and run 16 tokens in llmrt and/or llama.cpp, each in its own process (a crash
    or an unsupported architecture in one does not stop the other). Returns {side: True (ok) /
    False (failed)} for the sides run."""
    res = {}
    base = os.path.basename(path)
    if "llmrt" in sides:
        p = subprocess.run([sys.executable, "-c", CHECK_LLMRT, path, str(threads)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            err = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
            print(f"  llmrt     {base}: FAILED to load/eval (exit {p.returncode}): {err[-300:]}", flush=True)
            res["llmrt"] = False
        else:
            fin, std, mx, top_mean, top = eval(p.stdout.strip().splitlines()[-1])
            good = bool(fin) and top <= 0.99
            print(f"  llmrt     {base}: std {std:.2f}, max |logit| {mx:.1f}, top p mean {top_mean:.3f} "
                  f"max {top:.3f}{'' if good else '  BAD'}", flush=True)
            res["llmrt"] = good
    if "llama.cpp" in sides:
        if not (llama_python and os.path.exists(llama_python)):
            print(f"  llama.cpp {base}: no interpreter {llama_python!r}, not checked", flush=True)
        else:
            p = subprocess.run([llama_python, "-c", CHECK_LLAMA, path, str(threads)], capture_output=True, text=True)
            if p.returncode != 0:
                print(f"  llama.cpp {base}: FAILED to load/eval\n{p.stderr[-1500:]}", flush=True)
                res["llama.cpp"] = False
            else:
                fin, std, mx, top = eval(p.stdout.strip().splitlines()[-1])
                print(f"  llama.cpp {base}: loads, logits finite {bool(fin)}, std {std:.2f}, "
                      f"max |logit| {mx:.1f}, top p max {top:.3f}", flush=True)
                res["llama.cpp"] = bool(fin)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.expanduser("~/.cache/llmrt/synthetic"))
    ap.add_argument("--set", choices=sorted(SETS), default="dense",
                    help="dense (default): " + ",".join(SETS["dense"]) + "; moe: " + ",".join(SETS["moe"])
                         + "; all: both")
    ap.add_argument("--sizes", default=None, help="comma list of " + ",".join(SIZES) + " (overrides --set)")
    ap.add_argument("--types", default=None,
                    help="comma list of " + ",".join(ALL_TYPES) + " (default: the set's types per size)")
    ap.add_argument("--check", nargs="?", const="both", choices=["both", "llmrt", "llama.cpp"],
                    help="load each file in llmrt and llama.cpp (or only the side named), check logits")
    ap.add_argument("--force", action="store_true", help="rebuild files that exist")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", "/work/ref/venv/bin/python"))
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    sides = ("llmrt", "llama.cpp") if a.check == "both" else (a.check,) if a.check else ()
    failed = {"llmrt": [], "llama.cpp": []}
    sizes = a.sizes.split(",") if a.sizes else SETS[a.set]
    for size in sizes:
        if size not in SIZES:
            sys.exit(f"unknown size {size!r}: choose from {', '.join(SIZES)}")
    for size in sizes:
        cfg = SIZES[size]
        types = a.types.split(",") if a.types else DEFAULT_TYPES[size]
        for t in types:
            if t not in ALL_TYPES:
                sys.exit(f"unknown type {t!r}: choose from {', '.join(ALL_TYPES)}")
        blocks, tot = n_params(cfg)
        line = f"{size}: {cfg}, {blocks / 1e9:.2f} B parameters in the blocks, {tot / 1e9:.2f} B in all"
        if is_moe(cfg):
            ab, at = n_active_params(cfg)
            line += f"; active per token {ab / 1e9:.3f} B in the blocks, {at / 1e9:.3f} B with the output matrix"
        print(line, flush=True)
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
            if sides:
                for side, ok in check(path, a.threads, a.llama_python, sides).items():
                    if not ok:
                        failed[side].append(os.path.basename(path))
        if "f16" not in types and made_f16 and os.path.exists(f16):
            os.remove(f16)                                   # an intermediate only
            print(f"  {f16}: intermediate, deleted", flush=True)
    for side in ("llama.cpp", "llmrt"):
        if failed[side]:
            print(f"FAIL ({side}): " + ", ".join(failed[side]))
    if failed["llama.cpp"] or failed["llmrt"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
