"""TextStreamer / TextIteratorStreamer: HF's put/end contract, UTF-8 kept whole, threads, and the
text they show equals the tokenizer's decode (fake and real tokenizers)."""
from __future__ import annotations

import queue
import threading

import numpy as np
import pytest
import torch

from fake_lm import BYTE0, EOS, IM_START, FakeSession, FakeTokenizer, real_tokenizer
from llmrt.generation import GenerationResult, generate
from llmrt.streamers import TextIteratorStreamer, TextStreamer

THREAD_TIMEOUT = 30.0    # seconds; generous for a loaded 2-core machine


class Collect(TextStreamer):
    """TextStreamer that records on_finalized_text calls instead of printing."""

    def __init__(self, tok, **kw):
        super().__init__(tok, **kw)
        self.calls: list[tuple[str, bool]] = []

    def on_finalized_text(self, text, stream_end=False):
        self.calls.append((text, stream_end))

    @property
    def text(self):
        return "".join(t for t, _ in self.calls)


EURO = [BYTE0 + 0xE2, BYTE0 + 0x82, BYTE0 + 0xAC]       # "€" as three byte tokens


def test_text_streamer_prints_to_stdout(capsys):
    tok = FakeTokenizer()
    st = TextStreamer(tok)
    st.put(tok.encode("Hello"))
    st.put([tok.id_of(b" world")])
    st.end()
    assert capsys.readouterr().out == "<s>Hello world\n"     # prompt shown, newline at the end


def test_skip_prompt_drops_the_first_put_only(capsys):
    tok = FakeTokenizer()
    st = TextStreamer(tok, skip_prompt=True)
    for _ in range(2):                       # after end() the next put is a prompt again
        st.put(tok.encode("Hello"))
        st.put(tok.encode(" world", add_special=False))
        st.end()
    assert capsys.readouterr().out == " world\n world\n"


@pytest.mark.parametrize("wrap", [list, tuple, np.array, lambda x: np.array([x]), torch.tensor,
                                  lambda x: torch.tensor([x])],
                         ids=["list", "tuple", "numpy", "numpy-2d", "torch", "torch-2d"])
def test_put_accepts_lists_arrays_tensors(wrap):
    tok = FakeTokenizer()
    st = Collect(tok, skip_prompt=True)
    st.put(wrap([1, 2]))
    st.put(wrap(tok.encode("Hello world", add_special=False)))
    st.end()
    assert st.text == "Hello world"


def test_put_rejects_batches():
    st = Collect(FakeTokenizer())
    with pytest.raises(ValueError, match="batch size 1"):
        st.put(np.zeros((2, 3), dtype=np.int64))


def test_multibyte_character_comes_out_whole():
    tok = FakeTokenizer()
    st = Collect(tok, skip_prompt=True)
    st.put([1])
    for i in EURO + EURO[:2]:                 # one whole euro sign, then two bytes of another
        st.put([i])
    st.end()
    assert st.calls == [("\u20ac", False), ("\ufffd", True)]   # the broken tail at the end only


def test_skip_special_tokens():
    tok = FakeTokenizer()
    for kw in (dict(skip_special_tokens=True), dict(skip_special=True)):
        st = Collect(tok, **kw)
        st.put([IM_START] + tok.encode("Hello", add_special=False) + [EOS])
        st.end()
        assert st.text == "Hello"


def test_put_text_drops_pending_bytes():
    tok = FakeTokenizer()
    st = Collect(tok, skip_prompt=True)
    st.put([1])
    st.put(EURO[:2])
    st.put_text("a\u20ac")
    st.end()
    assert st.calls == [("a\u20ac", False), ("", True)]


def test_iterator_streamer_from_a_thread():
    tok = FakeTokenizer()
    script = tok.encode("Hello world! the \u20ac", add_special=False) + EURO

    def next_fn(tokens):
        i = len(tokens) - 1
        return script[i] if i < len(script) else EOS

    st = TextIteratorStreamer(tok, skip_prompt=True, timeout=THREAD_TIMEOUT)
    res = GenerationResult()
    t = threading.Thread(target=generate, args=(FakeSession(tok.n_vocab, next_fn), [1], tok),
                         kwargs=dict(streamer=st, result=res, temperature=0.0))
    t.start()
    pieces = list(st)
    t.join(THREAD_TIMEOUT)
    assert "".join(pieces) == res.text == "Hello world! the \u20ac\u20ac"
    assert pieces[-1] == ""                  # HF: end() queues the (empty) tail, then stops


def test_iterator_streamer_timeout_raises_queue_empty():
    st = TextIteratorStreamer(FakeTokenizer(), timeout=0.05)
    with pytest.raises(queue.Empty):
        next(iter(st))


def test_hf_text_streamer_works_with_generate(capsys):
    """transformers' own TextStreamer consumes what generate() puts (numpy int64 arrays)."""
    from transformers import TextStreamer as HFTextStreamer

    class HFish:                             # all HF's TextStreamer needs: decode(ids, **kw)
        def __init__(self, tok):
            self.tok = tok

        def decode(self, ids, **kw):     # one id or a list, as HF tokenizers take (5.x passes an int)
            return self.tok.decode([ids] if isinstance(ids, int) else ids)

    tok = FakeTokenizer()
    script = tok.encode("Hello world the END\nHello", add_special=False)

    def next_fn(tokens):
        i = len(tokens) - 2
        return script[i] if i < len(script) else EOS

    res = GenerationResult()
    generate(FakeSession(tok.n_vocab, next_fn), [1, 7], tok, result=res, temperature=0.0,
             streamer=HFTextStreamer(HFish(tok), skip_prompt=True))
    assert capsys.readouterr().out == res.text + "\n" == "Hello world the END\nHello\n"


# ---- real tokenizers -----------------------------------------------------------------------

TEXTS = ["Hello world! It's 3.14159 -- isn't it?",
         "Emoji: \U0001F600\U0001F44D\U0001F3FD, CJK: \u4f60\u597d\u4e16\u754c, "
         "accents: caf\u00e9 na\u00efve, Cyrillic: \u043f\u0440\u0438\u0432\u0435\u0442",
         "  leading spaces\n\ttabs\n\nand newlines  ",
         "<|im_start|>user\nhi<|im_end|>"]


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma3-270m"])
@pytest.mark.parametrize("text", TEXTS, ids=["ascii", "unicode", "spaces", "specials"])
def test_real_tokenizer_stream_equals_decode(name, text):
    tok, _ = real_tokenizer(name)
    ids = tok.encode(text, add_special=False, parse_special=True)
    st = Collect(tok, skip_prompt=True)
    st.put(tok.encode("x"))
    for i in ids:                            # one token per put, as generation does
        st.put([i])
    st.end()
    assert st.text == tok.decode(ids)
    assert all("\ufffd" not in t for t, _ in st.calls)
