package e2e_test

import (
	"os"
	"testing"

	"github.com/canopy-mesh/canopy/internal/sockmap"
)

// testBackend: the demo's pods are redirected by the configured backend.
// With ebpf, each has its programs pinned on the node's BPF filesystem and
// every slot of its socket map holds a socket of the node proxy (the
// traffic of an empty one would be dropped); with a netfilter backend, no
// pod has pins.
func testBackend(t *testing.T, m *mesh) {
	for _, p := range m.pods(t, "demo", "") {
		if p.Annotations["ambient.istio.io/redirection"] != "enabled" {
			t.Fatalf("%s is not enrolled", p.Name)
		}
		nsPath, err := m.local.PodNetns(&p)
		if err != nil {
			t.Fatal(err)
		}
		ns, err := os.Open(nsPath)
		if err != nil {
			t.Fatal(err)
		}
		// Pinned on the pod's node's own BPF file system.
		root, err := m.local.NodePath(p.Spec.NodeName, sockmap.DefaultRoot)
		if err != nil {
			t.Fatal(err)
		}
		sm, err := sockmap.Open(root, ns)
		ns.Close()
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		if sm == nil {
			if m.backend == "ebpf" {
				t.Errorf("%s: no socket map pinned under %s", p.Name, sockmap.DefaultRoot)
			}
			continue
		}
		func() {
			defer sm.Close()
			if m.backend != "ebpf" {
				t.Errorf("%s: a socket map is pinned with the %s backend", p.Name, m.backend)
			}
			for s := range sockmap.Slot(sockmap.Slots) {
				if _, ok, err := sockmap.Cookie(sm, s); err != nil || !ok {
					t.Errorf("%s: %s slot empty (%v): the node proxy did not register its socket", p.Name, s, err)
				}
			}
		}()
	}
}
