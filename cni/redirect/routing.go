package redirect

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The routing half of wire contract §4.1: packets of the proxy's connections
// (fwmark 0x111/0xfff) are delivered locally, so replies reach the proxy's
// transparent sockets.

// routeFamily is the routing of one address family.
type routeFamily struct {
	af  int
	all *net.IPNet
}

func (f routeFamily) String() string {
	if f.af == unix.AF_INET6 {
		return "ip -6"
	}
	return "ip"
}

var (
	routeV4 = routeFamily{af: unix.AF_INET, all: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}
	routeV6 = routeFamily{af: unix.AF_INET6, all: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}
)

func routingHandle(f *os.File) (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(netns.NsHandle(f.Fd()))
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", f.Name(), err)
	}
	return h, nil
}

// routeFamilies are the families the netns routes: IPv4, and IPv6 where
// lo has ::1. Without it (IPv6 off in the kernel or on lo) the table-100
// route cannot deliver anything locally, and nothing is lost: the rules
// redirect IPv6 to ::1, which then cannot be reached, so IPv6 TCP fails
// rather than leaving the pod around the proxy.
func routeFamilies(h *netlink.Handle) ([]routeFamily, error) {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("find lo: %w", err)
	}
	addrs, err := h.AddrList(lo, netlink.FAMILY_V6)
	if err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
		return nil, fmt.Errorf("list IPv6 addresses of lo: %w", err)
	}
	for _, a := range addrs {
		if a.IP.Equal(net.IPv6loopback) {
			return []routeFamily{routeV4, routeV6}, nil
		}
	}
	return []routeFamily{routeV4}, nil
}

func markRule(f routeFamily) *netlink.Rule {
	r := netlink.NewRule()
	mask := uint32(MarkMask)
	r.Family, r.Priority, r.Table, r.Mark, r.Mask = f.af, RulePriority, RouteTable, TProxyMark, &mask
	return r
}

func hasMarkRule(h *netlink.Handle, f routeFamily) (bool, error) {
	rules, err := h.RuleList(f.af)
	if err != nil {
		return false, fmt.Errorf("list %s rules: %w", f, err)
	}
	for _, r := range rules {
		if r.Priority == RulePriority && r.Table == RouteTable && r.Mark == TProxyMark && r.Mask != nil && *r.Mask == MarkMask {
			return true, nil
		}
	}
	return false, nil
}

func localRoute(h *netlink.Handle, f routeFamily) (*netlink.Route, error) {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("find lo: %w", err)
	}
	return &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: f.all, Table: RouteTable, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST}, nil
}

// ensureRouting installs the ip rule and the local route of every family
// the netns routes; both are idempotent.
func ensureRouting(h *netlink.Handle) error {
	fams, err := routeFamilies(h)
	if err != nil {
		return err
	}
	for _, f := range fams {
		if err := ensureFamilyRouting(h, f); err != nil {
			return err
		}
	}
	return nil
}

func ensureFamilyRouting(h *netlink.Handle, f routeFamily) error {
	ok, err := hasMarkRule(h, f)
	if err != nil {
		return err
	}
	if !ok {
		if err := h.RuleAdd(markRule(f)); err != nil {
			return fmt.Errorf("add %s rule fwmark 0x%x/0x%x lookup %d: %w", f, TProxyMark, MarkMask, RouteTable, err)
		}
	}
	route, err := localRoute(h, f)
	if err != nil {
		return err
	}
	if err := h.RouteReplace(route); err != nil {
		return fmt.Errorf("add %s local route to table %d: %w", f, RouteTable, err)
	}
	return nil
}

// verifyRouting lists what is missing, in every family the netns routes.
func verifyRouting(h *netlink.Handle) ([]string, error) {
	fams, err := routeFamilies(h)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, f := range fams {
		m, err := verifyFamilyRouting(h, f)
		if err != nil {
			return nil, err
		}
		missing = append(missing, m...)
	}
	return missing, nil
}

func verifyFamilyRouting(h *netlink.Handle, f routeFamily) ([]string, error) {
	var missing []string
	ok, err := hasMarkRule(h, f)
	if err != nil {
		return nil, err
	}
	if !ok {
		missing = append(missing, fmt.Sprintf("%s rule fwmark 0x%x/0x%x lookup %d priority %d", f, TProxyMark, MarkMask, RouteTable, RulePriority))
	}
	routes, err := h.RouteListFiltered(f.af, &netlink.Route{Table: RouteTable}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list %s routes of table %d: %w", f, RouteTable, err)
	}
	found := false
	for _, r := range routes {
		if r.Type == unix.RTN_LOCAL && (r.Dst == nil || r.Dst.String() == f.all.String()) {
			found = true
		}
	}
	if !found {
		missing = append(missing, fmt.Sprintf("%s route local %s dev lo table %d", f, f.all, RouteTable))
	}
	return missing, nil
}

// removeRouting deletes the rules and routes of both families; absent
// ones, and IPv6 in a kernel without it, are fine.
func removeRouting(h *netlink.Handle) error {
	var errs []error
	for _, f := range []routeFamily{routeV4, routeV6} {
		if err := removeFamilyRouting(h, f); err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func removeFamilyRouting(h *netlink.Handle, f routeFamily) error {
	var errs []error
	for {
		ok, err := hasMarkRule(h, f)
		if err != nil || !ok {
			errs = append(errs, err)
			break
		}
		if err := h.RuleDel(markRule(f)); err != nil {
			errs = append(errs, fmt.Errorf("delete %s rule: %w", f, err))
			break
		}
	}
	// An absent route is ESRCH for IPv4, ENOENT for IPv6.
	if route, err := localRoute(h, f); err != nil {
		errs = append(errs, err)
	} else if err := h.RouteDel(route); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("delete %s local route: %w", f, err))
	}
	return errors.Join(errs...)
}

// withRouting runs f with a netlink handle in the netns at path.
func withRouting(path string, f func(*netlink.Handle) error) error {
	ns, err := openNetns(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	h, err := routingHandle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	return f(h)
}

// routingState lists the routing the netns at path is missing.
func routingState(path string) ([]string, error) {
	var missing []string
	err := withRouting(path, func(h *netlink.Handle) (err error) {
		missing, err = verifyRouting(h)
		return err
	})
	return missing, err
}

// ipv6Addresses lists the IPv6 addresses of the netns at path but ::1;
// with any of them, link-local included, the pod can send IPv6 past lo.
func ipv6Addresses(path string) ([]netip.Addr, error) {
	var out []netip.Addr
	err := withRouting(path, func(h *netlink.Handle) error {
		addrs, err := h.AddrList(nil, netlink.FAMILY_V6)
		if errors.Is(err, unix.EAFNOSUPPORT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list IPv6 addresses: %w", err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.IsLoopback() {
				out = append(out, ip)
			}
		}
		return nil
	})
	return out, err
}
