package localcluster

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// TestResolveIn: a node's /var/run is a link to /run, which the kernel,
// asked for /proc/<init>/root/var/run, follows to the host's /run.
func TestResolveIn(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"run/canopy", "etc/alt", "usr/lib"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{"var/run": "/run", "lib": "usr/lib", "etc/loop": "/etc/loop", "etc/up": "../run"}
	if err := os.MkdirAll(filepath.Join(root, "var"), 0o755); err != nil {
		t.Fatal(err)
	}
	for l, target := range links {
		if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"/var/run/canopy/pods/x.json", "/run/canopy/pods/x.json"},
		{"/lib/xtables", "/usr/lib/xtables"},
		{"/etc/up/canopy", "/run/canopy"},
		{"/etc/cni/net.d", "/etc/cni/net.d"},
		{"/", "/"},
	} {
		got, err := resolveIn(root, tc.in)
		if err != nil {
			t.Errorf("resolveIn(%s): %v", tc.in, err)
			continue
		}
		if want := filepath.Join(root, tc.want); got != want {
			t.Errorf("resolveIn(%s) = %s, want %s", tc.in, got, want)
		}
	}
	if _, err := resolveIn(root, "/etc/loop/x"); err == nil {
		t.Error("a link to itself resolved")
	}
}

// TestPrimaryCNIConfig: the primary CNI's configuration parses as libcni
// parses it for the runtime, ptp with host-local over the node's pod CIDR,
// its IPAM state where asked.
func TestPrimaryCNIConfig(t *testing.T) {
	for _, dataDir := range []string{"", "/state/node-1/cni/ipam"} {
		b, err := primaryCNIConfig("10.244.1.0/24", dataDir)
		if err != nil {
			t.Fatal(err)
		}
		list, err := libcni.NetworkConfFromBytes(b)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "ptp" || list.Plugins[0].Network.IPAM.Type != "host-local" {
			t.Fatalf("plugins of %s", b)
		}
		var ptp struct {
			IPAM struct {
				Ranges  [][]struct{ Subnet string } `json:"ranges"`
				DataDir string                      `json:"dataDir"`
			} `json:"ipam"`
		}
		if err := json.Unmarshal(list.Plugins[0].Bytes, &ptp); err != nil {
			t.Fatal(err)
		}
		if len(ptp.IPAM.Ranges) != 1 || ptp.IPAM.Ranges[0][0].Subnet != "10.244.1.0/24" || ptp.IPAM.DataDir != dataDir {
			t.Errorf("ipam of %s", b)
		}
	}
}
