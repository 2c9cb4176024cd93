package kubelet

import "testing"

func TestHostPathMapping(t *testing.T) {
	t.Parallel()
	cfg := Config{
		StateDir:  "/state/node-1",
		HostPaths: map[string]string{"/etc/cni/net.d": "/state/node-1/cni/net.d", "/etc/cni": "/state/node-1/etc-cni", "/opt/cni/bin": "/state/node-1/cni/bin"},
	}
	for _, tt := range []struct{ in, want string }{
		{"/etc/cni/net.d", "/state/node-1/cni/net.d"},
		{"/etc/cni/net.d/10-x.conflist", "/state/node-1/cni/net.d/10-x.conflist"},
		{"/etc/cni/other", "/state/node-1/etc-cni/other"},
		{"/opt/cni/bin/", "/state/node-1/cni/bin"},
		{"/opt/cni/binary", "/state/node-1/root/opt/cni/binary"},
		{"/run/netns", "/run/netns"},
		{"/var/run/netns/cpod-x", "/var/run/netns/cpod-x"},
		{"/proc", "/proc"},
		{"/var/run/ztunnel", "/state/node-1/root/var/run/ztunnel"},
		{"/", "/state/node-1/root"},
	} {
		if got := cfg.hostPath(tt.in); got != tt.want {
			t.Errorf("hostPath(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
