"""The engine's batched decode (--parallel N: one forward_batch per round for every
decoding slot) and its prefix cache (GDN/conv snapshots every --snapshot-every
tokens, before the prompt's last <|im_start|>, at the prompt end and at each
turn end; bounded by --cache-mb, least recently used evicted).

Greedy (temperature 0, top_k 1, fixed seed) outputs must not depend on how many
sequences share a step, on where the prefill resumed, nor on another stream of
the batch being cancelled."""

import json
import socket
import threading
import time

import httpx
import openai
import pytest

from conftest import Server, _finish

EVERY = 32  # --snapshot-every of the cached servers

PROMPTS = [
    "Tell me about the weather in Paris today.",
    "Write a haiku about a lighthouse.",
    "What is 17 times 23? Explain.",
    "List three colours of the rainbow, then stop.",
]


@pytest.fixture(scope="module")
def p1():
    s = Server("--parallel", "1", "--snapshot-every", str(EVERY))
    yield s
    _finish(s)


@pytest.fixture(scope="module")
def p4():
    s = Server("--parallel", "4", "--snapshot-every", str(EVERY))
    yield s
    _finish(s)


@pytest.fixture(scope="module")
def nocache():
    s = Server("--parallel", "2", "--cache-mb", "0")
    yield s
    _finish(s)


def metrics(url):
    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def wait_for(cond, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


GREEDY = {"temperature": 0, "top_p": 1, "seed": 1234}


def chat_greedy(server, content, max_tokens=24, **extra):
    r = oa(server).chat.completions.create(model="x", messages=[{"role": "user", "content": content}],
                                           max_tokens=max_tokens, extra_body={"top_k": 1, "ignore_eos": True, **extra},
                                           **GREEDY)
    m = r.choices[0].message
    return (getattr(m, "reasoning_content", None) or "") + "|" + (m.content or ""), r.usage.completion_tokens


def run_concurrently(fn, args):
    out = [None] * len(args)
    errs = []

    def one(i):
        try:
            out[i] = fn(*args[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(e)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(args))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs, errs
    return out


# ---- (a) batched decode = one sequence at a time --------------------------------------

def test_greedy_parallel4_equals_parallel1(p1, p4):
    m0 = metrics(p4.url)
    batched = run_concurrently(chat_greedy, [(p4, p) for p in PROMPTS])
    m1 = metrics(p4.url)
    alone = run_concurrently(chat_greedy, [(p1, p) for p in PROMPTS])  # queued: one at a time
    assert batched == alone
    assert all(n == 24 for _, n in batched)
    # a real batched step: fewer forward_batch calls than tokens decoded
    toks = m1["llamacpp:n_decode_total"] - m0["llamacpp:n_decode_total"]
    steps = m1["lilac:batch_steps_total"] - m0["lilac:batch_steps_total"]
    assert toks == 4 * 23, (toks, steps)  # the first token of each comes from its prefill
    assert steps < toks, (toks, steps)


def test_greedy_completions_token_ids_batched(p1, p4):
    """Raw HTTP, prompts as token ids of different lengths (different positions per row)."""
    prompts = [list(range(20 + 7 * i, 60 + 19 * i)) for i in range(4)]

    def one(server, prompt):
        r = httpx.post(server.url + "/v1/completions", timeout=120, json={
            "prompt": prompt, "max_tokens": 16, "temperature": 0, "top_k": 1, "seed": 7, "ignore_eos": True,
            "logprobs": 1}).json()
        return r["choices"][0]["text"], r["choices"][0]["logprobs"]["tokens"]

    batched = run_concurrently(one, [(p4, p) for p in prompts])
    alone = [one(p1, p) for p in prompts]
    assert batched == alone


def test_seeded_sampling_batched(p1, p4):
    """Sampling stays per slot: a seeded, non-greedy request gives the same text alone or in a batch."""
    def one(server, content):
        r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": content}], "max_tokens": 20, "temperature": 0.9,
            "top_p": 0.95, "seed": 99, "ignore_eos": True, "presence_penalty": 0.5}).json()
        return r["choices"][0]["message"].get("reasoning_content"), r["choices"][0]["message"]["content"]

    assert run_concurrently(one, [(p4, p) for p in PROMPTS]) == [one(p1, p) for p in PROMPTS]


# ---- (b) prefix reuse across turns -------------------------------------------------------

SYSTEM = "You are a helpful assistant who answers briefly. " * 12
TURN1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello, what is the weather like?"}]
FORCED1 = "<think>\nThe user asks about the weather.\n</think>\n\nIt is sunny and warm."


def tokens(server, messages):
    return httpx.post(server.url + "/tokenize", json={"messages": messages}, timeout=30).json()["tokens"]


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def two_turns(server, cache_prompt=True):
    c = oa(server)
    r1 = c.chat.completions.create(model="x", messages=TURN1, max_tokens=64, temperature=0,
                                   extra_body={"lilac_forced_output": FORCED1})
    m = r1.choices[0].message
    assert m.content == "It is sunny and warm." and "weather" in m.reasoning_content
    turn2 = TURN1 + [{"role": "assistant", "content": m.content, "reasoning_content": m.reasoning_content},
                     {"role": "user", "content": "And what about tomorrow?"}]
    r2 = c.chat.completions.create(model="x", messages=turn2, max_tokens=24, seed=5, temperature=0,
                                   extra_body={"top_k": 1, "ignore_eos": True, "cache_prompt": cache_prompt})
    m2 = r2.choices[0].message
    return r1, r2, turn2, (m2.reasoning_content or "") + "|" + (m2.content or "")


def test_multi_turn_resumes_from_snapshot(p4, nocache):
    r1, r2, turn2, out = two_turns(p4)
    t1, t2 = tokens(p4, TURN1), tokens(p4, turn2)
    assert r1.usage.prompt_tokens == len(t1) and r2.usage.prompt_tokens == len(t2)
    L = common_prefix(t1, t2)
    # thinking on: the re-rendered history drops the reasoning, so it diverges inside turn 1's prompt
    assert 0 < L < len(t1)
    im_start = tokens(p4, [{"role": "user", "content": ""}])[0]
    mark = max(i for i, t in enumerate(t1) if t == im_start)  # snapshot before the generation prompt
    snaps = sorted({k * EVERY for k in range(1, len(t1) // EVERY + 1)} | {mark, len(t1)})
    expect = max(p for p in snaps if p <= min(L, len(t2) - 1))
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached == expect == mark, (cached, expect, L, snaps)
    assert r2.timings["cache_n"] == cached and r2.timings["prompt_n"] == len(t2) - cached
    # the same greedy output with no cache at all, and with the cache bypassed
    _, r2n, _, out_nocache = two_turns(nocache)
    assert r2n.usage.prompt_tokens_details.cached_tokens == 0
    assert out == out_nocache
    _, r2b, _, out_bypass = two_turns(p4, cache_prompt=False)
    assert r2b.usage.prompt_tokens_details.cached_tokens == 0
    assert out == out_bypass


def test_regular_boundaries_completions(p4, nocache):
    """Token-id prompts without <|im_start|>: resume from the multiple of --snapshot-every below the divergence."""
    base = [(i * 37 + 11) % 900 + 20 for i in range(300)]
    u = p4.url + "/v1/completions"
    httpx.post(u, json={"prompt": base, "max_tokens": 4, "temperature": 0}, timeout=60).raise_for_status()
    branch = base[:200] + [5, 6, 7, 8, 9]
    body = {"prompt": branch, "max_tokens": 12, "temperature": 0, "top_k": 1, "ignore_eos": True}
    b = httpx.post(u, json=body, timeout=60).json()
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 200 // EVERY * EVERY
    ref = httpx.post(nocache.url + "/v1/completions", json=body, timeout=60).json()
    assert ref["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert b["choices"][0]["text"] == ref["choices"][0]["text"]
    # the branch generated 12 tokens after its prompt; this extension diverges right at the prompt's end,
    # where the branch's prompt-end snapshot sits
    c = httpx.post(u, json={**body, "prompt": branch + [10, 11]}, timeout=60).json()
    assert c["usage"]["prompt_tokens_details"]["cached_tokens"] == len(branch)
    ref = httpx.post(nocache.url + "/v1/completions", json={**body, "prompt": branch + [10, 11]}, timeout=60).json()
    assert c["choices"][0]["text"] == ref["choices"][0]["text"]


def tokens_of(server, text):
    return httpx.post(server.url + "/tokenize", json={"content": text, "parse_special": True},
                      timeout=30).json()["tokens"]


def test_turn_end_snapshot(p4):
    """The last token handed out is consumed after the turn and a snapshot taken there: a prompt that holds
    the whole turn (prompt + every generated id) and then diverges from what the slot did next resumes
    from the turn's end."""
    u = p4.url + "/v1/completions"
    base = [(i * 53 + 3) % 900 + 20 for i in range(70)]
    forced = "Sunny and warm."
    gen = tokens_of(p4, forced)
    a = httpx.post(u, json={"prompt": base, "max_tokens": 20, "lilac_forced_output": forced}, timeout=60).json()
    assert a["choices"][0]["text"] == forced and a["usage"]["completion_tokens"] == len(gen)
    hist = base + gen
    # the slot's live state holds the whole turn: extending it reuses all of it (all but the last id when
    # this request came before the engine's next round consumed it; prefill feeds it then)
    b = httpx.post(u, json={"prompt": hist + [33, 34], "max_tokens": 5, "temperature": 0,
                            "ignore_eos": True}, timeout=60).json()
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] in (len(hist), len(hist) - 1)
    # now the slot is past hist + [33, 34] + 5 ids; a prompt diverging right after the turn
    c = httpx.post(u, json={"prompt": hist + [35], "max_tokens": 1, "temperature": 0}, timeout=60).json()
    assert c["usage"]["prompt_tokens_details"]["cached_tokens"] == len(hist)


# ---- (c) the memory bound ----------------------------------------------------------------

def test_cache_memory_bound():
    s = Server("--parallel", "2", "--snapshot-every", "16", "--cache-mb", "0.25")
    try:
        limit = 0.25 * 1048576
        u = s.url + "/v1/completions"
        outs = []
        for k in range(5):
            p = [(i * (31 + k) + 7 * k) % 900 + 20 for i in range(150)]
            r = httpx.post(u, json={"prompt": p, "max_tokens": 3, "temperature": 0}, timeout=60).json()
            outs.append((p, r["choices"][0]["text"]))
            m = metrics(s.url)
            assert m["lilac:prefix_cache_bytes"] <= limit
            assert m["lilac:prefix_cache_peak_bytes"] <= limit
        m = metrics(s.url)
        assert m["lilac:prefix_cache_limit_bytes"] == limit
        assert m["lilac:prefix_cache_evictions_total"] > 0
        assert m["lilac:prefix_cache_snapshots"] >= 1
        per = m["lilac:prefix_cache_bytes"] / m["lilac:prefix_cache_snapshots"]
        assert m["lilac:prefix_cache_snapshots"] <= limit // per
        # the most recent snapshots survive: a branch near the end of the last prompt (150 ids, so
        # snapshots at 16, 32, ..., 144) resumes from the one at 144
        p, _ = outs[-1]
        r = httpx.post(u, json={"prompt": p[:148] + [9, 9], "max_tokens": 6, "temperature": 0, "top_k": 1,
                                "ignore_eos": True}, timeout=60).json()
        cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == 144, cached
        ref = httpx.post(u, json={"prompt": p[:148] + [9, 9], "max_tokens": 6, "temperature": 0, "top_k": 1,
                                  "ignore_eos": True, "cache_prompt": False}, timeout=60).json()
        assert r["choices"][0]["text"] == ref["choices"][0]["text"]
        assert metrics(s.url)["lilac:prefix_cache_peak_bytes"] <= limit
    finally:
        _finish(s)


def test_cache_smaller_than_one_snapshot():
    s = Server("--parallel", "1", "--cache-mb", "0.001", "--snapshot-every", "16")
    try:
        p = list(range(30, 130))
        r = httpx.post(s.url + "/v1/completions", json={"prompt": p, "max_tokens": 2}, timeout=60)
        assert r.status_code == 200
        m = metrics(s.url)
        assert m["lilac:prefix_cache_bytes"] == 0 and m["lilac:prefix_cache_peak_bytes"] == 0
        # the live state still extends
        r = httpx.post(s.url + "/v1/completions", json={"prompt": p + [5, 6], "max_tokens": 1}, timeout=60).json()
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] in (0, len(p))
    finally:
        _finish(s)


def test_bad_cache_flags():
    import subprocess
    from conftest import BIN, demo_dir
    for flags in (["--cache-mb", "-1"], ["--cache-mb", "abc"], ["--snapshot-every", "-3"], ["--snapshot-every", "x"]):
        out = subprocess.run([BIN, "serve", "--model", demo_dir(), "--port", "0", *flags], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode != 0 and flags[0] in out.stderr, (flags, out.stderr)


# ---- (d) cancelling one stream of a batch ------------------------------------------------

def stream_text(server, content, max_tokens):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "top_k": 1, "seed": 3, "ignore_eos": True}
    parts = []
    with httpx.Client(timeout=120) as c, c.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                d = json.loads(line[6:])
                for ch in d.get("choices", []):
                    parts.append(ch["delta"].get("reasoning_content") or "")
                    parts.append(ch["delta"].get("content") or "")
    return "".join(parts)


def test_cancel_one_stream_of_batch(p1, p4):
    others = PROMPTS[:3]
    m0 = metrics(p4.url)
    victim_done = threading.Event()

    def victim():
        body = json.dumps({"messages": [{"role": "user", "content": PROMPTS[3]}], "max_tokens": 2000,
                           "ignore_eos": True, "stream": True}).encode()
        s = socket.create_connection(("127.0.0.1", p4.port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        s.settimeout(30)
        got = b""
        while got.count(b"data: ") < 4:
            more = s.recv(4096)
            assert more, f"the server closed the stream early: {got[-300:]!r}"
            got += more
        s.close()
        victim_done.set()
        return True

    def other(content):
        return stream_text(p4, content, 60)

    res = run_concurrently(lambda f, *a: f(*a), [(victim,)] + [(other, c) for c in others])
    assert victim_done.is_set() and res[0]
    assert wait_for(lambda: metrics(p4.url)["lilac:requests_cancelled_total"] >= m0["lilac:requests_cancelled_total"] + 1, 10)
    assert wait_for(lambda: metrics(p4.url)["llamacpp:requests_processing"] == 0, 10)
    m1 = metrics(p4.url)
    # the victim stopped long before its 2000 tokens
    assert m1["llamacpp:tokens_predicted_total"] - m0["llamacpp:tokens_predicted_total"] < 3 * 60 + 1000
    ref = [stream_text(p1, c, 60) for c in others]
    assert res[1:] == ref
