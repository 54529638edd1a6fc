"""`lilac synth` as a command: it refuses to overwrite a non-empty directory without --force,
gives every checkpoint of two or more layers a full-attention layer, writes a tokenizer and chat
template that `lilac generate --chat` runs on, and reports progress unless --quiet."""
import json
import os
import subprocess
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
