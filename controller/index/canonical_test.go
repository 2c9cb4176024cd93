package index

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
)

// TestIndexCanonicalService: of the services that share a hostname across
// namespaces, one is canonical, as istiod's selectWorkloadServices
// (pilot/pkg/serviceregistry/ambient/services.go) marks it: a Kubernetes
// Service, else the oldest ServiceEntry not visible only in its own
// namespace. The mark moves when that one goes.
func TestIndexCanonicalService(t *testing.T) {
	x := New(ambient.Config{})
	entry := func(ns string, created int64, exportTo ...string) *networkingv1.ServiceEntry {
		se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns, CreationTimestamp: metav1.Unix(created, 0)}}
		se.Spec.Hosts = []string{"api.example.com"}
		se.Spec.Ports = []*networkingapi.ServicePort{{Number: 443, Name: "https", Protocol: "TLS"}}
		se.Spec.Resolution = networkingapi.ServiceEntry_DNS
		se.Spec.ExportTo = exportTo
		return se
	}
	const (
		a       = "a/api.example.com"
		b       = "b/api.example.com"
		c       = "c/api.example.com"
		implA   = "Kubernetes/networking.istio.io/ServiceEntry/a/api/api.example.com"
		implB   = "Kubernetes/networking.istio.io/ServiceEntry/b/api/api.example.com"
		implC   = "Kubernetes/networking.istio.io/ServiceEntry/c/api/api.example.com"
		echoSvc = "shop/echo.shop.svc.cluster.local"
		echoSE  = "other/echo.shop.svc.cluster.local"
	)
	canonical := func() map[string]bool {
		out := map[string]bool{}
		for _, n := range []string{a, b, c} {
			if s := x.Address(n).GetService(); s != nil {
				out[n] = s.GetCanonical()
			}
		}
		return out
	}
	want := func(step string, w map[string]bool) {
		t.Helper()
		if diff := cmp.Diff(w, canonical()); diff != "" {
			t.Errorf("%s: canonical (-want +got):\n%s", step, diff)
		}
	}

	check(t, "an entry", x.UpsertServiceEntry(entry("b", 200)), addr([]string{b, implB}, nil, nil))
	want("a lone entry is canonical", map[string]bool{b: true})
	check(t, "a newer entry", x.UpsertServiceEntry(entry("c", 300)), addr([]string{c, implC}, nil, nil))
	want("the older stays canonical", map[string]bool{b: true, c: false})
	check(t, "an older entry visible only in its namespace", x.UpsertServiceEntry(entry("a", 100, ".")), addr([]string{a, implA}, nil, nil))
	want("namespace-visible entries are never canonical", map[string]bool{a: false, b: true, c: false})
	check(t, "it becomes public", x.UpsertServiceEntry(entry("a", 100)), addr(nil, []string{a, b}, nil))
	want("the oldest public entry", map[string]bool{a: true, b: false, c: false})
	check(t, "the canonical entry goes", x.DeleteServiceEntry("a", "api"), addr(nil, []string{b}, []string{a, implA}))
	want("the next oldest takes over", map[string]bool{b: true, c: false})

	// A ServiceEntry of another namespace naming a Kubernetes Service's host.
	x.UpsertService(service("echo", nil))
	se := entry("other", 1)
	se.Spec.Hosts = []string{"echo.shop.svc.cluster.local"}
	x.UpsertServiceEntry(se)
	if !x.Address(echoSvc).GetService().GetCanonical() || x.Address(echoSE).GetService().GetCanonical() {
		t.Errorf("canonical: Service %v, ServiceEntry %v; want the Service only",
			x.Address(echoSvc).GetService().GetCanonical(), x.Address(echoSE).GetService().GetCanonical())
	}
	x.DeleteService("shop", "echo")
	if x.Address(echoSE).GetService().GetCanonical() {
		t.Error("a ServiceEntry copying shop's Service name is canonical once the Service is gone")
	}
}

// TestIndexServiceEntryCopyingAServiceName is issue 33's finding 2 as the
// attack, at the controller: whoever may write ServiceEntries in namespace
// attacker declares host payments.prod.svc.cluster.local, with an address
// of its own, older than the Service. The Service stays the canonical one
// (node proxies answer every other namespace with it), the copy is never
// canonical, before, with or after the Service, and the copy's
// ServiceEntry gets a Warning naming the Service, which follows the
// Service's comings and goings. prod's own ServiceEntry of a name of
// prod's is a normal one.
func TestIndexServiceEntryCopyingAServiceName(t *testing.T) {
	x := New(ambient.Config{})
	const (
		host    = "payments.prod.svc.cluster.local"
		svcName = "prod/" + host
		copyOf  = "attacker/" + host
		problem = "ServiceEntry attacker/grab"
	)
	grab := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "grab", Namespace: "attacker", CreationTimestamp: metav1.Unix(1, 0)}}
	grab.Spec.Hosts = []string{host}
	grab.Spec.Addresses = []string{"240.240.6.6"}
	grab.Spec.Ports = []*networkingapi.ServicePort{{Number: 80, Name: "http", Protocol: "HTTP"}}
	grab.Spec.Resolution = networkingapi.ServiceEntry_STATIC
	grab.Spec.Endpoints = []*networkingapi.WorkloadEntry{{Address: "10.244.6.6"}}
	payments := service("payments", map[string]string{"app": "payments"})
	payments.Namespace, payments.CreationTimestamp = "prod", metav1.Unix(100, 0)

	type state struct {
		ServiceCanonical, CopyCanonical bool
		CopySent                        bool
		Warning                         string
	}
	now := func() state {
		return state{
			ServiceCanonical: x.Address(svcName).GetService().GetCanonical(),
			CopyCanonical:    x.Address(copyOf).GetService().GetCanonical(),
			CopySent:         x.Address(copyOf).GetService() != nil,
			Warning:          x.Problems()[problem],
		}
	}
	alone := "host " + host + " is another namespace's Service name: node proxies answer it with this ServiceEntry only to pods of namespace attacker, and it is never canonical"
	shadowing := "host " + host + " is the name of Service prod/payments: every namespace but attacker gets the Service, and this ServiceEntry is never canonical"
	for _, step := range []struct {
		name string
		do   func()
		want state
	}{
		{"the copy alone", func() { x.UpsertServiceEntry(grab) }, state{CopySent: true, Warning: alone}},
		{"the Service comes", func() { x.UpsertService(payments) }, state{ServiceCanonical: true, CopySent: true, Warning: shadowing}},
		{"the copy is updated", func() { x.UpsertServiceEntry(grab.DeepCopy()) }, state{ServiceCanonical: true, CopySent: true, Warning: shadowing}},
		{"the Service goes", func() { x.DeleteService("prod", "payments") }, state{CopySent: true, Warning: alone}},
		{"the Service again", func() { x.UpsertService(payments) }, state{ServiceCanonical: true, CopySent: true, Warning: shadowing}},
		{"the copy goes", func() { x.DeleteServiceEntry("attacker", "grab") }, state{ServiceCanonical: true}},
	} {
		step.do()
		if diff := cmp.Diff(step.want, now()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", step.name, diff)
		}
	}

	// prod's own ServiceEntry under prod's names is canonical as any
	// other, and nothing is reported.
	own := grab.DeepCopy()
	own.Namespace, own.Name = "prod", "legacy"
	own.Spec.Hosts = []string{"legacy.prod.svc.cluster.local"}
	x.UpsertServiceEntry(own)
	if !x.Address("prod/legacy.prod.svc.cluster.local").GetService().GetCanonical() {
		t.Error("prod's own ServiceEntry of a prod name is not canonical")
	}
	if msg, ok := x.Problems()["ServiceEntry prod/legacy"]; ok {
		t.Errorf("prod's own ServiceEntry reported: %s", msg)
	}
}
