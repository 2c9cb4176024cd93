// Package validation checks Istio configuration the way Istio's validating
// webhook does (istio.io/istio pkg/config/validation) for the fields Canopy
// translates, and refuses besides what Envoy or grpc-go would refuse once
// translated: a regular expression RE2 does not compile or whose program is
// larger than Envoy runs, a header name that is not an HTTP token, a host
// with a wildcard anywhere but its leftmost label, a duration under a
// millisecond, a percentage outside 0..100, a port outside 1..65535,
// weights that sum to 0 or beyond what a uint32 holds.
//
// It is the one place these rules live: the validating webhook
// (controller/admission) refuses objects with them before they are stored,
// and the sidecar generators (controller/sidecar) check every object again
// before it reaches a resource that proxies share, because the webhook can
// be bypassed (failurePolicy Ignore while the controller starts, an object
// stored before the webhook existed, a cluster administrator who deletes
// the configuration). One bad route then costs its own object, not every
// sidecar's routes.
//
// Everything here is pure and safe for concurrent use: specs in, errors
// out. Messages are Istio's where Istio has one. Anything may import this
// package; it imports only the Istio API types and the standard library.
package validation
