package proxy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/canopy-mesh/canopy/node/authz"
	"github.com/canopy-mesh/canopy/workloadapi"
	"github.com/canopy-mesh/canopy/workloadapi/security"
)

// live is an open inbound connection, kept so that a change of policy
// or of the pod's workload re-authorizes it: a connection opened under
// policies that no longer allow it is closed, as Istio's node proxy does,
// rather than carrying requests for as long as the client keeps it.
type live struct {
	self      *workloadapi.Workload // the destination pod, as served
	conn      authz.Conn
	authority string
	close     func()
	revoked   atomic.Bool
}

// liveSet is the proxy's open inbound connections.
type liveSet struct {
	mu sync.Mutex
	m  map[*live]struct{}
}

// track registers l and re-checks it at once (the policies may have
// changed since it was admitted); the returned func forgets it.
func (p *Proxy) track(l *live) (untrack func()) {
	p.live.mu.Lock()
	if p.live.m == nil {
		p.live.m = map[*live]struct{}{}
	}
	p.live.m[l] = struct{}{}
	p.live.mu.Unlock()
	p.reauthorize(l, p.Table.Policies())
	return func() {
		p.live.mu.Lock()
		delete(p.live.m, l)
		p.live.mu.Unlock()
	}
}

// Reauthorize evaluates every open inbound connection against the
// policies held now and closes those no longer allowed; it returns how
// many it closed.
func (p *Proxy) Reauthorize() int {
	p.live.mu.Lock()
	all := make([]*live, 0, len(p.live.m))
	for l := range p.live.m {
		all = append(all, l)
	}
	p.live.mu.Unlock()
	policies := p.Table.Policies()
	// A pod's applicable policies are worked out once per pass, not once
	// per connection: a busy pod holds thousands.
	applicable := map[*workloadapi.Workload][]*security.Authorization{}
	closed := 0
	for _, l := range all {
		self := p.current(l.self)
		pols, ok := applicable[self]
		if !ok {
			pols = authz.Applicable(policies, self)
			applicable[self] = pols
		}
		if p.revokeUnless(l, self, pols) {
			closed++
		}
	}
	return closed
}

// reauthorize closes l if the policies no longer allow it.
func (p *Proxy) reauthorize(l *live, policies []*security.Authorization) bool {
	self := p.current(l.self)
	return p.revokeUnless(l, self, authz.Applicable(policies, self))
}

// revokeUnless closes l unless applicable, self's policies, allow it.
func (p *Proxy) revokeUnless(l *live, self *workloadapi.Workload, applicable []*security.Authorization) bool {
	d := authz.Evaluate(applicable, l.conn)
	if d.Allow || !l.revoked.CompareAndSwap(false, true) {
		return false
	}
	p.Log.Info("open connection no longer allowed: closed",
		"src", l.conn.Src.String(), "dst", l.authority, "dst_workload", podName(self),
		"policy", d.Policy, "reason", d.Reason)
	l.close()
	return true
}

// Run re-authorizes open connections each time the table changes, and
// sweeps the connection pool every minute, until ctx ends.
func (p *Proxy) Run(ctx context.Context) {
	sweep := time.NewTicker(time.Minute)
	defer sweep.Stop()
	for {
		changed := p.Table.Changed()
		select {
		case <-ctx.Done():
			return
		case <-changed:
			p.Reauthorize()
		case <-sweep.C:
			p.pool.sweep()
		}
	}
}
