"""Qwen3-MoE (general.architecture = "qwen3moe"): the Qwen 3 graph (per-head Q/K RMS norm, NeoX
RoPE, no biases) with a mixture-of-experts FFN in every layer: softmax router, top-k
renormalised (norm_topk_prob, which llama.cpp always applies for this architecture), no shared
expert (moe.py)."""
from llmrt.models import llama
from llmrt.models.common import ROPE_NEOX

can_shift = True


class HParams(llama.HParams):
    @classmethod
    def from_gguf(cls, f):
        return super().from_gguf(f, rope_mode=ROPE_NEOX, qk_norm=True, expert_norm=True, moe_only=True)


required_tensors = llama.required_tensors
build_graph = llama.build_graph
