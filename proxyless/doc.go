// Package proxyless tests canopy-controller against a client it did not
// write: grpc-go's own xDS client, configured by a bootstrap as Istio's
// proxyless gRPC applications are, reaching canopy-controller over TLS
// with a service-account token, on a real API server.
package proxyless
