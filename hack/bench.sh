#!/usr/bin/env bash
# Benchmarks csi-attacher-rs against the upstream Go csi-attacher v4.12.0, side by
# side on one real control plane and one csi-mock-driver (tools/bench/:
# one module per scenario; `hack/bench.sh --help` lists every flag).
#
#   hack/bench.sh                 full run (3 rounds, ~70 min on 2 cores, then P8 ~50 min) → bench/results.{md,json}
#   hack/bench.sh --smoke         tiny sizes, one round (CI) → $TMPDIR/csi-attacher-bench-smoke
#   hack/bench.sh --only p5,p6    some scenarios (p1 p2 p3 p4 p5 p6 limit p1-workers p4-load p7 growth floor
#                                 p8 p8-aws-ebs p8-azure-disk p8-gce-pd p8-serial-per-node cost;
#                                 p8-azure-disk-fast, the sensitivity row, runs only when named)
#   hack/bench.sh --rounds N      another number of rounds
#   hack/bench.sh --out DIR       where results go
#   hack/bench.sh --ours-only     skip upstream (profiling; CSI_ATTACHER_BENCH_OURS=wrapper, or
#                                 --ours-binary wrapper, runs ours under a profiler); P8 then runs
#                                 ours and ours FIFO (--schedule-per-node=false)
#   hack/bench.sh --upstream-binary PATH
#                                 another build in upstream's place: before/after of ours in one run
#                                 (hack/evidence.sh's lean part), results.md says so above its table
#   hack/bench.sh --only p8 --p8-floor-only
#                                 P8's floor alone (and its cloud operations' bound), no attacher
#   hack/bench.sh --charts-only   redraw the SVG charts from bench/results.json (or --out DIR's), running nothing
#   hack/bench.sh --merge DIR... --out DIR2
#                                 P8 runs made apart (each DIR a run's --out, one commit, one machine, the
#                                 same --rounds) into DIR2's results.{md,json} and charts, as one run of
#                                 them all writes them (hack/evidence.sh's p8 part), running nothing
#   hack/bench.sh --wire-format [--pvs N] [--reps R] [--out DIR]
#                                 JSON against protobuf for a list of N PVs (benches/wire_format.rs):
#                                 the API server's CPU, bytes, our decode → DIR/wire-format.md
#
# Every run also writes its charts (throughput, cpu, failover, latency,
# latency-load .svg; p8-<profile>.svg) next to results.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The harness (tools/bench, a workspace member of its own) runs the
# csi-attacher and csi-mock-driver built beside it, in one cargo invocation so
# that they share its dependencies' features: release for a measurement, the
# tests' profile for --smoke (CI), reusing hack/test.sh's build.
profile=(--release)
[[ " $* " == *" --smoke "* ]] && profile=()
bench() {
  cargo build --locked "${profile[@]}" -p csi-attacher-bench -p csi-attacher -p csi-mock-driver --bins
  local dir=target/release
  ((${#profile[@]})) || dir=target/debug
  exec "$dir/csi-attacher-bench" "$@"
}

# Redrawing charts, merging runs or printing the flags needs no control plane.
if [[ " $* " == *" --charts-only "* || " $* " == *" --merge "* || " $* " == *" --help "* ]]; then
  bench "$@"
fi

CSI_ATTACHER_TOOLS_BIN=$(bash hack/build-controlplane.sh | tail -n1)
export CSI_ATTACHER_TOOLS_BIN
# The commit, date, machine and command, written into results.json and
# results.md (hack/figures.py quotes them).
CSI_ATTACHER_PROVENANCE=$(python3 hack/figures.py --provenance "hack/bench.sh $*")
export CSI_ATTACHER_PROVENANCE

# Wire formats: a benchmark of its own (release build).
if [[ "${1:-}" == --wire-format ]]; then
  shift
  exec cargo bench --locked --bench wire_format -- "$@"
fi

bench "$@"
