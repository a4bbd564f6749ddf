#!/usr/bin/env bash
# Builds the pinned Go tools the tests and the benchmark need (versions in
# hack/tools/go.mod), from the Go module proxy: kube-apiserver, etcd, the
# csi-test mock driver, csi-translate (k8s.io/csi-translation-lib behind a
# JSON-lines filter) and the upstream Go csi-attacher (benchmark peer). Also
# kube-apiserver-1.34 (hack/tools-k8s134/go.mod): the oldest Kubernetes the
# attacher supports, so the behaviour tests can run against it too.
#
#   hack/build-controlplane.sh                       all of them
#   hack/build-controlplane.sh kube-apiserver etcd   only these (the demo's)
#
# Output goes to a cache directory keyed by a hash of hack/tools and
# hack/tools-k8s134 (go.mod, go.sum, sources), this script and the Go version;
# each binary is built once, when first asked for, so a later run is a no-op
# for what is there. The directory is printed on the last line of stdout;
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

all=(kube-apiserver kube-apiserver-1.34 etcd csi-test-driver csi-translate csi-attacher-upstream)
wanted=("$@")
if ((${#wanted[@]} == 0)); then
  wanted=("${all[@]}")
fi
for b in "${wanted[@]}"; do
  [[ " ${all[*]} " == *" $b "* ]] || { echo "build-controlplane: unknown binary $b (known: ${all[*]})" >&2; exit 2; }
done

cache_root=${CSI_ATTACHER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-attacher-rs}
key=$( (go env GOVERSION; cd "$here" && { find tools tools-k8s134 -type f \( -name '*.go' -o -name go.mod -o -name go.sum \); echo build-controlplane.sh; } | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -c1-16)
out="$cache_root/tools-$key"

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

missing=()
for b in "${wanted[@]}"; do
  [ -x "$out/$b" ] || missing+=("$b")
done
if ((${#missing[@]})); then
  rm -rf "$out".tmp.* # left by an interrupted build
  echo "build-controlplane: building ${missing[*]} into $out (a first build takes minutes)" >&2
  tmp="$out.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp" "$out"
  export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly"
  # Each binary lands in $out only once it is whole.
  for b in "${missing[@]}"; do
    case $b in
      kube-apiserver-1.34)
        (cd "$tools134" && go build -trimpath -ldflags "$(version_ldflags)" -o "$tmp/$b" k8s.io/kubernetes/cmd/kube-apiserver) ;;
      kube-apiserver)
        (cd "$tools" && go build -trimpath -ldflags "$(version_ldflags)" -o "$tmp/$b" k8s.io/kubernetes/cmd/kube-apiserver) ;;
      etcd | csi-test-driver | csi-translate)
        (cd "$tools" && go build -trimpath -o "$tmp/$b" "./$b") ;;
      csi-attacher-upstream)
        (cd "$tools" && go build -trimpath -o "$tmp/$b" github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher) ;;
    esac
    mv "$tmp/$b" "$out/$b"
  done
  rm -rf "$tmp"
  echo "build-controlplane: done" >&2
fi
echo "$out"
