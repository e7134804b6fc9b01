"""Hyperparameter reading shared by the families (GGUF key conventions of llama.cpp)."""
import math
from dataclasses import dataclass

import numpy as np

from llmrt.checks import C_INT_MAX, is_int, is_number
from llmrt.errors import ModelFormatError

ROPE_NORM = 0   # pairs (2i, 2i+1): the llama family
ROPE_NEOX = 2   # pairs (i, i + n_rot/2): Qwen, Gemma, ...


def _scalar(v, key, where):
    """A per-model scalar that some files store as a per-layer array (all equal)."""
    if isinstance(v, (list, tuple, np.ndarray)):
        try:
            vals = list(np.asarray(v).ravel())
        except (TypeError, ValueError):         # e.g. nested arrays of unequal lengths
            raise ModelFormatError(f"{where}: key {key} is not a number or an array of numbers") from None
        if not vals:
            raise ModelFormatError(f"{where}: key {key} is an empty array")
        if any(x != vals[0] for x in vals):
            raise ModelFormatError(f"{where}: key {key} varies per layer, which llmrt does not support")
        return vals[0]
    return v


class KeyReader:
    """Reads `{arch}.*` keys with clear errors for missing or malformed ones."""

    def __init__(self, f):
        self.f = f
        self.arch = f.architecture
        self.where = str(f.path)

    def get(self, suffix, default=None, required=False, kind=float):
        key = f"{self.arch}.{suffix}"
        v = self.f.get(key)
        if v is None:
            if required:
                raise ModelFormatError(f"{self.where}: missing required key {key}")
            return default
        v = _scalar(v, key, self.where)
        # the GGUF value's own type: 1.5, True or "8" for a count is a broken file, not 1 or 8
        # (llama.cpp checks the key's type too)
        bad_int = kind is int and not is_int(v)
        if bad_int or kind is float and not is_number(v):
            shown = v.item() if isinstance(v, np.generic) else v    # '4', not np.str_('4')
            raise ModelFormatError(f"{self.where}: key {key} must be "
                                   f"{'an integer' if bad_int else 'a number'}, got "
                                   f"{shown!r:.60} ({type(shown).__name__})")
        try:
            out = kind(v)
        except (TypeError, ValueError, OverflowError):
            raise ModelFormatError(f"{self.where}: key {key} has a bad value {v!r:.60}") from None
        if kind is int and out < 0:
            raise ModelFormatError(f"{self.where}: key {key} is negative ({out})")
        if kind is int and out > C_INT_MAX:
            raise ModelFormatError(f"{self.where}: key {key} is too large ({out} > {C_INT_MAX})")
        if kind is float and not math.isfinite(out):
            raise ModelFormatError(f"{self.where}: key {key} is not finite ({out})")
        return out


@dataclass
class RopeParams:
    """What ggml_rope_ext needs, as llama.cpp derives it from the GGUF keys."""
    n_rot: int
    mode: int
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0

    def kwargs(self, freq_base=None, freq_scale=None):
        return dict(freq_base=self.freq_base if freq_base is None else freq_base,
                    freq_scale=self.freq_scale if freq_scale is None else freq_scale,
                    ext_factor=self.ext_factor, attn_factor=self.attn_factor,
                    beta_fast=self.beta_fast, beta_slow=self.beta_slow,
                    n_ctx_orig=self.n_ctx_orig)


def read_rope(r: KeyReader, n_rot: int, mode: int, n_ctx_train: int) -> RopeParams:
    """RoPE frequency base and scaling as llama.cpp reads them (rope.scaling.type: none, linear,
    yarn; llama3-style scaling comes as a rope_freqs tensor and is handled by the family)."""
    rp = RopeParams(n_rot=n_rot, mode=mode)
    rp.freq_base = r.get("rope.freq_base", 10000.0)
    if rp.freq_base <= 0:
        raise ModelFormatError(f"{r.where}: {r.arch}.rope.freq_base must be > 0, got {rp.freq_base}")
    # llama.cpp: rope.scaling.factor (older files: rope.scale_linear); freq_scale = 1/factor;
    # a missing scaling type means linear.
    factor = r.get("rope.scaling.factor", 0.0) or r.get("rope.scale_linear", 0.0)
    if factor < 0:              # llama.cpp would rotate backwards (freq_scale 1/factor < 0)
        raise ModelFormatError(f"{r.where}: {r.arch}.rope.scaling.factor must be > 0 (or 0: "
                               f"none), got {factor}")
    rp.freq_scale = 1.0 / factor if factor > 0 else 1.0
    if not 1e-30 < rp.freq_scale < 1e30:       # an f32 in the kernels: 0 or inf there
        raise ModelFormatError(f"{r.where}: {r.arch}.rope.scaling.factor {factor} is out of range")
    rp.n_ctx_orig = r.get("rope.scaling.original_context_length", 0, kind=int) or n_ctx_train
    rtype = r.f.get(f"{r.arch}.rope.scaling.type", "linear")
    if not isinstance(rtype, str):
        raise ModelFormatError(f"{r.where}: {r.arch}.rope.scaling.type must be a string, got {type(rtype).__name__}")
    if rtype in ("none", "linear"):
        pass
    elif rtype == "yarn":
        rp.ext_factor = 1.0
        rp.attn_factor = r.get("rope.scaling.yarn_attn_factor", 1.0)
        rp.beta_fast = r.get("rope.scaling.yarn_beta_fast", 32.0)
        rp.beta_slow = r.get("rope.scaling.yarn_beta_slow", 1.0)
    else:
        raise ModelFormatError(f"{r.where}: unsupported rope scaling type {rtype!r} "
                               f"(llmrt supports none, linear, yarn)")
    return rp


@dataclass
class DecoderHParams:
    """Hyperparameters every decoder family has (fields filled by read_base_hparams)."""
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    norm_eps: float
    rope: RopeParams
    attn_scale: float
    tied_output: bool = False      # no output.weight: the logits use token_embd

    def kv_shapes(self):
        """Per layer (n_head_kv, head_dim_k, head_dim_v) of the KV cache."""
        return [(self.n_head_kv, self.head_dim_k, self.head_dim_v)] * self.n_layer

    def rope_for_layer(self, il):
        return self.rope


def read_base_hparams(f, default_eps: float, default_ctx: int):
    """The keys every decoder family shares, checked: (KeyReader, dict of HParams fields, n_rot)."""
    r = KeyReader(f)
    n_embd = r.get("embedding_length", required=True, kind=int)
    n_layer = r.get("block_count", required=True, kind=int)
    n_head = r.get("attention.head_count", required=True, kind=int)
    if n_embd <= 0 or n_layer <= 0 or n_head <= 0:
        raise ModelFormatError(f"{r.where}: embedding_length, block_count and head_count must be > 0")
    n_head_kv = r.get("attention.head_count_kv", n_head, kind=int)
    if n_head_kv <= 0 or n_head % n_head_kv != 0:
        raise ModelFormatError(
            f"{r.where}: head_count ({n_head}) must be a multiple of head_count_kv ({n_head_kv})")
    blocks = {int(t.split(".")[1]) for t in f.tensors if t.startswith("blk.") and t.split(".")[1].isdigit()}
    if n_layer > len(blocks):               # (before anything sized by it is built)
        raise ModelFormatError(f"{r.where}: block_count is {n_layer} but the file has tensors of "
                               f"{len(blocks)} blocks")
    hd_k = r.get("attention.key_length", n_embd // n_head, kind=int)
    hd_v = r.get("attention.value_length", hd_k, kind=int)
    if hd_k <= 0 or hd_v <= 0:
        raise ModelFormatError(f"{r.where}: the head size must be > 0 (attention.key_length {hd_k}, "
                               f"value_length {hd_v}; else embedding_length / head_count)")
    n_rot = r.get("rope.dimension_count", hd_k, kind=int)
    if n_rot <= 0 or n_rot > hd_k or n_rot % 2:
        raise ModelFormatError(f"{r.where}: rope.dimension_count ({n_rot}) must be even, > 0 and <= head dim ({hd_k})")
    tok = f.get("tokenizer.ggml.tokens")
    if tok is not None and not isinstance(tok, (list, tuple, np.ndarray)):
        raise ModelFormatError(f"{r.where}: tokenizer.ggml.tokens must be an array, got {type(tok).__name__}")
    n_vocab = r.get("vocab_size", len(tok) if tok is not None else 0, kind=int)
    if n_vocab <= 0 and "token_embd.weight" in f.tensors:
        n_vocab = f.tensors["token_embd.weight"].shape[1]
    if tok is not None and len(tok) != n_vocab:   # llama.cpp sizes the embeddings by the vocabulary
        raise ModelFormatError(f"{r.where}: the vocabulary has {len(tok)} tokens but the model {n_vocab} "
                               f"(vocab_size or token_embd.weight)")
    fields = dict(
        n_vocab=n_vocab, n_ctx_train=r.get("context_length", default_ctx, kind=int), n_embd=n_embd,
        n_layer=n_layer, n_ff=r.get("feed_forward_length", 0, kind=int), n_head=n_head,
        n_head_kv=n_head_kv, head_dim_k=hd_k, head_dim_v=hd_v,
        norm_eps=r.get("attention.layer_norm_rms_epsilon", default_eps),
        tied_output="output.weight" not in f.tensors,
    )
    if fields["norm_eps"] < 0:
        raise ModelFormatError(f"{r.where}: attention.layer_norm_rms_epsilon must be >= 0, got {fields['norm_eps']}")
    return r, fields, n_rot


def out_rows_cap(all_logits) -> int:
    """Picked output rows of a graph built with `all_logits` False (1) or an int k (k)."""
    return max(1, int(all_logits))
