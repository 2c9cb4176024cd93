package bpfprog

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

func TestProbe(t *testing.T) {
	loadCollection(t) // root, or skip
	// This kernel runs the programs (TestLoad), so Probe must agree.
	if err := Probe(); err != nil {
		t.Fatalf("Probe: %v", err)
	}
}

func TestIsOurs(t *testing.T) {
	coll := loadCollection(t)
	specs := map[string]*ebpf.ProgramSpec{ProgSkLookup: SkLookupSpec(), ProgInbound: InboundSpec()}
	// A program of Canopy's name and type but other instructions.
	stranger := InboundSpec()
	stranger.Instructions = asm.Instructions{asm.Mov.Imm(asm.R0, tcxNext), asm.Return()}
	strangerProg, err := ebpf.NewProgram(stranger)
	if err != nil {
		t.Fatal(err)
	}
	defer strangerProg.Close()

	loaded := map[string]*ebpf.Program{
		ProgSkLookup: coll.Programs[ProgSkLookup],
		ProgInbound:  coll.Programs[ProgInbound],
		"stranger":   strangerProg,
	}
	for specName, spec := range specs {
		for progName, prog := range loaded {
			info, err := prog.Info()
			if err != nil {
				t.Fatal(err)
			}
			got, err := IsOurs(spec, info)
			if err != nil {
				t.Fatalf("IsOurs(%s, %s): %v", specName, progName, err)
			}
			if want := specName == progName; got != want {
				t.Errorf("IsOurs(%s, %s) = %v, want %v", specName, progName, got, want)
			}
		}
	}

	// The spec is left as it was: a caller may load it afterwards.
	spec := InboundSpec()
	info, err := coll.Programs[ProgInbound].Info()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := IsOurs(spec, info); err != nil {
		t.Fatal(err)
	}
	for i, ins := range spec.Instructions {
		if ins.OpCode.Class().IsJump() && ins.Reference() != "" && ins.Offset != -1 {
			t.Fatalf("instruction %d: jump to %s resolved in the caller's spec (offset %d)", i, ins.Reference(), ins.Offset)
		}
	}
}
