package bpfprog

import (
	"errors"
	"fmt"
	"math"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
)

// Probe reports whether the running kernel can run these programs: the
// sk_lookup program type (Linux 5.9), bpf_sk_assign from tc (5.7) and tcx
// links (6.6). The error names what is missing; the agent then stays with
// the nftables backend. Results of the program probes are cached by the
// features package; the tcx probe loads a two-instruction program.
func Probe() error {
	if err := features.HaveProgramType(ebpf.SkLookup); err != nil {
		return missing("the sk_lookup program type", err)
	}
	if err := features.HaveProgramHelper(ebpf.SkLookup, asm.FnSkAssign); err != nil {
		return missing("bpf_sk_assign in sk_lookup programs", err)
	}
	if err := features.HaveProgramHelper(ebpf.SchedCLS, asm.FnSkAssign); err != nil {
		return missing("bpf_sk_assign in tc programs", err)
	}
	if err := features.HaveProgramHelper(ebpf.SchedCLS, asm.FnSkcLookupTcp); err != nil {
		return missing("bpf_skc_lookup_tcp in tc programs", err)
	}
	if err := features.HaveMapType(ebpf.SockMap); err != nil {
		return missing("the SOCKMAP map type", err)
	}
	if err := probeTCX(); err != nil {
		return missing("tcx links", err)
	}
	return nil
}

func missing(what string, err error) error {
	return fmt.Errorf("eBPF redirection needs %s, use the nftables backend instead: %w", what, err)
}

// probeTCX attaches a program to an interface index that cannot exist: a
// kernel with tcx links says ENODEV, an older one does not know the attach
// type, which link.AttachTCX reports as ebpf.ErrNotSupported.
func probeTCX() error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:       ebpf.SchedCLS,
		AttachType: ebpf.AttachTCXIngress,
		License:    license,
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, tcxNext),
			asm.Return(),
		},
	})
	if err != nil {
		return fmt.Errorf("load a tc program: %w", err)
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxUint32, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err == nil {
		l.Close()
		return errors.New("attaching to a nonexistent interface succeeded")
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		return err
	}
	return nil
}
