"""int4 rounding search speed and error on real F16 weights (csrc/wquant.c via llmrt.wquant).

    python benchmarks/wquant_speed.py [save.json] [baseline.json]

Rows 0..191 of the 2-D matmul weights of blocks 0, 5, 11 (+ output / non-block tensors) of
SmolLM2 135M F16 and Gemma 3 270M F16; per (scheme, group): elements/s of the search (process CPU
time of the single-threaded C call), MSE of the dequantized values, its ratio to min/max, and with
a baseline json the speedup and MSE ratio against it.
"""
import json, sys, time
import numpy as np, gguf
from llmrt import wquant
ids = {("sym"): 2, ("asym"): 3}  # Q4_0, Q4_1
MODELS = ["/work/models/smollm2-135m-f16.gguf", "/work/models/gemma3-270m-f16.gguf"]
ROWS = 192
tensors = []
for path in MODELS:
    r = gguf.GGUFReader(path)
    for t in r.tensors:
        if len(t.shape) != 2 or not t.name.endswith(".weight") or t.name.startswith("token_embd"):
            continue
        blk = t.name.split(".")
        if blk[0] == "blk" and int(blk[1]) not in (0, 5, 11):
            continue
        a = np.asarray(t.data).astype(np.float32)
        a = a.reshape(-1, a.shape[-1])[:ROWS].copy()
        tensors.append((path.split("/")[-1] + ":" + t.name, a))
nel = sum(a.size for _, a in tensors)
print(len(tensors), "tensors", nel, "elements", file=sys.stderr)

def deq(b, layout, k):
    rows = b.shape[0]
    if layout == 2:
        bl = b.reshape(rows, -1, 18)
        d = bl[:, :, :2].copy().view(np.float16).astype(np.float32)
        m = np.zeros_like(d); qs = bl[:, :, 2:]; off = 8
    else:
        bl = b.reshape(rows, -1, 20)
        d = bl[:, :, :2].copy().view(np.float16).astype(np.float32)
        m = bl[:, :, 2:4].copy().view(np.float16).astype(np.float32); qs = bl[:, :, 4:]; off = 0
    q = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.float32) - off
    return (q * d + m).reshape(rows, k)

res = {}
for scheme in ("asym", "sym"):
    for group in (32, 128):
        tid = ids[scheme]
        t_s = 0.0; se = 0.0; se_mm = 0.0
        for name, a in tensors:
            t0 = time.process_time()
            b = wquant.quantize_tensor(a, tid, group, "search")
            t_s += time.process_time() - t0
            se += float(((deq(b, tid, a.shape[1]) - a).astype(np.float64) ** 2).sum())
            bm = wquant.quantize_tensor(a, tid, group, "minmax")
            se_mm += float(((deq(bm, tid, a.shape[1]) - a).astype(np.float64) ** 2).sum())
        key = f"{scheme} g{group}"
        res[key] = dict(mse=se / nel, mse_mm=se_mm / nel, Mel_s=nel / t_s / 1e6)
base = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else None
for k, v in res.items():
    line = f"{k:10s} {v['Mel_s']:7.2f} Mel/s  mse {v['mse']:.4e}  vs minmax {v['mse']/v['mse_mm']:.4f}"
    if base:
        line += f"  | speedup {v['Mel_s']/base[k]['Mel_s']:.2f}x  mse ratio vs base {v['mse']/base[k]['mse']:.5f}"
    print(line)
if len(sys.argv) > 1 and sys.argv[1] != "-":
    json.dump(res, open(sys.argv[1], "w"), indent=1)
