"""`llmrt serve`: an OpenAI-compatible HTTP server over the engine (llmrt/engine.py).

    pip install "llmrt[serve]"
    llmrt serve model.gguf --port 8080 --parallel 4 --ctx-size 2048 --n-keep auto

Routes: GET / (a chat page in the browser), POST /v1/chat/completions, POST /v1/completions
(both with `stream` as server-sent events in OpenAI's chunk format, ending with `data: [DONE]`),
GET /v1/models (and /v1/models/{id}), POST /tokenize and /detokenize and GET /props
(llama-server's), GET or HEAD /health, GET /metrics (Prometheus), GET /slots
(each slot's cache: cells used, pinned, shifts), POST /slots/{id}?action=save|restore|erase
(llama.cpp's slot API; files inside --slot-save-path).

This file is a thin layer: it parses and checks the JSON, renders the chat template, and hands
the ids to the engine, which owns batching, slots and their streaming caches. Every bad request
gets a 4xx with an OpenAI-style body {"error": {"message", "type", "param", "code"}}: malformed
JSON, invalid UTF-8, a body over --max-body-bytes (413), wrong types, unknown roles, values out
of range; a full queue is a 503 with Retry-After. A client that disconnects cancels its request
(its slot is free within one engine step).

Log-probabilities: chat `logprobs` / `top_logprobs`, completions `logprobs` N (LogprobsFormat;
the engine computes them, Request.logprobs).

API keys (--api-key, --api-key-file, LLMRT_API_KEY): every route but GET /health, GET /v1/models
and the chat page needs `Authorization: Bearer KEY` (or `X-Api-Key: KEY`), else a 401.
--cors-origin ORIGIN lets pages of ORIGIN ("*": any) call the API from a browser.

Conversation affinity: the request's `user` field, or an `X-Session-Id` header, names the
conversation; the engine prefers the slot that served it last, so its prefix cache keeps working.
"""

import asyncio
import codecs
import hashlib
import hmac
import json
import logging
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from llmrt import __version__
from llmrt.checks import id_text, is_int, is_number
from llmrt.grammar import gbnf_grammar, schema_grammar
from llmrt.jsonmode import parse_response_format, vocab_tables

log = logging.getLogger("llmrt")

MAX_BODY_BYTES = 4 << 20         # default --max-body-bytes
MAX_STOP = 16                    # stop strings per request
MAX_PROMPTS = 64                 # prompts per completions request (one choice each)
MAX_N = 16                       # choices per prompt ('n')
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SAMPLING_DEFAULTS = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05}


DISCONNECT_POLL_S = 0.5   # how often a non-streamed request looks for a client that left
BODY_TIMEOUT_S = 30.0     # default --body-timeout: a request body stalled this long between two parts: 408
# routes open without an API key (as llama-server's: health, the model list; and the chat page,
# which asks for the key when the API answers 401)
PUBLIC_ROUTES = frozenset({"/health", "/v1/models", "/"})


class APIError(Exception):
    """An error answered as OpenAI does: status, {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 type_: Optional[str] = None, code: Optional[str] = None, headers: Optional[dict] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


# ---- request checking ---------------------------------------------------------------------------

def _num(body: dict, name: str, lo: float, hi: float, default=None, integer: bool = False,
         lo_open: bool = False):
    """body[name] as a number in [lo, hi] ((lo, hi] with lo_open), or default if absent/null."""
    v = body.get(name)
    if v is None:
        return default
    if not (is_int(v) if integer else is_number(v)):
        raise APIError(400, f"'{name}' must be {'an integer' if integer else 'a number'}, got "
                            f"{type(v).__name__}", param=name)
    if isinstance(v, float) and not math.isfinite(v):
        raise APIError(400, f"'{name}' must be finite, got {v}", param=name)
    if v < lo or v > hi or (lo_open and v == lo):
        lo_s = f"({lo}" if lo_open else f"[{lo}"
        raise APIError(400, f"'{name}' must be in {lo_s}, {hi}], got {v}", param=name)
    return v


def _opt_type(body: dict, name: str, types, what: str):
    v = body.get(name)
    if v is not None and (not isinstance(v, types) or isinstance(v, bool) and bool not in
                          (types if isinstance(types, tuple) else (types,))):
        raise APIError(400, f"'{name}' must be {what}, got {type(v).__name__}", param=name)
    return v


# OpenAI fields llmrt does not implement, each with the values that mean "not used"
_UNSUPPORTED = (
    ("tools", lambda v: v == [], "no tool calling"),
    ("functions", lambda v: v == [], "no function calling"),
    ("tool_choice", lambda v: v in ("none", "auto"), "no tool calling"),   # (auto: with no tools,
    ("function_call", lambda v: v in ("none", "auto"), "no function calling"),   # none)
    ("suffix", lambda v: v == "", "no insertion after a suffix"),
    ("best_of", lambda v: v == 1, "one completion per request"),
)


def _started(g):
    """g, with its start state made (memoized on it; ValueError if it is too ambiguous there)."""
    g.start()
    return g


def parse_logprobs(body: dict, chat: bool) -> Optional[int]:
    """The alternatives per token asked for, or None (no logprobs). Chat: `logprobs` (a boolean)
    and `top_logprobs` (0-20, needs logprobs true); completions: `logprobs` (0-20, OpenAI's own
    bound there is 5)."""
    from llmrt.engine import MAX_TOP_LOGPROBS

    if chat:
        on = _opt_type(body, "logprobs", bool, "a boolean")
        k = _num(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, None, integer=True)
        if k and not on:        # (0 without logprobs: what some clients always send)
            raise APIError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        return (k or 0) if on else None
    if body.get("logprobs") is False:
        return None
    return _num(body, "logprobs", 0, MAX_TOP_LOGPROBS, None, integer=True)


def parse_logit_bias(body: dict, n_vocab: int, tokenizer=None) -> Optional[dict]:
    """OpenAI's {"id": bias} or llama.cpp's [[id, bias], ...] -> {id: bias} for the Sampler.
    bias: a number in [-100, 100], or false (llama.cpp: banned). As llama-server, an object key
    that is not a token id, and a pair's first element that is a string, is text: the bias goes to
    each of its tokens. Ids are checked against the vocabulary; banning all of it is refused."""
    v = body.get("logit_bias")
    if v is None or v == {} or v == []:
        return None
    what = "'logit_bias' must be an object {token id: bias} or a list of [token id or text, bias] pairs"
    as_list = isinstance(v, list)   # (there a string is always text, as llama.cpp reads it)
    if isinstance(v, dict):
        items = list(v.items())
    elif as_list and all(isinstance(x, list) and len(x) == 2 for x in v):
        items = [tuple(x) for x in v]
    else:
        raise APIError(400, what, param="logit_bias")
    if len(items) > n_vocab:
        raise APIError(400, f"'logit_bias' has {len(items)} entries, more than the vocabulary's {n_vocab}",
                       param="logit_bias")
    out = {}
    for k, b in items:
        if b is False:
            b = float("-inf")
        elif not (is_number(b) and -100 <= b <= 100):
            raise APIError(400, f"logit_bias[{k!r}] must be a number in [-100, 100] (or false: banned), "
                                f"got {b!r}", param="logit_bias")
        if not as_list and (i := id_text(k)) is not None:
            ids = [i]
        elif is_int(k):
            ids = [k]
        elif isinstance(k, str) and 0 < len(k) <= 1000 and tokenizer is not None:
            ids = tokenizer.encode(k, add_special=False)        # text: each of its tokens
        else:
            raise APIError(400, f"logit_bias: {k!r} is not a token id of this vocabulary of {n_vocab}"
                                + ("" if tokenizer is not None else " (this model has no tokenizer for text)"),
                           param="logit_bias")
        for i in ids:
            if not 0 <= i < n_vocab:
                raise APIError(400, f"logit_bias: {k!r} is not a token id of this vocabulary of {n_vocab}",
                               param="logit_bias")
            out[int(i)] = float(b)
    if sum(1 for b in out.values() if b == float("-inf")) >= n_vocab:
        raise APIError(400, "'logit_bias' bans every token of the vocabulary", param="logit_bias")
    return out


def parse_common(body: dict, n_ctx: int, chat: bool = True) -> dict:
    """The sampling and stopping fields shared by both completion routes -> engine kwargs."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    _opt_type(body, "model", str, "a string")
    _opt_type(body, "stream", bool, "a boolean")
    so = _opt_type(body, "stream_options", dict, "an object")
    if so is not None:
        _opt_type(so, "include_usage", bool, "a boolean")
    n = _num(body, "n", 1, MAX_N, default=1, integer=True)     # choices per prompt
    if n > 1 and body.get("stream"):
        raise APIError(400, "'n' > 1 is not streamed: send it without stream", param="n")
    echo = _opt_type(body, "echo", bool, "a boolean")
    if chat and echo:
        raise APIError(400, "'echo' is a completions field (chat answers never repeat the messages)",
                       param="echo")
    if not chat and body.get("top_logprobs") is not None:
        raise APIError(400, "'top_logprobs' is a chat field: completions take 'logprobs': N",
                       param="top_logprobs")
    for name, off, what in _UNSUPPORTED:   # a request that asks for them expects their effect:
        v = body.get(name)                 # refused, not answered as if they were not there
        if v is not None and not off(v):
            raise APIError(400, f"'{name}' is not supported ({what})", param=name)
    kw: dict[str, Any] = {}
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    mt = body.get(name)                 # (a null max_completion_tokens is absent, not a limit)
    if mt is not None:      # (0: score the prompt only, with echo and logprobs)
        scoring = not chat and echo and body.get("logprobs") not in (None, False)
        kw["max_tokens"] = _num({name: mt}, name, 0 if scoring else 1, 1 << 30, integer=True)
    kw["temperature"] = _num(body, "temperature", 0.0, 2.0, SAMPLING_DEFAULTS["temperature"])
    kw["top_p"] = _num(body, "top_p", 0.0, 1.0, SAMPLING_DEFAULTS["top_p"], lo_open=True)
    kw["top_k"] = _num(body, "top_k", 0, 1 << 30, SAMPLING_DEFAULTS["top_k"], integer=True)
    kw["min_p"] = _num(body, "min_p", 0.0, 1.0, SAMPLING_DEFAULTS["min_p"])
    kw["presence_penalty"] = _num(body, "presence_penalty", -2.0, 2.0, 0.0)
    kw["frequency_penalty"] = _num(body, "frequency_penalty", -2.0, 2.0, 0.0)
    kw["repeat_penalty"] = _num(body, "repeat_penalty", 0.0, 10.0, 1.0, lo_open=True)
    seed = _num(body, "seed", -(1 << 63), (1 << 64) - 1, None, integer=True)
    kw["seed"] = None if seed is None or seed < 0 else seed
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise APIError(400, "'stop' must be a string or a list of strings", param="stop")
        if len(stop) > MAX_STOP:
            raise APIError(400, f"'stop' has {len(stop)} strings, at most {MAX_STOP}", param="stop")
        kw["stop"] = [s for s in stop if s]
    if body.get("ignore_eos") is not None:
        kw["ignore_eos"] = _opt_type(body, "ignore_eos", bool, "a boolean")
    keep = _num(body, "n_keep", 0, n_ctx - 1, None, integer=True)
    if keep is not None:
        kw["n_keep"] = keep
    _opt_type(body, "user", str, "a string")
    param = "response_format"
    try:
        mode, schema = parse_response_format(body.get("response_format"), compile_schema=False)
        if body.get("json_schema") is not None:         # llama-server's field
            param = "json_schema"
            if mode != "text":
                raise ValueError("give either 'response_format' or 'json_schema', not both")
            mode, schema = parse_response_format({"type": "json_schema", "json_schema": {"schema": body["json_schema"]}},
                                                 compile_schema=False)
    except ValueError as e:
        raise APIError(400, str(e), param=param) from None
    if mode == "json_object":
        kw["response_format"] = {"type": "json_object"}
    elif mode == "json_schema":         # (compiled by the route, off the event loop)
        kw["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
    grammar = _opt_type(body, "grammar", str, "a string (GBNF)")
    if grammar:                         # llama-server's field ("" is none)
        if mode != "text":
            raise APIError(400, "give 'grammar' or a JSON response_format / json_schema, not both", param="grammar")
        kw["grammar"] = grammar         # (parsed by the route, off the event loop)
    if n > 1:
        kw["n"] = n
    lp = parse_logprobs(body, chat)
    if lp is not None:
        kw["logprobs"] = lp
        if not chat and echo:           # the prompt's ids scored too (e.g. lm-eval's loglikelihood)
            kw["prompt_logprobs"] = True
    return kw


class LogprobsFormat:
    """Engine TokenLogprobs as OpenAI's `logprobs` objects. Chat: {"content": [{"token", "logprob",
    "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]} (plus llama.cpp's "id");
    completions (legacy): {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
    "text_offset"}. A token's text is its piece as UTF-8, or, for a piece that is part of a
    character, OpenAI's "bytes:\\xe4\\xbd" spelling (`bytes` has it exactly). text_offset: the
    characters of the answer before the token's first byte, counted across stream chunks."""

    def __init__(self, tokenizer, chat: bool):
        self.tok, self.chat = tokenizer, chat
        self.chars = 0                  # whole characters of the answer so far
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _piece(self, i: int) -> bytes:
        return self.tok.token_to_piece(i) if self.tok is not None else b""

    @staticmethod
    def _text(b: bytes) -> str:
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{c:02x}" for c in b)

    def _entry(self, i: int, lp: float) -> dict:
        b = self._piece(i)
        return {"id": i, "token": self._text(b), "logprob": lp, "bytes": list(b)}

    def __call__(self, entries: list) -> dict:
        if self.chat:       # (chat never echoes: every entry has its logprob)
            return {"content": [dict(self._entry(e.id, e.logprob),
                                     top_logprobs=[self._entry(i, lp) for i, lp in e.top])
                                for e in entries]}
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            b = self._piece(e.id)
            out["tokens"].append(self._text(b))
            out["token_logprobs"].append(e.logprob)        # (None: an echoed prompt's first token)
            out["top_logprobs"].append(None if e.logprob is None else
                                       {self._text(self._piece(i)): lp for i, lp in e.top})
            out["text_offset"].append(self.chars)
            self.chars += len(self.dec.decode(b))
        return out


def _content_text(content, i: int) -> str:
    """A message's content: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise APIError(400, f"messages[{i}].content: only text parts are supported, got "
                                    f"{kind!r}", param=f"messages[{i}].content")
            parts.append(p["text"])
        return "".join(parts)
    raise APIError(400, f"messages[{i}].content must be a string or a list of text parts, got "
                        f"{type(content).__name__}", param=f"messages[{i}].content")


def parse_messages(body: dict) -> list:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise APIError(400, f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise APIError(400, f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}, got "
                                f"{role!r}", param=f"messages[{i}].role")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        out.append({"role": ROLES[role], "content": _content_text(content, i)})
    if all(m["role"] == "system" for m in out):
        raise APIError(400, "'messages' needs at least one user or assistant message", param="messages")
    return out


def _finish_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _usage(req) -> dict:
    u = req.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


# ---- the app ------------------------------------------------------------------------------------

def _check_unicode(body: dict):
    """JSON may escape an unpaired UTF-16 surrogate ("\\ud800"), which json.loads keeps in the
    str: not Unicode text, so no tokenizer can take it. A 400 naming the field, as for invalid
    UTF-8 bytes. (Iterative: the nesting depth is json.loads's to bound.)"""
    todo = [("body", body)]
    while todo:
        where, v = todo.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise APIError(400, f"{where} has an unpaired UTF-16 surrogate (\\u{ord(v[e.start]):04x} "
                                    f"at character {e.start}): not valid Unicode") from None
        elif isinstance(v, dict):
            todo.extend((f"{where}.{k}" if where != "body" else str(k), x) for k, x in v.items())
            todo.extend((f"{where}: a key", k) for k in v)
        elif isinstance(v, list):
            todo.extend((f"{where}[{i}]", x) for i, x in enumerate(v))


def create_app(engine, model_name: str, template=None, *, n_keep="auto",
               max_body_bytes: int = MAX_BODY_BYTES, slot_save_path: Optional[str] = None,
               api_keys=None, cors_origins=None, body_timeout: float = BODY_TIMEOUT_S):
    """The FastAPI app over `engine` (llmrt.engine.Engine). template: a llmrt.chat.ChatTemplate
    (default: the model's). n_keep: "auto" pins BOS + the system prompt of each new conversation
    (capped at half the context), an int pins that many, None leaves the engine's.
    slot_save_path: the directory of POST /slots/{id}?action=save|restore (None: off).
    api_keys: if any, every route but PUBLIC_ROUTES needs one of them (`Authorization: Bearer
    KEY`, or llama.cpp's `X-Api-Key: KEY`): else a 401. cors_origins: origins whose pages may
    call the API from a browser ("*": any), none by default. body_timeout: seconds a request
    body may stall between two parts before a 408."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import ClientDisconnect

    from llmrt.chat import ChatTemplate, auto_keep, encode_chat
    from llmrt.engine import QueueFull

    model = engine.model
    tok = engine.tokenizer
    if template is None and tok is not None:
        template = ChatTemplate.for_model(model)
    created = int(time.time())
    app = FastAPI(title="llmrt", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine

    registry = CollectorRegistry()
    http_requests = Counter("llmrt_http_requests", "HTTP requests by route and status",
                            ["route", "status"], registry=registry)

    class EngineCollector:
        def collect(self):
            st = engine.stats()
            c = CounterMetricFamily("llmrt_requests_finished", "Requests finished, by reason",
                                    labels=["reason"])
            for reason, n in sorted(st["requests_finished"].items()):
                c.add_metric([reason], n)
            yield c
            for name, key, doc in (
                    ("llmrt_requests_submitted", "requests_submitted", "Requests accepted into the queue"),
                    ("llmrt_requests_rejected", "requests_rejected", "Requests refused: queue full (503)"),
                    ("llmrt_prompt_tokens", "prompt_tokens", "Prompt tokens received"),
                    ("llmrt_prompt_tokens_cached", "prompt_tokens_cached",
                     "Prompt tokens reused from a slot's cache (prefix cache)"),
                    ("llmrt_prompt_tokens_evaluated", "prompt_tokens_evaluated", "Prompt tokens prefilled"),
                    ("llmrt_generated_tokens", "generated_tokens", "Tokens generated"),
                    ("llmrt_decode_steps", "decode_steps", "Batched decode steps (one graph run each)"),
                    ("llmrt_prefill_chunks", "prefill_chunks",
                     "Prompt chunks prefilled (one graph run each, alone or with a decode step)"),
                    ("llmrt_prefill_chunks_with_decode", "prefill_chunks_with_decode",
                     "Prompt chunks prefilled in the graph run of a decode step"),
                    ("llmrt_cache_shifts", "cache_shifts", "Streaming-cache evictions over all slots")):
                yield CounterMetricFamily(name, doc, value=st[key])
            for name, key, doc in (
                    ("llmrt_tokens_per_second", "tokens_per_second",
                     "Generated tokens per second over the last 10 s"),
                    ("llmrt_slots_busy", "slots_busy", "Slots serving a request"),
                    ("llmrt_slots_total", "slots_total", "Slots (--parallel)"),
                    ("llmrt_queue_length", "queue_length", "Requests waiting for a slot")):
                yield GaugeMetricFamily(name, doc, value=st[key])

    registry.register(EngineCollector())

    def error_response(e: APIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(APIError)
    async def _api_error(request, e: APIError):
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, e):
        return error_response(APIError(e.status_code, str(e.detail),
                                       type_="not_found_error" if e.status_code == 404 else None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, e):
        return error_response(APIError(400, str(e)))

    @app.exception_handler(Exception)
    async def _internal_error(request, e):
        log.exception("llmrt: internal error")
        return error_response(APIError(500, f"internal error: {type(e).__name__}"))

    class CountRequests:
        """Counts HTTP requests by route and status. A plain ASGI middleware (Starlette's
        @app.middleware("http") wraps `receive` in its own, which request.is_disconnected()
        reads through, and it never counted a request that raised). A request that fails
        before its response starts is counted as the 500 it becomes."""

        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            if scope["type"] != "http":
                await self.app(scope, receive, send)
                return
            status = []

            async def send_counted(message):
                if message["type"] == "http.response.start":
                    status.append(message["status"])
                await send(message)
            try:
                await self.app(scope, receive, send_counted)
            finally:
                route = scope.get("route")      # the route's template, not the raw path
                http_requests.labels(getattr(route, "path", "other"),
                                     str(status[0] if status else 500)).inc()

    if any(not isinstance(k, str) or not k.strip() or len(k) > 4096 for k in (api_keys or ())):
        raise ValueError("an API key must be a non-empty string of at most 4096 characters")
    # compared as SHA-256 digests: equal lengths, so the time tells neither which key nearly
    # matched nor how long the keys are
    keys = [hashlib.sha256(k.encode()).digest() for k in (api_keys or ())]

    class RequireKey:
        """Requests to a route not in PUBLIC_ROUTES without one of the keys get a 401 (compared
        in constant time; CORS preflights pass)."""

        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            if scope["type"] == "http" and scope["path"] not in PUBLIC_ROUTES and scope["method"] != "OPTIONS":
                given = []          # every credential sent: one that matches lets it in
                for name, value in scope["headers"]:
                    if name == b"authorization" and value[:7].lower() == b"bearer ":
                        given.append(value[7:].strip())
                    elif name == b"x-api-key":
                        given.append(value.strip())
                digests = [hashlib.sha256(g).digest() for g in given[:4]]
                if not sum(hmac.compare_digest(d, k) for d in digests for k in keys):
                    e = APIError(401, "a valid API key is needed: send 'Authorization: Bearer KEY'",
                                 code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                    await error_response(e)(scope, receive, send)
                    return
            await self.app(scope, receive, send)

    if keys:
        app.add_middleware(RequireKey)
    if cors_origins:        # outside the key check: a preflight (OPTIONS) is answered without one
        from starlette.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST", "HEAD"],
                           allow_headers=["Authorization", "Content-Type", "X-Api-Key", "X-Session-Id"],
                           expose_headers=["Retry-After"])
    app.add_middleware(CountRequests)       # (added last: outermost, it counts the 401s too)

    async def read_json(request: Request) -> dict:
        cl = request.headers.get("content-length")
        if cl is not None:
            try:
                if int(cl) > max_body_bytes:
                    raise APIError(413, f"the request body is {int(cl)} bytes, more than "
                                        f"{max_body_bytes}", type_="invalid_request_error")
            except ValueError:
                raise APIError(400, "invalid Content-Length header") from None
        chunks, size = [], 0
        body = request.stream()
        try:
            while True:     # a client that stops sending mid-body is answered, not waited on forever
                try:
                    chunk = await asyncio.wait_for(body.__anext__(), timeout=body_timeout)
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    raise APIError(408, f"no part of the request body arrived for {body_timeout:g} s",
                                   type_="invalid_request_error", code="timeout") from None
                size += len(chunk)
                if size > max_body_bytes:
                    raise APIError(413, f"the request body is more than {max_body_bytes} bytes")
                chunks.append(chunk)
        except ClientDisconnect:            # gone before its body arrived: nothing to log
            raise APIError(499, "the client disconnected before sending the whole body") from None
        raw = b"".join(chunks)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise APIError(400, f"the request body is not valid UTF-8 (byte {e.start})") from None
        try:
            body = json.loads(text)
        except json.JSONDecodeError as e:
            raise APIError(400, f"the request body is not valid JSON: {e.msg} at line {e.lineno} "
                                f"column {e.colno}") from None
        except RecursionError:          # json.loads recurses per nesting level
            raise APIError(400, "the request body is nested too deeply") from None
        except ValueError as e:         # e.g. an integer of more than 4300 digits
            raise APIError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
        _check_unicode(body)
        return body

    def submit(ids: list, kw: dict, conversation: Optional[str], loop, aq: asyncio.Queue, i: int = 0):
        def on_event(kind, payload):        # (i: the prompt's index in the request)
            loop.call_soon_threadsafe(aq.put_nowait, (i, kind, payload))
        try:
            return engine.submit(ids, conversation=conversation, on_event=on_event, **kw)
        except QueueFull as e:
            raise APIError(503, str(e), type_="server_busy", code="queue_full",
                           headers={"Retry-After": str(e.retry_after)}) from None
        except ValueError as e:
            raise APIError(400, str(e)) from None

    def failed(req) -> APIError:
        if req.error_type == "timeout":
            return APIError(503, req.error, type_="server_busy", code="timeout",
                            headers={"Retry-After": "1"})
        if req.error_type == "invalid":     # (its constraint could not be met)
            return APIError(400, f"generation failed: {req.error}")
        return APIError(500, f"generation failed: {req.error}")

    def echoed(req, lpf) -> tuple:
        """(the prompt's text, its logprobs object or None) for a completion with echo: the
        first id has no log-probability, the others their prompt_logprobs."""
        from llmrt.engine import TokenLogprob
        ids = req.prompt_ids
        text = (tok.detokenize(ids, remove_special=False, unparse_special=True).decode("utf-8", errors="replace")
                if tok is not None else "")
        if lpf is None:
            return text, None
        return text, lpf([TokenLogprob(ids[0], None, ())] + list(req.prompt_logprobs))

    async def run(request: Request, prompts: list, kw: dict, body: dict, chat: bool):
        """Serve one request: prompts, a list of id lists (several only from /v1/completions),
        each answered kw["n"] times (default once): the choices, prompt by prompt, decoded side
        by side in the slots. Choice j of a prompt samples with seed + j when a seed is given."""
        kw = dict(kw)
        n = kw.pop("n", 1)
        if len(prompts) * n > MAX_PROMPTS:
            raise APIError(400, f"{len(prompts)} prompts x n = {n} asks for {len(prompts) * n} choices, "
                                f"at most {MAX_PROMPTS}", param="n")
        runs = [(ids, j) for ids in prompts for j in range(n)]     # (prompt ids, choice j of it)
        seed = kw.get("seed")
        stream = bool(body.get("stream"))
        if stream and len(prompts) > 1:
            raise APIError(400, "a streamed request takes one prompt (send several prompts without "
                                "stream, or one streamed request each)", param="prompt")
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        conversation = (body.get("user") or request.headers.get("x-session-id")
                        or request.headers.get("serve_multiplexed_model_id"))   # (Ray Serve's)
        loop = asyncio.get_running_loop()
        aq: asyncio.Queue = asyncio.Queue()
        reqs = []
        try:
            for i, (ids, j) in enumerate(runs):
                kw_i = dict(kw, seed=seed + j) if seed is not None and j else kw
                reqs.append(submit(ids, kw_i, conversation if len(runs) == 1 else None, loop, aq, i))
        except APIError:                # (e.g. the queue is full: none of them is served)
            for r in reqs:
                r.cancel()
            raise
        req = reqs[0]
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        obj = "chat.completion" if chat else "text_completion"
        name = model_name
        logprobs = kw.get("logprobs") is not None
        echo = not chat and body.get("echo") is True

        if not stream:
            parts = [[] for _ in reqs]
            left = len(reqs)
            checked = loop.time()
            try:
                while left:
                    try:
                        i, kind, payload = await asyncio.wait_for(aq.get(), timeout=DISCONNECT_POLL_S)
                    except asyncio.TimeoutError:
                        kind = None
                    # every DISCONNECT_POLL_S, tokens flowing or not (they arrive faster than
                    # that, and a client that gave up must not keep its slot generating)
                    if loop.time() - checked >= DISCONNECT_POLL_S:
                        checked = loop.time()
                        if await request.is_disconnected():
                            for r in reqs:
                                r.cancel()
                            return Response(status_code=499)
                    if kind == "text":
                        parts[i].append(payload)
                    elif kind == "done":
                        left -= 1               # (logprobs: req.logprobs has them all)
            except asyncio.CancelledError:
                for r in reqs:
                    r.cancel()
                raise
            for r in reqs:
                if r.finish_reason == "error":
                    raise failed(r)
            choices = []
            for i, r in enumerate(reqs):
                f = LogprobsFormat(tok, chat) if logprobs else None     # (offsets per choice)
                head, head_lp = echoed(r, f) if echo else ("", None)
                lp = f(r.logprobs) if f is not None else None
                if head_lp is not None:
                    lp = {k: head_lp[k] + lp[k] for k in lp}
                text = head + "".join(parts[i])
                fr = _finish_reason(r.finish_reason)
                choices.append({"index": i, "message": {"role": "assistant", "content": text},
                                "logprobs": lp, "finish_reason": fr} if chat else
                               {"index": i, "text": text, "logprobs": lp, "finish_reason": fr})
            usage = _usage(reqs[0])
            for r, (_, j) in zip(reqs[1:], runs[1:]):   # (a prompt's tokens count once, as OpenAI's n)
                u = _usage(r)
                usage["completion_tokens"] += u["completion_tokens"]
                if j == 0:
                    usage["prompt_tokens"] += u["prompt_tokens"]
                    usage["prompt_tokens_details"]["cached_tokens"] += u["prompt_tokens_details"]["cached_tokens"]
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            return {"id": rid, "object": obj, "created": int(time.time()), "model": name,
                    "system_fingerprint": "llmrt", "choices": choices, "usage": usage}

        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        created_s = int(time.time())
        lpf = LogprobsFormat(tok, chat) if logprobs else None

        def chunk(delta: Optional[dict], text: Optional[str], fr: Optional[str],
                  logprobs: Optional[dict] = None) -> str:
            c = {"index": 0, "logprobs": logprobs, "finish_reason": fr}
            if chat:
                c["delta"] = delta or {}
            else:
                c["text"] = text or ""
            return json.dumps({"id": rid, "object": chunk_obj, "created": created_s,
                               "model": name, "system_fingerprint": "llmrt", "choices": [c]},
                              ensure_ascii=False)

        # the per-token event, the hot path: chunk({"content": t}, t, None) as one format
        head, tail = chunk({"content": "\0"} if chat else None, "\0", None).split('"\\u0000"')

        def event(data: str) -> str:
            return "data: " + data + "\n\n"

        async def events():
            nonlocal echo
            try:
                if chat:
                    yield event(chunk({"role": "assistant", "content": ""}, None, None))
                done = False
                lps: list = []       # tokens' logprobs not yet sent: they go with the next text
                while not done:
                    items = [await aq.get()]
                    if echo:         # the prompt first, once prefilled (its logprobs are made then)
                        echo_text, echo_lp = echoed(req, lpf)     # (head: the hot path's)
                        yield event(chunk(None, echo_text, None, echo_lp))
                        echo = False
                    while not aq.empty():           # what queued meanwhile goes in one write
                        items.append(aq.get_nowait())
                    out = []
                    for _, kind, payload in items:
                        if kind == "logprobs":
                            lps.append(payload)
                        elif kind == "text" and lps:
                            out.append(event(chunk({"content": payload}, payload, None, lpf(lps))))
                            lps = []
                        elif kind == "text":
                            out.append(event(head + json.dumps(payload, ensure_ascii=False) + tail))
                        else:
                            done = True
                    if done and lps:     # tokens whose text a stop string held back, or cut
                        out.append(event(chunk({}, "", None, lpf(lps))))
                    if out:
                        yield "".join(out)
                if req.finish_reason == "error":     # as OpenAI: an error event; then the end
                    yield event(json.dumps(failed(req).body())) + event("[DONE]")
                else:
                    last = event(chunk({}, "", _finish_reason(req.finish_reason)))
                    if include_usage:
                        last += event(json.dumps({"id": rid, "object": chunk_obj, "created": created_s,
                                                  "model": name, "choices": [], "usage": _usage(req)}))
                    yield last + event("[DONE]")
            finally:
                if not req.done:        # the client went away: free the slot
                    req.cancel()

        # server-sent events as plain bytes (Starlette cancels the generator when the client
        # disconnects); nginx-style proxies are told not to buffer them
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def pick_keep(ids: list, messages: Optional[list]) -> Optional[int]:
        if n_keep != "auto":
            return n_keep
        system = None
        if messages and messages[0]["role"] == "system":
            system = messages[0]["content"]
        n = auto_keep(tok, template, system, ids) if template is not None else 4
        return min(n, engine.n_ctx // 2)

    async def common_kw(body: dict, chat: bool) -> dict:
        """parse_common's engine arguments plus logit_bias (its texts tokenized), the GBNF grammar
        parsed and, for constrained output, the tokenizer's tables made (once): off the event loop."""
        kw = parse_common(body, engine.n_ctx, chat=chat)
        lb = await run_in_threadpool(parse_logit_bias, body, model.n_vocab, tok)
        if lb:
            kw["logit_bias"] = lb
        # a schema or grammar compiled, and its start state made, off the event loop (a large
        # one takes a while; the limits in llmrt.grammar bound it)
        if "grammar" in kw:
            try:
                kw["grammar"] = await run_in_threadpool(lambda: _started(gbnf_grammar(kw["grammar"])))
            except ValueError as e:
                raise APIError(400, str(e), param="grammar") from None
        if kw.get("response_format", {}).get("type") == "json_schema":
            try:
                await run_in_threadpool(lambda: _started(schema_grammar(kw["response_format"]["json_schema"]["schema"])))
            except ValueError as e:
                raise APIError(400, str(e), param="json_schema" if body.get("json_schema") is not None
                               else "response_format") from None
        if "response_format" in kw or "grammar" in kw:
            if tok is None:
                raise APIError(400, "this model has no tokenizer: no constrained output",
                               param="grammar" if "grammar" in kw else "response_format")
            await run_in_threadpool(vocab_tables, tok)
        return kw

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        if tok is None or template is None:
            raise APIError(400, "this model has no tokenizer or chat template: use /v1/completions "
                                "with token ids")
        body = await read_json(request)
        kw = await common_kw(body, chat=True)
        messages = parse_messages(body)

        def prompt_ids():
            try:
                text = template.render(messages, add_generation_prompt=True)
            except ValueError as e:     # e.g. a template that insists on alternating roles
                raise APIError(400, str(e), param="messages") from None
            ids = encode_chat(tok, text)
            return ids, (kw["n_keep"] if "n_keep" in kw else pick_keep(ids, messages))

        # a long conversation takes a while to render and tokenize: off the event loop, which
        # keeps serving every other client meanwhile
        ids, kw["n_keep"] = await run_in_threadpool(prompt_ids)
        return await run(request, [ids], kw, body, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await read_json(request)
        kw = await common_kw(body, chat=False)
        prompt = body.get("prompt")
        # one prompt (a string, or token ids), or several (a list of them: one choice each)
        several = isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt)
        prompts = prompt if several else [prompt]
        if len(prompts) > MAX_PROMPTS:
            raise APIError(400, f"'prompt' holds {len(prompts)} prompts, at most {MAX_PROMPTS}", param="prompt")
        ids = []
        for j, p in enumerate(prompts):
            where = f"prompt[{j}]" if several else "prompt"
            if isinstance(p, str):
                if tok is None:
                    raise APIError(400, "this model has no tokenizer: send token ids", param="prompt")
                if not p:
                    raise APIError(400, f"'{where}' is empty", param="prompt")
                # special-token texts are tokens, as llama-server and vLLM read a prompt (a client
                # that counts "<|im_start|>" as one token must get one)
                ids.append(await run_in_threadpool(tok.encode, p, add_special=True, parse_special=True))
            elif isinstance(p, list) and p and all(is_int(i) for i in p):
                bad = [i for i in p if not 0 <= i < model.n_vocab]
                if bad:
                    raise APIError(400, f"token id {bad[0]} is out of range for a vocabulary of "
                                        f"{model.n_vocab}", param="prompt")
                ids.append(list(p))
            else:
                raise APIError(400, "'prompt' must be a non-empty string, a list of token ids, or a list "
                                    "of such prompts", param="prompt")
        if "n_keep" not in kw and n_keep != "auto" and n_keep is not None:
            kw["n_keep"] = n_keep
        return await run(request, ids, kw, body, chat=False)

    page = None

    @app.get("/")
    async def chat_page():
        """The chat page (llmrt/static/chat.html): one static file, no build step, no CDN."""
        nonlocal page
        if page is None:
            page = (Path(__file__).parent / "static" / "chat.html").read_text(encoding="utf-8")
        return HTMLResponse(page, headers={"Cache-Control": "no-cache"})

    def model_card() -> dict:
        hp = model.hparams
        return {"id": model_name, "object": "model", "created": created, "owned_by": "llmrt",
                "meta": {"arch": model.arch, "n_vocab": model.n_vocab, "n_ctx_train": hp.n_ctx_train,
                         "n_ctx_slot": engine.n_ctx, "n_embd": hp.n_embd, "n_layer": hp.n_layer,
                         "slots": len(engine.slots)}}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model_by_id(model_id: str):
        """OpenAI's retrieve-a-model (client.models.retrieve): the served model by its name."""
        if model_id != model_name:
            raise APIError(404, f"the model {model_id!r} does not exist: this server serves "
                                f"{model_name!r}", param="model", code="model_not_found")
        return model_card()

    def need_tokenizer():
        if tok is None:
            raise APIError(400, "this model has no tokenizer")

    @app.post("/tokenize")
    async def tokenize(request: Request):
        """llama-server's {"content", "add_special" (false), "parse_special" (true), "with_pieces"
        (false)}, or vLLM's {"prompt", "add_special_tokens"} (what lm-evaluation-harness's remote
        tokenizer sends) -> {"tokens": [id, ...], "count", "max_model_len"}; with pieces,
        [{"id", "piece"}, ...] (a piece that is not whole UTF-8 is its list of bytes)."""
        need_tokenizer()
        body = await read_json(request)
        field = "content" if "content" in body or "prompt" not in body else "prompt"
        content = body.get(field)
        if not isinstance(content, str):
            raise APIError(400, f"'{field}' must be a string", param=field)
        add_name = "add_special" if "add_special" in body or "add_special_tokens" not in body else "add_special_tokens"
        add = _opt_type(body, add_name, bool, "a boolean") or False
        parse = _opt_type(body, "parse_special", bool, "a boolean")
        pieces = _opt_type(body, "with_pieces", bool, "a boolean") or False
        ids = await run_in_threadpool(tok.encode, content, add_special=add,
                                      parse_special=True if parse is None else parse)
        out = {"count": len(ids), "max_model_len": engine.n_ctx}
        if not pieces:
            return {"tokens": ids, **out}
        listed = []
        for i in ids:
            b = tok.token_to_piece(i)
            try:
                listed.append({"id": i, "piece": b.decode("utf-8")})
            except UnicodeDecodeError:
                listed.append({"id": i, "piece": list(b)})
        return {"tokens": listed, **out}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        """{"tokens": [id, ...]} -> {"content": text} (llama-server's name) and "prompt" (vLLM's):
        special tokens rendered; bytes that are not whole UTF-8 become U+FFFD."""
        need_tokenizer()
        body = await read_json(request)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(is_int(i) for i in ids):
            raise APIError(400, "'tokens' must be a list of token ids", param="tokens")
        bad = [i for i in ids if not 0 <= i < model.n_vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is out of range for a vocabulary of {model.n_vocab}",
                           param="tokens")
        text = await run_in_threadpool(tok.detokenize, ids, remove_special=False, unparse_special=True)
        text = text.decode("utf-8", errors="replace")
        return {"content": text, "prompt": text}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        """vLLM's (lm-evaluation-harness's remote tokenizer reads it): the special tokens' texts
        and the chat template."""
        need_tokenizer()

        def text(i):
            return None if i is None or i < 0 else tok.id_to_token(i)
        return {"tokenizer_class": "llmrt", "bos_token": text(getattr(tok, "bos_id", None)),
                "eos_token": text(getattr(tok, "eos_id", None)), "pad_token": text(getattr(tok, "pad_id", None)),
                "add_bos_token": bool(getattr(tok, "add_bos", False)), "model_max_length": engine.n_ctx,
                "chat_template": template.source if template is not None else None}

    @app.get("/props")
    async def props():
        """llama-server's properties, for clients and UIs that read them: the slots, the context
        per slot, the chat template's source, the defaults a request gets."""
        return {"total_slots": len(engine.slots), "n_ctx": engine.n_ctx, "model_alias": model_name,
                "model_path": str(model.path), "chat_template": template.source if template is not None else None,
                "chat_template_name": template.name if template is not None else None,
                "default_generation_settings": {"n_ctx": engine.n_ctx, "n_predict": engine.n_predict,
                                                "n_keep": n_keep, **SAMPLING_DEFAULTS},
                "build_info": f"llmrt {__version__}"}

    @app.api_route("/health", methods=["GET", "HEAD"])     # (HEAD: load balancers' probes)
    async def health():
        st = engine.stats()
        return {"status": "ok", "slots_idle": st["slots_total"] - st["slots_busy"],
                "slots_processing": st["slots_busy"], "queue_length": st["queue_length"]}

    @app.get("/slots")
    async def slots():
        return engine.slot_info()

    @app.post("/slots/{id_slot}")
    async def slot_action(request: Request, id_slot: str, action: str = ""):
        """llama.cpp's slot API: ?action=save|restore with {"filename": NAME} (a plain file name
        inside --slot-save-path), ?action=erase."""
        from llmrt.engine import SlotBusy
        try:
            i = int(id_slot)
        except ValueError:
            raise APIError(400, f"slot id must be an integer, got {id_slot!r}", param="id_slot") from None
        if action not in ("save", "restore", "erase"):
            raise APIError(400, f"action must be save, restore or erase, got {action!r}", param="action")
        path = filename = None
        if action != "erase":
            if slot_save_path is None:
                raise APIError(400, "slot save and restore are off: start the server with --slot-save-path DIR",
                               code="not_enabled")
            body = await read_json(request)
            filename = body.get("filename")
            if (not isinstance(filename, str) or not filename or "/" in filename or "\\" in filename
                    or ".." in filename or filename.startswith(".") or "\0" in filename):
                raise APIError(400, "'filename' must be a plain file name (no '/', no '..')",
                               param="filename")
            path = os.path.join(slot_save_path, filename)
        loop = asyncio.get_running_loop()
        try:
            if action == "save":
                r = await loop.run_in_executor(None, engine.save_slot, i, path)
                return {"id_slot": i, "filename": filename, "n_saved": r["n_saved"],
                        "n_written": r["n_written"], "timings": {"save_ms": r["save_ms"]}}
            if action == "restore":
                if not os.path.isfile(path):
                    raise APIError(404, f"no saved slot named {filename!r}", param="filename",
                                   type_="not_found_error")
                r = await loop.run_in_executor(None, engine.restore_slot, i, path)
                return {"id_slot": i, "filename": filename, "n_restored": r["n_restored"],
                        "n_read": r["n_read"], "timings": {"restore_ms": r["restore_ms"]}}
            return await loop.run_in_executor(None, engine.erase_slot, i)
        except SlotBusy as e:
            raise APIError(409, str(e), code="slot_busy") from None
        except ValueError as e:          # no such slot, or a file that does not fit (SessionFileError)
            raise APIError(400, str(e)) from None

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def listen_sockets(host: str, port: int) -> list:
    """Sockets bound to host:port (every address the host resolves to, as uvicorn would bind
    them), taken before the model loads: a port in use or a host that does not resolve is a
    clear ValueError at once, not after the load."""
    import socket

    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    socks, seen = [], set()
    try:
        for family, kind, proto, _, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
    except OSError as e:
        for sock in socks:
            sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return socks


def serve(model_path, *, host: str = "127.0.0.1", port: int = 8080, parallel: int = 4,
          ctx_size: Optional[int] = None, n_keep="auto", n_discard: int = -1, threads=None,
          n_batch: int = 256, max_queue: int = 64, timeout: float = 600.0, n_predict: int = -1,
          chat_template: Optional[str] = None, alias: Optional[str] = None,
          max_body_bytes: int = MAX_BODY_BYTES, slot_save_path: Optional[str] = None, model=None,
          log_level: str = "info", prefill_chunk: Optional[int] = None, sockets=None, api_keys=None,
          cors_origins=None, body_timeout: float = BODY_TIMEOUT_S):
    """Load the model, start the engine and run uvicorn until interrupted. `sockets`: ones
    listen_sockets() bound already (they are closed on return), else host:port is bound first."""
    import os

    import uvicorn

    from llmrt.chat import ChatTemplate
    from llmrt.engine import Engine

    socks = listen_sockets(host, port) if sockets is None else sockets
    try:
        if model is None:
            from llmrt.model import Model
            model = Model(model_path, **({"n_threads": threads} if threads else {}))
        ctx = int(ctx_size or model.n_ctx)
        keep_engine = 4 if n_keep == "auto" else int(n_keep)
        engine = Engine(model, n_parallel=parallel, ctx_size=ctx, n_keep=keep_engine,
                        n_discard=n_discard, n_batch=n_batch, max_queue=max_queue,
                        queue_timeout=timeout, n_predict=n_predict, prefill_chunk=prefill_chunk)
        try:
            template = (ChatTemplate.for_model(model, chat_template)
                        if model.tokenizer is not None else None)
            name = alias or os.path.basename(str(model.path))
            if slot_save_path is not None:
                os.makedirs(slot_save_path, exist_ok=True)
            app = create_app(engine, name, template, n_keep=n_keep, max_body_bytes=max_body_bytes,
                             slot_save_path=slot_save_path, api_keys=api_keys, cors_origins=cors_origins,
                             body_timeout=body_timeout)
            log.info("llmrt: serving %s on http://%s:%d (%d slots of %d cells, n_keep %s%s)", name,
                     host, socks[0].getsockname()[1], parallel, ctx, n_keep,
                     f", {len(api_keys)} API key{'s' if len(api_keys) > 1 else ''}" if api_keys else
                     ", no API key")
            config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5)
            uvicorn.Server(config).run(sockets=socks)
        finally:
            engine.close()
    finally:
        for sock in socks:
            sock.close()
