"""Tiny Hugging Face models written to GGUF the way llama.cpp's converter writes them.

Test helper (torch + transformers are test-only dependencies). Usage:

    model, config = tiny_model("llama", seed=0)          # random tiny HF model, float32, eval mode
    write_gguf(model, config, tmp_path / "m.gguf", dtype="f32")   # "f32" | "f16" | "bf16" | "q8_0"
    ref = hf_logits(model, ids)                          # [len(ids), n_vocab] float32

For f16/q8_0 files, compare against hf_logits(roundtrip_model(model, config, dtype), ids) (the
weights as the file holds them) or llamacpp_like_model (also rounds matmul inputs to f16 / q8_0
like ggml's CPU backend, and Gemma's GELU through ggml's f16 table).

Checked against llama.cpp itself (llama-cpp-python 0.3.36, f32 K/V cache) by
tools/check_tiny_llamacpp.py: every f32 file of the SiLU families reproduces transformers'
logits to <= 1.1e-6 of the largest logit (24 tokens, all positions); Gemma 3 to 6e-4, and to
7e-5 once ggml's f16 GELU table is emulated; f16/q8_0 files match llamacpp_like_model exactly
(~3e-7) at every position where no rounding near a tie flipped.

Families: "llama" (GQA 4/2 heads), "mistral" (arch llama), "qwen2" (q/k/v biases), "qwen3"
(q_norm/k_norm), "gemma3" (text-only, sliding window 8, layer 5 of 6 global), and the llama
RoPE-scaling variants "llama-rope-linear", "llama-rope-yarn", "llama-rope-llama3".

What write_gguf mirrors, from llama.cpp's convert_hf_to_gguf.py (the `conversion/` package of
the llama.cpp vendored by llama-cpp-python 0.3.x: base.py TextModel/ModelBase, llama.py,
qwen.py, gemma.py). It is re-implemented here, not imported:

- general.architecture: "llama" for Llama and Mistral (MistralForCausalLM is registered on
  LlamaModel), "qwen2", "qwen3", "gemma3".
- keys from TextModel.set_gguf_parameters on `config.to_dict()`: block_count, context_length
  (max_position_embeddings), embedding_length, feed_forward_length, attention.head_count,
  attention.head_count_kv, rope scaling (linear: type+factor; yarn: type+factor+
  original_context_length and the optional yarn fields; llama3: no key, a `rope_freqs.weight`
  tensor instead), rope.freq_base, rope.freq_base_swa (a "sliding_attention" rope entry, Gemma 3),
  attention.layer_norm_rms_epsilon, attention.key_length/value_length (only when the config has
  `head_dim`), general.file_type. LlamaModel adds vocab_size and rope.dimension_count (head_dim).
  Gemma3Model re-writes its defaults and adds final_logit_softcapping (only when truthy) and
  attention.sliding_window. It writes no sliding-window pattern: llama.cpp uses its built-in
  pattern of 6 (every 6th layer global), which is what transformers' default layer_types say.
  Mistral's `sliding_window` is NOT written (arch llama has none), so tiny_model("mistral")
  uses sliding_window=None: a smaller window would make transformers and llama.cpp disagree.
- tensors: names from gguf.get_tensor_name_map (token_embd, blk.N.attn_norm, attn_q/k/v
  (+ .bias for Qwen2), attn_q_norm/attn_k_norm, attn_output, post_attention_norm, ffn_norm,
  ffn_gate/up/down, post_ffw_norm, output_norm, output unless tied).
  Conversions:
  * arch "llama": Q and K rows are PERMUTED (LlamaModel.permute): within each head, HF's
    rotate-half layout (dims i and i + d/2 rotate together) becomes interleaved pairs
    (2i, 2i+1), the layout of llama.cpp's LLAMA_ROPE_TYPE_NORM. K uses n_head_kv heads.
    `unpermute` below is the inverse.
  * Gemma 3: every tensor whose HF name ends in "norm.weight" gets +1 (Gemma3RMSNorm computes
    x * (1 + w)): input/post_attention/pre_feedforward/post_feedforward layernorms, q_norm,
    k_norm and the final norm.
  * types: 1-D tensors and names ending in "_norm.weight" stay F32; every other 2-D ".weight"
    (token_embd and output included) becomes F16 / Q8_0 for dtype f16 / q8_0 via
    gguf.quants.quantize (F16 fallback on a QuantError, as the converter does).
- tokenizer: the converter hashes a real HF tokenizer; a tiny model has none, so we write a
  minimal byte-level BPE vocab that llama.cpp loads: tokenizer.ggml.model "gpt2",
  pre "default", ids 0..255 = GPT-2 byte-to-unicode chars of bytes 0..255 (so "\n" exists),
  then results of made-up merges (each merge "a b" has a, b and a+b in the vocab), last id
  "<|endoftext|>" (CONTROL) used as bos = eos, add_bos_token false. ("no_vocab" is accepted by
  llama.cpp too but gives no tokenizer at all; gpt2 keeps llmrt's tokenizer testable.)

Known gaps vs transformers, on purpose: Gemma 3's query_pre_attn_scalar is not stored in GGUF
(llama.cpp uses 1/sqrt(head_dim)), so tiny gemma3 sets query_pre_attn_scalar = head_dim and
write_gguf refuses other values. transformers' Llama has no partial rotary, so there is no
"llama-partial-rotary" family.
"""
from __future__ import annotations

import copy
import logging
import math
from pathlib import Path

import numpy as np

import gguf

# ---------------------------------------------------------------------------------------------
# tiny models
# ---------------------------------------------------------------------------------------------

# Base configs. Odd vocab sizes (not powers of two) and non-default eps / rope bases so that a
# loader that ignores a key or assumes a size is caught.
_BASE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-5)

FAMILIES = {
    # family: (HF config class, HF model class, config overrides)
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(num_hidden_layers=3, vocab_size=320, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(num_hidden_layers=2, vocab_size=288, tie_word_embeddings=False, sliding_window=None,
                     rope_parameters={"rope_type": "default", "rope_theta": 100000.0})),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(num_hidden_layers=2, vocab_size=352, tie_word_embeddings=True, rms_norm_eps=1e-6,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(num_hidden_layers=2, vocab_size=304, tie_word_embeddings=False, rms_norm_eps=1e-6,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(num_hidden_layers=6, vocab_size=384, head_dim=32, query_pre_attn_scalar=32,
                    sliding_window=8, tie_word_embeddings=True, rms_norm_eps=1e-6,
                    final_logit_softcapping=None, attn_logit_softcapping=None,
                    hidden_activation="gelu_pytorch_tanh",
                    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    "llama-rope-linear": ("LlamaConfig", "LlamaForCausalLM",
                          dict(num_hidden_layers=2, vocab_size=320, tie_word_embeddings=False,
                               rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})),
    "llama-rope-yarn": ("LlamaConfig", "LlamaForCausalLM",
                        dict(num_hidden_layers=2, vocab_size=320, tie_word_embeddings=False,
                             rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                              "original_max_position_embeddings": 128})),
    # original_max_position_embeddings 8192: the converter reads it from the top level of the
    # config (default 8192), transformers from rope_parameters; 8192 makes both agree.
    "llama-rope-llama3": ("LlamaConfig", "LlamaForCausalLM",
                          dict(num_hidden_layers=2, vocab_size=320, tie_word_embeddings=False,
                               max_position_embeddings=16384,
                               rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 10000.0,
                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 8192})),
}

# Standard deviation of the random weights, as a multiple of 1/sqrt(fan_in) for matrices.
# transformers' default init (std 0.02) gives near-uniform attention and logits with a spread
# of ~0.1, which hides bugs; these give attention scores and logits of order 1.
W_SCALE = 1.0        # linear weights: N(0, (W_SCALE / sqrt(fan_in))^2)
EMB_STD = 1.0        # token embeddings; divided by sqrt(hidden) when tied or Gemma-scaled
NORM_STD = 0.2       # RMSNorm weights: 1 + N(0, NORM_STD^2)  (Gemma: stored offset N(0, NORM_STD^2))
BIAS_STD = 0.2       # Qwen2 q/k/v biases


def _arch_of(config) -> str:
    mt = config.model_type
    if mt in ("llama", "mistral"):
        return "llama"
    if mt in ("qwen2", "qwen3"):
        return mt
    if mt in ("gemma3_text", "gemma3"):
        return "gemma3"
    raise ValueError(f"[hf_gguf] unsupported model_type {mt!r}")


def tiny_model(family: str, seed: int = 0, **overrides):
    """A random tiny HF causal LM of `family` (see FAMILIES); returns (model, config).

    float32, eval mode, eager attention, weights drawn from torch.Generator(seed). `overrides`
    go into the config constructor (e.g. num_hidden_layers=4, tie_word_embeddings=True).
    """
    import torch
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"[hf_gguf] unknown family {family!r}; known: {sorted(FAMILIES)}")
    cfg_name, model_name, fam = FAMILIES[family]
    kw = dict(_BASE)
    kw.update(copy.deepcopy(fam))
    kw.update(overrides)
    n_vocab = kw["vocab_size"]
    kw.setdefault("bos_token_id", n_vocab - 1)
    kw.setdefault("eos_token_id", n_vocab - 1)
    kw.setdefault("pad_token_id", None)
    config = getattr(transformers, cfg_name)(**kw)
    config._attn_implementation = "eager"
    model = getattr(transformers, model_name)(config)
    model.to(torch.float32)
    _randomize(model, config, seed)
    model.eval()
    return model, config


def _randomize(model, config, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    gemma = _arch_of(config) == "gemma3"
    tied = bool(getattr(config, "tie_word_embeddings", False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "lm_head.weight" and tied:
                continue  # same storage as embed_tokens
            if name.endswith("norm.weight"):
                r = torch.randn(p.shape, generator=g) * NORM_STD
                p.copy_(r if gemma else 1.0 + r)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * BIAS_STD)
            elif "embed_tokens" in name:
                # a tied (or Gemma-scaled) embedding is also the output matrix: 1/sqrt(hidden)
                # keeps those logits of order 1 instead of echoing the input token
                std = EMB_STD / math.sqrt(config.hidden_size) if (gemma or tied) else EMB_STD
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * (W_SCALE / math.sqrt(p.shape[1])))
            else:
                raise AssertionError(f"[hf_gguf] unexpected parameter {name} {tuple(p.shape)}")


def hf_logits(model, ids) -> np.ndarray:
    """Teacher-forced logits of `ids` (one sequence): float32 [len(ids), n_vocab]."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([list(ids)], dtype=torch.long))
    return out.logits[0].float().numpy()


# ---------------------------------------------------------------------------------------------
# vocab
# ---------------------------------------------------------------------------------------------

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable unicode char map used by byte-level BPE vocabs."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


EOS_TEXT = "<|endoftext|>"


def tiny_vocab(n_vocab: int):
    """(tokens, toktypes, merges, eos_id) of a byte-level BPE vocab of exactly n_vocab entries.

    ids 0..255: byte b -> bytes_to_unicode()[b] (id == byte value); then one token per merge,
    in merge-rank order; last id: EOS_TEXT, CONTROL.
    """
    n_merge = n_vocab - 256 - 1
    if n_merge < 0:
        raise ValueError(f"[hf_gguf] n_vocab must be >= 257, got {n_vocab}")
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    sp = b2u[ord(" ")]
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    level1 = [(sp, c) for c in letters]
    pairs = [(a, b) for a in letters for b in letters if a != b]
    cands = list(level1)
    for a, b in pairs:  # a pair, then the same pair after a space: "Ġa" + "b"
        cands.append((a, b))
        cands.append((sp + a, b))
    if n_merge > len(cands):
        raise ValueError(f"[hf_gguf] n_vocab too large for tiny_vocab: {n_vocab}")
    merges = []
    have = set(tokens)
    for a, b in cands[:n_merge]:
        assert a in have and b in have and a + b not in have
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        have.add(a + b)
    tokens.append(EOS_TEXT)
    toktypes = [int(gguf.TokenType.NORMAL)] * (n_vocab - 1) + [int(gguf.TokenType.CONTROL)]
    return tokens, toktypes, merges, n_vocab - 1


# ---------------------------------------------------------------------------------------------
# GGUF writer
# ---------------------------------------------------------------------------------------------

_FTYPE = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
          "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
_QTYPE = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
          "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: per head, rows [x0..x(d/2-1), y0..] -> [x0, y0, x1, y1, ...]."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """Inverse of permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _find(hp: dict, keys, default=None):
    for k in keys:
        if k in hp:
            return hp[k]
    return default


def _rope_parameters(hp: dict) -> dict:
    """TextModel.__init__'s view of the rope config (rope_parameters, mirrored top-level keys)."""
    rp = copy.deepcopy(hp.get("rope_parameters", hp.get("rope_scaling")) or {})
    theta = _find(hp, ["global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta",
                       "rotary_emb_base"])
    local_theta = _find(hp, ["local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta",
                             "rope_local_base_freq"])
    prf = _find(hp, ["partial_rotary_factor", "rope_pct", "rope_percent"])
    orig = _find(hp, ["original_max_position_embeddings"])
    if "full_attention" not in rp and "sliding_attention" not in rp:
        if local_theta is not None:
            rp["sliding_attention"] = {"rope_theta": local_theta}
        if "rope_theta" not in rp and theta is not None:
            rp["rope_theta"] = theta
        if "rope_type" not in rp and rp.get("type") is not None:
            rp["rope_type"] = rp["type"]
        if "partial_rotary_factor" not in rp and prf is not None:
            rp["partial_rotary_factor"] = prf
        if "original_max_position_embeddings" not in rp and orig is not None:
            rp["original_max_position_embeddings"] = orig
    return rp


def _write_base_params(w: gguf.GGUFWriter, hp: dict, rp: dict, n_layer: int, ftype) -> None:
    """TextModel.set_gguf_parameters, for the keys our families can have."""
    w.add_block_count(n_layer)
    if (n_ctx := _find(hp, ["max_position_embeddings", "n_ctx", "n_positions", "max_length"])) is not None:
        w.add_context_length(n_ctx)
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    if (n_kv := hp.get("num_key_value_heads")) is not None:
        w.add_head_count_kv(n_kv)
    rpf = rp.get("full_attention", rp)
    if (rope_type := rpf.get("rope_type")) is not None:
        factor = rpf.get("factor")
        if rope_type == "linear" and factor is not None:
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(factor)
        elif rope_type == "yarn" and factor is not None:
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(factor)
            w.add_rope_scaling_orig_ctx_len(rpf["original_max_position_embeddings"])
            if (v := rpf.get("extrapolation_factor")) is not None:
                w.add_rope_scaling_yarn_ext_factor(v)
            if (v := rpf.get("attention_factor", rpf.get("attn_factor"))) is not None:
                w.add_rope_scaling_yarn_attn_factor(v)
            if (v := rpf.get("beta_fast")) is not None:
                w.add_rope_scaling_yarn_beta_fast(v)
            if (v := rpf.get("beta_slow")) is not None:
                w.add_rope_scaling_yarn_beta_slow(v)
        elif rope_type in ("default", "llama3"):
            pass  # no key; llama3 becomes the rope_freqs tensor
        else:
            raise ValueError(f"[hf_gguf] rope_type {rope_type!r} not supported by this helper")
    if (theta := rpf.get("rope_theta")) is not None:
        w.add_rope_freq_base(theta)
    if (local_theta := rp.get("sliding_attention", {}).get("rope_theta")) is not None:
        w.add_rope_freq_base_swa(local_theta)
    if (eps := _find(hp, ["rms_norm_eps", "norm_eps"])) is not None:
        w.add_layer_norm_rms_eps(eps)
    if (head_dim := hp.get("head_dim")) is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(ftype)


def _llama3_rope_factors(hp: dict, rp: dict) -> np.ndarray:
    """LlamaModel.generate_extra_tensors: per-frequency divisors for rope_type llama3."""
    rpf = rp.get("full_attention", rp)
    base = rpf.get("rope_theta", 10000.0)
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rpf.get("factor", 8.0)
    lo = rpf.get("low_freq_factor", 1.0)
    hi = rpf.get("high_freq_factor", 4.0)
    old_ctx = hp.get("original_max_position_embeddings", 8192)  # top level, as the converter reads it
    lo_wl = old_ctx / lo
    hi_wl = old_ctx / hi
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(factor)
        else:
            smooth = (old_ctx / wl - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def gguf_tensors(model, config) -> list[tuple[str, np.ndarray]]:
    """(gguf name, float32 array) in writing order, after the converter's value conversions
    (llama Q/K permute, Gemma norm +1), before type conversion. Shapes are numpy (row-major)."""
    arch = _arch_of(config)
    hp = config.to_dict()
    rp = _rope_parameters(hp)
    n_layer = hp["num_hidden_layers"]
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], n_layer)
    tied = bool(hp.get("tie_word_embeddings", False))
    n_head = hp["num_attention_heads"]
    n_kv = hp.get("num_key_value_heads") or n_head
    out = []
    if arch == "llama" and rp.get("full_attention", rp).get("rope_type", "").lower() == "llama3":
        out.append(("rope_freqs.weight", _llama3_rope_factors(hp, rp)))
    for name, t in model.state_dict().items():
        if name.endswith((".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")):
            continue
        if name == "lm_head.weight" and tied:
            continue  # save_pretrained drops the tied copy, so the converter never sees it
        data = t.detach().to("cpu").float().numpy().copy()
        if arch == "llama":
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                data = permute(data, n_head, n_head)
            if name.endswith(("k_proj.weight", "k_proj.bias")):
                data = permute(data, n_head, n_kv)
        if arch == "gemma3" and name.endswith("norm.weight"):
            data = data + np.float32(1.0)
        new = tmap.get_name(key=name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"[hf_gguf] cannot map tensor {name!r}")
        out.append((new, data))
    return out


def gguf_qtype(name: str, data: np.ndarray, dtype: str) -> gguf.GGMLQuantizationType:
    """ModelBase.prepare_tensors' type choice for our families."""
    if data.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return gguf.GGMLQuantizationType.F32
    return _QTYPE[dtype]


def convert_tensor(name: str, data: np.ndarray, dtype: str):
    """(array to write, its GGML type), quantizing like the converter (F16 on a QuantError)."""
    qt = gguf_qtype(name, data, dtype)
    try:
        return gguf.quants.quantize(data, qt), qt
    except gguf.QuantError:
        qt = gguf.GGMLQuantizationType.F16
        return gguf.quants.quantize(data, qt), qt


def write_gguf(model, config, path, dtype: str = "f32", family: str | None = None) -> Path:
    """Write `model` to `path` as llama.cpp's convert_hf_to_gguf.py --outtype `dtype` would."""
    if dtype not in _FTYPE:
        raise ValueError(f"[hf_gguf] dtype must be one of {sorted(_FTYPE)}, got {dtype!r}")
    arch = _arch_of(config)
    hp = config.to_dict()
    rp = _rope_parameters(hp)
    n_layer = hp["num_hidden_layers"]
    if arch == "gemma3":
        if hp.get("attn_logit_softcapping") is not None:
            raise ValueError("[hf_gguf] Gemma 3 has no attn_logit_softcapping (the converter asserts it)")
        if hp.get("query_pre_attn_scalar") != hp.get("head_dim", 256):
            raise ValueError("[hf_gguf] llama.cpp scales Gemma 3 attention by 1/sqrt(head_dim); "
                             "query_pre_attn_scalar must equal head_dim for the GGUF to match")
    if arch == "llama" and hp.get("sliding_window"):
        raise ValueError("[hf_gguf] arch llama has no sliding window in GGUF; use sliding_window=None")
    path = Path(path)
    ftype = _FTYPE[dtype]
    name = f"tiny-{family or arch}"

    w = gguf.GGUFWriter(path=None, arch=arch)
    glog = logging.getLogger("gguf.gguf_writer")
    old_level = glog.level
    glog.setLevel(logging.ERROR)  # Gemma3Model re-adds base keys on purpose ("Duplicated key" warnings)
    try:
        # prepare_tensors
        for tname, data in gguf_tensors(model, config):
            arr, qt = convert_tensor(tname, data, dtype)
            w.add_tensor(tname, arr, raw_dtype=qt)
        # prepare_metadata: type, meta model, set_gguf_parameters, quantization version
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(name)
        _write_base_params(w, hp, rp, n_layer, ftype)
        if arch == "llama":
            w.add_vocab_size(hp["vocab_size"])
            w.add_rope_dimension_count(hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"])
        elif arch == "gemma3":
            w.add_context_length(hp.get("max_position_embeddings", 131072))
            w.add_head_count(hp.get("num_attention_heads", 8))
            w.add_layer_norm_rms_eps(hp.get("rms_norm_eps", 1e-6))
            w.add_key_length(hp.get("head_dim", 256))
            w.add_value_length(hp.get("head_dim", 256))
            w.add_rope_freq_base(rp.get("full_attention", rp).get("rope_theta", 1_000_000.0))
            if (softcap := hp.get("final_logit_softcapping")):
                w.add_final_logit_softcapping(softcap)
            if hp.get("sliding_window_pattern") != 1:
                w.add_sliding_window(hp["sliding_window"])
            w.add_head_count_kv(hp.get("num_key_value_heads", 4))
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        # set_vocab (_set_vocab_gpt2 + SpecialVocab)
        tokens, toktypes, merges, eos_id = tiny_vocab(hp["vocab_size"])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(toktypes)
        w.add_token_merges(merges)
        w.add_bos_token_id(eos_id)
        w.add_eos_token_id(eos_id)
        w.add_add_bos_token(False)
    finally:
        glog.setLevel(old_level)
    w.write_header_to_file(path=path)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def roundtrip_model(model, config, dtype: str):
    """A deep copy of `model` whose weights went through the GGUF type of `dtype` and back
    (F16 rounding, Q8_0 quantization), so a runtime reading the GGUF can be compared to it
    without the weight-rounding error. Norms and biases are untouched (F32 in the file)."""
    import torch

    m2 = copy.deepcopy(model)
    arch = _arch_of(config)
    hp = config.to_dict()
    n_layer = hp["num_hidden_layers"]
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], n_layer)
    with torch.no_grad():
        for name, p in m2.named_parameters():
            new = tmap.get_name(key=name, try_suffixes=(".weight", ".bias"))
            data = p.detach().numpy().astype(np.float32)
            arr, qt = convert_tensor(new, data, dtype)
            if qt == gguf.GGMLQuantizationType.F32:
                continue
            # quantization is row-wise, so a row permutation (llama Q/K) commutes with it
            back = gguf.quants.dequantize(arr, qt).astype(np.float32).reshape(data.shape)
            p.copy_(torch.from_numpy(back))
    return m2


def _round_act_f16(x):
    return x.half().float()


def _round_act_q8_0(x):
    # ggml's AVX2 quantize_row_q8_0, per block of 32 along the input dim: d = amax/127 stored
    # as f16, q = round_nearest_even(x * (127/amax)) in f32 (127/amax, not 1/d: near-ties of
    # x*id would otherwise round differently), value q * f16(d)
    import torch

    b = x.reshape(-1, 32).float()
    amax = b.abs().amax(dim=1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    d16 = (amax / 127.0).half().float()
    return (torch.round(b * inv) * d16).reshape(x.shape)


def gelu_f16_table():
    """An nn.Module computing ggml's CPU GELU (GGML_GELU_FP16): the input rounded to f16 indexes
    a table of f16(gelu_tanh(x)), so input and output are both f16-rounded."""
    import torch
    import torch.nn.functional as F

    class GeluF16Table(torch.nn.Module):
        def forward(self, x):
            return F.gelu(x.half().float(), approximate="tanh").half().float()

    return GeluF16Table()


def llamacpp_like_model(model, config, dtype: str):
    """roundtrip_model plus the roundings llama.cpp's CPU backend adds, for tight comparisons:
    matmul inputs rounded to F16 (F16 weights) or quantized to Q8_0 (Q8_0 weights), as ggml's
    vec_dot_type does; Gemma's GELU through ggml's f16 lookup table. Not emulated: the f16 KV
    cache (use an f32 cache on the llama.cpp side) and summation order."""
    import torch

    m2 = roundtrip_model(model, config, dtype)
    rnd = {"f16": _round_act_f16, "q8_0": _round_act_q8_0}.get(dtype)
    if rnd is not None:
        for mod in m2.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.register_forward_pre_hook(lambda _m, args: (rnd(args[0]),) + tuple(args[1:]))
    if _arch_of(config) == "gemma3":
        for layer in m2.model.layers:
            layer.mlp.act_fn = gelu_f16_table()
    return m2
