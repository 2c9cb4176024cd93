// Package securitypolicy is the one home of the rules of Istio's security
// policies that every translation must agree on, whatever a policy is
// translated for (node proxies' Authorization and mTLS policies, Envoy
// sidecars' RBAC and inbound TLS, proxyless gRPC servers' RBAC):
//
//   - which AuthorizationPolicies apply to a workload: their scope (the
//     workload's namespace, or the root namespace for the mesh), that a
//     policy with targetRefs binds to gateways and waypoints rather than
//     workloads, that `selector: {}` selects every workload in scope, and
//     which policies are dry runs;
//   - how an action no Canopy data plane can enforce (CUSTOM) is enforced
//     instead;
//   - which PeerAuthentications decide a workload's mTLS mode: the
//     workload's, its namespace's and the mesh's, the oldest of each
//     level, each UNSET deferring to the next, and a workload policy's
//     port-level modes first.
//
// Everything here is pure and table-tested. Where istiod itself reads a
// policy differently for sidecars and for ztunnel (a PeerAuthentication's
// empty selector), the difference is a parameter, named for the path it
// mirrors.
package securitypolicy
