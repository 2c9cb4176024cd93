package redirect

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/sockmap"
)

// Ebpf redirects an ambient pod's traffic with eBPF programs inside the
// pod's network namespace instead of netfilter (cni/README.md, "eBPF
// backend"; the programs are package bpfprog's):
//
//   - an sk_lookup program attached to the namespace steers the app's
//     outbound TCP, and DNS on port 53 when DNS capture is on, to the node
//     proxy's sockets; policy routing (ebpf_routing.go) makes those
//     connections local deliveries so that sk_lookup sees them;
//   - a tcx ingress program on every interface but lo assigns new inbound
//     TCP connections (but HBONE's 15008 and kubelet probes) to the
//     proxy's 15006 listener.
//
// The proxy's sockets are in the socks SOCKMAP the node proxy fills
// (internal/sockmap); an empty slot drops the traffic that belongs to it.
// The maps and the links are pinned under <Root>/<netns inode>/ (socks,
// cfg, sklookup_link, tcx_<interface>_link), so the attachments outlive the
// agent, and a restarted agent, or a newer one, takes them over: existing
// maps are kept (the proxy's registrations live in socks), a changed
// configuration is written to cfg, and a program of another version is
// swapped atomically with Link.Update.
//
// The proxy learns a connection's original destination from getsockname()
// on the accepted socket; SO_ORIGINAL_DST fails, since nothing is NATed.
// Behaviour differs from the netfilter backends in a few ways (cni/README.md):
// an app's connection to its own pod IP is not captured, and captured
// traffic without a registered proxy socket times out instead of being
// refused.
//
// Two kinds of pods are handed to the Nftables backend; once its rules are
// in, any eBPF state of the pod is removed (Verify then checks the
// nftables rules and that no eBPF state is left):
//
//   - sidecar pods (PodConfig.Sidecar): Ebpf does not implement Istio's
//     sidecar capture;
//   - pods without inbound capture (ambient.istio.io/bypass-inbound-capture):
//     the capture routing sends every TCP packet the pod originates to
//     local delivery, the app's replies included, which is what brings the
//     replies of the proxy's connections that spoof the client's address
//     back to the proxy. Inbound capture makes the proxy (or the probe rule)
//     the only peer of outside connections; without it the app's replies
//     to an outside client would be delivered locally and the connection
//     never completes. Telling the two kinds of replies apart needs
//     connection state, which the nftables rules keep (connmark) and the
//     programs do not. The node proxy sees no pinned map for such a pod
//     (internal/sockmap) and treats it as netfilter-redirected.
//
// RerouteInterfaces are refused (ErrEbpfUnsupported). A pod with more than
// one global address of a family is refused too: the programs know one
// address per family.
//
// Root must be on a BPF filesystem (ErrNotBPFFS otherwise); the agent
// mounts one with sockmap.MountBPFFS.
type Ebpf struct {
	// Root is the directory of the pods' pins; empty is
	// sockmap.DefaultRoot. The node proxy must look in the same place.
	Root string
}

// ErrEbpfUnsupported is a pod setting the eBPF backend cannot apply.
var ErrEbpfUnsupported = errors.New("not supported by the ebpf redirection backend")

// Files in a pod's pin directory besides the socket map
// (sockmap.MapFile).
const (
	ebpfCfgFile      = "cfg"
	ebpfSkLookupFile = "sklookup_link"
	ebpfTCXPrefix    = "tcx_"
	ebpfLinkSuffix   = "_link"
)

// tcxLinkFile is the pin of the tcx link of interface ifname.
func tcxLinkFile(ifname string) string { return ebpfTCXPrefix + ifname + ebpfLinkSuffix }

// Name implements Backend.
func (Ebpf) Name() string { return "ebpf" }

func (e Ebpf) root() string {
	if e.Root == "" {
		return sockmap.DefaultRoot
	}
	return e.Root
}

// ebpfPod is a pod's network namespace, open, with what the backend
// needs of it.
type ebpfPod struct {
	path string
	ns   *os.File
	ino  uint64
	dir  string
	h    *netlink.Handle
}

func (e Ebpf) openPod(path string) (*ebpfPod, error) {
	ns, err := openNetns(path)
	if err != nil {
		return nil, err
	}
	ino, err := sockmap.Inode(ns)
	if err != nil {
		ns.Close()
		return nil, err
	}
	h, err := routingHandle(ns)
	if err != nil {
		ns.Close()
		return nil, err
	}
	return &ebpfPod{path: path, ns: ns, ino: ino, dir: sockmap.Dir(e.root(), ino), h: h}, nil
}

func (p *ebpfPod) Close() {
	p.h.Close()
	p.ns.Close()
}

// delegated reports whether the pod is handed to the Nftables backend
// (see Ebpf).
func delegated(cfg PodConfig) bool {
	return cfg.Sidecar != nil || !cfg.InboundCapture
}

// refuseUnsupported fails for the settings of cfg the backend cannot
// apply. The agent reports the error on the pod.
func refuseUnsupported(cfg PodConfig) error {
	if cfg.Sidecar == nil && len(cfg.RerouteInterfaces) > 0 {
		return fmt.Errorf("pod annotation istio.io/reroute-virtual-interfaces (%v): %w; use the nftables or iptables backend for such pods",
			cfg.RerouteInterfaces, ErrEbpfUnsupported)
	}
	return nil
}

// prepare opens the pod's namespace and works out what Enroll installs
// there now (the cfg map's value, the routing of each family) from the
// pod's addresses, which are read again each time. The caller closes the
// pod.
func (e Ebpf) prepare(netnsPath string, cfg PodConfig) (p *ebpfPod, want bpfprog.Config, fams []ebpfFamily, err error) {
	if err := checkBPFFS(e.root()); err != nil {
		return nil, want, nil, err
	}
	if p, err = e.openPod(netnsPath); err != nil {
		return nil, want, nil, err
	}
	defer func() {
		if err != nil {
			p.Close()
			p = nil
		}
	}()
	addrs, err := discoverPodAddrs(p.h, netnsPath)
	if err != nil {
		return p, want, nil, fmt.Errorf("%s: %w", netnsPath, err)
	}
	if want, err = bpfprog.NewConfig(addrs.v4, addrs.v6, cfg.ProbeSNAT, cfg.ProbeSNATv6, cfg.DNSCapture); err != nil {
		return p, want, nil, err
	}
	fams, err = ebpfFamilies(p.h, addrs, cfg)
	return p, want, fams, err
}

// Enroll implements Backend. See Ebpf for what it installs; it first
// fails, changing nothing, for settings it refuses and when Root is not on
// a BPF filesystem. The netfilter capture of the nftables and iptables
// backends, if the pod has it, is removed last, so the pod is never left
// uncaptured in between.
func (e Ebpf) Enroll(netnsPath string, cfg PodConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := refuseUnsupported(cfg); err != nil {
		return err
	}
	if delegated(cfg) {
		// Its rules first: a pod changing over is captured twice for a
		// moment, never not at all.
		if err := (Nftables{}).Enroll(netnsPath, cfg); err != nil {
			return err
		}
		return e.removeEbpf(netnsPath)
	}
	p, want, fams, err := e.prepare(netnsPath, cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return fmt.Errorf("create pin directory: %w", err)
	}
	maps, err := openPinnedMaps(p.dir, true)
	if err != nil {
		return err
	}
	defer maps.Close()
	if err := bpfprog.PutConfig(maps.cfg, want); err != nil {
		return fmt.Errorf("%s: %w", p.dir, err)
	}
	progs := &ebpfProgs{maps: maps}
	defer progs.Close()
	if err := p.ensureSkLookup(progs); err != nil {
		return err
	}
	if err := p.ensureTCX(progs); err != nil {
		return err
	}
	if err := ensureEbpfRouting(p.path, p.h, fams, cfg.DNSCapture); err != nil {
		return err
	}
	if err := ensureMigrate(netnsPath); err != nil {
		return err
	}
	return p.removeNetfilterCapture()
}

// Unenroll implements Backend: the eBPF routing goes first (so no
// outbound connection is delivered locally without sk_lookup to steer
// it), then the links, detached, and the pin directory; the nftables
// rules of a pod the backend handed to Nftables go as well. Nothing there
// is fine.
func (e Ebpf) Unenroll(netnsPath string) error {
	return errors.Join(e.removeEbpf(netnsPath), Nftables{}.Unenroll(netnsPath))
}

// removeEbpf removes the pod's eBPF routing, links and pins.
func (e Ebpf) removeEbpf(netnsPath string) error {
	p, err := e.openPod(netnsPath)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := removeEbpfRouting(p.path, p.h); err != nil {
		return err
	}
	// Pins cannot exist elsewhere than on a BPF filesystem.
	if ok, err := sockmap.IsBPFFS(p.dir); err != nil || !ok {
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	return removePinDir(p.dir)
}

// Verify implements Backend: the programs attached to the
// namespace and to each interface are exactly Canopy's, through the
// pinned links, using the pinned maps; cfg holds what Enroll would write
// now (the pod's addresses are read again); the routing and
// tcp_migrate_req are as Enroll sets them; no netfilter capture of the
// other backends is left. Empty socket slots are not drift: the proxy
// fills them, and Unregistered lists them.
func (e Ebpf) Verify(netnsPath string, cfg PodConfig) error {
	if err := refuseUnsupported(cfg); err != nil {
		return err
	}
	if delegated(cfg) {
		return e.verifyDelegated(netnsPath, cfg)
	}
	p, want, fams, err := e.prepare(netnsPath, cfg)
	if err != nil {
		return err
	}
	defer p.Close()

	var problems []string
	var mapIDs []ebpf.MapID
	maps, err := openPinnedMaps(p.dir, false)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		problems = append(problems, fmt.Sprintf("pinned maps missing (%v): the node proxy cannot register its sockets", err))
	case errors.Is(err, ebpf.ErrMapIncompatible):
		problems = append(problems, err.Error())
	case err != nil:
		return err
	default:
		defer maps.Close()
		if mapIDs, err = maps.ids(); err != nil {
			return err
		}
		var have bpfprog.Config
		if err := maps.cfg.Lookup(uint32(0), &have); err != nil {
			return fmt.Errorf("read %s: %w", filepath.Join(p.dir, ebpfCfgFile), err)
		}
		problems = append(problems, configProblems(have, want)...)
	}
	progProblems, err := p.skLookupProblems(mapIDs, true)
	if err != nil {
		return err
	}
	problems = append(problems, progProblems...)
	if progProblems, err = p.tcxProblems(mapIDs, true); err != nil {
		return err
	}
	problems = append(problems, progProblems...)
	routing, err := ebpfRoutingProblems(p.path, p.h, fams, cfg.DNSCapture)
	if err != nil {
		return err
	}
	problems = append(problems, routing...)
	off, err := verifyMigrate(netnsPath)
	if err != nil {
		return err
	}
	problems = append(problems, off...)
	left, err := p.netfilterCapture()
	if err != nil {
		return err
	}
	problems = append(problems, left...)
	if len(problems) > 0 {
		return &DriftError{Problems: problems}
	}
	return nil
}

// verifyDelegated is Verify of a pod handed to the Nftables backend: its
// capture, and nothing of the eBPF backend's.
func (e Ebpf) verifyDelegated(netnsPath string, cfg PodConfig) error {
	return verifyWithout(Nftables{}, e, netnsPath, cfg)
}

// verifyWithout is b's Verify, with what is left of e's eBPF state in the
// pod as drift too.
func verifyWithout(b Backend, e Ebpf, netnsPath string, cfg PodConfig) error {
	var problems []string
	err := b.Verify(netnsPath, cfg)
	var drift *DriftError
	switch {
	case errors.As(err, &drift):
		problems = drift.Problems
	case err != nil:
		return err
	}
	left, err := e.leftovers(netnsPath, b.Name())
	if err != nil {
		return err
	}
	problems = append(problems, left...)
	if len(problems) > 0 {
		return &DriftError{Problems: problems}
	}
	return nil
}

// leftovers lists the eBPF state in a pod that the backend named other
// captures: pins, programs, routing.
func (e Ebpf) leftovers(netnsPath, other string) ([]string, error) {
	p, err := e.openPod(netnsPath)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	var problems []string
	if _, err := os.Stat(p.dir); err == nil {
		problems = append(problems, fmt.Sprintf("eBPF pins left at %s for a pod the %s backend captures", p.dir, other))
	}
	progs, err := p.skLookupProblems(nil, false)
	if err != nil {
		return nil, err
	}
	problems = append(problems, progs...)
	tcx, err := p.tcxProblems(nil, false)
	if err != nil {
		return nil, err
	}
	problems = append(problems, tcx...)
	routing, err := ebpfRoutingProblems(p.path, p.h, nil, false)
	if err != nil {
		return nil, err
	}
	return append(problems, routing...), nil
}

// Unregistered lists the socket slots of the pod's socks map that hold no
// proxy socket. Traffic of an empty slot is dropped until the node proxy
// registers; the agent cannot repair that, so it is not drift, but the
// agent can report it. A pod without pinned maps (not enrolled with eBPF)
// is an error wrapping fs.ErrNotExist.
func (e Ebpf) Unregistered(netnsPath string) ([]sockmap.Slot, error) {
	ns, err := openNetns(netnsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	ino, err := sockmap.Inode(ns)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(sockmap.Dir(e.root(), ino), sockmap.MapFile)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, fmt.Errorf("open socket map %s: %w", path, err)
	}
	defer m.Close()
	var empty []sockmap.Slot
	for s := range sockmap.Slot(sockmap.Slots) {
		_, ok, err := sockmap.Cookie(m, s)
		if err != nil {
			return nil, err
		}
		if !ok {
			empty = append(empty, s)
		}
	}
	return empty, nil
}

// podAddrs are a pod's global addresses, one per family at most (an
// invalid netip.Addr is none), and the interfaces with IPv6 addresses.
type podAddrs struct {
	v4, v6 netip.Addr
	// v6Links are the interfaces but lo that are up with IPv6 on: the pod
	// can send IPv6 over them, from a link-local address at least.
	v6Links []netlink.Link
}

// discoverPodAddrs finds the pod's global (scope universe) addresses on
// its interfaces but lo. Link-local IPv6 addresses are not pod IPs. More
// than one address of a family is refused: the programs compare with one
// address per family, and the others would be taken for foreign
// destinations.
func discoverPodAddrs(h *netlink.Handle, netnsPath string) (podAddrs, error) {
	links, err := podInterfaces(h)
	if err != nil {
		return podAddrs{}, err
	}
	var out podAddrs
	var v4, v6 []netip.Addr
	for _, l := range links {
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return podAddrs{}, fmt.Errorf("list addresses of %s: %w", l.Attrs().Name, err)
		}
		hasV6 := false
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			hasV6 = hasV6 || ip.Is6()
			switch {
			case a.Scope != unix.RT_SCOPE_UNIVERSE:
			case ip.Is4():
				v4 = append(v4, ip)
			default:
				v6 = append(v6, ip)
			}
		}
		// The kernel takes no IPv6 route through an interface that is
		// down; it carries nothing either. Verify notices it coming up.
		if l.Attrs().Flags&net.FlagUp == 0 {
			continue
		}
		// An interface just brought up gets its link-local address a
		// moment later: IPv6 being on, not the address, says the pod
		// can send IPv6 over it, so that the decision does not depend on
		// when Enroll looked.
		if !hasV6 {
			on, err := ipv6On(netnsPath, l.Attrs().Name)
			if err != nil {
				return podAddrs{}, err
			}
			hasV6 = on
		}
		if hasV6 {
			out.v6Links = append(out.v6Links, l)
		}
	}
	for _, f := range []struct {
		name string
		all  []netip.Addr
		dst  *netip.Addr
	}{{"IPv4", v4, &out.v4}, {"IPv6", v6, &out.v6}} {
		slices.SortFunc(f.all, netip.Addr.Compare)
		f.all = slices.Compact(f.all)
		switch len(f.all) {
		case 0:
		case 1:
			*f.dst = f.all[0]
		default:
			return podAddrs{}, fmt.Errorf("pod has %d global %s addresses %v: %w, it redirects for one address per family", len(f.all), f.name, f.all, ErrEbpfUnsupported)
		}
	}
	return out, nil
}

// ipv6On reports whether IPv6 is on for interface name in the netns at
// path (net.ipv6.conf.<name>.disable_ipv6 is 0); a kernel without IPv6
// has it off.
func ipv6On(path, name string) (bool, error) {
	var b []byte
	err := netns.Do(path, func() (err error) {
		b, err = os.ReadFile(filepath.Join("/proc/sys/net/ipv6/conf", name, "disable_ipv6"))
		return err
	})
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read net.ipv6.conf.%s.disable_ipv6 in %s: %w", name, path, err)
	}
	return strings.TrimSpace(string(b)) == "0", nil
}

// podInterfaces are the interfaces of the netns but loopback ones, by
// name.
func podInterfaces(h *netlink.Handle) ([]netlink.Link, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	links = slices.DeleteFunc(links, func(l netlink.Link) bool { return l.Attrs().Flags&net.FlagLoopback != 0 })
	slices.SortFunc(links, func(a, b netlink.Link) int { return cmp.Compare(a.Attrs().Name, b.Attrs().Name) })
	return links, nil
}

// configProblems describes how the cfg map's value differs from want.
func configProblems(have, want bpfprog.Config) []string {
	var out []string
	field := func(name string, h, w []byte) {
		if slices.Equal(h, w) {
			return
		}
		out = append(out, fmt.Sprintf("cfg map: %s is %s, want %s", name, cfgAddr(h), cfgAddr(w)))
	}
	field("pod IPv4", have.PodIPv4[:], want.PodIPv4[:])
	field("pod IPv6", have.PodIPv6[:], want.PodIPv6[:])
	field("probe IPv4", have.ProbeIPv4[:], want.ProbeIPv4[:])
	field("probe IPv6", have.ProbeIPv6[:], want.ProbeIPv6[:])
	if h, w := have.Flags&bpfprog.FlagDNSCapture != 0, want.Flags&bpfprog.FlagDNSCapture != 0; h != w {
		out = append(out, fmt.Sprintf("cfg map: DNS capture is %s, want %s", onOff(h), onOff(w)))
	}
	if extra := have.Flags &^ want.Flags &^ bpfprog.FlagDNSCapture; extra != 0 {
		out = append(out, fmt.Sprintf("cfg map: unknown flags 0x%x", extra))
	}
	return out
}

func cfgAddr(b []byte) string {
	a, _ := netip.AddrFromSlice(b)
	if a.IsUnspecified() {
		return "none"
	}
	return a.String()
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
