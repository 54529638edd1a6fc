"""`lilac generate --prompt/--chat`: text in, text out, checked against HF `tokenizers`
(encode and decode) and jinja2-free: the chat form must equal `lilac render` + HF encode
of the rendered text with specials on (no user text here contains special-token strings)."""
import os
import subprocess

import pytest
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LILAC = os.path.join(ROOT, os.environ.get("LILAC", "build/lilac"))


def run(*args, check=True):
    p = subprocess.run([LILAC, *args], capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    p = subprocess.run([LILAC, "demo", "--build-only"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    dirs = [os.path.join(cache, "lilac", d) for d in os.listdir(os.path.join(cache, "lilac"))]
    assert len(dirs) == 1
    return dirs[0]


def greedy_ids(model, ids, n):
    out = run("generate", "--model", model, "--ids", ",".join(map(str, ids)), "--max-tokens", str(n),
              "--ignore-eos").stdout.split()
    return [int(x) for x in out]


def test_prompt_matches_hf_encode_and_decode(demo):
    tok = Tokenizer.from_file(os.path.join(demo, "tokenizer.json"))
    text = "The quick brown fox, naïve café — 123."
    ids = tok.encode(text, add_special_tokens=False).ids
    n = 16
    gen = greedy_ids(demo, ids, n)
    assert len(gen) == n
    out = run("generate", "--model", demo, "--prompt", text, "--max-tokens", str(n), "--ignore-eos").stdout
    assert out.rstrip("\n") == tok.decode(gen, skip_special_tokens=True)


def test_chat_prompt_is_the_rendered_template(demo):
    tok = Tokenizer.from_file(os.path.join(demo, "tokenizer.json"))
    msg = os.path.join(os.path.dirname(demo), "msgs.json")
    with open(msg, "w") as f:
        f.write('[{"role": "user", "content": "Hello there"}]')
    rendered = run("render", "--model", demo, "--messages", msg, "--no-thinking").stdout
    ids = tok.encode(rendered, add_special_tokens=False).ids
    n = 12
    gen = greedy_ids(demo, ids, n)
    out = run("generate", "--model", demo, "--prompt", "Hello there", "--chat", "--no-thinking",
              "--max-tokens", str(n), "--ignore-eos").stdout
    assert out.rstrip("\n") == tok.decode(gen, skip_special_tokens=True)


def test_prompt_without_tokenizer_is_a_clear_error(tmp_path):
    p = run("generate", "--model", str(tmp_path), "--prompt", "x", check=False)
    assert 0 < p.returncode < 128 and p.stderr.startswith("lilac: ")
