"""POST /v1/messages (the Anthropic Messages API) with the official
`anthropic` client: text, system, thinking blocks, tools, stop reasons,
streaming events, count_tokens, its error shape and x-api-key. Texts are
compared with the same request through /v1/chat/completions (greedy)."""

import json

import anthropic
import pytest

from test_openai_client import ARGS, CALL, TOOLS

ATOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
           "input_schema": t["function"]["parameters"]} for t in TOOLS]
GREEDY = {"ignore_eos": True, "temperature": 0}  # (this client version takes temperature only in the body)


def forced(text, **kw):
    return dict({"lilac_forced_output": text}, **kw)


@pytest.fixture(scope="module")
def ant(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def test_text_equals_chat(ant, client):
    chat = client.chat.completions.create(model="m", messages=[{"role": "system", "content": "Be brief."},
                                                               {"role": "user", "content": "Hello"}],
                                          temperature=0, max_tokens=10,
                                          extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}})
    for system in ("Be brief.", [{"type": "text", "text": "Be brief."}]):
        m = ant.messages.create(model="m", system=system, messages=[{"role": "user", "content": "Hello"}], max_tokens=10,
                                extra_body=GREEDY)
        assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
        assert [b.type for b in m.content] == ["text"] and m.content[0].text == chat.choices[0].message.content
        assert m.stop_reason == "max_tokens" and m.stop_sequence is None
        u = m.usage
        assert u.input_tokens + u.cache_read_input_tokens == chat.usage.prompt_tokens and u.output_tokens == 10


def test_thinking_blocks(ant, client):
    msgs = [{"role": "user", "content": "Hello"}]
    chat = client.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=10, extra_body=GREEDY)
    m = ant.messages.create(model="m", messages=msgs, max_tokens=10,
                            thinking={"type": "enabled", "budget_tokens": 1024}, extra_body=GREEDY)
    assert m.content[0].type == "thinking" and m.content[0].thinking == chat.choices[0].message.reasoning_content
    m = ant.messages.create(model="m", messages=msgs, max_tokens=50, thinking={"type": "enabled", "budget_tokens": 1024},
                            extra_body=forced("Let me see.\n</think>\n\nHi!"))
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking.strip() == "Let me see." and m.content[1].text == "Hi!" and m.stop_reason == "end_turn"


def test_tool_use_and_result(ant, http):
    m = ant.messages.create(model="m", messages=[{"role": "user", "content": "Weather?"}], tools=ATOOLS,
                            tool_choice={"type": "auto"}, max_tokens=300, extra_body=forced("Checking. " + CALL))
    assert m.stop_reason == "tool_use"
    assert [b.type for b in m.content] == ["text", "tool_use"] and m.content[0].text == "Checking."
    tu = m.content[1]
    assert tu.name == "get_weather" and tu.input == ARGS and tu.id.startswith("toolu_")
    # the tool_use / tool_result turn renders exactly as the chat equivalent
    body = {"messages": [{"role": "user", "content": "Weather?"},
                         {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                                           {"type": "tool_use", "id": tu.id, "name": tu.name,
                                                            "input": tu.input}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id,
                                                       "content": [{"type": "text", "text": "sunny"}]}]}],
            "tools": ATOOLS}
    chat = {"messages": [{"role": "user", "content": "Weather?"},
                         {"role": "assistant", "content": "Checking.", "tool_calls": [
                             {"id": tu.id, "type": "function", "function": {"name": tu.name, "arguments": tu.input}}]},
                         {"role": "tool", "tool_call_id": tu.id, "content": "sunny"}],
            "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}}
    n = ant.messages.count_tokens(model="m", **body).input_tokens
    assert n == http.post("/tokenize", json=chat).json()["count"]
    m2 = ant.messages.create(model="m", max_tokens=3, extra_body=GREEDY, **body)
    assert m2.usage.input_tokens + m2.usage.cache_read_input_tokens == n


def test_stop_sequence(ant):
    m = ant.messages.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=50,
                            stop_sequences=["END", "!"], extra_body=forced("abc def! ghi"))
    assert m.content[0].text == "abc def" and m.stop_reason == "stop_sequence" and m.stop_sequence == "!"


def test_stream_events(ant):
    out = "Plan.\n</think>\n\nOK. " + CALL
    kw = dict(model="m", messages=[{"role": "user", "content": "Weather?"}], tools=ATOOLS, max_tokens=300,
              thinking={"type": "enabled", "budget_tokens": 1024}, extra_body=forced(out))
    with ant.messages.stream(**kw) as s:
        events = list(s)
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[1].text == "OK." and final.content[2].input == ARGS and final.stop_reason == "tool_use"
    raw = [e.type for e in ant.messages.create(stream=True, **kw)]
    assert raw[0] == "message_start" and raw[-2:] == ["message_delta", "message_stop"]
    assert raw.count("content_block_start") == 3 == raw.count("content_block_stop")
    deltas = {e.delta.type for e in events if e.type == "content_block_delta"}
    assert {"thinking_delta", "text_delta", "input_json_delta"} <= deltas
    (md,) = [e for e in ant.messages.create(stream=True, **kw) if e.type == "message_delta"]
    assert md.delta.stop_reason == "tool_use" and md.usage.output_tokens == final.usage.output_tokens


def test_stream_text_greedy_equals_nonstream(ant):
    kw = dict(model="m", messages=[{"role": "user", "content": "Hello"}], max_tokens=12, extra_body=GREEDY)
    whole = ant.messages.create(**kw)
    with ant.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == whole.content[0].text and final.stop_reason == "max_tokens"


def test_errors_have_anthropic_shape(ant, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        ant.post("/v1/messages", body={"model": "m", "messages": [{"role": "user", "content": "x"}]}, cast_to=object)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        ant.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    assert "text-only" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        ant.messages.create(model="m", max_tokens=5000, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "invalid_request_error" and "2048" in e.value.body["error"]["message"]


def test_api_key_headers(keyed_server):
    good = anthropic.Anthropic(base_url=keyed_server.url, api_key="sekret-key", max_retries=0)
    m = good.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "x"}], extra_body=GREEDY)
    assert m.usage.output_tokens == 2
    bad = anthropic.Anthropic(base_url=keyed_server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert e.value.body == {"type": "error", "error": {"type": "authentication_error", "message": "Invalid API Key"}}
