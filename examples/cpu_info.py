"""Which CPU features llmrt found, which ISA level it runs at, and the kernel picked per type.
LLMRT_ISA=generic|avx2|avx512|avx512_vnni|amx caps the level (same as `llmrt info`).

    LLMRT_ISA=generic python examples/cpu_info.py
"""
from llmrt import runtime

feats = runtime.cpu_features()
print("CPU:", " ".join(name for name, on in feats.items() if on))
print("ISA level in use:", runtime.isa(), "| levels this CPU can run:", ", ".join(runtime.available_isas()))
for table, per_type in runtime.kernel_names().items():
    print(f"{table}: " + ", ".join(f"{t}={k}" for t, k in sorted(per_type.items())))
