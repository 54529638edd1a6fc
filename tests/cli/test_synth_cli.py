"""`lilac synth` as a command: it refuses to overwrite a non-empty directory without --force,
gives every checkpoint of two or more layers a full-attention layer, writes a tokenizer and chat
template that `lilac generate --chat` runs on, and reports progress unless --quiet."""
import json
import os
import subprocess
import time

import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LILAC = str(ROOT / os.environ.get("LILAC", "build/lilac"))
SMALL = ["--vocab", "1024", "--hidden", "256", "--experts", "8", "--inter", "64", "--seed", "3"]


def synth(out, *args):
    return subprocess.run([LILAC, "synth", "--out", str(out), *SMALL, *args], capture_output=True, text=True,
                          timeout=300)


def test_refuses_nonempty_dir_without_force(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    p = synth(out, "--layers", "1")
    assert p.returncode != 0
    assert "--force" in p.stderr and str(out) in p.stderr
    assert not (out / "config.json").exists()
    p = synth(out, "--layers", "1", "--force")
    assert p.returncode == 0, p.stderr
    assert (out / "config.json").exists()


def test_empty_existing_dir_is_fine(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    p = synth(out, "--layers", "1")
    assert p.returncode == 0, p.stderr


def layer_types(out):
    return json.loads((out / "config.json").read_text())["text_config"]["layer_types"]


def test_two_and_three_layers_have_attention(tmp_path):
    for n in (2, 3):
        out = tmp_path / f"m{n}"
        p = synth(out, "--layers", str(n))
        assert p.returncode == 0, p.stderr
        t = layer_types(out)
        assert len(t) == n and "full_attention" in t
        assert t[-1] == "full_attention"


def test_four_layers_keep_the_real_pattern(tmp_path):
    out = tmp_path / "m4"
    assert synth(out, "--layers", "4").returncode == 0
    assert layer_types(out) == ["linear_attention"] * 3 + ["full_attention"]


def added(out):
    return {a["content"]: a["id"] for a in json.loads((out / "tokenizer.json").read_text())["added_tokens"]}


def test_tokenizer_and_template_make_generate_chat_work(tmp_path):
    out = tmp_path / "m"
    assert synth(out, "--layers", "2").returncode == 0
    assert (out / "chat_template.jinja").read_text().startswith("{%- set image_count")
    ids = added(out)
    for name in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"):
        assert name in ids and 0 <= ids[name] < 1024
    tok = json.loads((out / "tokenizer.json").read_text())
    assert all(i < 1024 for i in tok["model"]["vocab"].values())
    p = subprocess.run([LILAC, "generate", "--model", str(out), "--backend", "cpu", "--prompt", "Hello there",
                        "--chat", "--max-tokens", "4"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([LILAC, "tokenize", "--model", str(out), "--special"], input="<|im_start|>user",
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert str(ids["<|im_start|>"]) in p.stdout


def test_tokenizer_checked_by_hf_tokenizers(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    out = tmp_path / "m"
    assert synth(out, "--layers", "1").returncode == 0
    t = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = added(out)
    enc = t.encode("<|im_start|>user\nHello, world!<|im_end|>").ids
    assert enc[0] == ids["<|im_start|>"] and enc[-1] == ids["<|im_end|>"]
    assert t.decode(enc[1:-1]) == "user\nHello, world!"


def test_full_vocab_puts_specials_at_the_real_ids(tmp_path):
    out = tmp_path / "m"
    p = subprocess.run([LILAC, "synth", "--out", str(out), "--layers", "1", "--hidden", "64", "--experts", "8",
                        "--inter", "64"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    ids = added(out)
    # The real Qwen3.6 ids (its config's eos_token_id is <|endoftext|>).
    assert ids["<|endoftext|>"] == 248044 and ids["<|im_start|>"] == 248045 and ids["<|im_end|>"] == 248046
    assert ids["<think>"] == 248068 and ids["</think>"] == 248069
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["text_config"]["eos_token_id"] == 248044


def test_progress_lines_unless_quiet(tmp_path):
    p = synth(tmp_path / "a", "--layers", "2")
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "tensors (" in ln]
    assert 9 <= len(lines) <= 11 and lines[-1].endswith("(100%)")
    p = synth(tmp_path / "b", "--layers", "2", "--quiet")
    assert p.returncode == 0 and p.stderr == ""


def test_bench_flushes_each_row(tmp_path):
    """Each row reaches a pipe when its context length is measured, not all at the end: the row for
    context 4 arrives well before the one for 256 (without a flush both come in one write at exit)."""
    out = tmp_path / "m"
    assert synth(out, "--layers", "1", "--quiet").returncode == 0
    p = subprocess.Popen([LILAC, "bench", "--model", str(out), "--backend", "cpu", "--prompt-lens", "4,256",
                          "--decode-steps", "2", "--rounds", "2"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True)
    seen = {}
    for line in p.stdout:
        first = line.split()[:1]
        if first in (["4"], ["256"]):
            seen[first[0]] = time.monotonic()
    assert p.wait(timeout=300) == 0
    assert set(seen) == {"4", "256"}
    assert seen["256"] - seen["4"] > 0.005


def test_convert_progress_lines_unless_quiet(tmp_path):
    """Off a terminal, convert prints a line per 10% of the bytes (and none with --quiet)."""
    import sys
    sys.path.insert(0, str(ROOT / "tests" / "convert"))
    import make_hf
    hf = make_hf.write_hf(tmp_path / "hf", make_hf.TINY, seed=1)
    p = subprocess.run([LILAC, "convert", "--from", str(hf), "--to", str(tmp_path / "a")], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "%" in ln and "GB/s" in ln and "ETA" in ln]
    assert 5 <= len(lines) <= 12, p.stderr
    p = subprocess.run([LILAC, "convert", "--from", str(hf), "--to", str(tmp_path / "b"), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stderr == "", p.stderr
