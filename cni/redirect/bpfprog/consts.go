package bpfprog

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// Program names in CollectionSpec; also the kernel's program names, which
// bpftool shows (at most 15 bytes).
const (
	ProgSkLookup = "canopy_sklookup"
	ProgInbound  = "canopy_inbound"
)

// license is what the kernel records for the programs; none of the helpers
// they call is GPL-only.
const license = "Apache-2.0"

// Return codes of the program types (uapi/linux/bpf.h).
const (
	skDrop = 0
	skPass = 1

	tcxNext = -1
	tcxPass = 0
	tcxDrop = 2
)

// Values of struct bpf_sock and the socket lookup helpers.
const (
	tcpListen     = 10 // TCP_LISTEN, struct bpf_sock.state
	currentNetns  = -1 // BPF_F_CURRENT_NETNS
	ipprotoTCP    = unix.IPPROTO_TCP
	ipprotoUDP    = unix.IPPROTO_UDP
	afInet        = unix.AF_INET
	afInet6       = unix.AF_INET6
	dnsPort       = 53
	hbonePort     = 15008
	tcpFlagSYN    = 0x02
	tcpFlagACK    = 0x10
	ethPIPv4      = 0x0800
	ethPIPv6      = 0x86dd
	ipv4FragMask  = 0x1fff // fragment offset bits of the IPv4 frag_off field
	ipv4MinHeader = 20
	ipv6Header    = 40
	ethHeader     = 14
	tcpMinHeader  = 20
)

// Network-order fields (addresses, ports, EtherTypes) are loaded from
// memory as native-endian integers. net16 and net32 give the constant such
// a load yields for a value, so that comparisons need no byte swapping and
// the programs stay correct on either byte order.
func net16(v uint16) int32 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return int32(binary.NativeEndian.Uint16(b[:]))
}

func net32(b [4]byte) int32 {
	return int32(binary.NativeEndian.Uint32(b[:]))
}

// byteOrder is the host's byte order as a value the asm package accepts
// (it knows binary.LittleEndian and binary.BigEndian only).
func byteOrder() binary.ByteOrder {
	if binary.NativeEndian.Uint16([]byte{1, 0}) == 1 {
		return binary.LittleEndian
	}
	return binary.BigEndian
}
