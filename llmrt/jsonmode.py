"""Constrained output: sampling such that the output is one JSON object (RFC 8259), a JSON
text a JSON Schema accepts, or a text a GBNF grammar accepts.

    c = Constraint(tokenizer)                     # one per generation (it keeps the text so far)
    c = Constraint(tokenizer, schema={"type": "object", "properties": {...}})
    c = Constraint(tokenizer, grammar='root ::= "yes" | "no"')     # GBNF, llama.cpp's format
    tok = sampler.sample(logits, prev_ids, constraint=c)    # only ids that keep the JSON valid
    c.accept(tok)                                 # ... and c.done once the text is complete

JSON mode is what OpenAI's `response_format: {"type": "json_object"}` and llama.cpp's JSON
grammar (grammars/json.gbnf) give: the output starts with `{`, every token keeps it a prefix of a
valid JSON text, and generation ends when the outer object closes (the constraint is `done`: the
callers stop there, as llama.cpp's grammar then allows only end-of-generation). With a schema
(`{"type": "json_schema", "json_schema": {"schema": ...}}`, llama.cpp's `json_schema`), the
schema is compiled to a grammar (llmrt.grammar, the subset llama.cpp's converter takes) and the
output is a text it accepts; a GBNF grammar (llama.cpp's `grammar`, `--grammar`) likewise.
End-of-generation is allowed wherever the text may end (JSON mode: once the object is done),
special tokens never, and generation stops where nothing else can follow. In JSON mode
whitespace between tokens is limited to WS_MAX bytes in a row (llama.cpp's grammar allows a
newline and up to 20 blanks), so a model cannot fill its budget with spaces, and inside strings
control bytes are refused and bytes >= 0x80 pass (the model's UTF-8; a schema's strings take
whole UTF-8 characters).

All three check each token's bytes (Tokenizer.token_to_piece), so a byte token that is a part
of a UTF-8 character is judged by that byte. Sampling follows llama.cpp's grammar sampler: the chain
picks a token from the unconstrained logits, and only if that token is refused are the logits
masked (every refused id to -inf) and the chain run again (Sampler.sample).
"""
from __future__ import annotations

import numpy as np

from llmrt.grammar import Grammar, GrammarState, gbnf_grammar, schema_grammar

WS_MAX = 32     # whitespace bytes in a row outside strings

# modes
_START, _VALUE, _ARR_FIRST, _OBJ_FIRST, _KEY, _COLON, _AFTER, _STR, _NUM, _LIT, _DONE = range(11)
# number sub-states: after "-", after a leading "0", in the integer digits, after ".", in the
# fraction, after "e", after the exponent's sign, in the exponent
_N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(8)
_N_END = frozenset((_N_ZERO, _N_INT, _N_FRAC, _N_EXP))      # a number may end here
_WS = frozenset(b" \t\n\r")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESC = frozenset(b'"\\/bfnrtu')
_LITS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}


class JsonState:
    """A pushdown automaton over bytes that accepts the prefixes of one JSON object. feed(b)
    returns False (and leaves the state unusable) on the first byte that cannot continue it."""

    __slots__ = ("stack", "mode", "aux", "key", "lit", "ws")

    def __init__(self):
        self.stack = ""         # open containers, "{" or "[", innermost last
        self.mode = _START
        self.aux = 0            # _STR: 0, 1 after "\", 2..5 hex digits of \\u left + 1; _NUM: sub-state
        self.key = False        # _STR: this string is an object key
        self.lit = b""          # _LIT: the literal's bytes still to come
        self.ws = 0             # whitespace bytes in a row

    def copy(self) -> "JsonState":
        s = JsonState.__new__(JsonState)
        s.stack, s.mode, s.aux, s.key, s.lit, s.ws = self.stack, self.mode, self.aux, self.key, self.lit, self.ws
        return s

    @property
    def done(self) -> bool:
        return self.mode == _DONE

    can_end = done              # (one object: it may end only when it is done)

    def next_bytes(self) -> int:
        """The mask of the bytes that can come next."""
        m = 0
        for b in range(256):
            if self.copy().feed(b):
                m |= 1 << b
        return m

    def feed_bytes(self, data: bytes) -> bool:
        for b in data:
            if not self.feed(b):
                return False
        return True

    def _value_done(self):
        self.mode = _AFTER if self.stack else _DONE

    def _start_value(self, b: int) -> bool:
        if b == 0x22:                       # "
            self.mode, self.aux, self.key = _STR, 0, False
        elif b == 0x7B:                     # {
            self.stack += "{"
            self.mode = _OBJ_FIRST
        elif b == 0x5B:                     # [
            self.stack += "["
            self.mode = _ARR_FIRST
        elif b == 0x2D:                     # -
            self.mode, self.aux = _NUM, _N_MINUS
        elif b == 0x30:
            self.mode, self.aux = _NUM, _N_ZERO
        elif b in _DIGITS:
            self.mode, self.aux = _NUM, _N_INT
        elif b in _LITS:
            self.mode, self.lit = _LIT, _LITS[b]
        else:
            return False
        return True

    def _close(self, b: int) -> bool:
        if not self.stack or self.stack[-1] != ("{" if b == 0x7D else "["):
            return False
        self.stack = self.stack[:-1]
        self._value_done()
        return True

    def feed(self, b: int) -> bool:
        m = self.mode
        if m == _STR:
            a = self.aux
            if a == 0:
                if b == 0x22:               # the closing quote
                    if self.key:
                        self.mode = _COLON
                    else:
                        self._value_done()
                    self.ws = 0
                elif b == 0x5C:
                    self.aux = 1
                elif b < 0x20:
                    return False
                return True
            if a == 1:
                if b not in _ESC:
                    return False
                self.aux = 5 if b == 0x75 else 0        # \u: 4 hex digits
                return True
            if b not in _HEX:
                return False
            self.aux = a - 1 if a > 2 else 0
            return True
        if m == _NUM:
            n = self.aux
            if b in _DIGITS:
                if n == _N_ZERO:
                    return False                        # no leading zeros
                self.aux = ((_N_ZERO if b == 0x30 else _N_INT) if n == _N_MINUS else _N_INT if n == _N_INT
                            else _N_FRAC if n in (_N_DOT, _N_FRAC) else _N_EXP)
                return True
            if b == 0x2E and n in (_N_ZERO, _N_INT):    # .
                self.aux = _N_DOT
                return True
            if b in (0x65, 0x45) and n in (_N_ZERO, _N_INT, _N_FRAC):    # e E
                self.aux = _N_E
                return True
            if b in (0x2B, 0x2D) and n == _N_E:         # + -
                self.aux = _N_ESIGN
                return True
            if n not in _N_END:
                return False
            self.ws = 0
            self._value_done()                          # the number ended: b goes on from there
            m = self.mode
        elif m == _LIT:
            if b != self.lit[0]:
                return False
            self.lit = self.lit[1:]
            if not self.lit:
                self._value_done()
                self.ws = 0
            return True
        if b in _WS:
            if m in (_START, _DONE):
                return False
            self.ws += 1
            return self.ws <= WS_MAX
        self.ws = 0
        if m == _START:
            if b != 0x7B:
                return False
            self.stack, self.mode = "{", _OBJ_FIRST
            return True
        if m == _VALUE:
            return self._start_value(b)
        if m == _ARR_FIRST:
            return self._close(b) if b == 0x5D else self._start_value(b)
        if m == _OBJ_FIRST or m == _KEY:
            if b == 0x22:
                self.mode, self.aux, self.key = _STR, 0, True
                return True
            return m == _OBJ_FIRST and b == 0x7D and self._close(b)
        if m == _COLON:
            if b != 0x3A:
                return False
            self.mode = _VALUE
            return True
        if m == _AFTER:
            if b == 0x2C:                               # ,
                self.mode = _KEY if self.stack[-1] == "{" else _VALUE
                return True
            if b == 0x7D or b == 0x5D:
                return self._close(b)
            return False
        return False                                    # _DONE: nothing more


class _VocabTables:
    """Per tokenizer, once: each id's bytes, its first byte, and whether it may appear in JSON
    text at all (not special, not end-of-generation, not empty)."""

    def __init__(self, tokenizer):
        self.pieces, special = tokenizer.piece_table()
        self.first = np.array([p[0] if p else 0 for p in self.pieces], dtype=np.uint8)
        usable = np.array([bool(p) for p in self.pieces]) & ~np.array(special, dtype=bool)
        self.eog = frozenset(i for i in tokenizer.eog_ids if 0 <= i < usable.shape[0])
        usable[list(self.eog)] = False
        self.usable = usable


def vocab_tables(tokenizer) -> _VocabTables:
    """The tokenizer's tables, made on first use (~0.1 s for a 262k vocabulary) and kept on it."""
    t = getattr(tokenizer, "_json_tables", None)
    if t is None:
        t = _VocabTables(tokenizer)
        try:
            tokenizer._json_tables = t
        except AttributeError:          # (a tokenizer that takes no attributes: not cached)
            pass
    return t


class Constraint:
    """The token-level constraint of one generation (see the module docstring): the output is
    one JSON object (neither argument), a JSON text the JSON Schema `schema` (a dict) accepts, or
    a text the grammar `grammar` accepts (GBNF text, or a llmrt.grammar.Grammar)."""

    def __init__(self, tokenizer, schema=None, grammar=None):
        if schema is not None and grammar is not None:
            raise ValueError("give a JSON schema or a grammar, not both")
        self._t = vocab_tables(tokenizer)
        if grammar is not None:
            self.state = GrammarState(grammar if isinstance(grammar, Grammar) else gbnf_grammar(grammar))
        elif schema is not None:
            self.state = GrammarState(schema_grammar(schema))
        else:
            self.state = JsonState()
        self.text = bytearray()         # the accepted bytes

    @property
    def done(self) -> bool:
        """The text is complete and nothing can follow it: nothing more may be generated."""
        return self.state.done

    def allows(self, tok: int) -> bool:
        t = self._t
        if tok in t.eog:                # end-of-generation: where the text may end
            return self.state.can_end
        if not 0 <= tok < len(t.pieces) or not t.usable[tok]:
            return False
        return self.state.copy().feed_bytes(t.pieces[tok])

    def accept(self, tok: int):
        """Advance over token `tok`, which must be allowed (ValueError otherwise)."""
        if not self.allows(tok):
            raise ValueError(f"[constraint] token {tok} ({self._t.pieces[tok]!r}) does not continue the "
                             f"text {bytes(self.text[-40:])!r}")
        if tok not in self._t.eog:
            self.state.feed_bytes(self._t.pieces[tok])
            self.text += self._t.pieces[tok]

    def mask(self, logits: np.ndarray, need: int = 0) -> np.ndarray:
        """A copy of `logits` ([n_vocab]) with every id that cannot continue the text at -inf. The
        ids are tried from the most likely down; need > 0 stops after that many allowed ones (the
        sampler's top_k, 1 for greedy: the rest could not be chosen anyway). ValueError if no id
        with a finite logit is allowed."""
        t = self._t
        n = min(logits.shape[0], len(t.pieces))
        nb = self.state.next_bytes()            # bytes that may come next
        ok_first = np.array([(nb >> b) & 1 for b in range(256)], dtype=bool)
        lg = logits[:n]
        ok = ok_first[t.first[:n]] & t.usable[:n]
        if self.state.can_end:
            ok[[i for i in t.eog if i < n]] = True
        cand = np.flatnonzero(ok & (lg > -np.inf))
        cand = cand[np.argsort(-lg[cand], kind="stable")]
        keep = []
        for i in cand.tolist():
            if i in t.eog or self.state.copy().feed_bytes(t.pieces[i]):
                keep.append(i)
                if len(keep) == need:
                    break
        if not keep:
            raise ValueError(f"[constraint] no token can continue the text {bytes(self.text[-40:])!r} "
                             f"(banned by logit_bias?)")
        out = np.full(logits.shape, -np.inf, dtype=logits.dtype)
        out[keep] = logits[keep]
        return out


_FORMS = ('{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": '
          '{"schema": {...}}}')


def parse_response_format(fmt, compile_schema: bool = True):
    """OpenAI's response_format -> (mode, schema): None or {"type": "text"} -> ("text", None),
    {"type": "json_object"} -> ("json_object", None) (llama.cpp's {"type": "json_object",
    "schema": S} -> ("json_schema", S)), {"type": "json_schema", "json_schema": {"schema": S, ...}}
    -> ("json_schema", S) (no "schema": {}, any JSON). ValueError for any other value; with
    compile_schema (the default) the schema is compiled here (cached), so a schema llmrt cannot
    take is one now too."""
    if fmt is None:
        return "text", None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise ValueError(f"response_format must be {_FORMS}, got {fmt!r}")
    kind, keys = fmt["type"], set(fmt) - {"type"}
    if kind == "text" and not keys:
        return "text", None
    if kind == "json_object" and not keys:
        return "json_object", None
    if kind == "json_object" and keys == {"schema"}:
        schema = fmt["schema"]
    elif kind == "json_schema" and keys == {"json_schema"} and isinstance(fmt["json_schema"], dict):
        schema = fmt["json_schema"].get("schema", {})
    else:
        raise ValueError(f"response_format must be {_FORMS}, got {fmt!r}")
    if compile_schema:
        schema_grammar(schema).start()  # (ValueError: what the schema asks that llmrt cannot do)
    return "json_schema", schema
