package redirect

import (
	"net/netip"
	"os"
	"strings"
	"testing"
)

// TestLeavingEbpf: a node moved from the eBPF backend back to a netfilter
// one: the netfilter backend's Verify of a pod still carrying eBPF state
// reports it, Enroll captures the pod with netfilter and removes the eBPF
// state, and the pod's outbound TCP is REDIRECTed (SO_ORIGINAL_DST set),
// not steered by a program left behind.
func TestLeavingEbpf(t *testing.T) {
	for _, inner := range []Backend{Nftables{}, Iptables{}} {
		t.Run(inner.Name(), func(t *testing.T) {
			if inner.Name() == "iptables" {
				needIptables(t)
			}
			root := bpffsRoot(t)
			p := newEbpfPair(t)
			cfg := DefaultPodConfig()
			if err := (Ebpf{Root: root}).Enroll(p.pod, cfg); err != nil {
				t.Fatal(err)
			}
			b := LeavingEbpf{Backend: inner, Root: root}
			driftHas(t, b.Verify(p.pod, cfg), "eBPF pins left")
			if err := b.Enroll(p.pod, cfg); err != nil {
				t.Fatal(err)
			}
			if err := b.Verify(p.pod, cfg); err != nil {
				t.Fatalf("Verify after Enroll: %v", err)
			}
			entries, err := os.ReadDir(root)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 0 {
				t.Errorf("pins left under %s: %v", root, entries)
			}
			if rules := ipIn(t, p.pod, "rule"); strings.Contains(rules, "lookup 133") {
				t.Errorf("eBPF routing left:\n%s", rules)
			}
			outbound := listen(t, p.pod, "0.0.0.0:15001")
			name, c := landsOn(t, dialFrom(t, p.pod, netip.Addr{}, 0, at(p.out4, 80)), map[string]listener{"15001": outbound})
			if name != "15001" {
				t.Fatalf("landed on %s", name)
			}
			if got, want := originalDst(t, c), netip.AddrPortFrom(p.out4, 80); got != want {
				t.Errorf("original destination = %v, want %v", got, want)
			}
			if err := b.Unenroll(p.pod); err != nil {
				t.Fatal(err)
			}
		})
	}
}
