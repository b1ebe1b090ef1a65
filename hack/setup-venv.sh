#!/usr/bin/env bash
# Create or update .venv with the operator, the runtime's CPU stack and the test tools.
# PyPI serves no CPU-only torch build, so the +cpu wheel is taken from a wheel folder:
#   $CHATTTS_WHEELS, else ../shared/wheels beside the checkout, else the user cache
#   (~/.cache/chattts-operator/wheels), where this script keeps a copy for fresh clones.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CHATTTS_VENV:-$root/.venv}"
python="${PYTHON:-python3}"

# shellcheck source=torch-wheels.sh
source "$root/hack/torch-wheels.sh"

[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
stamp="$venv/.chattts-stamp"
want="$(sha256sum "$root/pyproject.toml" "$0" "$root/hack/torch-wheels.sh" "$root/tests/parity/requirements.txt" \
  "$root/tests/runtime/normalizers-requirements.txt" \
  | sha256sum | cut -c1-16)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "[venv] $venv is up to date"; exit 0
fi

"${pip[@]}" install -U pip wheel setuptools
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '$torch_version')" 2>/dev/null; then
  wheels="$(find_wheels || true)"
  if [[ -n "$wheels" ]]; then
    mkdir -p "$cache_wheels"
    cp -n "$wheels"/torch-"${torch_version}"-*.whl "$cache_wheels/" 2>/dev/null || true
    "${pip[@]}" install --find-links "$wheels" "torch==$torch_version"
  else
    echo "[venv] no torch $torch_version wheel found (set CHATTTS_WHEELS); installing torch from the index" >&2
    "${pip[@]}" install "torch==${torch_version%+cpu}"
  fi
fi
"${pip[@]}" install -e "$root[runtime,test]"
# AutoAWQ 0.2.9 pins an old torch/transformers in its metadata but quantizes fine with
# the pinned stack (see the runtime README); install it without letting it downgrade torch.
"${pip[@]}" install "accelerate>=1.0" "datasets>=2.20" zstandard
"${pip[@]}" install --no-deps "autoawq==0.2.9"
# Upstream ChatTTS for the parity tier (tests/parity): a test-time reference only (AGPL-3.0),
# never imported by the runtime. It goes, without its declared dependencies, into a folder of its
# own that only tests/parity/conftest.py puts on sys.path, with just the light modules its model
# code imports; the versions are pinned in tests/parity/requirements.txt (why: its README).
# PyPI's torchaudio is a CUDA build whose compiled extension does not load beside the CPU torch;
# the parity tier needs only its pure-Python MelSpectrogram, so the extension's libraries are removed.
parity_site="$venv/parity-site"
rm -rf "$parity_site"
"${pip[@]}" install --no-deps --target "$parity_site" -r "$root/tests/parity/requirements.txt"
rm -f "$parity_site"/torchaudio/lib/*.so "$parity_site"/torchaudio/*.so
# The language normalizers (WeTextProcessing, nemo_text_processing: what the runtime image carries) go
# into a folder of their own too, so every other tier runs without them (text.language_normalizers:
# installed then finds none); the tests that serve with them put it on the path. About 0.7 GB (pynini)
# and a minute to install; cdifflib compiles (gcc). nemo's English grammars are compiled once here (about
# 1 CPU-minute, a few wall minutes on a busy machine) into the cache the runtime loads them from
# (chattts_runtime.text.language.GRAMMAR_DIR, under the venv), as the image build does.
normalizers_site="$venv/normalizers-site"
rm -rf "$normalizers_site"
"${pip[@]}" install --no-deps --target "$normalizers_site" -r "$root/tests/runtime/normalizers-requirements.txt"
PYTHONPATH="$normalizers_site" "$venv/bin/python" -m chattts_runtime.text.language
echo "$want" > "$stamp"
echo "[venv] ready: $venv"
