//go:build tools

// Package tools pins crane (go-containerregistry v0.22.1), which assembles,
// pushes, pulls and inspects the OCI image index of hack/image.sh without a
// container engine, and serves the loopback registry that script checks
// against (`crane registry serve`).
// Built by: hack/build-gotool.sh tools-crane crane github.com/google/go-containerregistry/cmd/crane
package tools

import _ "github.com/google/go-containerregistry/cmd/crane"
