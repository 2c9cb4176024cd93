package pods

import (
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"

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
}

func (c *certs) Add(id workloadapi.Identity)    { c.mu.Lock(); c.ids[id]++; c.mu.Unlock() }
func (c *certs) Remove(id workloadapi.Identity) { c.mu.Lock(); c.ids[id]--; c.mu.Unlock() }

type server struct {
	mu          sync.Mutex
	names, uids []string
}

func (s *server) ServePod(_ *inpod.Pod, self *workloadapi.Workload) {
	s.mu.Lock()
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
