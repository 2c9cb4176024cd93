//go:build tools

// Package containerd lists the container runtime binaries the local
// cluster's real nodes run, so that go mod tidy keeps their dependencies in
// this module.
package containerd

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
