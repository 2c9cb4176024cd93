// Package dns is the node proxy's DNS server (docs/wire-contract.md §4.6): one
// per served pod, inside the pod's network namespace on 127.0.0.1:15053 and
// [::1]:15053, UDP and TCP, where the pod's redirection sends its DNS (and,
// for a pod the CNI agent redirects with eBPF, on the sockets in its socket
// map, which get the queries unNATed: each UDP answer is sent from the
// server address the query was sent to; see steeredConn).
//
// It answers A and AAAA for the mesh's names itself (package authority:
// Kubernetes Services, ServiceEntry hosts and their allocated addresses, as
// the pod's namespace sees them), authoritative, with a 30 s TTL; a mesh
// name without an address of the asked family is answered empty, never
// NXDOMAIN. Every other query is relayed to the pod's own resolvers (package
// upstream) and their answer sent back as it came, only truncated to what
// the client can take: 512 bytes without EDNS, its advertised size with it,
// with TC set so that it asks again over TCP.
//
// # Hostile pods
//
// A pod's queries are its own, and bounded: at most Limits.MaxInFlight of
// one pod's forwarded queries wait for its resolvers at once (a UDP query
// past it is dropped, as a loaded resolver does, and asked again by the
// client; a TCP one is answered SERVFAIL); mesh names, answered at once,
// take no slot, so a pod with slow resolvers still gets them. A pod holds
// at most Limits.MaxTCPConns TCP connections, each with read, write and
// idle deadlines and at most Limits.MaxTCPQueries queries. Malformed
// messages are dropped, or answered FORMERR or NOTIMP, by the DNS library
// or the handler.
package dns
