package workloadapi

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWorkloadUIDBuilders(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		got  string
		want string
	}{
		{"pod", PodUID("Kubernetes", "default", "foo-abc"), "Kubernetes//Pod/default/foo-abc"},
		{"workload entry", WorkloadEntryUID("Kubernetes", "vm", "db-1"), "Kubernetes/networking.istio.io/WorkloadEntry/vm/db-1"},
		{"service entry", ServiceEntryUID("c1", "ns", "ext", "10.0.0.1"), "c1/networking.istio.io/ServiceEntry/ns/ext/10.0.0.1"},
		{"endpoint slice", EndpointSliceUID("c1", "ns", "svc-x7k", "10.0.0.9"), "c1/discovery.k8s.io/EndpointSlice/ns/svc-x7k/10.0.0.9"},
		{"network gateway", NetworkGatewayUID("net1", "1.2.3.4", 15008), "NetworkGateway/net1/1.2.3.4/15008"},
		{"split horizon", SplitHorizonUID("net2", "gw.example.com", "ns", "svc.ns.svc.cluster.local"), "net2/SplitHorizonWorkload/gw.example.com/ns/svc.ns.svc.cluster.local"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

func TestParseWorkloadUID(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in      string
		want    WorkloadUID
		wantErr bool
	}{
		{in: "Kubernetes//Pod/default/foo-abc", want: WorkloadUID{Kind: KindPod, Cluster: "Kubernetes", Namespace: "default", Name: "foo-abc"}},
		{in: "Kubernetes/networking.istio.io/WorkloadEntry/vm/db-1", want: WorkloadUID{Kind: KindWorkloadEntry, Cluster: "Kubernetes", Namespace: "vm", Name: "db-1"}},
		{in: "c1/networking.istio.io/ServiceEntry/ns/ext/2001:db8::1", want: WorkloadUID{Kind: KindServiceEntry, Cluster: "c1", Namespace: "ns", Name: "ext", Endpoint: "2001:db8::1"}},
		{in: "c1/networking.istio.io/ServiceEntry/ns/ext/unix:///var/run/app.sock", want: WorkloadUID{Kind: KindServiceEntry, Cluster: "c1", Namespace: "ns", Name: "ext", Endpoint: "unix:///var/run/app.sock"}},
		{in: "c1/discovery.k8s.io/EndpointSlice/ns/svc-x7k/10.0.0.9", want: WorkloadUID{Kind: KindEndpointSlice, Cluster: "c1", Namespace: "ns", Name: "svc-x7k", Endpoint: "10.0.0.9"}},
		{in: "NetworkGateway/net1/1.2.3.4/15008", want: WorkloadUID{Kind: KindNetworkGateway, Network: "net1", Gateway: "1.2.3.4", Port: 15008}},
		{in: "NetworkGateway/net1/2001:db8::2/15008", want: WorkloadUID{Kind: KindNetworkGateway, Network: "net1", Gateway: "2001:db8::2", Port: 15008}},
		{in: "net2/SplitHorizonWorkload/gw.example.com/ns/svc.ns.svc.cluster.local", want: WorkloadUID{Kind: KindSplitHorizon, Network: "net2", Gateway: "gw.example.com", Namespace: "ns", Hostname: "svc.ns.svc.cluster.local"}},
		// A cluster may be called NetworkGateway without confusing the parser.
		{in: "NetworkGateway//Pod/ns/p", want: WorkloadUID{Kind: KindPod, Cluster: "NetworkGateway", Namespace: "ns", Name: "p"}},

		{in: "", wantErr: true},
		{in: "Kubernetes/Pod/default/foo", wantErr: true},
		{in: "Kubernetes//Pod/default", wantErr: true},
		{in: "Kubernetes//Pod/default/foo/extra", wantErr: true},
		{in: "//Pod/default/foo", wantErr: true},
		{in: "Kubernetes//Pod//foo", wantErr: true},
		{in: "Kubernetes//Pod/default/", wantErr: true},
		{in: "Kubernetes//Deployment/default/foo", wantErr: true},
		{in: "c1/networking.istio.io/ServiceEntry/ns/ext", wantErr: true},
		{in: "c1/networking.istio.io/ServiceEntry/ns/ext/", wantErr: true},
		{in: "NetworkGateway/net1/1.2.3.4/0", wantErr: true},
		{in: "NetworkGateway/net1/1.2.3.4/65536", wantErr: true},
		{in: "NetworkGateway/net1/1.2.3.4/015008", wantErr: true},
		{in: "NetworkGateway//1.2.3.4/15008", wantErr: true},
		{in: "NetworkGateway/net1/1.2.3.4/15008/x", wantErr: true},
		{in: "net2/SplitHorizonWorkload/gw/ns", wantErr: true},
		{in: "net2/SplitHorizonWorkload/gw/ns/a/b", wantErr: true},
	} {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseWorkloadUID(tt.in)
			if tt.wantErr {
				if !errors.Is(err, ErrMalformedName) {
					t.Fatalf("ParseWorkloadUID(%q) = %+v, %v; want ErrMalformedName", tt.in, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseWorkloadUID(%q): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseWorkloadUID(%q) mismatch (-want +got):\n%s", tt.in, diff)
			}
			if s := got.String(); s != tt.in {
				t.Errorf("String() = %q, want %q", s, tt.in)
			}
		})
	}
}

func FuzzParseWorkloadUID(f *testing.F) {
	for _, s := range []string{
		"Kubernetes//Pod/default/foo-abc",
		"c1/networking.istio.io/ServiceEntry/ns/ext/unix:///x",
		"c1/discovery.k8s.io/EndpointSlice/ns/s/k",
		"NetworkGateway/n/1.2.3.4/15008",
		"n/SplitHorizonWorkload/gw/ns/h",
		"c1/networking.istio.io/WorkloadEntry/ns/x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseWorkloadUID(s)
		if err != nil {
			if !errors.Is(err, ErrMalformedName) {
				t.Fatalf("error %v does not wrap ErrMalformedName", err)
			}
			return
		}
		// Whatever parses is canonical: it prints back to the same bytes.
		if got := u.String(); got != s {
			t.Fatalf("ParseWorkloadUID(%q).String() = %q", s, got)
		}
	})
}
