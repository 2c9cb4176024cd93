package realnode

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/canopy-mesh/canopy/internal/testing/golden"
)

func testSpec() Spec {
	return Spec{
		Name:                "node-1",
		Dir:                 "/var/lib/canopy-local/demo/nodes/node-1/disk",
		Netns:               "/run/netns/demo-node-1",
		Cgroup:              "canopy-local-demo/node-1",
		IP:                  netip.MustParseAddr("10.99.0.11"),
		Labels:              map[string]string{"topology.kubernetes.io/zone": "zone-a", "topology.kubernetes.io/region": "local"},
		Taints:              []corev1.Taint{{Key: "cni.canopy.dev/not-ready", Effect: corev1.TaintEffectNoSchedule}},
		Registry:            "10.99.0.1:5000",
		SandboxImage:        "10.99.0.1:5000/pause:3.10.2",
		Nameserver:          netip.MustParseAddr("10.99.0.1"),
		ClusterDNS:          netip.MustParseAddr("10.96.0.10"),
		ClusterDomain:       "cluster.local",
		Kubeconfig:          "/var/lib/canopy-local/demo/nodes/node-1/kubeconfig",
		ClientCAFile:        "/var/lib/canopy-local/demo/control-plane/kubelet-client-ca.crt",
		RestrictOOMScoreAdj: true,
		Binaries: Binaries{
			Containerd: "/root/.cache/canopy/containerd/v2.4.2-x",
			Kubelet:    "/root/.cache/canopy/kube/v1.37.2-x/kubelet",
			Runc:       "/usr/sbin/runc",
			CNI:        "/root/.cache/canopy/cni/v1.10.0-x",
		},
	}
}

func TestNodeFiles(t *testing.T) {
	s := testSpec()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	containerd, err := s.ContainerdConfig()
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "containerd.toml", containerd)
	kubelet, err := s.KubeletConfig()
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "kubelet.yaml", kubelet)
	// Every field is one the kubelet knows: it refuses unknown ones.
	var typed kubeletv1beta1.KubeletConfiguration
	if err := yaml.UnmarshalStrict(kubelet, &typed); err != nil {
		t.Errorf("the kubelet config has a field the kubelet does not know: %v", err)
	}
	for dir, b := range s.HostsTOML() {
		golden.Check(t, "certs.d/"+dir+"/hosts.toml", b)
	}
	golden.Check(t, "resolv.conf", s.ResolvConf())
	golden.Check(t, "kubelet.args", []byte(strings.Join(s.KubeletArgs(), "\n")+"\n"))
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Spec)
		want string
	}{
		{"loopback nameserver", func(s *Spec) { s.Nameserver = netip.MustParseAddr("127.0.0.53") }, "loopback"},
		{"absolute cgroup", func(s *Spec) { s.Cgroup = "/canopy" }, "clean relative path"},
		{"cgroup escaping its root", func(s *Spec) { s.Cgroup = "../x" }, "clean relative path"},
		{"relative dir", func(s *Spec) { s.Dir = "nodes/node-1" }, "dir"},
		{"bad name", func(s *Spec) { s.Name = "Node_1" }, "DNS label"},
		{"no registry", func(s *Spec) { s.Registry = "" }, "registry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testSpec()
			tc.edit(&s)
			err := s.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestBinds(t *testing.T) {
	got := testSpec().Binds()
	if diff := cmp.Diff(Bind{Source: "/var/lib/canopy-local/demo/nodes/node-1/disk/var/lib/kubelet", Target: "/var/lib/kubelet"}, got[0]); diff != "" {
		t.Error(diff)
	}
	for _, b := range got {
		if !strings.HasSuffix(b.Source, b.Target) {
			t.Errorf("%s is bound from %s", b.Target, b.Source)
		}
	}
}
