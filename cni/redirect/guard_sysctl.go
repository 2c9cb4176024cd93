package redirect

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
)

// DefaultPortRange is net.ipv4.ip_local_port_range in a new network
// namespace: the ports the kernel picks from itself.
const DefaultPortRange = "32768 60999"

// AutoboundGuardedPorts returns the node proxy's ports
// (bpfprog.GuardedPorts) the kernel may pick by itself for a socket of a
// namespace with these settings: net.ipv4.ip_local_port_range
// (ports, "low high") and net.ipv4.ip_local_reserved_ports (reserved,
// "8080,9000-9010"). Such a pick never runs the bind hook (PortGuard):
// PortGuard.Guard reserves the ports, and a pod whose own sysctls would
// replace that reservation with one that leaves them in its range must
// be refused (cni/enroll).
func AutoboundGuardedPorts(ports, reserved string) ([]uint16, error) {
	f := strings.Fields(ports)
	if len(f) != 2 {
		return nil, fmt.Errorf("port range %q: want two ports", ports)
	}
	lo, err := strconv.ParseUint(f[0], 10, 16)
	if err != nil {
		return nil, fmt.Errorf("port range %q: %w", ports, err)
	}
	hi, err := strconv.ParseUint(f[1], 10, 16)
	if err != nil {
		return nil, fmt.Errorf("port range %q: %w", ports, err)
	}
	res, err := parsePortRanges(reserved)
	if err != nil {
		return nil, err
	}
	var out []uint16
	for _, p := range bpfprog.GuardedPorts() {
		if uint64(p) < lo || uint64(p) > hi {
			continue
		}
		if !slices.ContainsFunc(res, func(r portRange) bool { return r.has(p) }) {
			out = append(out, p)
		}
	}
	return out, nil
}
