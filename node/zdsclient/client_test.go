package zdsclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/canopy-mesh/canopy/cni/zds"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/zdsconn"
	zdspb "github.com/canopy-mesh/canopy/workloadapi/zds"
)

// recorder is a Handler that records calls; it refuses uids in refuse.
type recorder struct {
	mu     sync.Mutex
	calls  []string
	refuse string
}

func (r *recorder) log(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, s)
}

func (r *recorder) Add(uid string, info *zdspb.WorkloadInfo, netns *os.File) error {
	netns.Close()
	r.log("add " + uid + " " + info.GetNamespace() + "/" + info.GetServiceAccount())
	if uid == r.refuse {
		return fmt.Errorf("cannot serve %s", uid)
	}
	return nil
}
func (r *recorder) Keep(uid string) error { r.log("keep " + uid); return nil }
func (r *recorder) Snapshot() error       { r.log("snapshot"); return nil }
func (r *recorder) Del(uid string) error  { r.log("del " + uid); return nil }

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// TestAgainstTheAgentServer runs the client against the CNI agent's real
// ZDS server.
func TestAgainstTheAgentServer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ztunnel.sock")
	log := slog.New(slog.DiscardHandler)
	server := zds.New(path, zds.Config{}, log)
	ns, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	_ = server.Add(zds.Pod{UID: "a", Info: &zdspb.WorkloadInfo{Name: "a", Namespace: "apps", ServiceAccount: "web"}, Netns: ns})
	_ = server.Add(zds.Pod{UID: "b", Info: &zdspb.WorkloadInfo{Name: "b", Namespace: "apps"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = server.Run(ctx) }()

	rec := &recorder{refuse: "c"}
	cctx, ccancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = Client{Path: path, Handler: rec, Log: log}.Run(cctx) }()
	defer func() { ccancel(); <-done }()

	eventually.True(t, "the client has the snapshot", func() bool { return slices.Equal(rec.got(), []string{"add a apps/web", "keep b", "snapshot"}) })
	ns2, _ := os.Open("/proc/self/ns/net")
	if err := server.Add(zds.Pod{UID: "c", Info: &zdspb.WorkloadInfo{Namespace: "apps", ServiceAccount: "x"}, Netns: ns2}); err == nil {
		t.Error("a refused Add was acknowledged without its error")
	}
	if err := server.Delete("a"); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "the client has deleted a", func() bool { return slices.Contains(rec.got(), "del a") })
}

// longRefusal refuses one pod with an error far longer than a datagram,
// with multi-byte runes and a byte that is not UTF-8.
type longRefusal struct {
	recorder
	uid string
}

const longPrefix = "cannot serve: "

func (r *longRefusal) Add(uid string, info *zdspb.WorkloadInfo, netns *os.File) error {
	if err := r.recorder.Add(uid, info, netns); err != nil || uid != r.uid {
		return err
	}
	return errors.New(longPrefix + strings.Repeat("é", 50_000) + "\xff")
}

// TestLongErrorKeepsTheSession: a handler's error longer than a datagram
// allows goes back cut to fit, as valid UTF-8, and the session goes on: the
// next pod is served on the same connection, with no second snapshot.
func TestLongErrorKeepsTheSession(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ztunnel.sock")
	log := slog.New(slog.DiscardHandler)
	server := zds.New(path, zds.Config{}, log)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = server.Run(ctx) }()

	h := &longRefusal{uid: "long"}
	cctx, ccancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = Client{Path: path, Handler: h, Log: log}.Run(cctx) }()
	defer func() { ccancel(); <-done }()
	eventually.True(t, "connected", func() bool { return server.Connected() == 1 })

	ns, _ := os.Open("/proc/self/ns/net")
	err := server.Add(zds.Pod{UID: "long", Info: &zdspb.WorkloadInfo{Namespace: "apps"}, Netns: ns})
	var refused *zds.RefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("Add of a pod refused at length = %v, want a refusal", err)
	}
	if msg := refused.Message; !strings.HasPrefix(msg, longPrefix+"é") || !utf8.ValidString(msg) || len(msg) > zdsconn.MaxAckError {
		t.Errorf("refusal of %d bytes (valid UTF-8 %v) starting %q; want the error's start, cut to at most %d bytes",
			len(msg), utf8.ValidString(msg), msg[:min(len(msg), 20)], zdsconn.MaxAckError)
	}
	ns2, _ := os.Open("/proc/self/ns/net")
	if err := server.Add(zds.Pod{UID: "next", Info: &zdspb.WorkloadInfo{Namespace: "apps"}, Netns: ns2}); err != nil {
		t.Fatalf("Add after a long refusal: %v", err)
	}
	if diff := cmp.Diff([]string{"snapshot", "add long apps/", "add next apps/"}, h.got()); diff != "" {
		t.Errorf("handler calls (-want +got): the session must not restart\n%s", diff)
	}
}
