#!/usr/bin/env bash
# The test command: builds the pinned control plane (cached after the first
# run), then runs every test: unit tests, and behaviour tests against a real
# kube-apiserver + etcd, csi-mock-driver and csi-test's Go mock driver.
# CSI_ATTACHER_KUBE_VERSION=1.34 runs them against kube-apiserver 1.34 instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tools=$(hack/build-controlplane.sh | tail -n 1)
export CSI_ATTACHER_TOOLS_BIN="$tools"
exec cargo test --locked "$@"
