"""Qwen 2 / 2.5 (general.architecture = "qwen2"): the llama graph with Q/K/V biases and NeoX RoPE."""
from llmrt.models import llama
from llmrt.models.common import ROPE_NEOX

can_shift = True


class HParams(llama.HParams):
    @classmethod
    def from_gguf(cls, f):
        return super().from_gguf(f, rope_mode=ROPE_NEOX, qkv_bias=True)


required_tensors = llama.required_tensors
build_graph = llama.build_graph
