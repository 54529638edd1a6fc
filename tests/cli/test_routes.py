"""`lilac logits --routes`: the experts lilac picked, per layer and token, against the experts MLX-LM picks
on the same checkpoint (the tiny oracle case, tools/oracle). tools/device/hf_full.py replays this table in
HF transformers, so a wrong table would make that check compare the wrong thing."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "oracle"))
import make_case  # noqa: E402

LILAC = str(ROOT / os.environ.get("LILAC", "build/lilac"))


def mlx_routes(mlx_dir, ids):
    """MLX-LM's top-k experts [layer][token][k] (as sets) and the k-th/(k+1)-th router logit gap."""
    import mlx.core as mx
    from mlx_lm.models.qwen3_next import Qwen3NextSparseMoeBlock as Blk

    picks, gaps = [], []
    orig = Blk.__call__

    def probe(self, x):
        lg = np.array(self.gate(x).astype(mx.float32)).reshape(-1, self.num_experts)
        order = np.argsort(-lg, axis=1, kind="stable")
        picks.append(np.sort(order[:, :self.top_k], axis=1))
        s = np.take_along_axis(lg, order, axis=1)
        gaps.append(s[:, self.top_k - 1] - s[:, self.top_k])
        return orig(self, x)

    model, _ = make_case.load_f32(mlx_dir)
    Blk.__call__ = probe
    try:
        make_case.forward_logits(model, ids)
    finally:
        Blk.__call__ = orig
    return np.stack(picks), np.stack(gaps)


def test_routes_match_mlx(tmp_path):
    case = Path(make_case.ensure_case("tiny", root=os.environ.get("LILAC_FIXTURES") or None))
    ids = [int(x) for x in np.load(case / "ids.npy")[:64]]
    out, routes = tmp_path / "logits.npy", tmp_path / "routes.npy"
    p = subprocess.run([LILAC, "logits", "--model", str(case / "mlx"), "--backend", "cpu", "--ids",
                        ",".join(map(str, ids)), "--out", str(out), "--routes", str(routes)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    got = np.load(routes)
    want, gap = mlx_routes(case / "mlx", ids)
    assert got.dtype == np.int32 and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    assert got.min() >= 0, "a token-layer was not recorded"
    # each row: top_k distinct experts
    srt = np.sort(got, axis=2)
    assert (np.diff(srt, axis=2) > 0).all()
    # The same sets wherever MLX's k-th and (k+1)-th logits are apart by more than rounding can move them.
    clear = gap > 1e-4
    assert clear.mean() > 0.9, f"only {clear.mean():.2f} of token-layers without a near-tie: a poor test case"
    same = (srt == want).all(axis=2)
    bad = np.argwhere(clear & ~same)
    assert not len(bad), f"{len(bad)} token-layers route differently from MLX-LM, first (layer, token) {bad[0]}"


def test_routes_refuses_bad_path(tmp_path):
    case = Path(make_case.ensure_case("tiny", root=os.environ.get("LILAC_FIXTURES") or None))
    p = subprocess.run([LILAC, "logits", "--model", str(case / "mlx"), "--backend", "cpu", "--ids", "1,2,3",
                        "--out", str(tmp_path / "l.npy"), "--routes", str(tmp_path / "no" / "such" / "r.npy")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode != 0 and "r.npy" in p.stderr, p.stderr
