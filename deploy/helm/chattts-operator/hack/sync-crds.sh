#!/usr/bin/env bash
# Copy the generated CRDs (deploy/crds/, written by `python -m chattts_operator.crdgen`) into
# the chart, which can only read files inside itself. Run after regenerating the CRDs;
# tests/helm/test_chart_files.py fails while the copies differ.
set -euo pipefail
chart="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$chart/../../crds"
dst="$chart/files/crds"
shopt -s nullglob
generated=("$src"/*.yaml)
if (( ${#generated[@]} == 0 )); then
  echo "no CRDs in $src: run 'python -m chattts_operator.crdgen' first" >&2
  exit 1
fi
mkdir -p "$dst"
rm -f "$dst"/*.yaml
cp "${generated[@]}" "$dst/"
echo "synced ${#generated[@]} CRD file(s) into $dst"
