#!/usr/bin/env bash
# Build (or reuse) the local control-plane binaries: kube-apiserver,
# kube-controller-manager, kube-scheduler, etcd, kwok and helm.
#
# Binaries land in a cache outside the checkout, keyed by the pinned versions,
# so a fresh clone on the same machine (CI) reuses them in seconds:
#   ${CHATTTS_CLUSTER_CACHE:-${XDG_CACHE_HOME:-~/.cache}/chattts-operator/cluster}/bin/<key>/
# Set CHATTTS_CLUSTER_BIN_DIR to a folder that already holds these binaries
# (envtest or kwokctl downloads, say) to skip building altogether.
# Prints the binary folder on its last line of stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

# Required; kubectl is built too but may come from PATH when CHATTTS_CLUSTER_BIN_DIR is used.
tools=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok helm)

if [[ -n "${CHATTTS_CLUSTER_BIN_DIR:-}" ]]; then
  for t in "${tools[@]}"; do
    [[ -x "$CHATTTS_CLUSTER_BIN_DIR/$t" ]] || { echo "CHATTTS_CLUSTER_BIN_DIR=$CHATTTS_CLUSTER_BIN_DIR lacks $t" >&2; exit 1; }
  done
  echo "$CHATTTS_CLUSTER_BIN_DIR"; exit 0
fi

# A go new enough for the modules (fetches the official toolchain module if PATH's go is older).
go_bin="$("$here/ensure-go.sh")"
export PATH="$(dirname "$go_bin"):$PATH"

cache="${CHATTTS_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/chattts-operator/cluster}"
key="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_$(go env GOOS)-$(go env GOARCH)"
bin="$cache/bin/$key"
mkdir -p "$bin"

log() { echo "[build] $*" >&2; }

# One binary at a time: the machine has two cores and each link wants both.
build() {  # build <module dir> <output name> <package> <ldflags>
  local dir="$1" name="$2" pkg="$3" ldflags="$4"
  if [[ -x "$bin/$name" ]]; then log "$name: cached"; return; fi
  log "$name: building $pkg (the first build of Kubernetes takes many minutes on 2 cores)"
  local start=$SECONDS
  (cd "$here/$dir" && CGO_ENABLED=0 go build -trimpath -tags "selinux,notest,grpcnotrace" \
      -ldflags "-s -w $ldflags" -o "$bin/$name.tmp" "$pkg")
  mv "$bin/$name.tmp" "$bin/$name"
  log "$name: built in $((SECONDS - start)) s"
}

kver="$KUBERNETES_VERSION"
kminor="${kver#v1.}"; kminor="${kminor%%.*}"
kflags="-X k8s.io/component-base/version.gitVersion=$kver -X k8s.io/component-base/version.gitMajor=1 \
-X k8s.io/component-base/version.gitMinor=$kminor -X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z \
-X k8s.io/client-go/pkg/version.gitVersion=$kver -X k8s.io/client-go/pkg/version.gitMajor=1 \
-X k8s.io/client-go/pkg/version.gitMinor=$kminor -X k8s.io/client-go/pkg/version.gitTreeState=clean"

build etcd etcd go.etcd.io/etcd/server/v3 ""
build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$kver"
build helm helm helm.sh/helm/v3/cmd/helm "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
build kubernetes kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kflags"
build kubernetes kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$kflags"
build kubernetes kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$kflags"
# kubectl of the same minor as the server (a distro kubectl may be outside the version skew).
build kubernetes kubectl k8s.io/kubernetes/cmd/kubectl "$kflags"

# kwok's default stages ship inside its module; copy them beside the binaries.
stages="$bin/kwok-stages"
if [[ ! -d "$stages" ]]; then
  moddir="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  mkdir -p "$stages.tmp"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    cp "$moddir/kustomize/stage/$f" "$stages.tmp/$(basename "$f")"
  done
  mv "$stages.tmp" "$stages"
fi
echo "$bin"
