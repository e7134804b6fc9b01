"""Generate with a streamer: text appears as it is produced, whole UTF-8 characters only.

    python examples/generate_streamer.py [MODEL] ["prompt"]

MODEL is a GGUF path or a known short name (default: smollm2-135m-instruct, fetched on first use).
"""
import sys

from llmrt import Model, TextStreamer

model = Model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct", ctx_size=512)
prompt = sys.argv[2] if len(sys.argv) > 2 else "Once upon a time, in a small village,"
ids = model.tokenizer.encode(prompt)
out = model.generate(ids, streamer=TextStreamer(model.tokenizer), max_new_tokens=64,
                     temperature=0.7, seed=42, stop=["\n\n"])
print(f"\n[{len(out) - len(ids)} new tokens]")
