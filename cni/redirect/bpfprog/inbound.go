package bpfprog

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Offsets in struct __sk_buff and struct bpf_sock.
const (
	skbData    = 76
	skbDataEnd = 80
	sockState  = 72
)

// Offsets in the frame.
const (
	offEtherType = 12
	offIP        = ethHeader
	offIPv4Proto = offIP + 9
	offIPv4Frag  = offIP + 6
	offIPv4Src   = offIP + 12
	offIPv4Dst   = offIP + 16
	offIPv6Next  = offIP + 6
	offIPv6Src   = offIP + 8
	offIPv6Dst   = offIP + 24
	offTCPDport  = 2
	offTCPFlags  = 13
)

// The struct bpf_sock_tuple the socket lookup reads, on the stack. Its
// IPv4 and IPv6 forms share the start; the ports follow the addresses.
const (
	stackTuple     = -48
	tupleV4Size    = 12
	tupleV6Size    = 36
	stackV4Dst     = stackTuple + 4
	stackV4Sport   = stackTuple + 8
	stackV4Dport   = stackTuple + 10
	stackV6Dst     = stackTuple + 16
	stackV6Sport   = stackTuple + 32
	stackV6Dport   = stackTuple + 34
	familyMarkerV4 = 4
	familyMarkerV6 = 6
)

// InboundSpec returns the tcx ingress program for the pod's interfaces. It
// sends new inbound TCP connections to the proxy's 15006 listener, the way
// TPROXY would, and leaves every other packet to the next program:
//
//   - It acts only on a TCP SYN without ACK, addressed to the pod's IP or
//     to an IPv6 link-local address (fe80::/10), to a port other than
//     HBONE's 15008, and not from the kubelet probe source. Later segments
//     need nothing: the tuple is unchanged, so they find the accepted
//     socket through the kernel's own lookup.
//   - Link-local destinations are the pod's own addresses too, reachable
//     by its neighbours on the link. Left to the kernel, a SYN to one
//     would reach sk_lookup, which takes every local address but the pod
//     IPs for an outbound destination and would steer it to the outbound
//     listener.
//   - A SYN that belongs to an existing connection (a retransmission, a
//     reused time-wait tuple) goes on to that socket.
//   - Otherwise the SYN is assigned to SlotInbound; an empty slot drops it
//     (fail closed).
//
// IPv4 with options and IPv6 without extension headers are parsed; any
// other frame, and any frame too short for its headers, passes on.
// Helper calls invalidate packet pointers, so the tuple is copied to the
// stack first.
//
// The spec references the maps by name (MapSocks, MapCfg).
func InboundSpec() *ebpf.ProgramSpec {
	// R6 skb, R2 data, R3 data end, R7 family marker then socket, R8 TCP
	// header then assign error, R9 tuple size then slot.
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, skbData, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, skbDataEnd, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, ethHeader),
		asm.JGT.Reg(asm.R4, asm.R3, "next"),
		asm.LoadMem(asm.R4, asm.R2, offEtherType, asm.Half),
		asm.JEq.Imm32(asm.R4, net16(ethPIPv4), "ip4"),
		asm.JNE.Imm32(asm.R4, net16(ethPIPv6), "next"),

		// IPv6: a fixed header followed directly by TCP.
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, offIP+ipv6Header),
		asm.JGT.Reg(asm.R4, asm.R3, "next"),
		asm.LoadMem(asm.R4, asm.R2, offIPv6Next, asm.Byte),
		asm.JNE.Imm(asm.R4, ipprotoTCP, "next"),
	}
	for i := int16(0); i < 8; i++ { // source, then destination
		insns = append(insns,
			asm.LoadMem(asm.R4, asm.R2, offIPv6Src+4*i, asm.Word),
			asm.StoreMem(asm.RFP, stackTuple+4*i, asm.R4, asm.Word),
		)
	}
	insns = append(insns,
		asm.Mov.Reg(asm.R8, asm.R2),
		asm.Add.Imm(asm.R8, offIP+ipv6Header),
		asm.Mov.Imm(asm.R9, tupleV6Size),
		asm.Mov.Imm(asm.R7, familyMarkerV6),
		asm.Ja.Label("tcp"),

		// IPv4: header length from IHL; fragments after the first carry
		// no TCP header.
		asm.Mov.Reg(asm.R4, asm.R2).WithSymbol("ip4"),
		asm.Add.Imm(asm.R4, offIP+ipv4MinHeader),
		asm.JGT.Reg(asm.R4, asm.R3, "next"),
		asm.LoadMem(asm.R4, asm.R2, offIPv4Proto, asm.Byte),
		asm.JNE.Imm(asm.R4, ipprotoTCP, "next"),
		asm.LoadMem(asm.R4, asm.R2, offIPv4Frag, asm.Half),
		asm.And.Imm32(asm.R4, net16(ipv4FragMask)),
		asm.JNE.Imm(asm.R4, 0, "next"),
		asm.LoadMem(asm.R5, asm.R2, offIP, asm.Byte),
		asm.And.Imm(asm.R5, 0x0f),
		asm.LSh.Imm(asm.R5, 2),
		asm.JLT.Imm(asm.R5, ipv4MinHeader, "next"),
		asm.LoadMem(asm.R4, asm.R2, offIPv4Src, asm.Word),
		asm.StoreMem(asm.RFP, stackTuple, asm.R4, asm.Word),
		asm.LoadMem(asm.R4, asm.R2, offIPv4Dst, asm.Word),
		asm.StoreMem(asm.RFP, stackV4Dst, asm.R4, asm.Word),
		asm.Mov.Reg(asm.R8, asm.R2),
		asm.Add.Imm(asm.R8, offIP),
		asm.Add.Reg(asm.R8, asm.R5),
		asm.Mov.Imm(asm.R9, tupleV4Size),
		asm.Mov.Imm(asm.R7, familyMarkerV4),

		// TCP: only a SYN without ACK, not to HBONE.
		asm.Mov.Reg(asm.R4, asm.R8).WithSymbol("tcp"),
		asm.Add.Imm(asm.R4, tcpMinHeader),
		asm.JGT.Reg(asm.R4, asm.R3, "next"),
		asm.LoadMem(asm.R4, asm.R8, offTCPFlags, asm.Byte),
		asm.And.Imm(asm.R4, tcpFlagSYN|tcpFlagACK),
		asm.JNE.Imm(asm.R4, tcpFlagSYN, "next"),
		asm.LoadMem(asm.R4, asm.R8, 0, asm.Half),
		asm.LoadMem(asm.R5, asm.R8, offTCPDport, asm.Half),
		asm.JEq.Imm32(asm.R5, net16(hbonePort), "next"),
		asm.JEq.Imm(asm.R7, familyMarkerV6, "ports6"),
		asm.StoreMem(asm.RFP, stackV4Sport, asm.R4, asm.Half),
		asm.StoreMem(asm.RFP, stackV4Dport, asm.R5, asm.Half),
		asm.Ja.Label("cfg"),
		asm.StoreMem(asm.RFP, stackV6Sport, asm.R4, asm.Half).WithSymbol("ports6"),
		asm.StoreMem(asm.RFP, stackV6Dport, asm.R5, asm.Half),
	)
	// From here on no packet pointer is used.
	insns = append(insns, lookupCfg("cfg", "next")...)
	insns = append(insns,
		asm.JEq.Imm(asm.R7, familyMarkerV6, "match6"),

		// IPv4: to the pod, not from the probe source.
		asm.LoadMem(asm.R2, asm.RFP, stackV4Dst, asm.Word),
		asm.LoadMem(asm.R3, asm.R0, cfgOffPodIPv4, asm.Word),
		asm.JNE.Reg32(asm.R2, asm.R3, "next"),
		asm.LoadMem(asm.R2, asm.RFP, stackTuple, asm.Word),
		asm.LoadMem(asm.R3, asm.R0, cfgOffProbeIPv4, asm.Word),
		asm.JEq.Reg32(asm.R2, asm.R3, "next"),
		asm.Ja.Label("established"),
	)
	// IPv6: to the pod or to a link-local address, not from the probe
	// source.
	insns = append(insns,
		asm.LoadMem(asm.R2, asm.RFP, stackV6Dst, asm.Word).WithSymbol("match6"),
		asm.And.Imm32(asm.R2, net32([4]byte{0xff, 0xc0, 0, 0})),
		asm.JEq.Imm32(asm.R2, net32([4]byte{0xfe, 0x80, 0, 0}), "probe6"),
	)
	insns = append(insns, jumpIfNotPodIPv6("pod6", asm.RFP, stackV6Dst, asm.R0, "next")...)
	for i := int16(0); i < 4; i++ {
		ins := asm.LoadMem(asm.R2, asm.RFP, stackTuple+4*i, asm.Word)
		if i == 0 {
			ins = ins.WithSymbol("probe6")
		}
		insns = append(insns,
			ins,
			asm.LoadMem(asm.R3, asm.R0, cfgOffProbeIPv6+4*i, asm.Word),
			asm.JNE.Reg32(asm.R2, asm.R3, "established"),
		)
	}
	insns = append(insns,
		asm.Ja.Label("next"),

		// A socket other than a listener owns the tuple already.
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("established"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stackTuple),
		asm.Mov.Reg(asm.R3, asm.R9),
		asm.Mov.Imm(asm.R4, currentNetns),
		asm.Mov.Imm(asm.R5, 0),
		asm.FnSkcLookupTcp.Call(),
		asm.JEq.Imm(asm.R0, 0, "capture"),
		asm.LoadMem(asm.R7, asm.R0, sockState, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R0),
		asm.FnSkRelease.Call(),
		asm.JNE.Imm(asm.R7, tcpListen, "next"),

		asm.Mov.Imm(asm.R9, int32(SlotInbound)).WithSymbol("capture"),
	)
	insns = append(insns, assignSlot("assign", "drop")...)
	insns = append(insns,
		asm.Mov.Imm(asm.R0, tcxPass),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcxDrop).WithSymbol("drop"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcxNext).WithSymbol("next"),
		asm.Return(),
	)
	return &ebpf.ProgramSpec{
		Name:         ProgInbound,
		Type:         ebpf.SchedCLS,
		AttachType:   ebpf.AttachTCXIngress,
		License:      license,
		Instructions: insns,
	}
}
