"""Generate with a mixture-of-experts model: top-k routing per token, a streaming cache, and what
one token reads (only the experts it chose).

    python examples/moe_generate.py [MODEL] ["prompt"]

MODEL: a MoE GGUF as llama.cpp writes them (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE). Default: the
synthetic Qwen3-MoE of the benchmark set (dim 1024, 48 experts, top-4; random weights, so the text
is noise: the point is the machinery), built on first use by benchmarks/make_models.py (about a
minute, no download).
"""
import os
import subprocess
import sys
import time

from llmrt import Model, TextStreamer
from llmrt.bench import weight_bytes_per_token

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.expanduser("~/.cache/llmrt/synthetic/synthetic-moe-0.5b-q4_0.gguf")

path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
if path == DEFAULT and not os.path.exists(path):
    subprocess.run([sys.executable, os.path.join(HERE, "..", "benchmarks", "make_models.py"),
                    "--sizes", "moe-0.5b", "--types", "q4_0"], check=True)
model = Model(path, ctx_size=64)
hp = model.hparams
total = sum(t.nbytes for t in model.gguf.tensors.values())
print(f"{model.arch}: {hp.n_layer} layers, {hp.n_expert} experts of ffn {hp.n_ff_exp}, "
      f"{hp.n_expert_used} used per token" + (f", shared expert ffn {hp.n_ff_shexp}" if hp.n_ff_shexp else ""))
print(f"weights {total / 1e6:.0f} MB; one decoded token reads {weight_bytes_per_token(model) / 1e6:.0f} MB")

prompt = sys.argv[2] if len(sys.argv) > 2 else "The experts of this model"
ids = model.tokenizer.encode(prompt)
t0 = time.perf_counter()
# 32 cells, 4 sinks: the 96 new tokens stream through the cache with a shift every ~14 tokens
sess = model.new_session(ctx_size=32, n_keep=4)
out = model.generate(ids, streamer=TextStreamer(model.tokenizer), max_new_tokens=96, temperature=0.7,
                     seed=1, ignore_eos=True, session=sess)
dt = time.perf_counter() - t0
print(f"\n[{len(out) - len(ids)} tokens in {dt:.2f} s; {sess.n_shifts} cache shifts, "
      f"{sess.n_past} tokens in the cache]")
