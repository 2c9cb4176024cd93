// Package localcluster runs a Kubernetes cluster on one Linux machine out of
// namespaces and processes: Canopy's "kind" for end-to-end tests and demos.
//
// Up starts a real control plane (internal/testing/testenv: etcd, kube-apiserver,
// kube-controller-manager) on a host bridge, and for each node a network
// namespace joined to the bridge, with routes to the other nodes' pod
// CIDRs, a kubelet stand-in (localcluster/kubelet) that runs the
// node's CNI chain and the pods' programs, and kube-proxy in nftables mode.
// CoreDNS serves cluster DNS behind the kube-dns Service VIP, and a small
// scheduler binds pods. The API server runs on the host, outside every
// node, so it reaches webhooks at their Services' endpoints
// (--enable-aggregator-routing) rather than through a Service address no
// kube-proxy programs there. Every process is long-lived and detached; a state
// file in the cluster's directory records what Up made, so that Down removes
// all of it, also after a crash.
//
// Everything here needs root. Functions are not safe for concurrent use on
// the same cluster name.
package localcluster
