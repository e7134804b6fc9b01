"""Gemma 3, text (general.architecture = "gemma3").

    x = token_embd[tokens] * sqrt(n_embd)
    for each layer (5 local sliding-window layers, then 1 global, repeating):
        h = rms_norm(x) * attn_norm                         # GGUF norm weights already hold 1 + w
        q, k, v = Wq h, Wk h, Wv h                          # [head_dim, n_head(_kv), n]
        q = rope(rms_norm(q) * q_norm) * attn_scale         # NeoX pairs; base 10000 on local
        k = rope(rms_norm(k) * k_norm)                      #   layers, rope.freq_base on global
        a = rms_norm(Wo attention(q, k, v)) * attn_post_norm # local layers: window n_swa
        x = x + a
        h = rms_norm(x) * ffn_norm
        x = x + rms_norm(W_down (gelu(W_gate h) * W_up h)) * ffn_post_norm
    logits = token_embd^T (rms_norm(x) * output_norm)

As llama.cpp (llm_build_gemma3_iswa): attention scale 1/sqrt(head_dim) applied to Q, no final
logit soft-capping in the sliding-window build.
"""
import math
from dataclasses import dataclass

from llmrt.models.common import ROPE_NEOX, DecoderHParams, out_rows_cap, read_base_hparams, read_rope

can_shift = True

SWA_PATTERN = 6              # llama.cpp: hparams.set_swa_pattern(6): every 6th layer is global
ROPE_FREQ_BASE_LOCAL = 10000.0


@dataclass
class HParams(DecoderHParams):
    n_swa: int = 0
    rope_freq_base_swa: float = ROPE_FREQ_BASE_LOCAL
    final_logit_softcap: float = 0.0

    @classmethod
    def from_gguf(cls, f):
        r, base, n_rot = read_base_hparams(f, default_eps=1e-6, default_ctx=32768)
        n_embd, n_head = base["n_embd"], base["n_head"]
        return cls(
            **base,
            rope=read_rope(r, n_rot, ROPE_NEOX, base["n_ctx_train"]),
            # llama.cpp: 27B (62 layers) uses 1/sqrt(n_embd / n_head), the others 1/sqrt(head_dim)
            attn_scale=1.0 / math.sqrt(n_embd / n_head if base["n_layer"] == 62 else base["head_dim_k"]),
            n_swa=r.get("attention.sliding_window", 0, kind=int),
            # newer converters write the local layers' base; llama.cpp's default is 10000
            rope_freq_base_swa=r.get("rope.freq_base_swa", ROPE_FREQ_BASE_LOCAL),
        )

    def is_swa(self, il):
        return self.n_swa > 0 and (il % SWA_PATTERN) < SWA_PATTERN - 1


def required_tensors(hp):
    names = ["token_embd.weight", "output_norm.weight"]
    if not hp.tied_output:
        names.append("output.weight")
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        names += [b + n for n in (
            "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
            "attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight",
            "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "post_ffw_norm.weight")]
    return names


def build_graph(g, hp: HParams, w, cache, all_logits: bool):
    tok = g.input_tokens()                                        # [n]
    pos = g.input_positions()                                     # [n]
    x = g.scale(g.get_rows(w("token_embd.weight"), tok), math.sqrt(hp.n_embd))   # [n_embd, n]
    rp = hp.rope
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        local = hp.is_swa(il)
        rope_kw = rp.kwargs(freq_base=hp.rope_freq_base_swa, freq_scale=1.0) if local else rp.kwargs()

        h = g.mul(g.rms_norm(x, hp.norm_eps), w(b + "attn_norm.weight"))
        q = g.reshape(g.mul_mat(w(b + "attn_q.weight"), h), (hp.head_dim_k, hp.n_head))
        k = g.reshape(g.mul_mat(w(b + "attn_k.weight"), h), (hp.head_dim_k, hp.n_head_kv))
        v = g.reshape(g.mul_mat(w(b + "attn_v.weight"), h), (hp.head_dim_v, hp.n_head_kv))
        q = g.mul(g.rms_norm(q, hp.norm_eps), w(b + "attn_q_norm.weight"))
        q = g.rope(q, pos, rp.n_rot, rp.mode, **rope_kw)
        k = g.mul(g.rms_norm(k, hp.norm_eps), w(b + "attn_k_norm.weight"))
        k = g.rope(k, pos, rp.n_rot, rp.mode, **rope_kw)
        q = g.scale(q, hp.attn_scale)
        a = g.attention(q, k, v, cache, il, 1.0, n_swa=hp.n_swa if local else 0)
        a = g.mul_mat(w(b + "attn_output.weight"), a)
        a = g.mul(g.rms_norm(a, hp.norm_eps), w(b + "post_attention_norm.weight"))
        x = g.add(a, x)

        h = g.mul(g.rms_norm(x, hp.norm_eps), w(b + "ffn_norm.weight"))
        f = g.glu(g.mul_mat(w(b + "ffn_gate.weight"), h), g.mul_mat(w(b + "ffn_up.weight"), h), "gelu")
        f = g.mul_mat(w(b + "ffn_down.weight"), f)
        f = g.mul(g.rms_norm(f, hp.norm_eps), w(b + "post_ffw_norm.weight"))
        x = g.add(f, x)

    if all_logits is not True:
        x = g.get_rows_f32(x, g.input_out_rows(out_rows_cap(all_logits)))
    x = g.mul(g.rms_norm(x, hp.norm_eps), w("output_norm.weight"))
    out = w("token_embd.weight") if hp.tied_output else w("output.weight")
    logits = g.mul_mat(out, x)
    if hp.final_logit_softcap > 0:
        logits = g.softcap(logits, hp.final_logit_softcap)
    g.set_output(logits)
