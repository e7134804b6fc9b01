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
    cases = ({"ctx_size": 8, "kv_mode": "none"}, {"repeat_penalty": -1.0},
             # checked by Model.generate itself or at decode's start: the streamer was left open
             {"stop": [1]}, {"ctx_size": 0}, {"ctx_size": 2}, {"kv_mode": "bad"}, {"n_discard": -2},
             {"session": smol.new_session(64), "ctx_size": 64}, {"max_new_tokens": "a"},
             {"ids": b"Once"}, {"ids": [1.5, 2.0]}, {"n_keep": 2.7})
    for kw in cases:
        st = TextIteratorStreamer(smol.tokenizer, timeout=30)
        errors = []
        ids = kw.pop("ids", IDS * 4)

        def run():
            try:
                smol.generate(ids, streamer=st, max_new_tokens=4, temperature=0.0, **kw) \
                    if "max_new_tokens" not in kw else smol.generate(ids, streamer=st, temperature=0.0, **kw)
            except (ValueError, TypeError) as e:
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


def test_a_generation_holds_its_session_between_tokens(smol):
    """Each eval held the session, a whole generate did not: a second thread could cut the
    session back between two of the first one's tokens and take it over; neither got an error
    and the first continued the second's text. Now the second gets the RuntimeError at once."""
    s = smol.new_session(64)
    ref = greedy(smol, n=10)
    errors = []

    class Intruder:
        n = 0

        def put(self, value):
            self.n += 1
            if self.n == 3:                 # between two of the first generation's tokens
                def other():
                    try:
                        smol.generate([6403, 1980], max_new_tokens=4, temperature=0.0, session=s)
                    except RuntimeError as e:
                        errors.append(e)
                t = threading.Thread(target=other)
                t.start()
                t.join(30)

        def end(self):
            pass

    out = smol.generate(IDS, max_new_tokens=10, temperature=0.0, session=s, streamer=Intruder())
    assert out == ref
    assert len(errors) == 1 and "in use by another thread" in str(errors[0])
    # the same thread may nest (a streamer that evaluates on the session it streams is its own)
    with s.hold():
        with s.hold():
            s.eval([42])


@pytest.mark.parametrize("kw", [{"n_keep": 2.7}, {"n_keep": "3"}, {"n_keep": True}, {"n_discard": 2.5},
                                {"n_discard": "8"}])
def test_cache_counts_must_be_integers(smol, kw):
    """n_keep / n_discard of 2.7, "3" or True were truncated, parsed or taken as 1."""
    name = next(iter(kw))
    with pytest.raises(TypeError, match=f"{name} must be an integer"):
        smol.new_session(64, **kw)


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


class _InterruptAfterRun:
    """A graph whose run completes (its cells written) and then lets a Ctrl-C surface: where a
    real SIGINT that arrived during the C run is raised (at the first bytecode after it)."""

    def __init__(self, g):
        self._g = g

    def run(self, *a, **kw):
        self._g.run(*a, **kw)
        raise KeyboardInterrupt

    def run_seqs(self, *a, **kw):
        self._g.run_seqs(*a, **kw)
        raise KeyboardInterrupt


def test_an_interrupt_as_a_run_returns_keeps_tokens_and_cache_in_step(smol, monkeypatch):
    """Ctrl-C during generation left the cache one chunk ahead of the session's tokens (the run
    had written its cells, `tokens.extend` never ran): every later call appended after stray
    cells, and a full cache then failed for good (`llmrt chat`: 'prepare: 1 new cells do not
    fit'). Now the tokens follow the cache, and the session goes on as if the chunk had been
    evaluated normally."""
    from llmrt.model import Model as M
    ref = smol.new_session(64)
    ref.eval(IDS + [1980])
    s, t = smol.new_session(64), smol.new_session(64)
    s.eval(IDS)
    t.eval([253])
    real = M._graph
    monkeypatch.setattr(M, "_graph", lambda self, *a, **kw: _InterruptAfterRun(real(self, *a, **kw)))
    with pytest.raises(KeyboardInterrupt):
        s.eval([1980])
    with pytest.raises(KeyboardInterrupt):
        smol.eval_sessions([s, t], [[6403], [655]])
    monkeypatch.setattr(M, "_graph", real)
    assert s.n_past == s.cache.n_used == len(IDS) + 2 and t.n_past == t.cache.n_used == 2
    assert s.tokens == IDS + [1980, 6403]
    ref.eval([6403])
    np.testing.assert_array_equal(s.eval([655]), ref.eval([655]))   # the session goes on exactly


def test_a_chat_turn_refused_before_decoding_ends_its_streamer(smol):
    """ChatSession.send refused a turn longer than the context ("this turn adds ... tokens")
    without ending the streamer: its consumer waited forever."""
    cs = ChatSession(smol, temperature=0.0, max_new_tokens=4, ctx_size=32)
    st = TextIteratorStreamer(smol.tokenizer, timeout=30)
    with pytest.raises(ValueError, match="this turn adds"):
        cs.send("word " * 100, streamer=st)
    assert "".join(st) == ""                           # ended (a timeout raises queue.Empty)
    assert cs.send("Hi").strip() != ""                 # and the chat goes on
