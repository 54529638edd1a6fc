"""`lilac chat` on a pseudo-terminal, on the demo model: line editing and history (the up arrow
recalls an earlier line), /help, and a mistyped /command answered locally, never sent to the model."""
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LILAC = str(ROOT / os.environ.get("LILAC", "build/lilac"))


def demo():
    env = dict(os.environ, XDG_CACHE_HOME=str(ROOT / "build" / "test-cache"))
    r = subprocess.run([LILAC, "demo", "--build-only"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


class Tty:
    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                os.environ.update(TERM="xterm", ASAN_OPTIONS="detect_leaks=0")
                os.execv(LILAC, [LILAC, *args])
            finally:
                os._exit(127)  # the child never returns into pytest
        self.out = b""

    def expect(self, pattern, timeout=30):
        """Read until `pattern` (bytes regex) matches output not yet consumed; return the text up to it."""
        end = time.time() + timeout
        while time.time() < end:
            m = re.search(pattern, self.out)
            if m:
                got, self.out = self.out[:m.end()], self.out[m.end():]
                return got.decode(errors="replace")
            r, _, _ = select.select([self.fd], [], [], 0.1)
            if r:
                try:
                    self.out += os.read(self.fd, 4096)
                except OSError:
                    break
        raise AssertionError(f"no {pattern!r} in {self.out!r}")

    def send(self, b):
        os.write(self.fd, b)

    def close(self):
        self.send(b"\x04")
        end = time.time() + 20
        while time.time() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                os.read(self.fd, 4096)
            except OSError:
                pass
            time.sleep(0.05)
        os.kill(self.pid, 9)
        raise AssertionError("chat did not end at Ctrl-D")


def test_chat_line_editing_history_and_commands():
    t = Tty("chat", "--model", demo(), "--backend", "cpu", "--threads", "1", "--max-tokens", "4", "--max-seq", "1024")
    try:
        t.expect(rb"/help for the commands")
        t.expect(rb"> ")
        t.send(b"/help\r")
        assert "/nothink" in t.expect(rb"/nothink.*\n")
        t.expect(rb"> ")
        t.send(b"/typo and more\r")
        reply = t.expect(rb"> ")
        assert "unknown command /typo" in reply and "tokens," not in reply, reply
        # editing: type, move left, insert, erase; the model never sees the raw escape codes
        t.send(b"/hlp\x1b[D\x1b[De\r")  # "/hlp", left twice, "e" -> "/help"
        assert "/nothink" in t.expect(rb"/nothink.*\n")
        t.expect(rb"> ")
        # history: up twice is "/typo and more" (once would be "/help")
        t.send(b"\x1b[A\x1b[A\r")
        assert "unknown command /typo" in t.expect(rb"unknown command /typo.*\n")
        t.expect(rb"> ")
        t.send(b"hello\r")
        assert re.search(r"\[\d+ tokens, ", t.expect(rb"\[\d+ tokens, [^\]]*\]"))
        t.expect(rb"> ")
    finally:
        rc = t.close()
    assert rc == 0
