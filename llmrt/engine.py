"""The serving engine: continuous batching over slots, each with its own streaming KV cache.
No HTTP in here (llmrt/server.py is a thin layer over it); usable from Python directly:

    engine = Engine(model, n_parallel=4, ctx_size=2048, n_keep=4)
    req = engine.submit(prompt_ids, max_tokens=128, temperature=0.0, stop=["\\n\\n"])
    for piece in req:                  # text as it is generated; any thread may iterate
        print(piece, end="")
    req.finish_reason, req.usage       # "stop" | "length" | "cancelled" | "error", token counts
    engine.generate("Hello", max_tokens=32)   # blocking: submit + wait (many threads at once)
    engine.close()

Slots. Each of the n_parallel slots owns a Session (llmrt.model.Session): a streaming cache with
its own n_keep / n_discard / shift, so every conversation runs unbounded in its own cache and
a prompt longer than the context is fed through evictions, never refused. A slot keeps its
tokens after its request ends.

One engine thread runs the loop; each step:
  1. admits queued requests (FIFO) to idle slots (see "Prefix cache"), drops cancelled ones;
  2. prefills ONE chunk of one admitted prompt: up to n_batch tokens when no stream is
     decoding, else up to prefill_chunk tokens (default: sized from the measured step times so
     that the chunk costs about two decode steps, at least 16 tokens), so streams that are
     already running wait at most one short chunk between tokens;
  3. runs ONE decode step for every slot that has a sampled token to evaluate: one graph run
     for all of them (Model.eval_sessions: the weights are read once per step, each token
     attends only to its own slot's cache), then samples each slot's next token with its own
     request's sampler, stop strings, end-of-generation ids and max_tokens.
  A chunk that fits its slot's cache as it is (no eviction) runs in the decode step's graph run:
  the weights are read once for both and the streams wait one run, not a chunk's and then a
  step's (_mixed_step; a chunk that needs an eviction goes alone through Session.eval, whose
  evictions interleave with its pieces).
Batched decode rows are the same bits as decoding each sequence alone (the kernels are exact per
row and per token: tests/test_engine.py), so a greedy request gets the same answer at any load.

Prefix cache. A slot remembers every id fed to its cache since it was last reset (its history,
evicted ids included). A request whose prompt starts with a slot's whole history continues that
cache as it is: only the rest is prefilled, however many evictions happened (a conversation
sent back turn after turn stays unbounded). Otherwise, if the slot never evicted, its cache is
cut back to the longest common prefix (a shared system prompt). A request goes to the idle slot
of its `conversation` key, else to one whose whole history it continues, else to an empty slot
(a new conversation never cuts another one's cache while a slot is free), else to one whose
history it mostly shares, else to the least recently used one (Engine._pick). The reused count
is the request's usage.cached_tokens.

Bad input raises ValueError from submit(); a full queue raises QueueFull (retry_after seconds);
a request that waits longer than queue_timeout for a slot ends with finish_reason "error".
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np

from llmrt.checks import is_int
from llmrt.generation import _common_prefix, _Release, make_sampler, output_constraint, sample_next, stop_strings
from llmrt.model import N_BATCH

log = logging.getLogger("llmrt")

# tokens/s in the metrics: generated tokens over this many recent seconds
_RATE_WINDOW = 10.0
# prefill_chunk="auto" while streams decode: a chunk costing about this many decode steps' time
# (run with the decode step: the run's time beyond the step's) ...
_PREFILL_SHARE = 2.0
# ... and at least this many tokens (fewer would reread the weights for too little work)
_PREFILL_MIN = 16
# weight of the newest step in the step-time averages
_EMA = 0.25
# most alternatives a request may ask logprobs for (OpenAI's top_logprobs bound)
MAX_TOP_LOGPROBS = 20
# a scored prompt (prompt_logprobs) is prefilled in chunks of at most this many logits
_SCORED_LOGITS = 8 << 20


def _average(avg: Optional[float], x: float) -> float:
    """The step-time average: exponential, the newest sample weighted _EMA."""
    return x if avg is None else avg + _EMA * (x - avg)


class QueueFull(RuntimeError):
    """More requests than slots and queue places. retry_after: seconds to wait before retrying."""

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after


class SlotBusy(RuntimeError):
    """A slot operation (save, restore) on a slot that is serving a request."""


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability under the model (log-softmax of its raw logits:
    before temperature, penalties or truncation, as OpenAI reports them) and the `top` most
    likely ids with theirs, highest first: [(id, logprob), ...]."""
    id: int
    logprob: float
    top: tuple


def token_logprob(logits, tok: int, k: int) -> TokenLogprob:
    """tok's TokenLogprob with k alternatives from one row of logits (float64 log-softmax; ties
    in the top k go to the lower id)."""
    lg = np.asarray(logits, dtype=np.float64)
    m = lg.max()
    lse = m + np.log(np.exp(lg - m).sum())
    top = ()
    if k > 0:
        k = min(k, lg.size)
        idx = np.argpartition(-lg, k - 1)[:k] if k < lg.size else np.arange(lg.size)
        idx = sorted(idx.tolist(), key=lambda i: (-lg[i], i))
        top = tuple((i, float(lg[i] - lse)) for i in idx)
    return TokenLogprob(int(tok), float(lg[tok] - lse), top)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0          # prompt tokens the slot's cache already held (not prefilled)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Request:
    """One generation in the engine. Iterate it for the text as it comes (blocks until the next
    piece; raises RuntimeError if the request failed), or wait() for the end. cancel() stops it
    (its slot is freed within one engine step). on_event, if set before the engine sees the
    request, is called from the engine thread as on_event(kind, payload) for kind "text"
    (payload: a str), "logprobs" (payload: a TokenLogprob, before the token's "text"; only when
    the request asked for logprobs) and "done" (payload: None) instead of queueing them for
    iteration; if it raises, the error is logged, the callback is not called again and the
    request is cancelled (the engine and the other requests go on)."""

    _ids = itertools.count(1)

    def __init__(self, prompt_ids: list, sampler, max_tokens: Optional[int], stop: list,
                 ignore_eos: bool, conversation: Optional[str], n_keep: Optional[int],
                 top_logprobs: Optional[int] = None, prompt_logprobs: bool = False):
        self.id = next(Request._ids)
        self.prompt_ids = prompt_ids
        self.sampler = sampler
        self.max_tokens = max_tokens        # None: until an end-of-generation id or a stop
        self.stop = stop
        self.ignore_eos = ignore_eos
        self.conversation = conversation
        self.n_keep = n_keep
        self.ids: list = []                 # generated ids (the end-of-generation id included)
        self.constraint = None              # constrained output: a llmrt.jsonmode.Constraint
        # logprobs: None (not asked), else one TokenLogprob per generated token with top_logprobs
        # alternatives each (an ending end-of-generation id has none: it is no output)
        self.top_logprobs = top_logprobs
        self.logprobs: Optional[list] = None if top_logprobs is None else []
        # prompt_logprobs: prompt_logprobs[j - 1] for prompt id j >= 1 (given ids[:j]), each with
        # top_logprobs alternatives; the prompt is then prefilled from scratch, no reuse
        self.prompt_logprobs: Optional[list] = [] if prompt_logprobs else None
        self.text = ""                      # released text (stop strings cut off)
        self.finish_reason: Optional[str] = None   # stop | length | cancelled | error
        self.stop_matched: Optional[str] = None
        self.error: Optional[str] = None
        # timeout (no slot in time) | internal | closed | invalid (what it asked cannot be met,
        # e.g. its grammar and logit_bias leave no token)
        self.error_type: Optional[str] = None
        self.usage = Usage(prompt_tokens=len(prompt_ids))
        self.slot: Optional[int] = None
        self.t_submit = time.monotonic()
        self.t_first: Optional[float] = None       # first generated token
        self.t_done: Optional[float] = None
        self.on_event = None
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._stream_read = False      # __iter__ has read the end event
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._engine = None

    def __repr__(self):
        return (f"Request({self.id}, prompt {len(self.prompt_ids)} ids, {len(self.ids)} generated, "
                f"finish_reason={self.finish_reason!r})")

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self):
        """Stop this request: it ends with finish_reason "cancelled" within one engine step."""
        self._cancel.set()
        if self._engine is not None:
            self._engine._wake()

    def wait(self, timeout: Optional[float] = None) -> "Request":
        """Block until the request ends (or timeout seconds pass: then TimeoutError)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        return self

    def __iter__(self) -> Iterator[str]:
        """The text as it is generated, once: iterating again after the end yields nothing (it
        waited forever for events already read); the whole text is `text`."""
        while not self._stream_read:
            kind, payload = self._events.get()
            if kind == "text":
                yield payload
            elif kind == "done":
                self._stream_read = True
        if self.finish_reason == "error":
            raise RuntimeError(f"request {self.id} failed: {self.error}")

    def _emit(self, kind: str, payload):
        if kind == "text" and not payload:
            return
        cb = self.on_event
        if cb is None:
            self._events.put((kind, payload))
            return
        try:
            cb(kind, payload)
        except Exception:
            # the consumer is gone (e.g. a closed connection): this request stops within one
            # step; the engine thread and the other requests go on
            log.exception("llmrt: request %d: on_event(%r) raised; the request is cancelled", self.id, kind)
            self.on_event = None
            self._cancel.set()


class _Slot:
    """A session and what the engine knows about it (touched by the engine thread only)."""

    def __init__(self, i: int, session):
        self.id = i
        self.session = session
        self.req: Optional[Request] = None
        self.history: list = []         # every id fed to the cache since the last reset
        self.last_logits = None         # logits after history[-1]
        self.shifts0 = 0                # session.n_shifts at the last reset
        self.pending: list = []         # prompt ids still to prefill
        self.next_tok: Optional[int] = None    # sampled, not yet evaluated
        self.prev_ids: list = []        # prompt + generated ids (repeat penalties)
        self.rel: Optional[_Release] = None
        self.conversation: Optional[str] = None
        self.last_used = 0.0
        self.admit_seq = 0

    @property
    def exact(self) -> bool:
        """The cache holds exactly `history` (no eviction since the last reset)."""
        return self.session.n_shifts == self.shifts0

    def reset(self):
        self.session.reset()
        self.history = []
        self.last_logits = None
        self.shifts0 = self.session.n_shifts


def _mem_available() -> Optional[int]:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _check_kv_memory(model, n_parallel: int, ctx_size: Optional[int]):
    """ValueError before anything is allocated when n_parallel slots' caches cannot fit in the
    memory available (their K and V cells alone, a lower bound): a typo such as --parallel 100000
    is an error, not a server that swaps until it is killed."""
    hp = getattr(model, "hparams", None)
    avail = _mem_available()
    if hp is None or avail is None or not hasattr(hp, "kv_shapes"):
        return
    esize = 2 if getattr(model, "kv_dtype", "f16") == "f16" else 4
    per_cell = sum(nkv * (hk + hv) * esize for nkv, hk, hv in hp.kv_shapes())
    n_ctx = int(ctx_size) if ctx_size else int(model.n_ctx)
    need = n_parallel * n_ctx * per_cell
    if need > avail:
        raise ValueError(f"{n_parallel} slots of {n_ctx} cells need at least {need / 2**30:.1f} GiB of KV "
                         f"cache, more than the {avail / 2**30:.1f} GiB of memory available: fewer slots "
                         f"(--parallel) or a smaller context (--ctx-size)")


class Engine:
    """Continuous batching over n_parallel slots (see the module doc).

    ctx_size, n_keep, n_discard, kv_mode: each slot's streaming cache (Session's meaning;
    ctx_size defaults to the model's). n_batch: prompt tokens prefilled per step while no other
    slot is decoding. prefill_chunk: the same while some are (at most n_batch; None: auto, see
    _prefill_limit). max_queue: requests that may wait for a slot (more: QueueFull).
    queue_timeout: seconds a request may wait for a slot. n_predict: max_tokens of a request
    that gives none (-1: no limit)."""

    def __init__(self, model, n_parallel: int = 4, ctx_size: Optional[int] = None, n_keep: int = 4,
                 n_discard: int = -1, kv_mode: str = "shift", n_batch: int = 256, max_queue: int = 64,
                 queue_timeout: float = 600.0, n_predict: int = -1, prefill_chunk: Optional[int] = None):
        if int(n_parallel) < 1:
            raise ValueError(f"n_parallel must be >= 1, got {n_parallel}")
        if not 1 <= int(n_batch) <= N_BATCH:
            raise ValueError(f"n_batch must be in [1, {N_BATCH}], got {n_batch}")
        if prefill_chunk is not None and int(prefill_chunk) < 1:
            raise ValueError(f"prefill_chunk must be >= 1 (or None: auto), got {prefill_chunk}")
        if int(max_queue) < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if not queue_timeout > 0:
            raise ValueError(f"queue_timeout must be > 0, got {queue_timeout}")
        _check_kv_memory(model, int(n_parallel), ctx_size)
        self.model = model
        self.tokenizer = model.tokenizer
        self.n_batch = int(n_batch)
        self.prefill_chunk = None if prefill_chunk is None else min(int(prefill_chunk), self.n_batch)
        self._dec_s: Optional[float] = None       # seconds per decode step (average)
        self._pre_tok_s: Optional[float] = None   # seconds per prefilled token (average)
        self.max_queue = int(max_queue)
        self.queue_timeout = float(queue_timeout)
        self.n_predict = int(n_predict)
        self.slots = [_Slot(i, model.new_session(ctx_size, n_keep=n_keep, n_discard=n_discard,
                                                 kv_mode=kv_mode)) for i in range(int(n_parallel))]
        self.n_ctx = self.slots[0].session.n_ctx
        self.n_keep = self.slots[0].session.n_keep
        self.n_discard = self.slots[0].session.n_discard
        self._eog = frozenset(self.tokenizer.eog_ids) if self.tokenizer is not None else frozenset()
        self._queue: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._closing = False
        self._admit_seq = itertools.count()
        # metrics (engine thread writes, stats() reads under the lock)
        self._m = collections.Counter()
        self._recent: collections.deque = collections.deque()   # (time, tokens) of decode steps
        self._warm()
        self._thread = threading.Thread(target=self._loop, name="llmrt-engine", daemon=True)
        self._thread.start()
        log.info("llmrt: engine: %d slots, %s, prefill chunks of %d (%s while streams decode)",
                 len(self.slots), self.slots[0].session.describe(), self.n_batch,
                 "auto" if self.prefill_chunk is None else self.prefill_chunk)

    # ---- public ----------------------------------------------------------------------------

    def submit(self, prompt, *, max_tokens: Optional[int] = None, stop: Sequence[str] | str = (),
               ignore_eos: bool = False, conversation: Optional[str] = None,
               n_keep: Optional[int] = None, on_event=None, sampler=None,
               do_sample: Optional[bool] = None, logprobs: Optional[int] = None,
               prompt_logprobs: bool = False, response_format=None, grammar=None, **sampling) -> Request:
        """Queue a generation. prompt: token ids, or text (encoded with BOS as Model.generate).
        max_tokens: None for the engine's n_predict. sampling: temperature, top_k, top_p, min_p,
        repeat_penalty, repeat_last_n, seed, frequency_penalty, presence_penalty, logit_bias (Sampler).
        conversation: a key that prefers the slot that served it last. n_keep: the slot's pinned
        tokens if its cache starts afresh (default: the engine's). on_event: see Request.
        logprobs: None, or k in [0, MAX_TOP_LOGPROBS]: each generated token's log-probability
        and its k most likely alternatives (Request.logprobs, and "logprobs" events).
        prompt_logprobs (needs logprobs): also every prompt id's after the first
        (Request.prompt_logprobs; what OpenAI's echo + logprobs scores); max_tokens=0 then scores
        the prompt alone. response_format: {"type": "json_object"} (one JSON object) or {"type":
        "json_schema", "json_schema": {"schema": S}} (JSON the schema S accepts) or grammar (GBNF
        text): llmrt.jsonmode; the request ends with "stop" where the text is complete."""
        if self._closing:
            raise RuntimeError("the engine is closed")
        if on_event is not None and not callable(on_event):
            raise TypeError(f"on_event must be callable (or None), got {type(on_event).__name__}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass token ids")
            ids = self.tokenizer.encode(prompt, add_special=True)
        else:
            ids = prompt
        ids = self.model._check_ids(list(ids) if not isinstance(ids, np.ndarray) else ids).tolist()
        stop = stop_strings(stop)
        if max_tokens is None:
            max_tokens = self.n_predict
        if not is_int(max_tokens):
            raise TypeError(f"max_tokens must be an integer (or None), got {max_tokens!r}")
        max_tokens = int(max_tokens)
        if prompt_logprobs and logprobs is None:
            raise ValueError("prompt_logprobs needs logprobs (the alternatives per token: 0 for none)")
        if (max_tokens == 0 and not prompt_logprobs) or max_tokens < -1:
            raise ValueError(f"max_tokens must be >= 1 (or -1: no limit; 0 with prompt_logprobs), got {max_tokens}")
        if n_keep is not None and not is_int(n_keep):
            raise TypeError(f"n_keep must be an integer (or None), got {n_keep!r}")
        if n_keep is not None and not 0 <= int(n_keep) < self.n_ctx:
            raise ValueError(f"n_keep must be in [0, ctx_size = {self.n_ctx}), got {n_keep}")
        if logprobs is not None and not is_int(logprobs):
            raise TypeError(f"logprobs must be an integer (or None), got {logprobs!r}")
        if logprobs is not None and not 0 <= int(logprobs) <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {logprobs}")
        sampler = make_sampler(sampler, do_sample, self.model.n_vocab, **sampling)
        constraint = output_constraint(self.tokenizer, response_format, grammar)
        req = Request(ids, sampler, None if max_tokens < 0 else max_tokens, stop, bool(ignore_eos),
                      conversation, None if n_keep is None else int(n_keep),
                      None if logprobs is None else int(logprobs), bool(prompt_logprobs))
        req.constraint = constraint
        req._engine = self
        req.on_event = on_event
        with self._cv:
            if self._closing:       # again, under the lock: close() may have begun while the
                raise RuntimeError("the engine is closed")   # prompt was encoded (never served)
            if len(self._queue) >= self.max_queue + self._idle_slots():
                self._m["rejected"] += 1
                raise QueueFull(f"all {len(self.slots)} slots are busy and {len(self._queue)} "
                                f"requests are waiting (max_queue {self.max_queue})",
                                retry_after=self._retry_after())
            self._queue.append(req)
            self._m["submitted"] += 1
            self._cv.notify_all()
        return req

    def generate(self, prompt, **kwargs) -> Request:
        """submit(prompt, **kwargs) and wait for the end. Safe from many threads at once: their
        requests are decoded together. Raises RuntimeError if the request failed."""
        req = self.submit(prompt, **kwargs).wait()
        if req.finish_reason == "error":
            raise RuntimeError(f"request {req.id} failed: {req.error}")
        return req

    def stats(self) -> dict:
        """Counters and gauges for metrics: requests, tokens, tokens/s, slots, queue, shifts."""
        with self._cv:
            now = time.monotonic()
            while self._recent and self._recent[0][0] < now - _RATE_WINDOW:
                self._recent.popleft()
            rate = sum(n for _, n in self._recent) / _RATE_WINDOW
            m = dict(self._m)
            busy = sum(1 for s in self.slots if s.req is not None)
            return {
                "requests_submitted": m.get("submitted", 0),
                "requests_rejected": m.get("rejected", 0),
                "requests_finished": {k[7:]: v for k, v in m.items() if k.startswith("finish_")},
                "prompt_tokens": m.get("prompt_tokens", 0),
                "prompt_tokens_cached": m.get("cached_tokens", 0),
                "prompt_tokens_evaluated": m.get("prefill_tokens", 0),
                "generated_tokens": m.get("generated_tokens", 0),
                "decode_steps": m.get("decode_steps", 0),
                "prefill_chunks": m.get("prefill_chunks", 0),
                "prefill_chunks_with_decode": m.get("mixed_steps", 0),
                "cache_shifts": sum(s.session.n_shifts for s in self.slots),
                "tokens_per_second": rate,
                "slots_total": len(self.slots),
                "slots_busy": busy,
                "queue_length": len(self._queue),
            }

    def slot_info(self) -> list:
        """Per slot: id, busy, cells used, n_keep, shifts so far, tokens in its history, the
        conversation key it last served (the chat page finds its slot by it)."""
        return [{"id": s.id, "busy": s.req is not None, "n_ctx": s.session.n_ctx,
                 "n_past": s.session.n_past, "n_keep": s.session.n_keep,
                 "n_shifts": s.session.n_shifts, "history": len(s.history),
                 "conversation": s.conversation} for s in self.slots]

    def save_slot(self, i: int, path) -> dict:
        """Save idle slot i (its cache, history and last logits) to `path` (llmrt/sessionfile.py).
        ValueError if the slot does not exist; SlotBusy while it serves a request."""
        from llmrt.sessionfile import save_session
        t0 = time.perf_counter()
        with self._cv:                       # holding the lock: no request is admitted to it
            s = self._idle_slot(i)
            n = save_session(path, s.session, kind="slot", last_logits=s.last_logits,
                             extra={"slot": {"history": s.history, "conversation": s.conversation,
                                             "exact": s.exact}})
            return {"id_slot": i, "n_saved": len(s.history), "n_written": n,
                    "save_ms": (time.perf_counter() - t0) * 1e3}

    def restore_slot(self, i: int, path) -> dict:
        """Restore idle slot i from a file save_slot wrote (the same model, ctx_size, kv_mode).
        A bad file is a SessionFileError (a ValueError) and the slot keeps what it had."""
        from llmrt.sessionfile import SessionFileError, is_ids, load_into, read_session_file
        t0 = time.perf_counter()
        with self._cv:
            s = self._idle_slot(i)
            saved = read_session_file(path, self.model)
            info = saved.extra.get("slot")
            if saved.header.get("kind") != "slot" or not isinstance(info, dict):
                raise SessionFileError(f"{path}: a {saved.header.get('kind')} state, not a server slot")
            if (not is_ids(info.get("history"), self.model.n_vocab)
                    or not (info.get("conversation") is None or isinstance(info["conversation"], str))):
                raise SessionFileError(f"{path}: damaged session file header (the slot's history)")
            load_into(path, s.session)
            s.history = [int(t) for t in info["history"]]
            s.conversation = info.get("conversation")
            s.last_logits = saved.last_logits
            # the prefix cache's "never shifted" holds only if it held when saved
            s.shifts0 = s.session.n_shifts if info.get("exact") else -1
            s.last_used = time.monotonic()
            return {"id_slot": i, "n_restored": len(s.history), "n_read": os.path.getsize(path),
                    "restore_ms": (time.perf_counter() - t0) * 1e3}

    def erase_slot(self, i: int) -> dict:
        """Forget idle slot i's cache and history (SlotBusy while it serves a request)."""
        with self._cv:
            s = self._idle_slot(i)
            n = len(s.history)
            s.reset()
            s.conversation = None
            return {"id_slot": i, "n_erased": n}

    def _idle_slot(self, i: int) -> "_Slot":
        if not isinstance(i, int) or not 0 <= i < len(self.slots):
            raise ValueError(f"no slot {i}: slots are 0..{len(self.slots) - 1}")
        s = self.slots[i]
        if s.req is not None:
            raise SlotBusy(f"slot {i} is serving a request")
        return s

    def close(self, timeout: float = 10.0):
        """Stop the engine thread; requests still queued or running end with an error."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _warm(self):
        """Build now the graphs the loop will run (prefill chunks, batched decode steps of up to
        n_parallel sequences, both together), so the first requests do not wait for them."""
        from llmrt.model import BATCH_BUCKETS
        t0 = time.perf_counter()
        for prev, b in zip((0,) + BATCH_BUCKETS, BATCH_BUCKETS):
            if prev < self.n_batch:                 # the buckets prefill chunks land in
                self.model._graph(b, False)
        for n in range(2, min(len(self.slots), N_BATCH) + 1):
            self.model._graph(n, False, n_out=n)
            # a prompt chunk with the decode step of n - 1 streams (_mixed_step): up to n_batch + n - 1 ids
            top = min(self.n_batch + n - 1, N_BATCH)
            for prev, b in zip((0,) + BATCH_BUCKETS, BATCH_BUCKETS):
                if n < b and prev < top:
                    self.model._graph(b, False, n_out=n)
        log.debug("llmrt: engine graphs built in %.2f s", time.perf_counter() - t0)

    # ---- the loop ---------------------------------------------------------------------------

    def _wake(self):
        with self._cv:
            self._cv.notify_all()

    def _idle_slots(self) -> int:
        return sum(1 for s in self.slots if s.req is None)

    def _retry_after(self) -> int:
        """Seconds until a slot may be free: the least max_tokens left of a running request at
        the recent decode rate per slot, within [1, 60]."""
        now = time.monotonic()
        recent = [n for t, n in self._recent if t >= now - _RATE_WINDOW]
        per_slot = sum(recent) / _RATE_WINDOW / max(1, len(self.slots))
        left = [s.req.max_tokens - len(s.req.ids) for s in self.slots
                if s.req is not None and s.req.max_tokens is not None]
        if not left or per_slot <= 0:
            return 1
        return int(min(60, max(1, min(left) / per_slot)))

    def _loop(self):
        while True:
            with self._cv:
                while not self._closing and not self._queue and all(s.req is None for s in self.slots):
                    self._cv.wait()
                if self._closing:
                    break
                self._admit()
            try:
                self._step()
            except Exception as e:          # a bug or an out-of-memory: fail what ran, go on
                log.exception("llmrt: engine step failed")
                for s in self.slots:
                    if s.req is not None:
                        self._finish(s, "error", error=f"{type(e).__name__}: {e}")
                        s.reset()
        with self._cv:
            waiting = list(self._queue)
            self._queue.clear()
        for req in waiting:
            self._end_unadmitted(req, "error", "the engine was closed", "closed")
        for s in self.slots:
            if s.req is not None:
                self._finish(s, "error", error="the engine was closed", error_type="closed")

    def _end_unadmitted(self, req: Request, reason: str, error: Optional[str] = None,
                        error_type: Optional[str] = None):
        req.finish_reason, req.error, req.error_type = reason, error, error_type
        req.t_done = time.monotonic()
        self._m["finish_" + reason] += 1
        req._done.set()
        req._emit("done", None)

    def _admit(self):
        """(under the lock) Queued requests to idle slots, FIFO; drops cancelled and expired."""
        now = time.monotonic()
        keep = collections.deque()
        while self._queue:
            req = self._queue.popleft()
            if req.cancelled:
                self._end_unadmitted(req, "cancelled")
                continue
            idle = [s for s in self.slots if s.req is None]
            if not idle:
                if now - req.t_submit > self.queue_timeout:
                    self._end_unadmitted(req, "error", f"waited {self.queue_timeout:g} s for a free slot",
                                         "timeout")
                else:
                    keep.append(req)
                continue
            if req.prompt_logprobs is not None:     # scored: every id's logits, so no reuse, and
                empty = [s for s in idle if not s.history]   # no conversation's cache lost for it
                self._assign(empty[0] if empty else min(idle, key=lambda s: s.last_used), 0, req)
            else:
                self._assign(*self._pick(idle, req), req)
        self._queue = keep

    def _reuse(self, s: _Slot, ids: list) -> int:
        """Prompt ids slot s can keep: its whole history if the prompt extends it (evictions or
        not), else (never evicted) the common prefix, at most len(ids) - 1 (the last id's logits
        are needed) unless the cache holds exactly the prompt with its logits."""
        h = s.history
        if not h:
            return 0
        c = _common_prefix(h, ids)
        if c == len(h) and (c < len(ids) or s.last_logits is not None):
            return c
        if not s.exact:
            return 0
        return min(c, len(ids) - 1)

    def _pick(self, idle: list, req: Request):
        """The idle slot for a request: its conversation's; else one whose whole history the
        prompt continues, or that holds the whole prompt (a retry), most reused first; else an
        empty slot (a new conversation never cuts
        another one's cache while a slot is free, even when they share a system prompt); else
        one whose history the prompt mostly shares (>= half of it: little is lost); else the
        least recently used one. Returns (slot, the prompt ids it keeps: _reuse)."""
        if req.conversation is not None:
            for s in idle:
                if s.conversation == req.conversation:
                    return s, self._reuse(s, req.prompt_ids)
        reuse = {s.id: self._reuse(s, req.prompt_ids) for s in idle}
        n = len(req.prompt_ids)         # the prompt continues the history, or lies within it
        whole = [s for s in idle if reuse[s.id] > 0 and reuse[s.id] >= min(len(s.history), n - 1)]
        empty = [s for s in idle if not s.history]
        most = [s for s in idle if 2 * reuse[s.id] >= len(s.history)]
        if whole:
            s = max(whole, key=lambda s: reuse[s.id])
        elif empty:
            s = empty[0]
        elif most:
            s = max(most, key=lambda s: (reuse[s.id], -s.last_used))
        else:
            s = min(idle, key=lambda s: s.last_used)
        return s, reuse[s.id]

    def _assign(self, s: _Slot, n: int, req: Request):
        """Give slot s to req, keeping n of its cached ids (_reuse(s, req.prompt_ids))."""
        ids = req.prompt_ids
        if n == 0:
            s.reset()
        elif n < len(s.history):
            s.session.truncate(n)
            del s.history[n:]
            s.last_logits = None
        # the request's pinned count whether the cache starts afresh or keeps a prefix, so that no
        # request runs with the n_keep of the slot's last one (on a kept prefix it only moves
        # where later evictions start); n_discard the engine's where it fits beside it
        keep = self.n_keep if req.n_keep is None else min(req.n_keep, s.session.n_ctx - 1)
        ses = s.session
        if ses.n_keep != keep or ses.n_discard != self.n_discard:
            ses.n_discard = -1
            ses.n_keep = keep
            ses.n_discard = self.n_discard if self.n_discard <= ses.n_ctx - ses.n_keep else -1
        s.req = req
        s.pending = list(ids[n:])
        s.next_tok = None
        s.prev_ids = list(ids)
        s.rel = _Release(self.tokenizer, req.stop, None)
        s.conversation = req.conversation
        s.admit_seq = next(self._admit_seq)
        req.slot = s.id
        req.usage.cached_tokens = n
        self._m["prompt_tokens"] += len(ids)
        self._m["cached_tokens"] += n
        log.debug("llmrt: request %d -> slot %d: %d prompt ids, %d reused", req.id, s.id, len(ids), n)

    def _step(self):
        for s in self.slots:
            if s.req is None:
                continue
            if s.req.cancelled:
                self._finish(s, "cancelled")
            elif not s.pending and s.next_tok is None and not s.req.ids:
                self._sample(s, s.last_logits)   # the cache held the whole prompt, with its logits
        # one prefill chunk, oldest admission first; short while other streams wait on this step
        pre = [s for s in self.slots if s.req is not None and s.pending]
        dec = [s for s in self.slots if s.req is not None and s.next_tok is not None]
        if pre:
            s = min(pre, key=lambda s: s.admit_seq)
            if dec and len(dec) < N_BATCH and s.req.prompt_logprobs is None:
                n = min(self._prefill_limit(), len(s.pending), N_BATCH - len(dec))
                if n <= s.session.n_ctx - s.session.n_past:  # fits without an eviction: one run
                    self._mixed_step(s, n, dec)
                    return
            limit = self._prefill_limit() if dec else self.n_batch
            if s.req.prompt_logprobs is not None:   # every row's logits: at most ~32 MB of them
                limit = max(1, min(limit, _SCORED_LOGITS // max(1, self.model.n_vocab)))
            chunk = s.pending[:limit]
            del s.pending[:limit]
            t0 = time.perf_counter()
            scored = s.req.prompt_logprobs is not None     # (its time is not a plain prefill's)
            try:
                self._eval_one(s, chunk)
            except Exception as e:          # e.g. n_keep leaves no room: this request only
                log.exception("llmrt: prefill of request %d failed", s.req.id)
                self._finish(s, "error", error=f"{type(e).__name__}: {e}")
            else:
                if not scored:
                    self._pre_tok_s = _average(self._pre_tok_s, (time.perf_counter() - t0) / len(chunk))
                self._m["prefill_tokens"] += len(chunk)
                self._m["prefill_chunks"] += 1
                if not s.pending:
                    self._sample(s, s.last_logits)
        # one decode step for every slot with a sampled token to evaluate
        dec = [s for s in self.slots if s.req is not None and s.next_tok is not None]
        for i in range(0, len(dec), N_BATCH):
            group = dec[i:i + N_BATCH]
            toks = [s.next_tok for s in group]
            t0 = time.perf_counter()
            try:
                logits = self.model.eval_sessions([s.session for s in group], [[t] for t in toks])
            except Exception:
                for s in group:             # the caches may be half-written: start them afresh
                    s.next_tok = None
                raise
            self._dec_s = _average(self._dec_s, time.perf_counter() - t0)
            self._decoded(group, toks, logits)

    def _decoded(self, group: list, toks: list, logits):
        """After a decode step of the slots in group (their tokens toks): count it, then each slot
        keeps its token and samples the next one from its row of logits."""
        with self._cv:
            self._m["decode_steps"] += 1
            self._recent.append((time.monotonic(), len(group)))
        for s, t, lg in zip(group, toks, logits):
            s.history.append(t)
            s.last_logits = lg
            s.next_tok = None
            self._sample(s, lg)

    def _mixed_step(self, s: _Slot, n: int, dec: list):
        """Slot s's next n prompt ids (they fit its cache without an eviction) and the decode step
        of every slot in dec in one graph run (Model.eval_sessions): each row's bits are those of
        the chunk run alone and of the step run alone (the kernels are exact per row and token,
        attention per sequence), the weights are read once, and the chunk's share of the run
        (its time less the decode step's average) updates the per-token prefill estimate."""
        chunk = s.pending[:n]
        del s.pending[:n]
        toks = [d.next_tok for d in dec]
        t0 = time.perf_counter()
        try:
            logits = self.model.eval_sessions([s.session] + [d.session for d in dec], [chunk] + [[t] for t in toks])
        except Exception:
            s.reset()                       # the caches may be half-written: start them afresh
            for d in dec:
                d.next_tok = None
            raise
        dt = time.perf_counter() - t0
        s.history.extend(chunk)
        s.last_logits = logits[0]
        with self._cv:
            self._m["prefill_tokens"] += len(chunk)
            self._m["prefill_chunks"] += 1
            self._m["mixed_steps"] += 1
        if self._dec_s is not None and dt > self._dec_s:
            self._pre_tok_s = _average(self._pre_tok_s, (dt - self._dec_s) / len(chunk))
        if not s.pending:
            self._sample(s, s.last_logits)
        self._decoded(dec, toks, logits[1:])

    def _prefill_limit(self) -> int:
        """Prompt tokens to prefill in a step that also decodes running streams: prefill_chunk,
        or (auto) as many as take about _PREFILL_SHARE decode steps by the measured averages
        (a running stream then waits ~3 steps' time for its token instead of a whole n_batch
        chunk's), at least _PREFILL_MIN; never more than n_batch."""
        if self.prefill_chunk is not None:
            return self.prefill_chunk
        if self._dec_s is None or not self._pre_tok_s:
            n = 2 * _PREFILL_MIN                   # nothing measured yet
        else:
            n = int(_PREFILL_SHARE * self._dec_s / self._pre_tok_s)
        return min(self.n_batch, max(_PREFILL_MIN, n))

    def _eval_one(self, s: _Slot, ids: list):
        req = s.req
        scored = req is not None and req.prompt_logprobs is not None
        try:
            out = s.session.eval(ids, all_logits=scored)
        except Exception:
            s.reset()
            raise
        s.history.extend(ids)
        if scored:      # row r predicts the prompt id after ids[r] (the last row: the first output)
            done = len(req.prompt_logprobs)
            nxt = req.prompt_ids[done + 1:done + 1 + len(ids)]
            req.prompt_logprobs.extend(token_logprob(out[r], t, req.top_logprobs) for r, t in enumerate(nxt))
            out = out[-1]
        s.last_logits = out

    def _sample(self, s: _Slot, logits):
        req = s.req
        if req.cancelled:
            self._finish(s, "cancelled")
            return
        if req.max_tokens == 0:         # the prompt scored (prompt_logprobs), nothing generated
            self._finish(s, "length")
            return
        try:
            tok = sample_next(req.sampler, logits, s.prev_ids, req.constraint)
        except Exception as e:          # e.g. non-finite logits, a grammar too ambiguous, no token
            log.error("llmrt: request %d: %s", req.id, e)   # left by the grammar and logit_bias:
            # this request, not the step's others; a constraint's refusal is the request's own
            self._finish(s, "error", error=f"{type(e).__name__}: {e}",
                         error_type="invalid" if req.constraint is not None and isinstance(e, ValueError)
                         else "internal")
            return
        if req.t_first is None:
            req.t_first = time.monotonic()
        req.ids.append(tok)
        s.prev_ids.append(tok)
        self._m["generated_tokens"] += 1
        if tok in self._eog and (not req.ignore_eos or req.constraint is not None):
            self._finish(s, "stop")     # (constrained: the constraint allowed it, the text is complete)
            return
        if req.top_logprobs is not None:
            lp = token_logprob(logits, tok, req.top_logprobs)
            req.logprobs.append(lp)
            req._emit("logprobs", lp)
        n0 = len(s.rel.out)
        hit = s.rel.push(tok)
        req._emit("text", "".join(s.rel.out[n0:]))
        if hit:
            req.stop_matched = s.rel.matched
            self._finish(s, "stop")
        elif req.constraint is not None and req.constraint.done:
            self._finish(s, "stop")     # the text is complete (llama.cpp's grammar: only eog next)
        elif req.max_tokens is not None and len(req.ids) >= req.max_tokens:
            self._finish(s, "length")
        elif getattr(s.session, "kv_mode", None) == "none" and s.session.n_past >= s.session.n_ctx:
            # nothing is evicted and the cache is full: this request ends as Model.generate's
            # does (llama.cpp's context limit), the others in the step go on
            self._finish(s, "length")
        else:
            s.next_tok = tok

    def _finish(self, s: _Slot, reason: str, error: Optional[str] = None, error_type: str = "internal"):
        req = s.req
        if req is None:
            return
        if reason != "error":
            n0 = len(s.rel.out)
            s.rel.finish()
            req._emit("text", "".join(s.rel.out[n0:]))
        req.text = s.rel.result_text() if s.rel is not None else ""
        req.finish_reason, req.error = reason, error
        req.error_type = error_type if reason == "error" else None
        req.usage.completion_tokens = len(req.ids)
        req.t_done = time.monotonic()
        s.req, s.pending, s.next_tok, s.rel = None, [], None, None
        s.last_used = req.t_done
        with self._cv:
            self._m["finish_" + reason] += 1
            self._cv.notify_all()
        req._done.set()
        req._emit("done", None)
