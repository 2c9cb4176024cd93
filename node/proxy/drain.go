package proxy

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/canopy-mesh/canopy/node/hbone"
	"github.com/canopy-mesh/canopy/node/inpod"
)

// Kinds of accepted connection, by the listener that took it.
const (
	kindOutbound = "outbound"          // 15001
	kindInbound  = "inbound_plaintext" // 15006
	kindHBONE    = "hbone"             // 15008, one per TCP connection whatever its streams
)

// reasonDrainOver: the drain period ended with the connection still open
// (canopy_node_connections_cut_total).
const reasonDrainOver = "drain_period_over"

// cutWait bounds the wait, after the drain period, for the handlers of the
// connections just closed to return: closing a connection ends its relay
// at once, so this is only a bound on a hang.
const cutWait = time.Second

// servedPod is a pod whose listeners ServePod serves; accepting counts
// its running accept loops.
type servedPod struct {
	pod       *inpod.Pod
	accepting sync.WaitGroup
}

// openSet is the accepted connections whose handlers still run, with
// their kind; safe for concurrent use.
type openSet struct {
	mu sync.Mutex
	m  map[net.Conn]string
	// idle, when set, is closed by the removal that empties the set.
	idle chan struct{}
}

func (o *openSet) add(c net.Conn, kind string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[net.Conn]string{}
	}
	o.m[c] = kind
}

func (o *openSet) remove(c net.Conn) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, c)
	if len(o.m) == 0 && o.idle != nil {
		close(o.idle)
		o.idle = nil
	}
}

func (o *openSet) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.m)
}

// wait returns true once the set is empty, false if ctx ends first.
func (o *openSet) wait(ctx context.Context) bool {
	o.mu.Lock()
	if len(o.m) == 0 {
		o.mu.Unlock()
		return true
	}
	if o.idle == nil {
		o.idle = make(chan struct{})
	}
	idle := o.idle
	o.mu.Unlock()
	select {
	case <-idle:
		return true
	case <-ctx.Done():
		return false
	}
}

// cut closes every connection in the set and counts them by kind.
func (o *openSet) cut() map[string]int {
	o.mu.Lock()
	all := make(map[net.Conn]string, len(o.m))
	for c, k := range o.m {
		all[c] = k
	}
	o.mu.Unlock()
	n := map[string]int{}
	for c, k := range all {
		n[k]++
		_ = c.Close()
	}
	return n
}

// Drained is what a Drain saw.
type Drained struct {
	// Pods is how many pods' listeners it closed; NoMigration how many
	// of them are in a namespace that does not migrate queued connections
	// (inpod.Pod.MigratesRequests), whose queues the kernel reset.
	Pods, NoMigration int
	// Open is the accepted connections still open once the listeners
	// were closed: those the drain waited for.
	Open int
	// Cut is, by kind, those still open when the drain period ended,
	// which Drain closed.
	Cut map[string]int
}

// CutTotal is the number of connections Drain closed.
func (d Drained) CutTotal() int {
	n := 0
	for _, v := range d.Cut {
		n += v
	}
	return n
}

// Drain is the proxy's part of stopping (SIGTERM), for a hand-over to
// another proxy serving the same pods (node/README.md, "Upgrades"):
//
//  1. It stops accepting: every served pod's listeners close. What the
//     kernel had queued for them goes to the other proxy's listeners on
//     the same ports where the pod's namespace migrates requests (the CNI
//     agent's net.ipv4.tcp_migrate_req), and is reset where it does not.
//     A pod served after this is not served at all.
//  2. Every inbound HBONE connection gets GOAWAY: the peer opens its next
//     streams on a new connection, which the other proxy accepts. Each
//     closes once its last stream ends.
//  3. The connections already accepted, either way and on every
//     listener, are carried as usual (policies still re-checked while Run
//     runs) until they end or ctx ends, whichever is first.
//  4. When ctx ends, those still open are closed, counted in
//     canopy_node_connections_cut_total{reason="drain_period_over"} and
//     logged with their number.
//
// Nothing accepted is closed by Drain before ctx ends. It returns when
// every connection has ended or been cut.
func (p *Proxy) Drain(ctx context.Context) Drained {
	p.mu.Lock()
	p.draining = true
	pods := make([]*servedPod, 0, len(p.pods))
	for sp := range p.pods {
		pods = append(pods, sp)
	}
	hbones := make([]*hbone.ServerConn, 0, len(p.inbound))
	for sc := range p.inbound {
		hbones = append(hbones, sc)
	}
	p.mu.Unlock()

	d := Drained{Pods: len(pods)}
	for _, sp := range pods {
		// Read before closing, for the log: what the kernel does with
		// the queue happens at the close.
		if on, err := sp.pod.MigratesRequests(); err == nil && !on {
			d.NoMigration++
		}
		if err := sp.pod.CloseListeners(); err != nil {
			p.Log.Warn("cannot close a pod's listeners", "err", err)
		}
	}
	// Every connection a listener returned is in p.open once its accept
	// loop is over.
	for _, sp := range pods {
		sp.accepting.Wait()
	}
	for _, sc := range hbones {
		// Each on its own: a peer that does not read holds the write of
		// its GOAWAY up to the HBONE write timeout.
		go sc.GoAway()
	}
	d.Open = p.open.len()
	p.Log.Info("draining: no longer accepting", "pods", d.Pods, "open_connections", d.Open)
	if d.NoMigration > 0 {
		p.Log.Warn("pods whose namespace does not migrate queued connections (net.ipv4.tcp_migrate_req off or missing): what was queued on this proxy's listeners was reset",
			"pods", d.NoMigration)
	}
	if p.open.wait(ctx) {
		p.Log.Info("drained: every connection ended")
		return d
	}
	streams := 0
	p.mu.Lock()
	for sc := range p.inbound {
		streams += sc.Streams()
	}
	p.mu.Unlock()
	d.Cut = p.open.cut()
	total := d.CutTotal()
	p.metrics.cut.WithLabelValues(reasonDrainOver).Add(float64(total))
	p.Log.Warn("drain period over: open connections closed", "reason", reasonDrainOver, "connections", total,
		kindOutbound, d.Cut[kindOutbound], kindInbound, d.Cut[kindInbound], kindHBONE, d.Cut[kindHBONE], "hbone_streams", streams)
	wctx, cancel := context.WithTimeout(context.Background(), cutWait)
	defer cancel()
	if !p.open.wait(wctx) {
		p.Log.Warn("connections still open after they were closed", "connections", p.open.len())
	}
	return d
}
