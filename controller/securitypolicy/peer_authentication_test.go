package securitypolicy

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// pa is a PeerAuthentication created age seconds after an epoch, with
// mode m; sel nil has no selector, an empty map is `selector: {}`.
func pa(ns, name string, age int, sel map[string]string, m Mode, ports map[uint32]Mode) *securityv1.PeerAuthentication {
	p := &securityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(time.Unix(1_700_000_000+int64(age), 0)),
	}}
	if sel != nil {
		p.Spec.Selector = &typeapi.WorkloadSelector{MatchLabels: sel}
	}
	if m != Unset {
		p.Spec.Mtls = &securityapi.PeerAuthentication_MutualTLS{Mode: m}
	}
	for port, pm := range ports {
		if p.Spec.PortLevelMtls == nil {
			p.Spec.PortLevelMtls = map[uint32]*securityapi.PeerAuthentication_MutualTLS{}
		}
		p.Spec.PortLevelMtls[port] = &securityapi.PeerAuthentication_MutualTLS{Mode: pm}
	}
	return p
}

func names(p PeerAuthentications) []string {
	var out []string
	for _, x := range []*securityv1.PeerAuthentication{p.Workload, p.Namespace, p.Mesh} {
		if x == nil {
			out = append(out, "-")
			continue
		}
		out = append(out, x.Namespace+"/"+x.Name)
	}
	return out
}

func TestDecide(t *testing.T) {
	t.Parallel()
	const root = "istio-system"
	app := map[string]string{"app": "web"}
	meshStrict := pa(root, "mesh", 0, nil, Strict, nil)
	for _, tt := range []struct {
		name     string
		policies []*securityv1.PeerAuthentication
		ns       string
		lbls     map[string]string
		empty    EmptySelector
		want     []string // workload, namespace, mesh
		wantMode Mode
	}{
		{name: "nothing is permissive", ns: "shop", lbls: app, want: []string{"-", "-", "-"}, wantMode: Permissive},
		{name: "the mesh's", policies: []*securityv1.PeerAuthentication{meshStrict}, ns: "shop", lbls: app,
			want: []string{"-", "-", root + "/mesh"}, wantMode: Strict},
		{name: "the namespace's relaxes the mesh's", ns: "shop", lbls: app,
			policies: []*securityv1.PeerAuthentication{meshStrict, pa("shop", "ns", 1, nil, Permissive, nil)},
			want:     []string{"-", "shop/ns", root + "/mesh"}, wantMode: Permissive},
		{name: "UNSET defers to the next level", ns: "shop", lbls: app,
			policies: []*securityv1.PeerAuthentication{meshStrict, pa("shop", "ns", 1, nil, Unset, nil), pa("shop", "wl", 2, app, Unset, nil)},
			want:     []string{"shop/wl", "shop/ns", root + "/mesh"}, wantMode: Strict},
		{name: "the oldest of a level wins", ns: "shop", lbls: app,
			policies: []*securityv1.PeerAuthentication{pa("shop", "young", 5, nil, Strict, nil), pa("shop", "old", 1, nil, Disable, nil)},
			want:     []string{"-", "shop/old", "-"}, wantMode: Disable},
		{name: "of the same age, the first by name", ns: "shop", lbls: app,
			policies: []*securityv1.PeerAuthentication{pa("shop", "b", 1, nil, Strict, nil), pa("shop", "a", 1, nil, Disable, nil)},
			want:     []string{"-", "shop/a", "-"}, wantMode: Disable},
		{name: "a workload policy that does not select the workload", ns: "shop", lbls: app,
			policies: []*securityv1.PeerAuthentication{pa("shop", "db", 1, map[string]string{"app": "db"}, Strict, nil)},
			want:     []string{"-", "-", "-"}, wantMode: Permissive},
		{name: "another namespace's policies do not apply", ns: "shop", lbls: app,
			policies: []*securityv1.PeerAuthentication{pa("other", "ns", 1, nil, Strict, nil), pa("other", "wl", 1, app, Strict, nil)},
			want:     []string{"-", "-", "-"}, wantMode: Permissive},
		{name: "the root namespace's workload policies select only its own workloads", ns: "shop", lbls: app,
			policies: []*securityv1.PeerAuthentication{pa(root, "wl", 1, app, Strict, nil)},
			want:     []string{"-", "-", "-"}, wantMode: Permissive},
		{name: "in the root namespace, its policy is the mesh's", ns: root, lbls: app,
			policies: []*securityv1.PeerAuthentication{meshStrict, pa(root, "wl", 1, app, Disable, nil)},
			want:     []string{root + "/wl", "-", root + "/mesh"}, wantMode: Disable},
		{name: "nil labels ask for the namespace's own mode", ns: "shop",
			policies: []*securityv1.PeerAuthentication{pa("shop", "ns", 1, nil, Strict, nil), pa("shop", "all", 0, map[string]string{}, Disable, nil)},
			empty:    EmptySelectorSelectsAll,
			want:     []string{"-", "shop/ns", "-"}, wantMode: Strict},
		{name: "sidecars: selector {} is namespace-wide and competes by age", ns: "shop", lbls: app,
			policies: []*securityv1.PeerAuthentication{pa("shop", "ns", 1, nil, Strict, nil), pa("shop", "all", 0, map[string]string{}, Disable, nil)},
			empty:    EmptySelectorNamespaceWide,
			want:     []string{"-", "shop/all", "-"}, wantMode: Disable},
		{name: "sidecars: a younger selector {} loses to the namespace's", ns: "shop", lbls: app,
			policies: []*securityv1.PeerAuthentication{pa("shop", "ns", 1, nil, Strict, nil), pa("shop", "all", 2, map[string]string{}, Disable, nil)},
			empty:    EmptySelectorNamespaceWide,
			want:     []string{"-", "shop/ns", "-"}, wantMode: Strict},
		{name: "ztunnel: selector {} selects every workload and outranks the namespace's", ns: "shop", lbls: app,
			policies: []*securityv1.PeerAuthentication{pa("shop", "ns", 1, nil, Strict, nil), pa("shop", "all", 2, map[string]string{}, Disable, nil)},
			empty:    EmptySelectorSelectsAll,
			want:     []string{"shop/all", "shop/ns", "-"}, wantMode: Disable},
		{name: "sidecars: selector {} in the root namespace is the mesh's", ns: "shop", lbls: app,
			policies: []*securityv1.PeerAuthentication{pa(root, "all", 1, map[string]string{}, Strict, nil)},
			empty:    EmptySelectorNamespaceWide,
			want:     []string{"-", "-", root + "/all"}, wantMode: Strict},
		{name: "ztunnel: selector {} in the root namespace is no other namespace's", ns: "shop", lbls: app,
			policies: []*securityv1.PeerAuthentication{pa(root, "all", 1, map[string]string{}, Strict, nil)},
			empty:    EmptySelectorSelectsAll,
			want:     []string{"-", "-", "-"}, wantMode: Permissive},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Decide(slices.Values(tt.policies), root, tt.ns, tt.lbls, tt.empty)
			if diff := cmp.Diff(tt.want, names(got)); diff != "" {
				t.Errorf("Decide (-want +got):\n%s", diff)
			}
			if m := got.Mode(); m != tt.wantMode {
				t.Errorf("Mode() = %s, want %s", m, tt.wantMode)
			}
		})
	}
}

func TestPortModeAndInherited(t *testing.T) {
	t.Parallel()
	wl := pa("shop", "wl", 0, map[string]string{"app": "web"}, Unset, map[uint32]Mode{8080: Disable, 9090: Unset})
	p := PeerAuthentications{Workload: wl, Namespace: pa("shop", "ns", 0, nil, Unset, nil), Mesh: pa("istio-system", "mesh", 0, nil, Strict, nil)}
	for port, want := range map[uint32]Mode{8080: Disable, 9090: Strict, 80: Strict} {
		if got := p.PortMode(port); got != want {
			t.Errorf("PortMode(%d) = %s, want %s", port, got, want)
		}
	}
	if got := p.Inherited(); got != Strict {
		t.Errorf("Inherited() = %s, want STRICT (the mesh's, the namespace's being UNSET)", got)
	}
	if got := (PeerAuthentications{}).PortMode(8080); got != Permissive {
		t.Errorf("PortMode without policies = %s, want PERMISSIVE", got)
	}
}
