"""Teacher-forced logits of every position (like a Hugging Face forward pass), and the
perplexity of a short text computed from them.

    python examples/teacher_forced_logits.py [MODEL]
"""
import sys

import numpy as np

from llmrt import Model

model = Model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct")
text = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog."
ids = model.tokenizer.encode(text)
logits = model(ids)                                   # [len(ids), n_vocab] float32
logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
nll = -logp[np.arange(len(ids) - 1), ids[1:]]
print(f"{len(ids)} tokens, logits {logits.shape}, perplexity {np.exp(nll.mean()):.3f}")
print("second half (a repeat) is far more predictable:",
      f"{np.exp(nll[: len(nll) // 2].mean()):.2f} -> {np.exp(nll[len(nll) // 2:].mean()):.2f}")
