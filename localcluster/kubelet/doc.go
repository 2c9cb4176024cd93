// Package kubelet is the local cluster's kubelet stand-in: a
// virtual-kubelet provider that runs pods on this machine the way a
// container runtime would, without containers.
//
// For each pod bound to its node it creates a network namespace, runs the
// node's CNI chain through libcni (as a CRI runtime does), prepares the
// pod's volumes, resolv.conf and hosts files, and starts each container's
// image as a local program (through an image table) in the pod's network
// namespace, a mount namespace of its own and the pod's cgroup
// (.../kubepods/pod<uid>, as a kubelet names it). It reports status
// (phase, IPs, container states, readiness from probes), runs HTTP and TCP
// probes from the node's network namespace, restarts containers by restart
// policy with backoff, and on delete stops the processes, runs CNI DEL and
// removes the namespace and the cgroup.
//
// The Provider is safe for concurrent use; virtual-kubelet calls it from
// several workers.
package kubelet
