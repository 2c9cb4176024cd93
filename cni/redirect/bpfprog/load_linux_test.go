package bpfprog

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/canopy-mesh/canopy/internal/testing/nettest"
)

// loadCollection loads the maps and both programs, failing the test with
// the verifier's log if the kernel refuses them.
func loadCollection(t *testing.T) *ebpf.Collection {
	t.Helper()
	nettest.NeedRoot(t)
	coll, err := ebpf.NewCollection(CollectionSpec())
	if err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			t.Fatalf("load: %+v", verr)
		}
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { coll.Close() })
	return coll
}

func TestLoad(t *testing.T) {
	coll := loadCollection(t)
	for name, spec := range CollectionSpec().Programs {
		t.Logf("%s: %d instructions, %d slots", name, len(spec.Instructions), spec.Instructions.Size()/asm.InstructionSize)
		if coll.Programs[name] == nil {
			t.Errorf("program %s not loaded", name)
		}
	}
}
