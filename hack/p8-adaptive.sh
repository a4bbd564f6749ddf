#!/usr/bin/env bash
# P8 with adaptive concurrency as its third side: ours as it ships, beside ours
# with --adaptive-concurrency, in the same run (issue 26: adaptive concurrency
# is on by default only if P8 shows no profile and scenario worse with it).
#
#   hack/p8-adaptive.sh [hack/bench.sh flags, e.g. --only p8-aws-ebs --out DIR]
#
# It runs `hack/bench.sh --ours-only` (P8's sides: ours, and "ours FIFO") with
# this script as ours' binary: called with P8's third-side flag
# (--schedule-per-node=false) it runs ours with --adaptive-concurrency instead,
# so the results' "ours FIFO" column is ours with adaptive concurrency (and
# per-node scheduling on, as ours ships).
set -euo pipefail
if [[ "${CSI_ATTACHER_P8_ADAPTIVE_BINARY:-}" ]]; then
  args=()
  for arg in "$@"; do
    if [[ "$arg" == --schedule-per-node=false ]]; then
      args+=(--adaptive-concurrency)
    else
      args+=("$arg")
    fi
  done
  exec "$CSI_ATTACHER_P8_ADAPTIVE_BINARY" "${args[@]}"
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The release binary hack/bench.sh builds.
export CSI_ATTACHER_P8_ADAPTIVE_BINARY="$PWD/target/release/csi-attacher"
exec env CSI_ATTACHER_BENCH_OURS="$PWD/hack/p8-adaptive.sh" hack/bench.sh --ours-only "$@"
