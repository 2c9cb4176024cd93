package bpfprog

import "github.com/cilium/ebpf/asm"

// stackKey is the stack slot of the u32 map key, in both programs.
const stackKey = -4

// lookupCfg looks up the pod's Config, leaving a pointer to it in R0, and
// jumps to missing if the cfg map has no entry (never, for an Array; the
// verifier wants the check). The first instruction carries symbol. It
// clobbers R1 to R5 and the key slot.
func lookupCfg(symbol, missing string) asm.Instructions {
	return asm.Instructions{
		asm.StoreImm(asm.RFP, stackKey, 0, asm.Word).WithSymbol(symbol),
		asm.LoadMapPtr(asm.R1, 0).WithReference(MapCfg),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stackKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, missing),
	}
}

// assignSlot assigns the proxy socket in the socks slot held in R9 to the
// lookup or packet whose context is in R6, and falls through; it jumps to
// fail if the slot is empty or the kernel refuses the assignment. The
// socket a map lookup returns holds a reference, released on both paths.
// The first instruction carries symbol. It clobbers R0 to R5, R7, R8 and
// the key slot.
func assignSlot(symbol, fail string) asm.Instructions {
	return asm.Instructions{
		asm.StoreMem(asm.RFP, stackKey, asm.R9, asm.Word).WithSymbol(symbol),
		asm.LoadMapPtr(asm.R1, 0).WithReference(MapSocks),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stackKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, fail),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R2, asm.R7),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnSkAssign.Call(),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.FnSkRelease.Call(),
		asm.JNE.Imm(asm.R8, 0, fail),
	}
}
