#!/usr/bin/env bash
# The B arm of `h200.sh --ab REV=STEP`: revision REV's runtime/ exported into .ab/REV/runtime (ignored by
# git, carried to the GPU machine with carry: [".ab", ...]; a runtime tree is ~1 MB).
#   bash bench/runtime/ab_prepare.sh 19b6802 [ccad1fd ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: ab_prepare.sh REV [REV...]" >&2; exit 2; }
for rev in "$@"; do
  git rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "ab_prepare.sh: no commit $rev" >&2; exit 2; }
  rm -rf ".ab/$rev"
  mkdir -p ".ab/$rev"
  git archive "$rev" runtime | tar -x -C ".ab/$rev"
  git rev-parse "$rev^{commit}" > ".ab/$rev/COMMIT"
  echo "ab_prepare.sh: .ab/$rev/runtime is $(git rev-parse --short "$rev^{commit}") ($(du -sh ".ab/$rev" | cut -f1))"
done
