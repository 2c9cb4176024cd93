package workloadtable

import (
	"net/netip"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/canopy-mesh/canopy/workloadapi"
)

const vip = "10.96.0.10"

// svc is a service at vip; port tells versions of it apart.
func svc(ns, name, host string, port uint32, vis workloadapi.Service_Visibility) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
		Name: name, Namespace: ns, Hostname: host, Visibility: vis,
		Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr(vip).AsSlice()}},
		Ports:     []*workloadapi.Port{{ServicePort: port}},
	}}}
}

var (
	echo  = svc("shop", "echo", "echo.shop.svc.cluster.local", 80, workloadapi.Service_PUBLIC)
	grab  = svc("attacker", "grab", "grab.example.com", 80, workloadapi.Service_PUBLIC)
	grab2 = svc("attacker", "grab2", "grab2.example.com", 80, workloadapi.Service_PUBLIC)
)

const (
	echoKey  = "shop/echo.shop.svc.cluster.local"
	grabKey  = "attacker/grab.example.com"
	grab2Key = "attacker/grab2.example.com"
)

// vipStep is one response applied to the table, and what it must leave.
type vipStep struct {
	name   string
	put    []*workloadapi.Address
	remove []string
	// rejected are the names the response NACKs; holder is the service
	// key the VIP leads to afterwards ("" for none).
	rejected []string
	holder   string
}

func runVIPSteps(t *testing.T, steps []vipStep) {
	t.Helper()
	const at = workloadapi.AddressTypeURL
	tbl := New()
	for _, s := range steps {
		var rs []*discoveryv3.Resource
		for _, a := range s.put {
			rs = append(rs, resource(t, at, a))
		}
		var rejected []string
		for _, r := range tbl.Apply(at, rs, s.remove) {
			rejected = append(rejected, r.Name)
		}
		holder := ""
		if _, got := tbl.ByAddress("", netip.MustParseAddr(vip)); got != nil {
			holder = workloadapi.ServiceKey(got.GetNamespace(), got.GetHostname())
		}
		type result struct {
			Rejected []string
			Holder   string
		}
		want, got := result{s.rejected, s.holder}, result{rejected, holder}
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%s: (-want +got):\n%s", s.name, diff)
		}
	}
}

// TestVIPStaysWithItsFirstHolder: a later service claiming a VIP another
// service holds is rejected and does not take it; removing the holder
// hands the VIP to the claimant that waited, so it is never unmapped while
// a claimant remains.
func TestVIPStaysWithItsFirstHolder(t *testing.T) {
	t.Parallel()
	runVIPSteps(t, []vipStep{
		{name: "service takes its VIP", put: []*workloadapi.Address{echo}, holder: echoKey},
		{name: "a later claimant is rejected", put: []*workloadapi.Address{grab}, rejected: []string{grabKey}, holder: echoKey},
		{name: "the holder's update keeps the VIP", put: []*workloadapi.Address{svc("shop", "echo", "echo.shop.svc.cluster.local", 81, 0)}, holder: echoKey},
		{name: "the claimant's update is rejected again", put: []*workloadapi.Address{svc("attacker", "grab", "grab.example.com", 81, 0)}, rejected: []string{grabKey}, holder: echoKey},
		{name: "the claimant goes: nothing changes", remove: []string{grabKey}, holder: echoKey},
		{name: "it comes back, still rejected", put: []*workloadapi.Address{grab}, rejected: []string{grabKey}, holder: echoKey},
		{name: "the holder goes: the claimant gets the VIP", remove: []string{echoKey}, holder: grabKey},
		{name: "the claimant holds it now", put: []*workloadapi.Address{grab}, holder: grabKey},
		{name: "the last claimant goes: unmapped", remove: []string{grabKey}, holder: ""},
	})
}

// TestVIPHandedOverInOneResponse: the control plane moves a VIP from one
// service to another in one response; whatever the order inside it, the
// new holder is not rejected.
func TestVIPHandedOverInOneResponse(t *testing.T) {
	t.Parallel()
	noVIP := svc("attacker", "grab", "grab.example.com", 80, 0)
	noVIP.GetService().Addresses = nil
	for _, last := range []vipStep{
		{name: "holder removed, next one added", put: []*workloadapi.Address{grab2}, remove: []string{grabKey}, holder: grab2Key},
		{name: "next one added, then the holder without the VIP", put: []*workloadapi.Address{grab2, noVIP}, holder: grab2Key},
		{name: "holder without the VIP, then the next one", put: []*workloadapi.Address{noVIP, grab2}, holder: grab2Key},
	} {
		runVIPSteps(t, []vipStep{{name: "first holder", put: []*workloadapi.Address{grab}, holder: grabKey}, last})
	}
}

// TestVIPSharedByTheHostsOfOneObject: a ServiceEntry's hosts all carry
// its addresses; they do not contend with each other.
func TestVIPSharedByTheHostsOfOneObject(t *testing.T) {
	t.Parallel()
	other := svc("attacker", "grab", "other.example.com", 80, 0)
	runVIPSteps(t, []vipStep{
		{name: "two hosts of one ServiceEntry", put: []*workloadapi.Address{grab, other}, holder: grabKey},
		{name: "the first host goes", remove: []string{grabKey}, holder: "attacker/other.example.com"},
	})
}

// TestVIPVisibility: services visible only in their own namespaces share a
// VIP, each found only by its namespace's clients; a public service
// claiming it later contends with them; a workload at the address is found
// before any service, as ztunnel looks addresses up.
func TestVIPVisibility(t *testing.T) {
	t.Parallel()
	const at = workloadapi.AddressTypeURL
	const ns = workloadapi.Service_NAMESPACE
	tbl := New()
	teamA := svc("team-a", "github", "github.com", 443, ns)
	teamB := svc("team-b", "github", "github.com", 443, ns)
	everyone := svc("shared", "github", "github.com", 443, workloadapi.Service_PUBLIC)
	apply := func(as ...*workloadapi.Address) []string {
		var rs []*discoveryv3.Resource
		for _, a := range as {
			rs = append(rs, resource(t, at, a))
		}
		var names []string
		for _, r := range tbl.Apply(at, rs, nil) {
			names = append(names, r.Name)
		}
		return names
	}
	seen := func() map[string]string {
		out := map[string]string{}
		for _, client := range []string{"team-a", "team-b", "other", ""} {
			w, s := tbl.ByAddressFrom(client, "", netip.MustParseAddr(vip))
			switch {
			case w != nil:
				out[client] = w.GetUid()
			case s != nil:
				out[client] = workloadapi.ServiceKey(s.GetNamespace(), s.GetHostname())
			}
		}
		return out
	}
	check := func(step string, gotRejected, wantRejected []string, want map[string]string) {
		t.Helper()
		if diff := cmp.Diff(wantRejected, gotRejected, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: rejections (-want +got):\n%s", step, diff)
		}
		if diff := cmp.Diff(want, seen()); diff != "" {
			t.Errorf("%s: who sees what (-want +got):\n%s", step, diff)
		}
	}

	check("two namespaces share the VIP", apply(teamA, teamB), nil,
		map[string]string{"team-a": "team-a/github.com", "team-b": "team-b/github.com"})
	if _, s := tbl.ByAddress("", netip.MustParseAddr(vip)); s != nil {
		t.Errorf("ByAddress without a namespace found %v", s)
	}
	check("a public service claiming it later is rejected", apply(everyone), []string{"shared/github.com"},
		map[string]string{"team-a": "team-a/github.com", "team-b": "team-b/github.com"})
	tbl.Apply(at, nil, []string{"team-a/github.com", "team-b/github.com"})
	check("once they are gone it holds", nil, nil,
		map[string]string{"team-a": "shared/github.com", "team-b": "shared/github.com", "other": "shared/github.com", "": "shared/github.com"})
	pod := workload("pod-1", "n1", vip, 0)
	check("a workload at the address comes first", apply(pod), nil,
		map[string]string{"team-a": "pod-1", "team-b": "pod-1", "other": "pod-1", "": "pod-1"})
}
