"""Chat templates (rendered as transformers renders them), template choice, one BOS, and
ChatSession's incremental KV-cache use, with a fake model and the real tokenizers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from fake_lm import BOS, IM_END, FakeModel, FakeSession, FakeTokenizer, real_tokenizer
from llmrt.chat import (BUILTIN_TEMPLATES, ChatSession, ChatTemplate, builtin_template,
                        encode_chat, pick_template)

REF_SMOLLM2 = Path(__file__).parent / "data" / "ref_smollm2.json"

CONV = [{"role": "system", "content": "  You are terse.\n"},
        {"role": "user", "content": "Hi there "},
        {"role": "assistant", "content": " Hello! "},
        {"role": "user", "content": "What is 2+2?"}]

# What each built-in template must produce for CONV (add_generation_prompt=True), written out
# from the formats' definitions (llama.cpp's llm_chat_apply_template and the models' templates).
EXPECTED = {
    "chatml": ("<|im_start|>system\n  You are terse.\n<|im_end|>\n"
               "<|im_start|>user\nHi there <|im_end|>\n"
               "<|im_start|>assistant\n Hello! <|im_end|>\n"
               "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
               "<|im_start|>assistant\n"),
    "gemma": ("<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n"
              "<start_of_turn>model\nHello!<end_of_turn>\n"
              "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
              "<start_of_turn>model\n"),
    "llama2": ("<s>[INST] <<SYS>>\n  You are terse.\n\n<</SYS>>\n\nHi there [/INST]"
               " Hello! </s><s>[INST] What is 2+2? [/INST]"),
    "llama3": ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
               "You are terse.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n"),
}
SPECIAL = {"chatml": ("<s>", "</s>"), "gemma": ("<bos>", "<eos>"), "llama2": ("<s>", "</s>"),
           "llama3": ("<|begin_of_text|>", "<|eot_id|>")}


def hf_render(source, messages, add_generation_prompt=True, **kw):
    out, _ = render_jinja_template([messages], chat_template=source,
                                   add_generation_prompt=add_generation_prompt, **kw)
    return out[0]


# ---- rendering -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", BUILTIN_TEMPLATES)
def test_builtin_templates(name):
    bos, eos = SPECIAL[name]
    t = ChatTemplate(builtin_template(name), bos_token=bos, eos_token=eos, name=name)
    got = t.render(CONV)
    assert got == EXPECTED[name]
    assert got == hf_render(t.source, CONV, bos_token=bos, eos_token=eos)


def test_gemma_without_system_and_without_generation_prompt():
    t = ChatTemplate(builtin_template("gemma"), bos_token="<bos>")
    assert t.render(CONV[1:3], add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nHi there<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n")


def test_llama2_roles_must_alternate():
    t = ChatTemplate(builtin_template("llama2"), bos_token="<s>", eos_token="</s>")
    with pytest.raises(ValueError, match="alternate"):
        t.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_smollm2_gguf_template_renders_chatml():
    tok, md = real_tokenizer("smollm2-135m-instruct")
    t = ChatTemplate.for_tokenizer(tok, md)
    assert t.name == "gguf"
    msgs = [{"role": "user", "content": "Hi"}]
    assert t.render(msgs) == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                              "trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                              "<|im_start|>assistant\n")
    assert t.render(CONV) == EXPECTED["chatml"]        # with a system message: no default one
    for conv in (msgs, CONV, CONV[:3]):
        for agp in (True, False):
            assert t.render(conv, agp) == hf_render(t.source, conv, agp,
                                                    bos_token=t.bos_token, eos_token=t.eos_token)


@pytest.mark.parametrize("source", [
    "{% for m in messages %}{{ m | tojson }}{% endfor %}",
    "{{ messages[0]['content'] | tojson(indent=2) }}",
    "{% for m in messages %}\n  {% if loop.index0 > 1 %}{% break %}{% endif %}\n"
    "  <{{ m.role }}>\n{% endfor %}",
    "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
    "{{ bos_token }}{{ '%d' | format(messages | length) }}{{ eos_token }}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% endfor %}{{ ns.n }}{{ messages[-1].content.strip() }}",
], ids=["tojson", "tojson-indent", "trim-lstrip-loopcontrols", "generation-tag", "filters",
        "namespace"])
def test_jinja_features_render_as_hf(source):
    msgs = [{"role": "user", "content": "caf\u00e9 \u4f60\u597d \"q\" <b>"},
            {"role": "assistant", "content": " ok "}, {"role": "user", "content": "x"}]
    t = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    assert t.render(msgs) == hf_render(source, msgs, bos_token="<s>", eos_token="</s>")


def test_raise_exception_and_strftime_now():
    t = ChatTemplate("{{ raise_exception('nope: ' + messages[0].role) }}")
    with pytest.raises(ValueError, match="nope: user"):
        t.render([{"role": "user", "content": ""}])
    year = ChatTemplate("{{ strftime_now('%Y') }}").render([])
    assert year.isdigit() and int(year) >= 2024


def test_sandbox_blocks_unsafe_access():
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(Exception):
        t.render([])


def test_syntax_error_is_a_value_error():
    with pytest.raises(ValueError, match="syntax error"):
        ChatTemplate("{% for m in messages %}")


def test_bad_message():
    with pytest.raises(ValueError, match="role"):
        ChatTemplate("x").render([{"content": "hi"}])


# ---- picking a template ----------------------------------------------------------------------

def _md(arch="llama", pre="default", model="gpt2", tokens=()):
    return {"general.architecture": arch, "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.model": model, "tokenizer.ggml.tokens": list(tokens) or ["a"]}


@pytest.mark.parametrize("md, want", [
    (_md(arch="gemma3", model="llama"), "gemma"),
    (_md(tokens=["<start_of_turn>", "<end_of_turn>"]), "gemma"),
    (_md(pre="llama-bpe"), "llama3"),
    (_md(tokens=["<|start_header_id|>", "<|eot_id|>"]), "llama3"),
    (_md(pre="qwen2", tokens=["<|im_start|>", "<|im_end|>"]), "chatml"),
    (_md(model="llama"), "llama2"),
    (_md(tokens=["[INST]", "[/INST]"]), "llama2"),
    (_md(arch="phi2"), "chatml"),
], ids=["gemma-arch", "gemma-tokens", "llama3-pre", "llama3-tokens", "chatml", "llama2-spm",
        "llama2-inst", "default"])
def test_pick_template(md, want):
    assert pick_template(md, FakeTokenizer()) == want


def test_for_tokenizer_override_and_file(tmp_path):
    tok, md = FakeTokenizer(), {"tokenizer.chat_template": "GGUF{{ messages | length }}"}
    assert ChatTemplate.for_tokenizer(tok, md).render([]) == "GGUF0"
    assert ChatTemplate.for_tokenizer(tok, {}).name == "chatml"      # fake vocab: no turn tokens
    assert ChatTemplate.for_tokenizer(tok, md, "llama3").name == "llama3"
    f = tmp_path / "t.jinja"
    f.write_text("FILE{{ bos_token }}")
    t = ChatTemplate.for_tokenizer(tok, md, str(f))
    assert t.render([]) == "FILE<s>"
    assert ChatTemplate.for_tokenizer(tok, md, "{{ 'SRC' }}").render([]) == "SRC"
    with pytest.raises(FileNotFoundError, match="no such file"):
        ChatTemplate.for_tokenizer(tok, md, str(tmp_path / "missing.jinja"))


def test_gemma_real_file_gets_the_gemma_template():
    tok, md = real_tokenizer("gemma3-270m")
    t = ChatTemplate.for_tokenizer(tok, md)
    assert t.name == "gemma" and t.bos_token == "<bos>"


# ---- one BOS ---------------------------------------------------------------------------------

@pytest.mark.parametrize("add_bos", [True, False])
@pytest.mark.parametrize("source", ["{{ bos_token }}[{{ messages[0].content }}]",
                                    "[{{ messages[0].content }}]"], ids=["writes-bos", "no-bos"])
def test_bos_exactly_once_fake(add_bos, source):
    tok = FakeTokenizer(add_bos=add_bos)
    t = ChatTemplate(source, bos_token="<s>")
    ids = encode_chat(tok, t.render([{"role": "user", "content": "Hello"}]))
    n_bos = ids.count(BOS)
    writes = source.startswith("{{ bos_token }}")
    assert n_bos == (1 if (writes or add_bos) else 0)
    assert (ids[0] == BOS) == (n_bos == 1)


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma3-270m"])
@pytest.mark.parametrize("template", [None, "chatml", "gemma", "llama3"])
def test_bos_never_doubled_or_missing_real(name, template):
    tok, md = real_tokenizer(name)
    t = ChatTemplate.for_tokenizer(tok, md, template)
    text = t.render(CONV)
    ids = encode_chat(tok, text)
    plain = tok.encode(text, add_special=False, parse_special=True)
    if tok.add_bos:                      # gemma: exactly one BOS, first, whatever the template
        assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
        assert ids == (plain if text.startswith(t.bos_token) else [tok.bos_id] + plain)
    else:
        # SmolLM2: add_bos is false and its BOS is <|im_start|>, which ChatML turns start with:
        # nothing is added, the turn markers are the only BOS ids
        assert t.bos_token == "<|im_start|>"
        assert ids == plain


def test_smollm2_chat_ids():
    tok, md = real_tokenizer("smollm2-135m-instruct")
    t = ChatTemplate.for_tokenizer(tok, md)
    ids = encode_chat(tok, t.render([{"role": "user", "content": "Hi"}]))
    # the turn markers are single special tokens, not their spelled-out text
    im_start, im_end = tok.bos_id, tok.eos_id          # 1 and 2 in SmolLM2's vocabulary
    assert ids[0] == im_start and ids.count(im_start) == 3 and ids.count(im_end) == 2
    assert tok.decode(ids) == t.render([{"role": "user", "content": "Hi"}])


def _ref_chat_entries():
    if not REF_SMOLLM2.exists():
        return []
    return json.loads(REF_SMOLLM2.read_text()).get("chat", [])


def test_smollm2_reference_chat_ids():
    entries = _ref_chat_entries()
    if not entries:
        pytest.skip(f"no 'chat' entries in {REF_SMOLLM2} yet (reference ids from llama.cpp)")
    tok, md = real_tokenizer("smollm2-135m-instruct")
    t = ChatTemplate.for_tokenizer(tok, md)
    for e in entries:
        text = t.render(e["messages"], add_generation_prompt=e["add_generation_prompt"])
        assert text == e["text"]
        assert encode_chat(tok, text) == e["ids"]


# ---- ChatSession -----------------------------------------------------------------------------

def _chatml(tok, messages, agp=True):
    t = ChatTemplate(builtin_template("chatml"))
    return encode_chat(tok, t.render(messages, agp))


def test_send_feeds_only_the_new_part():
    m = FakeModel(reply="Hello world!")
    cs = ChatSession(m, system="Be brief.", temperature=0.0)
    sess = m.sessions[0]
    assert cs.send("Hi") == "Hello world!"
    first = _chatml(m.tokenizer, cs.messages[:2])
    assert sess.calls[0] == first
    assert cs.send("Again") == "Hello world!"
    conv = _chatml(m.tokenizer, cs.messages[:4])
    # the answer's ids were evaluated one by one (not the final <|im_end|>); the second turn
    # evaluates only what follows them
    n_cached = len(first) + len(m.reply_ids())
    assert sess.calls[1 + len(m.reply_ids())] == conv[n_cached:]
    assert conv[n_cached] == IM_END
    assert sess.n_resets == 0
    assert [x["role"] for x in cs.messages] == ["system", "user", "assistant", "user",
                                                  "assistant"]


def test_streamer_gets_new_prompt_part_then_answer():
    m = FakeModel(reply="Hello")
    cs = ChatSession(m, temperature=0.0)
    puts = []

    class Rec:
        def put(self, v):
            puts.append(list(v))

        def end(self):
            puts.append("end")

    cs.send("Hi", streamer=Rec())
    assert puts == [m.sessions[0].calls[0], m.reply_ids(), "end"]


def test_reset_clears_conversation_and_cache():
    m = FakeModel()
    cs = ChatSession(m, system="S", temperature=0.0)
    cs.send("Hi")
    cs.reset()
    assert cs.messages == [{"role": "system", "content": "S"}]
    assert m.sessions[0].tokens == [] and m.sessions[0].n_resets == 1
    cs.send("Hi")
    assert m.sessions[0].calls[-len(m.reply_ids()) - 1] == _chatml(m.tokenizer, cs.messages[:2])


@pytest.mark.parametrize("truncate", [True, False])
def test_history_rewrite_re_evaluates_from_first_difference(truncate):
    m = FakeModel(reply="Hello")
    sess = m.new_session(truncate=truncate)
    cs = ChatSession(m, temperature=0.0, session=sess)
    cs.send("Hi")
    cs.messages[1]["content"] = "Ho"          # history changed behind the cache's back
    cs.send("Again")
    conv = _chatml(m.tokenizer, cs.messages[:3])      # the second turn's prompt
    assert sess.tokens[:len(conv)] == conv
    if truncate:
        assert sess.n_resets == 0 and sess.calls[-len(m.reply_ids())][0] != conv[0]
    else:
        assert sess.n_resets == 1


def test_answer_re_tokenized_differently_is_handled():
    """The sampled ids of an answer need not be how its text tokenizes; the next turn must
    still see exactly the rendered conversation."""
    m = FakeModel(reply="Hello")
    tok = m.tokenizer
    split = [tok.id_of(b"H"), tok.id_of(b"e"), tok.id_of(b"l"), tok.id_of(b"l"), tok.id_of(b"o")]
    m.reply_ids = lambda: split              # the model spells "Hello" byte by byte
    sess = m.new_session(truncate=True)
    cs = ChatSession(m, temperature=0.0, session=sess)
    assert cs.send("Hi") == "Hello"
    cs.send("Again")
    conv = _chatml(tok, cs.messages[:3])              # the second turn's prompt
    assert sess.tokens[:len(conv)] == conv


class ShiftSession(FakeSession):
    """Drops the oldest half of the unpinned tokens when full, like a streaming KV cache."""

    def __init__(self, n_vocab, next_fn, n_ctx, n_keep):
        super().__init__(n_vocab, next_fn, n_ctx)
        self.n_keep = n_keep
        self.n_shifts = 0
        self.all_fed: list[int] = []          # every id ever evaluated, in order

    def eval(self, ids):
        ids = [int(i) for i in ids]
        self.all_fed += ids
        while len(self.tokens) + len(ids) > self.n_ctx:
            d = (len(self.tokens) - self.n_keep) // 2
            assert d > 0, "batch larger than the cache"
            del self.tokens[self.n_keep:self.n_keep + d]
            self.n_shifts += 1
        self.calls.append(ids)
        self.tokens += ids
        import numpy as np
        x = np.zeros(self.n_vocab, dtype=np.float32)
        x[self.next_fn(self.all_fed)] = 10.0
        return x


def test_context_shift_does_not_trigger_re_evaluation():
    m = FakeModel(reply="Hello world!")
    sess = ShiftSession(m.n_vocab, m._next, n_ctx=48, n_keep=4)
    cs = ChatSession(m, temperature=0.0, session=sess)
    for i in range(6):
        assert cs.send(f"turn {i}") == "Hello world!"
    assert sess.n_shifts > 0 and sess.n_resets == 0
    # what was fed, in order, is exactly the conversation (nothing twice, nothing missing)
    assert sess.all_fed == _chatml(m.tokenizer, cs.messages[:-1]) + m.reply_ids()


def test_keyboard_interrupt_keeps_partial_answer():
    m = FakeModel(reply="Hello world!")
    calls = {"n": 0}
    orig = m._next

    def next_fn(tokens):
        calls["n"] += 1
        if calls["n"] == 3:                  # prompt logits, then 1 answer token, then Ctrl-C
            raise KeyboardInterrupt
        return orig(tokens)

    m._next = next_fn
    cs = ChatSession(m, temperature=0.0)
    with pytest.raises(KeyboardInterrupt):
        cs.send("Hi")
    assert cs.messages[-1]["role"] == "assistant"
    assert cs.messages[-1]["content"] == "Hello world"[:len(cs.messages[-1]["content"])]
    assert cs.last_result.finish_reason == "interrupted"
    m._next = orig
    assert cs.send("Again") == "Hello world!"    # the session goes on


def test_max_new_tokens_per_answer():
    m = FakeModel(reply="Hello world! the END")
    cs = ChatSession(m, temperature=0.0, max_new_tokens=2)
    assert cs.send("Hi") == "Hello world"
    assert cs.send("Hi", max_new_tokens=1) == "Hello"


# ---- real models -----------------------------------------------------------------------------

@pytest.mark.slow
def test_real_smollm2_chat_reuses_the_cache():
    from fake_lm import real_model
    m = real_model("smollm2-135m-instruct")
    sess = m.new_session()
    cs = ChatSession(m, temperature=0.0, max_new_tokens=12, session=sess)
    fed = []
    orig = sess.eval
    sess.eval = lambda ids, **kw: (fed.append(list(ids)), orig(ids, **kw))[1]
    a1 = cs.send("What is 2+2?")
    k = len(fed)                               # eval calls of the first turn
    a2 = cs.send("And 3+3?")
    assert a1 and a2
    prompt2 = encode_chat(m.tokenizer, cs.render(cs.messages[:3]))
    # turn 2 evaluated a suffix of its prompt, not the whole conversation again
    assert len(fed[k]) < len(prompt2) - len(fed[0])
    assert prompt2[-len(fed[k]):] == fed[k]
    assert sess.tokens[:len(prompt2)] == prompt2


@pytest.mark.slow
def test_real_gemma_chat_one_bos():
    from fake_lm import real_model
    m = real_model("gemma3-270m")
    cs = ChatSession(m, temperature=0.0, max_new_tokens=6)
    assert cs.template.name == "gemma"
    cs.send("Hello")
    toks = cs.session.tokens
    assert toks[0] == m.tokenizer.bos_id and toks.count(m.tokenizer.bos_id) == 1
    assert m.tokenizer.decode(toks).startswith("<bos><start_of_turn>user\nHello<end_of_turn>\n"
                                               "<start_of_turn>model\n")


def test_a_template_that_would_run_or_grow_forever_is_stopped(monkeypatch):
    """A template (a --chat-template file, or the GGUF's own) with nested loops of 10^10 steps hung
    `llmrt chat` (and would hang a server worker); `"x" * 10**10` tried to build 10 GB. Both are
    errors now: a time budget for the render, a size limit for one '*'."""
    import sys
    import time

    import llmrt.chat as chat_mod
    trace_before = sys.gettrace()
    monkeypatch.setattr(chat_mod, "RENDER_SECONDS", 0.5)
    msgs = [{"role": "user", "content": "hi"}]
    loops = chat_mod.ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}"
                                  "{% endfor %}{% endfor %}", name="loops")
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"\[chat template\] loops: rendering took more than 0.5 s"):
        loops.render(msgs)
    assert time.monotonic() - t0 < 5
    for src in ('{{ "x" * 10**10 }}', "{{ [0] * 10**9 }}", '{{ 10**10 * "x" }}'):
        with pytest.raises(ValueError, match=r"'\*' would build \d+ items"):
            chat_mod.ChatTemplate(src).render(msgs)
    with pytest.raises(ValueError, match=r"'\*\*' would build a number"):
        chat_mod.ChatTemplate("{{ 7 ** 100000 }}").render(msgs)
    # what templates do stays allowed, and the hook is removed afterwards
    assert chat_mod.ChatTemplate('{{ "=" * 3 }}{{ 2 ** 10 }}').render(msgs) == "===1024"
    assert sys.gettrace() is trace_before
