package bpfprog

import (
	"errors"
	"fmt"
	"io"

	"github.com/cilium/ebpf"
)

// IsOurs reports whether a loaded program runs the instructions of spec
// (SkLookupSpec or InboundSpec), for a Verify that finds a program attached
// to a pod and must tell ours, possibly of another Canopy version, from a
// stranger's. It compares the kernel's tag with one computed from the spec;
// map references do not take part, so programs loaded against other maps
// still match.
//
// The spec's jumps are labels until the instructions are marshalled, and a
// tag over unresolved offsets would never match, so a copy is marshalled
// first.
func IsOurs(spec *ebpf.ProgramSpec, info *ebpf.ProgramInfo) (bool, error) {
	c := spec.Copy()
	if err := c.Instructions.Marshal(io.Discard, byteOrder()); err != nil {
		return false, fmt.Errorf("resolve program %s: %w", spec.Name, err)
	}
	err := c.Compatible(info)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ebpf.ErrProgIncompatible):
		return false, nil
	default:
		return false, fmt.Errorf("compare program %s with loaded program %s: %w", spec.Name, info.Name, err)
	}
}
