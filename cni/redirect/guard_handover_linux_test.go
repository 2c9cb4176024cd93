package redirect

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// usedSlots counts the proxies g holds registered.
func usedSlots(g *PortGuard) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, r := range g.slots {
		if r != nil {
			n++
		}
	}
	return n
}

// TestGuardedHandOver: during an upgrade two node proxies are registered
// and both bind the pod's 15001 in one SO_REUSEPORT group; the kernel
// spreads connections over both, and when the old one (this process)
// closes its listener every connection goes to the new one (another
// process), none lost; meanwhile a process of the pod is still refused.
// The new proxy may run in the node's PID namespace (the chart's hostPID)
// or in one of its own (a proxy without hostPID, as ztunnel's chart runs
// it). When it exits its registration goes with it.
func TestGuardedHandOver(t *testing.T) {
	for _, tt := range []struct {
		name     string
		ownPidns bool
	}{
		{"new proxy in the node's PID namespace", false},
		{"new proxy in a PID namespace of its own", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := openGuard(t)
			if err := g.Admit(os.Getpid()); err != nil {
				t.Fatal(err)
			}
			p := newPair(t)
			b := Guarded{Backend: Nftables{}, Guard: g}
			if err := b.Enroll(p.pod, DefaultPodConfig()); err != nil {
				t.Fatal(err)
			}
			oldOut, oldL := proxyReusePort(t, p.pod, OutboundPort, false)
			newProxy := startRoleAdmitted(t, p.pod, tt.ownPidns, roleSpec{WaitToBind: true, Binds: []string{"tcp [::]:15001"}}, func(pid int) {
				if err := g.Admit(pid); err != nil {
					t.Fatal(err)
				}
			})
			if err := newProxy.ready.Binds[0]; err != "" {
				t.Fatalf("the new proxy's bind: %s", err)
			}
			if got := usedSlots(g); got != 2 {
				t.Fatalf("%d proxies registered, want 2", got)
			}
			attacker := startRole(t, p.pod, true, roleSpec{DropCaps: true, Binds: []string{"tcp [::]:15001"}})
			if err := attacker.ready.Binds[0]; !strings.Contains(err, "operation not permitted") {
				t.Errorf("the pod's bind during the hand-over: %q, want EPERM", err)
			}

			dial := func() int {
				failed := 0
				for range attackConns {
					c, err := dialQuick(p.pod, netip.Addr{}, 0, "10.213.0.1:80")
					if err != nil {
						failed++
						continue
					}
					c.Close()
				}
				return failed
			}
			failed := dial()
			both := drain(oldOut)
			oldL.Close() // the old proxy drains
			failed += dial()
			stolen := attacker.counts(t)[0]
			gotNew := newProxy.counts(t)[0]
			t.Logf("both listening: old proxy %d, new %d of %d; old closed: new %d of %d; attacker %d; failed %d",
				both, attackConns-both, attackConns, gotNew-(attackConns-both), attackConns, stolen, failed)
			if failed != 0 || stolen != 0 || both == 0 || both == attackConns || gotNew != 2*attackConns-both {
				t.Errorf("old proxy %d, new proxy %d, attacker %d, failed %d of %d: want both proxies sharing the first %d, the new one all the next, nothing else",
					both, gotNew, stolen, failed, 2*attackConns, attackConns)
			}
			eventually.True(t, "the new proxy's registration goes when it exits", func() bool { return usedSlots(g) == 1 })
		})
	}
}

// TestPortGuardRefusesAPodHoldingAPort: a running pod enrolled late may
// hold a guarded port already (bound before the guard), in the proxy's
// group once the proxy listens. Enroll refuses it, installing nothing,
// once a node proxy is registered to tell its sockets from others; the
// proxy's own socket there is no reason to refuse.
func TestPortGuardRefusesAPodHoldingAPort(t *testing.T) {
	g := openGuard(t)
	if err := g.Admit(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	p := newPair(t)
	squatter := startRole(t, p.pod, true, roleSpec{DropCaps: true, Binds: []string{"tcp [::]:15006"}})
	if err := squatter.ready.Binds[0]; err != "" {
		t.Fatalf("bind before the guard: %s", err)
	}
	b := Guarded{Backend: Nftables{}, Guard: g}
	err := b.Enroll(p.pod, DefaultPodConfig())
	if !errors.Is(err, ErrPortTaken) || !strings.Contains(err.Error(), "tcp port 15006") {
		t.Fatalf("Enroll with a pod's socket on 15006 = %v, want ErrPortTaken naming it", err)
	}
	if rs := nftList(t, p.pod); strings.Contains(rs, NatTable) {
		t.Errorf("rules installed for a refused pod:\n%s", rs)
	}
	driftHas(t, b.Verify(p.pod, DefaultPodConfig()), "held by a process that is not a registered node proxy: tcp port 15006")

	other := newPair(t)
	_, proxyL := proxyReusePort(t, other.pod, OutboundPort, false)
	defer proxyL.Close()
	if err := b.Enroll(other.pod, DefaultPodConfig()); err != nil {
		t.Errorf("Enroll with the node proxy's own socket on 15001: %v", err)
	}
}

// TestGuardedVerifiesAndRepairs: Verify reports a guard that is off, or
// ports the kernel may give away, as drift, and Enroll repairs both; a
// sidecar pod must not be guarded (its Envoy binds 15001 and 15006), and
// enrolling it as one unguards it; Unenroll unguards.
func TestGuardedVerifiesAndRepairs(t *testing.T) {
	g := openGuard(t)
	p := newPair(t)
	b := Guarded{Backend: Nftables{}, Guard: g}
	cfg := DefaultPodConfig()
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := g.Unguard(p.pod); err != nil {
		t.Fatal(err)
	}
	in(t, p.pod, func() (struct{}, error) { return struct{}{}, os.WriteFile(reservedPortsSysctl, []byte("8080"), 0o644) })
	driftHas(t, b.Verify(p.pod, cfg), "ports are not guarded", "ip_local_reserved_ports lacks 15001,15006,15008,15053")
	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(p.pod, cfg); err != nil {
		t.Fatalf("Verify after repair: %v", err)
	}
	if got := strings.TrimSpace(string(in(t, p.pod, func() ([]byte, error) { return os.ReadFile(reservedPortsSysctl) }))); got != "8080,15001,15006,15008,15053" {
		t.Errorf("reserved ports %q, want the pod's 8080 kept and the proxy's added", got)
	}
	if err := bindIn(t, p.pod, unix.AF_INET6, OutboundPort); !errors.Is(err, unix.EPERM) {
		t.Errorf("bind after repair: %v, want EPERM", err)
	}

	sidecar := PodConfig{Sidecar: DefaultSidecarConfig()}
	driftHas(t, b.Verify(p.pod, sidecar), "keeps the pod's own proxy from binding them")
	if err := b.Enroll(p.pod, sidecar); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(p.pod, sidecar); err != nil {
		t.Fatalf("Verify of the sidecar pod: %v", err)
	}
	if err := bindIn(t, p.pod, unix.AF_INET6, OutboundPort); err != nil {
		t.Errorf("the sidecar pod's Envoy cannot bind 15001: %v", err)
	}

	if err := b.Enroll(p.pod, cfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Unenroll(p.pod); err != nil {
		t.Fatal(err)
	}
	if err := bindIn(t, p.pod, unix.AF_INET6, OutboundPort); err != nil {
		t.Errorf("bind after Unenroll: %v", err)
	}
}

// TestPortGuardTakenOverByNextAgent: the guard holds while no agent runs
// (it is pinned), and the next agent takes it over: the same links, the
// guarded namespaces and the live proxies kept; a program of another
// version is swapped back in place.
func TestPortGuardTakenOverByNextAgent(t *testing.T) {
	nettest.NeedRoot(t)
	if err := bpfprog.ProbeBindGuard(); err != nil {
		ci.Unavailable(t, "%v", err)
	}
	cfg := PortGuardConfig{Root: filepath.Join(nettest.BPFFS(t), "guard"), Cgroup: cgroupMount(t), Log: testLog(t)}
	first, err := OpenPortGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := newPair(t)
	if err := first.Guard(p.pod); err != nil {
		t.Fatal(err)
	}
	if err := first.Admit(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	linkIDs := func(g *PortGuard) []link.ID {
		var ids []link.ID
		for _, l := range g.links {
			info, err := l.Info()
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, info.ID)
		}
		return ids
	}
	before := linkIDs(first)
	// What the map would hold for a proxy that exited while no agent ran,
	// its PID taken by another process since: the same ID but for the
	// start time.
	var self bpfprog.ProxyID
	if err := first.proxies.Lookup(uint32(0), &self); err != nil || self.PidnsIno == 0 {
		t.Fatalf("slot 0 = %+v, %v; want this process", self, err)
	}
	gone := self
	gone.StartTime--
	if err := first.proxies.Update(uint32(1), gone, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	first.Close() // the agent stops

	attacker := startRole(t, p.pod, true, roleSpec{DropCaps: true, Binds: []string{"tcp [::]:15001"}})
	if err := attacker.ready.Binds[0]; !strings.Contains(err, "operation not permitted") {
		t.Errorf("bind while no agent runs: %q, want EPERM", err)
	}

	// A program of another version, attached through the pinned link.
	other, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.CGroupSockAddr, AttachType: ebpf.AttachCGroupInet6Bind, License: "Apache-2.0",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	l, err := link.LoadPinnedLink(filepath.Join(cfg.Root, guardLink6File), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Update(other); err != nil {
		t.Fatal(err)
	}
	l.Close()

	second, err := OpenPortGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if after := linkIDs(second); !slices.Equal(before, after) {
		t.Errorf("links %v after the takeover, want the same %v", after, before)
	}
	if got := usedSlots(second); got != 1 {
		t.Errorf("%d proxies after the takeover, want this live one", got)
	}
	var slot1 bpfprog.ProxyID
	if err := second.proxies.Lookup(uint32(1), &slot1); err != nil || slot1 != (bpfprog.ProxyID{}) {
		t.Errorf("the gone proxy's slot after the takeover = %+v, %v; want it cleared", slot1, err)
	}
	if problems, err := second.Problems(p.pod, true); err != nil || len(problems) > 0 {
		t.Errorf("Problems after the takeover = %v, %v", problems, err)
	}
	attacker = startRole(t, p.pod, true, roleSpec{DropCaps: true, Binds: []string{"tcp [::]:15001"}})
	if err := attacker.ready.Binds[0]; !strings.Contains(err, "operation not permitted") {
		t.Errorf("bind after the takeover: %q, want EPERM (the other version's program replaced)", err)
	}
	if err := bindIn(t, p.pod, unix.AF_INET6, OutboundPort); err != nil {
		t.Errorf("the adopted proxy's bind: %v", err)
	}

	if err := second.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cfg.Root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pins left after Remove: %v", err)
	}
	attacker = startRole(t, p.pod, true, roleSpec{DropCaps: true, Binds: []string{"tcp [::]:15001"}})
	if err := attacker.ready.Binds[0]; err != "" {
		t.Errorf("bind after Remove: %q, want the guard gone", err)
	}
}

// TestPortGuardPrune: namespaces the agent no longer knows leave the map.
func TestPortGuardPrune(t *testing.T) {
	g := openGuard(t)
	a, b := newPair(t), newPair(t)
	for _, ns := range []string{a.pod, b.pod} {
		if err := g.Guard(ns); err != nil {
			t.Fatal(err)
		}
	}
	_, inoA, err := netnsOf(a.pod)
	if err != nil {
		t.Fatal(err)
	}
	n, err := g.Prune([]uint64{inoA})
	if err != nil || n != 1 {
		t.Fatalf("Prune = %d, %v; want 1", n, err)
	}
	if err := bindIn(t, a.pod, unix.AF_INET, OutboundPort); !errors.Is(err, unix.EPERM) {
		t.Errorf("the live pod's guard: %v, want EPERM", err)
	}
	if err := bindIn(t, b.pod, unix.AF_INET, OutboundPort); err != nil {
		t.Errorf("the pruned namespace: %v", err)
	}
}

// TestUnguardableRefusesAmbientPods: on a node that cannot guard, an
// ambient pod is refused with the reason, installing nothing, and one
// already enrolled is drift; a sidecar pod needs no guard and is
// enrolled.
func TestUnguardableRefusesAmbientPods(t *testing.T) {
	nettest.NeedRoot(t)
	p := newPair(t)
	b := Guarded{Backend: Nftables{}, Guard: Unguardable{Err: errors.New("no cgroup2 hierarchy")}}
	err := b.Enroll(p.pod, DefaultPodConfig())
	if !errors.Is(err, ErrNoPortGuard) || !strings.Contains(err.Error(), "no cgroup2 hierarchy") {
		t.Fatalf("Enroll = %v, want ErrNoPortGuard with the reason", err)
	}
	if rs := nftList(t, p.pod); strings.Contains(rs, NatTable) {
		t.Errorf("rules installed for a refused pod:\n%s", rs)
	}
	if err := (Nftables{}).Enroll(p.pod, DefaultPodConfig()); err != nil {
		t.Fatal(err)
	}
	driftHas(t, b.Verify(p.pod, DefaultPodConfig()), "cannot be guarded on this node: no cgroup2 hierarchy")
	sidecar := PodConfig{Sidecar: DefaultSidecarConfig()}
	if err := b.Enroll(p.pod, sidecar); err != nil {
		t.Fatalf("Enroll of a sidecar pod: %v", err)
	}
	if err := b.Verify(p.pod, sidecar); err != nil {
		t.Errorf("Verify of a sidecar pod: %v", err)
	}
}
