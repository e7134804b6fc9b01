"""Context-free grammars over bytes: JSON Schema compiled to one (what llama.cpp's
json_schema_to_grammar does) and GBNF (llama.cpp's grammar format) parsed to one, for
constrained sampling (llmrt.jsonmode).

    g = schema_grammar({"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]})
    st = GrammarState(g)
    st.feed_bytes(b'{"age": 3}') and st.done      # True
    gbnf_grammar('root ::= ("yes" | "no") "."')

A grammar is a list of rules, a rule a list of alternatives, an alternative a sequence of elements:
a byte class (a 256-bit mask) or a reference to a rule. Recognition is llama.cpp's (src/llama-
grammar.cpp): the state is the set of stacks of positions that can follow the bytes so far; each
stack's top is a byte class (references are expanded as soon as they are on top, and a finished
alternative is popped), a byte advances every stack whose top accepts it, and the empty stack
means "complete". Left recursion is refused (check_left_recursion). Repetition is right
recursion whose finished frames are dropped at once, so a long string does not grow the stacks.
A grammar so ambiguous that the readings of the text multiply (more than _MAX_STACKS) is a
ValueError at that byte, and grammars past _MAX_RULES rules / _MAX_ELEMENTS elements are refused:
one request cannot hang a server or fill its memory. Characters are UTF-8 byte sequences (a class
over code points compiles to alternatives of byte ranges).

JSON Schema, the subset llama.cpp's converter handles: type (one or a list), enum, const (beside
type: its values of that type), properties / required / additionalProperties (the properties in
the schema's order, the optional ones skippable, required names without a schema last with any
value; without additionalProperties no others, as llama.cpp; with it, other keys are printable
ASCII without escapes and none of the declared names), items, minItems / maxItems, minLength /
maxLength (in characters; an escaped surrogate pair is not allowed there), anyOf, oneOf (read as
anyOf, as llama.cpp does: a text two branches accept is possible), allOf of one schema, $ref to
#/$defs/... or #/definitions/... (recursion included), and {} / true for any value. Annotations
(title, description, default, examples, $schema, $id, $comment, format, ...) are ignored; a
keyword that would constrain what this compiler cannot (pattern, minimum, maximum, multipleOf,
uniqueItems, prefixItems, not, if/then/else, patternProperties, ...), or $ref / enum / anyOf /
allOf beside other constraints, is a ValueError naming it, never a silently looser grammar.
Numbers take up to 16 digits in each part (llama.cpp's bound). Whitespace between tokens is
llama.cpp's `space`: none, one blank, or one or two newlines and up to 20 blanks or tabs.
"""
from __future__ import annotations

import json
import threading

_MAX_RULES = 100_000     # a grammar or schema that needs more is refused (size limits, so that one
_MAX_ELEMENTS = 400_000  # request cannot hold gigabytes or the CPU for seconds)
_MAX_LEN = 4096          # bounded repetitions (maxLength, maxItems, {m,n}) up to this many
_MAX_STACKS = 2048       # readings of the text so far a state may hold: an ambiguous grammar that
                         # multiplies them (e.g. root ::= "x" root "y" | "x" root "z" | "") is an
                         # error, not an exponential hang
_MAX_STEPS = 200_000     # rule expansions per byte, likewise
_MEMO_STACKS = 1 << 20   # the advance memo is cleared when its states hold more stacks than this
_MAX_CP = 0x10FFFF                  # the last code point
_SURROGATES = (0xD800, 0xDFFF)      # code points UTF-8 does not encode


def _mask(chars) -> int:
    m = 0
    for b in chars:
        m |= 1 << b
    return m


def _range(lo: int, hi: int) -> int:
    return ((1 << (hi + 1)) - 1) & ~((1 << lo) - 1)


_ALL = _range(0, 255)


class Grammar:
    """Rules of byte-class / rule-reference alternatives. Elements: (0, mask) a byte class,
    (1, rule) a reference."""

    def __init__(self):
        self.rules: list[list[int]] = []            # rule -> alternative ids
        self.alts: list[tuple] = []                 # alternative id -> elements
        self.root = None
        self.n_elements = 0
        self._start = None
        self._memo: dict = {}                       # (stacks, byte) -> stacks
        self._memo_stacks = 0

    def new_rule(self) -> int:
        if len(self.rules) >= _MAX_RULES:
            raise ValueError(f"[grammar] more than {_MAX_RULES} grammar rules: too large")
        self.rules.append([])
        return len(self.rules) - 1

    def set_rule(self, r: int, alternatives):
        """alternatives: sequences of elements (see lit, cls, ref)."""
        for a in alternatives:
            self.alts.append(tuple(a))
            self.rules[r].append(len(self.alts) - 1)
            self.n_elements += len(a) + 1
        if self.n_elements > _MAX_ELEMENTS:
            raise ValueError(f"[grammar] more than {_MAX_ELEMENTS} grammar elements: too large")
        return r

    def rule(self, *alternatives) -> int:
        return self.set_rule(self.new_rule(), alternatives)

    def repeat(self, elems: list, lo: int, hi) -> int:
        """A rule for elems{lo,hi} (hi None: unbounded), as right recursion."""
        if hi is None:
            tail = self.new_rule()
            self.set_rule(tail, [[], elems + ref(tail)])
        else:
            tail = self.rule([])
            for _ in range(hi - lo):
                tail = self.rule([], elems + ref(tail))
        for _ in range(lo):
            tail = self.rule(elems + ref(tail))
        return tail

    # ---- recognition -------------------------------------------------------------------------

    def _expand(self, todo: list) -> frozenset:
        """The stacks the stacks in `todo` stand for with a byte class on top (() for a complete
        text). Iterative (a deep chain of references is no Python recursion); ValueError past
        _MAX_STACKS stacks or _MAX_STEPS expansions."""
        out: set = set()
        steps = 0
        while todo:
            stack = todo.pop()
            while stack:
                alt, pos = stack[-1]
                elems = self.alts[alt]
                if pos == len(elems):
                    stack = stack[:-1]
                    continue
                kind, val = elems[pos]
                if kind == 0:
                    out.add(stack)
                    break
                # a reference: its continuation (dropped when it is the alternative's end) under
                # each alternative of the rule
                rest = stack[:-1] + ((alt, pos + 1),) if pos + 1 < len(elems) else stack[:-1]
                todo.extend(rest + ((a, 0),) for a in self.rules[val])
                steps += len(self.rules[val])
                break
            else:
                out.add(())
            if len(out) > _MAX_STACKS or steps > _MAX_STEPS:
                raise ValueError(f"[grammar] the grammar is too ambiguous here: more than "
                                 f"{_MAX_STACKS} ways to read the text so far")
        return frozenset(out)

    def start(self) -> frozenset:
        """The stacks before any byte (made once)."""
        if self._start is None:
            self._start = self._expand([((a, 0),) for a in self.rules[self.root]])
        return self._start

    def advance(self, stacks: frozenset, b: int) -> frozenset:
        """The stacks after byte b (empty: b cannot come next). Memoized (the memo is cleared
        past _MEMO_STACKS stacks)."""
        key = (stacks, b)
        out = self._memo.get(key)
        if out is None:
            bit = 1 << b
            todo = []
            for st in stacks:
                if st:
                    alt, pos = st[-1]
                    elems = self.alts[alt]
                    if elems[pos][1] & bit:
                        todo.append(st[:-1] + ((alt, pos + 1),) if pos + 1 < len(elems) else st[:-1])
            out = self._expand(todo)
            if self._memo_stacks > _MEMO_STACKS:
                self._memo, self._memo_stacks = {}, 0
            self._memo[key] = out
            self._memo_stacks += len(out) + 1
        return out

    def next_bytes(self, stacks: frozenset) -> int:
        """The mask of the bytes that can come next."""
        m = 0
        for st in stacks:
            if st:
                alt, pos = st[-1]
                m |= self.alts[alt][pos][1]
        return m


def lit(data: bytes) -> list:
    return [(0, 1 << b) for b in data]


def cls(mask: int) -> list:
    return [(0, mask)]


def ref(r: int) -> list:
    return [(1, r)]


class GrammarState:
    """A position in a grammar: feed(b) -> False (and the state is dead) on a byte that cannot
    come next; done when only the end can; can_end when the end can (nothing more needed)."""

    __slots__ = ("g", "stacks")

    def __init__(self, g: Grammar, stacks: frozenset | None = None):
        self.g = g
        self.stacks = g.start() if stacks is None else stacks

    def copy(self) -> "GrammarState":
        return GrammarState(self.g, self.stacks)

    def feed(self, b: int) -> bool:
        self.stacks = self.g.advance(self.stacks, b)
        return bool(self.stacks)

    def feed_bytes(self, data: bytes) -> bool:
        for b in data:
            self.stacks = self.g.advance(self.stacks, b)
            if not self.stacks:
                return False
        return True

    @property
    def can_end(self) -> bool:
        return () in self.stacks

    @property
    def done(self) -> bool:
        return self.stacks == frozenset([()])

    def next_bytes(self) -> int:
        return self.g.next_bytes(self.stacks)


# ---- JSON Schema -> grammar -----------------------------------------------------------------------

_IGNORED = frozenset(("title", "description", "default", "examples", "$schema", "$id", "$comment",
                      "format", "readOnly", "writeOnly", "deprecated", "$defs", "definitions",
                      "contentMediaType", "contentEncoding", "strict", "name"))
_HANDLED = frozenset(("type", "enum", "const", "properties", "required", "additionalProperties",
                      "items", "minItems", "maxItems", "minLength", "maxLength", "anyOf", "oneOf",
                      "allOf", "$ref"))
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


class _SchemaCompiler:
    def __init__(self, schema):
        self.g = Grammar()
        self.root_schema = schema
        self.refs: dict[str, int] = {}
        g = self.g
        digits = _range(0x30, 0x39)
        blank = _mask(b" \t")
        ind = g.repeat(cls(blank), 0, 20)
        nl = g.rule(lit(b"\n"), lit(b"\n\n"))
        self.S = g.rule([], lit(b" "), ref(nl) + ref(ind))
        hexd = digits | _range(0x41, 0x46) | _range(0x61, 0x66)
        # one character of a string: printable ASCII but '"' and '\\', a whole UTF-8 character,
        # or an escape; UNIT (for minLength / maxLength, which count characters) refuses escaped
        # surrogates, whose pairs are one character in two escapes
        self.PLAIN = _range(0x20, 0x7F) & ~_mask(b'"\\')
        self.MULTI = g.rule(*_cp_ranges_elements([(0x80, _MAX_CP)]))
        esc = g.rule(cls(_mask(b'"\\/bfnrt')), lit(b"u") + cls(hexd) * 4)
        self.CHAR = g.rule(cls(self.PLAIN), ref(self.MULTI), lit(b"\\") + ref(esc))
        not_d = hexd & ~_mask(b"dD")
        u_bmp = g.rule(cls(not_d) + cls(hexd) * 3, cls(_mask(b"dD")) + cls(_range(0x30, 0x37)) + cls(hexd) * 2)
        esc1 = g.rule(cls(_mask(b'"\\/bfnrt')), lit(b"u") + ref(u_bmp))
        self.UNIT = g.rule(cls(self.PLAIN), ref(self.MULTI), lit(b"\\") + ref(esc1))
        self.STRING = g.rule(lit(b'"') + ref(g.repeat(ref(self.CHAR), 0, None)) + lit(b'"'))
        d15 = g.repeat(cls(digits), 0, 15)
        integral = g.rule(lit(b"0"), cls(_range(0x31, 0x39)) + ref(d15))
        self.INTEGER = g.rule(ref(integral), lit(b"-") + ref(integral))
        d1_16 = cls(digits) + ref(g.repeat(cls(digits), 0, 15))     # (JSON allows leading zeros there)
        frac = g.rule([], lit(b".") + d1_16)
        exp = g.rule([], cls(_mask(b"eE")) + ref(g.rule([], cls(_mask(b"+-")))) + d1_16)
        self.NUMBER = g.rule(ref(self.INTEGER) + ref(frac) + ref(exp))
        self.BOOLEAN = g.rule(lit(b"true"), lit(b"false"))
        self.NULL = g.rule(lit(b"null"))
        self.VALUE = g.new_rule()                # any JSON value
        self.OBJECT = self._object_any(self.VALUE)
        self.ARRAY = self._array(self.VALUE, 0, None)
        g.set_rule(self.VALUE, [ref(r) for r in (self.OBJECT, self.ARRAY, self.STRING, self.NUMBER,
                                                 self.BOOLEAN, self.NULL)])

    # ---- helpers ----
    def _key_not_in(self, names) -> int:
        """The content and closing quote of a key of printable ASCII characters (no escapes)
        that is none of `names`: a trie of the names, left by any character off its paths."""
        g = self.g
        free = g.rule(ref(g.repeat(cls(self.PLAIN), 0, None)) + lit(b'"'))

        def build(node: dict) -> int:
            kids = [c for c in node if c is not None]
            alts = [lit(bytes([c])) + ref(build(node[c])) for c in kids]
            off = self.PLAIN & ~_mask(kids)
            if off:
                alts.append(cls(off) + ref(free))
            if None not in node:
                alts.append(lit(b'"'))
            return g.rule(*alts)

        return build(_ascii_trie(names))

    def _object_any(self, value_rule: int) -> int:
        g, S = self.g, self.S
        kv = g.rule(ref(self.STRING) + ref(S) + lit(b":") + ref(S) + ref(value_rule))
        more = g.repeat(ref(S) + lit(b",") + ref(S) + ref(kv), 0, None)
        return g.rule(lit(b"{") + ref(S) + lit(b"}"),
                      lit(b"{") + ref(S) + ref(kv) + ref(more) + ref(S) + lit(b"}"))

    def _array(self, item: int, lo: int, hi) -> int:
        g, S = self.g, self.S
        if hi is not None and hi < lo:
            raise ValueError(f"[json_schema] maxItems {hi} < minItems {lo}")
        alts = [lit(b"[") + ref(S) + lit(b"]")] if lo == 0 else []
        if hi is None or hi >= 1:
            sep_item = ref(S) + lit(b",") + ref(S) + ref(item)
            more = self.g.repeat(sep_item, max(lo - 1, 0), None if hi is None else hi - 1)
            alts.append(lit(b"[") + ref(S) + ref(item) + ref(more) + ref(S) + lit(b"]"))
        return g.rule(*alts)

    def _literal(self, v) -> list:
        """Elements for the JSON value v (enum, const): scalars as json.dumps writes them, arrays
        and objects item by item with `space` where JSON allows whitespace."""
        S = self.S
        if isinstance(v, (list, tuple)):
            out = lit(b"[") + ref(S)
            for i, x in enumerate(v):
                out += (ref(S) + lit(b",") + ref(S) if i else []) + self._literal(x)
            return out + ref(S) + lit(b"]")
        if isinstance(v, dict):
            out = lit(b"{") + ref(S)
            for i, (k, x) in enumerate(v.items()):
                out += ((ref(S) + lit(b",") + ref(S) if i else []) + self._literal(k) + ref(S) + lit(b":")
                        + ref(S) + self._literal(x))
            return out + ref(S) + lit(b"}")
        try:
            return lit(json.dumps(v, ensure_ascii=False, allow_nan=False).encode("utf-8"))
        except (TypeError, ValueError) as e:
            raise ValueError(f"[json_schema] enum / const value {v!r} is not JSON: {e}") from None

    # ---- schemas ----
    def compile(self, s, where="schema") -> int:
        g = self.g
        if s is True or s == {}:
            return self.VALUE
        if not isinstance(s, dict):
            raise ValueError(f"[json_schema] {where} must be an object (or true), got {s!r}")
        unknown = set(s) - _HANDLED - _IGNORED
        if unknown:
            raise ValueError(f"[json_schema] {where}: {', '.join(sorted(unknown))} not supported "
                             f"(supported: {', '.join(sorted(_HANDLED))})")
        # a keyword that takes the whole value ($ref, const, enum, anyOf, oneOf, allOf) beside
        # others that constrain it would need their intersection: refused, never one of them
        # dropped (const / enum beside type: the values of that type)
        whole = [k for k in ("$ref", "const", "enum", "anyOf", "oneOf", "allOf") if k in s]
        if whole:
            others = sorted((set(s) & _HANDLED) - {whole[0]} - ({"type"} if whole[0] in ("const", "enum") else set()))
            if others:
                raise ValueError(f"[json_schema] {where}: {whole[0]} beside {', '.join(others)} is not "
                                 f"supported (the value must satisfy all: put them in one schema)")
        if "$ref" in s:
            return self._ref(s["$ref"], where)
        if "const" in s or "enum" in s:
            values = [s["const"]] if "const" in s else s["enum"]
            if not isinstance(values, list) or not values:
                raise ValueError(f"[json_schema] {where}.enum must be a non-empty list")
            if "type" in s:
                types = s["type"] if isinstance(s["type"], list) else [s["type"]]
                values = [v for v in values if any(_is_type(v, t) for t in types)]
                if not values:
                    raise ValueError(f"[json_schema] {where}: no enum / const value is of type {s['type']!r}")
            return g.rule(*[self._literal(v) for v in values])
        for key in ("anyOf", "oneOf"):
            if key in s:
                subs = s[key]
                if not isinstance(subs, list) or not subs:
                    raise ValueError(f"[json_schema] {where}.{key} must be a non-empty list")
                return g.rule(*[ref(self.compile(x, f"{where}.{key}[{i}]")) for i, x in enumerate(subs)])
        if "allOf" in s:
            subs = s["allOf"]
            if not isinstance(subs, list) or len(subs) != 1:
                raise ValueError(f"[json_schema] {where}.allOf: only a list of one schema is supported")
            return self.compile(subs[0], f"{where}.allOf[0]")
        t = s.get("type")
        if t is None:
            if "properties" in s or "additionalProperties" in s or "required" in s:
                t = "object"
            elif "items" in s or "minItems" in s or "maxItems" in s:
                t = "array"
            elif "minLength" in s or "maxLength" in s:
                t = "string"
            else:
                return self.VALUE
        if isinstance(t, list):
            if not t:
                raise ValueError(f"[json_schema] {where}.type is an empty list")
            return g.rule(*[ref(self._typed(dict(s, type=x), x, where)) for x in t])
        return self._typed(s, t, where)

    def _ref(self, r, where) -> int:
        if r in self.refs:
            return self.refs[r]
        parts = r.split("/") if isinstance(r, str) else []
        if len(parts) != 3 or parts[0] != "#" or parts[1] not in ("$defs", "definitions"):
            raise ValueError(f"[json_schema] {where}.$ref {r!r}: only #/$defs/NAME or #/definitions/NAME")
        target = (self.root_schema.get(parts[1]) or {}).get(parts[2]) if isinstance(self.root_schema, dict) else None
        if target is None:
            raise ValueError(f"[json_schema] {where}.$ref {r!r} names no definition")
        rule = self.refs[r] = self.g.new_rule()         # (before its body: recursion refers to it)
        self.g.set_rule(rule, [ref(self.compile(target, r))])
        return rule

    def _typed(self, s: dict, t, where) -> int:
        g = self.g
        if t not in _TYPES:
            raise ValueError(f"[json_schema] {where}.type {t!r} is not a JSON type")
        if t == "string":
            lo, hi = _count(s, "minLength", where), _count(s, "maxLength", where, None)
            if lo == 0 and hi is None:
                return self.STRING
            if hi is not None and hi < lo:
                raise ValueError(f"[json_schema] {where}: maxLength {hi} < minLength {lo}")
            return g.rule(lit(b'"') + ref(self.g.repeat(ref(self.UNIT), lo, hi)) + lit(b'"'))
        if t == "integer":
            return self.INTEGER
        if t == "number":
            return self.NUMBER
        if t == "boolean":
            return self.BOOLEAN
        if t == "null":
            return self.NULL
        if t == "array":
            item = self.compile(s.get("items", True), f"{where}.items")
            return self._array(item, _count(s, "minItems", where), _count(s, "maxItems", where, None))
        return self._object(s, where)

    def _object(self, s: dict, where) -> int:
        g, S = self.g, self.S
        props = s.get("properties")
        extra = s.get("additionalProperties")
        required = s.get("required", [])
        if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
            raise ValueError(f"[json_schema] {where}.required must be a list of names")
        if props is None and not required:
            if extra is False:
                return g.rule(lit(b"{") + ref(S) + lit(b"}"))
            return self._object_any(self.VALUE if extra in (None, True) else self.compile(extra, f"{where}.additionalProperties"))
        if props is None:
            props = {}
        if not isinstance(props, dict):
            raise ValueError(f"[json_schema] {where}.properties must be an object")
        # required names without a schema: any value, after the described ones
        props = dict(props, **{k: True for k in required if k not in props})
        names = list(props)
        kvs = [g.rule(lit(json.dumps(k, ensure_ascii=False).encode("utf-8")) + ref(S) + lit(b":") + ref(S)
                      + ref(self.compile(props[k], f"{where}.properties.{k}"))) for k in names]
        sep = ref(S) + lit(b",") + ref(S)
        # rest[first]: what may follow the properties before i (first: none of them was written)
        if extra in (None, False):
            rest = {True: g.rule([]), False: g.rule([])}
        else:                           # other names: printable ASCII keys that are none of names
            ev = self.VALUE if extra is True else self.compile(extra, f"{where}.additionalProperties")
            kv = g.rule(lit(b'"') + ref(self._key_not_in(names)) + ref(S) + lit(b":") + ref(S) + ref(ev))
            more = g.repeat(sep + ref(kv), 0, None)
            rest = {True: g.rule([], ref(kv) + ref(more)), False: g.rule([], sep + ref(kv) + ref(more))}
        for i in range(len(names) - 1, -1, -1):
            k = names[i]
            new = {}
            for first in (True, False):
                write = ([] if first else sep) + ref(kvs[i]) + ref(rest[False])
                new[first] = g.rule(write) if k in required else g.rule(write, ref(rest[first]))
            rest = new
        return g.rule(lit(b"{") + ref(S) + ref(rest[True]) + ref(S) + lit(b"}"))


def _ascii_trie(names) -> dict:
    """A trie (dicts by byte; key None marks an end) of the names that are printable ASCII
    without '"' or '\\' (the only ones an additional key of such characters can equal)."""
    root: dict = {}
    for k in names:
        b = k.encode("utf-8")
        if all(0x20 <= c < 0x7F and c not in b'"\\' for c in b):
            node = root
            for c in b:
                node = node.setdefault(c, {})
            node[None] = True
    return root


def _is_type(v, t) -> bool:
    """Whether the JSON value v is of JSON Schema type t (1.0 is an integer, as JSON Schema says)."""
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t in ("number", "integer"):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        return t == "number" or float(v).is_integer()
    return isinstance(v, {"string": str, "array": (list, tuple), "object": dict}.get(t, ()))


def _count(s: dict, key: str, where: str, default=0):
    v = s.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"[json_schema] {where}.{key} must be an integer >= 0, got {v!r}")
    if v > _MAX_LEN:
        raise ValueError(f"[json_schema] {where}.{key} {v} is more than this compiler takes ({_MAX_LEN})")
    return v


def check_left_recursion(g: Grammar):
    """ValueError if a rule can reach itself before any byte (recognition would not end), e.g.
    a $ref that names itself."""
    n = len(g.rules)
    nullable = [False] * n
    changed = True
    while changed:                      # the rules that can match nothing
        changed = False
        for r in range(n):
            if not nullable[r] and any(all(k == 1 and nullable[v] for k, v in g.alts[a]) for a in g.rules[r]):
                nullable[r] = changed = True
    first = [set() for _ in range(n)]   # rules each rule can start with, before any byte
    for r in range(n):
        for a in g.rules[r]:
            for k, v in g.alts[a]:
                if k == 0:
                    break
                first[r].add(v)
                if not nullable[v]:
                    break
    state = [0] * n                     # depth-first search for a cycle: 1 on the path, 2 done
    for r0 in range(n):
        if state[r0]:
            continue
        path = [(r0, iter(first[r0]))]
        state[r0] = 1
        while path:
            r, it = path[-1]
            nxt = next(it, None)
            if nxt is None:
                state[r] = 2
                path.pop()
            elif state[nxt] == 1:
                raise ValueError("[grammar] a rule refers to itself before any text (left recursion: in a "
                                 "JSON schema, e.g. a $ref whose definition is that $ref)")
            elif state[nxt] == 0:
                state[nxt] = 1
                path.append((nxt, iter(first[nxt])))


_CACHE: dict = {}       # schema text -> Grammar, the last _CACHE_SIZE compiled
_CACHE_SIZE = 64
_CACHE_LOCK = threading.Lock()      # (generate() runs from many threads)


def schema_grammar(schema) -> Grammar:
    """The grammar of the JSON texts `schema` (a JSON Schema, as a dict) accepts; ValueError for a
    schema this compiler does not take (see the module docstring). The last 64 schemas' grammars
    are kept (a server's clients repeat theirs)."""
    try:
        key = json.dumps(schema, sort_keys=True)
        with _CACHE_LOCK:
            g = _CACHE.get(key)
        if g is None:
            c = _SchemaCompiler(schema)
            c.g.root = c.compile(schema)
            check_left_recursion(c.g)
            g = c.g
    except RecursionError:
        raise ValueError("[json_schema] the schema is nested too deeply") from None
    except TypeError as e:
        raise ValueError(f"[json_schema] the schema is not JSON: {e}") from None
    with _CACHE_LOCK:
        if key not in _CACHE:
            if len(_CACHE) >= _CACHE_SIZE:
                _CACHE.pop(next(iter(_CACHE)))
            _CACHE[key] = g
    return g


# ---- GBNF (llama.cpp's grammar format, grammars/README.md) -> grammar -----------------------------



def _utf8_sequences(lo: int, hi: int, out: list):
    """The UTF-8 encodings of code points lo..hi (no surrogates) as sequences of byte ranges,
    each sequence's bytes varying independently (RE2's / utf8-ranges' split)."""
    if lo > hi:
        return
    for bound in (0x7F, 0x7FF, 0xFFFF):                 # one encoded length at a time
        if lo <= bound < hi:
            _utf8_sequences(lo, bound, out)
            _utf8_sequences(bound + 1, hi, out)
            return
    if hi <= 0x7F:
        out.append([(lo, hi)])
        return
    n = len(chr(lo).encode("utf-8"))
    for i in range(1, n):                               # continuation bytes must span 0x80..0xBF
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                _utf8_sequences(lo, lo | m, out)
                _utf8_sequences((lo | m) + 1, hi, out)
                return
            if hi & m != m:
                _utf8_sequences(lo, (hi & ~m) - 1, out)
                _utf8_sequences(hi & ~m, hi, out)
                return
    out.append(list(zip(chr(lo).encode("utf-8"), chr(hi).encode("utf-8"))))


def _cp_ranges_elements(ranges) -> list:
    """Alternatives (element lists) matching one code point in `ranges` [(lo, hi)], as UTF-8."""
    seqs: list = []
    for lo, hi in ranges:
        for a, b in ((lo, min(hi, _SURROGATES[0] - 1)), (max(lo, _SURROGATES[1] + 1), hi)):
            _utf8_sequences(a, b, seqs)
    ascii_mask = 0
    alts = []
    for seq in seqs:
        if len(seq) == 1:
            ascii_mask |= _range(*seq[0])
        else:
            alts.append([(0, _range(a, b)) for a, b in seq])
    if ascii_mask:
        alts.insert(0, cls(ascii_mask))
    return alts


def _normalize(ranges):
    out = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges):
    out, at = [], 0
    for lo, hi in _normalize(ranges):
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= _MAX_CP:
        out.append((at, _MAX_CP))
    return out


class _GbnfParser:
    """A recursive-descent parser of GBNF text into a Grammar (rules named, root "root")."""

    def __init__(self, text: str):
        self.s, self.i = text, 0
        self.g = Grammar()
        self.names: dict[str, int] = {}
        self.defined: set = set()

    def closing(self, close: str, what: str) -> bool:
        """Whether the next character is `close` (then it is consumed); an error at the end."""
        if self.i >= len(self.s):
            self.error(f"unterminated {what}")
        if self.s[self.i] == close:
            self.i += 1
            return True
        return False

    def error(self, msg):
        line = self.s.count("\n", 0, self.i) + 1
        col = self.i - (self.s.rfind("\n", 0, self.i) + 1) + 1
        raise ValueError(f"[grammar] line {line}, column {col}: {msg}")

    def space(self, newlines: bool):
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == "#":
                while self.i < len(s) and s[self.i] not in "\r\n":
                    self.i += 1
            elif c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            else:
                break

    def name(self) -> str:
        j = self.i
        while self.i < len(self.s) and (self.s[self.i].isascii() and (self.s[self.i].isalnum() or self.s[self.i] in "-_")):
            self.i += 1
        if j == self.i:
            self.error("a rule name was expected")
        return self.s[j:self.i]

    def rule_id(self, name: str) -> int:
        if name not in self.names:
            self.names[name] = self.g.new_rule()
        return self.names[name]

    def char(self) -> int:
        """One (possibly escaped) character of a literal or class: its code point."""
        s = self.s
        if self.i >= len(s):
            self.error("unexpected end of grammar")
        c = s[self.i]
        self.i += 1
        if c != "\\":
            return ord(c)
        if self.i >= len(s):
            self.error("unexpected end of grammar after \\")
        e = s[self.i]
        self.i += 1
        simple = {"n": 10, "r": 13, "t": 9, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45, "^": 94, "'": 39,
                  "/": 47}
        if e in simple:
            return simple[e]
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        if width is None:
            self.error(f"unknown escape \\{e}")
        h = s[self.i:self.i + width]
        if len(h) != width or any(ch not in "0123456789abcdefABCDEF" for ch in h):
            self.error(f"\\{e} needs {width} hex digits")
        self.i += width
        v = int(h, 16)
        if v > _MAX_CP:
            self.error(f"\\{e}{h} is past Unicode")
        return v

    def primary(self) -> list:
        """One term: elements to splice into a sequence."""
        s, g = self.s, self.g
        c = s[self.i]
        if c == '"':
            self.i += 1
            data = bytearray()
            while not self.closing('"', "literal"):
                cp = self.char()
                if _SURROGATES[0] <= cp <= _SURROGATES[1]:
                    self.error("a surrogate code point in a literal")
                data += chr(cp).encode("utf-8")
            return lit(bytes(data))
        if c == "[":
            self.i += 1
            neg = self.i < len(s) and s[self.i] == "^"
            if neg:
                self.i += 1
            ranges = []
            while not self.closing("]", "character class"):
                lo = self.char()
                hi = lo
                if self.i + 1 < len(s) and s[self.i] == "-" and s[self.i + 1] != "]":
                    self.i += 1
                    hi = self.char()
                    if hi < lo:
                        self.error(f"range {chr(lo)!r}-{chr(hi)!r} is backwards")
                ranges.append((lo, hi))
            ranges = _complement(ranges) if neg else _normalize(ranges)
            if not ranges:
                self.error("a character class that matches nothing")
            alts = _cp_ranges_elements(ranges)
            return alts[0] if len(alts) == 1 else ref(g.rule(*alts))
        if c == ".":
            self.i += 1
            return ref(g.rule(*_cp_ranges_elements([(0, _MAX_CP)])))
        if c == "(":
            self.i += 1
            self.space(True)
            r = g.new_rule()
            g.set_rule(r, self.alternatives(nested=True))
            self.space(True)
            if self.i >= len(s) or s[self.i] != ")":
                self.error("expected ')'")
            self.i += 1
            return ref(r)
        if c.isascii() and (c.isalnum() or c in "-_"):
            return ref(self.rule_id(self.name()))
        self.error(f"unexpected {c!r}")

    def repeat_count(self) -> tuple:
        s = self.s
        self.i += 1                         # {
        self.space(False)

        def number():
            j = self.i
            while self.i < len(s) and s[self.i].isdigit():
                self.i += 1
            return int(s[j:self.i]) if self.i > j else None

        lo = number()
        if lo is None:
            self.error("expected a number after '{'")
        hi = lo
        self.space(False)
        if self.i < len(s) and s[self.i] == ",":
            self.i += 1
            self.space(False)
            hi = number()                   # None: unbounded
        self.space(False)
        if self.i >= len(s) or s[self.i] != "}":
            self.error("expected '}'")
        self.i += 1
        if (hi is not None and hi < lo) or lo > _MAX_LEN or (hi or 0) > _MAX_LEN:
            self.error(f"bad repetition {{{lo},{'' if hi is None else hi}}} (at most {_MAX_LEN})")
        return lo, hi

    def sequence(self, nested: bool) -> list:
        out: list = []
        s = self.s
        while True:
            self.space(nested)
            if self.i >= len(s) or s[self.i] in "|)\r\n":
                return out
            term = self.primary()
            self.space(nested)
            while self.i < len(s) and s[self.i] in "*+?{":
                op = s[self.i]
                if op == "{":
                    lo, hi = self.repeat_count()
                else:
                    self.i += 1
                    lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[op]
                term = ref(self.g.repeat(term, lo, hi))
                self.space(nested)
            out += term

    def alternatives(self, nested: bool) -> list:
        alts = [self.sequence(nested)]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            self.space(True)
            alts.append(self.sequence(nested))
        return alts

    def parse(self) -> Grammar:
        s = self.s
        self.space(True)
        while self.i < len(s):
            name = self.name()
            self.space(False)
            if not s.startswith("::=", self.i):
                self.error(f"expected '::=' after {name!r}")
            self.i += 3
            self.space(True)
            r = self.rule_id(name)
            if name in self.defined:
                self.error(f"rule {name!r} is defined twice")
            self.defined.add(name)
            self.g.set_rule(r, self.alternatives(nested=False))
            self.space(False)
            if self.i < len(s) and s[self.i] not in "\r\n":
                self.error(f"unexpected {s[self.i]!r}")
            self.space(True)
        undefined = sorted(set(self.names) - self.defined)
        if undefined:
            raise ValueError(f"[grammar] undefined rule(s): {', '.join(undefined)}")
        if "root" not in self.names:
            raise ValueError("[grammar] no rule named 'root'")
        self.g.root = self.names["root"]
        check_left_recursion(self.g)
        return self.g


def gbnf_grammar(text: str) -> Grammar:
    """The Grammar of GBNF `text` (llama.cpp's format: `name ::= ...` rules, root `root`;
    literals, [classes] with ranges and ^, `.`, groups, `*` `+` `?` `{m}` `{m,}` `{m,n}` (n up
    to 4096), `#` comments; Unicode classes match UTF-8 byte sequences; not llama.cpp's token
    terms `<[id]>` / `<token>`). ValueError with the line and column of a syntax error, for an
    undefined rule, a missing root, left recursion or a grammar past the size limits."""
    if not isinstance(text, str):
        raise ValueError(f"[grammar] a grammar is GBNF text, got {type(text).__name__}")
    try:
        return _GbnfParser(text).parse()
    except RecursionError:
        raise ValueError("[grammar] the grammar is nested too deeply") from None
