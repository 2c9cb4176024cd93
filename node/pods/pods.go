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
	State string // "Up"
}

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
func (s *Set) Add(uid string, info *zdspb.WorkloadInfo, netns *os.File) error {
	self := s.self(info)
	if self == nil {
		self = s.provisional(info)
		s.Log.Debug("serving pod before its workload arrived over xDS", "uid", uid, "pod", info.GetNamespace()+"/"+info.GetName())
	}
	if s.keep(uid, info, netns) {
		return nil
	}
	pod, err := inpod.OpenWith(netns, s.Sockets)
	if err != nil {
		s.mu.Lock()
		if s.refused == nil {
			s.refused = map[string]bool{}
		}
		s.refused[uid] = true
		if s.snapshot != nil {
			// Seen: a pod served before under this UID keeps its
			// listeners rather than being dropped by the snapshot.
			s.snapshot[uid] = true
		}
		s.mu.Unlock()
		return err
	}
	id := workloadapi.WorkloadIdentity(self)
	s.Certs.Add(id)
	s.mu.Lock()
	if s.served == nil {
		s.served = map[string]*served{}
	}
	delete(s.refused, uid)
	old := s.served[uid]
	s.served[uid] = &served{Pod: Pod{UID: uid, Info: info, Self: self, State: "Up"}, pod: pod, id: id}
	if s.snapshot != nil {
		s.snapshot[uid] = true
	}
	s.mu.Unlock()
	if old != nil {
		s.stop(old)
	}
	s.Server.ServePod(pod, self)
	s.Log.Debug("serving pod", "uid", uid, "pod", info.GetNamespace()+"/"+info.GetName(), "identity", id.String())
	return nil
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
// as it knows: a snapshot has ended, and no pod it was handed is left
// refused. A refused pod comes again only in a later snapshot (a new
// connection) or goes with its Del, so until then the proxy is not ready;
// during an upgrade that keeps the old proxy, which serves it, in place.
func (s *Set) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced && len(s.refused) == 0
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
