"""Qwen2-MoE / Qwen1.5-MoE (general.architecture = "qwen2moe"): the Qwen 2 graph (Q/K/V biases,
NeoX RoPE) with a mixture-of-experts FFN in every layer: softmax router, top-k NOT renormalised,
plus a shared expert scaled by sigmoid(ffn_gate_inp_shexp · h) (moe.py)."""
from llmrt.models import llama
from llmrt.models.common import ROPE_NEOX

can_shift = True


class HParams(llama.HParams):
    @classmethod
    def from_gguf(cls, f):
        return super().from_gguf(f, rope_mode=ROPE_NEOX, qkv_bias=True, expert_norm=False, moe_only=True)


required_tensors = llama.required_tensors
build_graph = llama.build_graph
