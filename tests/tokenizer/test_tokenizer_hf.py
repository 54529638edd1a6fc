"""lilac's tokenizer against HF `tokenizers` on the real Qwen3 tokenizer.json and
on a copy with the Qwen3.5/3.6 regex, over the generated multi-script corpus."""
import json
import os
import unicodedata

import pytest
from tokenizers import Tokenizer

from conftest import GEN, run_lilac

CATEGORIES = ["prose", "contractions", "emoji", "combining", "code", "numbers", "whitespace",
              "random_assigned", "random_any", "added", "edge", "normforms"]

_cache = {}


def lilac_ids(tok_path, text_path, special):
    key = (tok_path, text_path, special)
    if key not in _cache:
        args = ["tokenize", "--tokenizer", tok_path, "--jsonl", "--file", text_path]
        if special:
            args.append("--special")
        out = run_lilac(args).stdout.decode()
        _cache[key] = [[int(x) for x in line.split()] for line in out.split("\n")[:-1]]
    return _cache[key]


def hf_ids(tok_path, docs):
    key = ("hf", tok_path)
    if key not in _cache:
        t = Tokenizer.from_file(tok_path)
        _cache[key] = [e.ids for e in t.encode_batch([d["text"] for d in docs], add_special_tokens=False)]
    return _cache[key]


def describe(tok_path, mine, ref):
    t = Tokenizer.from_file(tok_path)
    k = next((j for j in range(min(len(mine), len(ref))) if mine[j] != ref[j]), min(len(mine), len(ref)))
    return (f"first difference at token {k}: lilac {[t.id_to_token(x) for x in mine[max(0, k - 2):k + 4]]} "
            f"HF {[t.id_to_token(x) for x in ref[max(0, k - 2):k + 4]]} near {t.decode(ref[max(0, k - 4):k + 4])!r}")


def compare(tok_files, corpus, variant, cat, special, oracle_variant=None):
    docs = corpus["docs"]
    mine = lilac_ids(tok_files[variant], corpus["text_path"], special)
    ref = hf_ids(tok_files[oracle_variant or variant], docs)
    assert len(mine) == len(docs)
    idx = [i for i, d in enumerate(docs) if d["cat"] == cat]
    assert idx, f"no documents in category {cat}"
    bad = [i for i in idx if mine[i] != ref[i]]
    assert not bad, f"{len(bad)}/{len(idx)} {cat} documents differ; doc {bad[0]}: " + \
        describe(tok_files[variant], mine[bad[0]], ref[bad[0]])


def test_corpus_size(corpus):
    assert corpus["bytes"] >= 5_000_000, corpus["bytes"]
    cats = {d["cat"] for d in corpus["docs"]}
    assert set(CATEGORIES) <= cats


@pytest.mark.parametrize("cat", CATEGORIES)
@pytest.mark.parametrize("variant", ["qwen3", "qwen35"])
def test_ids_match_hf(tok_files_fixture, corpus, variant, cat):
    """--special (HF-compatible): added tokens matched everywhere."""
    compare(tok_files_fixture, corpus, variant, cat, True)


@pytest.mark.parametrize("variant", ["qwen3", "qwen35"])
def test_plain_mode_matches_hf_without_added_tokens(tok_files_fixture, corpus, variant):
    """Default (safe) mode: no added token is ever matched; the oracle is HF on a
    copy of tokenizer.json with the added tokens removed."""
    for cat in CATEGORIES:
        compare(tok_files_fixture, corpus, variant, cat, False, variant + "_noadded")


def test_string_form_merges(tok_files_fixture, corpus):
    """merges given as "a b" strings load to the same tokenizer as [a, b] arrays."""
    a = lilac_ids(tok_files_fixture["qwen3_strmerges"], corpus["text_path"], True)
    b = lilac_ids(tok_files_fixture["qwen3"], corpus["text_path"], True)
    assert a == b


@pytest.mark.parametrize("variant", ["qwen3", "qwen35"])
def test_decode_roundtrip_is_nfc(tok_files_fixture, corpus, variant):
    """decode(encode(x)) == NFC(x) (HF's NFC), and lilac's decode == HF's decode."""
    tok = tok_files_fixture[variant]
    ids = lilac_ids(tok, corpus["text_path"], True)
    path = os.path.join(GEN, f"ids_{variant}.txt")
    with open(path, "w") as f:
        for row in ids:
            f.write(" ".join(map(str, row)) + "\n")
    out = run_lilac(["detokenize", "--tokenizer", tok, "--jsonl", "--file", path]).stdout.decode()
    texts = [json.loads(line) for line in out.split("\n")[:-1]]
    t = Tokenizer.from_file(tok)
    nfc = t.normalizer
    bad = []
    for i, d in enumerate(corpus["docs"]):
        if texts[i] != nfc.normalize_str(d["text"]):
            bad.append((i, "not NFC(x)"))
        elif i % 7 == 0 and texts[i] != t.decode(ids[i], skip_special_tokens=False):
            bad.append((i, "differs from HF decode"))
    assert not bad, f"{len(bad)} documents: first {bad[0]}"
    # and NFC agrees with Python's unicodedata outside the marks HF does not know
    sample = [d["text"] for d in corpus["docs"] if d["cat"] in ("prose", "normforms")]
    assert all(nfc.normalize_str(s) == unicodedata.normalize("NFC", s) for s in sample)


@pytest.fixture(scope="session")
def tok_files_fixture(tokenizer_files):
    return tokenizer_files
