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

// jumpIfNotPodIPv6 compares the 16 bytes at addr+off with the pod's IPv6
// in the Config that cfg points to, a word at a time, and jumps to differ
// at the first word that differs; it falls through when they are equal.
// The first instruction carries symbol. It clobbers R2 and R3.
func jumpIfNotPodIPv6(symbol string, addr asm.Register, off int16, cfg asm.Register, differ string) asm.Instructions {
	var insns asm.Instructions
	for i := int16(0); i < 4; i++ {
		ins := asm.LoadMem(asm.R2, addr, off+4*i, asm.Word)
		if i == 0 {
			ins = ins.WithSymbol(symbol)
		}
		insns = append(insns,
			ins,
			asm.LoadMem(asm.R3, cfg, cfgOffPodIPv6+4*i, asm.Word),
			asm.JNE.Reg32(asm.R2, asm.R3, differ),
		)
	}
	return insns
}
