"""The public Python API on odd input: each bad argument is a clear error naming it (never a
numpy/Cython error from deep inside, never an argument silently coerced or ignored), and what a
call generated is kept when it has to stop. Found by fuzzing the API (2026-11-27)."""
import os
import threading

import numpy as np
import pytest

from fake_lm import real_model_path
from llmrt import Model
from llmrt.chat import ChatSession
from llmrt.generation import GenerationResult, generate
from llmrt.sampling import Sampler
from llmrt.streamers import TextIteratorStreamer

IDS = [6403, 1980, 253, 655]           # SmolLM2: "Once upon a time"


@pytest.fixture(scope="module")
def smol():
    return Model(real_model_path("smollm2-135m-instruct"), n_threads=2, ctx_size=256)


def greedy(m, ids=IDS, n=12, **kw):
    return m.generate(ids, max_new_tokens=n, temperature=0.0, **kw)


def test_one_stop_string_is_not_split_into_characters(smol):
    """stop="..." is one stop string (it was taken as its characters: the first of them in the
    text ended the generation), in Model.generate and ChatSession alike."""
    full = smol.tokenizer.decode(greedy(smol, n=24)[len(IDS):])
    # a word of the continuation one of whose characters occurs before it (split into
    # characters, it would stop there)
    stop = next(w for w in full.split()[2:] if any(ch in full[:full.find(w)] for ch in w))
    a = greedy(smol, n=24, stop=stop)
    assert a == greedy(smol, n=24, stop=[stop])
    text = smol.tokenizer.decode(a[len(IDS):])
    assert stop in text and full.startswith(text[:text.find(stop)])
    with pytest.raises(TypeError, match="stop must be a str or a list of str: element 0 is int"):
        greedy(smol, stop=[5])
    with pytest.raises(TypeError, match="stop must be a str or a list of str: element 0 is NoneType"):
        greedy(smol, stop=[None])
    chat = ChatSession(smol, temperature=0.0, max_new_tokens=16, stop="zzqx")
    assert chat.stop == ["zzqx"]


@pytest.mark.parametrize("ids, err, msg", [
    (b"Once", TypeError, "got bytes"),
    ([6403.9, 1980.2], TypeError, r"got 6403.9 \(float\)"),
    (["6403", "1980"], TypeError, r"got '6403' \(str\)"),
    ({6403, 1980}, TypeError, "ordered sequence"),
    ({6403: 1}, TypeError, "ordered sequence"),
    (5, TypeError, "got int"),
    (np.array([IDS, IDS]), ValueError, r"one sequence \(1-D\)"),
    ([[6403, 1980], [253, 655]], TypeError, "nested sequence"),
    (np.array([6403.0, 1980.0]), TypeError, "array of float64"),
    (np.array([2**64 - 1], dtype=np.uint64), ValueError, "token id 18446744073709551615 is out of range"),
    ([2**70], ValueError, "token id 1180591620717411303424 is out of range"),
])
def test_token_ids_are_checked(smol, ids, err, msg):
    """Token ids were coerced (bytes as their values, floats truncated, digit strings parsed, a
    set in hash order, a batch of two flattened into one sequence, uint64 2^64-1 named "-1"),
    also by llmrt.generation.generate called directly on a session."""
    with pytest.raises(err, match=msg):
        greedy(smol, ids, n=2)
    with pytest.raises(err, match=msg):
        smol(ids)
    if "out of range" not in msg:    # the range is checked by the session when it evaluates
        s = smol.new_session(64)
        with pytest.raises(err, match=msg):
            generate(s, ids, smol.tokenizer, max_new_tokens=2, temperature=0.0)
        assert s.tokens == []


def test_token_ids_in_every_accepted_form_give_the_same_result(smol):
    ref = greedy(smol)
    for ids in (tuple(IDS), np.array(IDS, dtype=np.int32), np.array([IDS], dtype=np.uint16), [IDS],
                (i for i in IDS), [np.int64(i) for i in IDS]):
        assert greedy(smol, ids) == ref


def test_kv_mode_none_stops_at_a_full_context_and_keeps_the_ids(smol):
    """With no eviction, a full cache ended the call with "context full" and the ids generated
    so far were lost; now it stops there (llama.cpp's context limit) and returns them."""
    out = greedy(smol, n=100, ctx_size=16, kv_mode="none")
    assert len(out) == 17                              # 16 cells + the last id (never evaluated)
    assert out == greedy(smol, n=13)
    res = GenerationResult()
    generate(smol.new_session(16, kv_mode="none"), IDS, smol.tokenizer, max_new_tokens=-1,
             temperature=0.0, ignore_eos=True, result=res)
    assert res.finish_reason == "length" and len(res.ids) == 13


def test_a_streamer_is_ended_when_generate_fails_before_decoding(smol):
    """The consumer of a TextIteratorStreamer waited forever when generate failed in the prompt
    (here: longer than a cache that evicts nothing) or on its arguments."""
    for kw in ({"ctx_size": 8, "kv_mode": "none"}, {"repeat_penalty": -1.0}):
        st = TextIteratorStreamer(smol.tokenizer, timeout=30)
        errors = []

        def run():
            try:
                smol.generate(IDS * 4, streamer=st, max_new_tokens=4, temperature=0.0, **kw)
            except ValueError as e:
                errors.append(e)

        t = threading.Thread(target=run)
        t.start()
        assert "".join(st) == ""                       # ends (a timeout would raise queue.Empty)
        t.join(30)
        assert len(errors) == 1


@pytest.mark.parametrize("kw, err, msg", [
    ({"repeat_penalty": float("nan")}, ValueError, "repeat_penalty must be a number, got NaN"),
    ({"frequency_penalty": float("nan")}, ValueError, "frequency_penalty must be a number, got NaN"),
    ({"presence_penalty": float("inf")}, ValueError, "presence_penalty must be finite"),
    ({"temperature": "0.5"}, TypeError, "temperature must be a number"),
    ({"top_k": 1.5}, TypeError, "top_k must be an integer"),
    ({"seed": 1.5}, TypeError, "seed must be an integer"),
    ({"seed": "2"}, TypeError, "seed must be an integer"),
])
def test_sampler_arguments_are_checked(kw, err, msg):
    """A NaN penalty gave garbage greedy text and an IndexError when sampling; a float seed a
    numpy SeedSequence error."""
    with pytest.raises(err, match=msg):
        Sampler(**kw)


def test_do_sample_false_or_zero_is_greedy(smol):
    ref = greedy(smol)
    for ds in (False, 0):
        assert smol.generate(IDS, max_new_tokens=12, temperature=0.9, seed=1, do_sample=ds) == ref


def test_a_session_is_not_evaluated_by_two_threads_at_once(smol):
    """Two threads' eval on one Session failed with an opaque "[run] failed" and could leave a
    cache that no longer matched its tokens; the second one is now a clear RuntimeError and the
    session is untouched."""
    s = smol.new_session(64)
    s.eval(IDS)
    before = list(s.tokens)
    held, release = threading.Event(), threading.Event()

    def hold():
        with s._busy:                                  # what a running eval holds
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(30)
    try:
        for call in (lambda: s.eval([42]), lambda: s.truncate(2), lambda: smol.eval_sessions([s], [[42]])):
            with pytest.raises(RuntimeError, match="in use by another thread"):
                call()
    finally:
        release.set()
        t.join(30)
    assert s.tokens == before
    fresh = smol.new_session(64)
    fresh.eval(IDS)
    np.testing.assert_array_equal(s.eval([42]), fresh.eval([42]))


def test_generate_refuses_cache_arguments_beside_a_session(smol):
    """ctx_size / n_keep / n_discard / kv_mode with session= were silently ignored."""
    s = smol.new_session(16)
    for kw in ({"ctx_size": 4096}, {"n_keep": 0}, {"kv_mode": "none"}, {"n_discard": 2}):
        with pytest.raises(ValueError, match="configure a new session"):
            greedy(smol, session=s, **kw)
    assert greedy(smol, session=s) == greedy(smol)


@pytest.mark.parametrize("kw, err, msg", [
    ({"n_threads": 2**31}, ValueError, r"n_threads must be in \[1, 1024\]"),
    ({"n_threads": 1.5}, TypeError, "n_threads must be an integer"),
    ({"n_threads": -1}, ValueError, "n_threads must be in"),
    ({"ctx_size": 1.5}, TypeError, "ctx_size must be an integer"),
    ({"ctx_size": 2**31}, ValueError, "ctx_size must be in"),
    ({"ctx_size": 0}, ValueError, "ctx_size must be in"),
    ({"weight_dtype": "int4"}, ValueError, "weight_dtype needs an F32/F16/BF16 model"),
    ({"weight_dtype": "int8", "group_size": 32.9}, ValueError, "group_size must be one of"),
    ({"weight_dtype": "int8", "quantize_output": "no"}, TypeError, "quantize_output must be True or False"),
])
def test_model_arguments_are_checked(kw, err, msg):
    """Sizes past a C int were accepted and failed at the first run (OverflowError from the
    graph), floats truncated; int4 on an already quantized file failed in numpy inside the
    importance pass it ran first."""
    with pytest.raises(err, match=msg):
        Model(real_model_path("smollm2-135m-instruct"), **kw)


def test_model_path_forms():
    path = real_model_path("smollm2-135m-instruct")
    assert Model(os.fsencode(path), n_threads=0).n_vocab == 49152   # bytes; 0: the default threads
    with pytest.raises(TypeError, match="model path must be a str"):
        Model(5)


def test_tokenizer_ids_are_checked(smol):
    """A negative id read the vocabulary from its end; one past it raised a bare IndexError."""
    tok = smol.tokenizer
    for f in (tok.token_to_piece, tok.id_to_token, tok.is_special, tok.token_attr, tok.is_eog):
        with pytest.raises(ValueError, match="token id -1 is out of range"):
            f(-1)
        with pytest.raises(ValueError, match="out of range"):
            f(tok.n_vocab)
        with pytest.raises(TypeError, match="token id must be an int"):
            f(None)
    assert tok.token_to_piece(np.int64(6403)) == tok.token_to_piece(6403)


def test_a_template_whose_code_fails_is_a_clear_error():
    """A template's own exception (here a division by zero) came out as a raw traceback."""
    from llmrt.chat import ChatTemplate
    for src, name in (("{{ 1 / 0 }}", "ZeroDivisionError"), ("{{ messages[5]['content'] }}", "")):
        with pytest.raises(ValueError, match=r"\[chat template\] custom.*" + name):
            ChatTemplate(src).render([{"role": "user", "content": "hi"}])


class _Bar:
    """A stand-in for llmrt.progress.Progress: records its total and updates."""

    def __init__(self, total):
        self.total, self.updates = total, []
        _Bar.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n):
        self.updates.append(n)


def test_prefill_progress_counts_the_ids_it_evaluates(smol):
    """`llmrt generate -f` of a long prompt shows a bar: prefill(progress=...) makes one for the
    ids it evaluates (a reused prefix is not counted) and the session updates it per graph run;
    the logits are those of a prefill without it."""
    from llmrt.generation import prefill
    from llmrt.model import N_BATCH
    ids = (IDS * 400)[:2 * N_BATCH + 37]
    _Bar.made = []
    a, b = smol.new_session(4096), smol.new_session(4096)
    np.testing.assert_array_equal(prefill(a, ids, progress=_Bar), prefill(b, ids))
    bar, = _Bar.made
    assert bar.total == len(ids) and bar.updates == [N_BATCH, N_BATCH, 37]
    more = ids + IDS
    np.testing.assert_array_equal(prefill(a, more, progress=_Bar), prefill(b, more))
    assert (_Bar.made[1].total, _Bar.made[1].updates) == (len(IDS), [len(IDS)])
