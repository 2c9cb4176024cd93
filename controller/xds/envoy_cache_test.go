package xds

import (
	"testing"

	"github.com/canopy-mesh/canopy/controller/sidecar"
)

type emptySource struct{}

func key(share string) cacheKey { return cacheKey{sidecar: true, typ: "t", share: share} }

func (emptySource) SidecarInputs() sidecar.Inputs { return sidecar.Inputs{} }

// TestGenerationTakesOverUnchangedShares: a generation takes the previous
// generation's entry of a share with the same key and Deps, and only of
// the previous one; a share without Deps is always its own.
func TestGenerationTakesOverUnchangedShares(t *testing.T) {
	c := &meshCache{src: emptySource{}, build: func(sidecar.Inputs) Generator { return nil }}
	g1 := c.get(1)
	kept, changed, own, older := g1.entry(key("outbound"), "deps"), g1.entry(key("endpoints"), "old"), g1.entry(key("inbound"), ""), g1.entry(key("older"), "deps")
	g2 := c.get(2)
	if g2.entry(key("outbound"), "deps") != kept {
		t.Error("same key and deps: not taken over")
	}
	if g2.entry(key("endpoints"), "new") == changed {
		t.Error("other deps: taken over")
	}
	if g2.entry(key("inbound"), "") == own {
		t.Error("a share without deps: taken over")
	}
	g3 := c.get(3)
	if g3.entry(key("outbound"), "deps") != kept {
		t.Error("a share taken over is not handed on")
	}
	if g3.entry(key("older"), "deps") == older {
		t.Error("two generations back: taken over")
	}
}
