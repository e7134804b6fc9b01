"""`llmrt serve` over HTTP with real clients: the official `openai` Python client (chat and
completions, streamed and not, stop strings, usage, the prefix cache), concurrency, a bounded
load test, conversations past --ctx-size, disconnects, the queue bound, and bad input.

Each fixture starts `python -m llmrt serve` as a subprocess on a free loopback port with
SmolLM2-135M-Instruct (fetched in CI) and stops it afterwards.

Greedy answers served 4 at a time must equal the same requests served one by one, exactly:
batched decode rows are bit-identical to single-sequence ones (tests/test_batching.py) and each
prompt is prefilled alone, so there are no near ties to allow for.

Run: python -m pytest -q tests/test_server.py
"""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

openai = pytest.importorskip("openai", reason="the openai client is a test extra (pip install -e .[test])")
httpx = pytest.importorskip("httpx", reason="httpx is a test extra (pip install -e .[test])")
pytest.importorskip("fastapi", reason="the serve extra: pip install -e .[serve]")

from fake_lm import real_model_path  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.serve]

START_TIMEOUT = 180      # seconds for a server to load and answer /health
TIMEOUT = 120            # seconds any request may take


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, tmp_path, *args):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"serve-{self.port}.log"
        cmd = [sys.executable, "-m", "llmrt", "serve", real_model_path("smollm2-135m-instruct"),
               "--port", str(self.port), "-t", "2", *args]
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llmrt serve exited ({self.proc.returncode}):\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > START_TIMEOUT:
                self.stop()
                raise RuntimeError(f"llmrt serve did not start in {START_TIMEOUT} s:\n{self.log.read_text()}")
            time.sleep(0.2)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", timeout=TIMEOUT,
                                    max_retries=0)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=5).json()

    def metrics(self) -> dict:
        out = {}
        for line in httpx.get(self.url + "/metrics", timeout=5).text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve"), "-np", "4", "-c", "512")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    """One slot, one queue place, a small context: the queue bound and the streaming cache."""
    d = tmp_path_factory.mktemp("serve1")
    s = Server(d, "-np", "1", "-c", "96", "--max-queue", "1", "--timeout", "30",
               "--slot-save-path", str(d / "slots"), "--body-timeout", "1")
    s.slot_dir = d / "slots"
    yield s
    s.stop()


MSG = [{"role": "system", "content": "You are a helpful assistant."},
       {"role": "user", "content": "Name three fruits."}]


def test_models_and_health(server):
    models = server.client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    h = server.health()
    assert h["status"] == "ok" and h["slots_idle"] + h["slots_processing"] == 4
    head = httpx.head(server.url + "/health", timeout=5)             # load balancers' probes
    assert head.status_code == 200 and head.content == b""
    one = server.client.models.retrieve("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert one.id == models.data[0].id and one.owned_by == "llmrt"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        server.client.models.retrieve("gpt-4o")
    props = httpx.get(server.url + "/props", timeout=5).json()      # llama-server's
    assert props["total_slots"] == 4 and props["n_ctx"] == 512 and "<|im_start|>" in props["chat_template"]
    assert props["default_generation_settings"]["temperature"] == 0.8


def test_chat_streamed_equals_not_streamed(server):
    r = server.client.chat.completions.create(model="x", messages=MSG, temperature=0, max_tokens=40)
    text = r.choices[0].message.content
    assert text and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens <= 40
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    stream = server.client.chat.completions.create(model="x", messages=MSG, temperature=0, max_tokens=40,
                                                   stream=True, stream_options={"include_usage": True})
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    assert "".join(pieces) == text and len(pieces) > 3     # it came in pieces
    assert finish == r.choices[0].finish_reason
    assert usage.completion_tokens == r.usage.completion_tokens
    # the same conversation again: served from the slot's cache
    assert usage.prompt_tokens_details.cached_tokens > 10


def test_greedy_answer_equals_the_library(server):
    """The server renders the GGUF's chat template and decodes as Model.generate does."""
    from llmrt import Model
    from llmrt.chat import ChatTemplate, encode_chat
    m = Model(real_model_path("smollm2-135m-instruct"), n_threads=1, ctx_size=512)
    ids = encode_chat(m.tokenizer, ChatTemplate.for_model(m).render(MSG))
    out = m.generate(ids, max_new_tokens=30, temperature=0, ctx_size=512)
    want = m.tokenizer.decode([i for i in out[len(ids):] if i not in m.tokenizer.eog_ids])
    r = server.client.chat.completions.create(model="x", messages=MSG, temperature=0, max_tokens=30)
    assert r.choices[0].message.content == want


def test_completions_stop_and_length(server):
    r = server.client.completions.create(model="x", prompt="1, 2, 3, 4,", temperature=0, max_tokens=20)
    text = r.choices[0].text
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 20
    assert " 5" in text
    s = server.client.completions.create(model="x", prompt="1, 2, 3, 4,", temperature=0, max_tokens=20,
                                         stop=[" 7"])
    assert s.choices[0].finish_reason == "stop" and s.choices[0].text == text[:text.index(" 7")]
    pieces = [c.choices[0].text for c in server.client.completions.create(
        model="x", prompt="1, 2, 3, 4,", temperature=0, max_tokens=20, stream=True)]
    assert "".join(pieces) == text
    ids = server.client.completions.create(model="x", prompt=[1, 504, 30, 216], temperature=0, max_tokens=3)
    assert ids.usage.prompt_tokens == 4


def _token_name(b: bytes) -> str:
    """A token's text in logprobs: UTF-8, or OpenAI's bytes:\\xNN spelling for part of a character."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{c:02x}" for c in b)


def _token_bytes(name: str) -> bytes:
    if name.startswith("bytes:"):
        return bytes(int(h, 16) for h in name[len("bytes:"):].split("\\x")[1:])
    return name.encode()


def test_logprobs_of_tokens_inside_a_character(server):
    """Emoji come in byte pieces: each piece is named by its bytes (distinct names, so no
    alternative is lost), the pieces make up the text, text_offset counts whole characters."""
    import codecs
    prompt = "Emoji party: \U0001F389\U0001F389\U0001F389 \U0001F600\U0001F600"
    r = server.client.completions.create(model="x", prompt=prompt, max_tokens=12, temperature=0, logprobs=2)
    lp, text = r.choices[0].logprobs, r.choices[0].text
    assert any(t.startswith("bytes:") for t in lp.tokens)
    assert b"".join(_token_bytes(t) for t in lp.tokens).decode("utf-8", errors="replace") == text
    dec, n, want = codecs.getincrementaldecoder("utf-8")(errors="replace"), 0, []
    for t in lp.tokens:
        want.append(n)
        n += len(dec.decode(_token_bytes(t)))
    assert lp.text_offset == want and max(lp.text_offset) < len(text)
    assert all(len(t) == 2 for t in lp.top_logprobs)
    # top_logprobs 0 without logprobs: what some clients always send
    ok = httpx.post(server.url + "/v1/chat/completions", timeout=TIMEOUT,
                    json={"messages": MSG, "max_tokens": 1, "top_logprobs": 0})
    assert ok.status_code == 200 and ok.json()["choices"][0]["logprobs"] is None


def test_echo_scores_the_prompt(server):
    """Completions' echo with logprobs, as lm-evaluation-harness's loglikelihood asks it
    (max_tokens 0 or 1): the prompt's text and tokens first, the first token without a
    log-probability, every other one the model's log-probability given the ids before it (the
    library's log-softmax, computed apart), then the answer's; streamed, the same entries."""
    from llmrt import Model
    from test_real_models import log_softmax
    m = Model(real_model_path("smollm2-135m-instruct"), n_threads=1, ctx_size=512)
    prompt = "The quick brown fox jumps over the lazy dog"
    ids = m.tokenizer.encode(prompt, add_special=True)
    want = log_softmax(m.new_session(ctx_size=512).eval(ids, all_logits=True))
    for max_tokens in (0, 1):
        r = server.client.completions.create(model="x", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             echo=True, logprobs=2)
        c, lp = r.choices[0], r.choices[0].logprobs
        assert c.text.startswith(prompt) and len(lp.tokens) == len(ids) + max_tokens
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        for j in range(1, len(ids)):
            assert abs(lp.token_logprobs[j] - want[j - 1, ids[j]]) <= 1e-6, j
            assert len(lp.top_logprobs[j]) == 2 and max(lp.top_logprobs[j].values()) == \
                pytest.approx(want[j - 1].max(), abs=1e-6)
        assert r.usage.completion_tokens == max_tokens and r.usage.prompt_tokens == len(ids)
    chunks = list(server.client.completions.create(model="x", prompt=prompt, max_tokens=3, temperature=0,
                                                   echo=True, logprobs=1, stream=True))
    assert chunks[0].choices[0].text == prompt
    streamed = sum((ch.choices[0].logprobs.token_logprobs for ch in chunks if ch.choices[0].logprobs), [])
    whole = server.client.completions.create(model="x", prompt=prompt, max_tokens=3, temperature=0, echo=True,
                                             logprobs=1)
    assert streamed == whole.choices[0].logprobs.token_logprobs and len(streamed) == len(ids) + 3
    plain = server.client.completions.create(model="x", prompt=prompt, max_tokens=3, temperature=0, echo=True)
    assert plain.choices[0].text == whole.choices[0].text and plain.choices[0].logprobs is None
    r = httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json={"prompt": prompt, "max_tokens": 0, "echo": True})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]    # (0: scoring only)


def test_logprobs_chat_and_completions(server):
    """logprobs through the openai client: one entry per generated token (the end-of-generation
    id has none), alternatives most likely first, greedy tokens the most likely; the token texts
    and bytes make up the answer; streamed chunks carry the same entries as the whole answer;
    completions' legacy object with its text offsets."""
    from llmrt import Model
    tok = Model(real_model_path("smollm2-135m-instruct"), n_threads=1).tokenizer
    r = server.client.chat.completions.create(model="x", messages=MSG, temperature=0, max_tokens=200,
                                              logprobs=True, top_logprobs=3)
    c = r.choices[0]
    content = c.logprobs.content
    assert c.finish_reason == "stop" and len(content) == r.usage.completion_tokens - 1  # (the EOG id)
    assert b"".join(bytes(e.bytes) for e in content).decode() == c.message.content
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == e.logprob
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
        assert bytes(e.bytes) == tok.token_to_piece(e.id) and e.token == _token_name(bytes(e.bytes))
    stream = server.client.chat.completions.create(model="x", messages=MSG, temperature=0, max_tokens=200,
                                                   logprobs=True, top_logprobs=3, stream=True)
    streamed = [e for ch in stream for ch_c in ch.choices if ch_c.logprobs for e in ch_c.logprobs.content]
    assert [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in streamed] == \
        [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in content]
    plain = server.client.chat.completions.create(model="x", messages=MSG, temperature=0, max_tokens=5)
    assert plain.choices[0].logprobs is None
    k = server.client.completions.create(model="x", prompt="1, 2, 3, 4,", temperature=0, max_tokens=8,
                                         logprobs=2, stop=[" 7"])
    lp = k.choices[0].logprobs
    assert k.choices[0].text.startswith(" 5") and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert "".join(lp.tokens).startswith(k.choices[0].text) and " 7" in "".join(lp.tokens)  # (the stop's token too)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(t) <= 2 and max(t.values()) == v for t, v in zip(lp.top_logprobs, lp.token_logprobs))
    pieces = [ch.choices[0].logprobs for ch in server.client.completions.create(
        model="x", prompt="1, 2, 3, 4,", temperature=0, max_tokens=8, logprobs=2, stop=[" 7"], stream=True)]
    got = [p for p in pieces if p is not None]
    assert sum((p.tokens for p in got), []) == lp.tokens
    assert sum((p.text_offset for p in got), []) == lp.text_offset


def test_logit_bias(server):
    """OpenAI's logit_bias ({"id": -100} all but bans a token) and llama.cpp's [[id, false]]
    (banned): the greedy first token gives way to the next most likely one (logprobs say which)."""
    first = server.client.completions.create(model="x", prompt="The capital of France is", max_tokens=1,
                                             temperature=0, logprobs=2)
    lp = first.choices[0].logprobs
    best, runner_up = lp.tokens[0], list(lp.top_logprobs[0])[1]
    tid = httpx.post(server.url + "/tokenize", json={"content": best}, timeout=TIMEOUT).json()["tokens"]
    assert len(tid) == 1
    r = server.client.completions.create(model="x", prompt="The capital of France is", max_tokens=1,
                                         temperature=0, logit_bias={str(tid[0]): -100})
    assert r.choices[0].text == runner_up != best
    r = httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json={
        "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0, "logit_bias": [[tid[0], False]]})
    assert r.json()["choices"][0]["text"] == runner_up
    for text_form in ({best: -100}, [[best, False]]):     # as llama-server: text, each of its tokens
        r = httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json={
            "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0, "logit_bias": text_form})
        assert r.json()["choices"][0]["text"] == runner_up, text_form
    every = httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json={
        "prompt": "Hi", "logit_bias": [[i, False] for i in range(49152)]})
    assert every.status_code == 400 and "bans every token" in every.json()["error"]["message"]


def test_several_prompts_one_choice_each(server):
    """A list of prompts (strings or id lists, as lm-evaluation-harness batches them): one choice
    per prompt, in order, each the answer the prompt gets alone; usage summed."""
    prompts = ["1, 2, 3,", "The capital of France is", [1, 504, 30, 216]]
    alone = [server.client.completions.create(model="x", prompt=p, temperature=0, max_tokens=6, logprobs=1)
             for p in prompts]
    r = server.client.completions.create(model="x", prompt=prompts, temperature=0, max_tokens=6, logprobs=1)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [a.choices[0].text for a in alone]
    assert [c.logprobs.token_logprobs for c in r.choices] == [a.choices[0].logprobs.token_logprobs for a in alone]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)


def test_n_choices(server):
    """'n': that many choices per prompt, decoded side by side; choice j samples with seed + j
    (the same request again gives the same choices; greedy ones are all equal); completions with
    several prompts give prompt x n choices, prompt by prompt."""
    kw = dict(model="x", messages=MSG, max_tokens=12, temperature=1.2, seed=5, n=3)
    a = server.client.chat.completions.create(**kw)
    b = server.client.chat.completions.create(**kw)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2] and texts == [c.message.content for c in b.choices]
    assert len(set(texts)) > 1 and a.usage.completion_tokens == sum(
        server.client.chat.completions.create(**dict(kw, n=1, seed=5 + j)).usage.completion_tokens for j in range(3))
    assert texts[1] == server.client.chat.completions.create(**dict(kw, n=1, seed=6)).choices[0].message.content
    g = server.client.chat.completions.create(model="x", messages=MSG, max_tokens=8, temperature=0, n=2)
    assert g.choices[0].message.content == g.choices[1].message.content
    one = server.client.chat.completions.create(model="x", messages=MSG, max_tokens=8, temperature=0)
    assert g.usage.prompt_tokens == one.usage.prompt_tokens                  # the prompt counts once
    assert g.usage.completion_tokens == 2 * one.usage.completion_tokens
    c = server.client.completions.create(model="x", prompt=["1, 2,", "a, b,"], max_tokens=4, temperature=0, n=2)
    assert [x.index for x in c.choices] == [0, 1, 2, 3]
    assert c.choices[0].text == c.choices[1].text != c.choices[2].text == c.choices[3].text


def test_special_token_texts_in_a_completion_prompt_are_tokens(server):
    """As llama-server and vLLM read a prompt: "<|im_start|>" is one token (lm-evaluation-harness
    counts it so; it was split into 7 pieces and its scores silently shifted)."""
    r = server.client.completions.create(model="x", prompt="<|im_start|>user\nHi", max_tokens=1,
                                         temperature=0, echo=True, logprobs=0)
    assert r.choices[0].logprobs.tokens[0] == "<|im_start|>" and r.usage.prompt_tokens == 4


def test_tokenize_and_detokenize(server):
    """llama-server's /tokenize and /detokenize: the ids the library's tokenizer gives, pieces
    (bytes where a piece is not whole UTF-8), specials parsed by default, and bad input 400."""
    from llmrt import Model
    tok = Model(real_model_path("smollm2-135m-instruct"), n_threads=1).tokenizer
    text = "<|im_start|>user\nHello, 你好!"
    post = lambda path, body: httpx.post(server.url + path, json=body, timeout=TIMEOUT)  # noqa: E731
    ids = post("/tokenize", {"content": text}).json()["tokens"]
    assert ids == tok.encode(text, add_special=False, parse_special=True) and ids[0] == tok.token_to_id("<|im_start|>")
    assert post("/tokenize", {"content": text, "parse_special": False}).json()["tokens"] == tok.encode(text, add_special=False)
    pieces = post("/tokenize", {"content": "你", "with_pieces": True}).json()["tokens"]
    assert b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces) == "你".encode()
    assert any(isinstance(p["piece"], list) for p in pieces)        # 你 is split inside its bytes
    assert post("/detokenize", {"tokens": ids}).json()["content"] == text
    # vLLM's field names (lm-evaluation-harness's remote tokenizer) and its /tokenizer_info
    v = post("/tokenize", {"prompt": "<|im_end|>", "add_special_tokens": False}).json()
    assert v["tokens"] == [tok.token_to_id("<|im_end|>")] and v["count"] == 1 and v["max_model_len"] == 512
    assert post("/detokenize", {"tokens": ids}).json()["prompt"] == text
    info = httpx.get(server.url + "/tokenizer_info", timeout=TIMEOUT).json()
    assert info["eos_token"] == tok.id_to_token(tok.eos_id) and "<|im_start|>" in info["chat_template"]
    for path, body, needle in (("/tokenize", {"content": 5}, "'content'"), ("/detokenize", {"tokens": "x"}, "'tokens'"),
                               ("/detokenize", {"tokens": [10 ** 7]}, "out of range"),
                               ("/tokenize", {"content": "x", "with_pieces": 1}, "with_pieces")):
        r = post(path, body)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], (path, body)


def test_prefix_cache_over_turns(server):
    msgs = [{"role": "user", "content": "Write one sentence about the sea."}]
    r1 = server.client.chat.completions.create(model="x", messages=msgs, temperature=0, max_tokens=30,
                                               user="conv-1")
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "And one about the sky."}]
    r2 = server.client.chat.completions.create(model="x", messages=msgs, temperature=0, max_tokens=30,
                                               user="conv-1")
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= r1.usage.prompt_tokens and cached < r2.usage.prompt_tokens


def _chat(server, content, n=32, **kw):
    return server.client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": content}], temperature=0, max_tokens=n, **kw)


TOPICS = ["Tell me about cats.", "How do planes fly?", "Give me a pasta recipe.", "What is rain?"]


def test_four_at_once_equal_each_alone(server):
    alone = [_chat(server, t).choices[0].message.content for t in TOPICS]
    out = [None] * 4
    barrier = threading.Barrier(4)

    def run(i):
        barrier.wait()
        out[i] = _chat(server, TOPICS[i]).choices[0].message.content
    ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(TIMEOUT)
    assert out == alone


def test_load_32_requests_from_8_threads(server):
    """Nothing lost: every streamed response complete (finish reason, [DONE]), every count right."""
    before = server.metrics()
    results, errors = [], []
    lock = threading.Lock()

    def worker(w):
        for k in range(4):
            prompt = f"Count from {w * 4 + k} to {w * 4 + k + 5}:"
            try:
                with httpx.stream("POST", server.url + "/v1/completions", timeout=TIMEOUT, json={
                        "prompt": prompt, "max_tokens": 16, "temperature": 0.7, "seed": w * 10 + k,
                        "stream": True, "ignore_eos": True}) as resp:
                    assert resp.status_code == 200
                    texts, finish, done = [], None, False
                    for line in resp.iter_lines():
                        if not line.startswith("data: "):
                            continue
                        data = line[6:]
                        if data == "[DONE]":
                            done = True
                            break
                        c = json.loads(data)["choices"][0]
                        texts.append(c["text"])
                        finish = c["finish_reason"] or finish
                with lock:
                    results.append((done, finish, len([t for t in texts if t])))
            except Exception as e:      # collected, asserted below
                with lock:
                    errors.append(repr(e))
    ts = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(4 * TIMEOUT)
    assert errors == []
    assert len(results) == 32
    assert all(done and finish == "length" for done, finish, _ in results)
    after = server.metrics()
    assert after['llmrt_requests_finished_total{reason="length"}'] - \
        before.get('llmrt_requests_finished_total{reason="length"}', 0) == 32
    assert after["llmrt_generated_tokens_total"] - before["llmrt_generated_tokens_total"] == 32 * 16
    # weights read once per step for all slots: far fewer steps than tokens
    assert after["llmrt_decode_steps_total"] - before["llmrt_decode_steps_total"] < 32 * 16 / 2
    assert server.health()["slots_processing"] == 0


def test_disconnect_frees_the_slot(server):
    with httpx.stream("POST", server.url + "/v1/completions", timeout=TIMEOUT, json={
            "prompt": "Once upon a time", "max_tokens": 100000, "stream": True, "ignore_eos": True}) as resp:
        n = 0
        for line in resp.iter_lines():
            if line.startswith("data: "):
                n += 1
                if n == 3:
                    break
    t0 = time.monotonic()
    while server.health()["slots_processing"] and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert server.health()["slots_processing"] == 0
    assert server.metrics()['llmrt_requests_finished_total{reason="cancelled"}'] >= 1


@pytest.mark.parametrize("route, body", [
    ("/v1/completions", {"prompt": "Once upon a time"}),
    ("/v1/chat/completions", {"messages": MSG}),
], ids=["completions", "chat"])
def test_a_non_streamed_client_that_leaves_frees_its_slot(server, route, body):
    """A client that gave up on a non-streamed request (its timeout) left the request generating
    on its slot to the end (here: never), because the metrics middleware hid the disconnect; two
    such requests wedged a two-slot server."""
    before = server.metrics().get('llmrt_requests_finished_total{reason="cancelled"}', 0)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + route, timeout=2, json={**body, "max_tokens": 100000, "ignore_eos": True})
    t0 = time.monotonic()
    while server.health()["slots_processing"] and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert server.health()["slots_processing"] == 0
    assert server.metrics()['llmrt_requests_finished_total{reason="cancelled"}'] >= before + 1


def test_null_max_completion_tokens_keeps_max_tokens(server):
    """"max_completion_tokens": null hid "max_tokens" (an unbounded generation)."""
    r = httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json={
        "prompt": "Once upon a time", "max_tokens": 5, "max_completion_tokens": None, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5


def test_bodies_that_failed_inside_the_json_parser(server):
    """An integer of 5000 digits is a ValueError of json.loads (not a JSONDecodeError): it was a
    500 with a traceback in the log, and the 500 was not counted in /metrics."""
    big = "1" * 5000
    r = httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, headers={"content-type": "application/json"},
                   content=f'{{"prompt": "hi", "x": {big}}}')
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert "Traceback" not in server.log.read_text()


def test_a_client_that_leaves_while_sending_its_body_is_not_an_internal_error(server):
    before = server.log.read_text()
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
        time.sleep(0.2)
        s.close()
    time.sleep(0.5)
    new = server.log.read_text()[len(before):]
    assert "internal error" not in new and "Traceback" not in new
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200


def _rest_of_response(s, got: bytes) -> bytes:
    """What is left of an HTTP response whose first bytes were `got`: read until its headers and
    Content-Length bytes of body are in, or the server closes (the socket's timeout bounds it)."""
    rest = b""
    while True:
        head, sep, body = (got + rest).partition(b"\r\n\r\n")
        if sep:
            m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            if m and len(body) >= int(m.group(1)):
                return rest
        chunk = s.recv(4096)
        if not chunk:
            return rest
        rest += chunk


def test_a_body_that_stalls_is_a_408(small_server):
    """A client that sends half a body and then nothing (slowloris) is answered 408 after
    --body-timeout (1 s here) instead of holding its connection and handler forever."""
    with socket.create_connection(("127.0.0.1", small_server.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
        t0 = time.monotonic()
        reply = s.recv(4096)
        waited = time.monotonic() - t0
        reply += _rest_of_response(s, reply)    # (the body may come in a segment of its own)
    assert reply.startswith(b"HTTP/1.1 408") and b"no part of the request body arrived for 1 s" in reply
    assert 0.9 <= waited < 10
    assert small_server.health()["status"] == "ok"


def test_conversation_longer_than_the_context(small_server):
    """-c 96: a conversation of several hundred tokens keeps being answered."""
    msgs = [{"role": "system", "content": "You are terse."}]
    for turn in range(6):
        msgs.append({"role": "user", "content": f"Tell me fact number {turn} about the moon."})
        r = small_server.client.chat.completions.create(model="x", messages=msgs, temperature=0,
                                                        max_tokens=40, user="long")
        assert r.choices[0].message.content is not None
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
    assert r.usage.prompt_tokens > 96
    assert small_server.metrics()["llmrt_cache_shifts_total"] > 0


def test_queue_full_is_503_with_retry_after(small_server):
    url = small_server.url + "/v1/completions"
    body = {"prompt": "Hello", "max_tokens": 100000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url, json=body, timeout=TIMEOUT) as running:   # takes the slot
        lines = running.iter_lines()        # (kept: a dropped iterator closes the response)
        next(lines)
        waiting = threading.Thread(target=lambda: httpx.post(url, json=dict(body, stream=False,
                                                                              max_tokens=2), timeout=TIMEOUT))
        waiting.start()                                                      # takes the queue place
        t0 = time.monotonic()
        while small_server.health()["queue_length"] < 1 and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        r = httpx.post(url, json=dict(body, stream=False), timeout=TIMEOUT)
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "queue_full"
        assert small_server.health()["slots_processing"] == 1
    waiting.join(TIMEOUT)
    assert not waiting.is_alive()


BAD = [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe{}", 400, "UTF-8"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"messages": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400, "nested too deeply"),
    (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
    (json.dumps({"messages": []}).encode(), 400, "messages"),
    (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "role"),
    (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), 400, "content"),
    (json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(), 400,
     "text parts"),
    (json.dumps({"messages": MSG, "temperature": "hot"}).encode(), 400, "temperature"),
    (json.dumps({"messages": MSG, "temperature": 9}).encode(), 400, "temperature"),
    (json.dumps({"messages": MSG, "max_tokens": 0}).encode(), 400, "max_tokens"),
    (json.dumps({"messages": MSG, "max_tokens": 1.5}).encode(), 400, "max_tokens"),
    (json.dumps({"messages": MSG, "top_p": 0}).encode(), 400, "top_p"),
    (json.dumps({"messages": MSG, "stop": [1]}).encode(), 400, "stop"),
    (json.dumps({"messages": MSG, "stream": "yes"}).encode(), 400, "stream"),
    (json.dumps({"messages": MSG, "n": 17}).encode(), 400, "'n' must be in [1, 16]"),
    (json.dumps({"messages": MSG, "n": 2, "stream": True}).encode(), 400, "'n' > 1 is not streamed"),
    (json.dumps({"messages": MSG, "seed": True}).encode(), 400, "seed"),
    (json.dumps({"messages": MSG, "logprobs": 3}).encode(), 400, "'logprobs' must be a boolean"),
    (json.dumps({"messages": MSG, "top_logprobs": 2}).encode(), 400, "'top_logprobs' needs 'logprobs': true"),
    (json.dumps({"messages": MSG, "logprobs": True, "top_logprobs": 21}).encode(), 400, "'top_logprobs' must be in"),
    # fields whose effect a client expects were silently ignored
    (json.dumps({"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]}).encode(),
     400, "'tools' is not supported (no tool calling)"),
    (json.dumps({"messages": MSG, "tool_choice": "required"}).encode(), 400, "'tool_choice' is not supported"),
    (json.dumps({"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "string", "pattern": "^a"}}}}).encode(), 400, "pattern not supported"),
    (json.dumps({"messages": MSG, "response_format": "json"}).encode(), 400, "response_format must be"),
    (json.dumps({"messages": MSG, "grammar": 5}).encode(), 400, "'grammar' must be a string (GBNF)"),
    (json.dumps({"messages": MSG, "json_schema": {"type": "nothing"}}).encode(), 400, "is not a JSON type"),
    (json.dumps({"messages": MSG, "json_schema": {}, "response_format": {"type": "json_object"}}).encode(), 400,
     "either 'response_format' or 'json_schema'"),
    (json.dumps({"messages": MSG, "logit_bias": {"": 10}}).encode(), 400, "logit_bias: '' is not a token id"),
    (json.dumps({"messages": MSG, "logit_bias": {"5": 101}}).encode(), 400, "must be a number in [-100, 100]"),
    (json.dumps({"messages": MSG, "logit_bias": [[10 ** 7, 1]]}).encode(), 400, "is not a token id of this vocabulary"),
    (json.dumps({"messages": MSG, "logit_bias": "none"}).encode(), 400, "'logit_bias' must be an object"),
    # valid JSON, not Unicode: an unpaired surrogate escape (no tokenizer can take it)
    (b'{"messages": [{"role": "user", "content": "\\ud800 hi"}]}', 400,
     "messages[0].content has an unpaired UTF-16 surrogate"),
]


@pytest.mark.parametrize("body,status,needle", BAD)
def test_bad_chat_requests(server, body, status, needle):
    r = httpx.post(server.url + "/v1/chat/completions", content=body, timeout=TIMEOUT,
                   headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error"


def test_json_mode(server):
    """response_format json_object through the openai client: every answer is a prefix of one
    JSON object, and one that ends ("stop", where the object closes) parses as one, streamed or
    not (the stream's pieces joined), sampled or greedy; with max_tokens cut short it is a prefix
    ("length"). (A tiny model may ramble inside a string until max_tokens: which answers end is
    the model's, at least one of these must.)"""
    from llmrt.jsonmode import JsonState

    msgs = [{"role": "user", "content": "Return a JSON object with keys name and age for a cat."}]
    fmt = {"type": "json_object"}
    ends = []

    def check(text, finish):
        assert JsonState().feed_bytes(text.encode()) and finish in ("stop", "length"), (text, finish)
        if finish == "stop":
            assert isinstance(json.loads(text), dict)
        ends.append(finish)

    for seed in range(4):
        r = server.client.chat.completions.create(model="m", messages=msgs, max_tokens=200, seed=seed,
                                                  temperature=0.5 if seed else 0.0, response_format=fmt)
        check(r.choices[0].message.content, r.choices[0].finish_reason)
    r = server.client.completions.create(model="m", prompt="A user record as JSON:", max_tokens=200,
                                         temperature=0, extra_body={"response_format": fmt})
    check(r.choices[0].text, r.choices[0].finish_reason)
    chunks = list(server.client.chat.completions.create(model="m", messages=msgs, max_tokens=200, temperature=0,
                                                        response_format=fmt, stream=True))
    check("".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices),
          [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason][-1])
    assert "stop" in ends, ends
    r = server.client.chat.completions.create(model="m", messages=msgs, max_tokens=3, temperature=0,
                                              response_format=fmt)
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content.startswith("{")


def test_json_schema(server):
    """OpenAI's response_format json_schema (the openai client) and llama-server's json_schema
    field: the answers validate against the schema (the `jsonschema` package's validator)."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a test extra (pip install -e .[test])")
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"]}
    msgs = [{"role": "user", "content": "Describe Paris."}]
    r = server.client.chat.completions.create(model="m", messages=msgs, max_tokens=400, temperature=0,
                                              response_format={"type": "json_schema",
                                                               "json_schema": {"name": "city", "schema": schema}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json={
        "prompt": "Paris:", "max_tokens": 400, "temperature": 0.7, "seed": 3, "json_schema": schema})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), schema)


def test_gbnf_grammar(server):
    """llama-server's `grammar` field (GBNF), chat and completions, streamed or not; a syntax
    error is a 400 naming its line and column."""
    import re as re_
    g = 'root ::= ("yes" | "no") (", " [a-z ]{1,12})? "."'
    pattern = re_.compile(r"(yes|no)(, [a-z ]{1,12})?\.")
    r = httpx.post(server.url + "/v1/chat/completions", timeout=TIMEOUT, json={
        "messages": [{"role": "user", "content": "Is the sky blue?"}], "temperature": 0, "grammar": g})
    assert r.status_code == 200, r.text
    assert pattern.fullmatch(r.json()["choices"][0]["message"]["content"])
    parts = [ch.choices[0].text for ch in server.client.completions.create(
        model="m", prompt="Is the sky blue?", stream=True, temperature=0.8, seed=1, extra_body={"grammar": g})]
    assert pattern.fullmatch("".join(parts)), parts
    r = httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json={"prompt": "x", "grammar": "root ::= ("})
    assert r.status_code == 400 and "line 1, column 11" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json={
        "prompt": "x", "grammar": g, "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and "not both" in r.json()["error"]["message"]


def test_grammars_that_cannot_be_served_are_4xx_and_harm_no_one(server):
    """A grammar whose readings multiply (pushed along by logit_bias), a schema past the size
    limit, a grammar whose start alone has 2^20 readings: each a 400 of its own, in seconds; the
    server answers the next request."""
    t0 = time.monotonic()
    r = httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json={
        "prompt": "x", "max_tokens": 60, "temperature": 0, "logit_bias": [["x", 100]],
        "grammar": 'root ::= "x" root "y" | "x" root "z" | ""'})
    assert r.status_code == 400 and "too ambiguous" in r.json()["error"]["message"], r.text
    r = httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json={
        "prompt": "x", "json_schema": {"const": [0] * 700000}})
    assert r.status_code == 400 and "too large" in r.json()["error"]["message"]
    g = "root ::= r0\n" + "".join(f'r{i} ::= r{i + 1} "a" | r{i + 1} "b"\n' for i in range(20)) + 'r20 ::= "c"\n'
    r = httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json={"prompt": "x", "grammar": g})
    assert r.status_code == 400 and "too ambiguous" in r.json()["error"]["message"]
    assert time.monotonic() - t0 < 60
    r = server.client.completions.create(model="m", prompt="Hi", max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length"


def test_unsupported_fields_at_their_off_values_are_accepted(server):
    """What clients send by default (an empty tools list, response_format text, ...) is fine."""
    r = httpx.post(server.url + "/v1/chat/completions", timeout=TIMEOUT, json={
        "messages": MSG, "max_tokens": 2, "tools": [], "tool_choice": "none", "logit_bias": {},
        "response_format": {"type": "text"}})
    assert r.status_code == 200, r.text
    r = httpx.post(server.url + "/v1/completions", timeout=TIMEOUT, json={
        "prompt": "Hi", "max_tokens": 2, "echo": False, "suffix": "", "best_of": 1})
    assert r.status_code == 200, r.text
    r = httpx.post(server.url + "/v1/chat/completions", timeout=TIMEOUT, json={"messages": MSG, "echo": True})
    assert r.status_code == 400 and "'echo' is a completions field" in r.json()["error"]["message"]


@pytest.mark.parametrize("body,needle", [
    ({"prompt": ""}, "empty"), ({"prompt": 5}, "prompt"), ({"prompt": [1, -1]}, "out of range"),
    ({"prompt": [10 ** 9]}, "out of range"), ({"prompt": ["a", 5]}, "or a list of such prompts"),
    ({"prompt": ["a", ""]}, "'prompt[1]' is empty"), ({"prompt": ["a"] * 65}, "at most 64"),
    ({"prompt": ["a", "b"], "stream": True}, "a streamed request takes one prompt"),
    ({"prompt": "x", "presence_penalty": 3}, "presence_penalty"), ({}, "prompt"),
    ({"prompt": "\ud800 lone"}, "prompt has an unpaired UTF-16 surrogate"),
    ({"prompt": "x", "stop": ["\udc00"]}, "stop[0] has an unpaired UTF-16 surrogate"),
    ({"prompt": "x", "logprobs": 21}, "'logprobs' must be in"), ({"prompt": "x", "logprobs": True}, "'logprobs' must be an integer"),
    ({"prompt": "x", "logprobs": 1, "top_logprobs": 2}, "'top_logprobs' is a chat field"),
    ({"prompt": "x", "logit_bias": {"99999999999": 1}}, "is not a token id"),
    ({"prompt": "x", "logit_bias": {"5": True}}, "must be a number in [-100, 100]"),
])
def test_bad_completion_requests(server, body, needle):
    r = httpx.post(server.url + "/v1/completions", content=json.dumps(body).encode(), timeout=TIMEOUT,
                   headers={"content-type": "application/json"})   # (json.dumps escapes a surrogate)
    assert r.status_code == 400 and needle in r.json()["error"]["message"]


def test_oversized_body_and_unknown_routes(server):
    big = b'{"prompt": "' + b"a" * (5 << 20) + b'"}'
    r = httpx.post(server.url + "/v1/completions", content=big, timeout=TIMEOUT)
    assert r.status_code == 413 and "bytes" in r.json()["error"]["message"]
    r = httpx.get(server.url + "/v1/nothing", timeout=TIMEOUT)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(server.url + "/v1/chat/completions", timeout=TIMEOUT)
    assert r.status_code == 405 and "error" in r.json()
    # still healthy after all that
    assert server.health()["status"] == "ok"
    assert _chat(server, "Hi", n=4).choices[0].message.content is not None


def test_metrics_names(server):
    _chat(server, "Hi", n=2)                    # at least one prompt prefilled
    m = server.metrics()
    for name in ("llmrt_requests_submitted_total", "llmrt_prompt_tokens_total", "llmrt_generated_tokens_total",
                 "llmrt_tokens_per_second", "llmrt_slots_busy", "llmrt_slots_total", "llmrt_queue_length",
                 "llmrt_cache_shifts_total", "llmrt_prompt_tokens_cached_total", "llmrt_prefill_chunks_total"):
        assert name in m, name
    assert m["llmrt_prefill_chunks_total"] >= 1
    assert m["llmrt_slots_total"] == 4
    assert any(k.startswith("llmrt_http_requests_total{") for k in m)


def test_api_keys(tmp_path):
    """--api-key / --api-key-file: every route but /health, /v1/models and the chat page needs a
    key (Bearer or X-Api-Key), else a 401 in OpenAI's format, counted in /metrics."""
    keyfile = tmp_path / "keys.txt"
    keyfile.write_text("# the second key\nk-two\n\n")
    s = Server(tmp_path, "--api-key", "k-one", "--api-key-file", str(keyfile), "-np", "1", "-c", "128",
               "--cors-origin", "https://app.example")
    try:
        for path in ("/health", "/v1/models", "/"):
            assert httpx.get(s.url + path, timeout=10).status_code == 200, path
        with pytest.raises(openai.AuthenticationError, match="a valid API key is needed"):
            s.client.chat.completions.create(model="x", messages=MSG, max_tokens=2)
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=TIMEOUT,
                       headers={"Authorization": "Bearer k-wrong"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "invalid_api_key"
        ok = openai.OpenAI(base_url=s.url + "/v1", api_key="k-one", timeout=TIMEOUT, max_retries=0)
        assert ok.chat.completions.create(model="x", messages=MSG, max_tokens=2).usage.completion_tokens == 2
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=TIMEOUT,
                       headers={"X-Api-Key": "k-two"})
        assert r.status_code == 200, r.text
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=TIMEOUT,
                       headers={"X-Api-Key": "stray", "Authorization": "Bearer k-one"})   # one matches
        assert r.status_code == 200, r.text
        assert httpx.get(s.url + "/metrics", timeout=10).status_code == 401
        m = httpx.get(s.url + "/metrics", timeout=10, headers={"Authorization": "Bearer k-two"}).text
        assert 'llmrt_http_requests_total{route="other",status="401"} 3.0' in m     # (chat, completions, metrics)
        assert "2 API keys" in s.log.read_text()
        # --cors-origin: a browser page of that origin may call it (preflight without a key)
        pre = httpx.options(s.url + "/v1/chat/completions", timeout=10, headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://app.example"
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=TIMEOUT,
                       headers={"Origin": "https://app.example"})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "https://app.example"
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=TIMEOUT,
                       headers={"Origin": "https://evil.example", "Authorization": "Bearer k-one"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    finally:
        s.stop()


@pytest.mark.parametrize("args,msg", [
    (["--api-key-file", "EMPTY"], "holds no key"), (["--api-key", "caf\u00e9"], "printable ASCII"),
    (["--api-key-file", "MISSING"], "cannot read"), (["--api-key", ""], "an empty API key"),
])
def test_cli_rejects_bad_api_keys(tmp_path, args, msg):
    (tmp_path / "EMPTY").write_text("# none\n")
    args = [str(tmp_path / a) if a in ("EMPTY", "MISSING") else a for a in args]
    r = subprocess.run([sys.executable, "-m", "llmrt", "serve", real_model_path("smollm2-135m-instruct"),
                        "--port", str(_free_port()), *args], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and msg in r.stderr, r.stderr


def test_cli_rejects_a_bad_prefill_chunk(tmp_path):
    r = subprocess.run([sys.executable, "-m", "llmrt", "serve", "--prefill-chunk", "0", "--port", str(_free_port())],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert r.returncode == 2 and "--prefill-chunk" in r.stderr and ">= 1" in r.stderr


@pytest.mark.parametrize("args, msg", [
    (["--port", "70000"], "'--port': 70000 is not in the range 0<=x<=65535"),
    (["--parallel", "100000"], "'-np' / '--parallel': 100000 is not in the range 1<=x<=1024"),
])
def test_cli_rejects_out_of_range_options(args, msg):
    """--port 70000 listened on 4464 (70000 mod 65536) while announcing 70000; --parallel 100000
    allocated caches until the machine ran out of memory."""
    r = subprocess.run([sys.executable, "-m", "llmrt", "serve"] + args, capture_output=True, text=True,
                       timeout=60, env=dict(os.environ))
    assert r.returncode == 2 and msg in r.stderr


def test_engine_refuses_slots_that_cannot_fit_in_memory():
    from llmrt import Model
    from llmrt.engine import Engine
    m = Model(real_model_path("smollm2-135m-instruct"), n_threads=1)
    with pytest.raises(ValueError, match="slots of 4096 cells need at least .* GiB of KV cache"):
        Engine(m, n_parallel=1_000_000)


def test_cli_needs_a_model_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    r = subprocess.run([sys.executable, "-m", "llmrt", "serve", str(bad), "--port", str(_free_port())],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert r.returncode == 1 and "error:" in r.stderr and "Traceback" not in r.stderr


def test_cli_refuses_a_busy_port_before_loading_the_model(tmp_path):
    """A port in use was found only after the model had loaded (minutes for a big one): the
    listening socket is now taken first, so the error names the port and the model file (here one
    that does not exist) is never opened."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "llmrt", "serve", str(tmp_path / "missing.gguf"),
                            "--port", str(port)], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in r.stderr
    assert "missing.gguf" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "llmrt", "serve", str(tmp_path / "missing.gguf"),
                        "--host", "no-such-host.invalid", "--port", str(_free_port())],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert r.returncode == 1 and "cannot listen on no-such-host.invalid:" in r.stderr


def test_slot_save_erase_restore(small_server):
    """llama.cpp's slot API: save the slot after a turn, erase it, restore it: the next turn is
    served from the restored cache with the same answer as before."""
    url = small_server.url
    msgs = [{"role": "user", "content": "Name a color."}]
    r1 = small_server.client.chat.completions.create(model="x", messages=msgs, temperature=0, max_tokens=10)
    msgs2 = msgs + [{"role": "assistant", "content": r1.choices[0].message.content},
                    {"role": "user", "content": "And another."}]
    save = httpx.post(url + "/slots/0?action=save", json={"filename": "conv.bin"}, timeout=TIMEOUT)
    assert save.status_code == 200 and save.json()["n_saved"] > 10
    assert (small_server.slot_dir / "conv.bin").stat().st_size == save.json()["n_written"]
    r2 = small_server.client.chat.completions.create(model="x", messages=msgs2, temperature=0, max_tokens=10)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached > 10
    assert httpx.post(url + "/slots/0?action=erase", timeout=TIMEOUT).json()["n_erased"] > 0
    restore = httpx.post(url + "/slots/0?action=restore", json={"filename": "conv.bin"}, timeout=TIMEOUT)
    assert restore.status_code == 200 and restore.json()["n_restored"] == save.json()["n_saved"]
    r3 = small_server.client.chat.completions.create(model="x", messages=msgs2, temperature=0, max_tokens=10)
    assert r3.usage.prompt_tokens_details.cached_tokens == cached
    assert r3.choices[0].message.content == r2.choices[0].message.content


@pytest.mark.parametrize("query,body,status", [
    ("?action=save", {"filename": "../x.bin"}, 400), ("?action=save", {"filename": "a/b"}, 400),
    ("?action=save", {"filename": ""}, 400), ("?action=save", {"filename": 5}, 400),
    ("?action=save", {"filename": ".hidden"}, 400), ("?action=restore", {"filename": "none.bin"}, 404),
    ("?action=fly", {"filename": "a.bin"}, 400), ("?action=save", None, 400),
])
def test_slot_api_bad_requests(small_server, query, body, status):
    slot = "7" if body is None else "0"           # (no slot 7)
    r = httpx.post(small_server.url + "/slots/" + slot + query, json=body or {"filename": "a.bin"},
                   timeout=TIMEOUT)
    assert r.status_code == status and "error" in r.json()


def test_slot_restore_of_a_bad_file_changes_nothing(small_server):
    (small_server.slot_dir / "junk.bin").write_bytes(b"not a session")
    before = httpx.get(small_server.url + "/slots", timeout=TIMEOUT).json()
    r = httpx.post(small_server.url + "/slots/0?action=restore", json={"filename": "junk.bin"},
                   timeout=TIMEOUT)
    assert r.status_code == 400 and "not an llmrt session file" in r.json()["error"]["message"]
    assert httpx.get(small_server.url + "/slots", timeout=TIMEOUT).json() == before


def test_slot_busy_is_409(small_server):
    body = {"prompt": "Hello", "max_tokens": 100000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", small_server.url + "/v1/completions", json=body, timeout=TIMEOUT) as running:
        lines = running.iter_lines()
        next(lines)
        r = httpx.post(small_server.url + "/slots/0?action=save", json={"filename": "busy.bin"},
                       timeout=TIMEOUT)
        assert r.status_code == 409 and r.json()["error"]["code"] == "slot_busy"
    assert not (small_server.slot_dir / "busy.bin").exists()


def test_a_stream_that_fails_midway_ends_with_an_error_event_and_done():
    """An engine step that fails while a stream runs: the tokens already sent, then an OpenAI
    error event, then `data: [DONE]` (the stream used to end after the error event, and a client
    that waits for [DONE] waited for the connection to close). In process: the app on an Engine
    whose third step raises."""
    from fastapi.testclient import TestClient

    from llmrt import Model
    from llmrt.engine import Engine
    from llmrt.server import create_app

    m = Model(real_model_path("smollm2-135m-instruct"), n_threads=2)
    engine = Engine(m, n_parallel=1, ctx_size=256)
    step, calls = engine._step, []

    def failing_step():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected failure")
        return step()

    engine._step = failing_step
    try:
        client = TestClient(create_app(engine, "x", None))
        with client.stream("POST", "/v1/completions", json={
                "prompt": "Once upon a time", "max_tokens": 32, "temperature": 0, "stream": True}) as r:
            assert r.status_code == 200
            events = [ln[len("data: "):] for ln in r.iter_lines() if ln.startswith("data: ")]
    finally:
        engine.close()
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["type"] == "server_error", err
    assert "injected failure" in err["message"]
    assert 1 <= len(events[:-2]) < 32 and all("choices" in json.loads(e) for e in events[:-2])


def test_an_internal_error_is_a_500_and_is_counted():
    """A request that raised inside a route was answered 500 but missing from
    llmrt_http_requests_total (the counting middleware never saw a response). In process: an
    Engine whose submit fails."""
    from fastapi.testclient import TestClient

    from llmrt import Model
    from llmrt.engine import Engine
    from llmrt.server import create_app

    m = Model(real_model_path("smollm2-135m-instruct"), n_threads=2)
    engine = Engine(m, n_parallel=1, ctx_size=256)

    def broken_submit(*a, **kw):
        raise RuntimeError("injected")

    engine.submit = broken_submit
    try:
        client = TestClient(create_app(engine, "x", None), raise_server_exceptions=False)
        r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        metrics = client.get("/metrics").text
    finally:
        engine.close()
    assert r.status_code == 500 and r.json()["error"]["message"] == "internal error: RuntimeError"
    assert 'llmrt_http_requests_total{route="/v1/completions",status="500"} 1.0' in metrics
