#!/usr/bin/env bash
# CPU side of bringing vLLM to the GPU machine: download, bundle, split into pieces one call can carry.
#
#   bash bench/runtime/vllm_prepare.sh            # download (once) and cut .vllm/pieces/p00 ... pNN
#   bash bench/runtime/vllm_prepare.sh --offline  # cut from the wheels already in .vllm/wheels
#
# From the repository root (or anywhere: it goes there). Downloads with pip (no dependency
# resolution: exactly the wheels in bench/runtime/vllm_h200.requirements.txt, cp312 manylinux
# x86_64, the GPU machine's Python) into .vllm/wheels (ignored by git), packs them into one
# uncompressed tar (wheels are zip files already), splits it into pieces of PIECE_MIB (53) MiB
# (`split -b 53M`: a call carries 64 MiB at most, the working tree of ~6 MiB included) and writes .vllm/pieces/SHA256SUMS (each piece,
# and the whole bundle as bundle.tar). Then prints the runbook: the `run` calls, in order, with their
# carry lists (bench/runtime/VLLM_H200.md says why and what each one does).
#
# Environment: PIP (default "python3 -m pip"), PIECE_MIB (53), VLLM_DIR (.vllm).
set -euo pipefail
cd "$(dirname "$0")/../.."
REQS=bench/runtime/vllm_h200.requirements.txt
VLLM_DIR="${VLLM_DIR:-.vllm}"
PIECE_MIB="${PIECE_MIB:-53}"
PIP="${PIP:-python3 -m pip}"
offline=0
while [ $# -gt 0 ]; do
  case "$1" in
    --offline) offline=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "vllm_prepare.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$PIECE_MIB" in ''|*[!0-9]*) echo "vllm_prepare.sh: PIECE_MIB must be a whole number of MiB, got '$PIECE_MIB'" >&2; exit 2 ;; esac
if [ "$PIECE_MIB" -lt 1 ] || [ "$PIECE_MIB" -gt 63 ]; then
  echo "vllm_prepare.sh: PIECE_MIB $PIECE_MIB: a piece and SHA256SUMS must fit one call's 64 MiB" >&2; exit 2
fi
mapfile -t pins < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$REQS" | grep -v '^$')
for pin in "${pins[@]}"; do
  case "$pin" in *==*) ;; *) echo "vllm_prepare.sh: $REQS: '$pin' is not pinned (name==version)" >&2; exit 2 ;; esac
done
wheels="$VLLM_DIR/wheels" pieces="$VLLM_DIR/pieces"
mkdir -p "$wheels"

# One wheel per pin, named by pip's own normalisation: lower case, runs of -_. as _.
norm() { echo "$1" | tr 'A-Z' 'a-z' | sed -E 's/[-_.]+/_/g'; }
wheel_for() {  # the wheel in $wheels for name==version, or nothing
  local name version f base
  name="$(norm "${1%%==*}")" version="${1#*==}"
  for f in "$wheels"/*.whl; do
    [ -e "$f" ] || continue
    base="$(basename "$f")"
    if [ "$(norm "$(echo "$base" | cut -d- -f1)")" = "$name" ] && [ "$(echo "$base" | cut -d- -f2)" = "$version" ]; then
      echo "$f"; return
    fi
  done
}
missing=()
for pin in "${pins[@]}"; do [ -n "$(wheel_for "$pin")" ] || missing+=("$pin"); done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$offline" = 1 ]; then
    echo "vllm_prepare.sh: --offline, but $wheels lacks: ${missing[*]}" >&2; exit 1
  fi
  echo "[vllm-prepare] downloading ${#missing[@]} wheel(s): ${missing[*]}"
  # shellcheck disable=SC2086  # PIP is a command line
  $PIP download --disable-pip-version-check -q --no-deps --only-binary=:all: -d "$wheels" \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 "${missing[@]}"
fi
# Exactly the pinned wheels go into the bundle (an older download of another version stays out).
chosen=()
for pin in "${pins[@]}"; do
  w="$(wheel_for "$pin")"
  [ -n "$w" ] || { echo "vllm_prepare.sh: no wheel for $pin after download" >&2; exit 1; }
  chosen+=("$(basename "$w")")
done

rm -rf "$pieces"
mkdir -p "$pieces"
# Reproducible: the same wheels give the same bytes (sorted, no times, no owners).
tar -C "$wheels" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$VLLM_DIR/bundle.tar" "${chosen[@]}"
split -b "${PIECE_MIB}M" -d -a 2 "$VLLM_DIR/bundle.tar" "$pieces/p"
(cd "$VLLM_DIR" && sha256sum bundle.tar | sed 's#  bundle.tar#  bundle.tar#') > "$pieces/SHA256SUMS"
(cd "$pieces" && sha256sum p[0-9][0-9]) >> "$pieces/SHA256SUMS"
total=$(stat -c %s "$VLLM_DIR/bundle.tar")
n=$(find "$pieces" -name 'p[0-9][0-9]' | wc -l)
rm -f "$VLLM_DIR/bundle.tar"
echo "[vllm-prepare] ${#chosen[@]} wheels, $total bytes in $n pieces of at most ${PIECE_MIB} MiB ($pieces)"
python3 - "$pieces" <<'EOF'
import json, pathlib, sys
pieces = sorted(p.name for p in pathlib.Path(sys.argv[1]).glob("p[0-9][0-9]"))
print("Runbook: send each call as soon as the previous one returns (the machine is given back after 30 s idle).")
for i, name in enumerate(pieces):
    last = i == len(pieces) - 1
    carry = [f".vllm/pieces/{name}", ".vllm/pieces/SHA256SUMS"]
    cmd = "bash bench/runtime/vllm_h200.sh run" if last else f"bash bench/runtime/vllm_h200.sh piece {name}"
    print(f"  call {i + 1}: run(kind=\"nvidia-h200\", timeout_s={600 if last else 60}, carry={json.dumps(carry)}, "
          f"command={json.dumps(cmd)})")
EOF
