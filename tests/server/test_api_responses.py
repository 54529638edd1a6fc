"""POST /v1/responses (the OpenAI Responses API) with the official `openai`
client: text, input items, tools, reasoning items, streaming events. Texts are
compared with the same request through /v1/chat/completions (greedy), and tool
calls and reasoning splits use the server's forced-output test hook."""

import json

import openai
import pytest

from test_openai_client import ARGS, CALL, TOOLS

RTOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
           "parameters": t["function"]["parameters"]} for t in TOOLS]
GREEDY = {"ignore_eos": True}


def forced(text, **kw):
    return dict({"lilac_forced_output": text}, **kw)


def test_text_equals_chat(client):
    kw = dict(model="m", temperature=0, max_tokens=10, extra_body=GREEDY)
    chat = client.chat.completions.create(messages=[{"role": "system", "content": "Be brief."},
                                                    {"role": "user", "content": "Hello"}], **kw)
    r = client.responses.create(model="m", instructions="Be brief.", input="Hello", temperature=0, max_output_tokens=10,
                                extra_body=GREEDY)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    kinds = [o.type for o in r.output]
    m = chat.choices[0].message
    if m.reasoning_content:
        assert kinds[0] == "reasoning" and r.output[0].content[0].text == m.reasoning_content
    assert r.output_text == (m.content or "")
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == 10
    assert r.usage.total_tokens == r.usage.input_tokens + 10
    assert r.instructions == "Be brief." and r.temperature == 0 and r.max_output_tokens == 10


def test_reasoning_item_and_message(client):
    r = client.responses.create(model="m", input="Hi", max_output_tokens=100,
                                extra_body=forced("Let me think.\n</think>\n\nHello there!"))
    assert r.status == "completed" and r.incomplete_details is None
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text.strip() == "Let me think." and r.output[0].id.startswith("rs_")
    assert r.output_text == "Hello there!" and r.output[1].role == "assistant"
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    off = client.responses.create(model="m", input="Hi", max_output_tokens=100, reasoning={"effort": "none"},
                                  extra_body=forced("Hello there!"))
    assert [o.type for o in off.output] == ["message"] and off.output_text == "Hello there!"


def test_input_items_render_like_chat(client, http):
    items = [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    chat_msgs = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    want = http.post("/tokenize", json={"messages": chat_msgs, "tools": TOOLS}).json()["count"]
    r = client.responses.create(model="m", input=items, tools=RTOOLS, max_output_tokens=2, extra_body=GREEDY)
    assert r.usage.input_tokens == want
    assert r.tools[0].name == "get_weather"


def test_function_call(client):
    r = client.responses.create(model="m", input="Weather?", tools=RTOOLS, tool_choice="auto", max_output_tokens=300,
                                reasoning={"effort": "none"}, extra_body=forced(CALL))
    (fc,) = [o for o in r.output if o.type == "function_call"]
    assert fc.name == "get_weather" and fc.call_id.startswith("call_") and fc.id.startswith("fc_")
    assert json.loads(fc.arguments) == ARGS and fc.status == "completed"
    assert not [o for o in r.output if o.type == "message"]


def test_stream_events(client):
    out = "Hmm.\n</think>\n\nSure. " + CALL
    events = []
    with client.responses.stream(model="m", input="Weather?", tools=RTOOLS, max_output_tokens=300,
                                 extra_body=forced(out)) as s:
        for ev in s:
            events.append(ev)
        final = s.get_final_response()
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    for t in ("response.output_item.added", "response.output_text.delta", "response.output_text.done",
              "response.output_item.done", "response.reasoning_text.delta", "response.function_call_arguments.delta",
              "response.function_call_arguments.done", "response.content_part.added"):
        assert t in types, t
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert text == "Sure." and json.loads(args) == ARGS
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(done.arguments) == ARGS
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.output_text == "Sure." and final.status == "completed"
    again = client.responses.create(model="m", input="Weather?", tools=RTOOLS, max_output_tokens=300,
                                    extra_body=forced(out))
    assert [o.type for o in again.output] == [o.type for o in final.output]
    assert again.usage.output_tokens == final.usage.output_tokens


def test_stream_true_greedy_equals_nonstream(client):
    kw = dict(model="m", input="Hello", temperature=0, max_output_tokens=12, reasoning={"effort": "none"},
              extra_body=GREEDY)
    whole = client.responses.create(**kw)
    evs = list(client.responses.create(stream=True, **kw))
    assert evs[-1].type == "response.incomplete"  # as OpenAI ends a response cut at max_output_tokens
    assert "".join(e.delta for e in evs if e.type == "response.output_text.delta") == whole.output_text
    assert evs[-1].response.usage.output_tokens == 12


def test_unsupported_fields_are_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="x", previous_response_id="resp_123")
    assert e.value.body["param"] == "previous_response_id" and "stores no responses" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="x", tools=[{"type": "web_search"}])
    assert e.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
    assert "text-only" in e.value.body["message"]
