"""A battery of bad inputs (>= 300 cases) against one server; afterwards it must still
answer correctly. Each case expects a clean 4xx (never a 5xx, a hang or a crash)."""

import json
import socket
import threading
import time

import httpx
import pytest

from conftest import Server

USER = [{"role": "user", "content": "Hi"}]
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def srv():
    from conftest import _finish

    s = Server("--parallel", "2", "--max-body", "262144", "--timeout", "3", "--ping", "0.5")
    yield s
    _finish(s)


def raw(port, data, read=True, timeout=10):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if not read:
            return b""
        out = b""
        while True:
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            if not b:
                break
            out += b
        return out
    finally:
        s.close()


def post_raw(port, path, body, extra=b""):
    return raw(port, b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n" + extra +
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


# ---- the cases -------------------------------------------------------------------------

def body_cases():
    """(name, path, bytes) that must all give a 4xx."""
    cases = []
    add = lambda name, b, path=CHAT: cases.append((name, path, b if isinstance(b, bytes) else json.dumps(b).encode()))
    # malformed JSON
    for i, b in enumerate([b"", b"{", b"}", b"[", b"null", b"true", b"1", b"\"s\"", b"[]", b"{\"a\":}", b"{,}",
                           b"{'a':1}", b"{\"messages\":[}", b"{\"messages\": [{]}", b"{\"a\":1,}", b"\x00",
                           b"{\"a\":1}{", b"{\"a\":1} x", b"{\"a\":NaN}", b"{\"a\":Infinity}", b"{\"a\":-}",
                           b"{\"a\":01}", b"{\"a\":1e99999}", b"{\"a\":\"\\x\"}", b"{\"a\":\"\\u12\"}",
                           b"{\"a\" 1}", b"\xef\xbb\xbf{}", b"{\"a\":\"\n\"}", b"{\"a\":tru}", b"{{}}"]):
        add(f"badjson{i}", b)
    # invalid UTF-8, surrogates, NUL
    for i, b in enumerate([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80",
                           b"\xfe\xfe", b"\xc3", b"a\xf0\x9f\x98"]):
        add(f"utf8_{i}", b'{"messages":[{"role":"user","content":"' + b + b'"}]}')
    for i, s in enumerate(["\\ud800", "\\udfff", "\\ud83d\\u0041", "\\u0000", "a\\u0000b", "\\udc00\\ud800"]):
        add(f"surr{i}", ('{"messages":[{"role":"user","content":"' + s + '"}]}').encode())
    # duplicate keys
    add("dupkey", b'{"messages":[],"messages":[]}')
    # deep nesting
    for d in (100, 1000, 5000, 20000):
        add(f"deep{d}", b'{"messages":' + b"[" * d + b"]" * d + b"}")
        add(f"deepobj{d}", b'{"x":' + b'{"a":' * d + b"1" + b"}" * d + b', "messages":[]}')
    # messages shapes
    bad_msgs = [None, 1, "x", {}, [], [1], ["x"], [None], [{}], [{"role": 1}], [{"role": "god", "content": "x"}],
                [{"role": "user", "content": 5}], [{"role": "user", "content": {"a": 1}}],
                [{"role": "user", "content": [1]}], [{"role": "user", "content": [{"type": 1}]}],
                [{"role": "user", "content": [{"type": "text"}]}], [{"role": "user", "content": [{"type": "text", "text": 1}]}],
                [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                [{"role": "user", "content": [{"type": "input_audio"}]}], [{"role": "user", "content": [{"type": "weird"}]}],
                [{"role": "system", "content": "s"}], [{"role": "assistant", "content": "a"}],
                [{"role": "user", "content": "u"}, {"role": "system", "content": "late"}],
                [{"role": "user", "content": "u", "tool_calls": 1}],
                [{"role": "assistant", "content": None, "tool_calls": [1]}],
                [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": 1}}]}],
                [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]}],
                [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
                [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}],
                [{"role": "user", "content": "x", "reasoning_content": 5}],
                [{"role": "tool", "content": "x", "tool_call_id": 5}],
                [{"role": "user", "content": "x"}, 7]]
    for i, m in enumerate(bad_msgs):
        add(f"msgs{i}", {"messages": m})
    # wrong types / ranges of every scalar field
    fields = {
        "max_tokens": ["x", 0, -5, 1.5, True, [1], {}, 2 ** 40, 10 ** 30, 5000],
        "max_completion_tokens": ["x", 0, -1, 1.5, 2 ** 33],
        "n_predict": ["x", -2],
        "temperature": ["x", -1, 101, True, [], {}, 1e308],
        "top_p": ["x", 0, -0.1, 1.1, True],
        "top_k": ["x", -2, 1.5, 2 ** 40],
        "min_p": [-0.1, 1.5, "x"],
        "presence_penalty": [-3, 3, "x"],
        "frequency_penalty": [-2.5, 2.5, {}],
        "repetition_penalty": [0, -1, 11, "x"],
        "repeat_penalty": [0, "x"],
        "seed": ["x", 1.5, [], {}],
        "stop": [1, [1], [None], {"a": 1}, ["a"] * 17, ["a" * 3000], True],
        "n": [17, 0, -1, "x", 100],
        "best_of": [0, 17, "x"],
        "stream": ["yes", 1, [], {}],
        "stream_options": ["x", 1, [], {"include_usage": "yes"}],
        "logprobs": ["x", 1, []],
        "top_logprobs": [-1, 21, "x", 1.5],
        "response_format": ["x", 1, {}, {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "a"}},
                            {"type": 5}],
        "tools": ["x", 1, {}, [1], [{}], [{"type": "function"}], [{"type": "function", "function": {"name": 5}}],
                  [{"type": "retrieval", "function": {"name": "f"}}],
                  [{"type": "function", "function": {"name": "f", "parameters": "x"}}]],
        "tool_choice": [1, "maybe", {}, {"function": {"name": "nope"}}, "required", []],
        "chat_template_kwargs": ["x", 1, [], {"enable_thinking": "no"}, {"preserve_thinking": 1}],
        "reasoning_effort": [1, [], {}],
        "model": [1, [], {}, True],
        "ignore_eos": ["x", 1],
        "cache_prompt": ["x"],
        "lilac_forced_output": [1, []],
    }
    chat_only = {"tools", "tool_choice", "chat_template_kwargs", "logprobs", "top_logprobs", "reasoning_effort"}
    for k, vals in fields.items():
        for i, v in enumerate(vals):
            add(f"{k}_{i}", {"messages": USER, k: v})
            if k not in chat_only:  # the same fields on /v1/completions
                add(f"cmpl_{k}_{i}", {"prompt": "hello", k: v}, "/v1/completions")
    # completions
    for i, p in enumerate([None, 1, "", [], [""], ["a", ""], [1, "a"], [[1, 2], []], [-1], [2 ** 40], [1.5],
                           {"a": 1}, [10 ** 6], True, ["a"] * 65]):
        add(f"prompt{i}", {"prompt": p} if p is not None else {}, "/v1/completions")
    for i, extra in enumerate([{"echo": True, "logprobs": 1}, {"suffix": "x"}, {"logprobs": 21}, {"logprobs": -1},
                               {"n": 3, "best_of": 2}, {"best_of": 3, "stream": True}, {"prompt": "x" * 30000}]):
        b = {"prompt": "hello"}
        b.update(extra)
        add(f"cmpl_extra{i}", b, "/v1/completions")
    # context overflow
    add("ctx_big_prompt", {"messages": [{"role": "user", "content": "word " * 2500}]})
    add("ctx_big_max", {"messages": USER, "max_tokens": 2040})
    add("ctx_ids", {"prompt": list(range(1, 900)) * 3}, "/v1/completions")
    # small endpoints
    for i, b in enumerate([{}, {"content": 1}, {"content": None}, {"messages": []}, {"messages": "x"},
                           {"messages": [{"role": "x"}]}, b'{"content":"\\ud800"}']):
        add(f"tok{i}", b, "/tokenize")
    for i, b in enumerate([{}, {"tokens": "x"}, {"tokens": [1.5]}, {"tokens": [-1]}, {"tokens": [2 ** 31]},
                           {"tokens": [None]}, {"tokens": {}}, {"tokens": [10 ** 20]}]):
        add(f"detok{i}", b, "/detokenize")
    for i, b in enumerate([{}, {"messages": []}, {"messages": [{"role": "system", "content": "s"}]}, {"messages": 1}]):
        add(f"tmpl{i}", b, "/apply-template")
    return cases


CASES = body_cases()
assert len(CASES) >= 300, len(CASES)


@pytest.mark.parametrize("name,path,body", CASES, ids=[c[0] for c in CASES])
def test_bad_body(srv, name, path, body):
    r = httpx.post(srv.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    e = r.json()["error"]
    assert isinstance(e["message"], str) and e["message"] and e["type"]
    assert "param" in e and "code" in e


def test_huge_numbers_ok_or_400(srv):
    for v in ["1e400", "-1e400", "123456789012345678901234567890", "1e-400", "-0"]:
        r = httpx.post(srv.url + CHAT, content=('{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"seed":' + v + "}").encode(),
                       headers={"Content-Type": "application/json"})
        assert r.status_code in (200, 400)


def test_unknown_fields_ignored(srv):
    r = httpx.post(srv.url + CHAT, json={"messages": USER, "max_tokens": 1, "user": "u", "store": True,
                                         "service_tier": "auto", "logit_bias": {"1": 5}, "metadata": {"a": "b"},
                                         "frobnicate": [1, 2, {"x": None}], "parallel_tool_calls": False})
    assert r.status_code == 200


# Each raw request with what the server must answer: a status, or None where it closes the
# connection without one (a request line it cannot parse at all). A body that is both over the
# size limit and not JSON may be refused for either, whichever the server sees first.
RAW = [
    (b"GARBAGE\r\n\r\n", None),
    (b"GET / HTTP/9.9\r\n\r\n", 505),
    (b"GET /health HTTP/1.1\r\n" + b"X-Long: " + b"a" * 100000 + b"\r\n\r\n", 431),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: -5\r\n\r\n", 400),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 99999999999999999999\r\n\r\n", 413),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 10\r\nContent-Length: 20\r\n\r\n0123456789", 400),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + (b"1000\r\n" + b"a" * 4096 + b"\r\n") * 80 + b"0\r\n\r\n", (400, 413)),
    (b"\x00\x01\x02\x03\r\n\r\n", None),
    (b"GET /../../etc/passwd HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\r\n", 404),
    # libmicrohttpd decodes %00 as the end of the path: this is /health, read-only and harmless
    (b"GET /health%00 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\r\n", 200),
    (b"DELETE /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\r\n", 405),
]


@pytest.mark.parametrize("req,want", RAW, ids=lambda v: repr(v[:24]) if isinstance(v, bytes) else str(v).replace(" ", ""))
def test_raw_protocol_garbage(srv, req, want):
    out = raw(srv.port, req, timeout=5)
    if want is None:
        assert out == b"", out[:200]
    else:
        assert out.startswith(b"HTTP/1.1 "), out[:200]
        assert int(out.split(b" ", 2)[1]) in (want if isinstance(want, tuple) else (want,)), out[:200]
    assert httpx.get(srv.url + "/health").status_code == 200


def test_slowloris(srv):
    """Clients that send a partial request and stall are dropped by the connection timeout."""
    socks = []
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mess")
        socks.append(s)
    assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
    time.sleep(4.5)  # --timeout 3
    closed = 0
    for s in socks:
        s.settimeout(1)
        try:
            closed += s.recv(100) == b""
        except (ConnectionResetError, socket.timeout):
            closed += 1
        s.close()
    assert closed == len(socks)


def test_vanish_mid_stream_and_mid_prefill(srv):
    body = json.dumps({"messages": USER, "max_tokens": 500, "ignore_eos": True, "stream": True}).encode()
    pre = json.dumps({"prompt": list(range(1, 1800)), "max_tokens": 3, "stream": True}).encode()
    for i in range(10):
        b = body if i % 2 else pre
        path = CHAT if i % 2 else "/v1/completions"
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " + str(len(b)).encode() +
                  b"\r\n\r\n" + b)
        if i % 2:
            s.recv(100)
        s.close()
    deadline = time.time() + 20
    while time.time() < deadline:
        m = httpx.get(srv.url + "/metrics").text
        if "llamacpp:requests_processing 0" in m and "llamacpp:requests_deferred 0" in m:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("work left running after the clients vanished")


def test_64_concurrent_streams(srv):
    ok = []

    def one(i):
        try:
            with httpx.Client(timeout=180) as c, c.stream(
                    "POST", srv.url + CHAT, json={"messages": USER, "max_tokens": 6, "stream": True, "seed": i}) as r:
                t = "".join(r.iter_text())
                ok.append(r.status_code == 200 and t.endswith("data: [DONE]\n\n"))
        except Exception as e:  # noqa
            ok.append(repr(e))

    ts = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert ok == [True] * 64


def test_queue_full_is_503():
    from conftest import _finish

    s = Server("--parallel", "1", "--queue", "1")
    try:
        codes = []

        def one():
            r = httpx.post(s.url + CHAT, json={"messages": USER, "max_tokens": 200, "ignore_eos": True}, timeout=60)
            codes.append((r.status_code, r.headers.get("retry-after")))

        ts = [threading.Thread(target=one) for _ in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert (503, "1") in codes and any(c == 200 for c, _ in codes)
    finally:
        _finish(s)


def test_still_correct_after_battery(srv):
    r = httpx.post(srv.url + CHAT, json={"messages": USER, "max_tokens": 30, "stream": False,
                                         "chat_template_kwargs": {"enable_thinking": False},
                                         "lilac_forced_output": "All good."}, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "All good."
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
