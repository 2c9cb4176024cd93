// Package pods keeps the set of pods this node proxy serves in step with
// ZDS (spec §3): each Add names a pod by its Kubernetes UID and workload
// info and hands over its netns; the pod's identity comes from the
// node-local workload with that namespace and service account (spec §3.4),
// never from an IP lookup alone. A snapshot ends with every pod neither
// added nor kept in it dropped.
package pods

import (
	"context"
	"fmt"
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
}

// Server serves one pod's sockets; *proxy.Proxy implements it.
type Server interface {
	ServePod(pod *inpod.Pod, self *workloadapi.Workload)
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
	Log       *slog.Logger
	// Wait bounds how long Add waits for the pod's workload to arrive
	// over xDS (default 4s: under the agent's 5s Ack deadline, so a pod
	// without a workload gets an Ack with the reason, not a dropped
	// connection).
	Wait time.Duration

	mu       sync.Mutex
	served   map[string]*served
	snapshot map[string]bool // pods seen in the snapshot under way
}

type served struct {
	Pod
	pod *inpod.Pod
	id  workloadapi.Identity
}

// self finds the pod's workload among the node's (spec §3.4): same
// namespace and service account, then the same name.
func (s *Set) self(info *zdspb.WorkloadInfo) *workloadapi.Workload {
	sa := info.GetServiceAccount()
	if sa == "" {
		sa = "default"
	}
	var match *workloadapi.Workload
	for _, w := range s.Workloads.NodeWorkloads(s.Node) {
		wsa := w.GetServiceAccount()
		if wsa == "" {
			wsa = "default"
		}
		if w.GetNamespace() != info.GetNamespace() || wsa != sa {
			continue
		}
		if w.GetName() == info.GetName() {
			return w
		}
		if match == nil {
			match = w
		}
	}
	return match
}

// Add implements zdsclient.Handler.
func (s *Set) Add(uid string, info *zdspb.WorkloadInfo, netns *os.File) error {
	wait := s.Wait
	if wait <= 0 {
		wait = 4 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var self *workloadapi.Workload
	for self = s.self(info); self == nil; self = s.self(info) {
		select {
		case <-ctx.Done():
			netns.Close()
			return fmt.Errorf("pod %s/%s: no workload on node %s with service account %q", info.GetNamespace(), info.GetName(), s.Node, info.GetServiceAccount())
		case <-time.After(50 * time.Millisecond):
		}
	}
	pod, err := inpod.Open(netns)
	if err != nil {
		return err
	}
	id := workloadapi.WorkloadIdentity(self)
	s.Certs.Add(id)
	s.mu.Lock()
	if s.served == nil {
		s.served = map[string]*served{}
	}
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
	s.Log.Info("serving pod", "uid", uid, "pod", info.GetNamespace()+"/"+info.GetName(), "identity", id.String())
	return nil
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

// Del implements zdsclient.Handler.
func (s *Set) Del(uid string) error {
	s.mu.Lock()
	p := s.served[uid]
	delete(s.served, uid)
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
