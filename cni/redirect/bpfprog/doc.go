// Package bpfprog holds the eBPF programs and maps of the CNI agent's eBPF
// redirection backend, and nothing else: loading them per pod, attaching,
// pinning and verifying are not part of it.
//
// The design keeps every hook inside the pod's network namespace, so it
// does not collide with the primary CNI's programs in the node namespace:
//
//   - sk_lookup (SkLookupSpec) steers the app's outbound TCP, which policy
//     routing turns into a local delivery, to the node proxy's 15001
//     listener, and DNS on port 53 to its 15053 sockets. sk_lookup sees no
//     packet mark, so it must leave the pod's own addresses alone: those are
//     the proxy's connections to the app.
//   - tcx ingress (InboundSpec) on the pod's interfaces assigns new inbound
//     TCP connections to the 15006 listener. Only traffic that really came
//     from outside the pod reaches it; the proxy's own connections to the
//     app go over lo.
//
// Nothing is NATed: the proxy learns the original destination from
// getsockname() on the accepted socket.
//
// The programs are written with the asm package rather than C so that
// building Canopy needs no clang and the bytecode is reviewable Go. They
// read only UAPI context structs and packet bytes at fixed offsets, so they
// need no BTF.
//
// The sockets in the socks SOCKMAP, at the Slot* keys, are the node
// proxy's listeners; an empty slot makes the programs drop (fail closed)
// rather than let the traffic bypass the proxy.
package bpfprog
