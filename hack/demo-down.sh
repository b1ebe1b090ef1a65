#!/usr/bin/env bash
# make demo-down: stop the demo's operator process and its local cluster.
# --purge also deletes the cluster's folder (etcd data, certificates, logs).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
if [[ ! -x "$python" ]]; then
  echo "error: $python not found: create the project's environment first with 'make venv'" >&2
  exit 1
fi
exec "$python" "$repo/hack/demo.py" down "$@"
