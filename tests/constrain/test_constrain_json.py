"""Random completions under the token mask, for >= 100 JSON schemas, validated by
the `jsonschema` package; GBNF, regex and choice grammars checked with Python's
`re` or a checker written here. A completion picks random allowed tokens of the
real Qwen3 vocabulary until the end token is allowed and chosen (bounded)."""
import json
import re

import jsonschema
import pytest

from conftest import run_batch, texts
from schemas import SCHEMAS

N_SAMPLES = 4
MAX_TOKENS = 400


@pytest.fixture(scope="module")
def schema_results():
    return run_batch([("schema", json.dumps(s, ensure_ascii=False)) for _, s in SCHEMAS], N_SAMPLES, 7, MAX_TOKENS)


def test_enough_schemas():
    assert len(SCHEMAS) >= 100
    assert len({n for n, _ in SCHEMAS}) == len(SCHEMAS)


@pytest.mark.parametrize("idx", range(len(SCHEMAS)), ids=[n for n, _ in SCHEMAS])
def test_schema_completions_validate(schema_results, idx):
    name, schema = SCHEMAS[idx]
    res = schema_results[idx]
    assert "error" not in res, res.get("error")
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema)
    ended = 0
    for done, text, problem in texts(res):
        assert problem is None, f"{problem}: {text!r}"
        if not done:
            continue
        ended += 1
        doc = json.loads(text)
        errors = list(validator.iter_errors(doc))
        assert not errors, f"{text!r}: {errors[0].message}"
    assert ended >= 1, f"no completion finished within {MAX_TOKENS} tokens"


# ---- GBNF, regex, choice --------------------------------------------------------------

def balanced_arith(s):
    """expr ::= term (("+"|"-") term)*, term ::= [0-9]+ | "(" expr ")" — checked by hand."""
    pos = 0

    def term():
        nonlocal pos
        if pos < len(s) and s[pos] == "(":
            pos += 1
            if not expr() or pos >= len(s) or s[pos] != ")":
                return False
            pos += 1
            return True
        st = pos
        while pos < len(s) and s[pos].isdigit() and s[pos] in "0123456789":
            pos += 1
        return pos > st

    def expr():
        nonlocal pos
        if not term():
            return False
        while pos < len(s) and s[pos] in "+-":
            pos += 1
            if not term():
                return False
        return True

    return expr() and pos == len(s)


GBNF_CASES = [
    ("arith", 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]{1,4} | "(" expr ")"\n', balanced_arith),
    ("list", 'root ::= "[" item ("," item){0,4} "]"\nitem ::= "\\"" [a-z]{1,6} "\\""\n',
     lambda s: re.fullmatch(r'\[("[a-z]{1,6}")(,"[a-z]{1,6}"){0,4}\]', s)),
    ("yaml_like", 'root ::= line+\nline ::= key ": " value "\\n"\nkey ::= [a-z_]{1,10}\nvalue ::= [0-9]{1,5} | "true" | "false" | "\\"" [^"\\n]{0,20} "\\""\n',
     lambda s: re.fullmatch(r'([a-z_]{1,10}: ([0-9]{1,5}|true|false|"[^"\n]{0,20}")\n)+', s)),
    ("unicode", 'root ::= [\\u4e00-\\u9fff]{2,5} ("。" | "！")\n', lambda s: re.fullmatch(r"[\u4e00-\u9fff]{2,5}[。！]", s)),
    ("negclass", 'root ::= "<" [^<>]* ">" ("<" [^<>]* ">")?\n', lambda s: re.fullmatch(r"<[^<>]*>(<[^<>]*>)?", s)),
    ("tool_call", 'root ::= "<tool_call>\\n{\\"name\\": \\"" name "\\", \\"arguments\\": {}}\\n</tool_call>"\nname ::= "get_weather" | "search"\n',
     lambda s: re.fullmatch(r'<tool_call>\n\{"name": "(get_weather|search)", "arguments": \{\}\}\n</tool_call>', s)),
    ("any_dot", 'root ::= "x" .{3} "y"\n', lambda s: re.fullmatch(r"x.{3}y", s, re.S)),
]

REGEX_CASES = [
    r"\d{3}-\d{4}", r"[A-Z][a-z]+ [A-Z][a-z]+", r"(true|false)", r"[a-z0-9._%+-]{1,12}@[a-z0-9-]{1,10}\.(com|org)",
    r"#?[0-9a-f]{6}", r"(ab|cd)*e", r"\w{2,5}\s\w{2,5}", r"[^\s]{1,8}", r"-?(0|[1-9]\d{0,5})(\.\d{1,3})?", r"(\d{1,3}\.){3}\d{1,3}",
    r"[\u00e0-\u00ff]{1,3}x?", r"https?://[a-z]{1,10}\.com(/[a-z]{1,5}){0,2}", r"\[(\d,){0,3}\d\]", r"a{2}b{0,2}c+?",
]

CHOICES = [["yes", "no"], ["Paris", "London", "Lond", "Londonderry"], ["😀", "😃 happy", "sad"], ["a", "b", "c", "d", "e", "f"]]


@pytest.fixture(scope="module")
def other_results():
    cases = [("gbnf", g) for _, g, _ in GBNF_CASES] + [("regex", r) for r in REGEX_CASES] + \
            [("choice", json.dumps(c, ensure_ascii=False)) for c in CHOICES]
    return run_batch(cases, 6, 11, 200)


def check_samples(res, accept):
    assert "error" not in res, res.get("error")
    ended = 0
    for done, text, problem in texts(res):
        assert problem is None, f"{problem}: {text!r}"
        if done:
            ended += 1
            assert accept(text), repr(text)
    assert ended >= 1


@pytest.mark.parametrize("idx", range(len(GBNF_CASES)), ids=[n for n, _, _ in GBNF_CASES])
def test_gbnf(other_results, idx):
    check_samples(other_results[idx], GBNF_CASES[idx][2])


@pytest.mark.parametrize("idx", range(len(REGEX_CASES)))
def test_regex(other_results, idx):
    pat = re.compile(REGEX_CASES[idx])
    check_samples(other_results[len(GBNF_CASES) + idx], lambda s: pat.fullmatch(s))


@pytest.mark.parametrize("idx", range(len(CHOICES)))
def test_choice(other_results, idx):
    c = CHOICES[idx]
    check_samples(other_results[len(GBNF_CASES) + len(REGEX_CASES) + idx], lambda s: s in c)


# ---- Refusals: clear messages with the JSON path -----------------------------------------

BAD_SCHEMAS = [
    ({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}, "$.properties.tags.uniqueItems"),
    ({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 5}}}, "$.properties.n.multipleOf"),
    ({"$defs": {"x": {"not": {"type": "string"}}}, "$ref": "#/$defs/x"}, "$.$defs.x.not"),
    ({"type": "strng"}, "unknown type 'strng'"),
    ({"anyOf": [{"type": "string", "pattern": "(?<=a)b"}]}, "$.anyOf[0].pattern"),
    ({"type": "object", "minProperties": 2}, "$.minProperties"),
    ({"$ref": "#/definitions/nope"}, "points to nothing"),
    ({"items": {"if": {"type": "string"}}}, "$.items.if"),
    ({"type": "string", "anyOf": [{"maxLength": 3}, {"pattern": "^x"}]}, "$.type: 'type' beside 'anyOf'"),
    ({"$ref": "#/$defs/a", "maxLength": 2, "$defs": {"a": {"type": "string"}}}, "$.maxLength"),
    ({"type": "integer", "enum": ["a", "b"]}, "$.enum: no value has the schema's type"),
]


@pytest.mark.parametrize("idx", range(len(BAD_SCHEMAS)))
def test_refusals_name_the_path(idx):
    schema, frag = BAD_SCHEMAS[idx]
    [res] = run_batch([("schema", json.dumps(schema))], 1, 1, 10)
    assert "error" in res and frag in res["error"], res
