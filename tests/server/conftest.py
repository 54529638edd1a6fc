"""Fixtures for the `lilac serve` tests: the real server binary on the demo model.

The binary is $LILAC_SERVE_BIN, else $LILAC, else build/lilac (tests/run.sh sets
LILAC=build/lilac; point LILAC_SERVE_BIN at build/asan/lilac to run the whole
suite under AddressSanitizer + UBSan). The demo model is built once into
build/test-cache (XDG_CACHE_HOME) by `lilac demo --build-only`.

Every server runs with --test-hooks, which makes it honour the request field
"lilac_forced_output": the engine then emits the tokens of that text instead of
sampling (still through prefill, the decode loop, the streaming detokenizer,
stop strings and the output parser). A random-weight model only produces
gibberish, so this is how tool calls, reasoning and stop strings are tested
end to end with exact expectations.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = os.environ.get("LILAC_SERVE_BIN") or os.environ.get("LILAC") or str(REPO / "build" / "lilac")
if not os.path.isabs(BIN):
    BIN = str(REPO / BIN)
CACHE = REPO / "build" / "test-cache"


def demo_dir():
    env = dict(os.environ, XDG_CACHE_HOME=str(CACHE))
    out = subprocess.run([BIN, "demo", "--build-only"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


class Server:
    def __init__(self, *extra, env=None, model=None):
        self.model = model or demo_dir()
        self.log_path = CACHE / f"serve-{os.getpid()}-{time.time_ns()}.log"
        self.log = open(self.log_path, "w+")
        args = [BIN, "serve", "--model", self.model, "--port", "0", "--backend", "cpu", "--threads", "1",
                "--test-hooks", "--max-seq", "2048", *extra]
        e = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
        if env:
            e.update(env)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log, env=e)
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline:
            self.log.seek(0)
            m = re.search(r"listening on http://[\d.]+:(\d+)", self.log.read())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        assert self.port, self.text()
        self.url = f"http://127.0.0.1:{self.port}"
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError("server never became healthy:\n" + self.text())

    def text(self):
        self.log.flush()
        return self.log_path.read_text()

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        """SIGTERM; returns (exit code, log)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode, self.text()


def _finish(server):
    rc, log = server.stop()
    # a clean shutdown, and nothing from the sanitizers
    assert rc == 0, f"server exit code {rc}\n{log[-4000:]}"
    assert "ERROR: AddressSanitizer" not in log and "runtime error:" not in log and "LeakSanitizer" not in log, log[-6000:]


@pytest.fixture(scope="session")
def server():
    s = Server("--parallel", "2", "--ping", "0.2")
    yield s
    _finish(s)


@pytest.fixture(scope="session")
def keyed_server():
    s = Server("--api-key", "sekret-key", "--max-body", "65536", "--cors-origin", "http://example.com")
    yield s
    _finish(s)


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def sse_events(text):
    """Parse an SSE body into a list of data payloads (strings); comments dropped."""
    out = []
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                out.append(line[6:])
    return out
