#!/usr/bin/env bash
# Installs what lilac's build and tests need on Debian 12: C libraries from
# Debian, and a Python venv (.venv) from PyPI holding the outside oracles.
# Idempotent: a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS="build-essential clang libclang-rt-14-dev libomp-dev libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libedit-dev python3-venv"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "deps: installing Debian packages:$missing"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi

[ "${1:-}" = "--c-only" ] && { echo "deps: ok (C libraries)"; exit 0; }

# The oracles: MLX (CPU build) + mlx-lm, HF tokenizers/transformers, jinja2, openai.
REQ=tools/oracle/requirements.txt
STAMP=.venv/.req-stamp
if [ ! -x .venv/bin/python ] || ! cmp -s "$REQ" "$STAMP"; then
    echo "deps: creating .venv from $REQ"
    PY=python3
    $PY -m venv .venv
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -r "$REQ"
    cp "$REQ" "$STAMP"
fi
echo "deps: ok"
