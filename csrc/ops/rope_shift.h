/*
 * rope_shift.h — internal: the graph op that feeds the streaming cache's master keys.
 *
 * KV_STORE_PRE (hidden, added by llmrt_graph_attention when its k is a rope node):
 *   src0 the rope node's input, pre-RoPE k [hd_k, n_head_kv, n]; src1 the rope node (its
 *   op_params are the rope parameters); src2 its freq_factors weight or NULL. It copies the
 *   run's n pre-RoPE keys (f32) into cache->k_pre[layer] cells [kv_first, kv_first + n) and
 *   registers the layer's rope parameters on the cache, so that llmrt_kv_cache_rerope can
 *   later recompute each working key as one rotation of its master at a new position.
 *   Does nothing when the cache has no master keys (shift not enabled).
 */
#ifndef LLMRT_ROPE_SHIFT_H
#define LLMRT_ROPE_SHIFT_H

#include "ops/ops.h"

void llmrt_compute_kv_store_pre(const llmrt_compute_params *p, llmrt_tensor *dst);

#endif /* LLMRT_ROPE_SHIFT_H */
