#!/usr/bin/env bash
# The full run of the property tests: the same tests `cargo test` runs with a
# few hundred cases each, here with PROPTEST_CASES (default 20000) cases each.
# The differential ones need the Go tools (csi-translate from the control
# plane's cache, goprops from hack/tools-goprops), built on first use.
#
#   hack/properties.sh              # 20000 cases per property
#   PROPTEST_CASES=100000 hack/properties.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export PROPTEST_CASES=${PROPTEST_CASES:-20000}
CSI_ATTACHER_TOOLS_BIN=$(hack/build-controlplane.sh | tail -n 1)
export CSI_ATTACHER_TOOLS_BIN
CSI_ATTACHER_GOPROPS_BIN=$(hack/build-gotool.sh tools-goprops goprops . | tail -n 1)
export CSI_ATTACHER_GOPROPS_BIN

# Unit-level properties (names contain "prop"), then the differential tests.
cargo test --locked --lib prop
cargo test --locked --test suite -- properties_migration:: properties_go:: properties_pager::
