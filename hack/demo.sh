#!/usr/bin/env bash
# make demo: a local cluster with simulated GPU nodes, the Helm chart, the real operator
# reconciling the samples in deploy/examples. Safe to run again. See hack/demo.py.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
if [[ ! -x "$python" ]]; then
  echo "error: $python not found: create the project's environment first with 'make venv'" >&2
  echo "       (or set PYTHON to a Python 3.11+ that has this project installed)" >&2
  exit 1
fi
exec "$python" "$repo/hack/demo.py" up "$@"
