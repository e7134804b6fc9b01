"""Model families, one file each, chosen by the GGUF key `general.architecture`.

A family module defines:
    HParams            a dataclass of hyperparameters with `from_gguf(f: GGUFFile)`
    build_graph(g, hp, w, cache, all_logits)
                       builds the compute graph on `g` (llmrt._core.Graph): token ids in, logits
                       out; `w(name)` returns the graph handle of a weight tensor. all_logits:
                       True keeps every row; False the one row picked by input_out_rows (the
                       last token); an int k > 1 up to k picked rows (one per sequence of a
                       multi-sequence batch): `common.out_rows_cap(all_logits)`
    can_shift          whether its RoPE keys can be shifted in place (streaming cache)
"""
import importlib

from llmrt.errors import ModelFormatError

# general.architecture -> module under llmrt.models
FAMILIES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "qwen2moe": "qwen2moe",
    "qwen3moe": "qwen3moe",
    "olmoe": "olmoe",
}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)


def get_family(arch: str, where: str = ""):
    """The family module for `arch`, or a ModelFormatError naming the supported ones."""
    mod = FAMILIES.get(arch)
    if mod is None:
        loc = f"{where}: " if where else ""
        shown = repr(arch) if arch else "(general.architecture is missing or not a string)"
        raise ModelFormatError(
            f"{loc}unsupported architecture {shown}; llmrt supports: {', '.join(SUPPORTED_ARCHITECTURES)}")
    return importlib.import_module(f"llmrt.models.{mod}")

