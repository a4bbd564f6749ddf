#!/usr/bin/env bash
# Builds one pinned Go tool that is not part of the control plane, from the Go
# module proxy, and prints the path of the binary on the last line of stdout
# (everything else goes to stderr).
#
#   hack/build-gotool.sh <module dir under hack/> <binary name> <package> [go build tags]
#   e.g. hack/build-gotool.sh tools-promtool promtool github.com/prometheus/prometheus/cmd/promtool remove_all_sd
#
# Each tool's module (go.mod, go.sum, sources) lives in its own directory, so
# adding or bumping one tool never invalidates hack/build-controlplane.sh's
# cache (two kube-apiservers: the expensive part). The cache key is a hash of
# that directory, the package, this script and the Go version; a second run is
# a no-op.
#
#   CSI_ATTACHER_CACHE   cache root (default: $XDG_CACHE_HOME or ~/.cache, /csi-attacher-rs)
set -euo pipefail

if [ $# -lt 3 ] || [ $# -gt 4 ]; then
  echo "usage: $0 <module dir under hack/> <binary name> <package> [go build tags]" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$1 name=$2 pkg=$3 tags=${4:-}
module="$here/$dir"
[ -f "$module/go.mod" ] || { echo "build-gotool: $module/go.mod not found" >&2; exit 1; }
command -v go >/dev/null 2>&1 || { echo "build-gotool: the Go toolchain is required but 'go' is not on PATH" >&2; exit 1; }

cache_root=${CSI_ATTACHER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-attacher-rs}
key=$( (go env GOVERSION; echo "$pkg $tags"; cd "$here" && { find "$dir" -type f \( -name '*.go' -o -name go.mod -o -name go.sum \); echo build-gotool.sh; } | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -c1-16)
out="$cache_root/$name-$key"

mkdir -p "$cache_root"
exec 9>"$out.lock"
flock 9
if [ ! -x "$out/$name" ]; then
  rm -rf "$out".tmp.*
  echo "build-gotool: building $name ($pkg) into $out" >&2
  tmp="$out.tmp.$$"
  mkdir -p "$tmp"
  (
    cd "$module"
    CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly" go build -trimpath -tags "$tags" -o "$tmp/$name" "$pkg"
  )
  rm -rf "$out" && mv "$tmp" "$out"
fi
echo "$out/$name"
