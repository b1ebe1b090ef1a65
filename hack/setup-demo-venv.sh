#!/usr/bin/env bash
# Create or update .venv-demo: what `make demo` runs and nothing more: the operator's light
# dependencies (kopf, the Kubernetes clients, pydantic, ...) and cryptography for the local
# cluster's certificates. No torch, no vLLM: seconds and ~100 MB, not gigabytes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CHATTTS_DEMO_VENV:-$root/.venv-demo}"
python="${PYTHON:-python3}"
stamp="$venv/.chattts-demo-stamp"
want="$(sha256sum "$root/pyproject.toml" "$0" | sha256sum | cut -c1-16)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "[demo-venv] $venv is up to date"; exit 0
fi
start=$SECONDS
echo "[demo-venv] creating $venv: the operator's light dependencies only (no torch)"
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install -U pip
"${pip[@]}" install -e "$root[demo]"
echo "$want" > "$stamp"
echo "[demo-venv] ready: $venv ($(du -sh "$venv" | cut -f1), $((SECONDS - start)) s)"
