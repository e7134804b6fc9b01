#!/usr/bin/env python3
"""Perplexity from Python: llama-perplexity's protocol, then the same text streamed through a
small cache that evicts as it goes (StreamingLLM's evaluation), with and without sinks.

    python examples/perplexity.py [MODEL] [TEXT]      (defaults: smollm2-135m-instruct, tests/data/ppl_text.txt)

The CLI does the same: `llmrt perplexity MODEL -f TEXT -c 128 [--kv-mode shift --n-keep 4]`.
"""
import sys
from pathlib import Path

from llmrt import Model
from llmrt.perplexity import perplexity, read_text

model_name = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct"
text_path = sys.argv[2] if len(sys.argv) > 2 else Path(__file__).parent.parent / "tests" / "data" / "ppl_text.txt"

model = Model(model_name, n_threads=2, ctx_size=128)
ids = model.tokenizer.encode(read_text(text_path))     # BOS first when the model adds one
print(f"{len(ids)} tokens")

# llama-perplexity: chunks of 128 tokens from an empty cache, NLL over each chunk's second half
r = perplexity(model, ids, ctx_size=128, max_tokens=1024)
print(f"dense     ppl {r.ppl:8.3f} +/- {r.ppl_err:.3f} over {r.n_tokens} tokens ({r.n_chunks} chunks)")

# streamed through a 64-cell cache, 8 tokens per eval: with 4 sinks, then with none
for mode, n_keep in [("shift", 4), ("window", 0)]:
    r = perplexity(model, ids, ctx_size=64, kv_mode=mode, n_keep=n_keep, batch=8, max_tokens=512)
    print(f"{mode:9s} ppl {r.ppl:8.3f} over {r.n_tokens} tokens, n_keep {r.n_keep}, "
          f"{r.n_evicted} tokens evicted on the way")
