#!/usr/bin/env bash
# Print the path of a `go` new enough to build the wrapper modules (their go.mod
# says `go 1.26.0`). The `go` on PATH is used when it is new enough. Otherwise
# any older go (Debian bookworm's golang-go is 1.19) fetches the official
# toolchain, which is published as an ordinary Go module (golang.org/toolchain),
# through the configured GOPROXY into the module cache.
#   CHATTTS_GO_TOOLCHAIN  toolchain to fetch when needed (default go1.26.8)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
want="$(awk '$1 == "go" {print $2; exit}' "$here/kubernetes/go.mod")"
toolchain="${CHATTTS_GO_TOOLCHAIN:-go1.26.8}"

at_least() {  # at_least <have> <want>: version comparison on dotted numbers
  [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]
}

if ! command -v go >/dev/null; then
  echo "ensure-go: no go on PATH; install Debian's golang-go (any version) first" >&2
  exit 1
fi
# GOTOOLCHAIN=local: report this go itself, not a toolchain it would switch to.
have="$(GOTOOLCHAIN=local go env GOVERSION)"; have="${have#go}"; have="${have%%[-+ ]*}"
if at_least "$have" "$want"; then
  command -v go
  exit 0
fi

module="golang.org/toolchain@v0.0.1-${toolchain}.$(go env GOOS)-$(go env GOARCH)"
echo "ensure-go: go $have is older than $want; fetching $module" >&2
# Outside any module, so the download does not touch a go.mod.
dir="$(cd "$(mktemp -d)" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "$module" \
       | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
[[ -n "$dir" && -d "$dir/bin" ]] || { echo "ensure-go: download of $module failed" >&2; exit 1; }
# Module zips do not keep the executable bit (the go command restores it the same way).
if [[ ! -x "$dir/bin/go" ]]; then
  chmod u+w "$dir" "$dir/bin" "$dir"/pkg/tool/*/ 2>/dev/null || true
  chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/* 2>/dev/null || true
fi
"$dir/bin/go" version >&2
echo "$dir/bin/go"
