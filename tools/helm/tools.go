//go:build tools

// Package helm lists the helm CLI, which the chart's test installs,
// upgrades and uninstalls Canopy with as most users do, so that go mod tidy
// keeps its dependencies in this module.
package helm

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
