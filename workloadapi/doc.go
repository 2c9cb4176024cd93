// Package workloadapi holds the Go types of Canopy's workload discovery
// protocol (proto package istio.workload, generated from proto/workload.proto)
// and the small helpers every component needs to name its resources: xDS type
// URLs, workload UIDs, "namespace/hostname" service keys, "network/ip" address
// keys and SPIFFE identities.
//
// The generated *.pb.go files are never edited by hand: change proto/ and run
// make proto. The helpers are pure functions and immutable values, safe for
// concurrent use. The package imports only the protobuf runtime and the SPIFFE
// ID library, so every binary may depend on it.
//
// Sub-packages: security (proto package istio.security, L4 authorization)
// and zds (proto package istio.workload.zds, CNI agent to node proxy).
package workloadapi
