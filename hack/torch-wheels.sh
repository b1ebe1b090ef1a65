# Sourced by hack/setup-venv.sh and hack/setup-vllm-venv.sh: where the CPU torch wheel comes from.
# PyPI serves no +cpu torch, so it is looked up in $CHATTTS_WHEELS, then ../shared/wheels beside
# the checkout, then the user cache (~/.cache/chattts-operator/wheels), where the setup scripts
# keep a copy so fresh clones on this machine find it.
torch_version="2.13.0+cpu"
cache_wheels="${XDG_CACHE_HOME:-$HOME/.cache}/chattts-operator/wheels"

find_wheels() {  # prints the first folder holding the wheel; nothing if none does
  for d in "${CHATTTS_WHEELS:-}" "$root/../shared/wheels" "$cache_wheels"; do
    if [[ -n "$d" ]] && compgen -G "$d/torch-${torch_version}-*.whl" >/dev/null; then echo "$d"; return; fi
  done
}
