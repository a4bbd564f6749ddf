#!/usr/bin/env bash
# The test command: builds the pinned control plane (cached after the first
# run), then runs every test: unit tests, and behaviour tests against a real
# kube-apiserver + etcd, csi-mock-driver and csi-test's Go mock driver; and
# promtool (hack/tools-promtool, cached) for deploy/monitoring's rule tests;
# and the GCE PD CSI driver's controller on its fake compute provider
# (hack/tools-gcepd, cached) for tests/gce_pd.rs.
# CSI_ATTACHER_KUBE_VERSION=1.34 runs them against kube-apiserver 1.34 instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tools=$(hack/build-controlplane.sh | tail -n 1)
export CSI_ATTACHER_TOOLS_BIN="$tools"
promtool=$(hack/build-gotool.sh tools-promtool promtool github.com/prometheus/prometheus/cmd/promtool | tail -n 1)
export CSI_ATTACHER_PROMTOOL="$promtool"
gce_pd_driver=$(hack/build-gotool.sh tools-gcepd gce-pd-driver github.com/csi-attacher-rs/hack/tools-gcepd | tail -n 1)
export CSI_ATTACHER_GCE_PD_DRIVER="$gce_pd_driver"
exec cargo test --locked "$@"
