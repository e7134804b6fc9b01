"""The generation loop: prompt -> sampled tokens, with end-of-generation ids, stop strings and a
streamer.

    ids = generate(session, prompt_ids, tokenizer, streamer=TextStreamer(tokenizer),
                   max_new_tokens=128, temperature=0.7, stop=["\\nUser:"])
    # ids == prompt_ids + new ids (Hugging Face convention)

`session` is an evaluation session of a model (model.new_session()): `eval(ids) -> logits` of
the last id ([n_vocab] float32) after appending `ids` to its KV cache, `tokens` (ids in the
cache), `reset()`, and optionally `truncate(n)` (keep the first n cached tokens).

Per token: sample, check eog, detokenize the one new id, check stop strings against the few
characters held back, evaluate the id. All O(1) in the length of the output.

Stop strings and the streamer. Streamers receive ids (HF contract), so holding back text means
holding back ids. `_Release` keeps the ids whose text might still turn into a stop string:

    released text | pending text (ids not yet put) = a suffix that is a prefix of a stop string
    "Hello wor"   | "ld\\nUs"      with stop "\\nUser:"

Each new id's text is appended to the pending text. If a stop string now occurs in it, the text
before the earliest match is released and generation ends; the ids that make up the match are
never put. Otherwise everything except the longest suffix that is a proper prefix of some stop
string is released. Ids are put whole, in order, so the streamer decodes exactly the released
text; an id that ends inside a UTF-8 character (a byte token, say) goes out together with the
id that completes the character, so the streamer never holds half a character when we stop.
A stop string that starts inside a token leaves the text before it without whole ids: it goes
to `streamer.put_text` (llmrt streamers; see streamers.py).

End-of-generation ids (tokenizer.eog_ids) stop generation unless `ignore_eos`; they are returned
(HF keeps the eos in the output ids) but never streamed or counted as text.
"""
from __future__ import annotations

import codecs
import logging
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from llmrt.checks import id_list, is_int
from llmrt.sampling import Sampler
from llmrt.streamers import make_detokenizer

_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                  "seed", "frequency_penalty", "presence_penalty", "logit_bias")

log = logging.getLogger("llmrt")


@dataclass
class GenerationResult:
    """What one generation produced. ids: new ids (with the eog id, if one ended it); text: the
    released text (cut before a matched stop string); finish_reason: "eog" | "stop" | "length"
    | "interrupted"; n_eval: how many of `ids` went into the KV cache (the last sampled id is
    not evaluated)."""
    ids: list = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""
    stop: str | None = None
    n_eval: int = 0


def stop_strings(stop) -> list:
    """`stop` as a list of strings: None or () -> [], one str -> [it] (never its characters), an
    iterable of str -> its list. TypeError naming the bad element otherwise."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, (bytes, bytearray)) or not hasattr(stop, "__iter__"):
        raise TypeError(f"stop must be a str or a list of str, got {type(stop).__name__}")
    out = list(stop)
    for i, s in enumerate(out):
        if not isinstance(s, str):
            raise TypeError(f"stop must be a str or a list of str: element {i} is {type(s).__name__}")
    return out


def make_sampler(sampler: Sampler | None = None, do_sample: bool | None = None,
                 n_vocab: int | None = None, **params) -> Sampler:
    """A Sampler from keyword parameters (llama.cpp names; HF's do_sample=False is greedy).
    n_vocab: the model's vocabulary, checked now (Sampler.check_vocab: a logit_bias id past it,
    or a ban of all of it, is a ValueError before any prompt runs)."""
    unknown = set(params) - set(_SAMPLING_KEYS)
    if unknown:
        raise TypeError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
    if sampler is not None:
        if params or do_sample is not None:
            raise TypeError("pass either `sampler` or sampling parameters, not both")
    else:
        params = {k: v for k, v in params.items() if v is not None or k == "seed"}
        if do_sample is not None and not do_sample:     # False, 0: greedy
            params["temperature"] = 0.0
        sampler = Sampler(**params)
    if n_vocab is not None and hasattr(sampler, "check_vocab"):     # (a caller's own may not)
        sampler.check_vocab(n_vocab)
    return sampler


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two id lists (vectorized)."""
    m = min(len(a), len(b))
    if m == 0:
        return 0
    x = np.asarray(a[:m], dtype=np.int64)
    y = np.asarray(b[:m], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else m


def prefill(session, ids: Sequence[int], progress=None) -> np.ndarray:
    """Bring the session's cache to exactly `ids` and return the logits of the last id.

    Reuses the cached prefix: only the ids after it are evaluated. When the cache diverges from
    `ids` (or holds all of them: the last id's logits are needed), it is cut back with
    `session.truncate(n)` if the session has it, else reset and re-evaluated. `progress`:
    made by progress(n_ids) for the n_ids to evaluate and passed to `session.eval` (which calls
    its update(n) per graph run); it is used as a context manager (a llmrt.progress.Progress)."""
    return _prefill(session, id_list(ids), progress)


def _prefill(session, ids: list[int], progress=None) -> np.ndarray:
    """prefill() of ids already checked (generate() checks them once for all its uses)."""
    if not ids:
        raise ValueError("[generate] the prompt is empty: at least one token is needed")
    return _prefill_from(session, ids, _common_prefix(list(session.tokens), ids), progress)[0]


def _prefill_from(session, ids: list[int], n: int, progress=None):
    """prefill() given n, the common prefix of the cache and `ids` -> (logits, ids evaluated)."""
    if not (n == len(session.tokens) and n < len(ids)):
        n = min(n, len(ids) - 1)
        truncate = getattr(session, "truncate", None)
        if n > 0 and truncate is not None:
            truncate(n)
        else:
            session.reset()
            n = 0
    if progress is None:
        return session.eval(ids[n:]), ids[n:]
    with progress(len(ids) - n) as bar:
        return session.eval(ids[n:], progress=bar), ids[n:]


class _Release:
    """Holds back ids whose text could begin a stop string; puts the rest to the streamer."""

    def __init__(self, tokenizer, stop: Sequence[str], streamer):
        self.tokenizer = tokenizer
        self.detok = make_detokenizer(tokenizer)
        # tracks whether the bytes so far end inside a UTF-8 character (see _release)
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop = [s for s in stop if s]
        self.streamer = streamer
        self.ids: list[int] = []    # pending ids, not yet put
        self.lens: list[int] = []   # [len(ids)]: characters of text each pending id produced
        self.whole: list[bool] = []  # [len(ids)]: no partial UTF-8 character after this id
        self.text = ""              # pending text == concatenated text of the pending ids
        self.out: list[str] = []    # released text pieces
        self.matched: str | None = None

    def push(self, id: int) -> bool:
        """Add one new id. True when a stop string has matched (generation must end)."""
        t = self.detok.put(id)
        self.utf8.decode(self.tokenizer.token_to_piece(id))
        self.ids.append(id)
        self.lens.append(len(t))
        self.whole.append(not self.utf8.getstate()[0])
        if not t:
            return False
        self.text += t
        if not self.stop:
            self._release(len(self.text))
            return False
        cut, hit = -1, None
        for s in self.stop:         # earliest match wins; a match always starts in pending text
            i = self.text.find(s)
            if i >= 0 and (cut < 0 or i < cut):
                cut, hit = i, s
        if hit is not None:
            self.matched = hit
            self._release(cut, final=True)
            return True
        self._release(len(self.text) - self._hold())
        return False

    def _hold(self) -> int:
        """Length of the longest suffix of the pending text that is a proper prefix of a stop."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _release(self, n: int, final: bool = False):
        """Release the pending ids whose text lies within the first n pending characters."""
        j, acc = 0, 0
        while j < len(self.ids) and acc + self.lens[j] <= n:
            acc += self.lens[j]
            j += 1
        while j > 0 and not self.whole[j - 1]:
            j -= 1                  # an id that ends inside a character goes with the next one
            acc -= self.lens[j]
        if j:
            if self.streamer is not None:
                self.streamer.put(np.asarray(self.ids[:j], dtype=np.int64))
            self.out.append(self.text[:acc])
            del self.ids[:j], self.lens[:j], self.whole[:j]
            self.text = self.text[acc:]
        if final:
            # The text before the stop inside a straddling token. put_text also tells the
            # streamer to drop what its detokenizer holds (part of `part`, or cut away).
            part = self.text[:n - acc]
            self.out.append(part)
            put_text = getattr(self.streamer, "put_text", None)
            if put_text is not None:
                put_text(part)
            self.ids.clear()
            self.lens.clear()
            self.whole.clear()
            self.text = ""

    def finish(self):
        """Generation ended without a stop match: release everything still pending."""
        if self.matched is not None:
            return
        self.text += self.detok.flush()
        if self.ids:
            if self.streamer is not None:
                self.streamer.put(np.asarray(self.ids, dtype=np.int64))
            self.ids.clear()
            self.lens.clear()
            self.whole.clear()
        self.out.append(self.text)
        self.text = ""

    def result_text(self) -> str:
        return "".join(self.out)


def _token_limit(max_new_tokens) -> int:
    """max_new_tokens as decode's limit (-1: none): an integer or None; 2.5, "8" and True are
    TypeErrors (they were truncated, parsed or taken as 1)."""
    if max_new_tokens is None:
        return -1
    if not is_int(max_new_tokens):
        raise TypeError(f"max_new_tokens must be an integer (or None), got {max_new_tokens!r}")
    return int(max_new_tokens)


def decode(session, logits: np.ndarray, tokenizer, sampler: Sampler, prev_ids: list[int], *,
           streamer=None, max_new_tokens: int | None = 256, stop: Sequence[str] = (),
           ignore_eos: bool = False, result: GenerationResult | None = None,
           constraint=None) -> GenerationResult:
    """Sample until eog, a stop string or max_new_tokens (None or < 0: no limit), starting from
    `logits` of the last prompt id. `prev_ids` (prompt ids; the new ids are appended to it) feeds
    the repeat penalty. Fills `result` as it goes; `streamer.end()` is always called.
    constraint (llmrt.jsonmode.Constraint): every id keeps the output valid, and generation
    ends (finish "eog") when the constraint is done (the JSON text complete, nothing can follow)
    or at an end-of-generation id it allowed, ignore_eos or not.

    KeyboardInterrupt: the result is finalized (finish_reason "interrupted", pending text
    released, streamer ended) and the interrupt is re-raised."""
    res = result if result is not None else GenerationResult()
    try:
        limit = _token_limit(max_new_tokens)
        # (with a constraint, an end-of-generation id it allowed ends the text, ignore_eos or not)
        eog = frozenset() if ignore_eos and constraint is None else frozenset(tokenizer.eog_ids)
        rel = _Release(tokenizer, stop, streamer)
    except BaseException:
        if streamer is not None:        # ended on every exit, as below
            streamer.end()
        raise
    res.finish_reason = "length"
    try:
        while limit < 0 or len(res.ids) < limit:
            tok = sample_next(sampler, logits, prev_ids, constraint)
            res.ids.append(tok)
            prev_ids.append(tok)
            if tok in eog:
                res.finish_reason = "eog"
                break
            if rel.push(tok):
                res.finish_reason, res.stop = "stop", rel.matched
                break
            if constraint is not None and constraint.done:
                res.finish_reason = "eog"       # (llama.cpp's grammar allows only eog from here)
                break
            if len(res.ids) == limit:
                break               # the last id need not be evaluated
            if getattr(session, "kv_mode", None) == "none" and session.n_past >= session.n_ctx:
                # nothing is evicted and the cache is full: stop here, keep what was generated
                # (llama.cpp's context limit, finish "length")
                log.info("llmrt: context full (%d tokens, kv_mode none): generation stopped",
                         session.n_ctx)
                break
            logits = session.eval([tok])
            res.n_eval += 1
    except KeyboardInterrupt:
        res.finish_reason = "interrupted"
        raise
    except BaseException:
        res.finish_reason = "error"
        raise
    finally:
        rel.finish()
        res.text = rel.result_text()
        if streamer is not None:
            streamer.end()
    return res


def generate(session, prompt_ids: Sequence[int], tokenizer, *, streamer=None,
             max_new_tokens: int | None = 256, sampler: Sampler | None = None,
             stop: Sequence[str] | str = (), ignore_eos: bool = False,
             do_sample: bool | None = None, result: GenerationResult | None = None,
             response_format=None, grammar=None, **sampling) -> list[int]:
    """Generate a continuation of `prompt_ids`; returns prompt_ids + new ids.

    sampling: temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed,
    frequency_penalty, presence_penalty, logit_bias (see Sampler), or a ready `sampler`. The session's cached
    prefix is reused. Pass a GenerationResult as `result` to get the text and finish reason.
    response_format: {"type": "json_object"} constrains the output to one JSON object (JSON mode,
    llmrt.jsonmode), {"type": "json_schema", "json_schema": {"schema": S}} to a text the JSON
    Schema S accepts, {"type": "text"} or None leaves it free. grammar: GBNF text (llama.cpp's
    format) the output must match instead."""
    try:
        stop = stop_strings(stop)
        constraint = output_constraint(tokenizer, response_format, grammar)
        sampler = make_sampler(sampler, do_sample, getattr(getattr(session, "model", None), "n_vocab", None),
                               **sampling)
        _token_limit(max_new_tokens)    # checked before the prompt is evaluated
        prompt_ids = id_list(prompt_ids)
        logits = _prefill(session, prompt_ids)
        if streamer is not None:
            streamer.put(np.asarray(prompt_ids, dtype=np.int64))
    except BaseException:
        if streamer is not None:    # decode() ends it from here on; a consumer never waits forever
            streamer.end()
        raise
    res = decode(session, logits, tokenizer, sampler, list(prompt_ids), streamer=streamer,
                 max_new_tokens=max_new_tokens, stop=stop, ignore_eos=ignore_eos, result=result,
                 constraint=constraint)
    return prompt_ids + res.ids


def sample_next(sampler, logits, prev_ids, constraint=None) -> int:
    """The next id: sampler.sample(logits, prev_ids), within `constraint` (then advanced over it)
    if there is one (a caller's own sampler without a constraint parameter serves free text)."""
    if constraint is None:
        return sampler.sample(logits, prev_ids)
    tok = sampler.sample(logits, prev_ids, constraint=constraint)
    constraint.accept(tok)
    return tok


def output_constraint(tokenizer, response_format=None, grammar=None):
    """A fresh llmrt.jsonmode.Constraint for response_format {"type": "json_object"} or {"type":
    "json_schema", ...} (llmrt.jsonmode.parse_response_format) or a GBNF `grammar`; None for free
    text (neither, or {"type": "text"}). ValueError for any other value, a schema or grammar
    llmrt cannot take, both at once, or no tokenizer."""
    from llmrt.jsonmode import Constraint, parse_response_format

    mode, schema = parse_response_format(response_format)
    if grammar is not None and mode != "text":
        raise ValueError("give response_format or grammar, not both")
    if mode == "text" and grammar is None:
        return None
    if tokenizer is None:
        raise ValueError("constrained output needs the model's tokenizer (the tokens' text)")
    return Constraint(tokenizer, schema, grammar)
