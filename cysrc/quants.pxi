# Dequantize / quantize rows of GGUF block types through the kernel table.
# (filled in by the quantization work)
