"""Model families, one file each, chosen by the GGUF key `general.architecture`."""

# general.architecture values llmrt can run (the family file that handles each is in FAMILIES,
# filled by llmrt/models/registry code as families land).
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
