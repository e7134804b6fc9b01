"""Model: a GGUF file ready to run — weights memory-mapped, graphs built once per batch bucket.

    model = Model("model.gguf", n_threads=2)          # or Model.from_pretrained(...), or a short name
    logits = model(ids)                               # [len(ids), n_vocab] float32, from an empty cache
    out = model.generate(ids, streamer=TextStreamer(model.tokenizer), max_new_tokens=64)

A Session owns one KV cache and the list of tokens in it (they always move together); it is a
streaming cache (n_keep sinks, n_discard eviction, shift-RoPE; see Session), so generation and
chat run past ctx_size in constant memory. `Model.generate` and the chat front end run on sessions. Graphs are built lazily, once per
(batch bucket, all-logits?) pair, and re-run for every batch that fits the bucket.
"""
import contextlib
import functools
import logging
import os
import re
import threading
from typing import Iterable, List, Optional, Sequence, Union

import numpy as np
from gguf import GGMLQuantizationType

from llmrt import _core
from llmrt.checks import C_INT_MAX, id_array, id_list, is_int
from llmrt.errors import ModelFormatError
from llmrt.gguf import SPLIT_EXPERT, GGUFFile
from llmrt.models import get_family
from llmrt.models.moe import split_importance as moe_split_importance

log = logging.getLogger("llmrt")

# Batch buckets: a batch of n tokens runs on the graph of the smallest bucket >= n.
BATCH_BUCKETS = (1, 8, 32, 128, 512)
N_BATCH = BATCH_BUCKETS[-1]
# When every position's logits are wanted, cap the logits buffer of one batch (n_vocab * n floats).
ALL_LOGITS_BATCH_BYTES = 64 << 20


def physical_core_count() -> int:
    """Physical cores available to this process (not hyper-threads); llama.cpp's default too."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return max(1, (os.cpu_count() or 2) // 2)
    cores = set()
    for c in cpus:
        base = f"/sys/devices/system/cpu/cpu{c}/topology/"
        try:
            with open(base + "physical_package_id") as f1, open(base + "core_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            cores.add(("cpu", str(c)))
    return max(1, len(cores))


MAX_THREADS = 1024           # thread pool size limit (more is a typo, not a machine)
MAX_CTX = 1 << 24           # cells of one cache: positions are C ints (far past any model's context)


def _int_arg(name: str, v, lo: int, hi: int) -> int:
    """v as an int in [lo, hi]: TypeError for a float, a bool, a str ...; ValueError outside."""
    if not is_int(v):
        raise TypeError(f"{name} must be an integer, got {v!r} ({type(v).__name__})")
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
    return int(v)


def _exclusive(method):
    """A Session method that no other thread may run on the same Session at the same time: a
    Session is one sequence (its cache and tokens change together); a second thread gets a clear
    RuntimeError instead of a cache that no longer matches its tokens."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self.hold():
            return method(self, *args, **kwargs)
    return wrapper


_NOT_WEIGHT_TYPES = frozenset(int(GGMLQuantizationType[n]) for n in ("I8", "I16", "I32", "I64", "F64"))


class _Weights:
    """`w(name)` gives the graph handle of a weight tensor, wrapped once per graph (zero-copy)."""

    def __init__(self, g, f: GGUFFile, replaced=None, advise: bool = True):
        self.g, self.f, self.handles = g, f, {}
        self.replaced = replaced or {}     # {name: (data, type_id, shape)}: weights quantized at load
        self.advise = advise               # ask the OS to read the weights ahead (not for the check)

    def has(self, name):
        return name in self.f.tensors or name in self.replaced

    def __call__(self, name):
        h = self.handles.get(name)
        if h is None:
            r = self.replaced.get(name)
            h = self.g.weight(r[0], r[1], r[2]) if r is not None else self._file_weight(name)
            h.name = name               # op errors name the tensor (Tensor.described)
            self.handles[name] = h
        return h

    def _file_weight(self, name):
        t = self.f.tensors.get(name)
        if t is None:
            raise ModelFormatError(f"{self.f.path}: missing tensor {name}")
        if t.type in _NOT_WEIGHT_TYPES:
            raise ModelFormatError(f"{self.f.path}: tensor {name} has type {t.type_name}: no op "
                                   f"takes integer or F64 weights")
        if self.advise:
            self.f.advise_willneed(t)   # read ahead: weights read from the map at run time
        try:
            return self.g.weight(t.data, t.type, tuple(t.shape))
        except ValueError as e:
            raise ModelFormatError(f"{self.f.path}: tensor {name}: {e}") from None


KV_MODES = ("shift", "recompute", "window", "none")


class Session:
    """One KV cache and the tokens in it (they always move together): a streaming cache.

    `eval(ids)` appends ids and returns logits. When a batch does not fit, `n_discard` cells
    right after the `n_keep` pinned sinks are evicted (n_discard=-1: half of the unpinned cells,
    as llama.cpp's n_left / 2), positions stay contiguous (the survivors' distances shrink by
    n_discard) and evaluation continues; a batch bigger than the room is fed in chunks.

    kv_mode:
      "shift"      (default) the survivors' keys are re-rotated in place, each as ONE rotation
                   of its exact pre-RoPE master key (no drift); no token is recomputed. Done as
                   llama.cpp's shift up to a common offset: the n_keep sinks are turned forward
                   by n_discard instead of the window back (RoPE attention depends on position
                   differences only), so a shift costs n_keep key rotations and no cell moves;
                   every ~ctx_size evicted tokens all keys are re-roped back to offset 0.
                   Families with `can_shift = False` fall back to "recompute".
      "recompute"  same eviction, then the kept tokens are re-evaluated at their new positions
                   (the exact reference for shift; costs a prefill per eviction).
      "window"     as shift with no sinks (n_keep forced to 0), for experiments.
      "none"       no eviction: a batch that does not fit raises ValueError ("context full").
    """

    def __init__(self, model: "Model", ctx_size: Optional[int] = None, n_keep: int = 4,
                 n_discard: int = -1, kv_mode: str = "shift"):
        self.model = model
        self.n_ctx = model.n_ctx if ctx_size is None else _int_arg("ctx_size", ctx_size, 1, MAX_CTX)
        self._busy = threading.RLock()        # see _exclusive
        if kv_mode not in KV_MODES:
            raise ValueError(f"kv_mode must be one of {', '.join(KV_MODES)}, got {kv_mode!r}")
        self.kv_mode = kv_mode
        self._mode = kv_mode                  # what eviction does: shift | recompute | none
        if kv_mode == "window":
            self._mode = "shift"
            n_keep = 0
        if self._mode == "shift" and not getattr(model.family, "can_shift", True):
            log.warning("llmrt: %s RoPE cannot be shifted in place: kv_mode %s falls back to "
                        "recompute (kept tokens are re-evaluated after each eviction)",
                        model.arch, kv_mode)
            self._mode = "recompute"
        self._n_keep = 0
        self._n_discard = -1
        self.n_keep = n_keep
        self.n_discard = n_discard
        hp = model.hparams
        shapes = hp.kv_shapes()
        self.cache = _core.KVCache(hp.n_layer, self.n_ctx, [s[0] for s in shapes],
                                   [s[1] for s in shapes], [s[2] for s in shapes], dtype=model.kv_dtype)
        if self._mode == "shift":
            self.cache.enable_shift()
        self.tokens: List[int] = []
        self.n_evicted = 0      # tokens evicted so far (totals, for tests and logs)
        self.n_shifts = 0       # evictions so far (each one shift or one recompute)
        self.sampler = self.last_logits = None    # what Session.load found saved with it

    @contextlib.contextmanager
    def hold(self):
        """This thread's for the block (re-entrant; what eval, truncate, ... take per call): a
        whole generation holds its session so that no other thread evaluates on it between two
        of its tokens. Another thread holding it: RuntimeError."""
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("this Session is in use by another thread: a Session is one sequence, give "
                               "each thread its own (Model.new_session; Model.generate makes one per call)")
        try:
            yield self
        finally:
            self._busy.release()

    # ---- settings --------------------------------------------------------------------------

    @property
    def n_keep(self) -> int:
        """Pinned sink cells [0, n_keep) that eviction never drops (0 in window mode)."""
        return self._n_keep

    @n_keep.setter
    def n_keep(self, n: int):
        n = _int_arg("n_keep", n, -C_INT_MAX, C_INT_MAX)     # 2.7, "3", True are not counts
        if self.kv_mode == "window":
            n = 0
        if self.kv_mode == "none":      # nothing is ever evicted: n_keep does not matter
            n = max(0, min(n, self.n_ctx - 1))
        if n < 0 or n + 1 > self.n_ctx:
            raise ValueError(f"n_keep ({n}) + 1 must be <= ctx_size ({self.n_ctx}) and n_keep >= 0: "
                             f"the pinned tokens and at least one new token must fit")
        if self._n_discard > self.n_ctx - n:
            raise ValueError(f"n_discard ({self._n_discard}) must be <= ctx_size ({self.n_ctx}) - "
                             f"n_keep ({n})")
        self._n_keep = n

    @property
    def n_discard(self) -> int:
        """Cells evicted per eviction (-1: half of the unpinned cells)."""
        return self._n_discard

    @n_discard.setter
    def n_discard(self, n: int):
        n = _int_arg("n_discard", n, -C_INT_MAX, C_INT_MAX)
        if self.kv_mode == "none":
            n = -1
        if n != -1 and not 0 < n <= self.n_ctx - self._n_keep:
            raise ValueError(f"n_discard must be -1 (half of the unpinned cells) or in [1, ctx_size "
                             f"({self.n_ctx}) - n_keep ({self._n_keep})], got {n}")
        self._n_discard = n

    def describe(self) -> str:
        """One line for logs: mode, ctx, n_keep, n_discard."""
        mode = self.kv_mode if self._mode != "recompute" or self.kv_mode == "recompute" \
            else f"{self.kv_mode} (recompute fallback)"
        nd = "half" if self._n_discard == -1 else str(self._n_discard)
        return f"kv cache: mode {mode}, ctx {self.n_ctx}, n_keep {self._n_keep}, n_discard {nd}"

    # ---- state -----------------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    @_exclusive
    def reset(self):
        self.cache.clear()
        self.tokens = []

    @_exclusive
    def truncate(self, n: int):
        """Keep the first n tokens (and their cache cells)."""
        if not is_int(n):
            raise TypeError(f"truncate: n must be an integer, got {n!r}")
        if not 0 <= n <= len(self.tokens):
            raise ValueError(f"cannot truncate a session of {len(self.tokens)} tokens to {n}")
        self.cache.truncate(n)
        del self.tokens[n:]

    # ---- saving ----------------------------------------------------------------------------

    @_exclusive
    def save(self, path, sampler=None, last_logits=None) -> int:
        """Save this session (tokens, the cache's cells as they lie, settings, counters; and a
        generation's sampler and last logits if given) to `path`, atomically; returns the bytes
        written. Session.load gives it back: the next tokens are the ones this session would
        give (llmrt/sessionfile.py)."""
        from llmrt.sessionfile import save_session
        return save_session(path, self, sampler=sampler, last_logits=last_logits)

    @classmethod
    def load(cls, path, model: "Model") -> "Session":
        """A Session of `model` restored from `path`; `.sampler` and `.last_logits` hold what
        was saved with it (or None). A file of another model, a truncated or foreign file is a
        llmrt.sessionfile.SessionFileError (a ValueError)."""
        from llmrt.sessionfile import load_session
        saved = load_session(path, model)
        sess = saved.session
        sess.sampler, sess.last_logits = saved.sampler, saved.last_logits
        return sess

    # ---- evaluation ------------------------------------------------------------------------

    def _run(self, chunk: np.ndarray, all_logits: bool) -> np.ndarray:
        """Evaluate chunk (fits in the cache and in one graph) at the next positions."""
        m = len(chunk)
        g = self.model._graph(m, all_logits)
        p0 = self.n_past + self.cache.pos_offset    # shifts turn the sinks forward (kv_cache.h)
        pos = np.arange(p0, p0 + m, dtype=np.int32)
        out_rows = None if all_logits else np.array([m - 1], dtype=np.int32)
        self.cache.prepare(m)
        try:
            return g.run(chunk, pos, out_rows, cache=self.cache)
        finally:
            # a Ctrl-C surfaces when the run returns, its cells already written: the tokens
            # follow the cache (n_used grows only when a run completes), never a chunk behind
            if self.cache.n_used == len(self.tokens) + m:
                self.tokens.extend(chunk.tolist())

    def _evict(self):
        """Make room: drop the n_discard cells after the sinks (fewer if fewer exist)."""
        n_left = self.n_past - self._n_keep
        if n_left < 1:
            raise ValueError(f"context full: the {self._n_keep} pinned tokens (n_keep) fill the "
                             f"cache of {self.n_ctx}")
        d = max(1, n_left // 2) if self._n_discard == -1 else min(self._n_discard, n_left)
        k = self._n_keep
        if self._mode == "shift":
            before = self.cache.n_used
            try:
                self.cache.shift(k, d)
            finally:                            # (as in _run: an interrupt as it returns)
                if self.cache.n_used == before - d:
                    del self.tokens[k:k + d]
        else:                                   # recompute: re-evaluate the kept tokens
            kept = np.asarray(self.tokens[:k] + self.tokens[k + d:], dtype=np.int32)
            self.reset()
            for start in range(0, len(kept), N_BATCH):
                self._run(kept[start:start + N_BATCH], False)
        self.n_evicted += d
        self.n_shifts += 1
        log.debug("llmrt: kv cache %s: evicted %d tokens after %d sinks (%d evictions, %d tokens in all)",
                  self._mode, d, k, self.n_shifts, self.n_evicted)

    @_exclusive
    def make_room(self, m: int):
        """Evict (as eval does) until m new tokens fit in the cache at once; when they do not fit
        as it is, m must be at most ctx_size - n_keep. A multi-sequence batch (Model.eval_sessions)
        calls it per session."""
        if self.n_past + m <= self.n_ctx:
            return
        if self._mode == "none":
            raise ValueError(
                f"context full: {self.n_past} tokens in the cache + {m} new > ctx_size {self.n_ctx}")
        if m > self.n_ctx - self._n_keep:
            raise ValueError(f"{m} tokens cannot fit at once in a cache of {self.n_ctx} with "
                             f"{self._n_keep} pinned (n_keep)")
        while self.n_past + m > self.n_ctx:
            self._evict()

    @_exclusive
    def eval(self, ids: Sequence[int], all_logits: bool = False, progress=None) -> np.ndarray:
        """Append `ids` to the cache, evicting as needed (see the class doc). Returns the logits
        of the last id ([n_vocab]), or of every id ([len(ids), n_vocab]) with all_logits.
        progress: an object whose update(n) is called after each graph run of n ids (a
        llmrt.progress.Progress for a long prompt)."""
        arr = self.model._check_ids(ids)
        n = len(arr)
        if self._mode == "none" and self.n_past + n > self.n_ctx:
            raise ValueError(
                f"context full: {self.n_past} tokens in the cache + {n} new > ctx_size {self.n_ctx}")
        step = N_BATCH if not all_logits else self.model._all_logits_batch
        outs = []
        i = 0
        just_evicted = False
        while i < n:
            rem = n - i
            if self.n_past + rem > self.n_ctx and not just_evicted and self.n_past > self._n_keep:
                self._evict()
                just_evicted = True
                continue
            room = self.n_ctx - self.n_past
            if room < 1:
                self._evict()
                continue
            m = min(room, rem, step)
            outs.append(self._run(arr[i:i + m], all_logits))
            i += m
            just_evicted = False
            if progress is not None:
                progress.update(m)
        if all_logits:
            return outs[0] if len(outs) == 1 else np.concatenate(outs, axis=0)
        return outs[-1][0]


_UNBUILT = object()
_BLOCK = re.compile(r"blk\.(\d+)\.")


def _strip_ones(shape) -> tuple:
    """A ggml shape without trailing 1s (llama.cpp's loader treats [n, 1] as [n])."""
    shape = tuple(shape)
    while len(shape) > 1 and shape[-1] == 1:
        shape = shape[:-1]
    return shape


def check_tensors(f: GGUFFile, family, hp, stacked_shapes: Optional[dict] = None) -> None:
    """The tensors a model of this family and these hyperparameters needs are in `f` with the
    shapes they must have, and no block lies past block_count: else a ModelFormatError naming
    the tensor. stacked_shapes: {merged expert name: shape} of an old file's per-expert tensors.
    (The loader's check; `llmrt quantize` runs it on its input too.)"""
    stacked_shapes = stacked_shapes or {}
    path, arch = f.path, f.architecture
    for name in f.tensors:      # a block past block_count: a wrong key or a wrong tensor
        m = _BLOCK.match(name)  # (llama.cpp refuses it too: a tensor it does not use)
        if m and int(m.group(1)) >= hp.n_layer:
            raise ModelFormatError(f"{path}: tensor {name} belongs to block {m.group(1)}, "
                                   f"but {arch}.block_count is {hp.n_layer}")
    expect = {
        "token_embd.weight": (hp.n_embd, hp.n_vocab),
        "output.weight": (hp.n_embd, hp.n_vocab),
        "output_norm.weight": (hp.n_embd,),
    }
    q_out, k_out, v_out = hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k, hp.n_head_kv * hp.head_dim_v
    per_layer = {
        "attn_norm.weight": (hp.n_embd,), "ffn_norm.weight": (hp.n_embd,),
        "attn_q.weight": (hp.n_embd, q_out), "attn_k.weight": (hp.n_embd, k_out),
        "attn_v.weight": (hp.n_embd, v_out), "attn_output.weight": (hp.n_head * hp.head_dim_v, hp.n_embd),
        "attn_q.bias": (q_out,), "attn_k.bias": (k_out,), "attn_v.bias": (v_out,),
        "attn_q_norm.weight": (hp.head_dim_k,), "attn_k_norm.weight": (hp.head_dim_k,),
        "post_attention_norm.weight": (hp.n_embd,), "post_ffw_norm.weight": (hp.n_embd,),
        "ffn_gate.weight": (hp.n_embd, hp.n_ff), "ffn_up.weight": (hp.n_embd, hp.n_ff),
        "ffn_down.weight": (hp.n_ff, hp.n_embd),
    }
    if hasattr(hp, "tensor_shapes"):
        per_layer.update(hp.tensor_shapes())
    for name in family.required_tensors(hp):
        t = f.tensors.get(name)
        shape = tuple(t.shape) if t is not None else None
        if t is None and name in stacked_shapes:
            shape = tuple(stacked_shapes[name])
        if shape is None:
            raise ModelFormatError(f"{path}: missing tensor {name} (architecture {arch})")
        want = expect.get(name) or per_layer.get(name.split(".", 2)[-1])
        if want is not None and _strip_ones(shape) != _strip_ones(want):   # [n, 1] is [n]
            raise ModelFormatError(
                f"{path}: tensor {name} has shape {shape}, expected {want}")


class Model:
    """A GGUF model. `path` may also be a known short name (see llmrt.hub).

    Weight-only quantization at load (F32/F16/BF16 models; llmrt/wquant.py): weight_dtype
    "int4" | "int8" turns it on; group_size 32 | 64 | 128 | -1 (per channel; default 32),
    scheme "sym" | "asym" (default sym), compute_dtype "int8" | "fp32" | "bf16" (default int8),
    rounding "imatrix" | "search" | "minmax" (int4 scales; default imatrix: a calibration pass,
    then the importance-weighted search), quantize_output (int4: the
    output head int4 too; default False: int8). weight_dtype on an already-quantized model
    raises ValueError."""

    def __init__(self, path: Union[str, os.PathLike], n_threads: Optional[int] = None,
                 ctx_size: int = 4096, kv_dtype: str = "f16", weight_dtype: Optional[str] = None,
                 group_size: Optional[int] = None, scheme: Optional[str] = None,
                 compute_dtype: Optional[str] = None, rounding: Optional[str] = None,
                 quantize_output: Optional[bool] = None):
        # wquant and hub are imported only when needed (a plain load of a local file is the
        # common case, and every import is load time)
        self.wq = None
        if any(v is not None for v in (weight_dtype, group_size, scheme, compute_dtype, rounding,
                                       quantize_output)):
            from llmrt import wquant
            self.wq = wquant.make_config(weight_dtype, group_size, scheme, compute_dtype, rounding,
                                         quantize_output)
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise TypeError(f"the model path must be a str or os.PathLike, got {type(path).__name__}")
        path = os.fsdecode(os.fspath(path))
        if not os.path.isfile(path):
            from llmrt import hub
            path = hub.resolve_model(path)
        self.path = str(path)
        self.gguf = GGUFFile(self.path)
        self.metadata = self.gguf.metadata
        self.arch = self.gguf.architecture
        self.family = get_family(self.arch, where=self.path)
        self.hparams = self.family.HParams.from_gguf(self.gguf)
        # old Mixtral files: one tensor per expert, copied into the merged 3-D form once
        split = getattr(self.hparams, "split_expert_weights", None)
        self._stacked = split(self.gguf) if split is not None else {}
        self._check_tensors()
        self._tokenizer = _UNBUILT   # built on first use (Gemma's 262k-piece vocabulary: ~2 s)
        self.n_vocab = self.hparams.n_vocab
        if kv_dtype not in ("f16", "f32"):
            raise ValueError(f"kv_dtype must be 'f16' or 'f32', got {kv_dtype!r}")
        self.kv_dtype = kv_dtype
        if ctx_size is None:
            raise ValueError("ctx_size must be >= 1, got None")
        self.n_ctx = _int_arg("ctx_size", ctx_size, 1, MAX_CTX)
        if self.n_ctx > self.hparams.n_ctx_train:
            log.warning("ctx_size %d exceeds the model's training context %d",
                        self.n_ctx, self.hparams.n_ctx_train)
        # None (or 0, as the CLI's -t 0): the physical cores
        self.n_threads = (physical_core_count() if n_threads is None or (type(n_threads) is int and n_threads == 0)
                          else _int_arg("n_threads", n_threads, 1, MAX_THREADS))
        self._graphs = {}
        # mul_mat weights repacked at load for the gemm kernels (gemm.h), shared by every batch
        # bucket's graph; LLMRT_PACK=0 keeps them plain (the vec_dot path, for comparisons)
        self._packs = {}
        pack = os.environ.get("LLMRT_PACK", "1").strip().lower()
        self._pack = pack not in ("0", "no", "false", "off")
        if pack not in ("0", "no", "false", "off", "1", "yes", "true", "on", ""):
            log.warning("llmrt: LLMRT_PACK=%r is not 0/1 (no/yes, false/true, off/on): weights are packed", pack)
        # {name: (blocks, type_id, shape)} of the matmul weights quantized at load (else empty)
        self._replaced, self.wq_summary = dict(self._stacked), ""
        if self.wq is not None:
            from llmrt import wquant
            wquant.require_float_weights(self.gguf)
            imp = None
            if self.wq.weight_dtype == "int4" and self.wq.rounding == "imatrix":
                from llmrt import imatrix
                imp = imatrix.model_importance(self.gguf, self.family, self.hparams, self.tokenizer,
                                               wquant.output_weight_name(self.gguf.tensors),
                                               stacked=self._stacked)
                if imp and self._stacked:   # per-expert tensors: each its row of the merged one
                    imp.update(moe_split_importance(imp, self._stacked))
            replaced, self.wq_summary = wquant.quantize_weights(self.gguf, self.wq, self.n_threads,
                                                                importance=imp)
            self._replaced.update(replaced)
            if self._stacked:               # old Mixtral files: merge the quantized experts,
                merged = split(self.gguf, replaced)   # keep only the merged copies
                self._replaced = {n: v for n, v in self._replaced.items() if not SPLIT_EXPERT.match(n)}
                self._replaced.update(merged)
        self._stacked = None                # (the float copies live on in _replaced if used)
        self._check_graph()
        self._all_logits_batch = max(1, min(N_BATCH, ALL_LOGITS_BATCH_BYTES // (4 * self.n_vocab)))
        log.info("llmrt: %s: arch %s, %d layers, n_embd %d, vocab %d; ISA %s, %d threads, kv cache %s",
                 os.path.basename(self.path), self.arch, self.hparams.n_layer, self.hparams.n_embd,
                 self.n_vocab, _core.isa_current(), self.n_threads, self.kv_dtype)

    @property
    def tokenizer(self):
        """The model's tokenizer (llmrt.tokenizer.Tokenizer), built from the GGUF vocabulary on
        first use; None when the file has no vocabulary."""
        if self._tokenizer is _UNBUILT:
            from llmrt.tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_gguf(self.metadata)
        return self._tokenizer

    @classmethod
    def from_pretrained(cls, path, **kwargs) -> "Model":
        return cls(path, **kwargs)

    # ---- loading checks --------------------------------------------------------------------

    def _check_tensors(self):
        check_tensors(self.gguf, self.family, self.hparams,
                      {n: tuple(v[2]) for n, v in self._stacked.items()})

    def _check_graph(self):
        """The forward pass built once at load on a one-token graph that packs nothing and is
        never run: what an op refuses (a norm weight stored quantized, a bias of the wrong shape,
        a weight type no matmul kernel takes, a short rope_freqs) is a ModelFormatError naming
        the tensor now, not an error at the first eval (2-5 ms on the models here)."""
        g = _core.Graph(1, 1, pack=False)
        try:
            self.family.build_graph(g, self.hparams, _Weights(g, self.gguf, self._replaced, advise=False),
                                    None, False)
        except ModelFormatError:
            raise
        except (ValueError, RuntimeError) as e:
            raise ModelFormatError(f"{self.path}: {e}") from None

    def _check_ids(self, ids) -> np.ndarray:
        if type(ids) is list and 0 < len(ids) <= 16 and all(type(i) is int for i in ids):
            for i in ids:                # the decode loop's case: no numpy reductions
                if not 0 <= i < self.n_vocab:
                    raise ValueError(f"token id {i} is out of range for a vocabulary of {self.n_vocab}")
            return np.array(ids, dtype=np.int32)
        if isinstance(ids, np.ndarray):
            arr = id_array(ids)
        else:
            lst = id_list(ids)
            try:
                arr = np.asarray(lst, dtype=np.int64)
            except OverflowError:       # an id past int64: out of range whatever the vocabulary
                bad = next(i for i in lst if not -2**63 <= i < 2**63)
                raise ValueError(f"token id {bad} is out of range for a vocabulary of {self.n_vocab}") from None
        if arr.size == 0:
            raise ValueError("no tokens to evaluate")
        bad = (arr >= self.n_vocab) if arr.dtype.kind == "u" else (arr < 0) | (arr >= self.n_vocab)
        if bad.any():
            raise ValueError(f"token id {int(arr[bad][0])} is out of range for a vocabulary of {self.n_vocab}")
        return arr.astype(np.int32)

    # ---- graphs ----------------------------------------------------------------------------

    def _graph(self, n: int, all_logits: bool, n_out: int = 1):
        """The graph for a batch of n tokens: every row's logits (all_logits), or n_out picked
        rows (1: the last token; more: one per sequence of a multi-sequence batch)."""
        cap = next((b for b in BATCH_BUCKETS if b >= n), N_BATCH)
        # rows kept: "all", or a capacity of picked rows (NOT True / 1: they are equal keys)
        rows = "all" if all_logits else (1 if n_out <= 1 else
                                          next((b for b in BATCH_BUCKETS if b >= n_out), N_BATCH))
        key = (cap, rows)
        g = self._graphs.get(key)
        if g is None:
            g = _core.Graph(cap, self.n_threads, packs=self._packs, pack=self._pack)
            self.family.build_graph(g, self.hparams, _Weights(g, self.gguf, self._replaced), None,
                                    True if rows == "all" else (rows if rows > 1 else False))
            g.build()
            self._graphs[key] = g
            log.debug("built graph for batch <= %d (logits: %s): %d nodes, arena %.1f MiB",
                      cap, "all rows" if rows == "all" else f"<= {rows} rows", g.n_nodes,
                      g.arena_bytes / 2**20)
        return g

    # ---- running ---------------------------------------------------------------------------

    def new_session(self, ctx_size: Optional[int] = None, n_keep: int = 4, n_discard: int = -1,
                    kv_mode: str = "shift") -> Session:
        """A streaming session (see Session): ctx_size cells (default: the model's n_ctx),
        n_keep pinned sinks, n_discard evicted per eviction (-1: half), kv_mode shift |
        recompute | window | none."""
        return Session(self, ctx_size, n_keep=n_keep, n_discard=n_discard, kv_mode=kv_mode)

    def eval_sessions(self, sessions: Sequence[Session], ids: Sequence[Sequence[int]]) -> np.ndarray:
        """Continuous batching: append ids[s] to sessions[s] for every s in ONE graph run (the
        weights are read once for all of them; each token attends only to its own session's
        cache) and return the logits of each session's last new id, [len(sessions), n_vocab].

        Each session first makes room as its eval would (its own n_keep / n_discard / shift);
        all the ids together must fit one batch (N_BATCH tokens), each session's at once in its
        cache. Sessions must be distinct and of this model."""
        sessions = list(sessions)
        if len(sessions) != len(ids) or not sessions:
            raise ValueError(f"eval_sessions: {len(sessions)} sessions and {len(ids)} id lists")
        if len({id(s) for s in sessions}) != len(sessions):
            raise ValueError("eval_sessions: a session appears twice")
        arrs = [self._check_ids(x) for x in ids]
        counts = [len(a) for a in arrs]
        total = sum(counts)
        if total > N_BATCH:
            raise ValueError(f"eval_sessions: {total} tokens in all, more than one batch ({N_BATCH})")
        for s in sessions:
            if s.model is not self:
                raise ValueError("eval_sessions: a session of another model")
        held = []
        try:
            for s in sessions:          # every session is this call's until it returns (_exclusive)
                if not s._busy.acquire(blocking=False):
                    raise RuntimeError("eval_sessions: a session is in use by another thread")
                held.append(s)
            for s, m in zip(sessions, counts):
                s.make_room(m)
            if len(sessions) == 1:
                return sessions[0].eval(arrs[0])[None, :]
            pos = np.concatenate([np.arange(s.n_past + s.cache.pos_offset, s.n_past + s.cache.pos_offset + m,
                                            dtype=np.int32) for s, m in zip(sessions, counts)])
            rows = np.cumsum(counts, dtype=np.int64).astype(np.int32) - 1
            g = self._graph(total, False, n_out=len(sessions))
            try:
                return g.run_seqs(np.concatenate(arrs), pos, rows, [s.cache for s in sessions], counts)
            finally:                            # (as Session._run)
                for s, a in zip(sessions, arrs):
                    if s.cache.n_used == len(s.tokens) + len(a):
                        s.tokens.extend(a.tolist())
        finally:
            for s in held:
                s._busy.release()

    def __call__(self, ids) -> np.ndarray:
        """Teacher-forced logits of every position, from an empty cache: [len(ids), n_vocab]."""
        arr = self._check_ids(ids)
        sess = Session(self, ctx_size=max(len(arr), 1), n_keep=0, kv_mode="none")
        return sess.eval(arr, all_logits=True)

    def generate(self, ids_or_prompt, streamer=None, max_new_tokens: int = 128, *,
                 temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 repeat_penalty: float = 1.0, repeat_last_n: int = 64, seed: Optional[int] = None,
                 stop: Optional[Iterable[str]] = None, ignore_eos: bool = False,
                 ctx_size: Optional[int] = None, do_sample: Optional[bool] = None,
                 n_keep: Optional[int] = None, n_discard: Optional[int] = None,
                 kv_mode: Optional[str] = None, session: Optional[Session] = None,
                 logit_bias=None, response_format=None, grammar=None) -> List[int]:
        """Generate after a prompt (ids, or text encoded with the model's tokenizer). Returns the
        prompt ids followed by the new ids (Hugging Face convention). temperature=0 is greedy.

        Runs on a streaming cache of ctx_size cells (default: the model's n_ctx): n_keep sinks
        (default 4), n_discard evicted per eviction (default -1: half), kv_mode shift (default) |
        recompute | window | none; these make a new session, so with `session=` they are an
        error (set them on the session).
        max_new_tokens=-1 (or None) generates until an end-of-generation token, forever with
        ignore_eos=True. `session` (optional) is the Session to run on, to inspect afterwards.
        logit_bias: {token id: bias} added to those logits before sampling (-inf bans a token).
        response_format: {"type": "json_object"} makes the output one JSON object (JSON mode: it
        ends when the object closes; llmrt.jsonmode), {"type": "json_schema", "json_schema":
        {"schema": S}} a JSON text the JSON Schema S accepts, None or {"type": "text"} free text;
        grammar: GBNF text (llama.cpp's format) the output must match instead."""
        from llmrt.generation import generate, stop_strings

        with contextlib.ExitStack() as held:
            try:            # a streamer is ended on every failure, these checks' included
                if isinstance(ids_or_prompt, str):
                    if self.tokenizer is None:
                        raise ValueError("this model has no tokenizer: pass token ids")
                    prompt_ids = self.tokenizer.encode(ids_or_prompt, add_special=True)
                else:
                    prompt_ids = id_list(ids_or_prompt)
                if do_sample is not None and not do_sample:     # False, 0: greedy
                    temperature = 0.0
                cache_args = {"ctx_size": ctx_size, "n_keep": n_keep, "n_discard": n_discard,
                              "kv_mode": kv_mode}
                if session is not None:
                    given = [k for k, v in cache_args.items() if v is not None]
                    if given:
                        raise ValueError(f"{', '.join(given)} configure a new session: with session=, "
                                         "set them on the session (Model.new_session) instead")
                    sess = session
                else:
                    sess = self.new_session(ctx_size, n_keep=4 if n_keep is None else n_keep,
                                            n_discard=-1 if n_discard is None else n_discard,
                                            kv_mode="shift" if kv_mode is None else kv_mode)
                stop = stop_strings(stop)
                # the session is this call's for the whole generation, not per eval: another
                # thread evaluating between two of its tokens would continue its own text
                held.enter_context(sess.hold())
            except BaseException:
                if streamer is not None:
                    streamer.end()
                raise
            log.info("llmrt: %s", sess.describe())
            return generate(sess, prompt_ids, self.tokenizer, streamer=streamer,
                            max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                            top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                            repeat_last_n=repeat_last_n, seed=seed, stop=stop, ignore_eos=ignore_eos,
                            logit_bias=logit_bias, response_format=response_format, grammar=grammar)
