// Package zds is the CNI agent's side of ZDS (docs/wire-contract.md §3): a
// SOCK_SEQPACKET server the node proxy connects to. Each new proxy connection
// gets a snapshot of every pod the agent holds (AddWorkload with the pod's
// netns, or KeepWorkload when the agent has none) and SnapshotSent; after
// that, new pods go to the newest connection and deletions to all, each
// message awaiting its Ack under a deadline. An idle connection is probed by
// a short read every keepalive period.
package zds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/canopy-mesh/canopy/internal/zdsconn"
	zdspb "github.com/canopy-mesh/canopy/workloadapi/zds"
)

// maxAck is the largest datagram the agent reads from a node proxy.
// Canopy's node proxy keeps its Acks under zdsconn.MaxMessage; ztunnel
// does not bound a refusal's text (send_nack in src/inpod), so a longer
// Ack is read whole, its text cut to zdsconn.MaxAckError, and is a
// refusal like any other rather than a broken connection.
const maxAck = 64 << 10

// ErrNoProxy: no node proxy is connected; the pod waits in the cache and
// goes out with the next snapshot.
var ErrNoProxy = errors.New("no node proxy connected")

// Pod is one pod the agent holds.
type Pod struct {
	// UID is the Kubernetes metadata.uid.
	UID  string
	Info *zdspb.WorkloadInfo
	// Netns is an open handle to the pod's network namespace; nil means
	// the agent knows the pod but holds no handle (KeepWorkload).
	Netns *os.File
}

// Config tunes the server; zero values take the defaults of
// wire contract §3.3.
type Config struct {
	// Timeout bounds each read and write (5s).
	Timeout time.Duration
	// Keepalive is how often an idle connection is probed (5s).
	Keepalive time.Duration
	// OnDelivered, if set, is called after a proxy acknowledged a pod's
	// AddWorkload, in a snapshot or not.
	OnDelivered func(uid string)
	// Admit, if set, is called with the process ID of each node proxy
	// that connects (SO_PEERCRED, as the agent's PID namespace sees it;
	// 0 when the proxy's process is not visible there) after its hello
	// and before its snapshot, whose pods it opens listeners in: the
	// agent lets that process bind the node proxy's ports in guarded
	// pods (redirect.PortGuard). An error refuses the connection.
	Admit func(pid int) error
}

// Server is the ZDS server. Pods are added and removed through Add and
// Delete whether or not a proxy is connected.
type Server struct {
	path string
	cfg  Config
	log  *slog.Logger

	mu    sync.Mutex
	pods  map[string]Pod
	conns []*conn // oldest first
}

type conn struct {
	mu sync.Mutex // one exchange at a time
	c  *zdsconn.Conn
}

// New returns a server that will listen at path.
func New(path string, cfg Config, log *slog.Logger) *Server {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Keepalive <= 0 {
		cfg.Keepalive = 5 * time.Second
	}
	return &Server{path: path, cfg: cfg, log: log.With("component", "zds"), pods: map[string]Pod{}}
}

// Run listens until ctx ends. A stale socket file from an earlier run is
// replaced.
func (s *Server) Run(ctx context.Context) error {
	if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: s.path, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("listen %s: %w", s.path, err)
	}
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		uc, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				s.closeAll()
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		pid, err := peerPID(uc)
		if err != nil {
			s.log.Warn("cannot tell which process connected", "err", err)
			uc.Close()
			continue
		}
		zc := zdsconn.New(uc)
		// ztunnel puts a refusal's whole text in its Ack; read it whole.
		zc.SetReadLimit(maxAck)
		wg.Go(func() { s.serve(ctx, zc, pid) })
	}
}

func (s *Server) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.c.Close()
	}
}

// peerPID is the process ID of the connection's peer, as it connected.
func peerPID(uc *net.UnixConn) (int, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, fmt.Errorf("SO_PEERCRED: %w", serr)
	}
	return int(cred.Pid), nil
}

// serve runs one proxy connection: hello, the proxy's process admitted,
// snapshot, then keepalives until it ends.
func (s *Server) serve(ctx context.Context, zc *zdsconn.Conn, pid int) {
	defer zc.Close()
	c := &conn{c: zc}
	var hello zdspb.ZdsHello
	fds, err := zc.Recv(&hello, time.Now().Add(s.cfg.Timeout))
	if err == nil && len(fds) > 0 {
		closeFiles(fds)
		err = fmt.Errorf("%w: hello carried file descriptors", zdsconn.ErrProtocol)
	}
	if err != nil {
		s.log.Warn("node proxy hello failed", "err", err)
		return
	}
	if hello.GetVersion() != zdspb.Version_V1 {
		s.log.Warn("node proxy speaks an unknown ZDS version", "version", hello.GetVersion())
		return
	}
	if s.cfg.Admit != nil {
		if err := s.cfg.Admit(pid); err != nil {
			// Without it the proxy could open no listener in a guarded
			// pod: it is told so by the closed connection, and the log
			// says why.
			s.log.Error("node proxy refused: it could not bind its ports in pods", "pid", pid, "err", err)
			return
		}
	}
	// The snapshot is sent under the server lock, so no Add or Delete
	// slips between the pods listed and the connection becoming newest.
	s.mu.Lock()
	err = s.snapshot(c)
	if err == nil {
		s.conns = append(s.conns, c)
	}
	s.mu.Unlock()
	if err != nil {
		s.log.Warn("snapshot to node proxy failed", "err", err)
		return
	}
	s.log.Info("node proxy connected; snapshot sent")
	defer s.drop(c)
	tick := time.NewTicker(s.cfg.Keepalive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := c.alive(); err != nil {
			s.log.Info("node proxy disconnected", "err", err)
			return
		}
	}
}

func (s *Server) snapshot(c *conn) error {
	uids := make([]string, 0, len(s.pods))
	for uid := range s.pods {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	for _, uid := range uids {
		p := s.pods[uid]
		req := &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Keep{Keep: &zdspb.KeepWorkload{Uid: uid}}}
		if p.Netns != nil {
			req = addRequest(p)
		}
		if err := c.exchange(req, p.Netns, s.cfg.Timeout); err != nil {
			var refused *RefusedError
			if !errors.As(err, &refused) {
				return fmt.Errorf("pod %s: %w", uid, err)
			}
			// The proxy cannot take this pod (yet): the rest of the
			// snapshot still goes, and the pod stays for the next one.
			s.log.Warn("node proxy refused a pod in the snapshot", "uid", uid, "reason", refused.Message)
			continue
		}
		if p.Netns != nil && s.cfg.OnDelivered != nil {
			s.cfg.OnDelivered(uid)
		}
	}
	return c.exchange(&zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_SnapshotSent{SnapshotSent: &zdspb.SnapshotSent{}}}, nil, s.cfg.Timeout)
}

func addRequest(p Pod) *zdspb.WorkloadRequest {
	return &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{Uid: p.UID, WorkloadInfo: p.Info}}}
}

// exchange sends one request and waits for its Ack.
func (c *conn) exchange(req *zdspb.WorkloadRequest, fd *os.File, timeout time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.c.Send(req, fd, time.Now().Add(timeout)); err != nil {
		return err
	}
	var resp zdspb.WorkloadResponse
	fds, err := c.c.Recv(&resp, time.Now().Add(timeout))
	if err != nil {
		return fmt.Errorf("await ack: %w", err)
	}
	if len(fds) > 0 {
		closeFiles(fds)
		return fmt.Errorf("%w: ack carried file descriptors", zdsconn.ErrProtocol)
	}
	if resp.GetAck() == nil {
		return fmt.Errorf("%w: response without an ack", zdsconn.ErrProtocol)
	}
	if msg := resp.GetAck().GetError(); msg != "" {
		return &RefusedError{Message: zdsconn.AckError(msg)}
	}
	return nil
}

// RefusedError is a node proxy's Ack with an error: the connection is
// fine, the proxy could not take the request. Message is the Ack's text,
// cut to at most zdsconn.MaxAckError bytes of valid UTF-8.
type RefusedError struct{ Message string }

func (e *RefusedError) Error() string { return "node proxy refused: " + e.Message }

// broken drops a connection whose exchange failed for any reason but a
// refusal; callers hold s.mu.
func (s *Server) broken(c *conn, err error) {
	var r *RefusedError
	if errors.As(err, &r) {
		return
	}
	c.c.Close()
	s.conns = slices.DeleteFunc(s.conns, func(x *conn) bool { return x == c })
}

// alive probes an idle connection with a 10ms read: a timeout means the
// peer is there, EOF that it left, and data is a protocol error.
func (c *conn) alive() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var resp zdspb.WorkloadResponse
	fds, err := c.c.Recv(&resp, time.Now().Add(10*time.Millisecond))
	closeFiles(fds)
	var nerr net.Error
	if errors.As(err, &nerr) && nerr.Timeout() {
		return nil
	}
	if err == nil {
		return fmt.Errorf("%w: unsolicited message", zdsconn.ErrProtocol)
	}
	return err
}

func (s *Server) drop(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns = slices.DeleteFunc(s.conns, func(x *conn) bool { return x == c })
}

// Add records a pod and sends it to the newest proxy connection, waiting
// for its Ack. With no proxy connected it returns ErrNoProxy; the pod
// stays recorded and goes out in the next snapshot. The server owns
// p.Netns from here on.
func (s *Server) Add(p Pod) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.pods[p.UID]; ok && old.Netns != nil && old.Netns != p.Netns {
		old.Netns.Close()
	}
	s.pods[p.UID] = p
	if len(s.conns) == 0 {
		return ErrNoProxy
	}
	c := s.conns[len(s.conns)-1]
	if err := c.exchange(addRequest(p), p.Netns, s.cfg.Timeout); err != nil {
		s.broken(c, err)
		return fmt.Errorf("add pod %s: %w", p.UID, err)
	}
	if s.cfg.OnDelivered != nil {
		s.cfg.OnDelivered(p.UID)
	}
	return nil
}

// Delete forgets a pod and tells every connected proxy.
func (s *Server) Delete(uid string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.pods[uid]; ok && p.Netns != nil {
		p.Netns.Close()
	}
	delete(s.pods, uid)
	var errs []error
	for _, c := range slices.Clone(s.conns) {
		req := &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Del{Del: &zdspb.DelWorkload{Uid: uid}}}
		if err := c.exchange(req, nil, s.cfg.Timeout); err != nil {
			s.broken(c, err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Has reports whether a pod is recorded.
func (s *Server) Has(uid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.pods[uid]
	return ok
}

// Connected returns the number of proxy connections past their snapshot.
func (s *Server) Connected() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
