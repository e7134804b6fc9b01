"""Qwen 3 (general.architecture = "qwen3"): the llama graph with per-head RMS norm on Q and K
(before RoPE) and NeoX RoPE; no biases."""
from llmrt.models import llama
from llmrt.models.common import ROPE_NEOX

can_shift = True


class HParams(llama.HParams):
    @classmethod
    def from_gguf(cls, f):
        return super().from_gguf(f, rope_mode=ROPE_NEOX, qk_norm=True)


required_tensors = llama.required_tensors
build_graph = llama.build_graph
