"""The generation loop with a scripted fake model: eog ids, max_new_tokens, stop strings split
across tokens (never leaked), UTF-8 kept whole, the streamer contract, cache reuse, Ctrl-C."""
from __future__ import annotations

import numpy as np
import pytest

from fake_lm import EOS, EOT, IM_END, FakeSession, FakeTokenizer
from llmrt.generation import GenerationResult, generate, prefill
from llmrt.streamers import BaseStreamer

GREEDY = dict(temperature=0.0)


class Recorder(BaseStreamer):
    """Records every put (as id lists), put_text and end, and decodes like a real streamer."""

    def __init__(self, tok):
        self.tok = tok
        self.puts: list[list[int]] = []
        self.texts: list[str] = []
        self.ends = 0

    def put(self, value):
        self.puts.append([int(v) for v in np.asarray(value).ravel()])

    def put_text(self, text):
        if text:
            self.texts.append(text)

    def end(self):
        self.ends += 1

    def new_ids(self):
        return [i for p in self.puts[1:] for i in p]


def pieces_to_ids(tok, pieces):
    """Script pieces: str/bytes -> one token each (a WORDS entry or a single byte)."""
    return [tok.id_of(p.encode() if isinstance(p, str) else p) if not isinstance(p, int) else p
            for p in pieces]


def run(script, stop=(), max_new_tokens=64, ignore_eos=False, tok=None, prompt=None,
        streamer=None, end=EOS, **kw):
    """Generate with a model that emits `script` after the prompt, then `end`."""
    tok = tok or FakeTokenizer()
    prompt = prompt if prompt is not None else tok.encode("Hello")
    ids = pieces_to_ids(tok, script)

    def next_fn(tokens):
        i = len(tokens) - len(prompt)
        return ids[i] if 0 <= i < len(ids) else end

    sess = FakeSession(tok.n_vocab, next_fn)
    st = streamer if streamer is not None else Recorder(tok)
    res = GenerationResult()
    out = generate(sess, prompt, tok, streamer=st, max_new_tokens=max_new_tokens, stop=stop,
                   ignore_eos=ignore_eos, result=res, **{**GREEDY, **kw})
    return out, res, st, sess, tok, prompt


def streamed_text(st: Recorder):
    """What a real streamer would show: the put ids decoded, plus put_text fragments."""
    return st.tok.decode(st.new_ids()) + "".join(st.texts)


# ---- basic contract -----------------------------------------------------------------------

def test_returns_prompt_plus_new_ids_and_streams_prompt_first():
    out, res, st, sess, tok, prompt = run([" world", "!"])
    assert out == prompt + pieces_to_ids(tok, [" world", "!"]) + [EOS]
    assert st.puts[0] == prompt                       # HF: put(prompt_ids) once, first
    assert res.text == " world!" == streamed_text(st)
    assert res.finish_reason == "eog" and st.ends == 1


@pytest.mark.parametrize("eog", [EOS, IM_END, EOT])
def test_stops_at_every_eog_id(eog):
    out, res, st, sess, tok, _ = run([" world"], end=eog)
    assert out[-1] == eog and res.finish_reason == "eog"
    assert eog not in st.new_ids()                    # the eog token is not streamed
    assert res.text == " world"
    assert sess.calls[-1] == pieces_to_ids(tok, [" world"])   # the eog id is not evaluated


def test_ignore_eos_runs_to_max_new_tokens():
    out, res, st, sess, tok, prompt = run([" world"], ignore_eos=True, max_new_tokens=4)
    assert out[len(prompt):] == pieces_to_ids(tok, [" world"]) + [EOS] * 3
    assert res.finish_reason == "length"
    assert res.text == " world</s></s></s>"          # with ignore_eos, eos is ordinary text


@pytest.mark.parametrize("n", [0, 1, 3])
def test_max_new_tokens(n):
    out, res, st, sess, tok, prompt = run(["Hello"] * 10, max_new_tokens=n)
    assert len(out) == len(prompt) + n
    assert res.n_eval == max(n - 1, 0)                # the last sampled id is not evaluated
    assert sum(len(c) for c in sess.calls) == len(prompt) + res.n_eval


def test_streamer_text_equals_decoded_text():
    script = ["Hello", " world", b"\xe2", b"\x82", b"\xac", "!", "\u20ac", b"a\xe2",
              b"\x82\xac!", " the", "\n"]
    out, res, st, sess, tok, prompt = run(script)
    new = out[len(prompt):-1]
    assert res.text == tok.decode(new) == streamed_text(st)
    assert "\ufffd" not in res.text


def test_no_decode_calls_per_token(monkeypatch):
    """The loop detokenizes incrementally: it never re-decodes the text so far."""
    tok = FakeTokenizer()
    monkeypatch.setattr(tok, "decode", lambda *a, **k: pytest.fail("decode() called"))
    out, res, *_ = run(["Hello"] * 20, tok=tok, stop=["xyz"])
    assert res.text == "Hello" * 20


# ---- stop strings ---------------------------------------------------------------------------

def _expand(tok, pieces):
    """Split pieces that are not single tokens into single bytes."""
    out = []
    for p in pieces:
        b = p.encode() if isinstance(p, str) else p
        try:
            tok.id_of(b)
            out.append(b)
        except AssertionError:
            out.extend(bytes([c]) for c in b)
    return out


@pytest.mark.parametrize("pieces", [
    ["Hello", "STOP", " world"],
    ["Hello", "ST", "OP", " world"],
    ["Hello", "S", "T", "O", "P", " world"],
    ["Hel", "l", "o", "S", "TOP"],
    ["Hello", "ST", "O", "P"],
], ids=["one-token", "two-tokens", "bytes", "bytes-then-token", "mixed"])
def test_stop_string_split_across_tokens_never_leaks(pieces):
    tok = FakeTokenizer()
    out, res, st, *_ = run(_expand(tok, pieces), stop=["STOP"], tok=tok)
    assert res.finish_reason == "stop" and res.stop == "STOP"
    assert res.text == "Hello" == streamed_text(st)
    assert st.texts == []                             # every cut fell on a token boundary


def test_stop_inside_a_token_releases_the_text_before_it():
    tok = FakeTokenizer()
    # b"a\xe2" + b"\x82\xac!" is "a€!"; the stop "€!" starts inside the second token, after
    # "a". The first token ends mid-character, so it was held; "a" has no whole ids of its own.
    out, res, st, *_ = run(["Hello", b"a\xe2", b"\x82\xac!"], stop=["\u20ac!"], tok=tok)
    assert res.text == "Helloa" == streamed_text(st)
    assert st.new_ids() == pieces_to_ids(tok, ["Hello"]) and st.texts == ["a"]


def test_stop_starting_mid_token_uses_put_text():
    tok = FakeTokenizer()
    out, res, st, *_ = run(["Hello", " world"], stop=["orld"], tok=tok)
    assert res.text == "Hello w"
    assert st.new_ids() == pieces_to_ids(tok, ["Hello"])   # " world" holds the stop: not put
    assert st.texts == [" w"]
    assert streamed_text(st) == "Hello w"


def test_near_miss_is_released():
    tok = FakeTokenizer()
    out, res, st, *_ = run(_expand(tok, ["Hello", "ST", "AR", " world"]), stop=["STOP"],
                           tok=tok)
    assert res.finish_reason == "eog"
    assert res.text == "HelloSTAR world" == streamed_text(st)


def test_held_text_is_released_at_the_end():
    tok = FakeTokenizer()
    for kw in (dict(), dict(max_new_tokens=2)):
        out, res, st, *_ = run(["Hello", "ST"], stop=["STOP"], tok=tok, **kw)
        assert res.text == "HelloST" == streamed_text(st)


def test_held_ids_are_not_put_before_resolved():
    tok = FakeTokenizer()
    out, res, st, *_ = run(_expand(tok, ["Hello", "S", "T", "O", "X"]), stop=["STOP"], tok=tok)
    # put groups: prompt, "Hello", then S T O X together once X shows it is not "STOP"
    assert [tok.decode(p) for p in st.puts[1:]] == ["Hello", "STOX"]


@pytest.mark.parametrize("stops, want", [
    (["STOP", "OP!"], "x"),                   # both match; STOP starts first
    (["Hello world", "lo w"], "Hel"),         # byte by byte: "lo w" completes first
    (["P!", "TOP!"], "xS"),                   # same end, earliest start wins
    (["OPQ", "STOP"], "x"),
])
def test_overlapping_stop_strings(stops, want):
    tok = FakeTokenizer()
    script = ["x", "STOP", "!"] if want != "Hel" else [bytes([c]) for c in b"Hello world"]
    out, res, st, *_ = run(_expand(tok, script), stop=stops, tok=tok)
    assert res.text == want == streamed_text(st)


def test_multibyte_stop_string_split_across_byte_tokens():
    tok = FakeTokenizer()
    pieces = ["Hello", b"\xe2", b"\x82", b"\xac", b"\xe2", b"\x82", "!", " world"]
    # text: "Hello€" then a broken char; stop "€" -> "Hello"
    out, res, st, *_ = run(pieces, stop=["\u20ac"], tok=tok)
    assert res.text == "Hello" == streamed_text(st)
    assert "\ufffd" not in streamed_text(st)


def _ref_cut(tok, ids, stops):
    """Reference: after each token, look for the stops in the whole text so far; the first
    token where one occurs cuts at the earliest match."""
    for n in range(1, len(ids) + 1):
        text = tok.decode(ids[:n])
        hits = [text.find(s) for s in stops if text.find(s) >= 0]
        if hits:
            return text[:min(hits)], True
    return tok.decode(ids), False


@pytest.mark.parametrize("seed", range(30))
def test_random_scripts_match_reference(seed):
    rng = np.random.default_rng(seed)
    tok = FakeTokenizer()
    vocab = [b"S", b"T", b"O", b"P", b"ST", b"OP", b"STOP", b"Hello", b" world", b"!", b"\n",
             "\u20ac".encode(), b"a"]
    pieces = [vocab[i] for i in rng.integers(0, len(vocab), size=int(rng.integers(1, 25)))]
    stops = [["STOP"], ["ST!", "OPS"], ["\u20acS", "\n\n"], ["TOP", "STO"]][seed % 4]
    ids = pieces_to_ids(tok, pieces)
    out, res, st, *_ = run(pieces, stop=stops, tok=tok)
    want, stopped = _ref_cut(tok, ids, stops)
    assert res.text == want == streamed_text(st)
    assert res.finish_reason == ("stop" if stopped else "eog")


# ---- sampling, cache reuse, interrupt -------------------------------------------------------

class RandomSession(FakeSession):
    """Logits drawn from a generator seeded by the cache length: a fixed random "model"."""

    def eval(self, ids):
        self.tokens += list(ids)
        rng = np.random.default_rng(len(self.tokens))
        return rng.standard_normal(self.n_vocab).astype(np.float32)


def test_seeded_sampling_reproducible():
    tok = FakeTokenizer()
    outs = [generate(RandomSession(tok.n_vocab, None), [1, 2], tok, max_new_tokens=20,
                     temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed, ignore_eos=True)
            for seed in (5, 5, 6)]
    assert outs[0] == outs[1] and outs[0] != outs[2]


def test_cached_prefix_is_reused():
    tok = FakeTokenizer()
    sess = FakeSession(tok.n_vocab, lambda t: EOS)
    prompt = tok.encode("Hello world")
    generate(sess, prompt, tok, **GREEDY)
    generate(sess, prompt + [7, 8], tok, **GREEDY)
    assert sess.calls == [prompt, [7, 8]] and sess.n_resets == 0


@pytest.mark.parametrize("truncate", [True, False])
def test_divergent_cache_is_cut_back(truncate):
    tok = FakeTokenizer()
    sess = FakeSession(tok.n_vocab, lambda t: EOS, truncate=truncate)
    generate(sess, [1, 10, 11, 12], tok, **GREEDY)
    generate(sess, [1, 10, 20, 21], tok, **GREEDY)
    assert sess.tokens == [1, 10, 20, 21]
    if truncate:
        assert sess.calls[-1] == [20, 21] and sess.n_resets == 0
    else:
        assert sess.calls[-1] == [1, 10, 20, 21] and sess.n_resets == 1
    # the same prompt again: the last id must be re-evaluated for its logits
    logits = prefill(sess, [1, 10, 20, 21])
    assert sess.tokens == [1, 10, 20, 21] and logits.shape == (tok.n_vocab,)


def test_empty_prompt_is_an_error():
    tok = FakeTokenizer()
    with pytest.raises(ValueError, match="empty"):
        generate(FakeSession(tok.n_vocab, lambda t: EOS), [], tok)


def test_keyboard_interrupt_finalizes_and_reraises():
    tok = FakeTokenizer()
    hello = tok.id_of(b"Hello")

    def next_fn(tokens):
        if len(tokens) > 4:
            raise KeyboardInterrupt
        return hello

    st = Recorder(tok)
    res = GenerationResult()
    with pytest.raises(KeyboardInterrupt):
        generate(FakeSession(tok.n_vocab, next_fn), [1], tok, streamer=st, result=res,
                 stop=["xyz"], **GREEDY)
    assert res.finish_reason == "interrupted" and st.ends == 1
    assert res.text == "Hello" * len(res.ids) == streamed_text(st)


def test_sampling_parameters_are_checked():
    tok = FakeTokenizer()
    with pytest.raises(TypeError, match="tempreature"):
        generate(FakeSession(tok.n_vocab, lambda t: EOS), [1], tok, tempreature=0.5)


# ---- real model -------------------------------------------------------------------------------

@pytest.mark.slow
def test_real_model_stop_strings_cut_exactly():
    """Greedy SmolLM2 text; then the same run with stop strings taken from inside that text
    (at and across token boundaries): the output is the text up to the stop, never more."""
    from fake_lm import real_model
    from llmrt.streamers import TextStreamer
    m = real_model("smollm2-135m-instruct")
    tok = m.tokenizer
    prompt = tok.encode("Once upon a time")

    class Collect(TextStreamer):
        def on_finalized_text(self, text, stream_end=False):
            self.out = getattr(self, "out", "") + text

    base = GenerationResult()
    ids = generate(m.new_session(), prompt, tok, max_new_tokens=24, temperature=0.0,
                   result=base)
    assert base.text == tok.decode(ids[len(prompt):])
    text = base.text
    for start, length in ((5, 6), (12, 3), (20, 9), (len(text) - 4, 4)):
        stop = text[start:start + length]
        res = GenerationResult()
        st = Collect(tok, skip_prompt=True)
        generate(m.new_session(), prompt, tok, max_new_tokens=24, temperature=0.0,
                 stop=[stop], result=res, streamer=st)
        assert res.finish_reason == "stop"
        assert res.text == text[:text.find(stop)] == st.out, stop
