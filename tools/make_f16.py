"""Make an F16 GGUF from a quantized one, to test weight-only quantization (no F16 model of the
real models can be downloaded on these machines).

    python tools/make_f16.py /work/models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-f16.gguf

Every quantized tensor is dequantized (llmrt's C kernels) and stored as F16; F32 / F16 / BF16
tensors are copied. Note: the values then sit on the source's quantization grid (SmolLM2: its
projections are Q4_1 blocks, which int4 asym group 32 re-quantizes almost exactly, but its tied
output head is Q8_0); Gemma 3 270M Q4_K_M mixes Q5_0, Q4_K, Q6_K and Q8_0, so its F16 is on no
single grid: the better test.
"""
import sys

from llmrt.quantize import float_file

if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    float_file(sys.argv[1], sys.argv[2], "F16")
