#!/usr/bin/env bash
# The test command: builds the pinned Go tools it needs (cached after the
# first run; in the background while cargo compiles the tests), then runs
# every test: unit tests, and behaviour tests against a real
# kube-apiserver + etcd, csi-mock-driver and csi-test's Go mock driver; and
# promtool (hack/tools-promtool, cached) for deploy/monitoring's rule tests;
# and the GCE PD CSI driver's controller on its fake compute provider
# (hack/tools-gcepd, cached) for tests/gce_pd.rs.
# CSI_ATTACHER_KUBE_VERSION=1.34 runs them against kube-apiserver 1.34 instead.
#
# With no arguments, the chaos binary (tests/chaos.rs: its fault run and the
# API-server outage test, about three minutes spent mostly waiting for faults
# to play out, each on a control plane of its own) runs beside the other test
# binaries instead of after them; in the main run those two tests see
# CSI_ATTACHER_CHAOS_BESIDE and return at once. With arguments, cargo test
# gets them as they are.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The Go tools of this run build in the background while cargo compiles
# (each cached after its first build); kube-apiserver 1.34 only for a run
# against it.
go_tools=(kube-apiserver etcd csi-test-driver csi-translate csi-attacher-upstream)
if [ "${CSI_ATTACHER_KUBE_VERSION:-}" = 1.34 ]; then
  go_tools+=(kube-apiserver-1.34)
fi
go_dir=$(mktemp -d)
trap 'rm -rf "$go_dir"' EXIT
(
  set -e
  hack/build-controlplane.sh "${go_tools[@]}" | tail -n 1 >"$go_dir/tools"
  hack/build-gotool.sh tools-promtool promtool github.com/prometheus/prometheus/cmd/promtool | tail -n 1 >"$go_dir/promtool"
  hack/build-gotool.sh tools-gcepd gce-pd-driver github.com/csi-attacher-rs/hack/tools-gcepd | tail -n 1 >"$go_dir/gce-pd-driver"
) 2>"$go_dir/log" &
go_pid=$!
cargo_rc=0
cargo test --locked --no-run "$@" || cargo_rc=$?
if ! wait "$go_pid"; then
  cat "$go_dir/log" >&2
  echo "test.sh: building the Go tools failed" >&2
  exit 1
fi
((cargo_rc == 0)) || exit "$cargo_rc"
CSI_ATTACHER_TOOLS_BIN=$(cat "$go_dir/tools")
CSI_ATTACHER_PROMTOOL=$(cat "$go_dir/promtool")
CSI_ATTACHER_GCE_PD_DRIVER=$(cat "$go_dir/gce-pd-driver")
export CSI_ATTACHER_TOOLS_BIN CSI_ATTACHER_PROMTOOL CSI_ATTACHER_GCE_PD_DRIVER
if [ $# -gt 0 ]; then
  cargo test --locked "$@"
  exit 0
fi

# Everything is built: nothing compiles while the chaos run's clocks tick.
chaos=$(cargo test --locked --no-run --test chaos --message-format=json 2>/dev/null |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "chaos" and m["profile"]["test"] and m.get("executable"):
        print(m["executable"])')
[ -x "$chaos" ] || { echo "test.sh: no chaos test binary found" >&2; exit 1; }
chaos_log="$go_dir/chaos.log"
# As cargo test runs it: from the package root.
"$chaos" >"$chaos_log" 2>&1 &
chaos_pid=$!
rc=0
CSI_ATTACHER_CHAOS_BESIDE=1 cargo test --locked || rc=$?
chaos_rc=0
wait "$chaos_pid" || chaos_rc=$?
echo "== tests/chaos.rs (run beside the other test binaries)"
cat "$chaos_log"
if ((rc != 0)); then
  exit "$rc"
fi
exit "$chaos_rc"
