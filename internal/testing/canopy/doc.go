// Package canopy runs canopy-controller, built from the tree, as a child
// process of a test or benchmark, beside the reference istiod of
// internal/testing/istiod, and dials its TLS xDS port as a proxy would.
//
// Build compiles the binary once (go build; the caller keeps the path for
// every Start of a run). Start runs it against an API server with its
// ports on free loopback addresses: the CA and TLS xDS (15012's
// counterpart), the monitoring port (readiness, metrics); the debug views
// are off. Dial verifies the controller with the root it publishes in its
// CA namespace.
//
// Only tests and benchmarks import this package. A Controller is safe for
// concurrent use.
package canopy
