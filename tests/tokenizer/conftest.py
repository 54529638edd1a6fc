"""Shared fixtures for lilac's tokenizer and chat-template tests against the
outside oracles (HF `tokenizers`, `jinja2`, `transformers`)."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(ROOT, "tests", "data")
QWEN3_TOK = os.path.join(DATA, "tokenizers", "qwen3", "tokenizer.json")
TEMPLATE_DIR = os.path.join(DATA, "templates", "qwen3.6")
GEN = os.path.join(ROOT, "tests", "fixtures", "gen")
os.makedirs(GEN, exist_ok=True)

# The Qwen3.5/3.6 split regex (spec/model.md section 5): adds \p{M} to letter runs.
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def lilac_bin():
    b = os.environ.get("LILAC", "build/lilac")
    return b if os.path.isabs(b) else os.path.join(ROOT, b)


def run_lilac(args, input=None, check=True):
    r = subprocess.run([lilac_bin()] + list(args), input=input, capture_output=True)
    if check and r.returncode != 0:
        raise AssertionError(f"lilac {' '.join(args)} failed ({r.returncode}): {r.stderr.decode(errors='replace')}")
    return r


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)
    os.replace(tmp, path)


@pytest.fixture(scope="session")
def tokenizer_files():
    """name -> path: the real Qwen3 tokenizer.json and copies derived from it."""
    assert os.path.isfile(QWEN3_TOK), f"missing {QWEN3_TOK}"
    os.makedirs(GEN, exist_ok=True)
    base = json.load(open(QWEN3_TOK, encoding="utf-8"))
    out = {"qwen3": QWEN3_TOK}

    d = json.loads(json.dumps(base))
    d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN35_REGEX
    out["qwen35"] = os.path.join(GEN, "tokenizer_qwen35.json")
    _write_json(out["qwen35"], d)

    for name in ("qwen3", "qwen35"):  # no added tokens: the oracle for plain (safe) mode
        d = json.load(open(out[name], encoding="utf-8"))
        d["added_tokens"] = []
        out[name + "_noadded"] = os.path.join(GEN, f"tokenizer_{name}_noadded.json")
        _write_json(out[name + "_noadded"], d)

    d = json.loads(json.dumps(base))  # merges in the legacy "a b" string form
    d["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in d["model"]["merges"]]
    out["qwen3_strmerges"] = os.path.join(GEN, "tokenizer_qwen3_strmerges.json")
    _write_json(out["qwen3_strmerges"], d)
    return out


@pytest.fixture(scope="session")
def corpus():
    """The generated corpus: list of {"cat", "text"}; also written as JSON strings
    one per line (tests/fixtures/gen/corpus_text.jsonl) for `lilac tokenize --jsonl`."""
    os.makedirs(GEN, exist_ok=True)
    path = os.path.join(GEN, "corpus.jsonl")
    builder = os.path.join(ROOT, "tools", "corpus", "build_corpus.py")
    stamp = hashlib.sha256(open(builder, "rb").read()).hexdigest()
    stamp_path = path + ".stamp"
    if not (os.path.isfile(path) and os.path.isfile(stamp_path) and open(stamp_path).read() == stamp):
        subprocess.run([sys.executable, builder, "--out", path], check=True)
        open(stamp_path, "w").write(stamp)
    docs = [json.loads(line) for line in open(path, encoding="utf-8")]
    text_path = os.path.join(GEN, "corpus_text.jsonl")
    with open(text_path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d["text"]) + "\n")
    return {"docs": docs, "text_path": text_path,
            "bytes": sum(len(d["text"].encode("utf-8")) for d in docs)}
