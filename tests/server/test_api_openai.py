"""OpenAI API surface beyond one choice per request: n, best_of, echo, prompt
lists, /v1/models/{id}, /version, /props, and the error shape and messages
(issue 46, items 4 and 5). Checked with the official `openai` client against
the demo model; greedy decoding where texts are compared, since the demo
model's text is gibberish."""

import json
import math

import httpx
import openai
import pytest

from conftest import Server, _finish

USER = [{"role": "user", "content": "Hello, how are you?"}]
GREEDY = dict(temperature=0, max_tokens=8, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def one_slot():
    s = Server("--parallel", "1")
    yield s
    _finish(s)


def test_chat_n_greedy_equals_single(client):
    one = client.chat.completions.create(model="m", messages=USER, **GREEDY)
    r = client.chat.completions.create(model="m", messages=USER, n=3, **GREEDY)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        assert c.message.content == one.choices[0].message.content
        assert c.message.reasoning_content == one.choices[0].message.reasoning_content
    # the prompt counted once, every choice's tokens counted
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    assert r.usage.completion_tokens == 3 * one.usage.completion_tokens


def test_chat_n_seeded_choices_differ_and_reproduce(client):
    kw = dict(model="m", messages=USER, n=3, seed=7, temperature=1.0, max_tokens=16, extra_body={"ignore_eos": True})
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    texts = [(c.message.reasoning_content, c.message.content) for c in a.choices]
    assert texts == [(c.message.reasoning_content, c.message.content) for c in b.choices]
    assert len(set(texts)) > 1  # choices are separate draws, not copies


def test_completions_n_and_prompt_list(client):
    single = {p: client.completions.create(model="m", prompt=p, **GREEDY).choices[0].text for p in ("Hello", "The cat")}
    r = client.completions.create(model="m", prompt=["Hello", "The cat"], n=2, **GREEDY)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [single["Hello"]] * 2 + [single["The cat"]] * 2
    ids = client.post("/tokenize", body={"content": "Hello"}, cast_to=httpx.Response).json()["tokens"]
    r2 = client.completions.create(model="m", prompt=[ids, "The cat"], **GREEDY)
    assert [c.text for c in r2.choices] == [single["Hello"], single["The cat"]]
    assert r2.usage.prompt_tokens == len(ids) + client.post(
        "/tokenize", body={"content": "The cat"}, cast_to=httpx.Response).json()["count"]


def test_stream_n_chunks_carry_index(client):
    kw = dict(model="m", messages=USER, n=2, **GREEDY)
    whole = client.chat.completions.create(**kw)
    parts = {0: "", 1: ""}
    finishes = {}
    for ch in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        for c in ch.choices:
            parts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
        if not ch.choices:
            usage = ch.usage
    assert finishes == {0: "length", 1: "length"}
    assert [parts[0], parts[1]] == [c.message.content for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_completions_stream_n_prompts(client):
    r = client.completions.create(model="m", prompt=["Hello", "The cat"], n=2, **GREEDY)
    got = {}
    for ch in client.completions.create(model="m", prompt=["Hello", "The cat"], n=2, stream=True, **GREEDY):
        for c in ch.choices:
            got[c.index] = got.get(c.index, "") + c.text
    assert [got[i] for i in range(4)] == [c.text for c in r.choices]


def mean_lp(choice):
    lps = choice.logprobs.token_logprobs
    return sum(lps) / len(lps)


def test_best_of_picks_highest_mean_logprob(client):
    kw = dict(model="m", prompt="Once upon", seed=11, temperature=1.0, max_tokens=10, extra_body={"ignore_eos": True})
    cands = client.completions.create(n=4, logprobs=0, **kw).choices
    best = client.completions.create(n=1, best_of=4, logprobs=0, **kw).choices
    assert len(best) == 1 and best[0].index == 0
    top = max(cands, key=mean_lp)
    assert best[0].text == top.text and mean_lp(best[0]) == pytest.approx(mean_lp(top))
    two = client.completions.create(n=2, best_of=4, **kw).choices  # logprobs not asked: not sent
    ranked = sorted(cands, key=mean_lp, reverse=True)
    assert [c.text for c in two] == [c.text for c in ranked[:2]] and two[0].logprobs is None
    chat = client.chat.completions.create(model="m", messages=USER, n=1, seed=3, temperature=1.0, max_tokens=6,
                                          extra_body={"best_of": 3, "ignore_eos": True})
    assert len(chat.choices) == 1


def test_best_of_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="x", n=3, best_of=2)
    assert e.value.body["param"] == "best_of"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="x", n=1, best_of=2, stream=True)
    assert e.value.body["param"] == "best_of"


def test_echo(client):
    r = client.completions.create(model="m", prompt="Hello there", echo=True, **GREEDY)
    plain = client.completions.create(model="m", prompt="Hello there", **GREEDY)
    assert r.choices[0].text == "Hello there" + plain.choices[0].text
    ids = client.post("/tokenize", body={"content": "Hello there"}, cast_to=httpx.Response).json()["tokens"]
    r = client.completions.create(model="m", prompt=ids, echo=True, **GREEDY)
    assert r.choices[0].text == "Hello there" + plain.choices[0].text
    text = "".join(c.choices[0].text for c in client.completions.create(model="m", prompt="Hello there", echo=True,
                                                                        stream=True, **GREEDY))
    assert text == "Hello there" + plain.choices[0].text
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="Hello", echo=True, logprobs=1, max_tokens=2)
    assert e.value.body["param"] == "echo" and "logprobs" in e.value.body["message"]


def test_n_shares_prefill_in_one_slot(one_slot):
    """With one slot the choices run in turn; each later one resumes from the
    snapshot before the prompt's last <|im_start|>, so it prefills only the
    generation prompt."""
    c = openai.OpenAI(base_url=one_slot.url + "/v1", api_key="x", max_retries=0)
    msgs = [{"role": "system", "content": "word " * 200}] + USER
    r = c.chat.completions.create(model="m", messages=msgs, n=3, temperature=0, max_tokens=2, extra_body={"ignore_eos": True})
    t = r.model_extra["timings"]
    P = r.usage.prompt_tokens
    assert t["prompt_n"] + t["cache_n"] == 3 * P
    assert t["prompt_n"] < P + 2 * 10, t  # the second and third choice prefill a few tokens each


def test_models_by_id(client, http):
    m = client.models.retrieve(client.models.list().data[0].id)
    assert m.object == "model" and m.model_extra["max_model_len"] == 2048
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body == {"message": "The model 'no-such-model' does not exist", "type": "invalid_request_error",
                            "param": "model", "code": "model_not_found"}


def test_version_and_props(server, http):
    v = http.get("/version").json()
    assert v["version"] and v["build_info"].startswith("lilac ")
    p = http.get("/props").json()
    assert p["model_path"] == server.model and p["n_ctx"] == 2048 and p["total_slots"] == 2
    assert p["chat_template"]["file"] is True and p["chat_template"]["official"] is True
    assert p["version"] == v["version"] and p["n_vocab"] == 1024


def test_error_code_is_string_or_null(server, http):
    """OpenAI sends `code` as a string or null, never the HTTP status."""
    bodies = [
        http.get("/no/such/endpoint"),
        http.get("/v1/chat/completions"),
        http.post("/v1/chat/completions", json={"messages": []}),
        http.post("/v1/completions", json={"prompt": "x", "max_tokens": 0}),
    ]
    for r in bodies:
        e = r.json()["error"]
        assert set(e) >= {"message", "type", "param", "code"}
        assert e["code"] is None or isinstance(e["code"], str), (r.status_code, e)


def test_context_message_states_real_numbers(client, http):
    n = http.post("/tokenize", json={"messages": USER}).json()["count"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=USER, max_tokens=2040)
    msg = e.value.body["message"]
    assert msg == (f"This model's maximum context length is 2048 tokens. However, you requested {n + 2040} tokens "
                   f"({n} in the messages, 2040 in the completion). Please reduce the length of the messages or completion.")
    with pytest.raises(openai.BadRequestError) as e:  # beyond any 32-bit bound: still the true numbers
        client.chat.completions.create(model="m", messages=USER, max_tokens=2 ** 40)
    assert f"you requested {n + 2 ** 40} tokens" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="word " * 2100)
    assert "resulted in" in e.value.body["message"] and "no room for a completion" in e.value.body["message"]


def test_range_message(client):
    for key in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="m", messages=USER, extra_body={key: 0})
        assert e.value.body["message"] == f"'{key}' must be at least 1, got 0"


def test_completion_logprobs_never_collapse(http):
    """Bytes that are not UTF-8 on their own are written "bytes:\\xNN" (as
    OpenAI does), so top_logprobs keeps one key per token."""
    seen_bytes = 0
    for p in ["Hello", "The quick brown", "\u00e9\u00e8"]:
        r = http.post("/v1/completions", json={"prompt": p, "max_tokens": 8, "logprobs": 20, "temperature": 0,
                                              "ignore_eos": True})
        dup = []

        def hook(pairs):
            keys = [k for k, _ in pairs]
            if len(keys) != len(set(keys)):
                dup.append(keys)
            return dict(pairs)

        body = json.loads(r.text, object_pairs_hook=hook)
        assert not dup
        lp = body["choices"][0]["logprobs"]
        for i, top in enumerate(lp["top_logprobs"]):
            assert len(top) == 20
            assert lp["tokens"][i] in top and top[lp["tokens"][i]] == pytest.approx(max(top.values()))
            for k in top:
                if k.startswith("bytes:"):
                    seen_bytes += 1
                    raw = bytes(int(h, 16) for h in k[6:].split("\\x")[1:])
                    with pytest.raises(UnicodeDecodeError):
                        raw.decode("utf-8")
            assert all(math.isfinite(v) for v in top.values())
    assert seen_bytes > 0
