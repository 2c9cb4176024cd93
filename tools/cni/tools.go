//go:build tools

// Package cni lists the CNI plugins the local cluster builds, so that go mod
// tidy keeps their dependencies in this module.
package cni

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/main/ptp"
)
