"""`lilac serve` start-up: a busy port and a bad model fail before anything is announced, the
start-up lines say what was loaded and where, the context defaults to the model's own (read here
from its config.json), --host takes names and IPv6, and out-of-range values are errors."""
import json
import os
import re
import resource
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from conftest import BIN, _finish, demo_dir

ASAN = "asan" in BIN


def run_bin(*args, timeout=30, **kw):
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, env=env, **kw)


def model_max_pos(d):
    cfg = json.loads((Path(d) / "config.json").read_text())
    return (cfg.get("text_config") or cfg)["max_position_embeddings"]


class Proc:
    """A server started without the conftest defaults (no --max-seq): the log read until "listening"."""

    def __init__(self, *args, preexec_fn=None):
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
        self.p = subprocess.Popen([BIN, "serve", "--model", demo_dir(), "--port", "0", "--backend", "cpu",
                                   "--threads", "1", *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  text=True, env=env, preexec_fn=preexec_fn)
        self.log = ""
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.p.stderr.readline()
            if not line:
                break
            self.log += line
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                return
        self.p.wait(timeout=30)
        raise AssertionError(f"no 'listening' line (exit {self.p.returncode}):\n{self.log}")

    def stop(self):
        self.p.terminate()
        rest = self.p.communicate(timeout=30)[1]
        return self.p.returncode, self.log + rest


def test_busy_port_fails_with_one_line(server):
    # the first server holds the port: a second one must not share it (SO_REUSEPORT would let it)
    t0 = time.time()
    r = run_bin("serve", "--model", demo_dir(), "--port", str(server.port), "--backend", "cpu")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode != 0, r.stderr
    assert len(lines) == 1 and str(server.port) in lines[0] and "in use" in lines[0], r.stderr
    assert "listening" not in r.stderr and time.time() - t0 < 20
    assert httpx.get(server.url + "/health").status_code == 200


def test_bad_model_fails_before_announcing():
    r = run_bin("serve", "--model", "/nonexistent", "--port", "0", "--backend", "cpu")
    assert r.returncode != 0 and "/nonexistent" in r.stderr, r.stderr
    assert "listening" not in r.stderr, r.stderr


def test_max_seq_beyond_the_model_is_an_error():
    limit = model_max_pos(demo_dir())
    for flag in ("--max-seq", "-c", "--ctx-size", "--max-model-len"):
        r = run_bin("serve", "--model", demo_dir(), "--port", "0", "--backend", "cpu", flag, str(limit + 1))
        assert r.returncode != 0 and str(limit) in r.stderr and "max_position_embeddings" in r.stderr, r.stderr
        assert "listening" not in r.stderr
    r = run_bin("serve", "--model", demo_dir(), "--port", "0", "--parallel", "0")
    assert r.returncode != 0 and "--parallel" in r.stderr


def test_startup_lines_say_what_and_where(server):
    log = server.text()
    assert re.search(r"loaded \S+ \(MLX 4-bit, group 64, 4 layers of which 1 attention, 16 experts, [\d.]+ MB\) in [\d.]+ s", log), log
    assert "backend cpu, 1 thread" in log, log
    assert re.search(r"context 2048 tokens per slot \(--max-seq\), 2 slot\(s\): KV cache and state [\d.]+ GiB per slot", log), log
    # the order: what was loaded, then where it listens
    assert log.index("loaded ") < log.index("listening on "), log


def test_default_context_is_the_models():
    s = Proc()
    try:
        limit = model_max_pos(demo_dir())
        assert f"context {limit} tokens per slot (the model's maximum)" in s.log, s.log
        m = httpx.get(s.url + "/v1/models").json()["data"][0]
        assert m["max_model_len"] == limit
    finally:
        rc, log = s.stop()
    assert rc == 0, log


@pytest.mark.skipif(ASAN, reason="ASan reserves more address space than any limit leaves")
def test_default_context_fits_memory():
    # 64 slots of the demo's full context need 16 GiB of KV cache; an address-space limit 3 GiB
    # above what the process maps at start leaves room for far less: the context shrinks and says why
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    s = Proc("--parallel", "64", preexec_fn=limit)
    try:
        m = re.search(r"context (\d+) tokens per slot, not the model's (\d+): .* more than the ([\d.]+) GiB of host "
                      r"memory free", s.log)
        assert m, s.log
        ctx, full, free = int(m.group(1)), int(m.group(2)), float(m.group(3))
        assert full == model_max_pos(demo_dir()) and 1024 <= ctx < full and ctx % 1024 == 0
        assert free < 6
        assert httpx.get(s.url + "/v1/models").json()["data"][0]["max_model_len"] == ctx
    finally:
        s.stop()


def ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as k:
            k.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("host,url_host", [("localhost", "127.0.0.1"), ("::1", "[::1]"), ("[::1]", "[::1]")])
def test_host_names_and_ipv6(host, url_host):
    if ":" in host and not ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    s = Proc("--host", host)
    try:
        assert s.url.startswith(f"http://{url_host}:"), s.log
        r = httpx.get(s.url + "/health")
        assert r.status_code == 200 and r.json() == {"status": "ok"}
    finally:
        rc, log = s.stop()
    assert rc == 0, log


def test_bad_host_is_an_error():
    r = run_bin("serve", "--model", demo_dir(), "--port", "0", "--host", "no.such.host.invalid")
    assert r.returncode != 0 and "--host" in r.stderr and "listening" not in r.stderr, r.stderr


def test_make_run_without_model_serves_the_demo():
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, MODEL="", LILAC_MODEL="", XDG_CACHE_HOME=str(repo / "build" / "test-cache"))
    p = subprocess.Popen(["make", "--no-print-directory", "run", "NO_CUDA=1", "ARGS=--port 0 --backend cpu --threads 1"],
                         cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    log = ""
    try:
        deadline = time.time() + 120
        url = None
        while time.time() < deadline and url is None:
            line = p.stdout.readline()
            if not line:
                break
            log += line
            m = re.search(r"listening on (http://\S+)", line)
            url = m and m.group(1)
        assert url, log
        assert "lilac demo: model in" in log, log
        assert httpx.get(url + "/health").status_code == 200
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
