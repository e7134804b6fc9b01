"""Unbounded generation in a small streaming KV cache: 1000 tokens through a cache of 100.

When the cache is full, the tokens right after the 4 pinned "attention sinks" are evicted (half
of the unpinned ones) and the surviving keys are shift-RoPEd to their new positions; nothing is
recomputed and memory stays flat (StreamingLLM).

    python examples/streaming_generate.py [MODEL] ["prompt"]

MODEL is a GGUF path or a known short name (default: smollm2-135m-instruct, fetched on first use).
"""
import sys

from llmrt import Model, TextStreamer

model = Model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct")
prompt = sys.argv[2] if len(sys.argv) > 2 else "Once upon a time, in a small village,"
ids = model.tokenizer.encode(prompt)
sess = model.new_session(ctx_size=100, n_keep=4, n_discard=-1, kv_mode="shift")
out = model.generate(ids, streamer=TextStreamer(model.tokenizer), max_new_tokens=1000,
                     ignore_eos=True, temperature=0.7, repeat_penalty=1.1, seed=42, session=sess)
print(f"\n[{len(out) - len(ids)} new tokens; cache {sess.n_past}/{sess.n_ctx} tokens, "
      f"{sess.n_evicted} evicted in {sess.n_shifts} shifts, {sess.cache.nbytes / 1024:.0f} KiB]")
