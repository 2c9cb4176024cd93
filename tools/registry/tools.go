//go:build tools

// Package registry lists the OCI registry the local cluster's nodes pull
// Canopy's images from, so that go mod tidy keeps its dependencies in this
// module.
package registry

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
)
