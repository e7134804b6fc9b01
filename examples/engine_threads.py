"""Several generation streams on one Model at once, from Python threads: the engine decodes them
together (one graph run per step for all of them), each in its own streaming cache.

    python examples/engine_threads.py [MODEL]

MODEL: a GGUF path or a known name (default: SmolLM2-135M-Instruct, fetched on first use).
"""
import sys
import threading
import time

from llmrt import Engine, Model

model = Model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct")
prompts = ["The three primary colors are", "A good name for a cat is", "def add(a, b):",
           "The tallest mountain on Earth is"]

with Engine(model, n_parallel=4, ctx_size=256, n_keep=4) as engine:
    # alone, one after another
    t0 = time.perf_counter()
    alone = [engine.generate(p, max_tokens=48, temperature=0).text for p in prompts]
    t_alone = time.perf_counter() - t0

    # the same requests from 4 threads at once: batched, same greedy answers
    together = [None] * len(prompts)

    def run(i):
        together[i] = engine.generate(prompts[i], max_tokens=48, temperature=0).text
    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t_together = time.perf_counter() - t0

    # streaming text from a request as it is generated
    req = engine.submit("Once upon a time", max_tokens=40, temperature=0.8, seed=3)
    for piece in req:
        print(piece, end="", flush=True)
    print(f"\n[{req.finish_reason}; usage {req.usage}]")

for p, a, b in zip(prompts, alone, together):
    print(f"{p!r} -> {b.strip()[:60]!r}" + ("" if a == b else "  (differs from alone!)"))
print(f"one by one {t_alone:.2f} s, 4 threads at once {t_together:.2f} s "
      f"({t_alone / t_together:.2f}x)")
