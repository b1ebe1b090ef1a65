#!/usr/bin/env bash
# make demo-down: stop the demo's operator process and its local cluster.
# --purge also deletes the cluster's folder (etcd data, certificates, logs).
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
  exit 1
fi
exec "$python" "$repo/hack/demo.py" down "$@"
