"""llama-bench's two tests from Python: prompt processing (pp) and decoding (tg) speed, and how
close decoding comes to the memory-bandwidth bound, and where the time goes (profile=True: every
graph node timed, summed by op), and decoding at a depth (a cache already holding 512 tokens). The
CLI does the same: `llmrt bench MODEL --profile`, `llmrt bench MODEL -d 512`.

    python examples/benchmark.py [MODEL] [THREADS]
"""
import sys

from llmrt import Model, bench

model = Model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct",
              n_threads=int(sys.argv[2]) if len(sys.argv) > 2 else None)
results = bench.run(model, n_prompt=128, n_gen=32, reps=3, profile=True)
for r in results:
    print(f"{r.test}: {r.t_s:.1f} ± {r.t_s_sd:.1f} tokens/s ({r.n_threads} threads, {r.isa})")
    for d in r.profile[:3]:                     # the three ops that take longest
        print(f"    {d['op']} {d['type']}: {d['ms_per_run']:.2f} ms per run")
# the same decoding deep into a conversation: 512 tokens already in the cache (llama-bench -d 512);
# attention now reads them for every new token
deep = bench.run(model, n_prompt=0, n_gen=32, reps=3, n_depth=512)[0]
print(f"{deep.test}: {deep.t_s:.1f} ± {deep.t_s_sd:.1f} tokens/s")
b = bench.bandwidth_bound(model)
print(f"decode bound: {b['weight_bytes_per_token'] / 1e6:.0f} MB of weights per token at "
      f"{b['read_bandwidth_gb_s']:.1f} GB/s = {b['tg_bound_t_s']:.0f} tokens/s")
