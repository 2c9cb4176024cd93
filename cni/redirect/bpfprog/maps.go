package bpfprog

import (
	"fmt"
	"net/netip"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/canopy-mesh/canopy/internal/sockmap"
)

// Names of the maps in the CollectionSpec, which the programs' instructions
// reference.
const (
	MapSocks = "socks"
	MapCfg   = "cfg"
)

// Slots of the socks SOCKMAP: which of the proxy's sockets each kind of
// captured traffic goes to. The node proxy registers its sockets by the
// same numbers (internal/sockmap), which is where they are defined.
const (
	SlotOutbound = int(sockmap.Outbound) // TCP listener on 15001
	SlotInbound  = int(sockmap.Inbound)  // TCP listener on 15006
	SlotDNSTCP   = int(sockmap.DNSTCP)   // TCP listener on 15053
	SlotDNSUDP   = int(sockmap.DNSUDP)   // UDP socket on 15053

	numSlots = sockmap.Slots
)

// FlagDNSCapture in Config.Flags makes sk_lookup capture DNS (port 53).
const FlagDNSCapture = 1 << 0

// Config is the value of the cfg map: what the programs need to know about
// their pod. Addresses are in network byte order, as the kernel hands them
// to the programs, so the programs compare them without conversion. The
// offsets are fixed (cfgOff*) because the programs load fields by offset.
//
// A zero address is "none": no packet or lookup has the unspecified
// address as its local or destination address, so it never matches.
type Config struct {
	PodIPv4   [4]byte
	PodIPv6   [16]byte
	ProbeIPv4 [4]byte
	ProbeIPv6 [16]byte
	Flags     uint32
}

// Offsets of Config's fields, used by the programs' loads.
const (
	cfgOffPodIPv4   = 0
	cfgOffPodIPv6   = 4
	cfgOffProbeIPv4 = 20
	cfgOffProbeIPv6 = 24
	cfgOffFlags     = 40
	cfgSize         = 44
)

// The programs depend on this layout; a field moved by mistake fails the
// build rather than the verifier or, worse, a comparison.
var _ = [1]struct{}{}[unsafe.Offsetof(Config{}.PodIPv6)-cfgOffPodIPv6]
var _ = [1]struct{}{}[unsafe.Offsetof(Config{}.ProbeIPv4)-cfgOffProbeIPv4]
var _ = [1]struct{}{}[unsafe.Offsetof(Config{}.ProbeIPv6)-cfgOffProbeIPv6]
var _ = [1]struct{}{}[unsafe.Offsetof(Config{}.Flags)-cfgOffFlags]
var _ = [1]struct{}{}[unsafe.Sizeof(Config{})-cfgSize]

// NewConfig builds a pod's Config. podIPv4 and podIPv6 may each be the zero
// netip.Addr when the pod has no address of that family; the probe
// addresses are the kubelet probe SNAT sources (redirect.DefaultProbeSNAT
// and DefaultProbeSNATv6).
func NewConfig(podIPv4, podIPv6, probeIPv4, probeIPv6 netip.Addr, dnsCapture bool) (Config, error) {
	var c Config
	var err error
	if c.PodIPv4, err = addr4("pod IPv4", podIPv4); err != nil {
		return Config{}, err
	}
	if c.PodIPv6, err = addr16("pod IPv6", podIPv6); err != nil {
		return Config{}, err
	}
	if c.ProbeIPv4, err = addr4("probe IPv4", probeIPv4); err != nil {
		return Config{}, err
	}
	if c.ProbeIPv6, err = addr16("probe IPv6", probeIPv6); err != nil {
		return Config{}, err
	}
	if dnsCapture {
		c.Flags |= FlagDNSCapture
	}
	return c, nil
}

func addr4(what string, a netip.Addr) ([4]byte, error) {
	if !a.IsValid() {
		return [4]byte{}, nil
	}
	if !a.Is4() {
		return [4]byte{}, fmt.Errorf("%s %v is not an IPv4 address", what, a)
	}
	return a.As4(), nil
}

// addr16 refuses v4-mapped addresses: the kernel reports IPv4 traffic as
// AF_INET, so a mapped address would never match.
func addr16(what string, a netip.Addr) ([16]byte, error) {
	if !a.IsValid() {
		return [16]byte{}, nil
	}
	if !a.Is6() || a.Is4In6() || a.Zone() != "" {
		return [16]byte{}, fmt.Errorf("%s %v is not an IPv6 address", what, a)
	}
	return a.As16(), nil
}

// MapSpecs returns new specs of the maps the programs use, keyed by the
// names the programs reference (MapSocks, MapCfg).
func MapSpecs() map[string]*ebpf.MapSpec {
	return map[string]*ebpf.MapSpec{
		// The value is 8 bytes so that a lookup from user space returns
		// the socket's cookie, which Verify can compare with SO_COOKIE.
		// An update takes the socket's fd as the value.
		MapSocks: {
			Name:       "canopy_socks",
			Type:       ebpf.SockMap,
			KeySize:    4,
			ValueSize:  8,
			MaxEntries: numSlots,
		},
		MapCfg: {
			Name:       "canopy_cfg",
			Type:       ebpf.Array,
			KeySize:    4,
			ValueSize:  cfgSize,
			MaxEntries: 1,
		},
	}
}

// CollectionSpec returns the maps and both programs, keyed by ProgSkLookup
// and ProgInbound, ready for ebpf.NewCollection.
func CollectionSpec() *ebpf.CollectionSpec {
	return &ebpf.CollectionSpec{
		Maps: MapSpecs(),
		Programs: map[string]*ebpf.ProgramSpec{
			ProgSkLookup: SkLookupSpec(),
			ProgInbound:  InboundSpec(),
		},
		ByteOrder: byteOrder(),
	}
}

// PutConfig stores c in the cfg map, where both programs read it from the
// next packet or lookup on.
func PutConfig(cfg *ebpf.Map, c Config) error {
	if err := cfg.Update(uint32(0), c, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("store pod config: %w", err)
	}
	return nil
}
