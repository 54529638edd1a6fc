"""The allowed-token set at random states, against acceptors written here (not
lilac's matcher): for every id of the Qwen3 vocabulary, is the text so far plus
the token's bytes still a prefix of some text of the language? The vocabulary's
bytes come from tokenizer.json itself (GPT-2 byte-to-unicode map); tokens marked
special are never allowed except the end tokens, which are allowed exactly where
the text may end."""
import json
import os
import subprocess
import tempfile

import pytest

from conftest import ROOT, constrain_bin

TOK = os.path.join(ROOT, "tests", "data", "tokenizers", "qwen3", "tokenizer.json")
EOS = ("<|im_end|>", "<|endoftext|>")


def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@pytest.fixture(scope="module")
def vocab():
    d = json.load(open(TOK, encoding="utf-8"))
    dec = byte_decoder()
    size = 1 + max(max(d["model"]["vocab"].values()), max(a["id"] for a in d["added_tokens"]))
    toks = [None] * size  # bytes, "eos", or None (never allowed)
    for s, i in d["model"]["vocab"].items():
        toks[i] = bytes(dec[ch] for ch in s)
    for a in d["added_tokens"]:
        toks[a["id"]] = "eos" if a["content"] in EOS else (None if a["special"] else a["content"].encode())
    return toks


def masks(kind, text, seed, states, max_ws):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(text)
        path = f.name
    try:
        r = subprocess.run([constrain_bin(), "masks", kind, path, str(seed), str(states), str(max_ws)],
                           cwd=ROOT, capture_output=True, timeout=600)
    finally:
        os.unlink(path)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return [json.loads(l) for l in r.stdout.decode().splitlines()]


def expected_mask(acceptor_cls, prefix, vocab):
    st = acceptor_cls()
    for c in prefix:
        assert st.feed(c), f"the walk's own text is refused at {prefix!r}"
    allowed = set()
    for i, t in enumerate(vocab):
        if t is None:
            continue
        if t == "eos":
            if st.complete():
                allowed.add(i)
            continue
        s = st.copy()
        if all(s.feed(c) for c in t):
            allowed.add(i)
    return allowed


def mask_ids(hexmask, n):
    b = bytes.fromhex(hexmask)
    return {i for i in range(n) if b[i >> 3] >> (i & 7) & 1}


# ---- Compact JSON (any object), the grammar's limits: <= 16 integer digits,
# 1..16 fraction digits, 1..3 exponent digits, \u escapes outside the surrogates.

DIG = set(b"0123456789")
HEX = set(b"0123456789abcdefABCDEF")


def utf8_rest(c):
    """Ranges the bytes after lead byte c must take, or None if c leads nothing."""
    cont = (0x80, 0xBF)
    if 0xC2 <= c <= 0xDF:
        return [cont]
    if c == 0xE0:
        return [(0xA0, 0xBF), cont]
    if c == 0xED:
        return [(0x80, 0x9F), cont]
    if 0xE1 <= c <= 0xEF:
        return [cont, cont]
    if c == 0xF0:
        return [(0x90, 0xBF), cont, cont]
    if 0xF1 <= c <= 0xF3:
        return [cont, cont, cont]
    if c == 0xF4:
        return [(0x80, 0x8F), cont, cont]
    return None


class JsonObject:
    def __init__(self):
        self.stack = []
        self.st = "start"
        self.sub = None

    def copy(self):
        o = JsonObject.__new__(JsonObject)
        o.stack = self.stack[:]
        o.st = self.st
        o.sub = list(self.sub) if isinstance(self.sub, list) else self.sub
        return o

    def complete(self):
        return self.st == "done"

    def _after_value(self):
        self.st = "after" if self.stack else "done"
        self.sub = None

    def _value(self, c):
        if c == ord("{"):
            self.stack.append("o")
            self.st = "key_or_close"
        elif c == ord("["):
            self.stack.append("a")
            self.st = "val_or_close"
        elif c == ord('"'):
            self.st, self.sub = "str", [False, None, []]
        elif c == ord("-"):
            self.st, self.sub = "num", ("sign", 0)
        elif c == ord("0"):
            self.st, self.sub = "num", ("zero", 0)
        elif c in DIG:
            self.st, self.sub = "num", ("int", 1)
        elif c in b"tfn":
            self.st, self.sub = "lit", {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}[c]
        else:
            return False
        return True

    def feed(self, c):
        st = self.st
        if st == "start":
            if c != ord("{"):
                return False
            self.stack.append("o")
            self.st = "key_or_close"
            return True
        if st == "value":
            return self._value(c)
        if st == "val_or_close":
            if c == ord("]"):
                self.stack.pop()
                self._after_value()
                return True
            return self._value(c)
        if st in ("key_or_close", "key"):
            if c == ord('"'):
                self.st, self.sub = "str", [True, None, []]
                return True
            if st == "key_or_close" and c == ord("}"):
                self.stack.pop()
                self._after_value()
                return True
            return False
        if st == "colon":
            if c == ord(":"):
                self.st = "value"
                return True
            return False
        if st == "after":
            top = self.stack[-1]
            if c == ord(","):
                self.st = "key" if top == "o" else "value"
                return True
            if c == ord("}" if top == "o" else "]"):
                self.stack.pop()
                self._after_value()
                return True
            return False
        if st == "lit":
            if c != self.sub[0]:
                return False
            self.sub = self.sub[1:]
            if not self.sub:
                self._after_value()
            return True
        if st == "str":
            is_key, esc, pend = self.sub
            if pend:
                lo, hi = pend[0]
                if not lo <= c <= hi:
                    return False
                self.sub[2] = pend[1:]
                return True
            if esc is None:
                if c == ord('"'):
                    if is_key:
                        self.st, self.sub = "colon", None
                    else:
                        self._after_value()
                    return True
                if c == ord("\\"):
                    self.sub[1] = "bs"
                    return True
                if c < 0x20:
                    return False
                if c >= 0x80:
                    rest = utf8_rest(c)
                    if rest is None:
                        return False
                    self.sub[2] = rest
                return True
            if esc == "bs":
                if c in b'"\\/bfnrt':
                    self.sub[1] = None
                    return True
                if c == ord("u"):
                    self.sub[1] = ("u", 0, False)
                    return True
                return False
            _, k, d = esc
            if k == 0:
                if c in b"dD":
                    self.sub[1] = ("u", 1, True)
                    return True
                if c in HEX:
                    self.sub[1] = ("u", 1, False)
                    return True
                return False
            if k == 1 and d and c not in b"01234567":
                return False
            if c not in HEX:
                return False
            self.sub[1] = None if k == 3 else ("u", k + 1, False)
            return True
        if st == "num":
            ph, n = self.sub
            digit = c in DIG
            if ph == "sign":
                if c == ord("0"):
                    self.sub = ("zero", 0)
                elif digit:
                    self.sub = ("int", 1)
                else:
                    return False
                return True
            if ph in ("zero", "int") and c == ord("."):
                self.sub = ("dot", 0)
                return True
            if ph in ("zero", "int", "frac") and c in b"eE":
                self.sub = ("e", 0)
                return True
            if ph == "int" and digit:
                if n == 16:
                    return False
                self.sub = ("int", n + 1)
                return True
            if ph in ("dot", "frac") and digit:
                if n == 16:
                    return False
                self.sub = ("frac", n + 1)
                return True
            if ph == "e" and c in b"+-":
                self.sub = ("esign", 0)
                return True
            if ph in ("e", "esign", "exp") and digit:
                if n == 3:
                    return False
                self.sub = ("exp", n + 1)
                return True
            if ph in ("zero", "int", "frac", "exp"):
                self._after_value()
                return self.feed(c)
            return False
        return False  # done


# ---- [a-z]{1,8}@[a-z]{1,8}\.(com|org), by hand.

class Email:
    def __init__(self):
        self.part, self.n, self.tld = 0, 0, b""  # part: 0 local, 1 domain, 2 tld

    def copy(self):
        o = Email()
        o.part, o.n, o.tld = self.part, self.n, self.tld
        return o

    def complete(self):
        return self.part == 2 and self.tld in (b"com", b"org")

    def feed(self, c):
        if self.part < 2:
            if ord("a") <= c <= ord("z") and self.n < 8:
                self.n += 1
                return True
            if self.n >= 1 and c == b"@."[self.part]:
                self.part, self.n = self.part + 1, 0
                return True
            return False
        t = self.tld + bytes([c])
        if b"com".startswith(t) or b"org".startswith(t):
            self.tld = t
            return True
        return False


CASES = [
    ("json_object", "schema", '{"type":"object"}', JsonObject, 0),
    ("email_regex", "regex", r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)", Email, 0),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_masks_match_an_independent_acceptor(vocab, case):
    name, kind, text, cls, max_ws = case
    got = masks(kind, text, 5, 8, max_ws)
    assert len(got) >= 6
    for k, rec in enumerate(got):
        prefix = bytes.fromhex(rec["prefix"])
        want = expected_mask(cls, prefix, vocab)
        have = mask_ids(rec["mask"], len(vocab))
        extra, missing = sorted(have - want)[:5], sorted(want - have)[:5]
        assert have == want, (f"state {k} after {prefix!r}: {len(have - want)} extra {[vocab[i] for i in extra]}, "
                              f"{len(want - have)} missing {[vocab[i] for i in missing]}")
