//go:build tools

// Package coredns lists the CoreDNS command the local cluster builds, so
// that go mod tidy keeps its dependencies in this module.
package coredns

import _ "github.com/coredns/coredns"
