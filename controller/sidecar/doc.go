// Package sidecar computes the Envoy xDS resources (clusters, endpoints,
// listeners, routes) that canopy-controller serves to Envoy sidecars (the
// sidecar generator: outbound and inbound sides, HBONE, RBAC) and to
// proxyless gRPC clients (a node whose metadata says GENERATOR "grpc"),
// as Istio's control plane shapes them for each (docs/sidecar-xds.md),
// and splits each answer into shares that proxies alike are answered
// together (Share).
//
// Everything here is pure: a Mesh (the services and endpoints of the
// workload tables, with the labels subsets select on, the VirtualServices,
// DestinationRules and Sidecar resources that shape traffic, and the
// PeerAuthentications and AuthorizationPolicies inbound sides enforce) and
// a Proxy in, go-control-plane protos out. Inputs are never modified;
// outputs are new.
package sidecar
