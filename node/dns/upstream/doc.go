// Package upstream is the forwarding side of the node proxy's per-pod DNS
// proxy: names the proxy does not answer itself go to the pod's upstream
// resolvers through a Forwarder.
//
// The Forwarder relays the query and returns the upstream's answer as the
// upstream sent it, only the message ID set back to the client's. It never
// re-resolves a name into a new answer, which loses flags, the authority
// section and EDNS options and changed SRV answers under Istio's ambient
// DNS capture (istio#55490). Over UDP it reads answers as large as the
// query's EDNS size allows, at least 1232 bytes (a 512-byte buffer turned
// large answers into SERVFAIL in istio#61371), and asks again over TCP when
// an answer comes back truncated. A query that came over TCP goes over TCP.
//
// The upstreams are the pod's own: PodConfig reads the resolv.conf of a
// process in the pod's network namespace, so a pod's dnsConfig (its
// nameservers, search list, ndots) holds as it would without the proxy,
// where ztunnel uses its own file (ztunnel#555). The file is opened with
// openat2 confined to the process's root and refusing magic links, so a
// pod whose resolv.conf is a symlink to an absolute path, or through
// /proc, reads a file of its own root or nothing, never one of the node.
// Parse reads resolv.conf as glibc does, within glibc's limits.
//
// A Forwarder is safe for concurrent use. Only the node proxy imports this
// package.
package upstream
