"""`lilac serve` against the official `openai` Python client (demo model, CPU)."""

import json

import openai
import pytest

USER = [{"role": "user", "content": "Hello, how are you?"}]


def honours_max_tokens(n_tokens, finish, n):
    """max_tokens is honoured: a "length" finish used exactly n tokens, a "stop" fewer."""
    assert finish in ("stop", "length"), finish
    assert (n_tokens == n) if finish == "length" else (0 <= n_tokens < n), (n_tokens, finish, n)


NOTHINK = {"chat_template_kwargs": {"enable_thinking": False}}


def forced(text, **kw):
    body = {"lilac_forced_output": text}
    body.update(kw)
    return body


def test_models_list(client):
    models = client.models.list()
    assert len(models.data) == 1
    m = models.data[0]
    assert m.id and m.object == "model"
    extra = m.model_extra
    assert extra["max_model_len"] == 2048 and extra["context_length"] == 2048


def test_chat_basic(client):
    r = client.chat.completions.create(model="anything-goes", messages=USER, max_tokens=12, seed=1)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == "anything-goes"
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant"
    assert c.finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 0
    honours_max_tokens(u.completion_tokens, c.finish_reason, 12)
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= 0
    t = r.model_extra["timings"]
    assert t["prompt_n"] + t["cache_n"] == u.prompt_tokens and t["predicted_n"] == u.completion_tokens


def test_chat_stream(client):
    stream = client.chat.completions.create(model="m", messages=USER, max_tokens=10, stream=True, seed=3,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason in ("stop", "length")
    last = chunks[-1]
    assert last.choices == []
    honours_max_tokens(last.usage.completion_tokens, finish[0].choices[0].finish_reason, 10)
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_equals_nonstream_greedy(client):
    kw = dict(model="m", messages=USER, max_tokens=16, temperature=0, extra_body=NOTHINK)
    a = client.chat.completions.create(**kw)
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw) if c.choices)
    assert text == a.choices[0].message.content


def test_max_tokens_length(client):
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=3, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    r = client.chat.completions.create(model="m", messages=USER, max_completion_tokens=2, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 2


@pytest.mark.parametrize("temperature", [0.0, 1.0, 1.5])
def test_seed_reproducible(client, temperature):
    kw = dict(model="m", messages=USER, max_tokens=24, seed=1234, temperature=temperature, extra_body={"ignore_eos": True})
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.reasoning_content == b.choices[0].message.reasoning_content
    assert a.choices[0].message.content == b.choices[0].message.content


def test_seeds_differ(client):
    outs = set()
    for seed in range(4):
        r = client.chat.completions.create(model="m", messages=USER, max_tokens=24, seed=seed, temperature=1.0,
                                           extra_body={"ignore_eos": True, "top_k": 0, "top_p": 1.0})
        outs.add((r.choices[0].message.reasoning_content, r.choices[0].message.content))
    assert len(outs) > 1


def test_sampling_params_accepted(client):
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=8, temperature=0.7, top_p=0.9,
                                       presence_penalty=0.5, frequency_penalty=0.5, seed=5,
                                       extra_body={"top_k": 10, "min_p": 0.05, "repetition_penalty": 1.1},
                                       user="someone", metadata={"a": "b"})
    honours_max_tokens(r.usage.completion_tokens, r.choices[0].finish_reason, 8)


def test_logprobs(client):
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=6, logprobs=True, top_logprobs=3,
                                       seed=7, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs.content
    assert len(lp) == 6
    for t in lp:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        tops = [x.logprob for x in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert t.logprob <= tops[0] + 1e-6
        assert isinstance(t.bytes, list)


def test_logprobs_greedy_is_top(client):
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=5, logprobs=True, top_logprobs=1,
                                       temperature=0, extra_body={"ignore_eos": True})
    for t in r.choices[0].logprobs.content:
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob, abs=1e-6)
        assert t.top_logprobs[0].bytes == t.bytes


def test_logprobs_stream(client):
    chunks = list(client.chat.completions.create(model="m", messages=USER, max_tokens=5, logprobs=True, top_logprobs=2,
                                                 stream=True, seed=1, extra_body={"ignore_eos": True}))
    n = sum(len(c.choices[0].logprobs.content) for c in chunks if c.choices and c.choices[0].logprobs)
    assert n == 5


def test_stop_string(client):
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=50, stop=["STOP"],
                                       extra_body=forced("Hello world, this is fine. STOP and more text", **NOTHINK))
    assert r.choices[0].message.content == "Hello world, this is fine."
    assert r.choices[0].finish_reason == "stop"


def test_stop_string_stream_held_back(client):
    chunks = list(client.chat.completions.create(
        model="m", messages=USER, max_tokens=50, stop=["is fi", "zzz"], stream=True,
        extra_body=forced("Hello world, this is fine. more", **NOTHINK)))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == "Hello world, this"
    assert not any("is f" in p for p in pieces)


def test_stop_single_string_and_exact_output(client):
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=50, stop="\n",
                                       extra_body=forced("line one\nline two", **NOTHINK))
    assert r.choices[0].message.content == "line one"


def test_forced_output_exact(client):
    text = "Ünïcödé ✓ — 日本語 text, emoji 🎉 and \"quotes\" \\ backslash"
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=200, extra_body=forced(text, **NOTHINK))
    assert r.choices[0].message.content == text
    s = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="m", messages=USER, max_tokens=200, stream=True, extra_body=forced(text, **NOTHINK)) if c.choices)
    assert s == text


def test_reasoning_split(client):
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=100,
                                       extra_body=forced("Let me think about it.\n</think>\n\nThe answer is 4."))
    m = r.choices[0].message
    assert m.reasoning_content.strip() == "Let me think about it."
    assert m.content == "The answer is 4."


def test_reasoning_split_stream(client):
    chunks = list(client.chat.completions.create(
        model="m", messages=USER, max_tokens=100, stream=True,
        extra_body=forced("Let me think about it.\n</think>\n\nThe answer is 4.")))
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning.strip() == "Let me think about it."
    assert content == "The answer is 4."
    assert "</think>" not in reasoning + content


def test_reasoning_truncated_is_all_reasoning(client):
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=100, extra_body=forced("still thinking"))
    assert r.choices[0].message.reasoning_content == "still thinking"
    assert not r.choices[0].message.content


def test_thinking_off_is_all_content(client):
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=100,
                                       extra_body=forced("Plain answer.", **NOTHINK))
    assert r.choices[0].message.content == "Plain answer."
    assert getattr(r.choices[0].message, "reasoning_content", None) is None


def test_reasoning_effort_none_disables_thinking(client, http):
    body = {"messages": USER, "reasoning_effort": "none"}
    on = http.post("/apply-template", json={"messages": USER}).json()["prompt"]
    off = http.post("/apply-template", json=body).json()["prompt"]
    assert on.endswith("<think>\n") and off.endswith("<think>\n\n</think>\n\n")


TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
            "scale": {"type": "number"}, "tags": {"type": "array"}, "opts": {"type": "object"}},
            "required": ["city"]},
    },
}]

CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "<parameter=metric>\ntrue\n</parameter>\n<parameter=scale>\n1.5\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n"
        "</parameter>\n<parameter=opts>\n{\"x\": 1}\n</parameter>\n</function>\n</tool_call>")
ARGS = {"city": "Paris", "days": 3, "metric": True, "scale": 1.5, "tags": ["a", "b"], "opts": {"x": 1}}


def test_tool_call(client):
    r = client.chat.completions.create(model="m", messages=USER, tools=TOOLS, max_tokens=200,
                                       extra_body=forced(CALL, **NOTHINK))
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content is None
    (tc,) = c.message.tool_calls
    assert tc.type == "function" and tc.id.startswith("call_")
    assert tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments) == ARGS


def test_tool_call_after_thinking_and_two_calls(client):
    out = "I should call it.\n</think>\n\n" + CALL + "\n" + CALL.replace("Paris", "Rome")
    r = client.chat.completions.create(model="m", messages=USER, tools=TOOLS, max_tokens=400, extra_body=forced(out))
    m = r.choices[0].message
    assert m.reasoning_content.strip() == "I should call it."
    assert [json.loads(t.function.arguments)["city"] for t in m.tool_calls] == ["Paris", "Rome"]
    assert len({t.id for t in m.tool_calls}) == 2


def test_tool_call_stream(client):
    chunks = list(client.chat.completions.create(model="m", messages=USER, tools=TOOLS, max_tokens=200, stream=True,
                                                 extra_body=forced("Sure. " + CALL, **NOTHINK)))
    calls = {}
    content = ""
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            e = calls.setdefault(tc.index, {"id": None, "name": None, "args": ""})
            if tc.id:
                e["id"] = tc.id
            if tc.function and tc.function.name:
                e["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                e["args"] += tc.function.arguments
    assert content == "Sure."
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["args"]) == ARGS
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_tool_value_not_matching_type_stays_string(client):
    call = CALL.replace("\n3\n", "\nthree\n")
    r = client.chat.completions.create(model="m", messages=USER, tools=TOOLS, max_tokens=200,
                                       extra_body=forced(call, **NOTHINK))
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments)["days"] == "three"


def test_tool_call_text_without_tools_is_content(client):
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=200, extra_body=forced(CALL, **NOTHINK))
    assert r.choices[0].message.tool_calls is None
    assert "<function=get_weather>" in r.choices[0].message.content


def test_tool_roundtrip_messages(client):
    msgs = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=5, tool_choice="auto")
    assert r.usage.prompt_tokens > 20


def test_content_parts_and_roles(client):
    msgs = [{"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": " there"}]},
            {"role": "assistant", "content": "Hi!", "reasoning_content": "greeting"},
            {"role": "user", "content": "Again"}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=4)
    honours_max_tokens(r.usage.completion_tokens, r.choices[0].finish_reason, 4)


def test_completions(client):
    r = client.completions.create(model="m", prompt="The weather in Paris", max_tokens=8, seed=2)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert isinstance(r.choices[0].text, str)
    honours_max_tokens(r.usage.completion_tokens, r.choices[0].finish_reason, 8)
    chunks = list(client.completions.create(model="m", prompt="The weather", max_tokens=5, stream=True, seed=2,
                                            stream_options={"include_usage": True}))
    fin = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(fin) == 1
    honours_max_tokens(chunks[-1].usage.completion_tokens, fin[0], 5)
    assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 1


def test_completions_logprobs_and_ids(client):
    r = client.completions.create(model="m", prompt=[1, 2, 3, 4], max_tokens=4, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.token_logprobs) == 4 and all(len(t) <= 2 for t in lp.top_logprobs)
    assert r.usage.prompt_tokens == 4


def test_completions_forced_stop(client):
    r = client.completions.create(model="m", prompt="x", max_tokens=50, stop=["!"],
                                  extra_body={"lilac_forced_output": "abc def! ghi"})
    assert r.choices[0].text == "abc def" and r.choices[0].finish_reason == "stop"


# ---- errors map to the client's exception classes ----

def test_error_n(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=USER, n=17)  # at most 16 choices
    assert e.value.body["param"] == "n"


def test_error_response_format(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=USER, response_format={"type": "json_object"})
    assert "response_format" in str(e.value)


def test_error_empty_messages(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[])
    assert e.value.body["param"] == "messages" and e.value.body["type"] == "invalid_request_error"


def test_error_bad_temperature(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=USER, temperature=-1)
    assert e.value.body["param"] == "temperature"


def test_error_template(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "system", "content": "only system"}])
    assert "No user query" in str(e.value)


def test_error_image_part(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])


def test_context_overflow(client):
    big = "word " * 3000
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": big}])
    b = e.value.body
    assert b["code"] == "context_length_exceeded" and b["type"] == "exceed_context_size_error"
    assert "maximum context length is 2048" in b["message"] and b["n_ctx"] == 2048
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=USER, max_tokens=5000)


def test_auth(keyed_server):
    bad = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="m", messages=USER, max_tokens=2)
    good = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="sekret-key", max_retries=0)
    r = good.chat.completions.create(model="m", messages=USER, max_tokens=2)
    honours_max_tokens(r.usage.completion_tokens, r.choices[0].finish_reason, 2)
    assert len(bad.models.list().data) == 1  # /v1/models is public, as llama.cpp


def test_stream_error_after_headers_is_apierror(client):
    # the 200 and headers go out before generation; an error afterwards arrives as data: {"error": ...}
    # (forced ids past the model's vocabulary cannot happen through text, so exercise the parse path)
    chunks = list(client.chat.completions.create(model="m", messages=USER, max_tokens=3, stream=True))
    assert chunks
