"""llmrt — a llama.cpp-compatible LLM inference runtime for CPUs with a Streaming-LLM KV cache.

    from llmrt import Model, TextStreamer
    model = Model("smollm2-135m-instruct")
    model.generate("Once upon a time", streamer=TextStreamer(model.tokenizer), max_new_tokens=64)
"""
from llmrt.errors import ModelFormatError
from llmrt import runtime  # noqa: F401  (probes the CPU once, picks kernels, warns about LLMRT_ISA)
from llmrt.model import Model, Session
from llmrt.streamers import TextIteratorStreamer, TextStreamer
from llmrt.chat import ChatSession
from llmrt.engine import Engine

__version__ = "0.1.0"

__all__ = ["ModelFormatError", "Model", "Session", "Engine", "TextStreamer", "TextIteratorStreamer",
           "ChatSession", "__version__"]
