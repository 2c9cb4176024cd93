// Package authzpolicy holds the rules of Istio's AuthorizationPolicy that
// every translation of a policy must agree on, whatever it is translated
// for (node proxies' Authorization, Envoy sidecars' RBAC, proxyless gRPC
// servers' RBAC): which policies are dry runs, and how an action no
// Canopy data plane can enforce is enforced instead.
package authzpolicy
