"""`--quantize`: an HF bf16 checkpoint quantized in memory at load computes exactly what the
checkpoint `lilac convert` writes computes (and convert is byte-identical to mlx-lm's
conversion, tests/convert). Uses the tiny oracle case with its HF twin (tools/oracle)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "oracle"))
import make_case  # noqa: E402

LILAC = str(ROOT / os.environ.get("LILAC", "build/lilac"))


def logits(model, ids, out, *extra):
    p = subprocess.run([LILAC, "logits", "--model", str(model), "--ids", ",".join(map(str, ids)), "--out", str(out),
                        *extra], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return np.load(out)


def test_quantize_at_load_equals_convert(tmp_path):
    case = Path(make_case.ensure_case("tiny", root=os.environ.get("LILAC_FIXTURES") or None, hf_twin=True))
    hf = case / "hf"
    ids = [int(x) for x in np.load(case / "ids.npy")[:96]]
    conv = tmp_path / "converted"
    p = subprocess.run([LILAC, "convert", "--from", str(hf), "--to", str(conv)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    a = logits(hf, ids, tmp_path / "a.npy", "--quantize")
    b = logits(conv, ids, tmp_path / "b.npy")
    assert a.shape == b.shape
    assert np.array_equal(a, b), f"max abs diff {np.abs(a - b).max()}"
    # And it is a real change: without --quantize the bf16 weights give different logits.
    c = logits(hf, ids, tmp_path / "c.npy")
    assert not np.array_equal(a, c)
    # `info` reports the quantized form.
    p = subprocess.run([LILAC, "info", "--model", str(hf), "--quantize"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "experts" in p.stdout
