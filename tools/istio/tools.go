//go:build tools

// Package istio lists the Istio commands the differential tests and the
// local cluster build, so that go mod tidy keeps their dependencies in this
// module.
package istio

import (
	_ "istio.io/istio/istioctl/cmd/istioctl"
	_ "istio.io/istio/pilot/cmd/pilot-agent"
	_ "istio.io/istio/pilot/cmd/pilot-discovery"
)
