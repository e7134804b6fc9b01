"""Tiny Hugging Face models written to GGUF the way llama.cpp's converter writes them.

Test helper (torch + transformers are test-only dependencies). Usage:

    model, config = tiny_model("llama", seed=0)          # random tiny HF model, float32, eval mode
    write_gguf(model, config, tmp_path / "m.gguf", dtype="f32")   # "f32" | "f16" | "bf16" | "q8_0"
    ref = hf_logits(model, ids)                          # [len(ids), n_vocab] float32

For f16/q8_0 files, compare against hf_logits(roundtrip_model(model, config, dtype), ids) (the
weights as the file holds them; hf_logits(..., float64=True) runs a float64 copy) or
llamacpp_like_model (also rounds matmul inputs to f16 / q8_0 like ggml's CPU backend, and
Gemma's GELU through ggml's f16 table).

Checked against llama.cpp itself (llama-cpp-python 0.3.36, f32 K/V cache) by
tools/check_tiny_llamacpp.py: every f32 file of the SiLU families reproduces transformers'
logits to <= 1.1e-6 of the largest logit (24 tokens, all positions); Gemma 3 to 6e-4, and to
7e-5 once ggml's f16 GELU table is emulated; f16/q8_0 files match llamacpp_like_model exactly
(~3e-7) at every position where no rounding near a tie flipped.

Families: "llama" (GQA 4/2 heads), "mistral" (arch llama), "qwen2" (q/k/v biases), "qwen3"
(q_norm/k_norm), "gemma3" (text-only, sliding window 8, layer 5 of 6 global), and the llama
RoPE-scaling variants "llama-rope-linear", "llama-rope-yarn", "llama-rope-llama3".
Mixture of Experts (MOE_FAMILIES, every layer MoE): "mixtral" (arch llama, top-2 of 4,
renormalised), "qwen2moe" (top-2 of 4 not renormalised + sigmoid-gated shared expert),
"qwen3moe" (top-4 of 8 renormalised, tied embeddings), "olmoe" (top-2 of 8 not renormalised,
q/k norm over the whole projection, 4/4 heads). For MoE: router_probs / router_gaps (float64
router gaps per layer and position), gap_mask (positions far from a routing tie, given
ROUTER_LOGIT_GAP_MIN), decisive_ids (token ids whose routing is decisive everywhere), and
write_gguf(split_experts=True) for old per-expert Mixtral files. Checked against llama.cpp like
the dense families (f32 within 9.4e-7 at every position; f16/q8_0 files = llamacpp_like_model
to ~3e-7, the experts' rounded activations included).

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
  MoE (Qwen2MoeModel / Qwen3MoeModel / OlmoeModel in qwen.py and olmo.py, LlamaModel's expert
  merge for Mixtral): keys expert_count (num_local_experts | num_experts) and expert_used_count
  (num_experts_per_tok) from TextModel, written after the rms eps; Qwen2-/Qwen3-MoE add
  expert_feed_forward_length (moe_intermediate_size) and Qwen2-MoE
  expert_shared_feed_forward_length; OLMoE re-writes the rms eps as 1e-5 (so tiny olmoe uses
  1e-5). Mixtral and OLMoE have no expert FFN key: llama.cpp takes feed_forward_length
  (intermediate_size, the expert size there). Tensors: blk.N.ffn_gate_inp (router, [n_expert,
  n_embd] numpy = ggml {n_embd, n_expert}); ffn_gate_exps / ffn_up_exps ([n_expert, n_ff,
  n_embd] = ggml {n_embd, n_ff, n_expert}) and ffn_down_exps (ggml {n_ff, n_embd, n_expert}),
  from transformers 5.x's fused experts.gate_up_proj [n_expert, 2*n_ff, n_embd] (gate = rows
  [:n_ff], up = rows [n_ff:], as Qwen2MoeModel.modify_tensors splits it) and experts.down_proj;
  Qwen2-MoE's shared expert ffn_{gate,up,down}_shexp and its gate ffn_gate_inp_shexp, written
  unsqueezed as [1, n_embd] (ggml {n_embd, 1}). No --fuse-gate-up-exps (ffn_gate_up_exps): off
  by default in the converter.
  Conversions:
  * arch "llama": Q and K rows are PERMUTED (LlamaModel.permute): within each head, HF's
    rotate-half layout (dims i and i + d/2 rotate together) becomes interleaved pairs
    (2i, 2i+1), the layout of llama.cpp's LLAMA_ROPE_TYPE_NORM. K uses n_head_kv heads.
    `unpermute` below is the inverse.
  * Gemma 3: every tensor whose HF name ends in "norm.weight" gets +1 (Gemma3RMSNorm computes
    x * (1 + w)): input/post_attention/pre_feedforward/post_feedforward layernorms, q_norm,
    k_norm and the final norm.
  * types: 1-D tensors, names ending in "_norm.weight" and the MoE routers (ffn_gate_inp,
    ffn_gate_inp_shexp: on prepare_tensors' always-F32 list) stay F32; every other ".weight"
    (token_embd, output and the 3-D expert tensors included) becomes F16 / Q8_0 for dtype
    f16 / q8_0 via gguf.quants.quantize, row by row along the last (input) axis (F16 fallback on
    a QuantError, as the converter does).
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
    # --- Mixture of Experts (every layer MoE; expert FFN sizes multiples of 32 so Q8_0 applies) ---
    # Mixtral: arch llama + expert_count / expert_used_count; softmax over 4 experts, top-2,
    # renormalised. intermediate_size IS the expert FFN size (llama.cpp: feed_forward_length).
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(num_hidden_layers=3, vocab_size=299, tie_word_embeddings=False, sliding_window=None,
                     intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=2e-6,
                     rope_parameters={"rope_type": "default", "rope_theta": 300000.0})),
    # Qwen2-MoE: q/k/v biases, shared expert (FFN 64) behind a sigmoid gate, top-2 of 4 NOT
    # renormalised. intermediate_size (feed_forward_length) is unused by llama.cpp when
    # expert_feed_forward_length is present; 96 (not 32 or 64) catches a loader that uses it.
    # No `output` fallback in llama.cpp's qwen2moe: untied.
    "qwen2moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                 dict(num_hidden_layers=2, vocab_size=333, tie_word_embeddings=False, rms_norm_eps=1e-6,
                      intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                      num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
                      decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 100000.0})),
    # Qwen3-MoE: per-head q/k RMSNorm, top-4 of 8 renormalised (llama.cpp's qwen3moe graph always
    # renormalises -- norm_w = true -- so norm_topk_prob must be True, as in the real Qwen3 MoE
    # configs), tied embeddings (llama.cpp falls back to token_embd).
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                 dict(num_hidden_layers=2, vocab_size=317, tie_word_embeddings=True, rms_norm_eps=1e-6,
                      intermediate_size=160, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=4,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # OLMoE: q/k RMSNorm over the whole q / k projection, top-2 of 8 not renormalised.
    # 4 heads / 4 KV heads: llama.cpp's olmoe creates attn_k_norm as [n_embd], so it cannot load
    # a GQA OLMoE. rms_norm_eps 1e-5: the converter overwrites the eps key with 1e-5.
    # intermediate_size IS the expert FFN size (llama.cpp: feed_forward_length).
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(num_hidden_layers=2, vocab_size=291, tie_word_embeddings=False, num_key_value_heads=4,
                   rms_norm_eps=1e-5, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                   norm_topk_prob=False, rope_parameters={"rope_type": "default", "rope_theta": 20000.0})),
}

MOE_FAMILIES = ("mixtral", "qwen2moe", "qwen3moe", "olmoe")

# Standard deviation of the random weights, as a multiple of 1/sqrt(fan_in) for matrices.
# transformers' default init (std 0.02) gives near-uniform attention and logits with a spread
# of ~0.1, which hides bugs; these give attention scores and logits of order 1.
W_SCALE = 1.0        # linear weights: N(0, (W_SCALE / sqrt(fan_in))^2)
EMB_STD = 1.0        # token embeddings; divided by sqrt(hidden) when tied or Gemma-scaled
NORM_STD = 0.2       # RMSNorm weights: 1 + N(0, NORM_STD^2)  (Gemma: stored offset N(0, NORM_STD^2))
BIAS_STD = 0.2       # Qwen2 q/k/v biases
# MoE router (`mlp.gate.weight`, [n_expert, n_embd]): N(0, (ROUTER_SCALE / sqrt(n_embd))^2). Its
# input is RMS-normed (rms ~1), so router logits have std ~ROUTER_SCALE: 2 spreads the top-k
# weights (a wrong weight or normalisation shows) without saturating the softmax (the
# unselected experts keep non-negligible probability, so renormalising or not matters). No
# scale makes Gaussian router logits decisive against rounding (the rounding noise in the logits
# scales with them too): tests pick decisive token ids instead (decisive_ids).
ROUTER_SCALE = 2.0


def _arch_of(config) -> str:
    mt = config.model_type
    if mt in ("llama", "mistral", "mixtral"):
        return "llama"
    if mt in ("qwen2", "qwen3", "olmoe"):
        return mt
    if mt in ("qwen2_moe", "qwen3_moe"):
        return mt.replace("_", "")
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
    if family in MOE_FAMILIES:
        # the plain per-expert loop: transformers 5.x otherwise picks torch's grouped_mm
        # (float32/bf16/f16 only, so no float64 reference) for the fused experts
        model.set_experts_implementation("eager")
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
            elif name.endswith(".mlp.gate.weight"):  # MoE router
                p.copy_(torch.randn(p.shape, generator=g) * (ROUTER_SCALE / math.sqrt(p.shape[1])))
            elif p.dim() in (2, 3):
                # 3-D: fused experts [n_expert, out, in] (gate_up_proj, down_proj); fan_in = in
                p.copy_(torch.randn(p.shape, generator=g) * (W_SCALE / math.sqrt(p.shape[-1])))
            else:
                raise AssertionError(f"[hf_gguf] unexpected parameter {name} {tuple(p.shape)}")


def hf_logits(model, ids, float64: bool = False) -> np.ndarray:
    """Teacher-forced logits of `ids` (one sequence): float32 [len(ids), n_vocab].

    float64=True: evaluated on a float64 copy of the model, returned as float64. (transformers'
    MoE routers take the softmax in float32 even then -- `softmax(..., dtype=torch.float)` /
    `.float()` -- so the routing weights carry ~1e-7 relative error; the rest is float64.)"""
    import torch

    m = _as_float64(model) if float64 else model
    with torch.no_grad():
        out = m(torch.tensor([list(ids)], dtype=torch.long))
    return out.logits[0].double().numpy() if float64 else out.logits[0].float().numpy()


def _as_float64(model):
    import torch

    if next(model.parameters()).dtype == torch.float64:
        return model
    return copy.deepcopy(model).to(torch.float64)


# ---------------------------------------------------------------------------------------------
# MoE routing
# ---------------------------------------------------------------------------------------------

def _routers(model):
    """The router modules of an MoE model, one per layer (all our families: `layer.mlp.gate`,
    a *TopKRouter with .weight [n_expert, n_embd] and .top_k)."""
    out = []
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is None or not hasattr(gate, "top_k"):
            raise ValueError("[hf_gguf] not an MoE model (every layer needs mlp.gate, a top-k router)")
        out.append(gate)
    return out


def _router_logits(m, batch) -> np.ndarray:
    """float64 [n_layer, B, T, n_expert]: router logits x W^T of a [B, T] batch of ids, from the
    hidden states the routers get in a forward pass of `m` (hooks on the router inputs), the
    product taken in float64."""
    import torch

    routers = _routers(m)
    out = [None] * len(routers)
    handles = []
    for il, r in enumerate(routers):
        def hook(mod, args, il=il):
            x = args[0].detach().reshape(-1, mod.weight.shape[1]).double()
            out[il] = (x @ mod.weight.detach().double().T).numpy()
        handles.append(r.register_forward_pre_hook(hook))
    try:
        ids = torch.tensor(batch, dtype=torch.long)
        with torch.no_grad():
            m(ids)
    finally:
        for h in handles:
            h.remove()
    return np.stack(out).reshape(len(routers), *ids.shape, -1)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def router_probs(model, ids, float64: bool = True) -> np.ndarray:
    """Router probabilities softmax(x W^T) at every layer and position: float64
    [n_layer, len(ids), n_expert], from the hidden states the routers actually get in a forward
    pass, computed in float64. float64=True (default) runs the forward pass on a float64 copy of
    the model, otherwise in the model's own dtype (e.g. llamacpp_like_model's float32)."""
    m = _as_float64(model) if float64 else model
    return _softmax(_router_logits(m, [list(ids)])[:, 0])


def _gaps(z: np.ndarray, k: int, kind: str) -> np.ndarray:
    if kind == "logit":
        zs = -np.sort(-z, axis=-1)
        return zs[..., k - 1] - zs[..., k]
    if kind == "prob":
        ps = -np.sort(-_softmax(z), axis=-1)
        return ps[..., k - 1] - ps[..., k]
    raise ValueError(f"[hf_gguf] kind must be 'prob' or 'logit', got {kind!r}")


def router_gaps(model, ids, kind: str = "prob") -> np.ndarray:
    """float64 [n_layer, len(ids)]: at each layer and position, the gap between the k-th and the
    (k+1)-th largest router probability (k = experts used; softmax over the experts, as the
    model routes), with the model in float64.

    kind="prob": p_(k) - p_(k+1). kind="logit": z_(k) - z_(k+1) = log(p_(k) / p_(k+1)), the
    router-logit gap. Rounding elsewhere (F16/Q8_0 weights and activations, summation order)
    moves the router logits by some absolute dz and the probabilities by ~p * dz, so it is the
    logit gap that compares directly with the noise (a swap needs dz ~ the logit gap); a
    probability gap of 0.05 is a logit gap of 0.05 / p_(k), large when p_(k) is small (top-4
    of 8 experts: p_(k) ~ 0.05)."""
    k = _routers(model)[0].top_k
    return _gaps(_router_logits(_as_float64(model), [list(ids)])[:, 0], k, kind)


def decisive_ids(model, n: int, seed: int = 1, min_gap: float = 0.5, n_try: int = 16,
                 kind: str = "logit") -> list[int]:
    """n random token ids (never the last id, EOS) chosen so that routing is decisive: position by
    position, n_try random candidates are evaluated (causal: earlier positions do not change)
    and the first whose router gap (router_gaps' `kind`, float64) is >= min_gap at every layer
    is kept, else the candidate with the largest smallest gap. Tests on these ids compare
    (almost) every position without an expert swap from rounding anywhere upstream."""
    import torch

    m = _as_float64(model)
    k = _routers(m)[0].top_k
    n_vocab = m.config.vocab_size
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    n_threads = torch.get_num_threads()
    # one thread: these small batches run ~50x slower on 2 threads of a loaded machine
    torch.set_num_threads(1)
    try:
        for _ in range(n):
            cand = rng.integers(0, n_vocab - 1, size=n_try).tolist()
            z = _router_logits(m, [ids + [c] for c in cand])[:, :, -1]   # [L, n_try, E]
            g = _gaps(z, k, kind).min(axis=0)                            # [n_try]
            ok = np.nonzero(g >= min_gap)[0]
            ids.append(cand[int(ok[0]) if len(ok) else int(np.argmax(g))])
    finally:
        torch.set_num_threads(n_threads)
    return ids


# Router-LOGIT gap (router_gaps kind="logit") below which a position is not compared, per file
# type. Measured with llamacpp_like_model (which reproduces llama.cpp's MoE logits to ~3e-7,
# tools/check_tiny_llamacpp.py) against transformers float64 on the same rounded weights, 4 MoE
# families x 4 random 40-token sequences: the largest router-logit change was 4e-6 (f32),
# 3.8e-3 (f16) and 0.15 (q8_0: activations quantized to 8 bits per block of 32); with q8_0,
# experts swapped at logit gaps up to 0.10. These thresholds leave >= 2x (q8_0) to 250x (f32)
# margin. (A probability gap of 0.05 would be the same test only where p_(k) ~ 0.5; for
# top-4 of 8 experts it drops ~95% of random positions.)
ROUTER_LOGIT_GAP_MIN = {"f32": 1e-3, "bf16": 0.03, "f16": 0.03, "q8_0": 0.3}


def gap_mask(gaps: np.ndarray, min_gap: float, causal: bool = True) -> np.ndarray:
    """bool [n_tokens]: the positions to compare, given router_gaps [n_layer, n_tokens].

    A position is kept when its gap is >= min_gap at every layer. causal=True (default) also
    drops every position after the first one whose gap is below min_gap at a layer other than
    the last: an expert swap there changes that position's K/V in the later layers, which later
    positions attend to (measured with hf_gguf.llamacpp_like_model Q8_0 on random ids: kept
    positions after such a swap had errors up to 2.8e-2 of the largest logit, vs <= 1.1e-2
    before it). A swap in the last layer only changes its own position's logits."""
    g = np.asarray(gaps)
    keep = g.min(axis=0) >= min_gap
    if causal and g.shape[0] > 1:
        bad_early = (g[:-1] < min_gap).any(axis=0)
        if bad_early.any():
            keep[int(np.argmax(bad_early)) + 1:] = False
    return keep


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
    if (n_expert := _find(hp, ["num_local_experts", "num_experts", "n_routed_experts"])) is not None:
        w.add_expert_count(n_expert)
    if (n_used := _find(hp, ["num_experts_per_tok", "num_experts_per_token", "top_k_experts"])) is not None:
        w.add_expert_used_count(n_used)
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


def _expert_split(hf_name: str, data: np.ndarray):
    """transformers 5.x fused expert parameters -> [(converter's per-kind HF name, array)]:
    `experts.gate_up_proj` [n_expert, 2*n_ff, n_embd] is gate rows [:n_ff] then up rows [n_ff:]
    (the experts compute `linear(x, gate_up_proj[e]).chunk(2)` = gate, up), as Qwen2MoeModel's
    modify_tensors splits it; `experts.down_proj` [n_expert, n_embd, n_ff] is kept. Other names:
    [(hf_name, data)]."""
    base, _, last = hf_name.rpartition(".")
    if last == "gate_up_proj" and base.endswith(".experts"):
        n_ff = data.shape[-2] // 2
        return [(f"{base}.gate_proj.weight", data[..., :n_ff, :]), (f"{base}.up_proj.weight", data[..., n_ff:, :])]
    if last == "down_proj" and base.endswith(".experts"):
        return [(f"{base}.down_proj.weight", data)]
    return [(hf_name, data)]


def gguf_tensors(model, config, split_experts: bool = False) -> list[tuple[str, np.ndarray]]:
    """(gguf name, float32 array) in writing order, after the converter's value conversions
    (llama Q/K permute, Gemma norm +1, MoE expert split), before type conversion. Shapes are
    numpy (row-major): ffn_gate_exps / ffn_up_exps [n_expert, n_ff, n_embd] (ggml ne
    {n_embd, n_ff, n_expert}), ffn_down_exps [n_expert, n_embd, n_ff], ffn_gate_inp [n_expert,
    n_embd], ffn_gate_inp_shexp [1, n_embd] (the converter does not squeeze it: ggml {n_embd, 1}).

    split_experts=True (arch llama only): one 2-D tensor per expert, `blk.N.ffn_gate.E.weight`,
    `ffn_up.E`, `ffn_down.E`, as GGUFs converted before llama.cpp merged experts (early 2024) hold
    Mixtral."""
    arch = _arch_of(config)
    hp = config.to_dict()
    rp = _rope_parameters(hp)
    n_layer = hp["num_hidden_layers"]
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], n_layer)
    tied = bool(hp.get("tie_word_embeddings", False))
    n_head = hp["num_attention_heads"]
    n_kv = hp.get("num_key_value_heads") or n_head
    if split_experts and arch != "llama":
        raise ValueError("[hf_gguf] split_experts: only arch llama (Mixtral) had per-expert tensors")
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
        for hname, hdata in _expert_split(name, data):
            new = tmap.get_name(key=hname, try_suffixes=(".weight", ".bias"))
            if new is None:
                raise ValueError(f"[hf_gguf] cannot map tensor {hname!r}")
            if split_experts and hdata.ndim == 3:
                kind = new.split(".")[2].removesuffix("_exps")      # ffn_gate | ffn_up | ffn_down
                bid = new.split(".")[1]
                out.extend((f"blk.{bid}.{kind}.{e}.weight", np.ascontiguousarray(hdata[e]))
                           for e in range(hdata.shape[0]))
            else:
                out.append((new, np.ascontiguousarray(hdata)))
    return out


# tensors ModelBase.prepare_tensors always keeps in F32 (its list, for the names we write): the
# MoE routers. 3-D expert tensors are converted like 2-D weights (quantized row by row).
_ALWAYS_F32 = (".ffn_gate_inp.weight", ".ffn_gate_inp_shexp.weight")


def gguf_qtype(name: str, data: np.ndarray, dtype: str) -> gguf.GGMLQuantizationType:
    """ModelBase.prepare_tensors' type choice for our families."""
    if data.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight") \
            or name.endswith(_ALWAYS_F32):
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


def write_gguf(model, config, path, dtype: str = "f32", family: str | None = None,
               split_experts: bool = False, edit_tensors=None, edit_kv=None) -> Path:
    """Write `model` to `path` as llama.cpp's convert_hf_to_gguf.py --outtype `dtype` would.

    split_experts=True (Mixtral only): per-expert 2-D tensors instead of the merged 3-D ones, as
    old Mixtral GGUFs have (see gguf_tensors; current llama.cpp no longer loads those).
    For broken-file tests: edit_tensors(list of (name, float32 array)) -> new list, applied
    before type conversion; edit_kv(writer), called after every key is added (add_* again
    overwrites a key)."""
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
    if arch == "olmoe" and hp.get("rms_norm_eps") != 1e-5:
        raise ValueError("[hf_gguf] the converter writes OLMoE's rms eps as 1e-5 whatever the config says; "
                         "rms_norm_eps must be 1e-5 for the GGUF to match")
    if arch == "qwen3moe" and not hp.get("norm_topk_prob"):
        raise ValueError("[hf_gguf] llama.cpp's qwen3moe always renormalises the top-k weights; "
                         "norm_topk_prob must be True for the GGUF to match")
    if arch in ("qwen2moe", "olmoe") and hp.get("norm_topk_prob"):
        raise ValueError(f"[hf_gguf] llama.cpp's {arch} never renormalises the top-k weights; "
                         "norm_topk_prob must be False for the GGUF to match")
    path = Path(path)
    ftype = _FTYPE[dtype]
    name = f"tiny-{family or arch}"

    w = gguf.GGUFWriter(path=None, arch=arch)
    glog = logging.getLogger("gguf.gguf_writer")
    old_level = glog.level
    glog.setLevel(logging.ERROR)  # Gemma3Model re-adds base keys on purpose ("Duplicated key" warnings)
    try:
        # prepare_tensors
        tensors = gguf_tensors(model, config, split_experts=split_experts)
        if edit_tensors is not None:
            tensors = edit_tensors(tensors)
        for tname, data in tensors:
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
        elif arch in ("qwen2moe", "qwen3moe"):    # Qwen2MoeModel (Qwen3MoeModel inherits it)
            if (v := hp.get("moe_intermediate_size")) is not None:
                w.add_expert_feed_forward_length(v)
            if (v := hp.get("shared_expert_intermediate_size")) is not None:
                w.add_expert_shared_feed_forward_length(v)
        elif arch == "olmoe":
            w.add_layer_norm_rms_eps(1e-5)        # OlmoeModel.set_gguf_parameters, unconditionally
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
        if edit_kv is not None:
            edit_kv(w)
    finally:
        glog.setLevel(old_level)
    w.write_header_to_file(path=path)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tensor_map(config):
    return gguf.get_tensor_name_map(gguf.MODEL_ARCH[_arch_of(config).upper()], config.num_hidden_layers)


def _qtype_of_param(tmap, name: str, data: np.ndarray, dtype: str) -> gguf.GGMLQuantizationType:
    """The GGML type the GGUF tensor of HF parameter `name` gets for `dtype` (a fused
    gate_up_proj: that of its gate half; gate and up always agree)."""
    hname, hdata = _expert_split(name, data)[0]
    new = tmap.get_name(key=hname, try_suffixes=(".weight", ".bias"))
    if new is None:
        raise ValueError(f"[hf_gguf] cannot map tensor {hname!r}")
    return convert_tensor(new, hdata, dtype)[1]


def roundtrip_model(model, config, dtype: str):
    """A deep copy of `model` whose weights went through the GGUF type of `dtype` and back
    (F16 rounding, Q8_0 quantization), so a runtime reading the GGUF can be compared to it
    without the weight-rounding error. Norms, biases and MoE routers are untouched (F32 in the
    file). Fused 3-D experts round row by row, as their GGUF tensors do."""
    import torch

    m2 = copy.deepcopy(model)
    tmap = _tensor_map(config)
    with torch.no_grad():
        for name, p in m2.named_parameters():
            data = p.detach().numpy().astype(np.float32)
            qt = _qtype_of_param(tmap, name, data, dtype)
            if qt == gguf.GGMLQuantizationType.F32:
                continue
            # quantization is row-wise (along the last axis), so a row permutation (llama Q/K)
            # and the gate/up split of a fused expert tensor commute with it
            back = gguf.quants.dequantize(gguf.quants.quantize(data, qt), qt).astype(np.float32)
            p.copy_(torch.from_numpy(back.reshape(data.shape)))
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


def _rounder(qt):
    # (BF16 weights: ggml rounds activations to bf16; not emulated, as before)
    return {gguf.GGMLQuantizationType.F16: _round_act_f16, gguf.GGMLQuantizationType.Q8_0: _round_act_q8_0}.get(qt)


def _experts_forward_rounded(experts, rnd_gate_up, rnd_down):
    """A forward for transformers 5.x fused experts (Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE
    share it) that rounds the matmul inputs as ggml's mul_mat_id does: x before gate_up, the
    SwiGLU output before down."""
    import torch
    import torch.nn.functional as F

    def forward(hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        xr = rnd_gate_up(hidden_states) if rnd_gate_up else hidden_states
        for e in range(experts.num_experts):
            tok, pos = torch.where(top_k_index == e)
            if len(tok) == 0:
                continue
            gate, up = F.linear(xr[tok], experts.gate_up_proj[e]).chunk(2, dim=-1)
            h = experts.act_fn(gate) * up
            if rnd_down:
                h = rnd_down(h)
            h = F.linear(h, experts.down_proj[e]) * top_k_weights[tok, pos, None]
            out.index_add_(0, tok, h.to(out.dtype))
        return out

    return forward


def llamacpp_like_model(model, config, dtype: str):
    """roundtrip_model plus the roundings llama.cpp's CPU backend adds, for tight comparisons:
    matmul inputs rounded to F16 (F16 weights) or quantized to Q8_0 (Q8_0 weights), as ggml's
    vec_dot_type does (not for F32 tensors: MoE routers, Qwen2-MoE's shared-expert gate);
    MoE experts likewise (x before gate/up, the SwiGLU output before down); Gemma's GELU through
    ggml's f16 lookup table. Not emulated: the f16 KV cache (use an f32 cache on the llama.cpp
    side) and summation order."""
    import torch

    m2 = roundtrip_model(model, config, dtype)
    tmap = _tensor_map(config)
    # by parameter identity: a tied lm_head has no name of its own in named_parameters()
    qtypes = {id(p): _qtype_of_param(tmap, name, p.detach().numpy(), dtype)
              for name, p in m2.named_parameters()}
    for mod in m2.modules():
        if isinstance(mod, torch.nn.Linear):
            rnd = _rounder(qtypes[id(mod.weight)])
            if rnd is not None:
                mod.register_forward_pre_hook(lambda _m, args, rnd=rnd: (rnd(args[0]),) + tuple(args[1:]))
        elif isinstance(getattr(mod, "gate_up_proj", None), torch.nn.Parameter) and hasattr(mod, "down_proj"):
            r1 = _rounder(qtypes[id(mod.gate_up_proj)])
            r2 = _rounder(qtypes[id(mod.down_proj)])
            if r1 is not None or r2 is not None:
                mod.forward = _experts_forward_rounded(mod, r1, r2)
    if _arch_of(config) == "gemma3":
        for layer in m2.model.layers:
            layer.mlp.act_fn = gelu_f16_table()
    return m2
