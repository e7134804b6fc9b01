"""Llama family: Llama 2/3, TinyLlama, SmolLM, Mistral (general.architecture = "llama").

    tokens ─► token_embd ─► x
    for each layer:
        h = rms_norm(x) * attn_norm
        q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv)      # [head_dim, n_head(_kv), n]
        (q, k = rms_norm per head * q_norm / k_norm)       # Qwen 3
        q, k = rope(q, pos), rope(k, pos)                  # pairs (2i, 2i+1) for llama
        x = x + Wo attention(q, k, v; cache)               # causal, grouped-query heads
        h = rms_norm(x) * ffn_norm
        x = x + W_down (silu(W_gate h) * W_up h)           # or a mixture of experts (moe.py)
    logits = output(rms_norm(x) * output_norm)              # output tied to token_embd if absent

Mixtral is this family with experts (`llama.expert_count`; softmax router, top-k renormalised).
Qwen 2 / 3, their MoE versions and OLMoE reuse this file with their own options (qwen2.py,
qwen3.py, qwen2moe.py, qwen3moe.py, olmoe.py).
Note on Q/K: llama.cpp's converter permutes Wq/Wk rows of Hugging Face Llama checkpoints into the
interleaved-pair layout, so rope mode NORM here matches HF's rotate-half on the original weights.
"""
import math
from dataclasses import dataclass

from llmrt.models import moe
from llmrt.models.common import ROPE_NORM, DecoderHParams, out_rows_cap, read_base_hparams, read_rope

can_shift = True  # RoPE only on Q/K: cached keys can be re-rotated


@dataclass
class HParams(DecoderHParams):
    qk_norm: bool = False
    qk_norm_full: bool = False     # OLMoE: q/k RMS norm over the whole projection, not per head
    qkv_bias: bool = False
    n_swa: int = 0
    n_expert: int = 0              # mixture of experts (moe.py); 0: a dense FFN
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0            # Qwen2-MoE's shared expert (0: none)
    expert_norm: bool = True       # renormalise the chosen experts' weights to sum 1

    rope_mode = ROPE_NORM

    @classmethod
    def from_gguf(cls, f, rope_mode=ROPE_NORM, qk_norm=False, qkv_bias=False, expert_norm=True,
                  qk_norm_full=False, moe_only=False):
        r, base, n_rot = read_base_hparams(f, default_eps=1e-5, default_ctx=4096)
        return cls(**base, rope=read_rope(r, n_rot, rope_mode, base["n_ctx_train"]),
                   attn_scale=1.0 / math.sqrt(base["head_dim_k"]), qk_norm=qk_norm or qk_norm_full,
                   qk_norm_full=qk_norm_full, qkv_bias=qkv_bias,
                   **moe.read_moe_hparams(r, f, base, norm=expert_norm, required=moe_only))

    def tensor_shapes(self):
        """Per-layer tensor suffix -> shape, beyond the ones every family has (Model checks)."""
        shapes = moe.tensor_shapes(self) if self.n_expert else {}
        if self.qk_norm_full:
            shapes.update({"attn_q_norm.weight": (self.n_head * self.head_dim_k,),
                           "attn_k_norm.weight": (self.n_head_kv * self.head_dim_k,)})
        return shapes

    def split_expert_weights(self, f, replaced=None):
        """Old Mixtral files' per-expert tensors merged (moe.stack_split_experts)."""
        return moe.stack_split_experts(f, self, replaced)


def required_tensors(hp):
    names = ["token_embd.weight", "output_norm.weight"]
    if not hp.tied_output:
        names.append("output.weight")
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        names += [b + n for n in ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                                  "attn_output.weight", "ffn_norm.weight")]
        if hp.n_expert:
            names += moe.required_tensors(hp, b)
        else:
            names += [b + "ffn_gate.weight", b + "ffn_up.weight", b + "ffn_down.weight"]
        if hp.qkv_bias:
            names += [b + "attn_q.bias", b + "attn_k.bias", b + "attn_v.bias"]
        if hp.qk_norm:
            names += [b + "attn_q_norm.weight", b + "attn_k_norm.weight"]
    return names


def _linear(g, w, name, x):
    y = g.mul_mat(w(name + ".weight"), x)
    if w.has(name + ".bias"):
        y = g.add(y, w(name + ".bias"))
    return y


def build_graph(g, hp: HParams, w, cache, all_logits: bool):
    """Build the forward pass on graph `g`; output: logits [n_vocab, n] or [n_vocab, 1]."""
    tok = g.input_tokens()                                       # [n]
    pos = g.input_positions()                                    # [n]
    x = g.get_rows(w("token_embd.weight"), tok)                  # [n_embd, n]
    freq_factors = w("rope_freqs.weight") if w.has("rope_freqs.weight") else None

    for il in range(hp.n_layer):
        b = f"blk.{il}."
        h = g.mul(g.rms_norm(x, hp.norm_eps), w(b + "attn_norm.weight"))
        q = _linear(g, w, b + "attn_q", h)                       # [hd * n_head, n]
        k = _linear(g, w, b + "attn_k", h)                       # [hd * n_head_kv, n]
        v = _linear(g, w, b + "attn_v", h)
        if hp.qk_norm_full:                                      # OLMoE
            q = g.mul(g.rms_norm(q, hp.norm_eps), w(b + "attn_q_norm.weight"))
            k = g.mul(g.rms_norm(k, hp.norm_eps), w(b + "attn_k_norm.weight"))
        q = g.reshape(q, (hp.head_dim_k, hp.n_head))             # [hd, n_head, n]
        k = g.reshape(k, (hp.head_dim_k, hp.n_head_kv))
        v = g.reshape(v, (hp.head_dim_v, hp.n_head_kv))
        if hp.qk_norm and not hp.qk_norm_full:
            q = g.mul(g.rms_norm(q, hp.norm_eps), w(b + "attn_q_norm.weight"))
            k = g.mul(g.rms_norm(k, hp.norm_eps), w(b + "attn_k_norm.weight"))
        rp = hp.rope_for_layer(il)
        q = g.rope(q, pos, rp.n_rot, rp.mode, freq_factors=freq_factors, **rp.kwargs())
        k = g.rope(k, pos, rp.n_rot, rp.mode, freq_factors=freq_factors, **rp.kwargs())
        a = g.attention(q, k, v, cache, il, hp.attn_scale, n_swa=hp.n_swa)   # [hd_v * n_head, n]
        x = g.add(x, g.mul_mat(w(b + "attn_output.weight"), a))

        h = g.mul(g.rms_norm(x, hp.norm_eps), w(b + "ffn_norm.weight"))
        if hp.n_expert:
            x = g.add(x, moe.moe_ffn(g, hp, w, b, h))
        else:
            f = g.glu(g.mul_mat(w(b + "ffn_gate.weight"), h), g.mul_mat(w(b + "ffn_up.weight"), h), "silu")
            x = g.add(x, g.mul_mat(w(b + "ffn_down.weight"), f))

    if all_logits is not True:
        x = g.get_rows_f32(x, g.input_out_rows(out_rows_cap(all_logits)))   # [n_embd, n_out]
    x = g.mul(g.rms_norm(x, hp.norm_eps), w("output_norm.weight"))
    out = w("token_embd.weight") if hp.tied_output else w("output.weight")
    g.set_output(g.mul_mat(out, x))                              # [n_vocab, n_out]
