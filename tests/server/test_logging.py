"""The request log: one line per request with method, path, status, token counts, TTFT, duration
and finish reason, checked against what the client received; no prompt text unless --log-prompts;
--log-level filters."""
import re

import httpx
import pytest

from conftest import Server, _finish, demo_dir
from test_startup import run_bin

LINE = re.compile(r"(?P<level>error|warn|info|debug) serve: (?P<method>[A-Z]+) (?P<path>\S+) (?P<status>\d+|-) "
                  r"client=\S+(?: prompt_tokens=(?P<pt>\d+) completion_tokens=(?P<ct>\d+) ttft_s=(?P<ttft>[\d.]+|-))?"
                  r" duration_s=(?P<dur>[\d.]+)(?: finish=(?P<finish>\S+))?")

MARK = "zebra-marker-4172"


def request_lines(log):
    return [m.groupdict() for m in map(LINE.search, log.splitlines()) if m]


@pytest.fixture(scope="module")
def logged():
    s = Server()
    yield s
    _finish(s)


def test_one_line_per_request_with_its_numbers(logged):
    url = logged.url
    before = len(request_lines(logged.text()))
    r1 = httpx.post(url + "/v1/completions", json={"prompt": MARK, "max_tokens": 3}, timeout=60)
    r2 = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": MARK}],
                                                         "max_tokens": 2, "stream": True}, timeout=60)
    r3 = httpx.get(url + "/no/such/path")
    r4 = httpx.post(url + "/v1/completions", json={"prompt": MARK, "max_tokens": -5})
    r5 = httpx.get(url + "/v1/completions")
    assert [r.status_code for r in (r1, r2, r3, r4, r5)] == [200, 200, 404, 400, 405]
    lines = request_lines(logged.text())[before:]
    assert len(lines) == 5, logged.text()[-3000:]
    a, b, c, d, e = lines
    u = r1.json()
    assert (a["method"], a["path"], a["status"]) == ("POST", "/v1/completions", "200")
    assert int(a["pt"]) == u["usage"]["prompt_tokens"] and int(a["ct"]) == u["usage"]["completion_tokens"]
    assert a["finish"] == u["choices"][0]["finish_reason"] == "length"
    assert 0 <= float(a["ttft"]) <= float(a["dur"])
    assert (b["method"], b["path"], b["status"], b["ct"], b["finish"]) == ("POST", "/v1/chat/completions", "200", "2", "length")
    assert (c["method"], c["path"], c["status"]) == ("GET", "/no/such/path", "404")
    assert (d["status"], e["status"]) == ("400", "405")
    assert MARK not in logged.text()


def test_log_prompts_and_log_level():
    s = Server("--log-prompts")
    try:
        httpx.post(s.url + "/v1/completions", json={"prompt": MARK, "max_tokens": 1}, timeout=60)
        assert MARK in s.text()
    finally:
        _finish(s)
    s = Server("--log-level", "warn")
    try:
        httpx.post(s.url + "/v1/completions", json={"prompt": MARK, "max_tokens": 1}, timeout=60)
        httpx.get(s.url + "/nope")
        assert request_lines(s.text()) == [] and MARK not in s.text()
    finally:
        _finish(s)
    r = run_bin("serve", "--model", demo_dir(), "--port", "0", "--log-level", "verbose")
    assert r.returncode != 0 and "--log-level" in r.stderr and "listening" not in r.stderr
