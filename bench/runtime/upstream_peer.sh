#!/usr/bin/env bash
# Upstream ChatTTS's own Chat.infer() on this GPU, the peer of the runtime's speech API (h200.sh's
# "upstream" step): random weights in upstream's layout, then its bench at batch 1/16/64, refine-text
# off and on. The scripts are ../shared/anchors/ (copied into .anchor/); the wheels they need in .whl.
#   bash bench/runtime/upstream_peer.sh OUT.jsonl
set -euo pipefail
out="${1:?usage: upstream_peer.sh OUT.jsonl}"
ckpt="$(mktemp -d)/upstream-ckpt"
python3 .anchor/make_upstream_ckpt.py "$ckpt"
python3 .anchor/upstream_chattts_bench.py "$ckpt" cuda 128 1,16,64 | tee "$out"
