#!/usr/bin/env bash
# The local base image (no registry): Debian bookworm minbase + Python 3.11, made with
# mmdebstrap and imported with podman as localhost/chattts-base:bookworm. The rootfs tarball is
# cached in ~/.cache/chattts-operator/images (keyed by the package list) so it is made once.
set -euo pipefail
# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
packages="python3,python3-venv,ca-certificates"
mirror="${CHATTTS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# Bump recipe when the mmdebstrap call below changes: the key names the cached tarball.
recipe=1
key="$(echo "$recipe $packages $mirror" | sha256sum | cut -c1-12)"
rootfs="$images_cache/base-bookworm-$key.tar"

if [[ ! -s "$rootfs" ]]; then
  start=$SECONDS
  echo "[images] base rootfs: mmdebstrap bookworm minbase + $packages (about a minute, once)"
  # Apt lists and caches are dropped: they are not needed at run time.
  mmdebstrap --quiet --variant=minbase --include="$packages" \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$rootfs.part.tar" "$mirror"  # the .tar suffix picks the output format
  mv "$rootfs.part.tar" "$rootfs"
  echo "[images] base rootfs ready: $rootfs ($(du -h "$rootfs" | cut -f1), $((SECONDS - start)) s)"
  podman rmi -f "$base_image" >/dev/null 2>&1 || true
fi
if ! podman image exists "$base_image" || \
   [[ "$(podman image inspect --format '{{index .Labels "chattts.base.key"}}' "$base_image")" != "$key" ]]; then
  podman import --quiet --change 'CMD ["/bin/bash"]' --change "LABEL chattts.base.key=$key" \
    "$rootfs" "$base_image" >/dev/null
  echo "[images] imported $base_image"
fi
