"""JSON Schema -> grammar (llmrt.grammar), checked against the `jsonschema` package's validator
(a reference nobody here wrote): every text the grammar accepts is one JSON value the schema
validates (for random instances and texts one edit away from them), every instance written in
the schema's property order is accepted, and the any-value grammar agrees with Python's json
parser. Plus the recognizer's own contracts: done / can_end, left recursion refused, unsupported
keywords named."""
import json
import re

import numpy as np
import pytest

from llmrt.grammar import GrammarState, gbnf_grammar, schema_grammar

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a test extra (pip install -e .[test])")

NODE = {"type": "object", "properties": {"v": {"type": "integer"},
                                         "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["v"]}
SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8}, "age": {"type": "integer"},
        "height": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "pet": {"anyOf": [{"type": "null"}, {"enum": ["cat", "dog", 3, [1, 2]]}]}, "ok": {"type": ["boolean", "null"]}},
        "required": ["name", "age"]},
    "extra": {"type": "object", "properties": {"id": {"const": 7}}, "required": ["id"],
              "additionalProperties": {"type": "integer"}},
    "map": {"type": "object", "additionalProperties": {"type": "boolean"}},
    "tree": {"$defs": {"node": NODE}, "$ref": "#/$defs/node"},
    "list": {"type": "array", "items": {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]}, "maxItems": 4},
    "any": {},
    "string": {"type": "string", "minLength": 2, "maxLength": 4},
}


def instance(s, rng, root, depth=0):
    """A random value `s` validates, written with the schema's property order in mind."""
    if s is True or s == {}:
        return [1, "x", None, {"k": [True]}, -2.5][rng.integers(0, 5)]
    if "$ref" in s:
        return instance(root["$defs"][s["$ref"].split("/")[-1]], rng, root, depth + 1)
    if "const" in s:
        return s["const"]
    if "enum" in s:
        return s["enum"][rng.integers(0, len(s["enum"]))]
    for k in ("anyOf", "oneOf"):
        if k in s:
            return instance(s[k][rng.integers(0, len(s[k]))], rng, root, depth)
    t = s.get("type", "object")
    if isinstance(t, list):
        t = t[rng.integers(0, len(t))]
    if t == "integer":
        return int(rng.integers(-10 ** 6, 10 ** 6))
    if t == "number":
        return float(np.round(rng.normal() * 10.0 ** rng.integers(-5, 5), 6))   # (<= 16 digits a part)
    if t == "boolean":
        return bool(rng.integers(0, 2))
    if t == "null":
        return None
    if t == "string":
        n = int(rng.integers(s.get("minLength", 0), s.get("maxLength", 6) + 1))
        return "".join(rng.choice(list('ab "\\\n/x'), n))       # (one byte each: lengths are bytes)
    if t == "array":
        hi = s.get("maxItems", 3) if depth < 3 else s.get("minItems", 0)
        n = int(rng.integers(s.get("minItems", 0), hi + 1))
        return [instance(s.get("items", {}), rng, root, depth + 1) for _ in range(n)]
    props = s.get("properties")
    if props is None:
        ev = s.get("additionalProperties", True)
        return {f"k{i}": instance(ev if ev is not True else {}, rng, root, depth + 1) for i in range(rng.integers(0, 3))}
    out = {k: instance(v, rng, root, depth + 1) for k, v in props.items()
           if k in s.get("required", []) or rng.integers(0, 2)}
    if isinstance(s.get("additionalProperties"), dict):
        for i in range(rng.integers(0, 2)):
            out[f"x{i}"] = instance(s["additionalProperties"], rng, root, depth + 1)
    return out


def accepts(schema, text: str) -> bool:
    st = GrammarState(schema_grammar(schema))
    return st.feed_bytes(text.encode("utf-8")) and st.can_end


def dumps(v, rng) -> str:
    sep = [(",", ":"), (", ", ": "), (" , ", " : ")][rng.integers(0, 3)]
    return json.dumps(v, separators=sep, ensure_ascii=bool(rng.integers(0, 2)))


@pytest.mark.parametrize("name", SCHEMAS)
def test_instances_are_accepted_and_edits_stay_sound(name, rng):
    schema = SCHEMAS[name]
    validator = jsonschema.Draft202012Validator(schema)
    alphabet = '{}[]",:0123456789-.etrufalsn x\\'
    n_edit_ok = 0
    for _ in range(60):
        v = instance(schema, rng, schema)
        assert validator.is_valid(v), v            # (the generator's own check)
        text = dumps(v, rng)
        assert accepts(schema, text), text
        for _ in range(15):
            i = int(rng.integers(0, len(text) + 1))
            c = alphabet[rng.integers(0, len(alphabet))]
            e = rng.integers(0, 3)
            t = text[:i] + c + text[i:] if e == 0 else text[:i] + c + text[i + 1:] if e == 1 else text[:i] + text[i + 1:]
            if accepts(schema, t):                 # sound: what it takes, the schema validates
                n_edit_ok += 1
                assert validator.is_valid(json.loads(t)), t
    assert n_edit_ok > 0


def test_any_value_agrees_with_the_json_parser(rng):
    """{} (any JSON value) against json.loads on random edits of random documents written with
    single spaces (the grammar's whitespace is llama.cpp's: none, a blank, or newlines + indent)."""
    alphabet = '{}[]",:0123456789-+.eEtrufalsn \\/ub'
    agree = 0
    for _ in range(200):
        doc = dumps(instance({"type": "array", "items": {}, "maxItems": 4}, rng, {}), rng)
        for _ in range(10):
            i = int(rng.integers(0, len(doc) + 1))
            c = alphabet[rng.integers(0, len(alphabet))]
            t = doc[:i] + c + doc[i:] if rng.integers(0, 2) else doc[:i] + doc[i + 1:]
            if not t or t != t.strip() or "  " in t:
                continue
            try:
                json.loads(t, parse_constant=lambda x: 1 / 0)
                ref = True
            except (ValueError, ZeroDivisionError):
                ref = False
            if ref and any(len(p) > 16 for p in re.findall(r"[0-9]+", t)):
                continue                            # (llama.cpp's grammar caps digits, as here)
            assert accepts({}, t) == ref, t
            agree += ref
    assert agree > 100


def test_done_and_can_end():
    st = GrammarState(schema_grammar({"type": "integer"}))
    assert st.feed_bytes(b"12") and st.can_end and not st.done          # more digits may follow
    st = GrammarState(schema_grammar({"type": "object"}))
    assert st.feed_bytes(b'{"a": [1]}') and st.done                       # nothing may follow
    st = GrammarState(schema_grammar({"enum": ["ab", "abc"]}))
    assert st.feed_bytes(b'"ab') and not st.can_end and st.feed(ord('"')) and st.done


def test_what_a_review_found_looser_than_the_schema_is_not():
    """Each of these texts validated nowhere but was accepted (jsonschema says no to all)."""
    cases = [
        ({"properties": {"a": {"type": "integer"}}, "additionalProperties": True}, ['{"a": "x"}', '{"a": 1, "a": "x"}']),
        ({"type": "string", "enum": ["a", 1]}, ["1"]),
        ({"type": "object", "required": ["a"]}, ["{}"]),
        ({"type": "string", "minLength": 2}, ['"\u00e9"', '"\\u00e9"', '"\\ud83d\\ude00"']),   # é, é, 😀
    ]
    for schema, texts in cases:
        for t in texts:
            assert not accepts(schema, t), (schema, t)
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(json.loads(t), schema)
    assert accepts({"properties": {"a": {"type": "integer"}}, "additionalProperties": True}, '{"a": 1, "b": "x"}')
    assert accepts({"type": "object", "required": ["a"]}, '{"a": [1]}')
    assert accepts({"type": "string", "enum": ["a", 1]}, '"a"')
    assert accepts({"type": "string", "minLength": 2}, '"\u00e9\u00e9"')


def test_ambiguous_grammars_are_an_error_not_a_hang():
    import time
    t0 = time.monotonic()
    st = GrammarState(gbnf_grammar('root ::= "x" root "y" | "x" root "z" | ""'))
    with pytest.raises(ValueError, match="too ambiguous"):
        st.feed_bytes(b"x" * 40)
    d = {"t": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/t"}},
                         {"type": "array", "items": {"$ref": "#/$defs/t"}, "minItems": 1}]}}
    st = GrammarState(schema_grammar({"$defs": d, "$ref": "#/$defs/t"}))
    with pytest.raises(ValueError, match="too ambiguous"):
        st.feed_bytes(b"[" * 40)
    with pytest.raises(ValueError, match="too ambiguous"):      # 2^20 readings before any byte
        gbnf_grammar("root ::= r0\n" + "".join(f'r{i} ::= r{i + 1} "a" | r{i + 1} "b"\n' for i in range(20))
                     + 'r20 ::= "c"\n').start()
    with pytest.raises(ValueError, match="grammar elements: too large"):
        schema_grammar({"const": [0] * 700000})
    assert time.monotonic() - t0 < 30
    st = GrammarState(gbnf_grammar("root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(3000))
                                   + 'r3000 ::= "a"\n'))       # a deep chain: no Python recursion
    assert st.feed_bytes(b"a") and st.done


def test_property_order_required_and_extra():
    s = SCHEMAS["person"]
    assert accepts(s, '{"name": "a", "age": 1}')
    assert not accepts(s, '{"age": 1, "name": "a"}')          # the schema's order, as llama.cpp
    assert not accepts(s, '{"name": "a"}')                    # required
    assert not accepts(s, '{"name": "a", "age": 1, "zzz": 1}')   # no additionalProperties: none
    assert not accepts(s, '{"name": "", "age": 1}')           # minLength
    assert not accepts(s, '{"name": "123456789", "age": 1}')  # maxLength
    assert not accepts(s, '{"name": "a", "age": 1.5}')        # integer
    assert accepts(SCHEMAS["extra"], '{"id": 7, "n": 3, "m": -1}') and not accepts(SCHEMAS["extra"], '{"id": 7, "n": "x"}')
    assert accepts(SCHEMAS["tree"], '{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]}')


@pytest.mark.parametrize("schema,needle", [
    ({"type": "string", "pattern": "^a"}, "pattern not supported"),
    ({"type": "integer", "minimum": 0}, "minimum not supported"),
    ({"type": "thing"}, "is not a JSON type"),
    ({"$ref": "#/$defs/missing"}, "names no definition"),
    ({"$ref": "http://x/y"}, "only #/$defs/NAME"),
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "left recursion"),
    ({"$defs": {"a": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}, "left recursion"),
    ({"type": "string", "enum": ["a"], "minLength": 2}, "enum beside minLength is not supported"),
    ({"$ref": "#/$defs/a", "type": "string", "$defs": {"a": {}}}, "$ref beside type is not supported"),
    ({"properties": {"a": {}}, "anyOf": [{"required": ["a"]}]}, "anyOf beside properties is not supported"),
    ({"allOf": [{"type": "integer"}], "type": "string"}, "allOf beside type is not supported"),
    ({"type": "integer", "const": "x"}, "no enum / const value is of type 'integer'"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "maxItems 2 < minItems 3"),
    ({"type": "string", "maxLength": 10 ** 6}, "more than this compiler takes"),
    ({"allOf": [{}, {}]}, "only a list of one schema"),
    ({"enum": []}, "non-empty list"),
    (False, "must be an object"),
])
def test_schemas_it_cannot_take_are_errors(schema, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        schema_grammar(schema)


def test_long_strings_keep_the_stacks_short():
    st = GrammarState(schema_grammar({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}))
    assert st.feed_bytes(b'{"s": "' + b"x" * 5000)
    assert max(len(x) for x in st.stacks) < 10
    assert st.feed_bytes(b'"}') and st.done


def test_a_schema_nested_too_deeply_is_an_error():
    s = {"type": "integer"}
    for _ in range(5000):
        s = {"type": "array", "items": s}
    with pytest.raises(ValueError, match="nested too deeply"):
        schema_grammar(s)


# ---- GBNF ------------------------------------------------------------------------------------------

def gbnf_accepts(text_grammar, s: str) -> bool:
    st = GrammarState(gbnf_grammar(text_grammar))
    return st.feed_bytes(s.encode("utf-8")) and st.can_end


ARITH = r"""
# integers with + - * / and parentheses, no unary signs
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= "0" | [1-9] [0-9]{0,5} | "(" expr ")"
"""


def python_arith(s: str) -> bool:
    """The reference: Python's own parser, keeping the expressions ARITH describes (binary
    operators on integer literals of at most 6 digits)."""
    import ast
    try:
        tree = ast.parse(s, mode="eval")
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, int) or len(str(node.value)) > 6:
                return False
        elif not isinstance(node, (ast.Expression, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div)):
            return False
    # (Python takes "00"; ARITH, as JSON, no leading zeros)
    return " " not in s and "_" not in s and not re.search(r"(?<![0-9])0[0-9]", s)


def test_gbnf_arithmetic_agrees_with_pythons_parser(rng):
    alphabet = list("0123456789+-*/()") + ["1", "2", "(", ")"]
    seen_ok = 0
    for _ in range(4000):
        s = "".join(rng.choice(alphabet, int(rng.integers(1, 10))))
        ref = python_arith(s)
        assert gbnf_accepts(ARITH, s) == ref, s
        seen_ok += ref
    assert seen_ok > 100


def test_gbnf_unicode_classes_match_code_points(rng):
    """[lo-hi] and [^lo-hi] compiled to UTF-8 byte sequences accept exactly the code points
    in (or out of) the range, one character each; a lone continuation byte or a surrogate never."""
    points = [0x41, 0x7F, 0x80, 0x7FF, 0x800, 0xFFF, 0x1000, 0xD7FF, 0xE000, 0xFFFD, 0xFFFF, 0x10000, 0x3FFFF,
              0x40000, 0x10FFFF]
    for _ in range(60):
        lo, hi = sorted(int(v) for v in rng.choice(points + list(rng.integers(0, 0x10FFFF, 4)), 2))
        if lo == hi or 0xD800 <= lo <= 0xDFFF or 0xD800 <= hi <= 0xDFFF:
            continue
        pos = gbnf_grammar(f"root ::= [\\U{lo:08X}-\\U{hi:08X}]")
        neg = gbnf_grammar(f"root ::= [^\\U{lo:08X}-\\U{hi:08X}]")
        probes = [lo, hi, lo - 1, hi + 1] + [int(v) for v in rng.integers(0, 0x110000, 40)]
        for cp in probes:
            if not 0 <= cp <= 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                continue
            b = chr(cp).encode("utf-8")
            for g, want in ((pos, lo <= cp <= hi), (neg, not lo <= cp <= hi)):
                st = GrammarState(g)
                assert (st.feed_bytes(b) and st.can_end) == want, (hex(lo), hex(hi), hex(cp))
    any_char = gbnf_grammar("root ::= .")
    for bad in (b"\x80", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf5\x80\x80\x80"):   # continuation, surrogate, overlong, > U+10FFFF
        st = GrammarState(any_char)
        assert not (st.feed_bytes(bad) and st.can_end), bad


@pytest.mark.parametrize("g,yes,no", [
    (r'root ::= "a"{2,3}', ["aa", "aaa"], ["a", "aaaa"]),
    (r'root ::= "a"{2,}', ["aa", "aaaaa"], ["a"]),
    (r'root ::= "a"{2}', ["aa"], ["a", "aaa"]),
    (r'root ::= "a"? "b"+ "c"*', ["b", "abbcc", "bc"], ["a", "ac", ""]),
    ('root ::= ( "x" |  # a group over two lines\n   "y" ) z\nz ::= "!"', ["x!", "y!"], ["x", "z!"]),
    (r'root ::= "\x41\u00e9\n\"\\"', ['A\u00e9\n"\\'], ["A"]),
    (r'root ::= [^a-z\n]+', ["ABC 12", "\u4e2d"], ["abc", "A\n"]),
])
def test_gbnf_constructs(g, yes, no):
    for s in yes:
        assert gbnf_accepts(g, s), (g, s)
    for s in no:
        assert not gbnf_accepts(g, s), (g, s)


@pytest.mark.parametrize("g,needle", [
    ('root ::= x', "undefined rule(s): x"),
    ('start ::= "a"', "no rule named 'root'"),
    ('root ::= root "a"', "left recursion"),
    ('root ::= a\na ::= "b"? root', "left recursion"),
    ('root ::= "a" )', "line 1, column 14: unexpected ')'"),
    ('root ::= "a"\nroot ::= "b"', "line 2, column 10: rule 'root' is defined twice"),
    ('root ::= [z-a]', "is backwards"),
    ('root ::= "\\q"', "unknown escape \\q"),
    ('root ::= "ab', "unterminated literal"),
    ('root ::= [ab', "unterminated character class"),
    ('root ::= "a"{3,1}', "bad repetition"),
    ('root ::= "a"{99999}', "bad repetition"),
    ('root = "a"', "expected '::='"),
    ('root ::= [^\\x00-\\U0010FFFF]', "matches nothing"),
    ('root ::= ' + "(" * 3000 + '"a"' + ")" * 3000, "nested too deeply"),
])
def test_gbnf_errors(g, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        gbnf_grammar(g)
