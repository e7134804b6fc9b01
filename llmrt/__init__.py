"""llmrt — a llama.cpp-compatible LLM inference runtime for CPUs with a Streaming-LLM KV cache."""
from llmrt.errors import ModelFormatError
from llmrt import runtime  # noqa: F401  (probes the CPU once, picks kernels, warns about LLMRT_ISA)

__version__ = "0.1.0"

__all__ = ["ModelFormatError", "__version__"]
