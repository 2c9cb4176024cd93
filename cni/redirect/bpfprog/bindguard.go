package bpfprog

import (
	"fmt"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
)

// Names of the bind guard's programs and maps (BindGuardSpec). The
// programs' names are also the kernel's (bpftool shows them).
const (
	ProgBindGuard4 = "canopy_bind4"
	ProgBindGuard6 = "canopy_bind6"
	// MapGuardedNetns holds the network namespaces the guard applies in:
	// key the namespace's cookie (SO_NETNS_COOKIE, never reused while
	// the node runs), value its inode (GuardedNetns), which tells the
	// agent which entries are of namespaces gone.
	MapGuardedNetns = "guarded"
	// MapProxies holds the node proxies allowed to bind there, one
	// ProxyID per slot.
	MapProxies = "proxies"
)

// GuardedPorts are the node proxy's ports inside an ambient pod
// (node/inpod: 15001, 15006, 15008, 15053, TCP and UDP): the ports its
// redirection delivers to. Nothing else of the proxy's listens in a pod;
// its 15000, 15020 and 15021 are in its own namespace.
func GuardedPorts() []uint16 { return []uint16{15001, 15006, 15008, 15053} }

// ProxySlots is how many node proxies can be allowed at once: two during
// an upgrade, a third while a crashed one is replaced, and room to spare.
const ProxySlots = 8

// ProxyID names a node proxy as the kernel can check it on the caller of
// bind(): its PID namespace (the device and inode of /proc/<pid>/ns/pid,
// the device as the kernel encodes a dev_t) and its thread-group ID as
// seen in that namespace. bpf_get_ns_current_pid_tgid answers for the
// calling task only when it is in that namespace, so a process of a pod,
// which has its own PID namespace, never matches a proxy's ID whatever
// its PID. HostPID and StartTime are for the agent's bookkeeping (the
// program reads neither): the PID as the agent sees it, and when the
// process started (/proc/<pid>/stat), which tells a proxy from a later
// process given the same PID. A zero PidnsIno is an empty slot.
type ProxyID struct {
	PidnsDev  uint64
	PidnsIno  uint64
	Tgid      uint32
	HostPID   uint32
	StartTime uint64
}

// GuardedNetns is the value of MapGuardedNetns.
type GuardedNetns struct {
	Inode uint64
}

// Offsets the program reads.
const (
	proxyOffDev    = 0
	proxyOffIno    = 8
	proxyOffTgid   = 16
	proxyIDSize    = 32
	sockAddrPort   = 24 // struct bpf_sock_addr.user_port, network byte order
	pidnsInfoSize  = 8  // struct bpf_pidns_info {u32 pid, tgid}
	pidnsInfoTgid  = 4
	stackCookie    = -8
	stackSlot      = -12
	stackPidnsInfo = -24
	bindAllow      = 1
	bindDeny       = 0
)

var _ = [1]struct{}{}[unsafe.Offsetof(ProxyID{}.PidnsIno)-proxyOffIno]
var _ = [1]struct{}{}[unsafe.Offsetof(ProxyID{}.Tgid)-proxyOffTgid]
var _ = [1]struct{}{}[unsafe.Sizeof(ProxyID{})-proxyIDSize]

// bindGuardInsns is the bind guard, the same for both families (struct
// bpf_sock_addr has the port at the same offset for bind4 and bind6):
//
//   - a bind to a port that is not one of GuardedPorts is allowed at once:
//     this runs for every bind() on the node, so that test comes first;
//   - so is a bind in a network namespace not in MapGuardedNetns (the
//     node's, a pod outside the mesh, a sidecar pod whose Envoy binds
//     these ports itself);
//   - otherwise it is allowed only to a task of a ProxyID of MapProxies,
//     and refused (EPERM) to anyone else, root or not, whatever its
//     capabilities, SO_REUSEPORT or user ID.
//
// A bind to port 0 (the kernel picks one) is not a guarded port; the
// kernel's pick never lands on one because the agent reserves them
// (net.ipv4.ip_local_reserved_ports) in every guarded namespace, which is
// also what covers listen(), connect() and sendto() on an unbound socket:
// those pick a port without calling the bind hook.
func bindGuardInsns() asm.Instructions {
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, sockAddrPort, asm.Word),
	}
	for _, p := range GuardedPorts() {
		insns = append(insns, asm.JEq.Imm(asm.R2, net16(p), "guarded_port"))
	}
	insns = append(insns,
		asm.Ja.Label("allow"),

		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("guarded_port"),
		asm.FnGetNetnsCookie.Call(),
		asm.StoreMem(asm.RFP, stackCookie, asm.R0, asm.DWord),
		asm.LoadMapPtr(asm.R1, 0).WithReference(MapGuardedNetns),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stackCookie),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "allow"),
	)
	// The slots, unrolled: R7 holds the slot's ProxyID across the
	// helper call.
	for i := range ProxySlots {
		next := fmt.Sprintf("slot_%d", i+1)
		if i == ProxySlots-1 {
			next = "deny"
		}
		ins := asm.StoreImm(asm.RFP, stackSlot, int64(i), asm.Word)
		if i > 0 {
			ins = ins.WithSymbol(fmt.Sprintf("slot_%d", i))
		}
		insns = append(insns,
			ins,
			asm.LoadMapPtr(asm.R1, 0).WithReference(MapProxies),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, stackSlot),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "deny"),
			asm.Mov.Reg(asm.R7, asm.R0),
			asm.LoadMem(asm.R2, asm.R7, proxyOffIno, asm.DWord),
			asm.JEq.Imm(asm.R2, 0, next),
			asm.LoadMem(asm.R1, asm.R7, proxyOffDev, asm.DWord),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, stackPidnsInfo),
			asm.Mov.Imm(asm.R4, pidnsInfoSize),
			asm.FnGetNsCurrentPidTgid.Call(),
			asm.JNE.Imm(asm.R0, 0, next),
			asm.LoadMem(asm.R2, asm.RFP, stackPidnsInfo+pidnsInfoTgid, asm.Word),
			asm.LoadMem(asm.R3, asm.R7, proxyOffTgid, asm.Word),
			asm.JEq.Reg(asm.R2, asm.R3, "allow"),
		)
	}
	insns = append(insns,
		asm.Mov.Imm(asm.R0, bindDeny).WithSymbol("deny"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, bindAllow).WithSymbol("allow"),
		asm.Return(),
	)
	return insns
}

// BindGuardSpec returns the bind guard's maps and its two programs
// (cgroup/bind4 and cgroup/bind6, keyed by ProgBindGuard4 and
// ProgBindGuard6), ready for ebpf.NewCollection. The agent attaches both
// to the root of the node's cgroup2 hierarchy, where they apply to every
// process of the node and no pod can detach them.
func BindGuardSpec() *ebpf.CollectionSpec {
	prog := func(name string, attach ebpf.AttachType) *ebpf.ProgramSpec {
		return &ebpf.ProgramSpec{
			Name:         name,
			Type:         ebpf.CGroupSockAddr,
			AttachType:   attach,
			License:      license,
			Instructions: bindGuardInsns(),
		}
	}
	return &ebpf.CollectionSpec{
		Maps: BindGuardMapSpecs(),
		Programs: map[string]*ebpf.ProgramSpec{
			ProgBindGuard4: prog(ProgBindGuard4, ebpf.AttachCGroupInet4Bind),
			ProgBindGuard6: prog(ProgBindGuard6, ebpf.AttachCGroupInet6Bind),
		},
		ByteOrder: byteOrder(),
	}
}

// GuardedNetnsMax bounds the guarded namespaces: far above the pods a
// node runs (Kubernetes' limit is 110 by default, some run a few
// hundred).
const GuardedNetnsMax = 16384

// BindGuardMapSpecs returns new specs of the bind guard's maps, keyed by
// MapGuardedNetns and MapProxies.
func BindGuardMapSpecs() map[string]*ebpf.MapSpec {
	return map[string]*ebpf.MapSpec{
		MapGuardedNetns: {
			Name:       "canopy_guarded",
			Type:       ebpf.Hash,
			KeySize:    8,
			ValueSize:  uint32(unsafe.Sizeof(GuardedNetns{})),
			MaxEntries: GuardedNetnsMax,
		},
		MapProxies: {
			Name:       "canopy_proxies",
			Type:       ebpf.Array,
			KeySize:    4,
			ValueSize:  proxyIDSize,
			MaxEntries: ProxySlots,
		},
	}
}

// ProbeBindGuard reports whether the running kernel can run the bind
// guard: cgroup sock_addr programs with bpf_get_netns_cookie (Linux 5.7)
// and bpf_get_ns_current_pid_tgid (allowed in every program type since
// 6.10). Without them the agent refuses to enroll ambient pods, naming
// what is missing: their node proxy's ports could be taken by the pod.
func ProbeBindGuard() error {
	if err := features.HaveProgramType(ebpf.CGroupSockAddr); err != nil {
		return guardMissing("the cgroup sock_addr program type", err)
	}
	for _, h := range []struct {
		fn   asm.BuiltinFunc
		what string
	}{
		{asm.FnGetNetnsCookie, "bpf_get_netns_cookie"},
		{asm.FnGetNsCurrentPidTgid, "bpf_get_ns_current_pid_tgid"},
		{asm.FnMapLookupElem, "bpf_map_lookup_elem"},
	} {
		if err := features.HaveProgramHelper(ebpf.CGroupSockAddr, h.fn); err != nil {
			return guardMissing(h.what+" in cgroup sock_addr programs", err)
		}
	}
	return nil
}

func guardMissing(what string, err error) error {
	return fmt.Errorf("guarding the node proxy's ports in pods needs %s (Linux 6.10 or later): %w", what, err)
}
