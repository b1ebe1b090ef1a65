#!/usr/bin/env bash
# make demo: a local cluster with simulated GPU nodes, the Helm chart, the real operator
# reconciling the samples in deploy/examples. Safe to run again. See hack/demo.py.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# .venv-demo (hack/setup-demo-venv.sh: the operator's light dependencies) else the full .venv.
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  python="$repo/.venv-demo/bin/python"
  [[ -x "$python" || ! -x "$repo/.venv/bin/python" ]] || python="$repo/.venv/bin/python"
fi
if [[ ! -x "$python" ]]; then
  echo "error: $python not found: create the demo's environment first with hack/setup-demo-venv.sh (make demo does)" >&2
  echo "       (or set PYTHON to a Python 3.11+ that has this project installed)" >&2
  exit 1
fi
exec "$python" "$repo/hack/demo.py" up "$@"
