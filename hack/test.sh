#!/usr/bin/env bash
# The test command: builds the pinned control plane (cached after the first
# run), then runs every test: unit tests, and behaviour tests against a real
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

tools=$(hack/build-controlplane.sh | tail -n 1)
export CSI_ATTACHER_TOOLS_BIN="$tools"
promtool=$(hack/build-gotool.sh tools-promtool promtool github.com/prometheus/prometheus/cmd/promtool | tail -n 1)
export CSI_ATTACHER_PROMTOOL="$promtool"
gce_pd_driver=$(hack/build-gotool.sh tools-gcepd gce-pd-driver github.com/csi-attacher-rs/hack/tools-gcepd | tail -n 1)
export CSI_ATTACHER_GCE_PD_DRIVER="$gce_pd_driver"
if [ $# -gt 0 ]; then
  exec cargo test --locked "$@"
fi

# Build everything first: nothing compiles while the chaos run's clocks tick.
cargo test --locked --no-run
chaos=$(cargo test --locked --no-run --test chaos --message-format=json 2>/dev/null |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "chaos" and m["profile"]["test"] and m.get("executable"):
        print(m["executable"])')
[ -x "$chaos" ] || { echo "test.sh: no chaos test binary found" >&2; exit 1; }
chaos_log=$(mktemp)
trap 'rm -f "$chaos_log"' EXIT
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
