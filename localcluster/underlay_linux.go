package localcluster

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/internal/netns"
)

// createBridge makes the host bridge that joins the nodes, with the host's
// underlay address on it. An existing bridge of the name is reused.
func createBridge(name string, addr netip.Prefix) error {
	br, err := netlink.LinkByName(name)
	if err != nil {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil {
			return fmt.Errorf("create bridge %s: %w", name, err)
		}
		if br, err = netlink.LinkByName(name); err != nil {
			return err
		}
	}
	if err := netlink.AddrReplace(br, &netlink.Addr{IPNet: ipNet(addr)}); err != nil {
		return fmt.Errorf("address bridge %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fmt.Errorf("bring up bridge %s: %w", name, err)
	}
	// With br_netfilter loaded, bridged packets go through the host's
	// iptables FORWARD chain, which a host firewall may drop: traffic
	// between nodes is L2 on this bridge and must not be filtered there.
	for _, f := range []string{"nf_call_iptables", "nf_call_ip6tables", "nf_call_arptables"} {
		path := filepath.Join("/sys/class/net", name, "bridge", f)
		if err := os.WriteFile(path, []byte("0"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("disable %s on %s: %w", f, name, err)
		}
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// nodeNetwork is what joins one node to the underlay.
type nodeNetwork struct {
	netnsPath string
	hostLink  string       // host side of the veth, on the bridge
	addr      netip.Prefix // node address with the underlay's prefix length
	gateway   netip.Addr   // the host's underlay address
	podCIDR   netip.Prefix
	// routes to other nodes' pod CIDRs, by their node address
	peers map[netip.Prefix]netip.Addr
}

// connectNode plugs a node namespace into the bridge: a veth pair whose node
// side is eth0 with the node address, a default route to the host, routes
// to the other nodes' pod CIDRs, and forwarding on (the node routes for its
// pods).
func connectNode(bridge string, n nodeNetwork) error {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("find bridge %s: %w", bridge, err)
	}
	nsFile, err := os.Open(n.netnsPath)
	if err != nil {
		return fmt.Errorf("open node namespace: %w", err)
	}
	defer nsFile.Close()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = n.hostLink
	attrs.MasterIndex = br.Attrs().Index
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(nsFile.Fd()))}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s: %w", n.hostLink, err)
	}
	host, err := netlink.LinkByName(n.hostLink)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("bring up %s: %w", n.hostLink, err)
	}
	return netns.Do(n.netnsPath, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(eth0, &netlink.Addr{IPNet: ipNet(n.addr)}); err != nil {
			return fmt.Errorf("address eth0: %w", err)
		}
		if err := netlink.LinkSetUp(eth0); err != nil {
			return fmt.Errorf("bring up eth0: %w", err)
		}
		if err := netlink.RouteAdd(&netlink.Route{Gw: n.gateway.AsSlice(), LinkIndex: eth0.Attrs().Index}); err != nil {
			return fmt.Errorf("default route: %w", err)
		}
		for cidr, via := range n.peers {
			if err := netlink.RouteAdd(&netlink.Route{Dst: ipNet(cidr), Gw: via.AsSlice(), LinkIndex: eth0.Attrs().Index}); err != nil {
				return fmt.Errorf("route %s via %s: %w", cidr, via, err)
			}
		}
		// /proc/sys/net shows the namespace of the thread that opens it.
		for _, s := range []string{"net/ipv4/ip_forward", "net/ipv4/conf/all/rp_filter", "net/ipv4/conf/default/rp_filter"} {
			val := "1"
			if filepath.Base(s) == "rp_filter" {
				val = "0"
			}
			if err := os.WriteFile(filepath.Join("/proc/sys", s), []byte(val), 0o644); err != nil {
				return fmt.Errorf("sysctl %s: %w", s, err)
			}
		}
		return nil
	})
}

// addHostRoute routes a node's pod CIDR from the host through the node, so
// that the host (tests, tools) reaches pods directly.
func addHostRoute(cidr netip.Prefix, via netip.Addr) error {
	err := netlink.RouteReplace(&netlink.Route{Dst: ipNet(cidr), Gw: via.AsSlice()})
	if err != nil {
		return fmt.Errorf("host route %s via %s: %w", cidr, via, err)
	}
	return nil
}

// deleteLink removes a host link; a missing one is fine.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	return nil
}
