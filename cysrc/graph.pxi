# Graph runtime, ops, KV cache (csrc/graph.c, csrc/ops/, csrc/kv_cache.c).
