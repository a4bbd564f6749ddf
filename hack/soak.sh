#!/usr/bin/env bash
# The soak (tests/chaos/soak.rs; docs/chaos.md#soak): one attacher under
# steady churn with faults for hours; its resident memory, file descriptors,
# threads and runtime tasks must plateau.
#
#   hack/soak.sh                 two hours; writes docs/soak-results.md and docs/soak-samples.csv
#   hack/soak.sh --minutes 5     a short run (the report goes to $TMPDIR unless SOAK_REPORT is set)
#
# The attacher is the release build (as deployed). Exits non-zero when a
# series grows, the attacher exits, or a volume does not attach or detach in time.
set -euo pipefail
cd "$(dirname "$0")/.."
# The commit, date, machine and command, written into the report (hack/figures.py).
CSI_ATTACHER_PROVENANCE=$(python3 hack/figures.py --provenance "hack/soak.sh $*")
export CSI_ATTACHER_PROVENANCE

minutes=120
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift ;;
    --minutes=*) minutes="${1#*=}" ;;
    *) echo "usage: hack/soak.sh [--minutes N]" >&2; exit 2 ;;
  esac
  shift
done
export SOAK_MINUTES="$minutes"
if [ "$minutes" -ge 120 ]; then
  export SOAK_REPORT="${SOAK_REPORT:-$PWD/docs/soak-results.md}"
  export SOAK_CSV="${SOAK_CSV:-$PWD/docs/soak-samples.csv}"
else
  export SOAK_REPORT="${SOAK_REPORT:-${TMPDIR:-/tmp}/soak-results.md}"
  export SOAK_CSV="${SOAK_CSV:-${TMPDIR:-/tmp}/soak-samples.csv}"
fi
if [ -z "${CSI_ATTACHER_TOOLS_BIN:-}" ]; then
  CSI_ATTACHER_TOOLS_BIN="$(hack/build-controlplane.sh kube-apiserver etcd | tail -1)"
  export CSI_ATTACHER_TOOLS_BIN
fi
echo "soak: $minutes minutes; report: $SOAK_REPORT"
exec cargo test --locked --workspace --release --test chaos -- --ignored --exact soak::soak --nocapture
