package sidecar_test

import (
	"net/netip"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/canopy-mesh/canopy/controller/sidecar"
	"github.com/canopy-mesh/canopy/controller/sidecar/sidecartest"
)

// TestGeneratedBytesAreStable: the same mesh gives byte-identical
// resources every time it is built, so a change pushes only what it
// changed (a resource's version is a hash of its bytes). Maps inside
// packed Any fields once made most clusters and listeners differ on every
// rebuild, and every sidecar was sent everything on every change.
func TestGeneratedBytesAreStable(t *testing.T) {
	in := sidecartest.Mesh(50, 3)
	p := sidecar.Proxy{Namespace: "ns-0", IPs: []netip.Addr{netip.MustParseAddr("10.1.0.1")}}
	marshal := func(m *sidecar.Mesh, typ string) map[string]string {
		out := map[string]string{}
		for _, n := range m.GenerateSidecar(p, typ, []string{"8080"}) {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(n.Resource)
			if err != nil {
				t.Fatal(err)
			}
			out[n.Name] = string(b)
		}
		return out
	}
	for _, typ := range []string{sidecar.ClusterType, sidecar.ListenerType, sidecar.RouteType} {
		first := marshal(sidecar.NewMesh(in), typ)
		if len(first) == 0 {
			t.Fatalf("%s: nothing generated", typ)
		}
		for range 3 {
			again := marshal(sidecar.NewMesh(in), typ)
			for name, b := range first {
				if again[name] != b {
					t.Errorf("%s %s: different bytes from the same mesh", typ, name)
				}
			}
		}
	}
}
