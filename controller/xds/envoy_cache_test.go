package xds

import (
	"errors"
	"testing"

	"github.com/canopy-mesh/canopy/controller/sidecar"
)

type emptySource struct{}

func key(share string) cacheKey { return cacheKey{sidecar: true, typ: "t", share: share} }

func (emptySource) SidecarInputs() sidecar.Inputs { return sidecar.Inputs{} }

// depsGen is a Generator whose DepsOf answers from a table, by the Reads
// a generation recorded.
type depsGen struct{ deps map[*sidecar.Reads]string }

func (depsGen) GRPCShares(sidecar.Proxy, string, []string) []sidecar.Share    { return nil }
func (depsGen) SidecarShares(sidecar.Proxy, string, []string) []sidecar.Share { return nil }
func (g depsGen) DepsOf(r *sidecar.Reads) string                              { return g.deps[r] }

// TestGenerationTakesOverUnchangedShares: a generation takes the previous
// generation's entry of a share whose recorded reads its own Mesh finds
// unchanged, and only of the previous one; never one still being
// generated or one that failed.
func TestGenerationTakesOverUnchangedShares(t *testing.T) {
	gens := []depsGen{{map[*sidecar.Reads]string{}}, {map[*sidecar.Reads]string{}}, {map[*sidecar.Reads]string{}}}
	next := 0
	c := &meshCache{src: emptySource{}, build: func(sidecar.Inputs) Generator { g := gens[next]; next++; return g }}
	reads := map[string]*sidecar.Reads{}
	fill := func(g *generation, name, deps string, err error) *cached {
		e, _ := g.entry(key(name))
		e.fill(g.mesh, func(r *sidecar.Reads) ([]*Resource, error) {
			reads[name] = r
			g.mesh.(depsGen).deps[r] = deps
			return nil, err
		})
		return e
	}
	g1 := c.get(1)
	kept, changed := fill(g1, "outbound", "d", nil), fill(g1, "endpoints", "old", nil)
	older, failed := fill(g1, "older", "d", nil), fill(g1, "failed", "d", errors.New("boom"))
	pending, _ := g1.entry(key("pending"))
	for name, deps := range map[string]string{"outbound": "d", "endpoints": "new", "older": "d", "failed": "d"} {
		gens[1].deps[reads[name]] = deps
	}
	g2 := c.get(2)
	if e, taken := g2.entry(key("outbound")); e != kept || !taken {
		t.Error("what it read is unchanged: not taken over")
	}
	if e, taken := g2.entry(key("endpoints")); e == changed || taken {
		t.Error("what it read changed: taken over")
	}
	if e, _ := g2.entry(key("failed")); e == failed {
		t.Error("a failed generation: taken over")
	}
	if e, _ := g2.entry(key("pending")); e == pending {
		t.Error("an entry still being generated: taken over")
	}
	if e, taken := g2.entry(key("outbound")); e != kept || taken {
		t.Error("the generation's own entry: not its own")
	}
	gens[2].deps[reads["outbound"]], gens[2].deps[reads["older"]] = "d", "d"
	g3 := c.get(3)
	if e, _ := g3.entry(key("outbound")); e != kept {
		t.Error("a share taken over is not handed on")
	}
	if e, _ := g3.entry(key("older")); e == older {
		t.Error("two generations back: taken over")
	}
}
