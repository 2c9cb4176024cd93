// Package sidecar computes the Envoy xDS resources (clusters, endpoints,
// listeners, routes) that canopy-controller serves to proxyless gRPC
// clients, as Istio's control plane shapes them for a node whose metadata
// says GENERATOR "grpc" (docs/sidecar-xds.md).
//
// Everything here is pure: a Mesh (the services and endpoints of the
// workload tables, with the labels subsets select on, the VirtualServices
// and DestinationRules that shape traffic, and the PeerAuthentications and
// AuthorizationPolicies a server listener enforces) and a Proxy in,
// go-control-plane protos out. Inputs are never modified; outputs are new.
package sidecar
