//go:build tools

// Package tools pins promtool (Prometheus v3.16.0, module v0.316.0), which
// checks and unit-tests deploy/monitoring/'s alert rules (tests/monitoring.rs).
// Built by: hack/build-gotool.sh tools-promtool promtool github.com/prometheus/prometheus/cmd/promtool
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
