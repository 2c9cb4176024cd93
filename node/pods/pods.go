// Package pods keeps the set of pods this node proxy serves in step with ZDS
// (docs/wire-contract.md §3): each Add names a pod by its Kubernetes UID and
// workload info and hands over its netns. The pod's identity is the namespace
// and service account of that workload info, which the CNI agent read from
// the API server and hands over the node-local ZDS socket; never an IP
// lookup. The pod's workload from xDS (same namespace, service account and
// name) is used once it arrives. A snapshot ends with every pod neither added
// nor kept in it dropped.
package pods

import (
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/workloadapi"
	zdspb "github.com/canopy-mesh/canopy/workloadapi/zds"
)

// Workloads are the node-local workloads as xDS delivered them;
// *workloadtable.Table implements it.
type Workloads interface {
	NodeWorkloads(node string) []*workloadapi.Workload
}

// Certs keeps identities' certificates; *identity.Manager implements it.
type Certs interface {
	Add(id workloadapi.Identity)
	Remove(id workloadapi.Identity)
	// Has reports whether id has a usable certificate now.
	Has(id workloadapi.Identity) bool
}

// Server serves one pod's sockets; *proxy.Proxy implements it, and
// *dns.Server for the DNS sockets.
type Server interface {
	ServePod(pod *inpod.Pod, self *workloadapi.Workload)
}

// Servers serve a pod together, each its own sockets.
type Servers []Server

// ServePod implements Server.
func (ss Servers) ServePod(pod *inpod.Pod, self *workloadapi.Workload) {
	for _, s := range ss {
		s.ServePod(pod, self)
	}
}

// Pod is one served pod, for the admin port.
type Pod struct {
	UID   string
	Info  *zdspb.WorkloadInfo
	Self  *workloadapi.Workload
	State string // StateUp or StateWaiting
}

// Pod states.
const (
	StateUp = "Up"
	// StateWaiting: another node proxy (the one this one replaces)
	// serves the pod, and this one has no certificate for it yet.
	StateWaiting = "WaitingForCertificate"
)

// waitPoll is how often a waiting pod checks its certificate and the
// other proxy.
const waitPoll = 100 * time.Millisecond

// Set is the served pods; it implements zdsclient.Handler.
type Set struct {
	Node      string
	Workloads Workloads
	Certs     Certs
	Server    Server
	// Sockets are what is opened in each pod besides the proxy's three
	// listeners (the DNS sockets).
	Sockets inpod.Options
	Log     *slog.Logger
	// ClusterID and TrustDomain name a pod whose workload has not arrived
	// over xDS yet (see provisional).
	ClusterID, TrustDomain string

	mu       sync.Mutex
	served   map[string]*served
	snapshot map[string]bool // pods seen in the snapshot under way
	// synced: a snapshot has ended. refused: pods whose last Add failed
	// and that no later Add, Del or snapshot settled.
	synced  bool
	refused map[string]bool
}

type served struct {
	Pod
	pod *inpod.Pod
	id  workloadapi.Identity
	// gone closes when the pod stops being served (stop).
	gone chan struct{}
}

// provisional stands in for a pod's workload until xDS delivers it. A pod
// is enrolled during CNI ADD, before it has an IP, and the controller
// publishes pods only once they have one: waiting for the workload would
// wait forever. The identity comes from the CNI agent, which read the pod
// from the API server; the CA issues a certificate for it only while a
// pod with that namespace and service account runs on this node. The UID
// is the one the controller will publish, so per-connection lookups switch
// to the real workload as soon as it arrives.
func (s *Set) provisional(info *zdspb.WorkloadInfo) *workloadapi.Workload {
	return &workloadapi.Workload{
		Uid:            workloadapi.PodUID(s.ClusterID, info.GetNamespace(), info.GetName()),
		Name:           info.GetName(),
		Namespace:      info.GetNamespace(),
		ServiceAccount: info.GetServiceAccount(),
		TrustDomain:    s.TrustDomain,
		ClusterId:      s.ClusterID,
		Node:           s.Node,
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
	}
}

// self finds the pod's workload among the node's (wire contract §3.4): same
// namespace, service account and name. Another pod's workload is never taken
// for it, not even one with the same identity: a replaced pod's workload
// lingers until the controller removes it, and serving the new pod as the old
// would refuse its inbound traffic (its address differs).
func (s *Set) self(info *zdspb.WorkloadInfo) *workloadapi.Workload {
	sa := info.GetServiceAccount()
	if sa == "" {
		sa = "default"
	}
	for _, w := range s.Workloads.NodeWorkloads(s.Node) {
		wsa := w.GetServiceAccount()
		if wsa == "" {
			wsa = "default"
		}
		if w.GetNamespace() == info.GetNamespace() && wsa == sa && w.GetName() == info.GetName() {
			return w
		}
	}
	return nil
}

// Add implements zdsclient.Handler.
//
// A pod that another node proxy still serves (this one is its upgrade) is
// taken over only once this proxy holds the pod's certificate: until then
// its listeners stay closed, so every connection goes on to the old proxy,
// which can carry it. The Add is acknowledged at once; the pod waits
// (StateWaiting) and keeps the proxy not Ready, so the old proxy is not
// told to go. A pod nobody else serves is served at once, certificate or
// not: a closed listener would refuse its traffic anyway, and traffic that
// needs no certificate (to destinations outside the mesh) flows.
func (s *Set) Add(uid string, info *zdspb.WorkloadInfo, netns *os.File) error {
	self := s.self(info)
	if self == nil {
		self = s.provisional(info)
		s.Log.Debug("serving pod before its workload arrived over xDS", "uid", uid, "pod", info.GetNamespace()+"/"+info.GetName())
	}
	if s.keep(uid, info, netns) {
		return nil
	}
	pod := inpod.Attach(netns)
	id := workloadapi.WorkloadIdentity(self)
	s.Certs.Add(id)
	p := &served{Pod: Pod{UID: uid, Info: info, Self: self, State: StateUp}, pod: pod, id: id, gone: make(chan struct{})}
	wait := false
	if !s.Certs.Has(id) {
		held, err := pod.AnotherProxyListens()
		if err != nil {
			s.Log.Warn("cannot tell whether another node proxy serves the pod; serving it", "uid", uid, "err", err)
		}
		wait = held
	}
	if wait {
		p.State = StateWaiting
		s.put(uid, p)
		s.Log.Info("another node proxy serves the pod; taking it over once its certificate is here",
			"uid", uid, "pod", info.GetNamespace()+"/"+info.GetName(), "identity", id.String())
		go s.await(p)
		return nil
	}
	if err := pod.Listen(s.Sockets); err != nil {
		s.refuse(uid, p)
		return err
	}
	s.put(uid, p)
	s.Server.ServePod(pod, self)
	s.Log.Debug("serving pod", "uid", uid, "pod", info.GetNamespace()+"/"+info.GetName(), "identity", id.String())
	return nil
}

// put records p as the pod served under uid, replacing (and stopping) an
// earlier one.
func (s *Set) put(uid string, p *served) {
	s.mu.Lock()
	if s.served == nil {
		s.served = map[string]*served{}
	}
	delete(s.refused, uid)
	old := s.served[uid]
	s.served[uid] = p
	if s.snapshot != nil {
		s.snapshot[uid] = true
	}
	s.mu.Unlock()
	if old != nil {
		s.stop(old)
	}
}

// refuse records that uid could not be served and releases p.
func (s *Set) refuse(uid string, p *served) {
	_ = p.pod.Close()
	s.Certs.Remove(p.id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refused == nil {
		s.refused = map[string]bool{}
	}
	s.refused[uid] = true
	if s.snapshot != nil {
		// Seen: a pod served before under this UID keeps its listeners
		// rather than being dropped by the snapshot.
		s.snapshot[uid] = true
	}
}

// mayTakeOver reports whether a waiting pod may be served: its
// certificate is here, or no other proxy listens in it (or that cannot be
// told, as in Add).
func (s *Set) mayTakeOver(p *served) bool {
	if s.Certs.Has(p.id) {
		return true
	}
	held, err := p.pod.AnotherProxyListens()
	return err != nil || !held
}

// await serves a waiting pod once its certificate is here, or once the
// other proxy no longer listens in it (it went: the pod is served with
// what this proxy has). It ends early if the pod stops being served.
func (s *Set) await(p *served) {
	tick := time.NewTicker(waitPoll)
	defer tick.Stop()
	for !s.mayTakeOver(p) {
		select {
		case <-p.gone:
			return
		case <-tick.C:
		}
	}
	if err := p.pod.Listen(s.Sockets); err != nil {
		s.Log.Warn("cannot serve a pod taken over from another node proxy", "uid", p.UID, "err", err)
		s.mu.Lock()
		current := s.served[p.UID] == p
		if current {
			delete(s.served, p.UID)
		}
		s.mu.Unlock()
		if current {
			close(p.gone)
			s.refuse(p.UID, p)
		}
		return
	}
	s.mu.Lock()
	current := s.served[p.UID] == p
	if current {
		p.State = StateUp
	}
	s.mu.Unlock()
	if !current {
		_ = p.pod.Close() // stopped meanwhile; stop closed it too
		return
	}
	s.Server.ServePod(p.pod, p.Self)
	s.Log.Info("took the pod over from the other node proxy", "uid", p.UID, "identity", p.id.String())
}

// keep takes an Add of a pod already served in the same network namespace
// (a CNI agent that restarted hands over every pod again): its listeners
// stay, so nothing queued on them or in flight to them is disturbed, and
// the new handle is closed. It reports whether it took the Add.
func (s *Set) keep(uid string, info *zdspb.WorkloadInfo, netns *os.File) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.served[uid]
	if p == nil {
		return false
	}
	same, err := p.pod.Holds(netns)
	if err != nil {
		s.Log.Warn("cannot tell whether a pod's network namespace changed; serving it anew", "uid", uid, "err", err)
		return false
	}
	if !same {
		return false
	}
	_ = netns.Close()
	p.Info = info
	if s.snapshot != nil {
		s.snapshot[uid] = true
	}
	s.Log.Debug("pod handed over again in the same network namespace; keeping its listeners", "uid", uid)
	return true
}

// stop closes a pod's listeners (its open connections finish on their
// own sockets) and releases its identity.
func (s *Set) stop(p *served) {
	close(p.gone)
	_ = p.pod.Close()
	s.Certs.Remove(p.id)
}

// Keep implements zdsclient.Handler.
func (s *Set) Keep(uid string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snapshot == nil {
		s.snapshot = map[string]bool{}
	}
	s.snapshot[uid] = true
	return nil
}

// Snapshot implements zdsclient.Handler: pods not in the snapshot go.
func (s *Set) Snapshot() error {
	s.mu.Lock()
	var gone []*served
	for uid, p := range s.served {
		if s.snapshot == nil || !s.snapshot[uid] {
			gone = append(gone, p)
			delete(s.served, uid)
		}
	}
	for uid := range s.refused {
		if s.snapshot == nil || !s.snapshot[uid] {
			delete(s.refused, uid) // the agent no longer holds it
		}
	}
	s.synced = true
	s.snapshot = nil
	s.mu.Unlock()
	for _, p := range gone {
		s.stop(p)
	}
	return nil
}

// Begin starts tracking a new connection's snapshot.
func (s *Set) Begin() {
	s.mu.Lock()
	s.snapshot = map[string]bool{}
	s.mu.Unlock()
}

// Ready reports whether the set serves every pod the agent holds, as far
// as it knows: a snapshot has ended, no pod it was handed is left
// refused, and none waits for its certificate. A refused pod comes again only in a later snapshot (a new
// connection) or goes with its Del, so until then the proxy is not ready;
// during an upgrade that keeps the old proxy, which serves it, in place.
func (s *Set) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.synced || len(s.refused) > 0 {
		return false
	}
	for _, p := range s.served {
		if p.State != StateUp {
			return false
		}
	}
	return true
}

// Del implements zdsclient.Handler.
func (s *Set) Del(uid string) error {
	s.mu.Lock()
	p := s.served[uid]
	delete(s.served, uid)
	delete(s.refused, uid)
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	s.stop(p)
	return nil
}

// Pods returns the served pods.
func (s *Set) Pods() []Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Pod, 0, len(s.served))
	for _, p := range s.served {
		out = append(out, p.Pod)
	}
	return out
}

// Close stops serving every pod.
func (s *Set) Close() error {
	s.mu.Lock()
	all := s.served
	s.served = nil
	s.mu.Unlock()
	for _, p := range all {
		s.stop(p)
	}
	return nil
}
