#!/usr/bin/env bash
# Builds the pinned Go tools the tests and the benchmark need (versions in
# hack/tools/go.mod), from the Go module proxy: kube-apiserver, etcd, the
# csi-test mock driver, csi-translate (k8s.io/csi-translation-lib behind a
# JSON-lines filter) and the upstream Go csi-attacher (benchmark peer). Also
# kube-apiserver-1.34 (hack/tools-k8s134/go.mod): the oldest Kubernetes the
# attacher supports, so the behaviour tests can run against it too.
#
# Output goes to a cache directory keyed by a hash of hack/tools and
# hack/tools-k8s134 (go.mod, go.sum, sources), this script and the Go version,
# so a second run is a no-op. The directory is printed on the last line of stdout;
# everything else goes to stderr.
#
#   CSI_ATTACHER_CACHE   cache root (default: $XDG_CACHE_HOME or ~/.cache, /csi-attacher-rs)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tools="$here/tools"
tools134="$here/tools-k8s134"

if ! command -v go >/dev/null 2>&1; then
  echo "build-controlplane: the Go toolchain (go >= 1.26) is required but 'go' is not on PATH" >&2
  exit 1
fi

cache_root=${CSI_ATTACHER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-attacher-rs}
key=$( (go env GOVERSION; cd "$here" && { find tools tools-k8s134 -type f \( -name '*.go' -o -name go.mod -o -name go.sum \); echo build-controlplane.sh; } | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -c1-16)
out="$cache_root/tools-$key"
binaries=(kube-apiserver kube-apiserver-1.34 etcd csi-test-driver csi-translate csi-attacher-upstream)

complete() {
  for b in "${binaries[@]}"; do [ -x "$out/$b" ] || return 1; done
}

# The release a kube-apiserver build reports (--version, GET /version), as
# Kubernetes' own build stamps it; a plain `go build` would say v0.0.0-master.
# Run inside the module that pins k8s.io/kubernetes.
version_ldflags() {
  local v minor
  v=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
  minor=${v#v1.} && minor=${minor%%.*}
  local pkg flags=()
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    flags+=("-X $pkg.gitVersion=$v" "-X $pkg.gitMajor=1" "-X $pkg.gitMinor=$minor" "-X $pkg.gitTreeState=clean")
  done
  echo "${flags[*]}"
}

mkdir -p "$cache_root"
# One lock per key: a build of other pins (another branch) need not wait.
exec 9>"$out.lock"
flock 9

if ! complete; then
  rm -rf "$out".tmp.* # left by an interrupted build
  echo "build-controlplane: building ${binaries[*]} into $out (first run takes several minutes)" >&2
  tmp="$out.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly"
  (
    cd "$tools134"
    go build -trimpath -ldflags "$(version_ldflags)" -o "$tmp/kube-apiserver-1.34" k8s.io/kubernetes/cmd/kube-apiserver
  )
  (
    cd "$tools"
    go build -trimpath -ldflags "$(version_ldflags)" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
    go build -trimpath -o "$tmp/etcd" ./etcd
    go build -trimpath -o "$tmp/csi-test-driver" ./csi-test-driver
    go build -trimpath -o "$tmp/csi-translate" ./csi-translate
    go build -trimpath -o "$tmp/csi-attacher-upstream" github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher
  )
  rm -rf "$out" && mv "$tmp" "$out"
  echo "build-controlplane: done" >&2
fi
echo "$out"
