"""`lilac bench` on the CPU backend (the tiny oracle case): the JSON it writes, and that the tokens it decodes
are the greedy tokens `lilac generate` produces for the same prompt (whose greedy path tests/oracle holds to
MLX-LM), via its digest. Speed is not tested here: only the shape and honesty of the report."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "oracle"))
import make_case  # noqa: E402

LILAC = str(ROOT / os.environ.get("LILAC", "build/lilac"))


def fnv1a(ids):
    """bench.c's digest: FNV-1a 64 over the ids' little-endian bytes."""
    h = 0xCBF29CE484222325
    for t in ids:
        for b in range(4):
            h ^= ((t & 0xFFFFFFFF) >> (8 * b)) & 0xFF
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@pytest.fixture(scope="module")
def tiny():
    return Path(make_case.ensure_case("tiny", root=os.environ.get("LILAC_FIXTURES") or None)) / "mlx"


def test_bench_json_and_digest(tiny, tmp_path):
    steps, lens = 6, [5, 17]
    out = tmp_path / "bench.json"
    p = subprocess.run([LILAC, "bench", "--model", str(tiny), "--backend", "cpu", "--prompt-lens",
                        ",".join(map(str, lens)), "--decode-steps", str(steps), "--rounds", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "TTFT ms" in p.stdout
    rep = json.loads(out.read_text())
    assert rep["backend"] == "cpu" and rep["decode_steps"] == steps and rep["rounds"] == 2
    assert [r["prompt_len"] for r in rep["results"]] == lens
    cfg = json.loads((tiny / "config.json").read_text())
    tc = cfg.get("text_config", cfg)
    V = tc.get("vocab_size") or cfg["vocab_size"]
    # the decode roofline's bytes grow with the context by the KV cache alone: K and V of every full-attention
    # layer, 4 bytes an element on the CPU (f32 cache), counted from the checkpoint's config
    n_full = sum(1 for t in tc["layer_types"] if t == "full_attention")
    kv_per_pos = 2 * 4 * n_full * tc["num_key_value_heads"] * tc["head_dim"]
    b = [r["decode_bytes_per_token"] for r in rep["results"]]
    assert b[1] - b[0] == pytest.approx(kv_per_pos * (lens[1] - lens[0]), rel=1e-6)
    for r in rep["results"]:
        L = r["prompt_len"]
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0
        assert r["ttft_ms"] == pytest.approx(1e3 * L / r["prefill_tok_s"], rel=1e-3, abs=1e-3)  # printed to 3 decimals
        assert r["digest_stable"] is True
        # the prompt bench feeds (synthetic ids, as hf_full.py makes them) through `lilac generate`
        ids = [((i * 2654435761) % 2**32) % V for i in range(L)]
        g = subprocess.run([LILAC, "generate", "--model", str(tiny), "--backend", "cpu", "--ids",
                            ",".join(map(str, ids)), "--max-tokens", str(steps + 1), "--ignore-eos"],
                           capture_output=True, text=True, timeout=600)
        assert g.returncode == 0, g.stderr
        toks = [int(x) for x in g.stdout.split()]
        assert len(toks) == steps + 1
        # bench times the prefill up to the first token, then decodes `steps` more: its digest covers those
        assert r["token_digest"] == "%016x" % fnv1a(toks[1:]), (toks, r["token_digest"])


def test_bench_two_token_timing_leaves_the_decode_alone(tiny):
    """LILAC_BENCH_TWO times forward() of one and two tokens after each length's rounds: a line per length, and
    the next length's digest must be the one the plain bench gives (the extra positions must fit the session and
    not leak into the next length's rounds)."""
    lens = ["5", "17"]
    base = [LILAC, "bench", "--model", str(tiny), "--backend", "cpu", "--prompt-lens", ",".join(lens),
            "--decode-steps", "6", "--rounds", "1"]
    plain = subprocess.run(base, capture_output=True, text=True, timeout=600)
    two = subprocess.run(base, capture_output=True, text=True, timeout=600, env={**os.environ, "LILAC_BENCH_TWO": "1"})
    assert plain.returncode == 0 and two.returncode == 0, (plain.stderr, two.stderr)
    timing = [l.split() for l in two.stdout.splitlines() if "forward() of one token" in l]
    assert [t[0] for t in timing] == lens, two.stdout
    digests = lambda out: [l.split()[-1] for l in out.splitlines() if l.split() and l.split()[0] in lens
                           and "forward()" not in l]
    assert digests(two.stdout) == digests(plain.stdout) and len(digests(plain.stdout)) == 2, (plain.stdout, two.stdout)


def test_bench_rejects_bad_options(tiny):
    for bad in (["--rounds", "0"], ["--prompt-lens", "12,x"]):
        p = subprocess.run([LILAC, "bench", "--model", str(tiny), "--backend", "cpu", *bad], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode != 0 and p.stderr.strip(), (bad, p.stderr)
