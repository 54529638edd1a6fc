"""`lilac <command> --help` for every command: each flag the command's parser takes (read from the
C source, the independent reference) appears in its help, and asking for help does nothing else;
`lilac --version`; the llama.cpp and vLLM spellings of the flags."""
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LILAC = str(ROOT / os.environ.get("LILAC", "build/lilac"))
SOURCES = {p: p.read_text() for p in (ROOT / "src").rglob("*.c")}

# command -> the functions whose option parsing it runs
PARSERS = {
    "info": ["cmd_info", "common_opt"], "logits": ["cmd_logits", "common_opt"],
    "generate": ["cmd_generate", "common_opt"], "bench": ["cmd_bench"], "tokenize": ["cmd_tokenize"],
    "detokenize": ["cmd_detokenize"], "render": ["cmd_render"], "serve": ["serve_main", "engine_opt"],
    "demo": ["cmd_demo", "serve_main", "engine_opt"], "chat": ["cmd_chat", "engine_opt"],
    "convert": ["cmd_convert"], "synth": ["cmd_synth"],
}


def body(fn):
    for text in SOURCES.values():
        m = re.search(r"^[a-z_ ]*\b" + fn + r"\([^)]*\) \{", text, re.M)
        if m:
            i, depth = m.end(), 1
            while depth:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            return text[m.end():i]
    raise AssertionError(f"no definition of {fn}")


def flags_parsed(cmd):
    found = set()
    for fn in PARSERS[cmd]:
        b = body(fn)
        found |= set(re.findall(r'opt_\w+\(argc, argv, &?i, "(--[\w-]+)"', b))
        found |= set(re.findall(r'strn?cmp\(argv\[i\], "(--[\w-]+)=?"', b))
    if cmd == "serve":  # serve_main skips demo's own flags, only when it serves the demo
        found -= {"--rebuild", "--out"}
    return found - {"--help"}


def run(*args, **kw):
    return subprocess.run([LILAC, *args], capture_output=True, text=True, timeout=60, **kw)


@pytest.mark.parametrize("cmd", sorted(PARSERS))
def test_help_lists_every_flag(cmd, tmp_path):
    flags = flags_parsed(cmd)
    assert flags, cmd
    r = run(cmd, "--help", cwd=tmp_path, env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), HOME=str(tmp_path)))
    assert r.returncode == 0 and r.stdout.startswith("usage: lilac " + cmd), r.stdout + r.stderr
    missing = [f for f in flags if not re.search(re.escape(f) + r"\b", r.stdout)]
    assert not missing, f"lilac {cmd} --help does not list {missing}"
    assert run("help", cmd).stdout == r.stdout
    # no side effect: nothing written (demo would otherwise build its model into the cache)
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))


def test_help_gives_defaults():
    out = run("serve", "--help").stdout
    for flag, default in [("--port", "8000"), ("--host", "127.0.0.1"), ("--parallel", "1"), ("--queue", "64"),
                          ("--log-level", "info"), ("--timeout", "60")]:
        entry = re.search(r"^  " + flag + r" .*(\n {20,}.*)*", out, re.M).group(0)
        assert f"default {default}" in entry, entry


def test_version():
    a, b = run("--version"), run("version")
    assert a.returncode == 0 and re.match(r"lilac \d+\.\d+\.\d+\n", a.stdout), a.stdout
    assert a.stdout == b.stdout


def demo(tmp_path_factory=None):
    env = dict(os.environ, XDG_CACHE_HOME=str(ROOT / "build" / "test-cache"))
    return run("demo", "--build-only", env=env).stdout.strip()


def test_aliases():
    d = demo()
    ref = run("generate", "--model", d, "--prompt", "hi", "--chat", "--no-thinking", "--max-tokens", "3", "--threads", "1")
    assert ref.returncode == 0, ref.stderr
    for args in (["-m", d, "--no-think", "-t", "1"], [f"--model={d}", "--no-think", "--threads=1"]):
        r = run("generate", *args, "--prompt", "hi", "--chat", "--max-tokens", "3")
        assert r.returncode == 0 and r.stdout == ref.stdout, r.stderr
    # a bad value names the spelling typed and the flag it stands for
    r = run("serve", "--model", d, "--ctx-size", "lots")
    assert r.returncode != 0 and "--ctx-size (--max-seq)" in r.stderr, r.stderr
    r = run("chat", "--model", d, "--no-thinking", "--max-model-len", "-1")
    assert r.returncode != 0 and "--max-model-len (--max-seq)" in r.stderr, r.stderr


def test_unknown_option_points_at_the_commands_help():
    r = run("serve", "--no-such-flag")
    assert r.returncode != 0 and "lilac serve --help" in r.stderr
