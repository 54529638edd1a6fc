#!/usr/bin/env bash
# Source trees of other commits for one `run.sh ab` call, made here (the device copy has no .git):
#
#   bash tools/device/abtrees.sh next/pk-words~1 next/pk-words
#
# writes each commit's `git archive` into .abtree1, .abtree2, ... (git-ignored through
# .git/info/exclude; a COMMIT file in each names it), removes older .abtreeN folders, and prints
# the device call's carry list and AB_TREES value: run.sh builds each tree and benches it beside
# the working tree's build, under the same checks (docs/perf.md runs 70 and 126 did it by hand).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: $0 COMMIT..." >&2; exit 2; }
grep -qx '/.abtree\*/' .git/info/exclude 2>/dev/null || echo '/.abtree*/' >> .git/info/exclude
rm -rf .abtree[0-9]*
trees=() carry=(.devdeps)
i=0
for c in "$@"; do
    i=$((i + 1))
    sha=$(git rev-parse --verify "$c^{commit}")
    mkdir -p ".abtree$i"
    git archive "$sha" | tar -x -C ".abtree$i"
    echo "$sha $c" > ".abtree$i/COMMIT"
    trees+=(".abtree$i") carry+=(".abtree$i")
done
du -sh "${trees[@]}" | sed 's/^/  /'
printf 'carry: ['; printf '"%s", ' "${carry[@]}" | sed 's/, $//'; printf ']\n'
echo "AB_TREES='${trees[*]}'"
