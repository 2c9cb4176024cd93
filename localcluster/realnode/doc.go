// Package realnode runs a real Kubernetes node on one Linux machine without
// a container engine: the kubelet and containerd (with Debian's runc) as
// root processes, isolated as kind isolates its node containers.
//
// A node is an init process (canopy-local node-init) that holds the node's
// namespaces: it is born in a mount and UTS namespace of its own, inside
// the node's network namespace, mounts the node's private paths over the
// standard ones (/var/lib/kubelet, /var/lib/containerd, /etc/cni/net.d,
// /opt/cni/bin, ... from a per-node directory on the host; a fresh tmpfs on
// /run and bpffs on /sys/fs/bpf, which a reboot loses as a real node does)
// and then waits. containerd and the kubelet are started inside those
// namespaces (nsenter) and in the node's own cgroup subtree, so that two
// kubelets never see each other's pods, containers, CNI configuration or
// pinned eBPF objects, while hostPath volumes resolve to the node's copy.
//
// The pure part (the files a node reads: containerd's config.toml, the
// KubeletConfiguration, hosts.toml for the local registry, resolv.conf)
// is rendered from a Spec and golden-tested; the rest is I/O.
package realnode
