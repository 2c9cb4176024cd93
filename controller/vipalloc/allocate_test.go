package vipalloc

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/controller/ambient"
)

// entry is a DNS ServiceEntry of namespace shop without addresses, created
// at unix time created; status lists "host=ip" pairs.
func entry(name string, created int64, hosts []string, status ...[2]string) *networkingv1.ServiceEntry {
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", CreationTimestamp: metav1.Unix(created, 0)}}
	se.Spec.Hosts = hosts
	se.Spec.Resolution = networkingapi.ServiceEntry_DNS
	se.Spec.Ports = []*networkingapi.ServicePort{{Number: 443, Name: "https", Protocol: "TLS"}}
	for _, s := range status {
		se.Status.Addresses = append(se.Status.Addresses, &networkingapi.ServiceEntryAddress{Host: s[0], Value: s[1]})
	}
	return se
}

// holdersOf indexes entries by the addresses they hold.
func holdersOf(entries ...*networkingv1.ServiceEntry) Holders {
	idx := map[netip.Addr][]*networkingv1.ServiceEntry{}
	for _, se := range entries {
		for _, a := range addresses(se) {
			idx[a] = append(idx[a], se)
		}
	}
	return func(a netip.Addr) []*networkingv1.ServiceEntry { return idx[a] }
}

// pairs turns status addresses into "host=ip" pairs.
func pairs(as []*networkingapi.ServiceEntryAddress) [][2]string {
	var out [][2]string
	for _, a := range as {
		out = append(out, [2]string{a.GetHost(), a.GetValue()})
	}
	return out
}

func TestAllocateFresh(t *testing.T) {
	t.Parallel()
	r := DefaultRanges()
	se := entry("api", 100, []string{"api.example.com", "*.cdn.example.com", "api.example.com", "pay.example.com"})
	got := Allocate(se, holdersOf(se), r)
	// istiod's statusPatchForAddresses: one IPv4 and one IPv6 address per
	// kept host (a wildcard host only with DYNAMIC_DNS), hosts once each.
	if len(got) != 4 {
		t.Fatalf("Allocate() = %v, want an IPv4 and an IPv6 address for each of two hosts", pairs(got))
	}
	seen := map[string]bool{}
	for i, a := range got {
		ip := netip.MustParseAddr(a.GetValue())
		wantHost := []string{"api.example.com", "api.example.com", "pay.example.com", "pay.example.com"}[i]
		inRange := r.IPv4.Contains(ip) && i%2 == 0 || r.IPv6.Contains(ip) && i%2 == 1
		if a.GetHost() != wantHost || !inRange || seen[a.GetValue()] {
			t.Errorf("address %d = %s for %s; want a new %s address for %s", i, a.GetValue(), a.GetHost(), []string{"IPv4", "IPv6"}[i%2], wantHost)
		}
		seen[a.GetValue()] = true
	}
	if again := Allocate(se, holdersOf(se), r); !cmp.Equal(pairs(again), pairs(got)) {
		t.Errorf("Allocate() is not deterministic: %v, then %v", pairs(got), pairs(again))
	}
	dyn := se.DeepCopy()
	dyn.Spec.Resolution = networkingapi.ServiceEntry_DYNAMIC_DNS
	if n := len(Allocate(dyn, holdersOf(dyn), r)); n != 6 {
		t.Errorf("DYNAMIC_DNS: %d addresses, want 6 (the wildcard host too)", n)
	}
}

func TestAllocate(t *testing.T) {
	t.Parallel()
	r := DefaultRanges()
	hosts := []string{"api.example.com"}
	fresh := pairs(Allocate(entry("api", 100, hosts), holdersOf(), r))
	for _, tt := range []struct {
		name   string
		se     *networkingv1.ServiceEntry
		others []*networkingv1.ServiceEntry
		want   [][2]string // nil: compare with fresh, with the changes in check
		check  func(t *testing.T, got [][2]string)
	}{
		{name: "existing addresses are kept", se: entry("api", 100, hosts, [2]string{"api.example.com", "240.240.1.1"}, [2]string{"api.example.com", "2001:2::1"}),
			want: [][2]string{{"api.example.com", "240.240.1.1"}, {"api.example.com", "2001:2::1"}}},
		{name: "an address out of range is kept", se: entry("api", 100, hosts, [2]string{"api.example.com", "10.9.9.9"}),
			check: func(t *testing.T, got [][2]string) {
				if len(got) != 2 || got[0][1] != "10.9.9.9" || got[1] != fresh[1] {
					t.Errorf("got %v, want 10.9.9.9 kept and the IPv6 address allocated", got)
				}
			}},
		{name: "addresses of removed hosts are dropped", se: entry("api", 100, hosts, [2]string{"api.example.com", "240.240.1.1"},
			[2]string{"api.example.com", "2001:2::1"}, [2]string{"old.example.com", "240.240.2.2"}),
			want: [][2]string{{"api.example.com", "240.240.1.1"}, {"api.example.com", "2001:2::1"}}},
		{name: "extra addresses of a family are dropped", se: entry("api", 100, hosts, [2]string{"api.example.com", "240.240.1.1"},
			[2]string{"api.example.com", "240.240.1.2"}, [2]string{"api.example.com", "2001:2::1"}),
			want: [][2]string{{"api.example.com", "240.240.1.1"}, {"api.example.com", "2001:2::1"}}},
		{name: "an address another entry holds is skipped", se: entry("api", 100, hosts),
			others: []*networkingv1.ServiceEntry{entry("taken", 50, []string{"t.example.com"}, [2]string{"t.example.com", fresh[0][1]})},
			check: func(t *testing.T, got [][2]string) {
				if len(got) != 2 || got[0][1] == fresh[0][1] || got[1] != fresh[1] {
					t.Errorf("got %v, want an IPv4 address other than %s", got, fresh[0][1])
				}
			}},
		{name: "an address a user gives another entry is lost", se: entry("api", 100, hosts, [2]string{"api.example.com", "240.240.1.1"}, [2]string{"api.example.com", "2001:2::1"}),
			others: []*networkingv1.ServiceEntry{func() *networkingv1.ServiceEntry {
				u := entry("user", 900, []string{"u.example.com"})
				u.Spec.Addresses = []string{"240.240.1.1"}
				return u
			}()},
			want: [][2]string{{"api.example.com", fresh[0][1]}, {"api.example.com", "2001:2::1"}}},
		{name: "an address an older entry holds is lost", se: entry("api", 100, hosts, [2]string{"api.example.com", "240.240.1.1"}, [2]string{"api.example.com", "2001:2::1"}),
			others: []*networkingv1.ServiceEntry{entry("older", 50, []string{"o.example.com"}, [2]string{"o.example.com", "2001:2::1"})},
			want:   [][2]string{{"api.example.com", "240.240.1.1"}, {"api.example.com", fresh[1][1]}}},
		{name: "an address a newer entry holds is kept", se: entry("api", 100, hosts, [2]string{"api.example.com", "240.240.1.1"}, [2]string{"api.example.com", "2001:2::1"}),
			others: []*networkingv1.ServiceEntry{entry("newer", 200, []string{"n.example.com"}, [2]string{"n.example.com", "240.240.1.1"})},
			want:   [][2]string{{"api.example.com", "240.240.1.1"}, {"api.example.com", "2001:2::1"}}},
		{name: "an older entry that no longer allocates does not win", se: entry("api", 100, hosts, [2]string{"api.example.com", "240.240.1.1"}, [2]string{"api.example.com", "2001:2::1"}),
			others: []*networkingv1.ServiceEntry{func() *networkingv1.ServiceEntry {
				o := entry("older", 50, []string{"o.example.com"}, [2]string{"o.example.com", "240.240.1.1"})
				o.Labels = map[string]string{ambient.LabelEnableAutoallocateIP: "false"}
				return o
			}()},
			want: [][2]string{{"api.example.com", "240.240.1.1"}, {"api.example.com", "2001:2::1"}}},
		{name: "opted out: cleared", se: func() *networkingv1.ServiceEntry {
			se := entry("api", 100, hosts, [2]string{"api.example.com", "240.240.1.1"})
			se.Labels = map[string]string{ambient.LabelEnableAutoallocateIP: "FALSE"}
			return se
		}(), want: nil, check: func(t *testing.T, got [][2]string) {
			if got != nil {
				t.Errorf("got %v, want none", got)
			}
		}},
		{name: "resolution none: none", se: func() *networkingv1.ServiceEntry {
			se := entry("api", 100, hosts)
			se.Spec.Resolution = networkingapi.ServiceEntry_NONE
			return se
		}(), check: func(t *testing.T, got [][2]string) {
			if got != nil {
				t.Errorf("got %v, want none", got)
			}
		}},
		{name: "addresses of its own: none", se: func() *networkingv1.ServiceEntry {
			se := entry("api", 100, hosts, [2]string{"api.example.com", "240.240.1.1"})
			se.Spec.Addresses = []string{"10.1.1.1"}
			return se
		}(), check: func(t *testing.T, got [][2]string) {
			if got != nil {
				t.Errorf("got %v, want none", got)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := pairs(Allocate(tt.se, holdersOf(append(tt.others, tt.se)...), r))
			if tt.check != nil {
				tt.check(t, got)
				return
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Allocate() (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAllocateFillsARange: every entry gets a distinct address until the
// range runs out; then the IPv4 address is left out.
func TestAllocateFillsARange(t *testing.T) {
	t.Parallel()
	r := Ranges{IPv4: netip.MustParsePrefix("240.240.0.0/29"), IPv6: netip.MustParsePrefix(DefaultIPv6Range)}
	var all []*networkingv1.ServiceEntry
	seen := map[string]bool{}
	for i := range 7 {
		se := entry(string(rune('a'+i)), int64(i), []string{"h.example.com"})
		got := Allocate(se, holdersOf(all...), r)
		se.Status.Addresses = got
		all = append(all, se)
		if i == 6 {
			if len(got) != 1 || netip.MustParseAddr(got[0].GetValue()).Is4() {
				t.Errorf("entry %d with the range full: %v, want the IPv6 address only", i, pairs(got))
			}
			break
		}
		v4 := got[0].GetValue()
		if seen[v4] || v4 == "240.240.0.0" || v4 == "240.240.0.7" || !r.IPv4.Contains(netip.MustParseAddr(v4)) {
			t.Errorf("entry %d got %s", i, v4)
		}
		seen[v4] = true
	}
}

func TestRangesValidate(t *testing.T) {
	t.Parallel()
	if err := DefaultRanges().Validate(); err != nil {
		t.Errorf("default ranges: %v", err)
	}
	for _, r := range []Ranges{
		{IPv4: netip.MustParsePrefix("2001:db8::/64"), IPv6: netip.MustParsePrefix(DefaultIPv6Range)},
		{IPv4: netip.MustParsePrefix("240.240.0.0/31"), IPv6: netip.MustParsePrefix(DefaultIPv6Range)},
		{IPv4: netip.MustParsePrefix(DefaultIPv4Range), IPv6: netip.MustParsePrefix("10.0.0.0/8")},
		{},
	} {
		if r.Validate() == nil {
			t.Errorf("%+v: no error", r)
		}
	}
}
