"""llmrt — a llama.cpp-compatible LLM inference runtime for CPUs with a Streaming-LLM KV cache."""
from llmrt.errors import ModelFormatError

__version__ = "0.1.0"

__all__ = ["ModelFormatError", "__version__"]
