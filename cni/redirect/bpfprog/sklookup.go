package bpfprog

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Offsets in struct bpf_sk_lookup, the sk_lookup context. The verifier
// wants each field loaded with its own size (4 bytes for all used here).
const (
	skcFamily    = 8
	skcProtocol  = 12
	skcLocalIP4  = 40 // network byte order
	skcLocalIP6  = 44 // network byte order, 4 words
	skcLocalPort = 60 // host byte order
)

// SkLookupSpec returns the sk_lookup program, which runs in the pod's
// network namespace whenever TCP looks for a listener or UDP for an
// unconnected socket:
//
//   - Other families and protocols, and local addresses that are the pod's
//     own (127.0.0.0/8, ::1, the pod IPs), pass untouched. The last are
//     inbound connections, left to the tcx program, or the proxy's
//     connections to the app, which sk_lookup cannot tell from an app
//     talking to itself because it sees no packet mark.
//   - Any other local address got here through the capture routing, so it
//     is outbound: TCP goes to SlotOutbound, or to SlotDNSTCP for port 53
//     when DNS capture is on; UDP to port 53 goes to SlotDNSUDP when DNS
//     capture is on, other UDP passes.
//   - An empty slot drops: capture fails closed.
//
// The spec references the maps by name (MapSocks, MapCfg).
func SkLookupSpec() *ebpf.ProgramSpec {
	// R6 context, R7 cfg value then socket, R8 flags then assign error,
	// R9 slot.
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),

		asm.LoadMem(asm.R2, asm.R6, skcProtocol, asm.Word),
		asm.JEq.Imm(asm.R2, ipprotoTCP, "proto_ok"),
		asm.JNE.Imm(asm.R2, ipprotoUDP, "pass"),
	}
	insns = append(insns, lookupCfg("proto_ok", "pass")...)
	insns = append(insns,
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.LoadMem(asm.R2, asm.R6, skcFamily, asm.Word),
		asm.JEq.Imm(asm.R2, afInet, "v4"),
		asm.JNE.Imm(asm.R2, afInet6, "pass"),

		// IPv6: ::1 passes.
		asm.LoadMem(asm.R2, asm.R6, skcLocalIP6, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, skcLocalIP6+4, asm.Word),
		asm.Or.Reg(asm.R2, asm.R3),
		asm.LoadMem(asm.R3, asm.R6, skcLocalIP6+8, asm.Word),
		asm.Or.Reg(asm.R2, asm.R3),
		asm.JNE.Imm(asm.R2, 0, "v6_pod"),
		asm.LoadMem(asm.R3, asm.R6, skcLocalIP6+12, asm.Word),
		asm.JEq.Imm32(asm.R3, net32([4]byte{0, 0, 0, 1}), "pass"),
	)
	// IPv6: the pod's own address passes.
	insns = append(insns, jumpIfNotPodIPv6("v6_pod", asm.R6, skcLocalIP6, asm.R7, "slot")...)
	insns = append(insns,
		asm.Ja.Label("pass"),

		// IPv4: 127.0.0.0/8 and the pod's own address pass.
		asm.LoadMem(asm.R2, asm.R6, skcLocalIP4, asm.Word).WithSymbol("v4"),
		asm.Mov.Reg(asm.R3, asm.R2),
		asm.And.Imm32(asm.R3, net32([4]byte{0xff, 0, 0, 0})),
		asm.JEq.Imm32(asm.R3, net32([4]byte{127, 0, 0, 0}), "pass"),
		asm.LoadMem(asm.R3, asm.R7, cfgOffPodIPv4, asm.Word),
		asm.JEq.Reg32(asm.R2, asm.R3, "pass"),

		// Pick the slot.
		asm.LoadMem(asm.R8, asm.R7, cfgOffFlags, asm.Word).WithSymbol("slot"),
		asm.And.Imm(asm.R8, FlagDNSCapture),
		asm.LoadMem(asm.R2, asm.R6, skcLocalPort, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, skcProtocol, asm.Word),
		asm.JEq.Imm(asm.R3, ipprotoUDP, "udp"),

		asm.Mov.Imm(asm.R9, int32(SlotOutbound)),
		asm.JNE.Imm(asm.R2, dnsPort, "assign"),
		asm.JEq.Imm(asm.R8, 0, "assign"),
		asm.Mov.Imm(asm.R9, int32(SlotDNSTCP)),
		asm.Ja.Label("assign"),

		asm.JNE.Imm(asm.R2, dnsPort, "pass").WithSymbol("udp"),
		asm.JEq.Imm(asm.R8, 0, "pass"),
		asm.Mov.Imm(asm.R9, int32(SlotDNSUDP)),
	)
	insns = append(insns, assignSlot("assign", "drop")...)
	insns = append(insns,
		asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, skDrop).WithSymbol("drop"),
		asm.Return(),
	)
	return &ebpf.ProgramSpec{
		Name:         ProgSkLookup,
		Type:         ebpf.SkLookup,
		AttachType:   ebpf.AttachSkLookup,
		License:      license,
		Instructions: insns,
	}
}
