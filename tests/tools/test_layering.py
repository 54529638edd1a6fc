"""Every #include in src/ runs downwards: a folder includes only itself and the folders below it.

The order (lowest first) is the one docs/ARCHITECTURE.md gives under "Layering". A quoted
include is resolved against the including file's folder; system includes (<...>) are ignored.
"""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
ORDER = ["util", "model", "tokenizer", "constrain", "chat", "backend", "engine", "tools", "server", "cli"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path):
    """The top folder under src/ of a path, or None outside src/."""
    try:
        return path.resolve().relative_to(SRC.resolve()).parts[0]
    except ValueError:
        return None


def sources():
    return sorted(p for ext in ("c", "h", "cu", "cuh") for p in SRC.rglob(f"*.{ext}"))


def includes(path):
    for m in INCLUDE.finditer(path.read_text(errors="replace")):
        yield m.group(1), path.parent / m.group(1)


def upward(path):
    """(include, its folder) for each include of `path` that runs to a higher folder."""
    me = layer_of(path)
    out = []
    for name, target in includes(path):
        if not target.exists():  # a system or toolkit header named with quotes
            continue
        there = layer_of(target)
        if there is None or there == me:
            continue
        if ORDER.index(there) > ORDER.index(me):
            out.append((name, there))
    return out


def test_every_folder_has_a_place():
    folders = sorted(p.name for p in SRC.iterdir() if p.is_dir())
    assert sorted(ORDER) == folders, "add the new folder to ORDER and to docs/ARCHITECTURE.md"


def test_order_is_documented():
    doc = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    assert " < ".join(ORDER) in doc


def test_no_include_runs_upward():
    bad = [f"{p.relative_to(REPO)}: {name} ({there} is above {layer_of(p)})" for p in sources()
           for name, there in upward(p)]
    assert not bad, "includes that run upward:\n" + "\n".join(bad)


@pytest.mark.parametrize("text, folder, ok", [
    ('#include "../util/common.h"\n', "model", True),
    ('#include "../cli/commands.h"\n', "tools", False),
    ('#  include "../server/sbuf.h"\n', "engine", False),
    ('#include <stdio.h>\n', "util", True),
])
def test_the_check_sees_upward_includes(tmp_path, monkeypatch, text, folder, ok):
    """The checker itself: a fake src/ tree with one include that runs up or down."""
    src = tmp_path / "src"
    for d in ORDER:
        (src / d).mkdir(parents=True)
    for d, f in (("util", "common.h"), ("cli", "commands.h"), ("server", "sbuf.h")):
        (src / d / f).write_text("")
    f = src / folder / "x.c"
    f.write_text(text)
    monkeypatch.setattr(__import__(__name__), "SRC", src)
    assert (upward(f) == []) == ok
