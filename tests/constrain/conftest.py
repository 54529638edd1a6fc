"""The constraint engine's test binary (build/tests/test_constrain, or the one
beside $LILAC's build, e.g. build/asan/tests/test_constrain) in batch mode."""
import json
import os
import subprocess
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def constrain_bin():
    lilac = os.environ.get("LILAC", "build/lilac")
    if not os.path.isabs(lilac):
        lilac = os.path.join(ROOT, lilac)
    return os.path.join(os.path.dirname(lilac), "tests", "test_constrain")


def run_batch(cases, n, seed, max_tokens):
    """cases: [(kind, text)] -> one dict per case: {"error"} or {"samples": [...]}."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for kind, text in cases:
            f.write(json.dumps({"kind": kind, "text": text}, ensure_ascii=False) + "\n")
        path = f.name
    try:
        r = subprocess.run([constrain_bin(), "batch", path, str(n), str(seed), str(max_tokens)],
                           cwd=ROOT, capture_output=True, timeout=1200)
    finally:
        os.unlink(path)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    out = [json.loads(l) for l in r.stdout.decode().splitlines()]
    assert len(out) == len(cases)
    return out


def texts(result):
    """(ended, text) per sample; text decoded as strict UTF-8 (a failure is a bug)."""
    return [(s["ended"], bytes.fromhex(s["hex"]).decode("utf-8"), s.get("problem")) for s in result["samples"]]
