"""`llmrt chat` and `llmrt generate` with a fake model: piped stdin, /reset, /quit, Ctrl-C,
exit codes, prompt files and stop strings."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

import llmrt.model
from fake_lm import FakeModel
from llmrt.cli import main

REPLY = "Hello world!"


@pytest.fixture
def models(monkeypatch, tmp_path):
    """Every Model the CLI creates is a FakeModel; returns the list of them."""
    made = []

    class Model(FakeModel):
        def __init__(self, path, **kw):
            super().__init__(path, reply=REPLY, **kw)
            self.kw = kw
            made.append(self)

    monkeypatch.setattr(llmrt.model, "Model", Model)
    return made


@pytest.fixture
def gguf(tmp_path):
    p = tmp_path / "fake.gguf"
    p.write_bytes(b"GGUF")
    return str(p)


def run(args, input=None):
    return CliRunner().invoke(main, args, input=input, catch_exceptions=False)


# ---- chat ------------------------------------------------------------------------------------

def test_chat_piped_stdin(models, gguf):
    r = run(["chat", gguf, "--temp", "0"], input="Hi\n\nHow are you?\n")
    assert r.exit_code == 0
    assert r.stdout == f"{REPLY}\n{REPLY}\n"          # answers only: no prompt, no banner
    assert "model: " in r.stderr and "chat template: gguf" in r.stderr


def test_chat_keeps_the_conversation_and_resets(models, gguf):
    r = run(["chat", gguf, "-s", "Be brief.", "--temp", "0"],
            input="Hi\nAgain\n/reset\nOnce more\n")
    assert r.exit_code == 0 and r.stdout == f"{REPLY}\n" * 3
    sess = models[0].sessions[0]
    assert sess.n_resets == 1
    tok = models[0].tokenizer
    text = tok.decode(sess.tokens)
    # after /reset the cache holds the system prompt and the last turn only
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nOnce more")
    assert "Again" not in text


def test_chat_save_and_load_without_a_path_and_help(models, gguf, tmp_path):
    """`/save` or `/load` with no path was sent to the model as a message; `/help` lists the
    commands. Piped, a bad command is an error (exit 1); a message that only starts with /save
    is a message."""
    r = run(["chat", gguf, "--temp", "0"], input="Hi\n/help\n/saved games?\n")
    assert r.exit_code == 0 and r.stdout == f"{REPLY}\n" * 2 and "/save PATH and /load PATH" in r.stderr
    assert "/saved games?" in models[-1].tokenizer.decode(models[-1].sessions[0].tokens)
    for cmd in ("/save", "/load  "):
        r = CliRunner().invoke(main, ["chat", gguf, "--temp", "0"], input=f"Hi\n{cmd}\nNever\n")
        assert r.exit_code == 1 and r.stdout == f"{REPLY}\n"
        assert f"{cmd.strip()} needs a file: {cmd.strip()} PATH" in r.stderr


def test_logit_bias_flag(models, gguf):
    """llama.cpp's -l/--logit-bias ID(+|-)BIAS reaches the sampler; a malformed one, +inf or an id
    past the vocabulary is a usage error before any answer."""
    r = run(["chat", gguf, "--temp", "0", "-l", "5-inf", "--logit-bias", "7+2.5", "-l", "9-1e1"], input="Hi\n")
    assert r.exit_code == 0 and "logit_bias={5: -inf, 7: 2.5, 9: -10.0}" in r.stderr
    for bad, msg in (("5*2", "is not ID+BIAS"), ("5+inf", "+inf would make"), ("x-1", "is not ID+BIAS")):
        r = CliRunner().invoke(main, ["chat", gguf, "-l", bad], input="Hi\n")
        assert r.exit_code == 2 and msg in r.stderr, r.stderr
    r = CliRunner().invoke(main, ["generate", gguf, "-p", "Hi", "-l", f"{10 ** 7}+1"])
    assert r.exit_code == 1 and "logit_bias token id 10000000 is out of range" in r.stderr and not r.stdout.strip()


def test_chat_second_turn_sees_the_first(models, gguf):
    run(["chat", gguf, "--temp", "0"], input="First\nSecond\n")
    text = models[0].tokenizer.decode(models[0].sessions[0].tokens)
    assert "First" in text and f"{REPLY}<|im_end|>" in text and "Second" in text


@pytest.mark.parametrize("cmd", ["/quit", "/exit"])
def test_chat_quit(models, gguf, cmd):
    r = run(["chat", gguf, "--temp", "0"], input=f"Hi\n{cmd}\nNever\n")
    assert r.exit_code == 0 and r.stdout == f"{REPLY}\n"


def test_chat_ctrl_c_stops_the_answer_not_the_session(models, gguf, monkeypatch):
    state = {"n": 0}
    orig = FakeModel._next

    def next_fn(self, tokens):
        state["n"] += 1
        if state["n"] == 2:                   # during the first answer
            raise KeyboardInterrupt
        return orig(self, tokens)

    monkeypatch.setattr(FakeModel, "_next", next_fn)
    r = run(["chat", gguf, "--temp", "0"], input="Hi\nAgain\n")
    assert r.exit_code == 0
    assert r.stdout == f"Hello\n{REPLY}\n"   # first answer cut after one token
    assert "interrupted" in r.stderr


def test_chat_empty_input_exits_0(models, gguf):
    r = run(["chat", gguf], input="")
    assert r.exit_code == 0 and r.stdout == ""


def test_chat_flags_reach_the_model_and_sampler(models, gguf):
    r = run(["chat", gguf, "-c", "256", "-t", "1", "--temp", "0.5", "--top-k", "7",
             "--top-p", "0.5", "--min-p", "0.2", "--repeat-penalty", "1.2", "--seed", "3",
             "-n", "1"], input="Hi\n")
    assert r.exit_code == 0
    assert models[0].kw == {"n_threads": 1, "ctx_size": 256}
    assert "Sampler(temperature=0.5, top_k=7, top_p=0.5, min_p=0.2, repeat_penalty=1.2" \
        in r.stderr
    assert r.stdout == "Hello\n"                      # -n 1: one token per answer


def test_chat_template_override(models, gguf, tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}{{ m.content }}{% endfor %}<|im_start|>assistant\n")
    r = run(["chat", gguf, "--temp", "0", "--chat-template", str(f)], input="Hi\n")
    assert r.exit_code == 0 and f"chat template: {f}" in r.stderr
    assert models[0].tokenizer.decode(models[0].sessions[0].tokens).startswith("Hi<|im_start|>")


def test_chat_unknown_model(models):
    r = run(["chat", "no-such-model"], input="Hi\n")
    assert r.exit_code == 1
    assert "error: no such file: no-such-model" in r.stderr and "gemma3-270m" in r.stderr


# ---- generate --------------------------------------------------------------------------------

PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"   # the fake model answers this


def test_generate_prompt(models, gguf):
    r = run(["generate", gguf, "-p", PROMPT, "--temp", "0"])
    assert r.exit_code == 0 and r.stdout == f"{REPLY}\n"
    assert "stop: eog" in r.stderr


def test_generate_file_and_n_predict(models, gguf, tmp_path):
    f = tmp_path / "prompt.txt"
    f.write_text(PROMPT)
    r = run(["generate", gguf, "-f", str(f), "-n", "2", "--temp", "0"])
    assert r.exit_code == 0 and r.stdout == "Hello world\n"
    assert "stop: length" in r.stderr


def test_generate_stop_string(models, gguf):
    r = run(["generate", gguf, "-p", PROMPT, "--temp", "0", "--stop", "ld!", "--stop", "xyz"])
    assert r.exit_code == 0 and r.stdout == "Hello wor\n"


def test_generate_ignore_eos(models, gguf):
    r = run(["generate", gguf, "-p", PROMPT, "--temp", "0", "--ignore-eos", "-n", "4"])
    assert r.exit_code == 0 and r.stdout == f"{REPLY}<|im_end|>\n"


@pytest.mark.parametrize("args", [[], ["-p", "x", "-f", __file__]], ids=["none", "both"])
def test_generate_needs_one_prompt(models, gguf, args):
    r = run(["generate", gguf] + args)
    assert r.exit_code == 2 and "exactly one of -p PROMPT or -f FILE" in r.stderr
