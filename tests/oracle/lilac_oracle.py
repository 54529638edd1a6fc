"""Helpers for the oracle tests: generated checkpoints and the lilac binary.

Environment:
  LILAC               path of the lilac binary (default build/lilac, relative to the repo root)
  LILAC_ORACLE_CASES  comma-separated subset of the cases in tools/oracle/cases.py (default: all)
  LILAC_TIMEOUT       seconds allowed per lilac run (default 1800)
  LILAC_FIXTURES      fixture root (default tests/fixtures/gen)
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "oracle"))

import cases as cases_mod  # noqa: E402
import make_case  # noqa: E402


def selected_cases():
    env = os.environ.get("LILAC_ORACLE_CASES", "").strip()
    names = [c.strip() for c in env.split(",") if c.strip()] if env else list(cases_mod.CASES)
    for n in names:
        if n not in cases_mod.CASES:
            raise pytest.UsageError(f"LILAC_ORACLE_CASES: unknown case {n!r}; known: {sorted(cases_mod.CASES)}")
    return names


def hf_cases():
    return [n for n in selected_cases() if cases_mod.CASES[n]["hf_twin"]]


def lilac_path():
    p = Path(os.environ.get("LILAC", "build/lilac"))
    return p if p.is_absolute() else REPO / p


TIMEOUT = float(os.environ.get("LILAC_TIMEOUT", "1800"))


def run_lilac(args, timeout=TIMEOUT):
    exe = lilac_path()
    if not exe.exists():
        pytest.fail(f"lilac binary not found at {exe} (build it with `make`, or set LILAC)", pytrace=False)
    cmd = [str(exe)] + [str(a) for a in args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail(f"lilac timed out after {timeout:.0f}s: {short_cmd(cmd)}", pytrace=False)


def short_cmd(cmd):
    s = " ".join(shlex.quote(c) for c in cmd)
    return s if len(s) < 300 else s[:250] + " ... " + s[-40:]


def describe(proc):
    err = proc.stderr.strip().splitlines()
    out = proc.stdout.strip().splitlines()
    return (
        f"command: {short_cmd(proc.args)}\nexit status: {proc.returncode}\n"
        f"stderr (last lines):\n  " + "\n  ".join(err[-15:]) + "\nstdout (last lines):\n  " + "\n  ".join(l[:300] for l in out[-5:])
    )


class Case:
    def __init__(self, name, path):
        self.name = name
        self.path = Path(path)
        import json

        self.meta = json.loads((self.path / "meta.json").read_text())
        self.mlx_dir = self.path / "mlx"
        self.hf_dir = self.path / "hf" if self.meta.get("hf_dir") else None
        self.ids = np.load(self.path / "ids.npy")
        self.ref = np.load(self.path / "ref_logits.npy")
        self.greedy = np.load(self.path / "greedy.npy")
        self.P = int(self.meta["P"])
        hf = self.path / "ref_logits_hf.npy"
        self.ref_hf = np.load(hf) if hf.exists() else None


_CASES = {}


def get_case(name):
    if name not in _CASES:
        root = os.environ.get("LILAC_FIXTURES") or None
        _CASES[name] = Case(name, make_case.ensure_case(name, root=root))
    return _CASES[name]


_LOGITS = {}


def lilac_logits(case, which, tmp_dir):
    """lilac's teacher-forced logits for case.ids on the 'mlx' or 'hf' directory (cached per session)."""
    key = (case.name, which)
    if key not in _LOGITS:
        model = case.mlx_dir if which == "mlx" else case.hf_dir
        out = Path(tmp_dir) / f"{case.name}-{which}-logits.npy"
        ids = ",".join(str(int(i)) for i in case.ids)
        proc = run_lilac(["logits", "--model", model, "--ids", ids, "--out", out])
        if proc.returncode != 0:
            _LOGITS[key] = AssertionError(f"lilac logits failed on {model}\n{describe(proc)}")
        elif not out.exists():
            _LOGITS[key] = AssertionError(f"lilac logits exited 0 but wrote no {out}\n{describe(proc)}")
        else:
            try:
                _LOGITS[key] = np.load(out)
            except Exception as e:  # noqa: BLE001
                _LOGITS[key] = AssertionError(f"cannot read lilac's {out} as .npy: {e}")
    v = _LOGITS[key]
    if isinstance(v, AssertionError):
        pytest.fail(str(v), pytrace=False)
    return v
