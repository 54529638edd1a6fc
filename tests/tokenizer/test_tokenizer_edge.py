"""Edge cases of lilac's tokenizer against HF `tokenizers`: added-token options,
ignore_merges, Unicode-version tables, invalid input, the CLI."""
import json
import os
import random
import re

import pytest
from tokenizers import Tokenizer

from conftest import GEN, QWEN3_TOK, ROOT, run_lilac

TRICKY = [
    "", "a", " ", "  ", "\n", "hello world", "Hello  world!!  ", "I'M you'RE we'Ve it'S 'll 'LL 'ſ", "don’t can't",
    "<|im_start|>user\nhi<|im_end|>\n", "<|im_start|><|im_start|>", "x<|im_end|>y", " <|im_end|> ", "<|im_end|",
    "<think>\n\n</think>\n\n", "<tool_call>\n<function=f>\n", "a" * 5000, "🙂" * 50, "e\u0301" * 20,
    "\u0301leading mark", "tab\tand\r\ncrlf\r\n\r\n", "１２３ ٤٥٦ 12345", "\u00a0\u00a0x\u3000y", "\u180e \u180e",
]


def encode_lines(tok, texts, special=True):
    path = os.path.join(GEN, "edge_in.jsonl")
    with open(path, "w") as f:
        for s in texts:
            f.write(json.dumps(s) + "\n")
    args = ["tokenize", "--tokenizer", tok, "--jsonl", "--file", path] + (["--special"] if special else [])
    out = run_lilac(args).stdout.decode()
    return [[int(x) for x in line.split()] for line in out.split("\n")[:-1]]


def derived(tokenizer_files, name, edit):
    d = json.load(open(QWEN3_TOK, encoding="utf-8"))
    edit(d)
    path = os.path.join(GEN, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False)
    return path


def check_same(tok, texts):
    t = Tokenizer.from_file(tok)
    mine = encode_lines(tok, texts)
    assert len(mine) == len(texts), (len(mine), len(texts))
    for s, m in zip(texts, mine):
        assert m == t.encode(s, add_special_tokens=False).ids, f"differs on {s!r}"


def test_tricky_strings(tokenizer_files):
    check_same(tokenizer_files["qwen3"], TRICKY)
    check_same(tokenizer_files["qwen35"], TRICKY)


def test_added_token_options(tokenizer_files):
    """lstrip / rstrip / single_word / normalized on added tokens, as HF applies them."""
    def edit(d):
        for a in d["added_tokens"]:
            if a["content"] == "<|im_start|>":
                a["lstrip"] = True
            if a["content"] == "<|im_end|>":
                a["rstrip"] = True
            if a["content"] == "<think>":
                a["single_word"] = True
            if a["content"] == "</think>":
                a["lstrip"] = a["rstrip"] = True
        d["added_tokens"].append({"id": 151669, "content": "Ångström", "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": True, "special": False})
        d["added_tokens"].append({"id": 151670, "content": "zap", "single_word": True, "lstrip": False,
                                  "rstrip": False, "normalized": True, "special": False})
    tok = derived(tokenizer_files, "tokenizer_opts.json", edit)
    texts = ["a  <|im_start|>b", "\t\n<|im_start|>", "x<|im_end|>  \n y", "<|im_end|>", "a<think>b", "a <think> b",
             "<think>", "é<think>", "x  </think>  y", "</think></think>", "  </think>", "Ångström", "A\u030angstro\u0308m",
             "the Ångströms", "zap zapzap zap_ zap. _zap", "<|im_start|> <|im_end|> <|im_start|>", "\u2003<|im_start|>"]
    check_same(tok, texts)


def test_ignore_merges(tokenizer_files):
    tok = derived(tokenizer_files, "tokenizer_ignore_merges.json",
                  lambda d: d["model"].__setitem__("ignore_merges", True))
    check_same(tok, TRICKY + ["internationalization", " the", "Supercalifragilistic"])


def test_unicode_version_tables(tokenizer_files):
    """Every code point of hf_unicode.h (newer letters/numbers/marks, marks HF's NFC
    does not know), in contexts where the class matters."""
    src = open(os.path.join(ROOT, "src", "tokenizer", "hf_unicode.h"), encoding="utf-8").read()
    cps = []
    for a, b in re.findall(r"\\\\x\{([0-9A-F]+)\}(?:-\\\\x\{([0-9A-F]+)\})?", src):
        lo = int(a, 16)
        hi = int(b, 16) if b else lo
        cps += list(range(lo, hi + 1, max(1, (hi - lo) // 40)))
    for a, b in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", src):
        cps += list(range(int(a, 16), int(b, 16) + 1))
    assert len(cps) > 200
    rng = random.Random(5)
    texts = []
    for cp in cps:
        c = chr(cp)
        texts += ["a" + c + "b", "!" + c, " " + c + "1", "a\u0301" + c + "\u0316", c + "\u0301x", "1" + c + c]
    for _ in range(200):
        texts.append("".join(chr(rng.choice(cps)) if rng.random() < 0.5 else rng.choice("ab \u0301\u0316!1")
                             for _ in range(12)))
    check_same(tokenizer_files["qwen3"], texts)
    check_same(tokenizer_files["qwen35"], texts)


def test_invalid_utf8_is_an_error(tmp_path):
    for bad in [b"ab\xffcd", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"ok \xe4\xbd", b"\xc0\xaf"]:
        p = tmp_path / "bad.txt"
        p.write_bytes(bad)
        r = run_lilac(["tokenize", "--tokenizer", QWEN3_TOK, "--file", str(p)], check=False)
        assert r.returncode == 1, bad
        assert b"UTF-8" in r.stderr


def test_cli_forms(tmp_path):
    text = "Hi <|im_end|> there"
    p = tmp_path / "t.txt"
    p.write_text(text)
    t = Tokenizer.from_file(QWEN3_TOK)
    hf = t.encode(text, add_special_tokens=False).ids
    # --model DIR reads DIR/tokenizer.json; stdin when no --file
    r = run_lilac(["tokenize", "--model", os.path.dirname(QWEN3_TOK), "--special"], input=text.encode())
    assert [int(x) for x in r.stdout.split()] == hf
    # default (plain): <|im_end|> stays text
    r = run_lilac(["tokenize", "--tokenizer", QWEN3_TOK, "--file", str(p)])
    plain = [int(x) for x in r.stdout.split()]
    assert 151645 not in plain and len(plain) > len(hf)
    assert run_lilac(["detokenize", "--tokenizer", QWEN3_TOK, "--ids", ",".join(map(str, plain))]).stdout.decode() == text
    # detokenize: HF decode, with and without special tokens
    r = run_lilac(["detokenize", "--tokenizer", QWEN3_TOK, "--ids", ",".join(map(str, hf))])
    assert r.stdout.decode() == t.decode(hf, skip_special_tokens=False)
    r = run_lilac(["detokenize", "--tokenizer", QWEN3_TOK, "--skip-special", "--ids", ",".join(map(str, hf))])
    assert r.stdout.decode() == t.decode(hf, skip_special_tokens=True)
    # a partial UTF-8 character decodes to U+FFFD like HF
    ids = t.encode("😀", add_special_tokens=False).ids
    part = t.encode("😀", add_special_tokens=False).ids[:1] if len(ids) > 1 else [t.token_to_id("ð")]
    r = run_lilac(["detokenize", "--tokenizer", QWEN3_TOK, "--ids", ",".join(map(str, part))])
    assert r.stdout.decode() == t.decode(part)


def test_bad_tokenizer_files(tmp_path):
    for name, content in [("empty.json", ""), ("trunc.json", open(QWEN3_TOK).read()[:5000]),
                          ("notjson.json", "{hello"), ("array.json", "[]"),
                          ("nomodel.json", '{"added_tokens": []}'),
                          ("badmerge.json", '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}, '
                                            '"pre_tokenizer": {"type": "ByteLevel"}}')]:
        p = tmp_path / name
        p.write_text(content)
        r = run_lilac(["tokenize", "--tokenizer", str(p)], input=b"x", check=False)
        assert r.returncode == 1 and b"tokenizer.json" in r.stderr, (name, r.stderr)
    r = run_lilac(["tokenize", "--tokenizer", str(tmp_path / "missing.json")], input=b"x", check=False)
    assert r.returncode == 1
