"""Weight-only quantization: an F16 model quantized at load (neural-speed's knobs), and
`llmrt quantize` writing a q4_0 file llama.cpp reads as its own.

    python examples/quantize_at_load.py [model.gguf]

No F16 model can be downloaded here, so the default makes one: SmolLM2-135M-Instruct dequantized
to F16 (llmrt.quantize.float_file, as tools/make_f16.py). Its projections sit on the Q4_1 grid
they came from (int4 asym group 32 with the rounding search finds that grid again; by default the
search weighs each column by E[a^2] from a short calibration pass, rounding="imatrix"); its tied
output head was Q8_0: under int4 the head is kept int8 by default (as llama.cpp keeps it at
Q6_K / Q8_0), quantize_output=True makes it int4 too, which costs most of int4's error here.
rounding="search" skips the calibration pass (unweighted search); rounding="minmax" gives
ggml's reference quantizer instead of the search (group 32: the bytes of
`llmrt quantize ... q4_0 / q4_1`).
"""
import os
import sys
import tempfile

import numpy as np

from llmrt import Model
from llmrt.quantize import float_file, quantize_file

tmp = tempfile.mkdtemp()
if len(sys.argv) > 1:
    f16 = sys.argv[1]
else:
    f16 = os.path.join(tmp, "smollm2-f16.gguf")
    float_file(Model("smollm2-135m-instruct").path, f16, "F16")

ids = Model(f16, n_threads=2).tokenizer.encode("The capital of France is Paris. The capital of Italy is")
ref = Model(f16, n_threads=2)(ids)
for kw in [dict(weight_dtype="int8"),                                  # Q8_0 blocks, int8 compute
           dict(weight_dtype="int4", scheme="asym"),                   # Q4_1 blocks, group 32, head int8
           dict(weight_dtype="int4", scheme="asym", rounding="search"),                   # no calibration
           dict(weight_dtype="int4", scheme="asym", quantize_output=True),                # head int4
           dict(weight_dtype="int4", scheme="asym", quantize_output=True, rounding="minmax"),
           dict(weight_dtype="int4", group_size=128, compute_dtype="fp32"),
           dict(weight_dtype="int8", scheme="asym", group_size=-1)]:   # per channel, llmrt's WQ_Q8A
    m = Model(f16, n_threads=2, **kw)
    logits = m(ids)
    print(f"{m.wq.describe():90s} max |logit diff| {np.abs(logits - ref).max():.3f}  "
          f"next token {m.tokenizer.decode([int(logits[-1].argmax())])!r}")

out = os.path.join(tmp, "model-q4_0.gguf")
r = quantize_file(f16, out, "q4_0", n_threads=2)             # = `llmrt quantize F16 OUT q4_0`
print(r.summary())
