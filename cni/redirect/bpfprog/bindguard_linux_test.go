package bpfprog

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/canopy-mesh/canopy/internal/testing/ci"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// TestBindGuardLoads: the kernel's verifier accepts both programs. What
// they decide is tested where they are attached (cni/redirect's
// guard tests): cgroup sock_addr programs have no test run.
func TestBindGuardLoads(t *testing.T) {
	nettest.NeedRoot(t)
	if err := ProbeBindGuard(); err != nil {
		ci.Unavailable(t, "%v", err)
	}
	coll, err := ebpf.NewCollection(BindGuardSpec())
	if err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			t.Fatalf("load: %+v", verr)
		}
		t.Fatalf("load: %v", err)
	}
	defer coll.Close()
	for name, spec := range BindGuardSpec().Programs {
		t.Logf("%s: %d instructions", name, spec.Instructions.Size()/asm.InstructionSize)
		p := coll.Programs[name]
		if p == nil {
			t.Fatalf("program %s not loaded", name)
		}
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := IsOurs(spec, info); err != nil || !ok {
			t.Errorf("IsOurs(%s) = %v, %v; want true", name, ok, err)
		}
	}
}
