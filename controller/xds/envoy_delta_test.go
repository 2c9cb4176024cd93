package xds_test

import (
	"strconv"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/canopy-mesh/canopy/controller/xds"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
)

// typeStatus returns proxyID's status for a type ("EDS").
func typeStatus(m *mesh, proxyID, typ string) (xds.TypeStatus, bool) {
	for _, ps := range m.server.Status() {
		if ps.ProxyID != proxyID {
			continue
		}
		for _, ts := range ps.Types {
			if ts.Type == typ {
				return ts, true
			}
		}
	}
	return xds.TypeStatus{}, false
}

// TestSidecarDelta: an Envoy sidecar over Delta ADS, by istiod's rules.
// Clusters and listeners are wildcard: no names or "*" subscribes to all
// of them. Endpoints and routes follow resource_names_subscribe and
// resource_names_unsubscribe, a name nothing answers comes back removed,
// and every response resends the whole set. An ACK, a stale nonce, a
// NACK (recorded as ERROR) and an unsubscription are not answered, nor
// is a type the server does not serve (the stream goes on). A change of
// the mesh pushes the types it changed, removed_resources naming an
// endpoint assignment that went away but not one unsubscribed from;
// system_version_info moves with the mesh, and nonces are never reused.
func TestSidecarDelta(t *testing.T) {
	fake := newFakeMesh()
	for _, r := range [][3]string{{cds, "c1", "v1"}, {cds, "c2", "v1"}, {eds, "e1", "v1"}, {eds, "e2", "v1"}, {lds, "l1", "v1"}, {rds, "r1", "v1"}, {rds, "r2", "v1"}} {
		fake.set(r[0], r[1], r[2])
	}
	m := startFakeMesh(t, xds.Config{}, fake)
	d := m.deltaStream(t)
	proxyID := "app-1." + m.ns
	const own = "sidecar 10.1.0.1 v1" // a wildcard type's tag for this proxy

	nonces := map[string]bool{}
	versions := map[string]bool{}
	expect := func(step string, want reply) *discoveryv3.DeltaDiscoveryResponse {
		t.Helper()
		r := d.recv()
		if diff := cmp.Diff(want, deltaReply(t, r)); diff != "" {
			t.Fatalf("%s (-want +got):\n%s", step, diff)
		}
		if nonces[r.GetNonce()] || r.GetNonce() == "" {
			t.Fatalf("%s: nonce %q empty or sent before", step, r.GetNonce())
		}
		nonces[r.GetNonce()] = true
		versions[r.GetSystemVersionInfo()] = true
		return r
	}

	d.send(&discoveryv3.DeltaDiscoveryRequest{Node: m.envoyNode(t, "sidecar", "app-1", "10.1.0.1", ""), TypeUrl: cds})
	c1 := expect("no names subscribes to every cluster", reply{Type: "CDS", Resources: res("c1", own, "c2", own)})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: lds, ResourceNamesSubscribe: []string{"*"}})
	expect(`"*" subscribes to every listener`, reply{Type: "LDS", Resources: res("l1", own)})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds, ResponseNonce: c1.GetNonce()})
	nothingFor(t, d, rds, "an ACK")

	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{"e1", "e2", "nope"}})
	e1 := expect("endpoints by name", reply{Type: "EDS", Resources: res("e1", "sidecar v1", "e2", "sidecar v1"), Removed: []string{"nope"}})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResponseNonce: e1.GetNonce()})
	nothingFor(t, d, rds, "an ACK of endpoints")
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResponseNonce: "999"})
	nothingFor(t, d, rds, "a stale nonce")
	if ts, _ := typeStatus(m, proxyID, "EDS"); ts.NonceAcked != e1.GetNonce() {
		t.Errorf("after a stale nonce EDS acked %q, want %q", ts.NonceAcked, e1.GetNonce())
	}
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResponseNonce: e1.GetNonce(), ErrorDetail: &statuspb.Status{Code: 3, Message: "endpoints rejected on purpose"}})
	nothingFor(t, d, rds, "a NACK")
	if ts, _ := typeStatus(m, proxyID, "EDS"); ts.Status != xds.Error || ts.NACK != "endpoints rejected on purpose" {
		t.Errorf("after a NACK EDS is %s %q, want ERROR with the message", ts.Status, ts.NACK)
	}
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesUnsubscribe: []string{"e2"}})
	nothingFor(t, d, rds, "an unsubscription")

	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: rds, ResourceNamesSubscribe: []string{"r1"}})
	expect("a route", reply{Type: "RDS", Resources: res("r1", "sidecar v1")})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: rds, ResourceNamesSubscribe: []string{"r2"}})
	expect("another route: the whole set", reply{Type: "RDS", Resources: res("r1", "sidecar v1", "r2", "sidecar v1")})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: rds, ResourceNamesUnsubscribe: []string{"r1"}})
	nothingFor(t, d, eds, "a route unsubscription")
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: "type.googleapis.com/istio.networking.nds.v1.NameTable"})
	nothingFor(t, d, eds, "a type not served")

	// e1 goes, e2 (unsubscribed) and r1 (unsubscribed) change, c3 comes;
	// listeners and the routes still watched are unchanged.
	fake.set(eds, "e1", "")
	fake.set(eds, "e2", "v2")
	fake.set(rds, "r1", "v2")
	fake.set(cds, "c3", "v1")
	m.meshChanged()
	p1 := expect("clusters pushed", reply{Type: "CDS", Resources: res("c1", own, "c2", own, "c3", own)})
	expect("an endpoint assignment removed", reply{Type: "EDS", Resources: res(), Removed: []string{"e1"}})
	nothingFor(t, d, eds, "unchanged listeners and routes")
	fake.set(cds, "c2", "")
	m.meshChanged()
	p2 := expect("a cluster removed", reply{Type: "CDS", Resources: res("c1", own, "c3", own), Removed: []string{"c2"}})

	v0, _ := strconv.ParseUint(c1.GetSystemVersionInfo(), 10, 64)
	v1, _ := strconv.ParseUint(p1.GetSystemVersionInfo(), 10, 64)
	v2, _ := strconv.ParseUint(p2.GetSystemVersionInfo(), 10, 64)
	if !(v0 < v1 && v1 < v2) {
		t.Errorf("system_version_info %q, %q, %q: want it to grow with each change of the mesh", c1.GetSystemVersionInfo(), p1.GetSystemVersionInfo(), p2.GetSystemVersionInfo())
	}
}

// TestSidecarDeltaWarming: a new listener watch makes the route watch
// answer its next request, even a same-nonce ACK (the warming rule);
// an answered cluster request is followed by the endpoints at once, which
// settles the cluster watch's warming of them.
func TestSidecarDeltaWarming(t *testing.T) {
	fake := newFakeMesh()
	for _, r := range [][3]string{{cds, "c1", "v1"}, {eds, "e1", "v1"}, {lds, "l1", "v1"}, {rds, "r1", "v1"}} {
		fake.set(r[0], r[1], r[2])
	}
	m := startFakeMesh(t, xds.Config{}, fake)
	d := m.deltaStream(t)
	expect := func(step string, want reply) *discoveryv3.DeltaDiscoveryResponse {
		t.Helper()
		r := d.recv()
		if diff := cmp.Diff(want, deltaReply(t, r)); diff != "" {
			t.Fatalf("%s (-want +got):\n%s", step, diff)
		}
		return r
	}
	// A reconnect's order: endpoints and routes before what needs them.
	d.send(&discoveryv3.DeltaDiscoveryRequest{Node: m.envoyNode(t, "sidecar", "app-1", "10.1.0.1", ""), TypeUrl: eds, ResourceNamesSubscribe: []string{"e1"}})
	expect("endpoints", reply{Type: "EDS", Resources: res("e1", "sidecar v1")})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: rds, ResourceNamesSubscribe: []string{"r1"}})
	r1 := expect("routes", reply{Type: "RDS", Resources: res("r1", "sidecar v1")})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: rds, ResponseNonce: r1.GetNonce()})
	nothingFor(t, d, eds, "an ACK of routes")

	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: lds})
	expect("listeners", reply{Type: "LDS", Resources: res("l1", "sidecar 10.1.0.1 v1")})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: rds, ResponseNonce: r1.GetNonce()})
	r2 := expect("the same ACK after a new listener watch", reply{Type: "RDS", Resources: res("r1", "sidecar v1")})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: rds, ResponseNonce: r2.GetNonce()})
	nothingFor(t, d, eds, "the ACK of the warming answer")

	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds})
	expect("clusters", reply{Type: "CDS", Resources: res("c1", "sidecar 10.1.0.1 v1")})
	e2 := expect("endpoints after clusters", reply{Type: "EDS", Resources: res("e1", "sidecar v1")})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResponseNonce: e2.GetNonce()})
	nothingFor(t, d, rds, "the ACK of the endpoints sent after clusters")
}

// TestSidecarDeltaReconnect: a reconnecting sidecar's
// initial_resource_versions spare it what it holds at the current
// version; what it holds and no longer exists is removed; what changed
// is sent.
func TestSidecarDeltaReconnect(t *testing.T) {
	fake := newFakeMesh()
	for _, r := range [][3]string{{cds, "c1", "v1"}, {cds, "c2", "v1"}, {eds, "e1", "v1"}, {eds, "e2", "v1"}} {
		fake.set(r[0], r[1], r[2])
	}
	m := startFakeMesh(t, xds.Config{}, fake)
	node := m.envoyNode(t, "sidecar", "app-1", "10.1.0.1", "")
	const own = "sidecar 10.1.0.1 "
	held := func(r *discoveryv3.DeltaDiscoveryResponse) map[string]string {
		out := map[string]string{}
		for _, res := range r.GetResources() {
			out[res.GetName()] = res.GetVersion()
		}
		return out
	}

	first := m.deltaStream(t)
	first.send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: cds})
	clusters := held(first.recv())
	first.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{"e1", "e2"}})
	endpoints := held(first.recv())
	first.close()

	observer := m.deltaStream(t)
	observer.send(&discoveryv3.DeltaDiscoveryRequest{Node: m.envoyNode(t, "sidecar", "observer", "10.1.0.2", ""), TypeUrl: eds, ResourceNamesSubscribe: []string{"e1"}})
	observer.recv()
	fake.set(cds, "c2", "")
	fake.set(cds, "c3", "v1")
	fake.set(eds, "e1", "v2")
	m.meshChanged()
	observer.recv() // the server has the new mesh

	clusters["gone"] = "0123"
	second := m.deltaStream(t)
	second.send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: cds, InitialResourceVersions: clusters})
	if diff := cmp.Diff(reply{Type: "CDS", Resources: res("c3", own+"v1"), Removed: []string{"c2", "gone"}}, deltaReply(t, second.recv())); diff != "" {
		t.Errorf("clusters after a reconnect (-want +got):\n%s", diff)
	}
	second.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{"e1", "e2"}, InitialResourceVersions: endpoints})
	if diff := cmp.Diff(reply{Type: "EDS", Resources: res("e1", "sidecar v2")}, deltaReply(t, second.recv())); diff != "" {
		t.Errorf("endpoints after a reconnect (-want +got):\n%s", diff)
	}
}

// TestProxylessDelta: a proxyless gRPC client over Delta ADS watches
// every type by name: no names and "*" subscribe to nothing; a change
// pushes only what it watches; an unsubscribed name is not pushed again.
func TestProxylessDelta(t *testing.T) {
	fake := newFakeMesh()
	for _, r := range [][3]string{{cds, "c1", "v1"}, {cds, "c3", "v1"}, {eds, "e1", "v1"}, {lds, "l1", "v1"}} {
		fake.set(r[0], r[1], r[2])
	}
	m := startFakeMesh(t, xds.Config{}, fake)
	d := m.deltaStream(t)
	expect := func(step string, want reply) {
		t.Helper()
		if diff := cmp.Diff(want, deltaReply(t, d.recv())); diff != "" {
			t.Fatalf("%s (-want +got):\n%s", step, diff)
		}
	}
	d.send(&discoveryv3.DeltaDiscoveryRequest{Node: m.envoyNode(t, "sidecar", "client", "10.1.0.9", "grpc"), TypeUrl: cds})
	expect("no names", reply{Type: "CDS", Resources: res()})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: lds, ResourceNamesSubscribe: []string{"*"}})
	expect(`"*"`, reply{Type: "LDS", Resources: res()})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds, ResourceNamesSubscribe: []string{"c1"}})
	expect("a cluster by name", reply{Type: "CDS", Resources: res("c1", "proxyless v1")})
	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{"e1"}})
	expect("endpoints by name", reply{Type: "EDS", Resources: res("e1", "proxyless v1")})

	fake.set(cds, "c1", "v2")
	fake.set(cds, "c2", "v1")
	m.meshChanged()
	expect("the watched cluster changed", reply{Type: "CDS", Resources: res("c1", "proxyless v2")})
	nothingFor(t, d, lds, "nothing else watched changed")

	d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds, ResourceNamesUnsubscribe: []string{"c1"}})
	nothingFor(t, d, lds, "an unsubscription")
	fake.set(cds, "c1", "v3")
	fake.set(eds, "e1", "v2")
	m.meshChanged()
	// Clusters come before endpoints in a push: none come.
	expect("only the endpoints", reply{Type: "EDS", Resources: res("e1", "proxyless v2")})
}

// TestProxylessNeverWildcard: whatever the variant, a proxyless client
// asking for clusters with no names gets none of them, now or when the
// mesh changes; over state of the world that is an unsubscription, and
// not answered.
func TestProxylessNeverWildcard(t *testing.T) {
	for _, tt := range []struct {
		name string
		run  func(t *testing.T, m *mesh, fake *fakeMesh) []reply
		want []reply
	}{
		{"state of the world", func(t *testing.T, m *mesh, fake *fakeMesh) []reply {
			s := m.sotwStream(t)
			s.send(&discoveryv3.DiscoveryRequest{Node: m.envoyNode(t, "sidecar", "client", "10.1.0.9", "grpc"), TypeUrl: cds})
			s.send(&discoveryv3.DiscoveryRequest{TypeUrl: lds, ResourceNames: []string{"l1"}})
			got := []reply{sotwReply(t, s.recv())}
			fake.set(cds, "c2", "v1")
			fake.set(lds, "l1", "v2")
			m.meshChanged()
			return append(got, sotwReply(t, s.recv()))
		}, []reply{
			{Type: "LDS", Resources: res("l1", "proxyless v1")},
			{Type: "LDS", Resources: res("l1", "proxyless v2")},
		}},
		{"Delta", func(t *testing.T, m *mesh, fake *fakeMesh) []reply {
			d := m.deltaStream(t)
			d.send(&discoveryv3.DeltaDiscoveryRequest{Node: m.envoyNode(t, "sidecar", "client", "10.1.0.9", "grpc"), TypeUrl: cds})
			d.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: lds, ResourceNamesSubscribe: []string{"l1"}})
			got := []reply{deltaReply(t, d.recv()), deltaReply(t, d.recv())}
			fake.set(cds, "c2", "v1")
			fake.set(lds, "l1", "v2")
			m.meshChanged()
			return append(got, deltaReply(t, d.recv()))
		}, []reply{
			{Type: "CDS", Resources: res()},
			{Type: "LDS", Resources: res("l1", "proxyless v1")},
			{Type: "LDS", Resources: res("l1", "proxyless v2")},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake := newFakeMesh()
			fake.set(cds, "c1", "v1")
			fake.set(lds, "l1", "v1")
			m := startFakeMesh(t, xds.Config{}, fake)
			if diff := cmp.Diff(tt.want, tt.run(t, m, fake)); diff != "" {
				t.Errorf("responses (-want +got):\n%s", diff)
			}
		})
	}
}

// eventuallySynced waits until proxyID has ACKed every type it watches.
func eventuallySynced(t *testing.T, m *mesh, proxyID string, types int) {
	t.Helper()
	eventually.Within(t, settle, proxyID+" synced", func() bool {
		for _, ps := range m.server.Status() {
			if ps.ProxyID != proxyID || len(ps.Types) != types {
				continue
			}
			for _, ts := range ps.Types {
				if ts.Status != xds.Synced {
					return false
				}
			}
			return true
		}
		return false
	})
}
