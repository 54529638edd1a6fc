"""Hostile clients, hostile web pages and hostile files get a clean refusal (issue 47).

Every case runs against the real server (or the real binary) on 127.0.0.1 with
bounded loops. Slow and flooding clients use other loopback source addresses
(127.0.0.2 and up: every 127/8 address is the local host) so that the
per-client limit sees them as the distinct clients they stand for.
"""

import json
import os
import resource
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from conftest import BIN, CACHE, Server, _finish, demo_dir

KEY = "k-hardening"
AUTH = {"Authorization": "Bearer " + KEY}
USER = [{"role": "user", "content": "Hello"}]


def connect(port, src="127.0.0.1", timeout=10):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


def read_all(s, limit=10):
    out, end = b"", time.time() + limit
    while time.time() < end:
        try:
            b = s.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not b:
            break
        out += b
    return out


def exchange(port, data, src="127.0.0.1", half_close=False):
    s = connect(port, src)
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        return read_all(s)
    finally:
        s.close()


def status_of(resp):
    return int(resp.split(b" ", 2)[1]) if resp.startswith(b"HTTP/1.") else None


def post_bytes(path, body, host=b"127.0.0.1", ctype=b"application/json", extra=b""):
    h = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + host + b"\r\n"
    if ctype is not None:
        h += b"Content-Type: " + ctype + b"\r\n"
    return h + extra + b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body


def rss_bytes(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run_bin(*args, env=None, timeout=20):
    e = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    if env is not None:
        e.update(env)
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, env=e)


@pytest.fixture(scope="module")
def keyed():
    """A keyed server with the flags every lilac version has (so each behaviour test fails on its own)."""
    s = Server("--api-key", KEY, "--max-body", "65536", "--ping", "0.2")
    yield s
    _finish(s)


@pytest.fixture(scope="module")
def limited():
    """Tight values for the new limits."""
    s = Server("--api-key", KEY, "--max-body", "65536", "--max-conns-per-client", "16", "--header-timeout", "2",
               "--body-timeout", "3", "--max-json-values", "5000", "--max-tokenize", "200")
    yield s
    _finish(s)


# ---- 1, 2: slow clients and unauthenticated bodies; the acceptance check ----------------

def test_acceptance_slow_clients_and_unauthenticated_bodies():
    """While 600 slow clients and 50 unauthenticated 31 MB bodies are held open, /health
    and an authenticated completion answer within 1 s and the RSS stays under 1 GB."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 4096)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < 900:
        pytest.skip(f"the descriptor limit ({hard}) is too low for 650 connections")
    s = Server("--api-key", KEY)
    socks = []
    try:
        slow, bodies = [], []
        for i in range(600):  # 20 clients x 30 connections, each a header that never ends
            c = connect(s.port, f"127.0.0.{2 + i // 30}")
            c.setblocking(False)
            c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            slow.append(c)
        big = 31 << 20
        for i in range(50):
            c = connect(s.port, "127.0.1.1")
            c.setblocking(False)
            c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: " + str(big).encode() + b"\r\n\r\n")
            bodies.append(c)
        socks = slow + bodies
        chunk = b"a" * 65536
        answered = 0
        for rnd in range(4):  # keep trickling and pushing body bytes while measuring
            for c in slow:
                try:
                    c.send(b"x")
                except OSError:
                    pass
            for c in bodies:
                for _ in range(8):
                    try:
                        c.send(chunk)
                    except OSError:
                        break
            t = time.time()
            r = httpx.get(s.url + "/health", timeout=5)
            assert r.status_code == 200 and time.time() - t < 1.0, time.time() - t
            t = time.time()
            r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 4}, headers=AUTH, timeout=5)
            assert r.status_code == 200 and time.time() - t < 1.0, time.time() - t
            answered += 1
            assert rss_bytes(s.proc.pid) < (1 << 30), rss_bytes(s.proc.pid)
            time.sleep(0.5)
        assert answered == 4
        # the unauthenticated bodies were refused from their headers: a 401, no body buffered
        refused = 0
        for c in bodies[:10]:
            c.setblocking(True)
            c.settimeout(5)
            got = read_all(c, 5)
            refused += got.startswith(b"HTTP/1.1 401")
        assert refused == 10
        assert s.alive()
    finally:
        for c in socks:
            c.close()
        _finish(s)


def test_unauthenticated_body_refused_before_it_is_sent(keyed):
    c = connect(keyed.port)
    c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: 60000\r\n\r\n")  # and not one body byte
    got = read_all(c, 5)
    c.close()
    assert got.startswith(b"HTTP/1.1 401") and b"Invalid API Key" in got


def test_per_client_connection_limit(limited):
    held = [connect(limited.port, "127.0.0.9") for _ in range(16)]
    try:
        extra = connect(limited.port, "127.0.0.9", timeout=3)
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_all(extra, 3) == b""  # closed at once: that client is at its limit
        extra.close()
        assert httpx.get(limited.url + "/health").status_code == 200  # others are not
    finally:
        for c in held:
            c.close()


def test_header_deadline_is_absolute(limited):
    """A byte every 0.3 s keeps resetting the idle timeout; the 2 s header deadline still ends it."""
    c = connect(limited.port, "127.0.0.10")
    t = time.time()
    got = b""
    c.settimeout(0.3)
    c.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    while time.time() - t < 8:
        try:
            c.sendall(b"X")
        except OSError:
            break
        try:
            b = c.recv(4096)
            got += b
            if not b:
                break
        except socket.timeout:
            pass
        except OSError:
            break
    c.close()
    assert time.time() - t < 4.5
    assert got.startswith(b"HTTP/1.1 408"), got


def test_body_deadline_is_absolute(limited):
    c = connect(limited.port, "127.0.0.11")
    c.sendall(post_bytes("/tokenize", b"", extra=AUTH_RAW).replace(b"Content-Length: 0", b"Content-Length: 60000"))
    t = time.time()
    c.settimeout(0.3)
    got = b""
    while time.time() - t < 8:
        try:
            c.sendall(b" ")
            b = c.recv(4096)
            got += b
            if not b:
                break
        except socket.timeout:
            pass
        except OSError:
            break
    c.close()
    assert time.time() - t < 5.5 and got.startswith(b"HTTP/1.1 408"), got


AUTH_RAW = b"Authorization: Bearer " + KEY.encode() + b"\r\n"


# ---- 4: a half-close is not a disconnect ------------------------------------------------

def test_half_closed_client_gets_its_answer(keyed):
    body = json.dumps({"messages": USER, "max_tokens": 6}).encode()
    got = exchange(keyed.port, post_bytes("/v1/chat/completions", body, extra=AUTH_RAW).replace(b"Connection: close\r\n", b""),
                   half_close=True)
    assert got.startswith(b"HTTP/1.1 200") and b'"finish_reason"' in got
    body = json.dumps({"messages": USER, "max_tokens": 6, "stream": True}).encode()
    got = exchange(keyed.port, post_bytes("/v1/chat/completions", body, extra=AUTH_RAW), half_close=True)
    assert got.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in got


def test_pipelined_requests_all_answered(keyed):
    one = post_bytes("/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 3}).encode(),
                     extra=AUTH_RAW).replace(b"Connection: close\r\n", b"")
    last = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    for half in (False, True):
        got = exchange(keyed.port, one + one + last, half_close=half)
        assert got.count(b"HTTP/1.1 200") == 3, got[:400]


# ---- 5: one content-part validator ------------------------------------------------------

@pytest.mark.parametrize("extra", [{"image": "x"}, {"image_url": {"url": "http://x/y.png"}}, {"video": "v"}])
def test_text_part_with_a_media_key_is_refused(keyed, extra):
    part = {"type": "text", "text": "my words", **extra}
    msgs = [{"role": "user", "content": [part]}]
    for path in ("/v1/chat/completions", "/apply-template", "/tokenize"):
        r = httpx.post(keyed.url + path, json={"messages": msgs, "max_tokens": 2}, headers=AUTH)
        assert r.status_code == 400, (path, r.text)
        assert "text-only" in r.json()["error"]["message"]
    r = httpx.post(keyed.url + "/apply-template", json={"messages": [{"role": "user", "content": [{"type": "text", "text": "my words"}]}]},
                   headers=AUTH)
    assert r.status_code == 200 and "my words" in r.json()["prompt"] and "vision" not in r.json()["prompt"]


# ---- 6: API keys ------------------------------------------------------------------------

@pytest.mark.parametrize("args,env", [(["--api-key", ""], None), (["--api-key", ","], None), (["--api-key", "a,,b"], None),
                                      (["--api-key", "   "], None), (["--api-key", "a b"], None),
                                      ([], {"LILAC_API_KEY": ""}), ([], {"LILAC_API_KEY": " "})])
def test_empty_or_blank_keys_refused_at_start(args, env):
    r = run_bin("serve", "--model", demo_dir(), "--port", "0", "--backend", "cpu", *args, env=env)
    assert r.returncode != 0 and "API key" in r.stderr and "listening" not in r.stderr, r.stderr


def test_keys_trimmed():
    s = Server("--api-key", " k1 , k2 ")
    try:
        for k in ("k1", "k2", "  k2"):
            r = httpx.post(s.url + "/tokenize", json={"content": "a"}, headers={"Authorization": "Bearer " + k})
            assert r.status_code == 200, k
        r = httpx.post(s.url + "/tokenize", json={"content": "a"}, headers={"Authorization": "Bearer k3"})
        assert r.status_code == 401
    finally:
        _finish(s)


# ---- 7: Host allowlist and JSON-only POST -------------------------------------------------

def test_host_allowlist_on_loopback(keyed):
    for host, want in [(b"evil.example", 403), (b"attacker.test:8000", 403), (b"localhost", 200),
                       (b"localhost:%d" % keyed.port, 200), (b"127.0.0.1:%d" % keyed.port, 200), (b"[::1]:1", 200)]:
        got = exchange(keyed.port, b"GET /health HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
        assert status_of(got) == want, (host, got[:200])


def test_allowed_hosts_flag():
    s = Server("--allowed-hosts", "api.example,127.0.0.1")
    try:
        ok = exchange(s.port, b"GET /health HTTP/1.1\r\nHost: api.example:443\r\nConnection: close\r\n\r\n")
        bad = exchange(s.port, b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        assert status_of(ok) == 200 and status_of(bad) == 403
    finally:
        _finish(s)


def test_http11_without_host_refused(keyed):
    got = exchange(keyed.port, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert status_of(got) == 400
    got = exchange(keyed.port, b"GET /health HTTP/1.0\r\n\r\n")  # HTTP/1.0 has no Host requirement
    assert status_of(got) == 200


@pytest.mark.parametrize("ctype", [b"text/plain", b"application/x-www-form-urlencoded",
                                   b"multipart/form-data; boundary=x", b"application/jsonx", None])
def test_post_needs_json_content_type(keyed, ctype):
    body = json.dumps({"content": "a"}).encode()
    got = exchange(keyed.port, post_bytes("/tokenize", body, ctype=ctype, extra=AUTH_RAW))
    assert status_of(got) == 415, got[:300]
    got = exchange(keyed.port, post_bytes("/tokenize", body, ctype=b"Application/JSON; charset=utf-8", extra=AUTH_RAW))
    assert status_of(got) == 200


def test_cors_preflight_still_answered():
    s = Server("--cors-origin", "http://app.example")
    try:
        r = httpx.options(s.url + "/v1/chat/completions",
                          headers={"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                                   "Access-Control-Request-Headers": "content-type"})
        assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "http://app.example"
        assert "Content-Type" in r.headers["access-control-allow-headers"]
    finally:
        _finish(s)


# ---- 8: /metrics behind the key -----------------------------------------------------------

def test_metrics_behind_key(keyed):
    assert httpx.get(keyed.url + "/metrics").status_code == 401
    assert httpx.get(keyed.url + "/metrics", headers=AUTH).status_code == 200
    assert httpx.get(keyed.url + "/health").status_code == 200
    assert httpx.get(keyed.url + "/v1/models").status_code == 200


def test_metrics_public_flag():
    s = Server("--api-key", KEY, "--metrics-public")
    try:
        assert httpx.get(s.url + "/metrics").status_code == 200
        assert httpx.post(s.url + "/tokenize", json={"content": "a"}).status_code == 401
    finally:
        _finish(s)


# ---- "Also": protocol edges and bounded memory ----------------------------------------------

@pytest.mark.xfail(strict=True, reason="libmicrohttpd 0.9.75 answers a chunk-size line longer than its connection "
                   "buffer with its own 500 before lilac sees the request; see docs/server.md, Missing")
def test_long_chunk_extension_is_4xx(keyed):
    req = (b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + AUTH_RAW +
           b"Transfer-Encoding: chunked\r\n\r\n5;" + b"e" * 100000 + b"\r\nhello\r\n0\r\n\r\n")
    got = exchange(keyed.port, req)
    st = status_of(got)
    assert st is not None and 400 <= st < 500, got[:300]


def test_endless_chunked_body_refused_as_it_arrives(keyed):
    c = connect(keyed.port)
    c.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + AUTH_RAW +
              b"Transfer-Encoding: chunked\r\n\r\n")
    c.settimeout(0.05)
    got, sent = b"", 0
    chunk = b"4000\r\n" + b"a" * 0x4000 + b"\r\n"
    for _ in range(400):  # up to 6.5 MB; the limit is 64 KB
        try:
            c.sendall(chunk)
            sent += len(chunk)
        except OSError:
            break
        try:
            b = c.recv(4096)
            got += b
            if not b or got:
                break
        except socket.timeout:
            pass
        except OSError:
            break
    got += read_all(c, 2)
    c.close()
    assert sent < (1 << 20), sent  # refused long before the client stopped
    assert got.startswith(b"HTTP/1.1 413"), got[:200]


def test_json_value_count_bounded(limited):
    body = json.dumps({"prompt": [1] * 6000, "max_tokens": 1}).encode()
    r = httpx.post(limited.url + "/v1/completions", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413 and "JSON values" in r.json()["error"]["message"]


def test_tokenize_answer_capped(limited):
    r = httpx.post(limited.url + "/tokenize", json={"content": "a " * 400, "with_pieces": True}, headers=AUTH)
    assert r.status_code == 400 and "at most 200" in r.json()["error"]["message"]
    r = httpx.post(limited.url + "/tokenize", json={"content": "a " * 20}, headers=AUTH)
    assert r.status_code == 200


# ---- 12: CLI numbers ----------------------------------------------------------------------

@pytest.mark.parametrize("flag,value", [("--threads", "100000"), ("--timeout", "4294967296"), ("--parallel", "0"),
                                        ("--queue", "-1"), ("--prefill-chunk", "-5"), ("--port", "70000"),
                                        ("--max-body", "99999999999999999999"), ("--ping", "nan"),
                                        ("--max-conns", "0"), ("--header-timeout", "0"), ("--max-seq", "-3")])
def test_serve_numbers_range_checked(flag, value):
    r = run_bin("serve", "--model", demo_dir(), "--port", "0", "--backend", "cpu", flag, value)
    assert r.returncode != 0 and flag in r.stderr and "listening" not in r.stderr, r.stderr


def test_generate_max_tokens_range_checked():
    r = run_bin("generate", "--model", demo_dir(), "--ids", "1,2", "--max-tokens", "9223372036854775807")
    assert r.returncode != 0 and "--max-tokens" in r.stderr and "runtime error" not in r.stderr, r.stderr
    r = run_bin("generate", "--model", demo_dir(), "--ids", "1,2", "--threads", "100000")
    assert r.returncode != 0 and "--threads" in r.stderr


# ---- 9, 10, 11: hostile files ---------------------------------------------------------------

@pytest.fixture()
def model_copy(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(demo_dir(), d)
    return d


def shard_of(d):
    shards = sorted(d.glob("*.safetensors"))
    assert shards
    return shards[-1]


def test_fifo_config_refused(model_copy):
    (model_copy / "config.json").unlink()
    os.mkfifo(model_copy / "config.json")
    r = run_bin("info", "--model", str(model_copy), timeout=20)
    assert r.returncode != 0 and "config.json" in r.stderr and "regular file" in r.stderr, r.stderr


def test_dev_zero_config_refused(model_copy):
    (model_copy / "config.json").unlink()
    (model_copy / "config.json").symlink_to("/dev/zero")
    r = run_bin("info", "--model", str(model_copy), timeout=20)
    assert r.returncode != 0 and "regular file" in r.stderr, r.stderr


def test_fifo_shard_refused(model_copy):
    sh = shard_of(model_copy)
    sh.unlink()
    os.mkfifo(sh)
    r = run_bin("info", "--model", str(model_copy), timeout=20)
    assert r.returncode != 0 and "regular file" in r.stderr, r.stderr


@pytest.mark.parametrize("cut", [1, 3, 5])
def test_header_length_cut_into_padding_refused(model_copy, cut):
    sh = shard_of(model_copy)
    b = bytearray(sh.read_bytes())
    n = int.from_bytes(b[:8], "little")
    pad = len(b[8:8 + n]) - len(bytes(b[8:8 + n]).rstrip(b" "))
    if pad < cut:  # make room: pad the header with spaces, as writers do, then cut into them
        hdr = bytes(b[8:8 + n]) + b" " * 8
        b = bytearray(len(hdr).to_bytes(8, "little") + hdr + bytes(b[8 + n:]))
        n = len(hdr)
        ok = model_copy / "ok.check"
        sh.write_bytes(bytes(b))
        assert run_bin("info", "--model", str(model_copy)).returncode == 0  # the padded file loads
        ok.touch()
    b[:8] = (n - cut).to_bytes(8, "little")
    sh.write_bytes(bytes(b))
    r = run_bin("info", "--model", str(model_copy))
    assert r.returncode != 0 and "data bytes" in r.stderr, r.stderr


def test_shard_truncated_while_serving(model_copy):
    s = Server(model=str(model_copy))
    try:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, headers={})
        assert r.status_code == 200
        sh = shard_of(model_copy)
        os.truncate(sh, 64)
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hello again", "max_tokens": 2}, timeout=30)
        assert s.alive()
        assert r.status_code == 500 and "truncated" in r.json()["error"]["message"], r.text
        r = httpx.get(s.url + "/health")
        assert r.status_code == 503 and "truncated" in r.json()["error"]["message"]
    finally:
        _finish(s)
