#!/usr/bin/env bash
# P8 with adaptive concurrency as its third side: ours as it ships, beside ours
# with --adaptive-concurrency, in the same run (issue 26: adaptive concurrency
# is on by default only if P8 shows no profile and scenario worse with it).
#
#   hack/p8-adaptive.sh [hack/bench.sh flags, e.g. --only p8-aws-ebs --out DIR]
#
# The same as `hack/bench.sh --ours-only --p8-third=--adaptive-concurrency ...`:
# the results' third value is ours with --adaptive-concurrency (per-node
# scheduling on, as ours ships), and results.md says so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec hack/bench.sh --ours-only --p8-third=--adaptive-concurrency "$@"
