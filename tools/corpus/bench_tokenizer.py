#!/usr/bin/env python3
"""Encode throughput, one thread: lilac vs HF `tokenizers`, same text, same run.

    python3 tools/corpus/bench_tokenizer.py [--tokenizer PATH] [--lilac build/lilac] [--repeat 3]

Builds the corpus if needed (tests/fixtures/gen/corpus.jsonl), then times
  - lilac: `lilac tokenize --jsonl --special --time` (encode calls only, no I/O);
  - HF: Tokenizer.encode(doc) per document with RAYON_NUM_THREADS=1 (best of N).
Prints a Markdown table, overall and per corpus category.
"""
import argparse
import json
import os
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def lilac_mbps(lilac, tok, path, repeat):
    best = None
    for _ in range(repeat):
        r = subprocess.run([lilac, "tokenize", "--tokenizer", tok, "--special", "--jsonl", "--time", "--file", path],
                           capture_output=True, text=True, check=True)
        line = [x for x in r.stderr.splitlines() if "MB/s" in x][-1]
        mbps = float(line.split()[-2])
        best = mbps if best is None else max(best, mbps)
    return best


def hf_mbps(t, texts, repeat):
    nb = sum(len(s.encode()) for s in texts)
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        for s in texts:
            t.encode(s, add_special_tokens=False)
        dt = time.perf_counter() - t0
        best = nb / 1e6 / dt if best is None else max(best, nb / 1e6 / dt)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "..", "shared", "tokenizers", "qwen3", "tokenizer.json"))
    ap.add_argument("--lilac", default=os.path.join(ROOT, "build", "lilac"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--by-category", action="store_true")
    a = ap.parse_args()
    gen = os.path.join(ROOT, "tests", "fixtures", "gen")
    corpus = os.path.join(gen, "corpus.jsonl")
    if not os.path.isfile(corpus):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "corpus", "build_corpus.py"), "--out", corpus], check=True)
    docs = [json.loads(x) for x in open(corpus, encoding="utf-8")]
    t = Tokenizer.from_file(a.tokenizer)
    groups = {"all": docs}
    if a.by_category:
        for d in docs:
            groups.setdefault(d["cat"], []).append(d)
    print("| text | MB | lilac MB/s | HF tokenizers MB/s | speed-up |")
    print("|---|---:|---:|---:|---:|")
    for name, ds in groups.items():
        path = os.path.join(gen, f"bench_{name}.jsonl")
        with open(path, "w") as f:
            for d in ds:
                f.write(json.dumps(d["text"]) + "\n")
        mb = sum(len(d["text"].encode()) for d in ds) / 1e6
        lm = lilac_mbps(a.lilac, a.tokenizer, path, a.repeat)
        hm = hf_mbps(t, [d["text"] for d in ds], a.repeat)
        print(f"| {name} | {mb:.2f} | {lm:.1f} | {hm:.1f} | {lm / hm:.1f}x |")


if __name__ == "__main__":
    main()
