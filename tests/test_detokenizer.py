"""Tests of llmrt.tokenizer.IncrementalDetokenizer: streamed text == Tokenizer.decode(all ids).

Random id sequences over both real vocabularies (SmolLM2 byte-level BPE, Gemma 3 SentencePiece
with <0xXX> byte fallback), sequences built to split multi-byte characters (emoji, CJK, ZWJ
sequences) across byte tokens, special tokens with and without skip_special, SPM dummy-prefix
spaces after BOS, and clean_spaces vocabularies. Every chunk put() returns must be whole
characters: re-encoding it as UTF-8 and decoding again gives it back, and no chunk is cut inside
a character that the full decode keeps whole.

Run: pytest tests/test_detokenizer.py
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from llmrt.tokenizer import BYTE_TO_UNICODE, TT_NORMAL, IncrementalDetokenizer, Tokenizer
from test_tokenizer import TEXTS, gemma, make_spm_md, smol  # noqa: F401  (fixtures)


def stream(tok, ids, skip_special=False):
    det = IncrementalDetokenizer(tok, skip_special=skip_special)
    chunks = [det.put(i) for i in ids]
    chunks.append(det.flush())
    return chunks


def check_stream(tok, ids, skip_special=False):
    chunks = stream(tok, ids, skip_special)
    full = tok.decode(ids, skip_special=skip_special)
    assert "".join(chunks) == full, (ids, chunks, full)
    # chunk boundaries fall on character boundaries of the full text: the chunks are a
    # partition of `full` into pieces of whole characters (no U+FFFD from a split character
    # unless the full decode has it at the same place)
    pos = 0
    for c in chunks:
        assert full[pos:pos + len(c)] == c
        pos += len(c)
    return chunks


@pytest.fixture(params=["smol", "gemma"])
def real(request):
    if request.param == "gemma":
        request.applymarker(pytest.mark.slow)
    return request.getfixturevalue(request.param)


def test_stream_equals_decode_random_ids(real):
    tok, _ = real
    rng = np.random.default_rng(7)
    for n in (1, 2, 5, 40, 300):
        for _ in range(20):
            ids = rng.integers(0, tok.n_vocab, size=n).tolist()
            check_stream(tok, ids)
            check_stream(tok, ids, skip_special=True)


def test_stream_equals_decode_encoded_texts(real):
    tok, _ = real
    for t in TEXTS:
        for add_special in (False, True):
            ids = tok.encode(t, add_special=add_special)
            check_stream(tok, ids)
            check_stream(tok, ids, skip_special=True)
            if add_special:
                assert "".join(stream(tok, ids, True)) == tok.decode(ids, skip_special=True)


def byte_ids(tok, data: bytes):
    """Token ids that spell `data` one byte per token (None for a byte the vocabulary lacks:
    SmolLM2 has no single-byte tokens for bytes that never occur in UTF-8, like 0xFF)."""
    if tok.vocab_type == "spm":
        return [tok.token_to_id("<0x%02X>" % b) for b in data]
    return [tok.token_to_id(BYTE_TO_UNICODE[b]) for b in data]


def has_byte(tok, b: int) -> bool:
    return byte_ids(tok, bytes([b]))[0] is not None


@pytest.mark.parametrize("s", ["🤗", "👨‍👩‍👧‍👦", "日本語", "é", "🏳️‍🌈", "a€b"])
def test_multibyte_split_across_byte_tokens(real, s):
    tok, _ = real
    ids = byte_ids(tok, s.encode("utf-8"))
    chunks = check_stream(tok, ids)
    assert "".join(chunks) == s
    assert "\ufffd" not in "".join(chunks)
    # nothing is released until a character is complete
    data, got = s.encode("utf-8"), ""
    det = IncrementalDetokenizer(tok)
    for k, i in enumerate(ids):
        got += det.put(i)
        assert got == data[:k + 1].decode("utf-8", errors="ignore")


def test_invalid_utf8_bytes_are_replaced_like_decode(real):
    tok, _ = real
    rnd = random.Random(8)
    pool = [b for b in (0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0xA4, 0x97, 0x41, 0xC3, 0xA9, 0x80, 0xC0, 0xFF)
            if has_byte(tok, b)]
    for _ in range(200):
        data = bytes(rnd.choice(pool) for _ in range(rnd.randint(1, 12)))
        ids = byte_ids(tok, data)
        chunks = check_stream(tok, ids)
        assert "".join(chunks) == data.decode("utf-8", errors="replace")


def test_random_bytes_mixed_with_pieces(real):
    tok, _ = real
    rng = np.random.default_rng(9)
    bytes_ = [i for i in byte_ids(tok, bytes(range(256))) if i is not None]
    for _ in range(100):
        ids = []
        for _ in range(rng.integers(1, 30)):
            if rng.random() < 0.5:
                ids.append(int(rng.choice(bytes_)))
            else:
                ids.append(int(rng.integers(0, tok.n_vocab)))
        check_stream(tok, ids)


def test_special_tokens_in_stream(smol):
    tok, _ = smol
    ids = tok.encode("<|im_start|>assistant\nHello 🤗<|im_end|>", add_special=False, parse_special=True)
    assert "".join(stream(tok, ids)) == "<|im_start|>assistant\nHello 🤗<|im_end|>"
    assert "".join(stream(tok, ids, skip_special=True)) == "assistant\nHello 🤗"


@pytest.mark.slow
def test_gemma_bos_then_text(gemma):
    tok, _ = gemma
    ids = tok.encode(" Hello world", add_special=True)
    assert ids[0] == tok.bos_id
    assert "".join(stream(tok, ids)) == "<bos> Hello world"
    assert "".join(stream(tok, ids, skip_special=True)) == " Hello world"


# ---- synthetic vocabularies: SPM dummy prefix, EOS kept/dropped, clean_spaces -----------------------

def test_spm_prefix_space_first_token():
    tok = Tokenizer.from_gguf(make_spm_md())
    h, w = tok.token_to_id("▁Hello"), tok.token_to_id("▁world")
    for ids in ([h, w], [1, h, w], [1, h], [h], [1], [w, 1, h], [tok.token_to_id("<0x20>"), h]):
        for skip in (False, True):
            check_stream(tok, ids, skip)
    assert "".join(stream(tok, [h, w])) == "Hello world"         # dummy prefix removed
    assert "".join(stream(tok, [1, h, w], True)) == " Hello world"  # as decode after a BOS


def test_spm_continuation_keeps_first_space():
    tok = Tokenizer.from_gguf(make_spm_md())
    h, w = tok.token_to_id("▁Hello"), tok.token_to_id("▁world")
    prompt = [1, h]
    det = IncrementalDetokenizer(tok, continuation=True)
    out = det.put(w) + det.flush()
    assert out == " world" == tok.decode(prompt + [w])[len(tok.decode(prompt)):]
    assert "".join(stream(tok, [w])) == "world"                  # a fresh text strips it


def test_spm_add_eos_dropped_only_at_the_end():
    md = make_spm_md()
    md["tokenizer.ggml.add_eos_token"] = True
    md["tokenizer.ggml.token_type"] = md["tokenizer.ggml.token_type"].copy()
    md["tokenizer.ggml.token_type"][2] = TT_NORMAL            # a visible EOS "[END]"
    md["tokenizer.ggml.tokens"] = ["<unk>", "<s>", "[END]"] + md["tokenizer.ggml.tokens"][3:]
    tok = Tokenizer.from_gguf(md)
    h = tok.token_to_id("▁Hello")
    for ids in ([1, h, 2], [1, h, 2, h], [2], [2, 2], [h, 2, 2], [1, 2]):
        for skip in (False, True):
            check_stream(tok, ids, skip)
    assert tok.decode([1, h, 2], skip_special=True) == " Hello"
    assert tok.decode([1, h, 2, h], skip_special=True) == " Hello[END] Hello"


def test_clean_spaces_stream_random():
    toks = [BYTE_TO_UNICODE[b] for b in range(256)] + ["Ġ'", "Ġ's", "Ġ.", "'re"]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": toks,
          "tokenizer.ggml.merges": []}
    tok = Tokenizer.from_gguf(md)
    assert tok.clean_spaces
    pool = [tok.token_to_id(t) for t in ("Ġ", "'", "s", "m", "r", "e", "v", "t", ".", ",", "?", "a",
                                         "Ġ'", "Ġ's", "Ġ.", "'re")]
    rnd = random.Random(10)
    for _ in range(2000):
        ids = [rnd.choice(pool) for _ in range(rnd.randint(1, 25))]
        check_stream(tok, ids)


def test_detokenizer_reusable_after_flush(smol):
    tok, _ = smol
    det = IncrementalDetokenizer(tok)
    a = tok.encode("first 🤗", add_special=False)
    b = tok.encode("second", add_special=False)
    s1 = "".join(det.put(i) for i in a) + det.flush()
    s2 = "".join(det.put(i) for i in b) + det.flush()
    assert (s1, s2) == ("first 🤗", "second")


def test_out_of_range_id_raises(smol):
    tok, _ = smol
    with pytest.raises(ValueError):
        IncrementalDetokenizer(tok).put(tok.n_vocab)
    with pytest.raises(ValueError):
        tok.decode([-1])
