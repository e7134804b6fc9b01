"""Session files: a conversation's or a generation's state saved so that a later process goes on
exactly where this one stopped (llama.cpp's --prompt-cache / slot save, for a streaming cache).

    save_session(path, session, sampler=sampler, extra={...})     # Session.save / ChatSession.save
    state = load_session(path, model)        # -> SavedSession: .session (a new Session), .sampler,
                                             #    .extra, .last_logits
    load_into(path, session)                 # restore into an existing Session (a server slot)

What is saved: the tokens, the streaming cache's cells exactly as they lie (KVCache.state(): K,
V, the pre-RoPE master keys, positions, the shift offset; cells keep their indices, so attention
sums in the same order and the next answer is the one the uninterrupted process would give),
n_keep, n_discard, kv_mode, the eviction counters, the sampler's parameters and random state,
and what the front end adds (a chat's messages and template).

Format (version 1): b"LLMRTSES", u32 version, u64 header length, a UTF-8 JSON header, then the
blobs the header lists (name, bytes, sha256). The header names the model by a fingerprint of its
architecture, hyperparameters, tensor table and the first bytes of three tensors. Loading checks
the magic, the version, the JSON, every header field's type and range (the header has no
checksum), the model, every blob's length and checksum and the cache image's shapes before
anything is allocated or changed: a foreign, truncated or damaged file, or one of
another model, is a SessionFileError (a ValueError) and the running session stays as it was.
Writes go to a temporary file in the same directory, are flushed to disk and renamed over the
real name: a crash never leaves half a file under it.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from llmrt.atomic import atomic_file
from llmrt.checks import C_INT_MAX, is_int, is_number

MAGIC = b"LLMRTSES"
VERSION = 1
_HEAD = struct.Struct("<8sIQ")       # magic, version, header bytes
MAX_HEADER = 256 << 20               # a header larger than this is not ours


class SessionFileError(ValueError):
    """A session file that cannot be loaded here (see the module doc)."""


def model_fingerprint(model) -> str:
    """sha256 over the model's architecture, vocabulary size, tensor table (names, types,
    shapes), the first 4 KB of three of its tensors and the weight-only quantization at load:
    another file (or the same one quantized otherwise) gets another fingerprint."""
    h = hashlib.sha256()
    h.update(f"{model.arch};{model.n_vocab};{getattr(model, 'wq', None)!r};".encode())
    tensors = model.gguf.tensors
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}:{int(t.type)}:{tuple(t.shape)};".encode())
    names = sorted(tensors)
    for name in (names[0], names[len(names) // 2], names[-1]):
        data = np.asarray(tensors[name].data).reshape(-1).view(np.uint8)
        h.update(data[:4096].tobytes())
    return h.hexdigest()


def sampler_state(sampler) -> Optional[dict]:
    if sampler is None:
        return None
    params = {k: getattr(sampler, k) for k in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty",
                                                 "repeat_last_n", "frequency_penalty", "presence_penalty",
                                                 "seed")}
    state = {"params": params, "rng": sampler.rng.bit_generator.state}
    bias = getattr(sampler, "logit_bias", None)
    if bias:                # [[id, bias], ...] (-inf written as JSON's -Infinity, read back as is)
        state["logit_bias"] = [[i, b] for i, b in bias.items()]
    return state


def restore_sampler(state: Optional[dict], path=""):
    """A Sampler with the saved parameters and random state (None if none was saved)."""
    if state is None:
        return None
    from llmrt.sampling import Sampler
    try:
        s = Sampler(**state["params"], logit_bias=state.get("logit_bias"))
    except (TypeError, ValueError, OverflowError) as e:
        raise SessionFileError(f"{path}: the sampler's parameters cannot be restored: {e}") from None
    try:
        s.rng.bit_generator.state = state["rng"]
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        raise SessionFileError(f"{path}: the sampler's random state cannot be restored: {e}") from None
    return s


def _write_atomic(path, chunks) -> None:
    # (a symlink's file is replaced, the link kept; a device refused: atomic_file)
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        for c in chunks:
            f.write(c)
        f.flush()
        os.fsync(f.fileno())


def save_session(path, session, *, sampler=None, extra: Optional[dict] = None, kind: str = "generation",
                 last_logits: Optional[np.ndarray] = None) -> int:
    """Write `session`'s state to `path` (atomically). Returns the bytes written."""
    model = session.model
    kv = session.cache.state()
    blobs = [("kv", kv)]
    if last_logits is not None:
        blobs.append(("logits", np.ascontiguousarray(last_logits, dtype="<f4").tobytes()))
    header = {
        "format": VERSION,
        "kind": kind,
        "model": {"fingerprint": model_fingerprint(model), "file": os.path.basename(str(model.path)),
                  "arch": model.arch},
        "session": {"n_ctx": session.n_ctx, "kv_dtype": model.kv_dtype, "kv_mode": session.kv_mode,
                    "n_keep": session.n_keep, "n_discard": session.n_discard,
                    "n_evicted": session.n_evicted, "n_shifts": session.n_shifts,
                    "tokens": [int(t) for t in session.tokens]},
        "sampler": sampler_state(sampler),
        "extra": extra or {},
        "blobs": [{"name": n, "bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in blobs],
    }
    head = json.dumps(header, ensure_ascii=False).encode("utf-8")
    chunks = [_HEAD.pack(MAGIC, VERSION, len(head)), head] + [b for _, b in blobs]
    _write_atomic(path, chunks)
    return sum(len(c) for c in chunks)


@dataclass
class SavedSession:
    header: dict
    blobs: dict
    session: object = None
    sampler: object = None
    extra: dict = field(default_factory=dict)
    last_logits: Optional[np.ndarray] = None


def read_session_file(path, model) -> SavedSession:
    """Read and check a session file against `model` (nothing is restored yet)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"a session file path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fsdecode(os.fspath(path))
    try:
        # the header first, the blobs only once it has been checked: a large file that is not a
        # session file (a device such as /dev/zero, a model) is never read whole
        if not stat.S_ISREG(os.stat(path).st_mode):     # before open(): a fifo's would block
            raise SessionFileError(f"{path}: not a regular file")
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            head = f.read(_HEAD.size)
            if len(head) < _HEAD.size or head[:8] != MAGIC:
                raise SessionFileError(f"{path}: not an llmrt session file")
            magic, version, n_head = _HEAD.unpack_from(head)
            if version != VERSION:
                raise SessionFileError(f"{path}: session file format {version}, this llmrt reads {VERSION}")
            if n_head > MAX_HEADER or _HEAD.size + n_head > st.st_size:
                raise SessionFileError(f"{path}: truncated session file (header)")
            try:
                header = json.loads(f.read(n_head).decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError) as e:
                raise SessionFileError(f"{path}: damaged session file header ({e})") from None
            _check_header(header, path, model.n_vocab)
            blobs_meta, sess, mdl = header["blobs"], header["session"], header["model"]
            fp = model_fingerprint(model)
            if mdl.get("fingerprint") != fp:
                raise SessionFileError(f"{path}: saved with another model ({mdl.get('file')}, {mdl.get('arch')}), "
                                       f"not {os.path.basename(str(model.path))}")
            at = _HEAD.size + n_head
            total = at + sum(int(b["bytes"]) for b in blobs_meta)
            if total != st.st_size:
                raise SessionFileError(
                    f"{path}: {'truncated' if total > st.st_size else 'damaged'} session file ({st.st_size} "
                    f"bytes, the header describes {total})")
            blobs = {}
            for b in blobs_meta:
                n = int(b["bytes"])
                data = f.read(n)
                if len(data) != n:
                    raise SessionFileError(f"{path}: truncated session file ({b['name']}: {len(data)} of {n} bytes)")
                if hashlib.sha256(data).hexdigest() != b["sha256"]:
                    raise SessionFileError(f"{path}: damaged session file ({b['name']} checksum)")
                blobs[b["name"]] = data
    except OSError as e:
        raise SessionFileError(f"{path}: cannot read the session file: {e.strerror or e}") from None
    if "kv" not in blobs:
        raise SessionFileError(f"{path}: no cache image in the session file")
    if len(blobs["kv"]) < 12 or struct.unpack_from("<3i", blobs["kv"]) != (_KV_MAGIC, model.hparams.n_layer,
                                                                            sess["n_ctx"]):
        raise SessionFileError(f"{path}: the cache image is not one of {model.hparams.n_layer} layers x "
                               f"{sess['n_ctx']} cells (the header's): damaged file")
    if sess.get("kv_dtype") != model.kv_dtype:
        raise SessionFileError(f"{path}: saved with a {sess.get('kv_dtype')} KV cache, this model runs "
                               f"{model.kv_dtype} (kv_dtype)")
    out = SavedSession(header=header, blobs=blobs, extra=header.get("extra") or {})
    if "logits" in blobs:
        lg = np.frombuffer(blobs["logits"], dtype="<f4")
        if lg.size != model.n_vocab:
            raise SessionFileError(f"{path}: saved logits of {lg.size} entries, the model has {model.n_vocab}")
        out.last_logits = lg.astype(np.float32)
    return out


_KV_MAGIC = 0x31564B4C               # csrc/kv_cache.c's STATE_MAGIC: a cache image starts with it,
                                     # n_layer and n_ctx (int32 each)
_SAMPLER_PARAMS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                   "frequency_penalty", "presence_penalty", "seed")


def is_ids(v, n_vocab: int) -> bool:
    """v is a list of token ids of a vocabulary of n_vocab (a header's tokens, a chat's or a
    slot's history)."""
    return isinstance(v, list) and all(is_int(i, 0, n_vocab - 1) for i in v)


def _check_header(h, path, n_vocab: int) -> None:
    """Every header field the loaders read, of its type and range (the header is JSON without a
    checksum: a hand edit or a damaged byte can still parse), so that loading fails with a
    SessionFileError before anything is allocated or changed."""
    def need(ok, what):
        if not ok:
            raise SessionFileError(f"{path}: damaged session file header ({what})")
    need(isinstance(h, dict), "not a JSON object")
    need(isinstance(h.get("kind"), str), "kind")
    need(isinstance(h.get("model"), dict) and isinstance(h["model"].get("fingerprint"), str), "model")
    s = h.get("session")
    need(isinstance(s, dict), "session")
    need(is_int(s.get("n_ctx"), 1, C_INT_MAX), "session.n_ctx")
    need(isinstance(s.get("kv_dtype"), str), "session.kv_dtype")
    from llmrt.model import KV_MODES
    need(s.get("kv_mode") in KV_MODES, "session.kv_mode")
    for k in ("n_keep", "n_discard"):
        need(is_int(s.get(k), -1, C_INT_MAX), f"session.{k}")
    for k in ("n_evicted", "n_shifts"):
        need(is_int(s.get(k, 0), 0), f"session.{k}")
    t = s.get("tokens")
    need(is_ids(t, n_vocab) and len(t) <= s["n_ctx"],
         f"session.tokens: at most n_ctx ids of the vocabulary of {n_vocab}")
    b = h.get("blobs")
    need(isinstance(b, list) and all(isinstance(x, dict) and isinstance(x.get("name"), str)
                                     and is_int(x.get("bytes"), 0) and isinstance(x.get("sha256"), str)
                                     for x in b), "blobs")
    sp = h.get("sampler")
    need(sp is None or (isinstance(sp, dict) and isinstance(sp.get("params"), dict)
                        and set(sp["params"]) <= set(_SAMPLER_PARAMS)
                        and all(v is None or is_number(v) for v in sp["params"].values())
                        and isinstance(sp.get("rng"), dict)
                        and (sp.get("logit_bias") is None or isinstance(sp["logit_bias"], list)
                             and all(isinstance(x, list) and len(x) == 2 and is_int(x[0], 0, n_vocab - 1)
                                     and is_number(x[1]) for x in sp["logit_bias"]))), "sampler")
    need(isinstance(h.get("extra", {}), dict), "extra")


def _apply(saved: SavedSession, session, path) -> None:
    """Restore the checked state into `session` (its settings must match): all or nothing."""
    s = saved.header["session"]
    tokens = [int(t) for t in s["tokens"]]
    if session.n_ctx != s["n_ctx"] or session.kv_mode != s["kv_mode"]:
        raise SessionFileError(f"{path}: saved from a cache of {s['n_ctx']} cells in mode {s['kv_mode']}; "
                               f"this one has {session.n_ctx} in mode {session.kv_mode}")
    if session.cache.n_pending:
        raise SessionFileError(f"{path}: the session is in the middle of a run")
    before = session.cache.state()
    try:
        session.cache.load_state(saved.blobs["kv"])     # checked in C before any cell changes
    except ValueError as e:
        raise SessionFileError(f"{path}: {e}") from None
    if session.cache.n_used != len(tokens):
        session.cache.load_state(before)
        raise SessionFileError(f"{path}: {len(tokens)} tokens but {session.cache.n_used} cached: damaged file")
    try:
        keep, discard = session.n_keep, session.n_discard
        session.n_discard = -1
        session.n_keep = int(s["n_keep"])
        session.n_discard = int(s["n_discard"])
    except ValueError as e:
        session.cache.load_state(before)
        session.n_discard, session.n_keep = -1, keep
        session.n_discard = discard
        raise SessionFileError(f"{path}: {e}") from None
    session.tokens = tokens
    session.n_evicted = int(s.get("n_evicted", 0))
    session.n_shifts = int(s.get("n_shifts", 0))


def load_session(path, model) -> SavedSession:
    """A new Session of `model` restored from `path` (plus the saved sampler and extras)."""
    saved = read_session_file(path, model)
    s = saved.header["session"]
    sampler = restore_sampler(saved.header.get("sampler"), path)
    try:
        session = model.new_session(s["n_ctx"], n_keep=0, n_discard=-1, kv_mode=s["kv_mode"])
    except MemoryError:
        raise SessionFileError(f"{path}: a cache of {s['n_ctx']} cells does not fit in memory") from None
    _apply(saved, session, path)
    saved.session = session
    saved.sampler = sampler
    return saved


def load_into(path, session) -> SavedSession:
    """Restore `path` into an existing Session (same n_ctx and kv_mode): all or nothing."""
    saved = read_session_file(path, session.model)
    sampler = restore_sampler(saved.header.get("sampler"), path)
    _apply(saved, session, path)
    saved.session = session
    saved.sampler = sampler
    return saved
