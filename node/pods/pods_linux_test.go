package pods

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/node/inpod"
	"github.com/canopy-mesh/canopy/workloadapi"
	zdspb "github.com/canopy-mesh/canopy/workloadapi/zds"
)

type workloads []*workloadapi.Workload

func (w workloads) NodeWorkloads(node string) []*workloadapi.Workload {
	var out []*workloadapi.Workload
	for _, x := range w {
		if x.GetNode() == node {
			out = append(out, x)
		}
	}
	return out
}

type certs struct {
	mu  sync.Mutex
	ids map[workloadapi.Identity]int
	// missing identities have no certificate; every other one has.
	missing map[workloadapi.Identity]bool
}

func (c *certs) Add(id workloadapi.Identity)    { c.mu.Lock(); c.ids[id]++; c.mu.Unlock() }
func (c *certs) Remove(id workloadapi.Identity) { c.mu.Lock(); c.ids[id]--; c.mu.Unlock() }
func (c *certs) Has(id workloadapi.Identity) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.missing[id]
}
func (c *certs) issue(id workloadapi.Identity) { c.mu.Lock(); delete(c.missing, id); c.mu.Unlock() }
func (c *certs) refs(id workloadapi.Identity) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids[id]
}

type server struct {
	mu          sync.Mutex
	names, uids []string
	pods        []*inpod.Pod
}

func (s *server) served() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pods)
}

func (s *server) ServePod(pod *inpod.Pod, self *workloadapi.Workload) {
	s.mu.Lock()
	s.pods = append(s.pods, pod)
	s.names = append(s.names, self.GetName())
	s.uids = append(s.uids, self.GetUid())
	s.mu.Unlock()
}

func TestSetFollowsZDS(t *testing.T) {
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.222.0.0/24"))
	open := func() *os.File {
		f, err := os.Open(pair.A)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	ws := workloads{
		{Uid: "w-web", Name: "web-1", Namespace: "apps", ServiceAccount: "web", Node: "n1"},
		{Uid: "w-api", Name: "api-1", Namespace: "apps", Node: "n1"},
		{Uid: "w-far", Name: "web-2", Namespace: "apps", ServiceAccount: "web", Node: "n2"},
	}
	c := &certs{ids: map[workloadapi.Identity]int{}}
	srv := &server{}
	set := &Set{Node: "n1", Workloads: ws, Certs: c, Server: srv, Log: slog.New(slog.DiscardHandler), ClusterID: "Kubernetes"}
	defer set.Close()

	set.Begin()
	if err := set.Add("uid-web", &zdspb.WorkloadInfo{Name: "web-1", Namespace: "apps", ServiceAccount: "web"}, open()); err != nil {
		t.Fatal(err)
	}
	// The default service account, matched by the empty one.
	if err := set.Add("uid-api", &zdspb.WorkloadInfo{Name: "api-1", Namespace: "apps"}, open()); err != nil {
		t.Fatal(err)
	}
	// A pod enrolled during CNI ADD has no workload yet (no IP, so the
	// controller has not published it): served at once, with the identity
	// the agent gave and the UID the controller will publish.
	if err := set.Add("uid-new", &zdspb.WorkloadInfo{Name: "new-1", Namespace: "apps", ServiceAccount: "other"}, open()); err != nil {
		t.Fatalf("a pod whose workload has not arrived: %v", err)
	}
	if err := set.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if got := len(set.Pods()); got != 3 {
		t.Fatalf("%d pods served, want 3", got)
	}
	if !slices.Equal(srv.names, []string{"web-1", "api-1", "new-1"}) {
		t.Errorf("served %v", srv.names)
	}
	if got, want := srv.uids[2], "Kubernetes//Pod/apps/new-1"; got != want {
		t.Errorf("provisional workload UID %q, want %q (the controller's)", got, want)
	}
	other := workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "apps", ServiceAccount: "other"}
	if c.ids[other] != 1 {
		t.Errorf("certificate refs for the provisional pod's identity = %d, want 1", c.ids[other])
	}
	_ = set.Del("uid-new")

	// A replacement pod whose workload has not arrived, while the replaced
	// pod's (same identity, other address) still lingers: never served as
	// the old one.
	if err := set.Add("uid-web-new", &zdspb.WorkloadInfo{Name: "web-9", Namespace: "apps", ServiceAccount: "web"}, open()); err != nil {
		t.Fatal(err)
	}
	if got, want := srv.uids[len(srv.uids)-1], "Kubernetes//Pod/apps/web-9"; got != want {
		t.Errorf("replacement pod served as %q, want its own %q", got, want)
	}
	_ = set.Del("uid-web-new")
	web := workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "apps", ServiceAccount: "web"}
	if c.ids[web] != 1 {
		t.Errorf("certificate refs for web = %d", c.ids[web])
	}

	// A reconnect's snapshot keeps web, drops api.
	set.Begin()
	_ = set.Keep("uid-web")
	_ = set.Snapshot()
	if pods := set.Pods(); len(pods) != 1 || pods[0].UID != "uid-web" {
		t.Errorf("after the second snapshot: %+v", pods)
	}
	_ = set.Del("uid-web")
	if len(set.Pods()) != 0 || c.ids[web] != 0 {
		t.Errorf("after Del: %d pods, %d refs", len(set.Pods()), c.ids[web])
	}
}

// TestSameNetnsKeepsListeners: a restarted CNI agent hands every pod over
// again. A pod handed over in the network namespace it is served in keeps
// its listeners (a new set would be a moment where its queued connections
// move, and, on a kernel without migration, are reset); a pod handed over
// in another namespace (its sandbox was replaced) is served anew.
func TestSameNetnsKeepsListeners(t *testing.T) {
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.222.1.0/24"))
	open := func(path string) *os.File {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	web := workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "apps", ServiceAccount: "web"}
	c := &certs{ids: map[workloadapi.Identity]int{}}
	srv := &server{}
	set := &Set{Node: "n1", Workloads: workloads{}, Certs: c, Server: srv, Log: slog.New(slog.DiscardHandler), ClusterID: "Kubernetes"}
	defer set.Close()
	info := &zdspb.WorkloadInfo{Name: "web-1", Namespace: "apps", ServiceAccount: "web"}

	set.Begin()
	if err := set.Add("uid-web", info, open(pair.A)); err != nil {
		t.Fatal(err)
	}
	_ = set.Snapshot()
	first := srv.pods[0]

	// The agent restarts: a new connection, the same pod, the same netns.
	set.Begin()
	again := open(pair.A)
	if err := set.Add("uid-web", info, again); err != nil {
		t.Fatal(err)
	}
	_ = set.Snapshot()
	if len(srv.pods) != 1 {
		t.Fatalf("the pod was served %d times, want once: its listeners were replaced", len(srv.pods))
	}
	if _, err := again.Stat(); err == nil {
		t.Error("the handle handed over again is still open; want it closed")
	}
	if got := len(set.Pods()); got != 1 {
		t.Fatalf("%d pods served after the snapshot, want 1", got)
	}
	if err := acceptErr(t, first.Outbound); errors.Is(err, net.ErrClosed) {
		t.Fatal("the pod's first listeners were closed")
	}
	if c.ids[web] != 1 {
		t.Errorf("certificate refs for web = %d, want 1", c.ids[web])
	}

	// The sandbox was replaced: same UID, another netns. Served anew,
	// the old listeners closed.
	if err := set.Add("uid-web", info, open(pair.B)); err != nil {
		t.Fatal(err)
	}
	if len(srv.pods) != 2 {
		t.Fatalf("a pod in a new netns was served %d times in all, want 2", len(srv.pods))
	}
	if err := acceptErr(t, first.Outbound); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the replaced netns's listener: accept err %v, want net.ErrClosed", err)
	}
	if c.ids[web] != 1 {
		t.Errorf("certificate refs for web = %d, want 1", c.ids[web])
	}
}

// acceptErr is what an accept on l with nothing queued ends with: a
// timeout while l is open, net.ErrClosed once it is closed.
func acceptErr(t *testing.T, l net.Listener) error {
	t.Helper()
	tl, ok := l.(*net.TCPListener)
	if !ok {
		t.Fatalf("listener is a %T, want *net.TCPListener", l)
	}
	if err := tl.SetDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		return err
	}
	_, err := tl.Accept()
	return err
}

// TestReadyAfterTheSnapshot: the set is ready once a snapshot has ended
// with every pod in it served; a pod it could not serve keeps it unready
// until the agent takes the pod back (Del) or a later snapshot no longer
// holds it.
func TestReadyAfterTheSnapshot(t *testing.T) {
	pair := nettest.NewPair(t, netip.MustParsePrefix("10.234.0.0/24"))
	netnsOf := func(path string) *os.File {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	set := &Set{Node: "n1", Workloads: workloads{}, Certs: &certs{ids: map[workloadapi.Identity]int{}}, Server: &server{},
		Log: slog.New(slog.DiscardHandler), ClusterID: "Kubernetes"}
	defer set.Close()
	info := &zdspb.WorkloadInfo{Name: "web-1", Namespace: "apps", ServiceAccount: "web"}
	step := func(what string, want bool) {
		t.Helper()
		if got := set.Ready(); got != want {
			t.Errorf("%s: Ready() = %v, want %v", what, got, want)
		}
	}

	step("before any snapshot", false)
	set.Begin()
	if err := set.Add("uid-web", info, netnsOf(pair.A)); err != nil {
		t.Fatal(err)
	}
	step("during the snapshot", false)
	// Not a network namespace: the listeners cannot be opened.
	if err := set.Add("uid-bad", &zdspb.WorkloadInfo{Name: "bad-1", Namespace: "apps"}, netnsOf(os.DevNull)); err == nil {
		t.Fatal("Add of a file that is no network namespace succeeded")
	}
	if err := set.Snapshot(); err != nil {
		t.Fatal(err)
	}
	step("after a snapshot with a refused pod", false)
	if err := set.Del("uid-bad"); err != nil {
		t.Fatal(err)
	}
	step("once the refused pod is deleted", true)

	// A later connection: refused again, then a snapshot without it.
	if err := set.Add("uid-bad", &zdspb.WorkloadInfo{Name: "bad-1", Namespace: "apps"}, netnsOf(os.DevNull)); err == nil {
		t.Fatal("Add of a file that is no network namespace succeeded")
	}
	step("after a refused Add", false)
	set.Begin()
	_ = set.Keep("uid-web")
	if err := set.Snapshot(); err != nil {
		t.Fatal(err)
	}
	step("after a snapshot no longer holding the refused pod", true)
	if pods := set.Pods(); len(pods) != 1 || pods[0].UID != "uid-web" {
		t.Errorf("served after the second snapshot: %+v", pods)
	}
}

// TestTakeOverWaitsForTheCertificate: during an upgrade the old node proxy
// still listens in the pod. The new one, without the pod's certificate
// (the CA is unreachable), leaves its listeners closed, so every
// connection goes on to the old proxy, which can carry it, and is not
// Ready; it takes the pod over once the certificate is here, or once the
// old proxy stops listening. A pod nobody else serves is served at once.
func TestTakeOverWaitsForTheCertificate(t *testing.T) {
	web := workloadapi.Identity{TrustDomain: "cluster.local", Namespace: "apps", ServiceAccount: "web"}
	info := &zdspb.WorkloadInfo{Name: "web-1", Namespace: "apps", ServiceAccount: "web"}
	newSet := func(t *testing.T, subnet string) (*Set, *certs, *server, *nettest.Pair) {
		pair := nettest.NewPair(t, netip.MustParsePrefix(subnet))
		c := &certs{ids: map[workloadapi.Identity]int{}, missing: map[workloadapi.Identity]bool{web: true}}
		srv := &server{}
		set := &Set{Node: "n1", Workloads: workloads{}, Certs: c, Server: srv, Log: slog.New(slog.DiscardHandler), ClusterID: "Kubernetes"}
		t.Cleanup(func() { set.Close() })
		return set, c, srv, &pair
	}
	add := func(t *testing.T, set *Set, path string) {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		set.Begin()
		if err := set.Add("uid-web", info, f); err != nil {
			t.Fatal(err)
		}
		if err := set.Snapshot(); err != nil {
			t.Fatal(err)
		}
	}
	oldProxy := func(t *testing.T, path string) *inpod.Pod {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		old, err := inpod.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { old.Close() })
		return old
	}
	state := func(set *Set) string {
		if pods := set.Pods(); len(pods) == 1 {
			return pods[0].State
		}
		return "not served"
	}
	// waiting checks the new proxy holds off: not serving, not Ready, and
	// a connection lands on the old proxy.
	waiting := func(t *testing.T, set *Set, srv *server, pair *nettest.Pair, old *inpod.Pod) {
		t.Helper()
		time.Sleep(3 * waitPoll)
		if srv.served() != 0 || state(set) != StateWaiting || set.Ready() {
			t.Fatalf("without the certificate: served %d times, state %q, Ready %v; want 0, %q, false", srv.served(), state(set), set.Ready(), StateWaiting)
		}
		for range 8 { // SO_REUSEPORT would spread these over both
			c := nettest.In(t, pair.B, func() (net.Conn, error) {
				return net.DialTimeout("tcp4", pair.AddrA.String()+":15001", 3*time.Second)
			})
			defer c.Close()
			if err := acceptErr(t, old.Outbound); err != nil {
				t.Fatalf("the old proxy did not get a connection: %v", err)
			}
		}
	}

	t.Run("the certificate arrives", func(t *testing.T) {
		set, c, srv, pair := newSet(t, "10.235.0.0/24")
		old := oldProxy(t, pair.A)
		add(t, set, pair.A)
		waiting(t, set, srv, pair, old)
		c.issue(web)
		eventually.True(t, "the pod is taken over", func() bool { return srv.served() == 1 })
		if state(set) != StateUp || !set.Ready() {
			t.Errorf("taken over: state %q, Ready %v", state(set), set.Ready())
		}
	})
	t.Run("the old proxy stops listening", func(t *testing.T) {
		set, _, srv, pair := newSet(t, "10.235.1.0/24")
		old := oldProxy(t, pair.A)
		add(t, set, pair.A)
		waiting(t, set, srv, pair, old)
		_ = old.CloseListeners()
		eventually.True(t, "the pod is taken over without its certificate", func() bool { return srv.served() == 1 })
	})
	t.Run("nobody else serves the pod", func(t *testing.T) {
		set, _, srv, pair := newSet(t, "10.235.2.0/24")
		add(t, set, pair.A)
		if srv.served() != 1 || state(set) != StateUp {
			t.Errorf("served %d times, state %q; want at once", srv.served(), state(set))
		}
	})
	t.Run("the pod goes while waiting", func(t *testing.T) {
		set, c, srv, pair := newSet(t, "10.235.3.0/24")
		oldProxy(t, pair.A)
		add(t, set, pair.A)
		if err := set.Del("uid-web"); err != nil {
			t.Fatal(err)
		}
		c.issue(web)
		time.Sleep(3 * waitPoll)
		if srv.served() != 0 || c.refs(web) != 0 || len(set.Pods()) != 0 {
			t.Errorf("after Del: served %d times, %d certificate refs, %d pods; want none", srv.served(), c.refs(web), len(set.Pods()))
		}
	})
}
