# Sourced by the hack/images scripts and the image tests' helpers: where buildah/podman keep
# their state. Everything lives outside the clone, in ~/.cache/chattts-operator/images, so a
# fresh clone reuses the base rootfs and the layer cache of an earlier build.
images_cache="${CHATTTS_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/chattts-operator/images}"
images_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$images_cache/storage" "$images_cache/run"
export CONTAINERS_CONF="$images_repo/hack/images/containers.conf"
export CONTAINERS_STORAGE_CONF="$images_cache/storage.conf"
# vfs: works on any filesystem (overlay-on-overlay does not in every CI container).
cat > "$CONTAINERS_STORAGE_CONF" <<CONF
[storage]
driver = "${CHATTTS_STORAGE_DRIVER:-vfs}"
graphroot = "$images_cache/storage"
runroot = "$images_cache/run"
CONF
export CONTAINERS_REGISTRIES_CONF="$images_repo/hack/images/registries.conf"
# The tag every project image gets; the chart's default tag is the package version.
images_version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$images_repo/pyproject.toml" | head -1)"
images_out="${CHATTTS_IMAGES_OUT:-$images_repo/build/images}"
base_image="localhost/chattts-base:bookworm"
