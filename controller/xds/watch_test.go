package xds

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/canopy-mesh/canopy/workloadapi"
)

const addrType = workloadapi.AddressTypeURL

func pod(name, node, ip string, services ...string) *workloadapi.Address {
	w := &workloadapi.Workload{
		Uid: "Kubernetes//Pod/default/" + name, Name: name, Namespace: "default",
		Addresses: [][]byte{mustIP(ip)}, Node: node, Services: map[string]*workloadapi.PortList{},
	}
	for _, s := range services {
		w.Services[s] = &workloadapi.PortList{}
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
}

func svc(name, vip string) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
		Name: name, Namespace: "default", Hostname: name + ".default.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Address: mustIP(vip)}},
	}}}
}

func mustIP(s string) []byte {
	b, err := netipParse(s)
	if err != nil {
		panic(err)
	}
	return b
}

func put(t testing.TB, tbl *Table, msgs ...proto.Message) {
	t.Helper()
	for _, m := range msgs {
		a := m.(*workloadapi.Address)
		r, err := NewResource(addrType, workloadapi.ResourceName(a), a)
		if err != nil {
			t.Fatal(err)
		}
		tbl.Put(addrType, r.Name, r)
	}
}

// got summarizes a delta: sorted resource names and removals.
type got struct{ Resources, Removed []string }

func summary(d delta) got {
	var g got
	for _, r := range d.resources {
		g.Resources = append(g.Resources, r.Name)
	}
	g.Removed = append(g.Removed, d.removed...)
	slices.Sort(g.Resources)
	slices.Sort(g.Removed)
	return g
}

const (
	uidA = "Kubernetes//Pod/default/a"
	uidB = "Kubernetes//Pod/default/b"
	uidC = "Kubernetes//Pod/default/c"
	echo = "default/echo.default.svc.cluster.local"
)

func table(t testing.TB) *Table {
	tbl := NewTable()
	put(t, tbl,
		pod("a", "node-1", "10.244.1.5", echo),
		pod("b", "node-2", "10.244.2.5", echo),
		pod("c", "node-2", "10.244.2.6"),
		svc("echo", "10.96.0.20"))
	return tbl
}

func TestWatchWildcard(t *testing.T) {
	t.Parallel()
	tbl := table(t)
	w := newWatch(addrType)
	if err := w.start(tbl, subscription{}, 100); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got{Resources: []string{uidA, uidB, uidC, echo}}, summary(w.next(tbl, "node-1"))); diff != "" {
		t.Errorf("initial (-want +got):\n%s", diff)
	}
	if w.pending() {
		t.Error("pending after a full response")
	}
	// b changes, c goes, d arrives; an unchanged re-put is no change.
	put(t, tbl, pod("b", "node-2", "10.244.2.7", echo), pod("d", "node-3", "10.244.3.5"), pod("a", "node-1", "10.244.1.5", echo))
	tbl.Put(addrType, uidC, nil)
	w.mark([]string{uidA, uidB, uidC, "Kubernetes//Pod/default/d"}, time.Now(), 100)
	want := got{Resources: []string{uidB, "Kubernetes//Pod/default/d"}, Removed: []string{uidC}}
	if diff := cmp.Diff(want, summary(w.next(tbl, "node-1"))); diff != "" {
		t.Errorf("push (-want +got):\n%s", diff)
	}
}

func TestWatchOnDemand(t *testing.T) {
	t.Parallel()
	tbl := table(t)
	w := newWatch(addrType)
	// ztunnel's on-demand opening: subscribe and unsubscribe "*".
	if err := w.start(tbl, subscription{subscribe: []string{"*"}, unsubscribe: []string{"*"}}, 100); err != nil {
		t.Fatal(err)
	}
	d := w.next(tbl, "node-1")
	if diff := cmp.Diff(got{Resources: []string{uidA}}, summary(d)); diff != "" {
		t.Errorf("initial: only the node's workloads (-want +got):\n%s", diff)
	}
	if !d.initial {
		t.Error("first response not marked initial")
	}

	// Lookup by IP: the workload under its primary name; an unknown key
	// comes back removed.
	if err := w.update(tbl, subscription{subscribe: []string{"/10.244.2.6", "/10.1.1.1"}}, 100); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got{Resources: []string{uidC}, Removed: []string{"/10.1.1.1"}}, summary(w.next(tbl, "node-1"))); diff != "" {
		t.Errorf("lookup (-want +got):\n%s", diff)
	}

	// A service by VIP brings its workloads.
	if err := w.update(tbl, subscription{subscribe: []string{"/10.96.0.20"}}, 100); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got{Resources: []string{uidB, echo}}, summary(w.next(tbl, "node-1"))); diff != "" {
		t.Errorf("service lookup (-want +got):\n%s", diff)
	}

	// Changes to what it does not hold are not sent; to what it holds are.
	put(t, tbl, pod("e", "node-3", "10.244.3.9"), pod("c", "node-2", "10.244.2.6", "x/y"))
	w.mark([]string{"Kubernetes//Pod/default/e", uidC}, time.Now(), 100)
	if diff := cmp.Diff(got{Resources: []string{uidC}}, summary(w.next(tbl, "node-1"))); diff != "" {
		t.Errorf("push (-want +got):\n%s", diff)
	}

	// The not-found key appears later: it is sent.
	put(t, tbl, pod("f", "node-3", "10.1.1.1"))
	w.mark([]string{"Kubernetes//Pod/default/f"}, time.Now(), 100)
	if diff := cmp.Diff(got{Resources: []string{"Kubernetes//Pod/default/f"}}, summary(w.next(tbl, "node-1"))); diff != "" {
		t.Errorf("late arrival (-want +got):\n%s", diff)
	}

	// Unsubscribed: no longer sent.
	if err := w.update(tbl, subscription{unsubscribe: []string{"/10.1.1.1"}}, 100); err != nil {
		t.Fatal(err)
	}
	put(t, tbl, pod("f", "node-3", "10.1.1.1", "z/z"))
	w.mark([]string{"Kubernetes//Pod/default/f"}, time.Now(), 100)
	if d := w.next(tbl, "node-1"); !d.empty() {
		t.Errorf("unsubscribed resource sent: %+v", summary(d))
	}
}

func TestWatchReconnect(t *testing.T) {
	t.Parallel()
	tbl := table(t)
	a := tbl.Get(addrType, uidA)
	w := newWatch(addrType)
	err := w.start(tbl, subscription{initialVersions: map[string]string{
		uidA:   a.Version, // unchanged: skipped
		uidB:   "0",       // changed: resent
		"gone": "1",       // vanished: removed
	}}, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := got{Resources: []string{uidB, uidC, echo}, Removed: []string{"gone"}}
	if diff := cmp.Diff(want, summary(w.next(tbl, ""))); diff != "" {
		t.Errorf("reconnect (-want +got):\n%s", diff)
	}

	// On demand, a name without a version is still wanted.
	w = newWatch(addrType)
	if err := w.start(tbl, subscription{subscribe: []string{"*"}, unsubscribe: []string{"*"}, initialVersions: map[string]string{"/10.244.2.5": ""}}, 100); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got{Resources: []string{uidB}}, summary(w.next(tbl, ""))); diff != "" {
		t.Errorf("on-demand reconnect (-want +got):\n%s", diff)
	}
}

// TestWatchReconnectIntoEmptyTable: the versions a reconnecting proxy
// holds are compared with the table when the response is built, not
// when the request arrives: a request that came while the table was
// still empty costs nothing once it is filled with the same content.
func TestWatchReconnectIntoEmptyTable(t *testing.T) {
	t.Parallel()
	full := table(t)
	held := map[string]string{"gone": "1"}
	for _, n := range []string{uidA, uidB, echo} {
		held[n] = full.Get(addrType, n).Version
	}
	tbl := NewTable()
	w := newWatch(addrType)
	if err := w.start(tbl, subscription{initialVersions: held}, 100); err != nil {
		t.Fatal(err)
	}
	put(t, tbl,
		pod("a", "node-1", "10.244.1.5", echo),
		pod("b", "node-2", "10.244.2.5", echo),
		pod("c", "node-2", "10.244.2.6"),
		svc("echo", "10.96.0.20"))
	w.mark([]string{uidA, uidB, uidC, echo}, time.Now(), 100)
	want := got{Resources: []string{uidC}, Removed: []string{"gone"}}
	if diff := cmp.Diff(want, summary(w.next(tbl, ""))); diff != "" {
		t.Errorf("reconnect (-want +got):\n%s", diff)
	}
	// What it held is now what it was sent: later pushes compare with it.
	put(t, tbl, pod("a", "node-1", "10.244.1.6", echo))
	w.mark([]string{uidA, uidB}, time.Now(), 100)
	if diff := cmp.Diff(got{Resources: []string{uidA}}, summary(w.next(tbl, ""))); diff != "" {
		t.Errorf("push after reconnect (-want +got):\n%s", diff)
	}
}

func TestWatchBounds(t *testing.T) {
	t.Parallel()
	tbl := table(t)
	w := newWatch(addrType)
	if err := w.start(tbl, subscription{}, 100); err != nil {
		t.Fatal(err)
	}
	w.next(tbl, "")
	t0 := time.Now()
	w.mark([]string{uidA, uidB}, t0.Add(time.Second), 2)
	w.mark([]string{uidC}, t0, 2)
	if !w.full || len(w.dirty) != 0 {
		t.Errorf("past the bound: full = %v, %d dirty; want full and none", w.full, len(w.dirty))
	}
	if d := w.next(tbl, ""); !d.empty() || !d.oldest.Equal(t0) {
		t.Errorf("full recompute of an unchanged table = %+v, oldest %v; want empty, oldest %v", summary(d), d.oldest, t0)
	}

	names := make([]string, 101)
	for i := range names {
		names[i] = "n" + string(rune('a'+i%26)) + time.Duration(i).String()
	}
	if err := w.update(tbl, subscription{subscribe: names}, 100); err == nil {
		t.Error("101 subscriptions with a limit of 100 accepted")
	}
	if err := newWatch(addrType).start(tbl, subscription{initialVersions: map[string]string{"a": "1", "b": "2"}}, 1); err == nil {
		t.Error("2 initial versions with a limit of 1 accepted")
	}
}
