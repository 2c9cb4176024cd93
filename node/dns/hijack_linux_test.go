package dns

import (
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/node/route"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// TestServiceEntryCannotHijackAServiceName is issue 33's finding 2 as the
// attack, through real pods: whoever may write ServiceEntries in
// namespace attacker declares host payments.prod.svc.cluster.local with
// an address of its own, backed by a workload of its own. A pod of each
// of four namespaces (aaa and zzz sort before and after the others) asks
// its node proxy's DNS server for the name and connects to the answer;
// every pod but attacker's must get the Service's VIP and be routed to
// the Service's pod. attacker's own pods get attacker's entry: an entry
// overrides a name for its own namespace, as ztunnel's lookup (the
// client's namespace first) does. Before the fix aaa and zzz got the
// attacker's address, and its workload.
func TestServiceEntryCannotHijackAServiceName(t *testing.T) {
	const host = "payments.prod.svc.cluster.local"
	namespaces := []string{"aaa", "attacker", "prod", "zzz"}
	ports := []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}
	vip := func(ip string) []*workloadapi.NetworkAddress {
		return []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr(ip).AsSlice()}}
	}
	endpoint := func(ns, name, ip string) *workloadapi.Address {
		return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
			Uid: name, Namespace: ns, Name: name, Addresses: [][]byte{netip.MustParseAddr(ip).AsSlice()},
			TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Status: workloadapi.WorkloadStatus_HEALTHY,
			Services: map[string]*workloadapi.PortList{ns + "/" + host: {Ports: ports}},
		}}}
	}
	addrs := []*workloadapi.Address{
		// The Kubernetes Service, canonical as the controller sends it.
		{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: "payments", Namespace: "prod", Hostname: host, Addresses: vip("10.96.0.80"), Ports: ports, Canonical: true,
		}}},
		endpoint("prod", "payments-0", "10.244.1.10"),
		// The attacker's ServiceEntry and its endpoint.
		{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: "grab", Namespace: "attacker", Hostname: host, Addresses: vip("240.240.6.6"), Ports: ports,
		}}},
		endpoint("attacker", "thief", "10.244.6.6"),
	}
	clients := map[string]*workloadapi.Workload{}
	for i, ns := range namespaces {
		w := &workloadapi.Workload{Uid: "client-" + ns, Namespace: ns, Name: "client", TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
			Addresses: [][]byte{netip.AddrFrom4([4]byte{10, 244, 9, byte(10 + i)}).AsSlice()}}
		clients[ns] = w
		addrs = append(addrs, &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}})
	}
	tbl := table(t, addrs...)
	s, err := New(Config{Table: tbl, Registerer: prometheus.NewRegistry(),
		Upstreams: func(*inpod.Pod) (Upstream, error) { return Upstream{}, fmt.Errorf("no resolvers in this test") }})
	if err != nil {
		t.Fatal(err)
	}

	got := map[string]string{}
	views := map[string]string{}
	for i, ns := range namespaces {
		pod := servePodIn(t, s, fmt.Sprintf("10.240.%d.0/24", i), clients[ns])
		r := pod.ask(t, &mdns.Client{Net: "udp", Timeout: 5 * time.Second}, query(host+".", mdns.TypeA))
		if r.Rcode != mdns.RcodeSuccess || len(r.Answer) != 1 {
			t.Errorf("%s: rcode %s, answers %q; want one A record", ns, mdns.RcodeToString[r.Rcode], answers(r))
			continue
		}
		a, ok := r.Answer[0].(*mdns.A)
		if !ok {
			t.Errorf("%s: answer %v is not an A record", ns, r.Answer[0])
			continue
		}
		ip, _ := netip.AddrFromSlice(a.A.To4())
		// The pod connects to what it was told: where does the node
		// proxy send it?
		rt, err := route.Decide(tbl, clients[ns], netip.AddrPortFrom(ip, 80), func(int) int { return 0 })
		if err != nil {
			t.Errorf("%s: route to %s: %v", ns, ip, err)
			continue
		}
		got[ns] = ip.String() + " -> " + rt.Workload.GetNamespace() + "/" + rt.Workload.GetName()
		v, _ := s.View(ns+"/client", tbl.Snapshot().Services)
		for _, n := range v.Names {
			if n.Name == host {
				views[ns] = n.Service
			}
		}
	}
	service, entry := "10.96.0.80 -> prod/payments-0", "240.240.6.6 -> attacker/thief"
	want := map[string]string{"aaa": service, "attacker": entry, "prod": service, "zzz": service}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the answer to %s and where a connection to it goes, by the pod's namespace (-want +got):\n%s", host, diff)
	}
	wantViews := map[string]string{"aaa": "prod/" + host, "attacker": "attacker/" + host, "prod": "prod/" + host, "zzz": "prod/" + host}
	if diff := cmp.Diff(wantViews, views); diff != "" {
		t.Errorf("the service each pod's DNS view shows for %s (-want +got):\n%s", host, diff)
	}
}

// servePodIn serves the DNS of a new pod (A of a pair on subnet, with the
// agent's capture rules) that is workload self, on s.
func servePodIn(t *testing.T, s *Server, subnet string, self *workloadapi.Workload) served {
	t.Helper()
	pair := nettest.NewPair(t, netip.MustParsePrefix(subnet))
	if err := (redirect.Nftables{}).Enroll(pair.A, redirect.DefaultPodConfig()); err != nil {
		t.Fatal(err)
	}
	ns, err := os.Open(pair.A)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := inpod.OpenWith(ns, inpod.Options{DNS: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	s.ServePod(pod, self)
	return served{pair: pair, resolver: pair.AddrB.String() + ":53", pod: pod, server: s}
}
