"""Structured output through `lilac serve` on the demo model, whose random
weights emit gibberish unless the constraint holds them: JSON schemas (the
constraint engine's schema suite, tests/constrain/schemas.py) validated with
the `jsonschema` package, forced tool calls whose arguments validate against
the tool's parameters, regexes, choices and GBNF grammars checked with
Python's `re`, and logit_bias as OpenAI documents it.

A random model under a mask keeps a free string going for hundreds of tokens
(few of its top candidates close it), so the open-ended cases add a
logit_bias towards the bytes that close strings and containers (`"`, `}`,
`]`, a newline then `<` in a tool call's raw text): it shortens the outputs,
while every byte that ends up in them is still only what the mask allows."""
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "constrain"))
from schemas import SCHEMAS  # noqa: E402

USER = [{"role": "user", "content": "Answer in the requested format."}]
NOTHINK = {"chat_template_kwargs": {"enable_thinking": False}}
MAX_TOKENS = 1300  # the demo server has 2048 positions


def validator(schema):
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def chat(client, seed=1, **kw):
    extra = dict(NOTHINK)
    extra.update(kw.pop("extra_body", {}))
    kw.setdefault("max_tokens", MAX_TOKENS if not kw.get("tools") else None)
    return client.chat.completions.create(model="m", messages=kw.pop("messages", USER), seed=seed, extra_body=extra, **kw)


@pytest.fixture(scope="module")
def client(server):
    """The suite's client with room to wait: 100+ schemas queue on one slot (under ASan too)."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def closers(http):
    """logit_bias that makes strings and containers end sooner."""
    out = {}
    for text, b in [('"', 6), ("}", 3), ("]", 3), ("\n", 5), ("<", 12)]:
        ids = http.post("/tokenize", json={"content": text, "add_special": False}).json()["tokens"]
        assert len(ids) == 1
        out[str(ids[0])] = b
    return out


def parallel(fn, items, workers=4):
    with ThreadPoolExecutor(workers) as ex:
        return list(ex.map(fn, items))


# ---- JSON schemas ------------------------------------------------------------------


@pytest.fixture(scope="module")
def schema_results(client, closers):
    def one(item):
        i, (name, schema) = item
        try:
            r = chat(client, seed=100 + i, logit_bias=closers, response_format={
                "type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}})
            return r.choices[0]
        except openai.APIError as e:
            return e

    return parallel(one, list(enumerate(SCHEMAS)))


def test_enough_schemas():
    assert len(SCHEMAS) >= 100


@pytest.mark.parametrize("idx", range(len(SCHEMAS)), ids=[n for n, _ in SCHEMAS])
def test_schema_completion_validates(schema_results, idx):
    name, schema = SCHEMAS[idx]
    ch = schema_results[idx]
    assert not isinstance(ch, Exception), f"{name}: {ch}"
    assert ch.finish_reason == "stop", f"{name}: {ch.finish_reason}: {ch.message.content!r}"
    doc = json.loads(ch.message.content)
    validator(schema).validate(doc)


def test_json_object_mode(client, closers):
    for seed in range(3):
        r = chat(client, seed=seed, logit_bias=closers, response_format={"type": "json_object"})
        assert r.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_schema_stream_and_n(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["ok", "n"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    chunks = list(chat(client, seed=3, stream=True, response_format=rf))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    validator(schema).validate(json.loads(text))
    r = chat(client, seed=4, n=3, temperature=1.0, response_format=rf)
    assert len(r.choices) == 3
    for ch in r.choices:
        validator(schema).validate(json.loads(ch.message.content))


@pytest.mark.parametrize("field", ["guided_json", "json_schema", "structured_outputs"])
def test_vllm_and_llamacpp_schema_fields(client, field):
    schema = {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 3}
    body = {"structured_outputs": {"json": schema}} if field == "structured_outputs" else {field: schema}
    r = chat(client, seed=5, extra_body=body)
    validator(schema).validate(json.loads(r.choices[0].message.content))


def test_guided_json_as_text(client):
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": False}
    r = chat(client, seed=6, extra_body={"guided_json": json.dumps(schema)})
    validator(schema).validate(json.loads(r.choices[0].message.content))


# ---- regex, choice, grammar ----------------------------------------------------------


REGEXES = [r"[a-c]{3}x", r"(GET|POST) /[a-z]{1,8}", r"\d{3}-\d{4}", r"[A-Z][a-z]{0,6}( [A-Z][a-z]{0,6})?", r"-?(0|[1-9][0-9]{0,5})\.[0-9]{2}"]


@pytest.mark.parametrize("regex", REGEXES)
def test_guided_regex(client, regex):
    for seed in range(3):
        r = chat(client, seed=seed, extra_body={"guided_regex": regex})
        assert r.choices[0].finish_reason == "stop"
        assert re.fullmatch(regex, r.choices[0].message.content), r.choices[0].message.content


def test_guided_choice(client):
    choices = ["yes", "no", "maybe later", "ja"]
    seen = set()
    for seed in range(8):
        r = chat(client, seed=seed, temperature=5.0, top_p=1.0, extra_body={"guided_choice": choices})
        assert r.choices[0].message.content in choices
        seen.add(r.choices[0].message.content)
    assert len(seen) >= 2  # a random model under the mask still draws among them


GBNF = r'''root ::= "(" expr ")"
expr ::= num (op num){0,3}
op ::= "+" | "-" | "*"
num ::= [1-9] [0-9]{0,2}
'''
GBNF_RE = r"\([1-9][0-9]{0,2}([-+*][1-9][0-9]{0,2}){0,3}\)"


@pytest.mark.parametrize("field", ["grammar", "guided_grammar"])
def test_gbnf_grammar(client, field):
    for seed in range(3):
        r = chat(client, seed=seed, extra_body={field: GBNF})
        assert re.fullmatch(GBNF_RE, r.choices[0].message.content), r.choices[0].message.content


def test_completions_endpoint_regex(client):
    r = client.completions.create(model="m", prompt="Phone:", max_tokens=60, seed=2, extra_body={"guided_regex": r"\+\d{2} \d{3} \d{4}"})
    assert re.fullmatch(r"\+\d{2} \d{3} \d{4}", r.choices[0].text), r.choices[0].text


def test_thinking_then_constrained_answer(client, http):
    """Reasoning streams unconstrained (here: </think> first, pushed by logit_bias, which the
    answer's grammar would refuse), then the answer follows the schema."""
    end = http.post("/tokenize", json={"content": "</think>", "with_pieces": False, "add_special": False}).json()["tokens"]
    assert len(end) == 1
    schema = {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"], "additionalProperties": False}
    r = client.chat.completions.create(
        model="m", messages=USER, max_tokens=MAX_TOKENS, seed=1, logit_bias={str(end[0]): 100},
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    m = r.choices[0].message
    assert (getattr(m, "reasoning_content", None) or "") == ""
    validator(schema).validate(json.loads(m.content))


# ---- forced tool calls ---------------------------------------------------------------


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "units": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "detailed": {"type": "boolean"}},
        "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {
            "query": {"type": "string", "maxLength": 40},
            "limit": {"type": ["integer", "null"], "minimum": 1, "maximum": 50},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "filters": {"type": "array", "items": {"type": "string", "enum": ["news", "blogs", "papers"]}, "maxItems": 3},
            "range": {"type": "object", "properties": {"from": {"type": "integer"}, "to": {"type": "integer"}},
                      "required": ["from", "to"], "additionalProperties": False},
            "mode": {"anyOf": [{"type": "string", "enum": ["fast", "deep"]}, {"type": "integer", "minimum": 0, "maximum": 3}]}},
        "required": ["query", "filters", "range", "mode"]}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
]
BY_NAME = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def check_calls(r, allowed):
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", (ch.finish_reason, ch.message)
    calls = ch.message.tool_calls
    assert calls and len(calls) == 1
    name = calls[0].function.name
    assert name in allowed
    validator(BY_NAME[name]).validate(json.loads(calls[0].function.arguments))
    return name


def test_tool_choice_required(client, closers):
    names = parallel(lambda seed: check_calls(chat(client, seed=seed, temperature=1.0, tools=TOOLS, tool_choice="required",
                                                   logit_bias=closers),
                                              set(BY_NAME)), range(8))
    assert len(set(names)) >= 2


@pytest.mark.parametrize("name", ["get_weather", "search", "ping"])
def test_tool_choice_named(client, closers, name):
    choice = {"type": "function", "function": {"name": name}}
    for name_got in parallel(lambda seed: check_calls(chat(client, seed=seed, tools=TOOLS, tool_choice=choice, logit_bias=closers),
                                                      {name}), range(3)):
        assert name_got == name


def test_tool_choice_named_stream(client, closers):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    chunks = list(chat(client, seed=9, stream=True, tools=TOOLS, tool_choice=choice, logit_bias=closers))
    args = "".join(tc.function.arguments or "" for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or []))
    validator(BY_NAME["get_weather"]).validate(json.loads(args))
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


# ---- logit_bias ----------------------------------------------------------------------


def token_id(http, text):
    ids = http.post("/tokenize", json={"content": text, "add_special": False}).json()["tokens"]
    assert len(ids) == 1, ids
    return ids[0]


def test_logit_bias_plus_100_always_chosen(client, http):
    tid = token_id(http, "t")
    for seed in range(3):
        r = chat(client, seed=seed, temperature=1.0, max_tokens=12, logprobs=True, logit_bias={str(tid): 100})
        toks = [t.token for t in r.choices[0].logprobs.content]
        assert toks == ["t"] * 12, toks


def test_logit_bias_minus_100_never_chosen(client, http):
    r = chat(client, temperature=0, max_tokens=1, logprobs=True)
    greedy = r.choices[0].logprobs.content[0]
    tid = token_id(http, bytes(greedy.bytes).decode())
    r = chat(client, temperature=0, max_tokens=24, logprobs=True, logit_bias={str(tid): -100})
    toks = [t.token for t in r.choices[0].logprobs.content]
    assert greedy.token not in toks, toks


@pytest.mark.parametrize("bias,msg", [({"5": 101}, "between -100 and 100"), ({"5": -100.5}, "between -100 and 100"),
                                      ({"abc": 1}, "not a token id"), ({"99999999": 1}, "outside the vocabulary"),
                                      ({"5": "x"}, "must be a number")])
def test_logit_bias_bad(http, bias, msg):
    r = http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2, "logit_bias": bias})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "logit_bias" and msg in err["message"], err


# ---- bad input -----------------------------------------------------------------------


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}},
     "response_format", ["$.properties.tags", "uniqueItems"]),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"$ref": "#/$defs/missing"}}}},
     "response_format", ["#/$defs/missing"]),
    ({"guided_json": {"type": "integer", "multipleOf": 3}}, "guided_json", ["multipleOf"]),
    ({"guided_regex": "(ab"}, "guided_regex", ["regex"]),
    ({"grammar": "root ::= undefined-rule"}, "grammar", ["undefined-rule"]),
    ({"guided_choice": []}, "guided_choice", ["non-empty"]),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", ["only one"]),
    ({"response_format": {"type": "yaml"}}, "response_format", ["yaml"]),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}},
                                                                             "$defs": {"X": {"type": "object"}}}}}],
      "tool_choice": "required"}, "tools", ["properties.x", "type"]),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice", ["only one"]),
]


@pytest.mark.parametrize("body,param,parts", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_constraint_400(http, body, param, parts):
    r = http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    for p in parts:
        assert p in err["message"], err


def test_grammar_cache_reuse_is_consistent(client):
    """The same schema twice (the second from the cache) with the same seed: the same output."""
    schema = {"type": "object", "properties": {"k": {"type": "string", "maxLength": 6}}, "required": ["k"]}
    rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    a = chat(client, seed=11, response_format=rf).choices[0].message.content
    b = chat(client, seed=11, response_format=rf).choices[0].message.content
    assert a == b
    validator(schema).validate(json.loads(a))
