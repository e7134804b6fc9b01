"""Streamers: text out of a running generation, with Hugging Face's `put(value)` / `end()` contract.

    model.generate(ids, streamer=TextStreamer(tok, skip_prompt=True))        # prints as it goes

    st = TextIteratorStreamer(tok, skip_prompt=True, timeout=60)
    threading.Thread(target=model.generate, args=(ids,), kwargs={"streamer": st}).start()
    for text in st:                                                           # in this thread
        ...

The contract (transformers.generation.streamers):
- `put(value)` receives token ids: a list, a numpy array or a torch tensor (anything with
  `.tolist()`), 1-D or a 2-D batch of one. The first `put` is the prompt; `skip_prompt=True`
  drops it. Then one `put` per released group of new tokens.
- `end()` closes the stream: pending text is flushed and `on_finalized_text(text,
  stream_end=True)` is called; the next `put` is a prompt again.
- `on_finalized_text(text, stream_end)` is the hook to override: TextStreamer prints to stdout
  (flushed, a newline at the end), TextIteratorStreamer queues the text for its iterator.

Text comes from an incremental detokenizer (O(1) per token): a character whose UTF-8 bytes are
split over several tokens is emitted whole, once its last byte arrives. Unlike HF's TextStreamer,
which re-decodes and waits for a space, text is printed as soon as it is complete.

llmrt extension: `put_text(text)`. Generation holds back ids whose text might begin a stop string;
when a stop string starts inside a token, the text before it is not the text of any whole id,
so generation hands it over with `put_text` (and never `put`s that token). Streamers without
`put_text` (foreign HF ones) miss just that fragment.
"""
from __future__ import annotations

import codecs
import queue

from llmrt.tokenizer import IncrementalDetokenizer, Tokenizer


class _ByteDetokenizer:
    """Incremental detokenizer over the public tokenizer interface only: token_to_piece bytes
    through a UTF-8 incremental decoder (invalid bytes -> U+FFFD). For tokenizers that are not
    llmrt's own (test fakes, wrappers)."""

    def __init__(self, tokenizer, skip_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def put(self, id: int) -> str:
        if self.skip_special and self.tokenizer.is_special(id):
            return ""
        return self._dec.decode(self.tokenizer.token_to_piece(id))

    def flush(self) -> str:
        s = self._dec.decode(b"", final=True)
        self._dec.reset()
        return s


def make_detokenizer(tokenizer, skip_special: bool = False):
    """A fresh incremental detokenizer: `.put(id) -> str` (newly completed text), `.flush()`.
    llmrt's Tokenizer gets its own (SPM space prefix, clean-up of spaces); any other object
    with token_to_piece/is_special the generic byte-level one."""
    cls = IncrementalDetokenizer if isinstance(tokenizer, Tokenizer) else _ByteDetokenizer
    return cls(tokenizer, skip_special=skip_special)


def as_id_list(value) -> list[int]:
    """Token ids from a list, tuple, int, numpy array or torch tensor; [1, n] batches allowed."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, int):
        return [value]
    value = list(value)
    if value and isinstance(value[0], (list, tuple)):
        if len(value) > 1:
            raise ValueError(f"streamers support batch size 1 only, got a batch of {len(value)}")
        value = list(value[0])
    return [int(v) for v in value]


class BaseStreamer:
    """What generation calls: put(ids) for the prompt and then new tokens, end() once."""

    def put(self, value):
        raise NotImplementedError

    def end(self):
        raise NotImplementedError


class TextStreamer(BaseStreamer):
    """Prints text to stdout as soon as it is complete.

    decode_kwargs: `skip_special_tokens=True` (HF name) or `skip_special=True` leaves special
    tokens out of the text; other HF decode options are accepted and ignored."""

    def __init__(self, tokenizer, skip_prompt: bool = False, **decode_kwargs):
        self.tokenizer = tokenizer
        self.skip_prompt = skip_prompt
        self.decode_kwargs = decode_kwargs
        self.skip_special = bool(decode_kwargs.get("skip_special_tokens",
                                                   decode_kwargs.get("skip_special", False)))
        self._detok = make_detokenizer(tokenizer, self.skip_special)
        self.next_tokens_are_prompt = True

    def put(self, value):
        ids = as_id_list(value)
        if self.skip_prompt and self.next_tokens_are_prompt:
            self.next_tokens_are_prompt = False
            return
        self.next_tokens_are_prompt = False
        text = "".join([self._detok.put(i) for i in ids])
        if text:
            self.on_finalized_text(text)

    def put_text(self, text: str):
        """llmrt extension: final text that is not the text of whole ids (see module doc).
        Bytes still pending from earlier ids are part of `text` and are dropped here."""
        self._detok = make_detokenizer(self.tokenizer, self.skip_special)
        self.next_tokens_are_prompt = False
        if text:
            self.on_finalized_text(text)

    def end(self):
        text = self._detok.flush()
        self._detok = make_detokenizer(self.tokenizer, self.skip_special)
        self.next_tokens_are_prompt = True
        self.on_finalized_text(text, stream_end=True)

    def on_finalized_text(self, text: str, stream_end: bool = False):
        """Prints `text` (flushed); a newline after the last piece."""
        print(text, flush=True, end="" if not stream_end else None)


class TextIteratorStreamer(TextStreamer):
    """Queues text for an iterator in another thread. Iteration stops after `end()`; with a
    `timeout` (seconds), waiting longer raises queue.Empty, as in HF."""

    def __init__(self, tokenizer, skip_prompt: bool = False, timeout: float | None = None,
                 **decode_kwargs):
        super().__init__(tokenizer, skip_prompt, **decode_kwargs)
        self.text_queue: queue.Queue = queue.Queue()
        self.stop_signal = None
        self.timeout = timeout

    def on_finalized_text(self, text: str, stream_end: bool = False):
        self.text_queue.put(text, timeout=self.timeout)
        if stream_end:
            self.text_queue.put(self.stop_signal, timeout=self.timeout)

    def __iter__(self):
        return self

    def __next__(self) -> str:
        value = self.text_queue.get(timeout=self.timeout)
        if value is self.stop_signal:
            raise StopIteration()
        return value
