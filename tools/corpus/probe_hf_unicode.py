#!/usr/bin/env python3
"""Regenerate src/tokenizer/hf_unicode.h: where HF `tokenizers` sees Unicode
differently from the libraries lilac uses.

- Regex classes. HF matches the pre-tokenizer regex with Oniguruma, whose tables
  are newer (Unicode 16 for tokenizers 0.23) than PCRE2 10.42's (Unicode 14).
  Every code point is classified the way HF sees it (letter / mark / number or
  space / other) by pre-tokenizing probe strings, and compared with PCRE2's
  classes (computed by a tiny C program built here). The code points HF counts
  as \\p{L}, \\p{N} or \\p{M} that PCRE2 does not are written out as ranges that
  lilac adds to those classes when it compiles the pattern.
- NFC. HF normalizes with old tables (unicode-normalization-alignments, before
  Unicode 10): marks added later are inert to it. Found by comparing HF's NFC
  with Python's unicodedata (Unicode 14) on probe strings, plus the Unicode 15.0
  marks utf8proc knows and Python 3.11 does not (listed below).

    python3 tools/corpus/probe_hf_unicode.py > src/tokenizer/hf_unicode.h
"""
import os
import subprocess
import sys
import tempfile
import unicodedata

from tokenizers import Regex, normalizers, pre_tokenizers
import tokenizers

R3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
R35 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

# Unicode 15.0 code points with canonical-combining-class or composition data
# (utf8proc 2.8 knows them, Python 3.11's unicodedata and HF do not).
UNICODE15_MARKS = [0x10EFD, 0x10EFE, 0x10EFF, 0x11F41, 0x11F42, 0x1E08F, 0x1E4EC, 0x1E4ED, 0x1E4EE, 0x1E4EF]

PCLS_C = r"""
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
static pcre2_code *C(const char *p) { int e; PCRE2_SIZE o;
  return pcre2_compile((PCRE2_SPTR)p, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &e, &o, 0); }
int main(void) {
  pcre2_code *L = C("^\\p{L}$"), *M = C("^\\p{M}$"), *N = C("^\\p{N}$");
  pcre2_match_data *md = pcre2_match_data_create(4, 0);
  for (unsigned cp = 0; cp < 0x110000; cp++) {
    if (cp >= 0xD800 && cp < 0xE000) continue;
    unsigned char b[4]; int n;
    if (cp < 0x80) { b[0] = cp; n = 1; }
    else if (cp < 0x800) { b[0] = 0xC0 | cp >> 6; b[1] = 0x80 | (cp & 63); n = 2; }
    else if (cp < 0x10000) { b[0] = 0xE0 | cp >> 12; b[1] = 0x80 | ((cp >> 6) & 63); b[2] = 0x80 | (cp & 63); n = 3; }
    else { b[0] = 0xF0 | cp >> 18; b[1] = 0x80 | ((cp >> 12) & 63); b[2] = 0x80 | ((cp >> 6) & 63); b[3] = 0x80 | (cp & 63); n = 4; }
    char k = pcre2_match(L, b, n, 0, 0, md, 0) >= 0 ? 'L' : pcre2_match(M, b, n, 0, 0, md, 0) >= 0 ? 'M'
           : pcre2_match(N, b, n, 0, 0, md, 0) >= 0 ? 'N' : 'O';
    printf("%u %c\n", cp, k);
  }
  return 0;
}
"""

WS = set(list(range(9, 14)) + [0x20, 0x85, 0xA0, 0x1680] + list(range(0x2000, 0x200B)) + [0x2028, 0x2029, 0x202F, 0x205F, 0x3000])


def hf_classes():
    split = lambda r: pre_tokenizers.Split(Regex(r), behavior="isolated")
    p3, p35 = split(R3), split(R35)
    cps = [c for c in range(0x110000) if not (0xD800 <= c < 0xE000) and c not in (10, 13)]

    def joined(p, prefix):  # is prefix+char one piece?
        res = {}
        for k in range(0, len(cps), 20000):
            chunk = cps[k:k + 20000]
            s = "".join(prefix + chr(c) + "\n" for c in chunk)
            ends = {a: b for _, (a, b) in p.pre_tokenize_str(s)}
            pos = 0
            for c in chunk:
                res[c] = ends.get(pos, 0) >= pos + len(prefix) + 1
                pos += len(prefix) + 2
        return res

    L, LM, X = joined(p3, "a"), joined(p35, "a"), joined(p3, "!")
    out = {}
    for c in cps:
        out[c] = "L" if L[c] else "M" if LM[c] else "O" if X[c] else ("S" if c in WS else "N")
    return out


def pcre_classes():
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "p.c"), os.path.join(d, "p")
        open(src, "w").write(PCLS_C)
        subprocess.run(["cc", "-O2", "-o", exe, src, "-lpcre2-8"], check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    res = {}
    for line in out.splitlines():
        a, k = line.split()
        c = int(a)
        res[c] = "S" if c in WS else k
    return res


def ranges(cps):
    r = []
    for c in sorted(cps):
        if r and r[-1][1] == c - 1:
            r[-1][1] = c
        else:
            r.append([c, c])
    return r


def pcre_class_text(cps):
    return "".join(f"\\\\x{{{a:X}}}" if a == b else f"\\\\x{{{a:X}}}-\\\\x{{{b:X}}}" for a, b in ranges(cps))


def nfc_unknown():
    n = normalizers.NFC()
    out = []
    for cp in range(0x80, 0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        relevant = unicodedata.combining(c) or (unicodedata.decomposition(c) and not unicodedata.decomposition(c).startswith("<")) \
            or unicodedata.category(c) in ("Mn", "Mc", "Me")
        if not relevant:
            continue
        probes = [c, "a" + c, c + "\u0301", "a\u0301" + c, "a\u0316" + c, "a" + c + "\u0316", "a" + c + "\u0301", c + "\u0334",
                  "\u1100" + c, c + "\u1161", c + "\u11a8", "\u0b47" + c, c + "\u0b3e", "e" + c, c + "e"]
        if any(n.normalize_str(p) != unicodedata.normalize("NFC", p) for p in probes):
            out.append(cp)
    return sorted(set(out) | set(UNICODE15_MARKS))


def main():
    hf, pc = hf_classes(), pcre_classes()
    extra = {"L": [], "N": [], "M": []}
    for c, k in hf.items():
        if k != pc[c]:
            if pc[c] != "O" or k not in extra:
                sys.exit(f"probe: U+{c:04X} is {k} to HF but {pc[c]} to PCRE2; only additions are handled")
            extra[k].append(c)
    inert = nfc_unknown()
    print("/* hf_unicode.h — GENERATED by tools/corpus/probe_hf_unicode.py (tokenizers "
          f"{tokenizers.__version__}); do not edit.\n * Where HF `tokenizers` sees Unicode differently from "
          "PCRE2 10.42 and utf8proc 2.8; see the script. */")
    print("#ifndef LILAC_HF_UNICODE_H\n#define LILAC_HF_UNICODE_H\n")
    for k in "LNM":
        print(f"/* {len(extra[k])} code points HF counts as \\p{{{k}}} and PCRE2 does not */")
        print(f'#define HF_EXTRA_{k} "{pcre_class_text(extra[k])}"')
    print(f"\n/* {len(inert)} code points HF's NFC does not know (inert starters) */")
    print("static const uint32_t hf_nfc_unknown[][2] = {")
    rs = ranges(inert)
    for i in range(0, len(rs), 5):
        print("    " + " ".join(f"{{0x{a:04X}, 0x{b:04X}}}," for a, b in rs[i:i + 5]))
    print("};\n\n#endif")


if __name__ == "__main__":
    main()
