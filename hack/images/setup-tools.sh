#!/usr/bin/env bash
# Installs the daemonless image tools from Debian (no Docker): buildah builds the images,
# podman runs them, runc is the OCI runtime (crun cannot start containers on some hosts),
# mmdebstrap makes the local base rootfs (no registry), skopeo inspects the OCI archives,
# uidmap/fuse-overlayfs for storage. Idempotent: does nothing when all are on PATH.
set -euo pipefail
need=()
for tool in buildah podman runc mmdebstrap skopeo; do
  command -v "$tool" >/dev/null || need+=("$tool")
done
if ((${#need[@]} == 0)); then
  echo "[image-tools] buildah, podman, runc, mmdebstrap, skopeo present"; exit 0
fi
sudo=()
((EUID == 0)) || sudo=(sudo)
start=$SECONDS
echo "[image-tools] installing from Debian: ${need[*]} (about a minute)"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
  buildah podman runc mmdebstrap skopeo uidmap fuse-overlayfs slirp4netns \
  containers-storage golang-github-containers-common ca-certificates >/dev/null
echo "[image-tools] installed in $((SECONDS - start)) s"
