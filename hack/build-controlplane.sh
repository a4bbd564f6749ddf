#!/usr/bin/env bash
# Builds the pinned Go tools the tests and the benchmark need (versions in
# hack/tools/go.mod), from the Go module proxy: kube-apiserver, etcd, the
# csi-test mock driver, csi-translate (k8s.io/csi-translation-lib behind a
# JSON-lines filter) and the upstream Go csi-attacher (benchmark peer).
#
# Output goes to a cache directory keyed by a hash of hack/tools (go.mod, go.sum,
# sources) and the Go version, so a second run is a no-op. The directory is
# printed on the last line of stdout; everything else goes to stderr.
#
#   CSI_ATTACHER_CACHE   cache root (default: $XDG_CACHE_HOME or ~/.cache, /csi-attacher-rs)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tools="$here/tools"

if ! command -v go >/dev/null 2>&1; then
  echo "build-controlplane: the Go toolchain (go >= 1.26) is required but 'go' is not on PATH" >&2
  exit 1
fi

cache_root=${CSI_ATTACHER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-attacher-rs}
key=$( (go env GOVERSION; cd "$tools" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -c1-16)
out="$cache_root/tools-$key"
binaries=(kube-apiserver etcd csi-test-driver csi-translate csi-attacher-upstream)

complete() {
  for b in "${binaries[@]}"; do [ -x "$out/$b" ] || return 1; done
}

mkdir -p "$cache_root"
exec 9>"$cache_root/.build.lock"
flock 9

if ! complete; then
  rm -rf "$out".tmp.* # left by an interrupted build
  echo "build-controlplane: building ${binaries[*]} into $out (first run takes several minutes)" >&2
  tmp="$out.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  (
    cd "$tools"
    export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly"
    go build -trimpath -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
    go build -trimpath -o "$tmp/etcd" ./etcd
    go build -trimpath -o "$tmp/csi-test-driver" ./csi-test-driver
    go build -trimpath -o "$tmp/csi-translate" ./csi-translate
    go build -trimpath -o "$tmp/csi-attacher-upstream" github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher
  )
  rm -rf "$out" && mv "$tmp" "$out"
  echo "build-controlplane: done" >&2
fi
echo "$out"
