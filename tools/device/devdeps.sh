#!/usr/bin/env bash
# Makes .devdeps/root: Debian 12's jansson, pcre2, utf8proc and microhttpd (headers, static and
# shared libraries) unpacked for the device machine, whose image has none of them. Run here,
# then carry it: run(..., carry=[".devdeps"]); tools/device/env.sh puts it on the paths.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 \
    libpcre2-posix3 libutf8proc-dev libutf8proc2 libmicrohttpd-dev libmicrohttpd12)
rm -rf .devdeps && mkdir -p .devdeps/root
for f in "$tmp"/*.deb; do dpkg -x "$f" .devdeps/root; done
echo "devdeps: $(du -sh .devdeps | cut -f1) in .devdeps/root"
