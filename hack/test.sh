#!/usr/bin/env bash
# The test command: builds the pinned Go tools it needs (cached after the
# first run; in the background while cargo compiles the tests), then runs
# every test: unit tests, and behaviour tests against a real
# kube-apiserver + etcd, csi-mock-driver and csi-test's Go mock driver; and
# promtool (hack/tools-promtool, cached) for deploy/monitoring's rule tests;
# the GCE PD CSI driver's controller on its fake compute provider
# (hack/tools-gcepd, cached) for tests/gce_pd.rs; and goprops
# (hack/tools-goprops, cached) for tests/properties_go.rs.
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

# At least four tests at a time in each test binary (libtest's default is one
# per core): the behaviour tests spend most of their
# time waiting on the API server, on processes and on the driver's clocks, not
# on the CPU. On 2 cores the suite took 250 s two at a time and 135 s four at
# a time (its own CPU: 49 s). RUST_TEST_THREADS set by the caller wins.
cores=$(nproc)
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-$((cores > 4 ? cores : 4))}

# The Go tools of this run build in the background while cargo compiles
# (each cached after its first build); kube-apiserver 1.34 only for a run
# against it.
go_tools=(kube-apiserver etcd csi-test-driver csi-translate csi-attacher-upstream)
if [ "${CSI_ATTACHER_KUBE_VERSION:-}" = 1.34 ]; then
  go_tools+=(kube-apiserver-1.34)
fi
go_dir=$(mktemp -d)
trap 'rm -rf "$go_dir"' EXIT
# Four builds at once: on a fresh machine each spends much of its time
# fetching modules, which the others' compiling fills.
build() { # build <name> <command...>: the last line of its output into $go_dir/<name>
  local name=$1
  shift
  "$@" 2>"$go_dir/$name.log" | tail -n 1 >"$go_dir/$name"
}
go_pids=()
build tools hack/build-controlplane.sh "${go_tools[@]}" &
go_pids+=($!)
# promtool without Prometheus' service-discovery plugins (the cloud SDKs: its
# `remove_all_sd` build tag): the rule tests need none, and the build takes
# 195 s of CPU instead of 448 s (measured at a542323 with a cold GOCACHE).
build promtool hack/build-gotool.sh tools-promtool promtool github.com/prometheus/prometheus/cmd/promtool remove_all_sd &
go_pids+=($!)
build gce-pd-driver hack/build-gotool.sh tools-gcepd gce-pd-driver github.com/csi-attacher-rs/hack/tools-gcepd &
go_pids+=($!)
build goprops hack/build-gotool.sh tools-goprops goprops . &
go_pids+=($!)
cargo_rc=0
cargo test --locked --workspace --no-run "$@" || cargo_rc=$?
go_failed=0
for pid in "${go_pids[@]}"; do
  wait "$pid" || go_failed=1
done
for name in tools promtool gce-pd-driver goprops; do
  if ((go_failed)) || [ ! -s "$go_dir/$name" ]; then
    cat "$go_dir/$name.log" >&2
  fi
done
if ((go_failed)); then
  echo "test.sh: building the Go tools failed (their output is above)" >&2
  exit 1
fi
((cargo_rc == 0)) || exit "$cargo_rc"
CSI_ATTACHER_TOOLS_BIN=$(cat "$go_dir/tools")
CSI_ATTACHER_PROMTOOL=$(cat "$go_dir/promtool")
CSI_ATTACHER_GCE_PD_DRIVER=$(cat "$go_dir/gce-pd-driver")
CSI_ATTACHER_GOPROPS_BIN=$(cat "$go_dir/goprops")
export CSI_ATTACHER_TOOLS_BIN CSI_ATTACHER_PROMTOOL CSI_ATTACHER_GCE_PD_DRIVER CSI_ATTACHER_GOPROPS_BIN
if [ $# -gt 0 ]; then
  cargo test --locked --workspace "$@"
  exit 0
fi

# Everything is built: nothing compiles while the chaos run's clocks tick.
chaos=$(cargo test --locked --workspace --no-run --test chaos --message-format=json 2>/dev/null |
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
CSI_ATTACHER_CHAOS_BESIDE=1 cargo test --locked --workspace || rc=$?
chaos_rc=0
wait "$chaos_pid" || chaos_rc=$?
echo "== tests/chaos.rs (run beside the other test binaries)"
cat "$chaos_log"
if ((rc != 0)); then
  exit "$rc"
fi
exit "$chaos_rc"
