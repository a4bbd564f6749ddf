#!/usr/bin/env bash
# The mutation gate: every mutant of hack/mutants.txt must be killed by its test
# (hack/mutants.py; results in docs/mutants.md). About a minute per mutant on 2 cores.
#   hack/mutants.sh [--only ID,ID] [--table FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${CSI_ATTACHER_TOOLS_BIN:-}" ]; then
  CSI_ATTACHER_TOOLS_BIN=$(bash hack/build-controlplane.sh | tail -n1)
  export CSI_ATTACHER_TOOLS_BIN
fi
exec python3 hack/mutants.py "$@"
