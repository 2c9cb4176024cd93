// Package parity holds the differential test of Canopy's control plane
// against Istio's: istiod (built from the istio.io/istio pinned in
// tools/istio) and canopy-controller watch one API server holding the
// objects of testdata/cluster.yaml, a subscriber takes each one's workload
// xDS (istio.workload.Address and istio.security.Authorization, wildcard
// Delta ADS), and the two tables are compared resource by resource.
//
// istiod is the reference. Every difference must be listed, with the reason,
// in testdata/allowlist.yaml; the test fails on any other, and on a listed
// one that no longer occurs. It logs the score: identical resources out of
// all resources either side sent, per type.
//
// The package has no code outside its tests.
package parity
