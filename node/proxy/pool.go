package proxy

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/canopy-mesh/canopy/node/hbone"
	"github.com/canopy-mesh/canopy/workloadapi"
)

// poolKey is the pool key of wire contract §5.3: who connects, to whom,
// where.
type poolKey struct {
	src, dst workloadapi.Identity
	addr     string
}

// pool reuses HBONE connections, up to maxStreams streams each, and
// drops those idle for idleTimeout.
type pool struct {
	maxStreams  int
	idleTimeout time.Duration
	mu          sync.Mutex
	conns       map[poolKey][]*hbone.ClientConn
}

func newPool() *pool {
	return &pool{maxStreams: 100, idleTimeout: 5 * time.Minute, conns: map[poolKey][]*hbone.ClientConn{}}
}

// get returns a usable connection for k, dialing one with dial if none.
// A new connection runs under lim.
func (p *pool) get(ctx context.Context, k poolKey, lim hbone.Limits, dial func(context.Context) (net.Conn, error)) (*hbone.ClientConn, error) {
	p.mu.Lock()
	kept := p.conns[k][:0]
	var found *hbone.ClientConn
	for _, c := range p.conns[k] {
		if !p.keep(c) {
			continue
		}
		kept = append(kept, c)
		if found == nil && c.Streams() < p.maxStreams {
			found = c
		}
	}
	p.conns[k] = kept
	p.mu.Unlock()
	if found != nil {
		return found, nil
	}
	nc, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	c, err := hbone.NewClientConnWith(nc, lim)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.conns[k] = append(p.conns[k], c)
	p.mu.Unlock()
	return c, nil
}

// sweep drops the connections that ended or idled out under every key:
// get only tidies the key it is asked for, and a destination never
// called again would keep its entries.
func (p *pool) sweep() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, cs := range p.conns {
		kept := cs[:0]
		for _, c := range cs {
			if !p.keep(c) {
				continue
			}
			kept = append(kept, c)
		}
		if len(kept) == 0 {
			delete(p.conns, k)
		} else {
			p.conns[k] = kept
		}
	}
}

// keep reports whether c stays in the pool, and lets go of it if not. A
// connection that can take no new stream (the peer sent GOAWAY: it is
// draining, a restarting proxy) still carries the streams the peer kept,
// and is closed only once they have ended; one idle too long is closed.
func (p *pool) keep(c *hbone.ClientConn) bool {
	switch {
	case !c.Usable():
		c.CloseWhenIdle()
		return false
	case c.IdleFor() > p.idleTimeout:
		_ = c.Close()
		return false
	}
	return true
}

func (p *pool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cs := range p.conns {
		for _, c := range cs {
			_ = c.Close()
		}
	}
	p.conns = map[poolKey][]*hbone.ClientConn{}
}
