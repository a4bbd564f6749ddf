#!/usr/bin/env bash
# The chaos suite (tests/chaos.rs; docs/chaos.md).
#
#   hack/chaos.sh                      CI size: >= 60 faults, about 3-4 minutes
#   hack/chaos.sh --full               full size: >= 500 faults; writes docs/chaos-results.md
#   hack/chaos.sh --seed 42            replay a run (the seed is printed at its start)
#   hack/chaos.sh --faults 120         any number of faults
#
# Env: CHAOS_REPORT=<path> (where the summary goes; default docs/chaos-results.md for --full),
# CHAOS_KEEP=1 keeps the run's directory (logs, audit log, ledger) for inspection.
# Exits non-zero when an invariant is violated; the summary is written either way.
set -euo pipefail
cd "$(dirname "$0")/.."
# The commit, date, machine and command, written into the report (hack/figures.py).
CSI_ATTACHER_PROVENANCE=$(python3 hack/figures.py --provenance "hack/chaos.sh $*")
export CSI_ATTACHER_PROVENANCE

export CHAOS_SIZE=ci
while [ $# -gt 0 ]; do
  case "$1" in
    --full) CHAOS_SIZE=full ;;
    --seed) export CHAOS_SEED="$2"; shift ;;
    --seed=*) export CHAOS_SEED="${1#*=}" ;;
    --faults) export CHAOS_FAULTS="$2"; shift ;;
    --faults=*) export CHAOS_FAULTS="${1#*=}" ;;
    *) echo "usage: hack/chaos.sh [--full] [--seed N] [--faults N]" >&2; exit 2 ;;
  esac
  shift
done
if [ "$CHAOS_SIZE" = full ]; then
  export CHAOS_REPORT="${CHAOS_REPORT:-$PWD/docs/chaos-results.md}"
fi
if [ -z "${CSI_ATTACHER_TOOLS_BIN:-}" ]; then
  CSI_ATTACHER_TOOLS_BIN="$(hack/build-controlplane.sh | tail -1)"
  export CSI_ATTACHER_TOOLS_BIN
fi
exec cargo test --locked --workspace --test chaos -- --nocapture
