#!/usr/bin/env bash
# The test command: builds the pinned control plane (cached after the first
# run), then runs every test: unit tests, and behaviour tests against a real
# kube-apiserver + etcd, csi-mock-driver and csi-test's Go mock driver; and
# promtool (hack/tools-promtool, cached) for deploy/monitoring's rule tests.
# CSI_ATTACHER_KUBE_VERSION=1.34 runs them against kube-apiserver 1.34 instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tools=$(hack/build-controlplane.sh | tail -n 1)
export CSI_ATTACHER_TOOLS_BIN="$tools"
promtool=$(hack/build-gotool.sh tools-promtool promtool github.com/prometheus/prometheus/cmd/promtool | tail -n 1)
export CSI_ATTACHER_PROMTOOL="$promtool"
exec cargo test --locked "$@"
