"""GGUF block formats from Python: quantize a float row to Q4_0/Q8_0/Q4_K..., dequantize it back,
and see the error. Same bytes as llama.cpp's reference quantizers.

    python examples/quants_roundtrip.py
"""
import numpy as np

from llmrt import quants, runtime

x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
print(f"ISA level: {runtime.isa()}")
for qtype in ["Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q2_K", "IQ4_NL"]:
    raw = quants.quantize(x, qtype)                  # uint8 [4, row bytes]
    y = quants.dequantize(raw, qtype)                # float32 [4, 256]
    bpw = 8 * raw.shape[-1] / x.shape[-1]
    rmse = float(np.sqrt(np.mean((x - y) ** 2)))
    print(f"{qtype:7s} {bpw:5.2f} bits/weight  rmse {rmse:.4f}")
