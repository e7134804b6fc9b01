"""Chat: templates (the GGUF's Jinja `tokenizer.chat_template` or a built-in one), prompt
encoding with exactly one BOS, and a conversation that keeps its KV cache between turns.

    chat = ChatSession(model, system="You are terse.", temperature=0.7, seed=1)
    chat.send("Hi!", streamer=TextStreamer(model.tokenizer, skip_prompt=True))
    chat.send("And then?")           # only the new part of the conversation is evaluated
    chat.reset()

Templates are rendered as Hugging Face does (transformers' chat_template_utils): a sandboxed
Jinja environment with trim_blocks and lstrip_blocks, the variables `messages`,
`add_generation_prompt`, `bos_token`, `eos_token` (and any extra keyword), the functions
`raise_exception(msg)` and `strftime_now(fmt)`, a `tojson` filter that keeps non-ASCII text,
and the `{% generation %}` block tag. Built-in templates (llmrt/templates/*.jinja) are used for
files without one: chatml, gemma, llama2, llama3, picked from the vocabulary's special tokens
and the architecture (`pick_template`).

BOS has one owner, `encode_chat`: when the rendered text already starts with the BOS token's
text (templates that write `{{ bos_token }}`), the text is tokenized with special tokens parsed
and nothing added; otherwise BOS is prepended iff the tokenizer's add_bos is set. Never two,
never none.

ChatSession renders the whole conversation each turn and evaluates only the ids after what the
KV cache already holds. If they diverge (a template that rewrites history, or an answer whose
re-tokenization differs from the sampled ids), the cache is cut back to the first difference
(`session.truncate` when the session has it, else reset) and re-evaluated from there.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import json
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from llmrt.checks import read_utf8
from llmrt.generation import (GenerationResult, _common_prefix, _prefill_from, decode, output_constraint,
                              make_sampler, stop_strings)

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
BUILTIN_TEMPLATES = ("chatml", "gemma", "llama2", "llama3")


# ---- Jinja environment (HF conventions) --------------------------------------------------------

def _raise_exception(message):
    from jinja2.exceptions import TemplateError
    raise TemplateError(message)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # HF's override: the builtin tojson escapes HTML characters and sorts keys.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


MAX_RENDER_CHARS = 1 << 26   # what one '*' in a template may build (64 M characters or items)
RENDER_SECONDS = 10.0        # a template that renders longer is stopped (they take milliseconds)


class RenderTimeout(Exception):
    pass


def _render_budget(render, seconds: float = None):
    """render() with a time limit: a line-level trace hook of this thread checks the clock, so a
    template's loop of 10^10 steps (range() is capped, nested loops are not) ends in an error
    instead of a hang (of `llmrt chat`, or of a server's worker)."""
    limit = RENDER_SECONDS if seconds is None else seconds
    deadline = time.monotonic() + limit
    n = [0]

    def tracer(frame, event, arg):
        n[0] += 1
        if n[0] & 255 == 0 and time.monotonic() > deadline:
            raise RenderTimeout
        return tracer

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        return render()
    finally:
        sys.settrace(before)


@functools.lru_cache(maxsize=1)
def _environment():
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """`{% generation %}...{% endgeneration %}` (HF marks assistant text with it): the body
        is rendered as is."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_render_body"), [], [], body) \
                .set_lineno(lineno)

        def _render_body(self, caller):
            return caller()

    from jinja2.exceptions import SecurityError

    class Environment(ImmutableSandboxedEnvironment):
        """The sandbox (no attribute access outside the safe ones, range() <= 100000 items) plus
        limits on what one operation may build: `"x" * 10**10` or `7 ** 1000000000` would run for
        minutes inside a single C call, where the time budget (_render_budget) cannot stop it."""
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) \
                            and len(seq) * n > MAX_RENDER_CHARS:
                        raise SecurityError(f"'*' would build {len(seq) * n} items (more than "
                                            f"{MAX_RENDER_CHARS})")
            elif isinstance(left, int) and isinstance(right, int) and abs(left) > 1 \
                    and right * max(abs(left).bit_length(), 1) > 1 << 16:
                raise SecurityError("'**' would build a number of more than 65536 bits")
            return super().call_binop(context, operator, left, right)

    env = Environment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def builtin_template(name: str) -> str:
    """The source of a built-in template (one of BUILTIN_TEMPLATES)."""
    if name not in BUILTIN_TEMPLATES:
        raise ValueError(f"[chat template] unknown built-in template {name!r}; "
                         f"known: {', '.join(BUILTIN_TEMPLATES)}")
    return (TEMPLATE_DIR / f"{name}.jinja").read_text(encoding="utf-8")


def _token_text(tokenizer, id) -> str:
    if id is None or id < 0:
        return ""
    try:
        return tokenizer.id_to_token(int(id))
    except (IndexError, KeyError, ValueError):
        return ""


class ChatTemplate:
    """A compiled chat template. `render(messages, add_generation_prompt=True) -> str`."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 name: str = "custom"):
        from jinja2.exceptions import TemplateSyntaxError
        self.source = source
        self.name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._tmpl = _environment().from_string(source)
        except TemplateSyntaxError as e:
            raise ValueError(f"[chat template] {name}: syntax error line {e.lineno}: "
                             f"{e.message}") from None

    def __repr__(self):
        return f"ChatTemplate(name={self.name!r})"

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True,
               **extra) -> str:
        from jinja2.exceptions import TemplateError
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"[chat template] a message must be a dict with 'role' and "
                                 f"'content', got {m!r}")
        kw = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        kw.update(extra)
        try:
            return _render_budget(lambda: self._tmpl.render(
                messages=list(messages), add_generation_prompt=add_generation_prompt, **kw))
        except RenderTimeout:
            raise ValueError(f"[chat template] {self.name}: rendering took more than "
                             f"{RENDER_SECONDS:g} s (a loop that does not end?)") from None
        except TemplateError as e:
            raise ValueError(f"[chat template] {self.name}: {e}") from None
        except (ArithmeticError, LookupError, TypeError, AttributeError, ValueError, RecursionError) as e:
            # an error of the template's own code (a division by zero, a missing key, ...)
            raise ValueError(f"[chat template] {self.name} failed: {type(e).__name__}: {e}") from None

    @classmethod
    def for_model(cls, model, override: str | None = None) -> "ChatTemplate":
        """The model's template: `override` (a built-in name, a file path or Jinja source), else
        the GGUF's tokenizer.chat_template, else a built-in one picked by pick_template."""
        return cls.for_tokenizer(model.tokenizer, getattr(model, "metadata", None) or {},
                                 override)

    @classmethod
    def for_tokenizer(cls, tokenizer, metadata: dict, override: str | None = None):
        tok = {"bos_token": _token_text(tokenizer, getattr(tokenizer, "bos_id", None)),
               "eos_token": _token_text(tokenizer, getattr(tokenizer, "eos_id", None))}
        if override is not None:
            if override in BUILTIN_TEMPLATES:
                return cls(builtin_template(override), name=override, **tok)
            if "{{" in override or "{%" in override:
                return cls(override, name="custom", **tok)
            p = Path(override).expanduser()
            if not p.is_file():
                raise FileNotFoundError(f"[chat template] no such file: {override} (or use a "
                                        f"built-in name: {', '.join(BUILTIN_TEMPLATES)})")
            return cls(read_utf8(p), name=str(p), **tok)
        src = metadata.get("tokenizer.chat_template")
        if isinstance(src, str) and src.strip():
            return cls(src, name="gguf", **tok)
        name = pick_template(metadata, tokenizer)
        return cls(builtin_template(name), name=name, **tok)


def _has_token(tokenizer, metadata: dict, text: str) -> bool:
    """Is `text` one token of the vocabulary (a special token such as <start_of_turn>)?"""
    vocab = metadata.get("tokenizer.ggml.tokens")
    if vocab is not None and len(vocab) > 0:
        return text in vocab
    try:
        return len(tokenizer.encode(text, add_special=False, parse_special=True)) == 1
    except Exception:   # a tokenizer that cannot encode it does not have it as one token
        return False


def pick_template(metadata: dict, tokenizer) -> str:
    """A built-in template name for a file without tokenizer.chat_template: by the turn tokens
    in the vocabulary, then the architecture and tokenizer type; ChatML otherwise (llama.cpp's
    default too)."""
    arch = str(metadata.get("general.architecture", ""))
    pre = str(metadata.get("tokenizer.ggml.pre", ""))
    tok_model = str(metadata.get("tokenizer.ggml.model", ""))
    if arch.startswith("gemma") or _has_token(tokenizer, metadata, "<start_of_turn>"):
        return "gemma"
    if pre in ("llama3", "llama-bpe") or (_has_token(tokenizer, metadata, "<|start_header_id|>")
                                           and _has_token(tokenizer, metadata, "<|eot_id|>")):
        return "llama3"
    if _has_token(tokenizer, metadata, "<|im_start|>"):
        return "chatml"
    if _has_token(tokenizer, metadata, "[INST]") or (arch == "llama" and tok_model == "llama"):
        return "llama2"
    return "chatml"


def encode_chat(tokenizer, text: str) -> list[int]:
    """Token ids of a rendered chat prompt with exactly one BOS (see the module doc)."""
    ids = list(tokenizer.encode(text, add_special=False, parse_special=True))
    bos = getattr(tokenizer, "bos_id", None)
    if bos is None or bos < 0:
        return ids
    bos_text = _token_text(tokenizer, bos)
    if bos_text and text.startswith(bos_text):
        return ids                      # the template wrote BOS
    if tokenizer.add_bos and not (ids and ids[0] == bos):
        ids.insert(0, bos)
    return ids


def auto_keep(tokenizer, template: ChatTemplate, system: str | None, ids: Sequence[int]) -> int:
    """n_keep "auto" for a conversation whose prompt ids are `ids`: BOS plus the system prompt
    (the ids `ids` shares with the rendering of the system message alone); 4 (StreamingLLM's
    sinks) when there is neither."""
    bos = getattr(tokenizer, "bos_id", None)
    has_bos = bos is not None and bos >= 0 and bool(ids) and ids[0] == bos
    n = 1 if has_bos else 0
    if system is not None:
        try:
            sys_ids = encode_chat(tokenizer, template.render(
                [{"role": "system", "content": system}], add_generation_prompt=False))
            n = max(n, _common_prefix(sys_ids, list(ids)))
        except ValueError:              # a template that wants a user turn after the system one
            pass
    return n if n > 0 else 4


# ---- conversation ------------------------------------------------------------------------------

def _chat_state_ok(c: dict, n_vocab: int) -> bool:
    """The chat fields of a session file (ChatSession.save's) of their types."""
    from llmrt.checks import is_int
    from llmrt.sessionfile import is_ids
    need = ("template", "system", "messages", "max_new_tokens", "stop", "n_keep", "ignore_eos", "hist",
            "n_past_after")
    return (all(k in c for k in need) and isinstance(c["template"], str)
            and isinstance(c.get("template_name", ""), str)
            and (c.get("system") is None or isinstance(c["system"], str))
            and isinstance(c.get("messages"), list)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in c["messages"])
            and (c.get("max_new_tokens") is None or is_int(c["max_new_tokens"]))
            and isinstance(c.get("stop"), list) and all(isinstance(x, str) for x in c["stop"])
            and (c.get("n_keep") == "auto" or is_int(c.get("n_keep")))
            and isinstance(c.get("ignore_eos"), bool) and (c["hist"] is None or is_ids(c["hist"], n_vocab))
            and (c.get("n_past_after") is None or is_int(c["n_past_after"])))


class ChatSession:
    """A conversation with a model: messages plus the KV cache that holds them.

    model: has `tokenizer`, `metadata` and `new_session(ctx_size=None)`. system: an optional
    system prompt. template: None (the model's), a built-in name, a file path or Jinja source.
    max_new_tokens: per answer (-1: until an end-of-generation token). sampling: Sampler
    parameters (temperature, top_k, ..., seed) or `sampler=`.

    The conversation lives in a streaming KV cache (llmrt.model.Session): it runs for as many
    turns as you like; when the cache is full the oldest unpinned tokens are evicted. n_keep:
    pinned tokens, an int or "auto" (BOS plus the system prompt, the default); n_discard and
    kv_mode as Session's (None: the session's default)."""

    def __init__(self, model, system: str | None = None, template=None, *, session=None,
                 ctx_size: int | None = None, max_new_tokens: int = -1,
                 stop: Sequence[str] = (), n_keep="auto", n_discard: int = -1,
                 kv_mode: str | None = None, ignore_eos: bool = False, **sampling):
        if getattr(model, "tokenizer", None) is None:
            raise ValueError("[chat] this model has no tokenizer (GGUF without a vocabulary)")
        if system is not None and not isinstance(system, str):
            raise TypeError(f"[chat] system must be a str (or None), got {type(system).__name__}")
        if template is not None and not isinstance(template, (str, ChatTemplate)):
            raise TypeError(f"[chat] template must be a str, a ChatTemplate or None, got {type(template).__name__}")
        stop = stop_strings(stop)
        self.model = model
        self.tokenizer = model.tokenizer
        self.template = (template if isinstance(template, ChatTemplate)
                         else ChatTemplate.for_model(model, template))
        self.system = system
        self.sampler = make_sampler(n_vocab=getattr(model, "n_vocab", None), **sampling)
        if n_keep != "auto" and (isinstance(n_keep, bool) or not isinstance(n_keep, int)):
            raise ValueError(f"[chat] n_keep must be an integer or 'auto', got {n_keep!r}")
        if session is None:
            kw = {"ctx_size": ctx_size} if ctx_size else {}
            if n_discard != -1:
                kw["n_discard"] = n_discard
            if kv_mode is not None:
                kw["kv_mode"] = kv_mode
            session = model.new_session(**kw)
        self.session = session
        # Pinned tokens of the streaming cache: an int, or "auto" = BOS plus the system prompt
        # (set on the session at the first turn, see _pin). Sessions without n_keep ignore it.
        self.n_keep = n_keep
        if n_keep != "auto" and hasattr(session, "n_keep"):
            session.n_keep = n_keep
        self.max_new_tokens = max_new_tokens
        self.ignore_eos = ignore_eos
        self.stop = list(stop)
        self.messages: list[dict] = []
        self.last_result: GenerationResult | None = None
        self._hist: list[int] | None = None   # ids fed to the session, in order (see _feed)
        self._n_past_after: int | None = None
        self.reset(clear_cache=False)

    def reset(self, clear_cache: bool = True):
        """Forget the conversation (the system prompt stays) and clear the KV cache."""
        self.messages = [] if self.system is None else [{"role": "system",
                                                          "content": self.system}]
        if clear_cache:
            self.session.reset()
        self._hist = None
        self._n_past_after = None

    def render(self, messages=None, add_generation_prompt: bool = True) -> str:
        return self.template.render(self.messages if messages is None else messages,
                                    add_generation_prompt=add_generation_prompt)

    def _pin(self, ids: list[int]):
        """n_keep "auto": pin BOS plus the system prompt (the ids the conversation shares with
        the rendering of the system message alone), so evictions never cut them."""
        sess = self.session
        if self.n_keep != "auto" or not hasattr(sess, "n_keep") or \
                getattr(sess, "kv_mode", None) == "window":
            return
        n = auto_keep(self.tokenizer, self.template, self.system, ids)
        room = sess.n_ctx - n
        if room < 1:
            raise ValueError(f"[chat] the system prompt takes {n} tokens (pinned with --n-keep auto) "
                             f"and leaves no room in a context of {sess.n_ctx}: raise --ctx-size")
        n = min(n, sess.n_ctx - 1)
        if sess.n_keep != n:
            if getattr(sess, "n_discard", -1) > sess.n_ctx - n:
                sess.n_discard = -1
            sess.n_keep = n

    def _check_fits(self, n_new: int):
        """A turn whose new tokens cannot fit beside the pinned ones: a clear error."""
        sess = self.session
        n_ctx, n_keep = getattr(sess, "n_ctx", None), getattr(sess, "n_keep", None)
        if n_ctx is None or n_keep is None or getattr(sess, "kv_mode", "none") == "none":
            return
        if n_new > n_ctx - n_keep:
            raise ValueError(f"[chat] this turn adds {n_new} tokens, more than the context of "
                             f"{n_ctx} holds beside the {n_keep} pinned tokens: shorten the message "
                             f"or raise --ctx-size")

    def _feed(self, ids: list[int]):
        """Evaluate what the cache lacks of `ids` -> (logits of the last id, the ids fed)."""
        sess = self.session
        self._pin(ids)
        cache = list(sess.tokens)
        n = _common_prefix(cache, ids)
        if n == len(cache) and n < len(ids):
            self._check_fits(len(ids) - max(n, getattr(sess, "n_keep", 0)))
            return sess.eval(ids[n:]), ids[n:]
        # The cache is not a prefix of the conversation. If the session evicted tokens (context
        # shift) but holds exactly what we fed it last time, the conversation we fed is still
        # the prefix that counts.
        hist = self._hist
        if (hist is not None and len(hist) < len(ids)
                and getattr(sess, "n_past", None) == self._n_past_after
                and _common_prefix(hist, ids) == len(hist)):
            self._check_fits(len(ids) - len(hist))
            return sess.eval(ids[len(hist):]), ids[len(hist):]
        return _prefill_from(sess, ids, n)

    # ---- saving ------------------------------------------------------------------------------

    def save(self, path) -> int:
        """Save the conversation (messages, template, settings, the sampler's state and the KV
        cache's cells) to `path`, atomically; returns the bytes written. ChatSession.load(path,
        model) continues it: the next answer is the one this session would give."""
        from llmrt.sessionfile import save_session
        extra = {"chat": {
            "messages": self.messages, "system": self.system, "template": self.template.source,
            "template_name": self.template.name, "n_keep": self.n_keep,
            "max_new_tokens": self.max_new_tokens, "stop": self.stop, "ignore_eos": self.ignore_eos,
            "hist": self._hist, "n_past_after": self._n_past_after}}
        return save_session(path, self.session, sampler=self.sampler, extra=extra, kind="chat")

    @classmethod
    def load(cls, path, model) -> "ChatSession":
        """A ChatSession of `model` restored from a file ChatSession.save wrote. A file of another
        model, or a truncated, damaged or foreign file is a llmrt.sessionfile.SessionFileError
        (a ValueError); nothing else changes."""
        from llmrt.sessionfile import SessionFileError, load_session
        saved = load_session(path, model)
        c = saved.extra.get("chat")
        if saved.header.get("kind") != "chat" or not isinstance(c, dict):
            raise SessionFileError(f"{path}: a {saved.header.get('kind')} state, not a chat")
        if not _chat_state_ok(c, model.n_vocab):
            raise SessionFileError(f"{path}: damaged session file header (the chat's state)")
        try:
            template = ChatTemplate(c["template"], bos_token=_token_text(model.tokenizer, model.tokenizer.bos_id),
                                    eos_token=_token_text(model.tokenizer, model.tokenizer.eos_id),
                                    name=c.get("template_name", "saved"))
            cs = cls(model, system=c["system"], template=template, session=saved.session,
                     max_new_tokens=c["max_new_tokens"], stop=c["stop"], n_keep=c["n_keep"],
                     ignore_eos=c["ignore_eos"], sampler=saved.sampler)
        except ValueError as e:         # a template that does not compile, a bad setting
            raise SessionFileError(f"{path}: {e}") from None
        cs.messages = [dict(m) for m in c["messages"]]
        cs._hist = c["hist"]
        cs._n_past_after = c["n_past_after"]
        return cs

    def send(self, user_text: str, streamer=None, max_new_tokens: int | None = None,
             response_format=None, grammar=None) -> str:
        """Add a user turn, generate the answer (until an end-of-generation token), return its
        text. The streamer gets the newly evaluated prompt ids first, then the answer.
        response_format ({"type": "json_object"} or {"type": "json_schema", ...}) or grammar
        (GBNF): this answer is constrained (llmrt.jsonmode), as in Model.generate.
        KeyboardInterrupt stops the answer: what was generated is kept in the conversation and
        the interrupt is re-raised."""
        with contextlib.ExitStack() as held:
            try:            # the streamer is ended on every failure (decode ends it after this)
                constraint = output_constraint(self.tokenizer, response_format, grammar)
                hold = getattr(self.session, "hold", None)
                if hold is not None:        # the session is this turn's (Session.hold)
                    held.enter_context(hold())
                msgs = self.messages + [{"role": "user", "content": user_text}]
                if hasattr(self.session, "n_keep"):
                    self._check_fits(len(self.tokenizer.encode(user_text, add_special=False)))
                ids = encode_chat(self.tokenizer, self.template.render(msgs, add_generation_prompt=True))
                try:
                    logits, fed = self._feed(ids)
                finally:
                    self._hist = None             # unknown until this turn completes
            except BaseException:
                if streamer is not None:
                    streamer.end()
                raise
            if streamer is not None:
                streamer.put(np.asarray(fed, dtype=np.int64))
            res = self.last_result = GenerationResult()
            limit = self.max_new_tokens if max_new_tokens is None else max_new_tokens
            try:
                decode(self.session, logits, self.tokenizer, self.sampler, list(ids),
                       streamer=streamer, max_new_tokens=limit, stop=self.stop, result=res,
                       ignore_eos=self.ignore_eos, constraint=constraint)
                self._hist = ids + res.ids[:res.n_eval]
                self._n_past_after = getattr(self.session, "n_past", None)
            finally:
                self.messages = msgs + [{"role": "assistant", "content": res.text}]
            return res.text

