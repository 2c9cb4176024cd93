package workloadtable

import (
	"net/netip"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

func resource(t *testing.T, typeURL string, m proto.Message) *discoveryv3.Resource {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	name := ""
	switch m := m.(type) {
	case *workloadapi.Address:
		name = workloadapi.ResourceName(m)
	case *security.Authorization:
		name = security.ResourceName(m)
	}
	return &discoveryv3.Resource{Name: name, Resource: &anypb.Any{TypeUrl: typeURL, Value: b}}
}

func workload(uid, node, ip string, mode workloadapi.NetworkMode) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: uid, Node: node, Addresses: [][]byte{netip.MustParseAddr(ip).AsSlice()}, NetworkMode: mode,
	}}}
}

func TestApply(t *testing.T) {
	t.Parallel()
	const at = workloadapi.AddressTypeURL
	tbl := New()
	echo := &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
		Namespace: "default", Hostname: "echo.default.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr("10.96.0.20").AsSlice()}},
	}}}
	bad := &discoveryv3.Resource{Name: "x", Resource: &anypb.Any{TypeUrl: at, Value: []byte{0xff}}}
	misnamed := resource(t, at, workload("u9", "", "10.0.0.9", 0))
	misnamed.Name = "other"
	rej := tbl.Apply(at, []*discoveryv3.Resource{
		resource(t, at, workload("u1", "node-1", "10.244.1.5", 0)),
		resource(t, at, workload("u2", "node-1", "10.99.0.11", workloadapi.NetworkMode_HOST_NETWORK)),
		resource(t, at, echo),
		bad, misnamed,
	}, nil)
	if len(rej) != 2 || !strings.Contains(JoinRejections(rej), "x: decode") || !strings.Contains(JoinRejections(rej), `other: address is named "u9"`) {
		t.Errorf("rejections = %q, want the undecodable and the misnamed one", JoinRejections(rej))
	}
	if w, _ := tbl.ByAddress("", netip.MustParseAddr("10.244.1.5")); w.GetUid() != "u1" {
		t.Errorf("ByAddress(10.244.1.5) = %v, want u1", w)
	}
	if w, s := tbl.ByAddress("", netip.MustParseAddr("10.99.0.11")); w != nil || s != nil {
		t.Error("a host-network workload is indexed by IP")
	}
	if _, s := tbl.ByAddress("", netip.MustParseAddr("10.96.0.20")); s.GetHostname() != "echo.default.svc.cluster.local" {
		t.Errorf("ByAddress(VIP) = %v, want echo", s)
	}
	if got := len(tbl.NodeWorkloads("node-1")); got != 2 {
		t.Errorf("NodeWorkloads(node-1) = %d workloads, want 2", got)
	}

	// u1 moves: the old IP and node no longer find it.
	tbl.Apply(at, []*discoveryv3.Resource{resource(t, at, workload("u1", "node-2", "10.244.2.5", 0))}, nil)
	if w, _ := tbl.ByAddress("", netip.MustParseAddr("10.244.1.5")); w != nil {
		t.Error("old IP still finds the replaced workload")
	}
	if !tbl.Has("/10.244.2.5") || len(tbl.NodeWorkloads("node-1")) != 1 {
		t.Error("replaced workload not indexed under its new IP and node")
	}

	// Removals: a UID, a service key, an unknown name.
	tbl.Apply(at, nil, []string{"u1", "default/echo.default.svc.cluster.local", "nope", "a/b/c"})
	got := tbl.Snapshot()
	if len(got.Workloads) != 1 || got.Workloads[0].GetUid() != "u2" || len(got.Services) != 0 || tbl.Has("/10.96.0.20") {
		t.Errorf("after removals: %v", got)
	}

	const pt = workloadapi.AuthorizationTypeURL
	p := &security.Authorization{Name: "allow", Namespace: "default"}
	if rej := tbl.Apply(pt, []*discoveryv3.Resource{resource(t, pt, p)}, nil); rej != nil {
		t.Fatal(rej)
	}
	if diff := cmp.Diff("allow", tbl.Policy("default/allow").GetName()); diff != "" {
		t.Error(diff)
	}
	tbl.Apply(pt, nil, []string{"default/allow"})
	if tbl.Has("default/allow") {
		t.Error("removed policy still held")
	}
}

// FuzzApply feeds arbitrary resource bytes and removals: never a panic, a
// rejection names its resource, and what is accepted can be found.
func FuzzApply(f *testing.F) {
	w, _ := proto.Marshal(workload("u1", "n", "10.0.0.1", 0))
	f.Add(w, "u1", "u1")
	f.Add([]byte{0x12, 0x03, 0x0a, 0x01, 0x61}, "x", "default/x")
	f.Fuzz(func(t *testing.T, body []byte, name, removed string) {
		tbl := New()
		rs := []*discoveryv3.Resource{{Name: name, Resource: &anypb.Any{TypeUrl: workloadapi.AddressTypeURL, Value: body}}}
		rej := tbl.Apply(workloadapi.AddressTypeURL, rs, nil)
		if len(rej) > 1 || (len(rej) == 1 && rej[0].Name != name) {
			t.Fatalf("rejections %v for one resource %q", rej, name)
		}
		if len(rej) == 0 && !tbl.Has(name) {
			t.Fatalf("accepted %q but cannot find it", name)
		}
		tbl.Apply(workloadapi.AddressTypeURL, nil, []string{removed})
		if removed == name && tbl.Has(name) && tbl.Workload(name) != nil {
			t.Fatalf("removed workload %q still held", name)
		}
	})
}

func TestChangedIsClosedByAnApply(t *testing.T) {
	tbl := New()
	ch := tbl.Changed()
	tbl.Apply(workloadapi.AuthorizationTypeURL, nil, nil)
	select {
	case <-ch:
		t.Fatal("an empty Apply closed Changed")
	default:
	}
	tbl.Apply(workloadapi.AuthorizationTypeURL, nil, []string{"apps/gone"})
	select {
	case <-ch:
	default:
		t.Fatal("a removal did not close Changed")
	}
	if next := tbl.Changed(); next == ch {
		t.Error("Changed returned the closed channel again")
	}
}

// TestByHostname: services are found by hostname, whatever its case, in
// every namespace that has one, and leave the index when removed or
// renamed.
func TestByHostname(t *testing.T) {
	t.Parallel()
	const at = workloadapi.AddressTypeURL
	svc := func(ns, host string) *workloadapi.Address {
		return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{Namespace: ns, Hostname: host}}}
	}
	keys := func(ss []*workloadapi.Service) []string {
		var out []string
		for _, s := range ss {
			out = append(out, s.GetNamespace()+"/"+s.GetHostname())
		}
		return out
	}
	tbl := New()
	tbl.Apply(at, []*discoveryv3.Resource{
		resource(t, at, svc("b", "api.example.com")),
		resource(t, at, svc("a", "api.example.com")),
		resource(t, at, svc("a", "echo.a.svc.cluster.local")),
	}, nil)
	if diff := cmp.Diff([]string{"a/api.example.com", "b/api.example.com"}, keys(tbl.ByHostname("API.Example.com"))); diff != "" {
		t.Errorf("ByHostname (-want +got):\n%s", diff)
	}
	tbl.Apply(at, nil, []string{"b/api.example.com"})
	if diff := cmp.Diff([]string{"a/api.example.com"}, keys(tbl.ByHostname("api.example.com"))); diff != "" {
		t.Errorf("after a removal (-want +got):\n%s", diff)
	}
	tbl.Apply(at, nil, []string{"a/api.example.com", "a/echo.a.svc.cluster.local"})
	if got := tbl.ByHostname("api.example.com"); got != nil {
		t.Errorf("removed services still found: %v", keys(got))
	}
	if len(tbl.byHostname) != 0 {
		t.Errorf("index keeps %d hostnames after every service left", len(tbl.byHostname))
	}
}
