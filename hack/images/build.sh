#!/usr/bin/env bash
# make images: builds the operator image and the CPU runtime image from deploy/images with
# buildah (no Docker, no registry: the base is made locally by hack/images/base.sh), saves them
# as OCI archives in build/images/ and checks their config (user, entrypoint, ports) with skopeo.
#   localhost/chattts-operator:<version>       build/images/chattts-operator-<version>.oci.tar
#   localhost/chattts-runtime:<version>-cpu    build/images/chattts-runtime-<version>-cpu.oci.tar
# Layers and the base rootfs are cached in ~/.cache/chattts-operator/images: a rebuild after a
# code change reruns only the last steps. The store is pruned before and after each build: the
# vfs driver keeps every layer as a full copy of the rootfs, so the chains of earlier builds
# (untagged, childless) and the working containers of a failed build would fill the disk.
# The CPU runtime image takes the +cpu torch wheel from the wheel folder hack/torch-wheels.sh
# finds; without one pip takes PyPI's torch, the CUDA build (several GB more).
# CHATTTS_IMAGES="operator runtime-cpu" picks which to build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
# shellcheck source=env.sh
source hack/images/env.sh
# shellcheck source=../torch-wheels.sh
source hack/torch-wheels.sh
start=$SECONDS
stamp() { echo "[images] $* ($((SECONDS - start)) s)"; }

hack/images/setup-tools.sh
hack/images/base.sh

prune_store() {  # keeps the layers behind tagged images (the cache), drops everything else
  buildah rm --all >/dev/null
  podman image prune --force >/dev/null
}

prune_store
mkdir -p "$images_out"
revision="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

build() {  # build <name> <tag> <dockerfile> [buildah args...]
  local name=$1 tag=$2 dockerfile=$3; shift 3
  local image="localhost/$name:$tag" archive="$images_out/$name-$tag.oci.tar"
  stamp "building $image from $dockerfile"
  # chroot isolation: no user namespaces or runtime needed for RUN steps. The host's CA bundle
  # is mounted so pip trusts whatever TLS the host trusts.
  buildah bud --quiet --isolation chroot --layers --pull=never \
    --ignorefile "$dockerfile.dockerignore" -f "$dockerfile" \
    -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
    --build-arg PYTHON_IMAGE="$base_image" --build-arg VERSION="$images_version" \
    --build-arg REVISION="$revision" "$@" -t "$image" . >/dev/null
  rm -f "$archive"
  podman save --quiet --format oci-archive -o "$archive" "$image"
  stamp "saved $archive ($(du -h "$archive" | cut -f1))"
  check_config "$archive"
  prune_store
}

check_config() {  # the config the chart relies on (hack/images/check_config.py)
  skopeo inspect --config "oci-archive:$1" | python3 hack/images/check_config.py "$(basename "$1")"
}

for which in ${CHATTTS_IMAGES:-operator runtime-cpu}; do
  case "$which" in
    operator) build chattts-operator "$images_version" deploy/images/operator.Dockerfile ;;
    runtime-cpu)
      wheels="$(find_wheels || true)"
      wheel_args=()
      if [[ -n "$wheels" ]]; then
        wheel_args=(-v "$wheels:/wheels:ro" --build-arg TORCH_WHEELS=/wheels)
      else
        echo "[images] no torch $torch_version wheel found (CHATTTS_WHEELS): the CPU image gets PyPI's CUDA torch" >&2
      fi
      build chattts-runtime "$images_version-cpu" deploy/images/runtime.Dockerfile \
        --build-arg EXTRAS=runtime,text-zh,text-en --build-arg SYSTEM_PACKAGES= "${wheel_args[@]}" ;;
    *) echo "[images] unknown image $which (operator, runtime-cpu)" >&2; exit 2 ;;
  esac
done
stamp "done (image store: $(du -sh "$images_cache/storage" | cut -f1))"
