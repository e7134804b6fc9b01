"""JSON mode (llmrt.jsonmode): the byte automaton against Python's json parser, the token-level
constraint against brute force over a vocabulary, the sampler's constrained choice, and
Model.generate / the engine on the real SmolLM2."""
import json
import re

import numpy as np
import pytest

from llmrt.jsonmode import WS_MAX, Constraint, JsonState, parse_response_format
from llmrt.sampling import Sampler


_LONG_WS = re.compile("[ \t\n\r]{%d,}" % (WS_MAX + 1))


def _no_constants(name):
    raise ValueError(name)          # NaN, Infinity: Python's extension, not JSON


def reference_ok(s: str) -> bool:
    """One JSON object, as RFC 8259 (Python's strict parser), with JSON mode's own limits: it
    starts with "{", ends with the object's "}", and has no run of more than WS_MAX whitespace
    characters (the test's strings hold no such run)."""
    if not s.startswith("{") or not s.endswith("}") or _LONG_WS.search(s):
        return False
    try:
        return isinstance(json.loads(s, parse_constant=_no_constants), dict)
    except ValueError:
        return False


def run(s: bytes):
    """(bytes accepted before the first refusal, done at the end)"""
    st = JsonState()
    for i, b in enumerate(s):
        if not st.feed(b):
            return i, False
    return len(s), st.done


def random_value(rng, depth=0):
    k = rng.integers(0, 8 if depth < 3 else 5)
    if k == 0:
        return int(rng.integers(-10 ** 6, 10 ** 6))
    if k == 1:
        return float(rng.normal() * 10.0 ** rng.integers(-8, 8))
    if k == 2:
        return "".join(rng.choice(list('ab "\\/\n\t\u00e9\u4e2d\U0001f600x'), rng.integers(0, 6)))
    if k == 3:
        return [True, False, None][rng.integers(0, 3)]
    if k == 4:
        return ""
    if k in (5, 6):
        return {f"k{i}\u00e9\"": random_value(rng, depth + 1)
                for i in range(rng.integers(0, 4))}
    return [random_value(rng, depth + 1) for _ in range(rng.integers(0, 4))]


def random_documents(rng, n):
    for _ in range(n):
        obj = {f"key{i}": random_value(rng) for i in range(rng.integers(0, 4))}
        indent = [None, 0, 1, 2, "\t"][rng.integers(0, 5)]
        yield json.dumps(obj, indent=indent, ensure_ascii=bool(rng.integers(0, 2)),
                         separators=None if indent is not None else [(",", ":"), (", ", ": ")][rng.integers(0, 2)])


def test_valid_documents_are_accepted_and_done_only_at_their_end(rng):
    for doc in random_documents(rng, 400):
        b = doc.encode("utf-8")
        st = JsonState()
        for i, c in enumerate(b):
            assert st.feed(c), (doc, i)
            assert st.done == (i == len(b) - 1), (doc, i)
        assert not st.copy().feed(ord(" ")) and not st.copy().feed(ord("}"))    # nothing after it


def test_mutated_documents_agree_with_the_json_parser(rng):
    """Every document one edit away from a valid one (a byte deleted, inserted or replaced, drawn
    from JSON's own alphabet): accepted to the end and done exactly when the parser takes it, and a
    refused byte is never part of a text the parser takes."""
    alphabet = '{}[]",:0123456789-+.eEtrufalsn \t\n\\/ub'
    n_ok = 0
    for doc in random_documents(rng, 300):
        for _ in range(20):
            i = int(rng.integers(0, len(doc) + 1))
            c = alphabet[rng.integers(0, len(alphabet))]
            edit = rng.integers(0, 3)
            s = doc[:i] + c + doc[i:] if edit == 0 else doc[:i] + c + doc[i + 1:] if edit == 1 else doc[:i] + doc[i + 1:]
            if not s:
                continue
            good = reference_ok(s)
            n, done = run(s.encode("utf-8"))
            assert (n == len(s.encode("utf-8")) and done) == good, s
            n_ok += good
    assert n_ok > 300      # (the comparison saw both kinds)


@pytest.mark.parametrize("text,ok", [
    ('{"a": -0}', True), ('{"a": -01}', False), ('{"a": 01}', False), ('{"a": 1.}', False),
    ('{"a": .5}', False), ('{"a": +1}', False), ('{"a": 1e+5}', True), ('{"a": 1E-5}', True),
    ('{"a": 1e}', False), ('{"a": "\\u00e9\\n"}', True), ('{"a": "\\x"}', False), ('{"a": "\\u12g4"}', False),
    ('{"a": [1, 2,]}', False), ('{"a": 1,}', False), ('{,}', False), ('{"a" 1}', False), ('{"a": tru}', False),
    ('{"a": [true, false, null, {}, []]}', True), ('[1]', False), (' {}', False), ('{}', True),
    ('{"a":\n' + " " * (WS_MAX - 1) + '1}', True), ('{"a":\n' + " " * WS_MAX + '1}', False),
    ('{"a": "tab\tinside"}', False), ('{1: 2}', False), ('{"a": NaN}', False),
])
def test_edge_cases(text, ok):
    n, done = run(text.encode())
    assert (n == len(text.encode()) and done) == ok
    if not text.startswith(" ") and not text.startswith("["):
        assert reference_ok(text) == ok


def test_response_format_values():
    assert parse_response_format(None) == ("text", None)
    assert parse_response_format({"type": "text"}) == ("text", None)
    assert parse_response_format({"type": "json_object"}) == ("json_object", None)
    s = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert parse_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": True}}) \
        == ("json_schema", s)
    assert parse_response_format({"type": "json_schema", "json_schema": {"name": "x"}}) == ("json_schema", {})
    assert parse_response_format({"type": "json_object", "schema": s}) == ("json_schema", s)   # llama.cpp's
    with pytest.raises(ValueError, match="pattern not supported"):
        parse_response_format({"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "a"}}})
    for bad in ("json", {"type": "xml"}, {"type": "json_object", "extra": 1}, {},
                {"type": "json_schema", "json_schema": "x"}, {"type": "json_schema"}):
        with pytest.raises(ValueError, match="response_format must be"):
            parse_response_format(bad)


class FakeTokenizer:
    """A byte-level vocabulary: pieces of JSON's bytes and some words, a control token and an
    end-of-generation id."""

    def __init__(self, rng):
        pieces = [b"<eos>", b"<ctl>", b""]
        pieces += [bytes([b]) for b in range(32, 127)] + [bytes([b]) for b in range(0x80, 0xC0)]   # (byte fallback)
        words = ['{"', '":', '",', '"}', '}', ']}', ' "', "name", "age", " 12", "1.5", "e3", "\\n", "\\u",
                 "00e9", "true", "nul", "l", ", ", ":\n", "\n  ", '{"a', "x\"", '"}\n', "\t", "\xe4\xbd"]
        pieces += [w.encode("latin-1") for w in words]
        pieces += [bytes(rng.integers(32, 127, rng.integers(1, 5)).tolist()) for _ in range(300)]
        self.pieces = pieces
        self.special = [i < 2 for i in range(len(pieces))]
        self.n_vocab = len(pieces)
        self.eog_ids = frozenset([0])

    def piece_table(self):
        return self.pieces, self.special


def brute_allowed(c: Constraint, tok: FakeTokenizer) -> set:
    out = set(tok.eog_ids) if c.state.can_end else set()
    for i, p in enumerate(tok.pieces):
        if tok.special[i] or not p or i in tok.eog_ids:
            continue
        if c.state.copy().feed_bytes(p):
            out.add(i)
    return out


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}, "ok": {"type": ["boolean", "null"]}},
    "required": ["name"]}


YES_NO = 'root ::= ("yes" | "no") (", " [a-z ]{1,12})? "."'


@pytest.mark.parametrize("schema,grammar", [(None, None), (PERSON, None), ({"type": "integer"}, None), (None, YES_NO)],
                         ids=["json_object", "person", "integer", "gbnf"])
def test_constraint_matches_brute_force_along_random_walks(rng, schema, grammar):
    tok = FakeTokenizer(rng)
    for walk in range(30):
        c = Constraint(tok, schema, grammar)
        for step in range(40):
            allowed = brute_allowed(c, tok)
            assert {i for i in range(tok.n_vocab) if c.allows(i)} == allowed
            logits = rng.normal(size=tok.n_vocab).astype(np.float32)
            m = c.mask(logits)                               # need 0: every allowed id
            assert set(np.flatnonzero(np.isfinite(m))) == allowed
            assert np.array_equal(m[sorted(allowed)], logits[sorted(allowed)])
            k = int(rng.integers(1, 6))                      # need k: the k most likely allowed
            mk = c.mask(logits, k)
            best = sorted(allowed, key=lambda i: -logits[i])[:k]
            assert set(np.flatnonzero(np.isfinite(mk))) == set(best)
            greedy = Sampler(temperature=0).sample(logits, (), constraint=c)
            assert greedy == best[0]
            t = Sampler(temperature=1.0, top_k=k, top_p=1.0, min_p=0.0, seed=walk * 100 + step).sample(
                logits, (), constraint=c)
            assert t in best
            c.accept(t)
            if t in tok.eog_ids:
                assert c.state.can_end
                break
            if c.done:          # nothing can follow: only end-of-generation
                assert {i for i in range(tok.n_vocab) if c.allows(i)} == set(tok.eog_ids)
                assert set(np.flatnonzero(np.isfinite(c.mask(logits)))) == set(tok.eog_ids)
                break
        if schema is None and grammar is None:
            assert JsonState().feed_bytes(bytes(c.text))
        if grammar is not None:
            assert re.fullmatch(r"(yes|no)(, [a-z ]{1,12})?\.?", bytes(c.text).decode()), bytes(c.text)


def test_accept_refuses_a_token_that_breaks_the_json(rng):
    tok = FakeTokenizer(rng)
    c = Constraint(tok)
    with pytest.raises(ValueError, match="does not continue the text"):
        c.accept(tok.pieces.index(b"}"))
    c.accept(tok.pieces.index(b"{"))
    assert not c.allows(0) and not c.allows(1)          # eog, a control token: not until done
    c.accept(tok.pieces.index(b"}"))
    assert c.done and bytes(c.text) == b"{}" and c.allows(0) and not c.allows(1)


def test_a_ban_of_every_continuation_is_a_clear_error(rng):
    tok = FakeTokenizer(rng)
    c = Constraint(tok)
    logits = np.zeros(tok.n_vocab, dtype=np.float32)
    s = Sampler(temperature=0, logit_bias={i: -np.inf for i, p in enumerate(tok.pieces) if p.startswith(b"{")})
    with pytest.raises(ValueError, match="no token can continue"):
        s.sample(logits, (), constraint=c)


@pytest.mark.slow
def test_generate_json_mode_on_a_real_model():
    """SmolLM2 asked for a JSON object: with response_format every answer that ends (finish eog:
    where the object closes) parses as one, one cut by max_new_tokens (a tiny model may ramble
    inside a string) is a prefix of one, and the greedy answer ends; without it the same prompt
    starts in prose or code."""
    from fake_lm import real_model_path

    from llmrt.generation import GenerationResult, generate
    from llmrt.model import Model

    m = Model(real_model_path("smollm2-135m-instruct"))
    tok = m.tokenizer
    prompt = ("<|im_start|>user\nReturn a JSON object with keys \"name\" and \"age\" for a cat."
              "<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(prompt, add_special=True, parse_special=True)
    ends = []
    for seed, temp in ((0, 0.0), (1, 0.8), (2, 0.8), (3, 0.8)):
        res = GenerationResult()
        out = generate(m.new_session(256), ids, tok, max_new_tokens=200, temperature=temp, seed=seed,
                       response_format={"type": "json_object"}, result=res)
        text = tok.decode(out[len(ids):])
        assert JsonState().feed_bytes(text.encode()) and res.finish_reason in ("eog", "length"), text
        if res.finish_reason == "eog":
            assert isinstance(json.loads(text), dict)
        ends.append(res.finish_reason)
    assert "eog" in ends, ends     # (which ones end is the model's: at least one must)
    free = m.generate(ids, max_new_tokens=8, temperature=0)
    assert not tok.decode(free[len(ids):]).startswith("{")       # (so the constraint did the work)
    with pytest.raises(ValueError, match="response_format must be"):
        m.generate(ids, max_new_tokens=8, response_format={"type": "json_schema"})


@pytest.mark.slow
def test_engine_json_mode():
    from fake_lm import real_model_path

    from llmrt.engine import Engine
    from llmrt.model import Model

    m = Model(real_model_path("smollm2-135m-instruct"))
    tok = m.tokenizer
    prompt = ("<|im_start|>user\nReturn a JSON object with keys \"name\" and \"age\" for a dog."
              "<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(prompt, add_special=True, parse_special=True)
    with Engine(m, n_parallel=2, ctx_size=256) as eng:
        reqs = [eng.submit(ids, max_tokens=200, temperature=t, seed=1, response_format={"type": "json_object"})
                for t in (0.0, 0.5)]
        plain = eng.submit(ids, max_tokens=10, temperature=0)
        for r in reqs:          # decoded side by side, each its own constraint
            r.wait()
            assert JsonState().feed_bytes(r.text.encode()) and r.finish_reason in ("stop", "length"), r.text
            if r.finish_reason == "stop":
                assert isinstance(json.loads(r.text), dict), r.text
        assert "stop" in {q.finish_reason for q in reqs}
        assert plain.wait().finish_reason == "length"


@pytest.mark.slow
def test_cli_generate_json():
    from click.testing import CliRunner

    from fake_lm import real_model_path
    from llmrt.cli import main

    prompt = ("<|im_start|>user\nReturn a JSON object describing Paris with keys city and country."
              "<|im_end|>\n<|im_start|>assistant\n")
    r = CliRunner().invoke(main, ["generate", real_model_path("smollm2-135m-instruct"), "-p", prompt,
                                  "--json", "--temp", "0", "-n", "100"])
    assert r.exit_code == 0, r.output
    out = r.stdout.rstrip("\n")
    assert JsonState().feed_bytes(out.encode()), out
    if "stop: eog" in r.stderr:
        assert isinstance(json.loads(out), dict)
    else:
        assert "stop: length" in r.stderr


@pytest.mark.slow
def test_chat_session_json_turn_then_free_turn():
    """One ChatSession turn in JSON mode, the next free: the JSON answer parses, and the
    conversation (its cache) goes on from it."""
    from fake_lm import real_model_path

    from llmrt.chat import ChatSession
    from llmrt.model import Model

    m = Model(real_model_path("smollm2-135m-instruct"))
    chat = ChatSession(m, temperature=0, max_new_tokens=120)
    a = chat.send("Return a JSON object with keys \"name\" and \"age\" for a cat.",
                  response_format={"type": "json_object"})
    assert JsonState().feed_bytes(a.encode()), a
    if chat.last_result.finish_reason == "eog":
        assert isinstance(json.loads(a), dict)
    b = chat.send("Thanks! Now say hello.", max_new_tokens=20)
    assert b and chat.messages[-2]["content"] == "Thanks! Now say hello." and chat.messages[1]["content"] == a
    with pytest.raises(ValueError, match="response_format must be"):
        chat.send("again", response_format={"type": "yaml"})
    assert len(chat.messages) == 4          # the refused turn left nothing behind


CAT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                                        "colors": {"type": "array", "items": {"enum": ["black", "white", "orange"]},
                                                   "minItems": 1, "maxItems": 3}},
       "required": ["name", "age", "colors"]}


@pytest.mark.slow
def test_generate_with_a_json_schema_on_a_real_model():
    """SmolLM2 with a JSON Schema: every answer that ends validates against the schema (the
    `jsonschema` package's validator), sampled or greedy; -j on the command line too."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a test extra (pip install -e .[test])")
    from click.testing import CliRunner

    from fake_lm import real_model_path
    from llmrt.cli import main
    from llmrt.generation import GenerationResult, generate
    from llmrt.model import Model

    path = real_model_path("smollm2-135m-instruct")
    m = Model(path)
    tok = m.tokenizer
    prompt = "<|im_start|>user\nDescribe a cat.<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(prompt, add_special=True, parse_special=True)
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "schema": CAT}}
    for seed, temp in ((0, 0.0), (1, 0.7), (2, 0.7)):
        res = GenerationResult()
        out = generate(m.new_session(1024), ids, tok, max_new_tokens=600, temperature=temp, seed=seed,
                       response_format=fmt, result=res)
        text = tok.decode(out[len(ids):])
        # every part of CAT is bounded (strings, arrays, digits, whitespace): at most ~590 bytes,
        # so it ends before 600 tokens whatever the model does
        assert res.finish_reason == "eog", text
        jsonschema.validate(json.loads(text), CAT)
    r = CliRunner().invoke(main, ["generate", path, "-p", prompt, "-j", json.dumps(CAT), "--temp", "0", "-n", "600"])
    assert r.exit_code == 0, r.output
    jsonschema.validate(json.loads(r.stdout), CAT)
    r = CliRunner().invoke(main, ["generate", path, "-p", prompt, "-j", '{"type": "string", "pattern": "a"}'])
    assert r.exit_code == 2 and "pattern not supported" in r.stderr


@pytest.mark.slow
def test_a_complete_text_ends_even_with_ignore_eos():
    """A root integer may end after any digit: end-of-generation is allowed there and, with a
    constraint, ends the text even under ignore_eos (else its text would follow the number); at
    most 16 digits, so it always ends."""
    from fake_lm import real_model_path

    from llmrt.generation import GenerationResult, generate
    from llmrt.model import Model

    m = Model(real_model_path("smollm2-135m-instruct"))
    tok = m.tokenizer
    ids = tok.encode("<|im_start|>user\nHow many legs has a cat?<|im_end|>\n<|im_start|>assistant\n",
                     add_special=True, parse_special=True)
    for ignore in (False, True):
        res = GenerationResult()
        out = generate(m.new_session(256), ids, tok, max_new_tokens=40, temperature=0, ignore_eos=ignore,
                       response_format={"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}},
                       result=res)
        assert res.finish_reason == "eog" and isinstance(json.loads(tok.decode(out[len(ids):])), int)


@pytest.mark.slow
def test_gbnf_grammar_on_a_real_model(tmp_path):
    """A GBNF grammar through Model.generate, ChatSession.send, the CLI's --grammar-file and
    Engine.submit: the answers match the grammar (a regular one here, checked by Python's re)."""
    from click.testing import CliRunner

    from fake_lm import real_model_path
    from llmrt.chat import ChatSession
    from llmrt.cli import main
    from llmrt.engine import Engine
    from llmrt.model import Model

    pattern = re.compile(r"(yes|no)(, [a-z ]{1,12})?\.")
    path = real_model_path("smollm2-135m-instruct")
    m = Model(path)
    tok = m.tokenizer
    prompt = "<|im_start|>user\nIs the sky blue?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(prompt, add_special=True, parse_special=True)
    for seed, temp in ((0, 0.0), (1, 0.8)):
        out = m.generate(ids, max_new_tokens=40, temperature=temp, seed=seed, grammar=YES_NO)
        assert pattern.fullmatch(tok.decode(out[len(ids):])), tok.decode(out[len(ids):])
    chat = ChatSession(m, temperature=0, max_new_tokens=40)
    assert pattern.fullmatch(chat.send("Is the sky blue?", grammar=YES_NO))
    with pytest.raises(ValueError, match="not both"):
        chat.send("x", grammar=YES_NO, response_format={"type": "json_object"})
    f = tmp_path / "yes_no.gbnf"
    f.write_text(YES_NO + "\n")
    r = CliRunner().invoke(main, ["generate", path, "-p", prompt, "--grammar-file", str(f), "--temp", "0"])
    assert r.exit_code == 0 and pattern.fullmatch(r.stdout.rstrip("\n")), r.output
    r = CliRunner().invoke(main, ["generate", path, "-p", prompt, "--grammar", "root ::= (", "--temp", "0"])
    assert r.exit_code == 2 and "line 1, column 11: expected ')'" in r.stderr
    with Engine(m, n_parallel=2, ctx_size=256) as eng:
        reqs = [eng.submit(ids, max_tokens=40, temperature=0.8, seed=s, grammar=YES_NO) for s in range(2)]
        for q in reqs:
            q.wait()
            assert q.finish_reason == "stop" and pattern.fullmatch(q.text), q.text
