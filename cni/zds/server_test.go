package zds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/zdsconn"
	zdspb "github.com/canopy-mesh/canopy/workloadapi/zds"
)

// proxy is a test node proxy: it connects, says hello, and records and
// acknowledges every request, checking each Add's fd is a netns.
type proxy struct {
	t    *testing.T
	mu   sync.Mutex
	got  []string
	conn *zdsconn.Conn
	// inode of the netns each Add carried.
	inodes map[string]uint64
	// refuse makes Adds fail with this error.
	refuse string
}

func connect(t *testing.T, path string) *proxy { return connectRefusing(t, path, "") }

// connectRefusing connects a proxy that refuses every Add with refuse
// (empty: accepts).
func connectRefusing(t *testing.T, path, refuse string) *proxy {
	t.Helper()
	p := &proxy{t: t, inodes: map[string]uint64{}, refuse: refuse}
	var uc *net.UnixConn
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if uc, err = net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"}); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	p.conn = zdsconn.New(uc)
	t.Cleanup(func() { p.conn.Close() })
	if err := p.conn.Send(&zdspb.ZdsHello{Version: zdspb.Version_V1}, nil, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	go p.serve()
	return p
}

func (p *proxy) serve() {
	for {
		var req zdspb.WorkloadRequest
		fds, err := p.conn.Recv(&req, time.Time{})
		if err != nil {
			return
		}
		ack := &zdspb.Ack{}
		var entry string
		switch r := req.GetPayload().(type) {
		case *zdspb.WorkloadRequest_Add:
			entry = "add " + r.Add.GetUid()
			if len(fds) != 1 || !zdsconn.IsNetns(fds[0]) {
				ack.Error = fmt.Sprintf("want one netns fd, got %d", len(fds))
				break
			}
			var st syscall.Stat_t
			_ = syscall.Fstat(int(fds[0].Fd()), &st)
			p.mu.Lock()
			p.inodes[r.Add.GetUid()] = st.Ino
			if p.refuse != "" {
				ack.Error = p.refuse
			}
			p.mu.Unlock()
		case *zdspb.WorkloadRequest_Keep:
			entry = "keep " + r.Keep.GetUid()
		case *zdspb.WorkloadRequest_Del:
			entry = "del " + r.Del.GetUid()
		case *zdspb.WorkloadRequest_SnapshotSent:
			entry = "snapshot-sent"
		}
		for _, f := range fds {
			f.Close()
		}
		p.mu.Lock()
		p.got = append(p.got, entry)
		p.mu.Unlock()
		if err := p.conn.Send(&zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: ack}}, nil, time.Now().Add(time.Second)); err != nil {
			return
		}
	}
}

func (p *proxy) received() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.got...)
}

func selfNetns(t *testing.T) (*os.File, uint64) {
	t.Helper()
	f, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return f, st.Ino
}

func start(t *testing.T, path string, s *Server) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

func info(name string) *zdspb.WorkloadInfo {
	return &zdspb.WorkloadInfo{Name: name, Namespace: "default", ServiceAccount: "default"}
}

// TestSnapshotAndSteadyState: a connecting proxy gets every pod (Add with
// a working netns fd, Keep without), then SnapshotSent; later adds go to
// the newest proxy only, deletes to all; after an agent restart a proxy
// gets a full snapshot again.
func TestSnapshotAndSteadyState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ztunnel.sock")
	var delivered sync.Map
	log := slog.New(slog.DiscardHandler)
	s := New(path, Config{Keepalive: 50 * time.Millisecond, OnDelivered: func(uid string) { delivered.Store(uid, true) }}, log)

	// Before any proxy: recorded, ErrNoProxy.
	nsA, inode := selfNetns(t)
	if err := s.Add(Pod{UID: "uid-a", Info: info("a"), Netns: nsA}); !errors.Is(err, ErrNoProxy) {
		t.Fatalf("Add without a proxy = %v, want ErrNoProxy", err)
	}
	if err := s.Add(Pod{UID: "uid-b", Info: info("b")}); !errors.Is(err, ErrNoProxy) {
		t.Fatal(err)
	}
	stop := start(t, path, s)

	old := connect(t, path)
	want := []string{"add uid-a", "keep uid-b", "snapshot-sent"}
	eventually.True(t, "snapshot", func() bool { return cmp.Equal(want, old.received()) })
	if _, ok := delivered.Load("uid-a"); !ok {
		t.Error("OnDelivered not called for the snapshot's Add")
	}
	old.mu.Lock()
	if old.inodes["uid-a"] != inode {
		t.Errorf("netns fd inode %d, want %d", old.inodes["uid-a"], inode)
	}
	old.mu.Unlock()

	// A second proxy (an upgrade): new pods go to it only, deletes to both.
	newer := connect(t, path)
	eventually.True(t, "second snapshot", func() bool { return len(newer.received()) == 3 })
	eventually.True(t, "both connected", func() bool { return s.Connected() == 2 })
	nsC, _ := selfNetns(t)
	if err := s.Add(Pod{UID: "uid-c", Info: info("c"), Netns: nsC}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("uid-a"); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(append(want, "del uid-a"), old.received()); diff != "" {
		t.Errorf("old proxy (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(append(want, "add uid-c", "del uid-a"), newer.received()); diff != "" {
		t.Errorf("newer proxy (-want +got):\n%s", diff)
	}

	// A proxy that leaves is dropped by the keepalive.
	old.conn.Close()
	eventually.True(t, "keepalive drops the old proxy", func() bool { return s.Connected() == 1 })

	// Agent restart: a new server learns the pods again, and the proxy,
	// reconnecting, gets all of them.
	stop()
	s2 := New(path, Config{}, log)
	nsC2, _ := selfNetns(t)
	_ = s2.Add(Pod{UID: "uid-b", Info: info("b")})
	_ = s2.Add(Pod{UID: "uid-c", Info: info("c"), Netns: nsC2})
	defer start(t, path, s2)()
	again := connect(t, path)
	eventually.True(t, "snapshot after restart", func() bool {
		return cmp.Equal([]string{"keep uid-b", "add uid-c", "snapshot-sent"}, again.received())
	})
}

// TestProtocolErrors: a bad hello, an Add the proxy refuses.
func TestProtocolErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ztunnel.sock")
	s := New(path, Config{Keepalive: 20 * time.Millisecond}, slog.New(slog.DiscardHandler))
	defer start(t, path, s)()

	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	for i := 0; err != nil && i < 100; i++ {
		time.Sleep(10 * time.Millisecond)
		uc, err = net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := uc.Write([]byte{0xff, 0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	// The server closes a connection whose hello does not decode.
	_ = uc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := uc.Read(make([]byte, 10)); err == nil {
		t.Error("server kept a connection with a garbage hello")
	}
	uc.Close()

	p := connect(t, path)
	eventually.True(t, "snapshot", func() bool { return len(p.received()) == 1 })
	p.mu.Lock()
	p.refuse = "cannot enter netns"
	p.mu.Unlock()
	ns, _ := selfNetns(t)
	if err := s.Add(Pod{UID: "uid-x", Info: info("x"), Netns: ns}); err == nil || !strings.Contains(err.Error(), "cannot enter netns") {
		t.Errorf("Add refused by the proxy = %v, want its error", err)
	}
	if !s.Has("uid-x") {
		t.Error("a refused pod must stay recorded for the next snapshot")
	}

	big := &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{Uid: string(make([]byte, 2000))}}}
	if err := (&conn{c: p.conn}).c.Send(big, nil, time.Now().Add(time.Second)); !errors.Is(err, zdsconn.ErrProtocol) {
		t.Errorf("sending 2000 bytes = %v, want ErrProtocol", err)
	}
}

// TestRefusedPodDoesNotAbortTheSnapshot: the proxy refuses one pod; the
// others and SnapshotSent still arrive.
func TestRefusedPodDoesNotAbortTheSnapshot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ztunnel.sock")
	s := New(path, Config{}, slog.New(slog.DiscardHandler))
	nsA, _ := selfNetns(t)
	nsB, _ := selfNetns(t)
	_ = s.Add(Pod{UID: "uid-a", Info: info("a"), Netns: nsA})
	_ = s.Add(Pod{UID: "uid-b", Info: info("b"), Netns: nsB})
	defer start(t, path, s)()
	p := connectRefusing(t, path, "not yet")
	eventually.True(t, "snapshot completes despite refusals", func() bool {
		got := p.received()
		return len(got) == 3 && got[2] == "snapshot-sent"
	})
	eventually.True(t, "the connection is kept", func() bool { return s.Connected() == 1 })
}

// TestLongAckIsARefusal: ztunnel puts a failure's whole text in the Ack
// (src/inpod/linux/protocol.rs send_nack), however long. Such an Ack is a
// refusal, its text cut to a bounded, valid length, and the connection
// stays: the next pod goes through on it.
func TestLongAckIsARefusal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ztunnel.sock")
	s := New(path, Config{}, slog.New(slog.DiscardHandler))
	defer start(t, path, s)()

	var uc *net.UnixConn
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if uc, err = net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"}); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	zc := zdsconn.New(uc)
	t.Cleanup(func() { zc.Close() })
	if err := zc.Send(&zdspb.ZdsHello{Version: zdspb.Version_V1}, nil, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	const prefix = "failed to add workload: "
	go func() {
		for {
			var req zdspb.WorkloadRequest
			fds, err := zc.Recv(&req, time.Time{})
			if err != nil {
				return
			}
			closeFiles(fds)
			ack := &zdspb.Ack{}
			if req.GetAdd().GetUid() == "uid-long" {
				ack.Error = prefix + strings.Repeat("ü", 20_000)
			}
			// Written raw: zdsconn.Send would refuse a datagram this long.
			b, _ := proto.Marshal(&zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: ack}})
			if _, err := uc.Write(b); err != nil {
				return
			}
		}
	}()
	eventually.True(t, "connected", func() bool { return s.Connected() == 1 })

	ns, _ := selfNetns(t)
	err = s.Add(Pod{UID: "uid-long", Info: info("long"), Netns: ns})
	var refused *RefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("Add answered by a 40 KB Ack = %v, want a refusal", err)
	}
	if msg := refused.Message; !strings.HasPrefix(msg, prefix+"ü") || !utf8.ValidString(msg) || len(msg) > zdsconn.MaxAckError {
		t.Errorf("refusal of %d bytes (valid UTF-8 %v); want the Ack's start, cut to at most %d bytes", len(msg), utf8.ValidString(msg), zdsconn.MaxAckError)
	}
	ns2, _ := selfNetns(t)
	if err := s.Add(Pod{UID: "uid-next", Info: info("next"), Netns: ns2}); err != nil {
		t.Errorf("Add after a long Ack: %v", err)
	}
	if n := s.Connected(); n != 1 {
		t.Errorf("%d connections after a long Ack, want the one kept", n)
	}
}

// TestAdmitBeforeSnapshot: the server hands Admit the connecting proxy's
// process ID (this test's, SO_PEERCRED) before the snapshot, whose pods
// the proxy opens listeners in; a proxy Admit refuses gets no snapshot
// and is not connected.
func TestAdmitBeforeSnapshot(t *testing.T) {
	for _, tt := range []struct {
		name      string
		refuse    error
		want      []string
		connected int
	}{
		{"admitted", nil, []string{"admit", "keep uid-a", "snapshot-sent"}, 1},
		{"refused", errors.New("no free slot"), []string{"admit"}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ztunnel.sock")
			var p *proxy
			var mu sync.Mutex
			var pids []int
			s := New(path, Config{Keepalive: 20 * time.Millisecond, Admit: func(pid int) error {
				mu.Lock()
				defer mu.Unlock()
				pids = append(pids, pid)
				if p != nil {
					p.mu.Lock()
					p.got = append(p.got, "admit")
					p.mu.Unlock()
				}
				return tt.refuse
			}}, slog.New(slog.DiscardHandler))
			if err := s.Add(Pod{UID: "uid-a", Info: info("a")}); !errors.Is(err, ErrNoProxy) {
				t.Fatal(err)
			}
			stop := start(t, path, s)
			defer stop()
			mu.Lock()
			p = connect(t, path)
			mu.Unlock()
			eventually.True(t, "the proxy's exchange", func() bool { return cmp.Equal(tt.want, p.received()) })
			eventually.True(t, "connections", func() bool { return s.Connected() == tt.connected })
			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff([]int{os.Getpid()}, pids); diff != "" {
				t.Errorf("Admit's pids (-want +got):\n%s", diff)
			}
		})
	}
}
