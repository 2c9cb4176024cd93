package index

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
)

// entryAt is a ServiceEntry of ns claiming address, created at unix time
// created.
func entryAt(ns, name, address string, created int64, exportTo ...string) *networkingv1.ServiceEntry {
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, CreationTimestamp: metav1.Unix(created, 0)}}
	se.Spec.Hosts = []string{name + ".example.com"}
	se.Spec.Addresses = []string{address}
	se.Spec.Ports = []*networkingapi.ServicePort{{Number: 80, Name: "tcp"}}
	se.Spec.ExportTo = exportTo
	return se
}

// vips lists the addresses a published Service carries.
func vips(x *Index, name string) []string {
	var out []string
	for _, a := range x.Address(name).GetService().GetAddresses() {
		ip, _ := netip.AddrFromSlice(a.GetAddress())
		out = append(out, ip.String())
	}
	return out
}

// TestIndexVIPOwners: a Kubernetes Service keeps its cluster IP from any
// ServiceEntry, the oldest ServiceEntry keeps an address from newer ones,
// losers are published without the address and reported, and removing
// the holder hands the address over in the same change set.
func TestIndexVIPOwners(t *testing.T) {
	x := New(ambient.Config{})
	const (
		clusterIP = "10.96.0.50"
		grab      = "attacker/grab.example.com"
		grab2     = "other/grab2.example.com"
	)
	echo := service("echo", nil)
	echo.CreationTimestamp = metav1.Unix(300, 0)
	check(t, "service", x.UpsertService(echo), addr([]string{svc}, nil, nil))
	check(t, "an older entry claims the cluster IP", x.UpsertServiceEntry(entryAt("attacker", "grab", clusterIP, 100)), addr([]string{grab}, nil, nil))
	check(t, "a newer entry claims it too", x.UpsertServiceEntry(entryAt("other", "grab2", clusterIP, 200)), addr([]string{grab2}, nil, nil))

	type state struct {
		Echo, Grab, Grab2         []string
		GrabProblem, Grab2Problem string
		EchoProblem               string
	}
	problemOf := func(owner string) string {
		p := x.Problems()[owner]
		if _, who, ok := strings.Cut(p, " is owned by "); ok {
			who, _, _ = strings.Cut(who, ";")
			return who
		}
		return p
	}
	expect := func(step string, want state) {
		t.Helper()
		got := state{vips(x, svc), vips(x, grab), vips(x, grab2),
			problemOf("ServiceEntry attacker/grab"), problemOf("ServiceEntry other/grab2"), problemOf("Service shop/echo")}
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: (-want +got):\n%s", step, diff)
		}
	}
	expect("the Service keeps its cluster IP", state{Echo: []string{clusterIP}, GrabProblem: "Service shop/echo", Grab2Problem: "Service shop/echo"})
	if p := x.Problems()["ServiceEntry attacker/grab"]; p != "address 10.96.0.50 is owned by Service shop/echo; this ServiceEntry is sent without it" {
		t.Errorf("problem = %q", p)
	}

	check(t, "the service goes: the oldest entry takes the address at once", x.DeleteService("shop", "echo"), addr(nil, []string{grab}, []string{svc}))
	expect("the oldest entry holds", state{Grab: []string{clusterIP}, Grab2Problem: "ServiceEntry attacker/grab"})

	check(t, "the service comes back and takes it back", x.UpsertService(echo), addr([]string{svc}, []string{grab}, nil))
	expect("the Service holds again", state{Echo: []string{clusterIP}, GrabProblem: "Service shop/echo", Grab2Problem: "Service shop/echo"})

	check(t, "a loser goes: nothing else changes", x.DeleteServiceEntry("attacker", "grab"), addr(nil, nil, []string{grab}))
	expect("after the loser went", state{Echo: []string{clusterIP}, Grab2Problem: "Service shop/echo"})

	check(t, "the service goes: the remaining entry takes it", x.DeleteService("shop", "echo"), addr(nil, []string{grab2}, []string{svc}))
	expect("the last claimant holds", state{Grab2: []string{clusterIP}})
}

// TestIndexVIPSharedAcrossNamespaces: entries visible only in their own
// namespaces may share an address; one visible everywhere contends with
// them.
func TestIndexVIPSharedAcrossNamespaces(t *testing.T) {
	x := New(ambient.Config{})
	const ip = "240.0.0.1"
	x.UpsertServiceEntry(entryAt("team-a", "github", ip, 100, "."))
	x.UpsertServiceEntry(entryAt("team-b", "github", ip, 200, "."))
	if a, b := vips(x, "team-a/github.example.com"), vips(x, "team-b/github.example.com"); len(a) != 1 || len(b) != 1 {
		t.Errorf("namespace-visible entries: team-a %v, team-b %v; want both with %s", a, b, ip)
	}
	x.UpsertServiceEntry(entryAt("shared", "github-all", ip, 300))
	if got := vips(x, "shared/github-all.example.com"); len(got) != 0 {
		t.Errorf("a newer public entry got %v", got)
	}
	if p := x.Problems()["ServiceEntry shared/github-all"]; !strings.Contains(p, "owned by ServiceEntry team-a/github") {
		t.Errorf("problem = %q, want the oldest holder named", p)
	}
}

// TestIndexServiceNameLosersAreReported: an object whose host is served
// by another object is told so.
func TestIndexServiceNameLosersAreReported(t *testing.T) {
	x := New(ambient.Config{})
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "shadow", Namespace: "shop"}}
	se.Spec.Hosts = []string{"echo.shop.svc.cluster.local"}
	x.UpsertService(service("echo", nil))
	x.UpsertServiceEntry(se)
	want := "host echo.shop.svc.cluster.local in namespace shop is served by Service shop/echo; this ServiceEntry's is not sent"
	if p := x.Problems()["ServiceEntry shop/shadow"]; p != want {
		t.Errorf("problem = %q, want %q", p, want)
	}
	x.DeleteService("shop", "echo")
	if p := x.Problems()["ServiceEntry shop/shadow"]; p != "" {
		t.Errorf("problem = %q once the entry won, want none", p)
	}
}

// TestIndexExportToWarning: an exportTo the node proxies cannot honour
// exactly is reported.
func TestIndexExportToWarning(t *testing.T) {
	x := New(ambient.Config{})
	x.UpsertServiceEntry(entryAt("shop", "pay", "240.0.0.2", 100, ".", "front"))
	if p := x.Problems()["ServiceEntry shop/pay"]; !strings.Contains(p, "exportTo names namespaces front") {
		t.Errorf("problem = %q", p)
	}
}
