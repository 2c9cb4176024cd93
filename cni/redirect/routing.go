package redirect

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The routing half of wire contract §4.1: packets of the proxy's connections
// (fwmark 0x111/0xfff) are delivered locally, so replies reach the proxy's
// transparent sockets.

var allV4 = &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}

func routingHandle(f *os.File) (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(netns.NsHandle(f.Fd()))
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", f.Name(), err)
	}
	return h, nil
}

func markRule() *netlink.Rule {
	r := netlink.NewRule()
	mask := uint32(MarkMask)
	r.Family, r.Priority, r.Table, r.Mark, r.Mask = unix.AF_INET, RulePriority, RouteTable, TProxyMark, &mask
	return r
}

func hasMarkRule(h *netlink.Handle) (bool, error) {
	rules, err := h.RuleList(unix.AF_INET)
	if err != nil {
		return false, fmt.Errorf("list ip rules: %w", err)
	}
	for _, r := range rules {
		if r.Priority == RulePriority && r.Table == RouteTable && r.Mark == TProxyMark && r.Mask != nil && *r.Mask == MarkMask {
			return true, nil
		}
	}
	return false, nil
}

func localRoute(h *netlink.Handle) (*netlink.Route, error) {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("find lo: %w", err)
	}
	return &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: allV4, Table: RouteTable, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST}, nil
}

// ensureRouting installs the ip rule and the local route; both are
// idempotent.
func ensureRouting(h *netlink.Handle) error {
	ok, err := hasMarkRule(h)
	if err != nil {
		return err
	}
	if !ok {
		if err := h.RuleAdd(markRule()); err != nil {
			return fmt.Errorf("add ip rule fwmark 0x%x/0x%x lookup %d: %w", TProxyMark, MarkMask, RouteTable, err)
		}
	}
	route, err := localRoute(h)
	if err != nil {
		return err
	}
	if err := h.RouteReplace(route); err != nil {
		return fmt.Errorf("add local route to table %d: %w", RouteTable, err)
	}
	return nil
}

// verifyRouting lists what is missing.
func verifyRouting(h *netlink.Handle) ([]string, error) {
	var missing []string
	ok, err := hasMarkRule(h)
	if err != nil {
		return nil, err
	}
	if !ok {
		missing = append(missing, fmt.Sprintf("ip rule fwmark 0x%x/0x%x lookup %d priority %d", TProxyMark, MarkMask, RouteTable, RulePriority))
	}
	routes, err := h.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: RouteTable}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes of table %d: %w", RouteTable, err)
	}
	found := false
	for _, r := range routes {
		if r.Type == unix.RTN_LOCAL && (r.Dst == nil || r.Dst.String() == allV4.String()) {
			found = true
		}
	}
	if !found {
		missing = append(missing, fmt.Sprintf("local 0.0.0.0/0 dev lo table %d", RouteTable))
	}
	return missing, nil
}

// removeRouting deletes the rule and route; absent ones are fine.
func removeRouting(h *netlink.Handle) error {
	var errs []error
	for {
		ok, err := hasMarkRule(h)
		if err != nil || !ok {
			errs = append(errs, err)
			break
		}
		if err := h.RuleDel(markRule()); err != nil {
			errs = append(errs, fmt.Errorf("delete ip rule: %w", err))
			break
		}
	}
	if route, err := localRoute(h); err != nil {
		errs = append(errs, err)
	} else if err := h.RouteDel(route); err != nil && !errors.Is(err, unix.ESRCH) {
		errs = append(errs, fmt.Errorf("delete local route: %w", err))
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
