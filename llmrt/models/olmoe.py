"""OLMoE (general.architecture = "olmoe"): the llama graph with RMS norm over the WHOLE Q and K
projections (not per head) before NeoX RoPE, and a mixture-of-experts FFN in every layer:
softmax router, top-k not renormalised (norm_topk_prob = false), no shared expert (moe.py)."""
from llmrt.models import llama
from llmrt.models.common import ROPE_NEOX

can_shift = True


class HParams(llama.HParams):
    @classmethod
    def from_gguf(cls, f):
        return super().from_gguf(f, rope_mode=ROPE_NEOX, qk_norm_full=True, expert_norm=False, moe_only=True)


required_tensors = llama.required_tensors
build_graph = llama.build_graph
