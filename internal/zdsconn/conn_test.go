package zdsconn

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	zdspb "github.com/canopy-mesh/canopy/workloadapi/zds"
)

func pair(t testing.TB) (*Conn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "zds")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	a, b := mk(fds[0]), mk(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return New(a), b
}

func TestSendRecvWithNetns(t *testing.T) {
	c, peer := pair(t)
	ns, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	req := &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{Uid: "u"}}}
	if err := c.Send(req, ns, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	var got zdspb.WorkloadRequest
	fds, err := New(peer).Recv(&got, time.Now().Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer fds[0].Close()
	if len(fds) != 1 || !IsNetns(fds[0]) || !proto.Equal(req, &got) {
		t.Errorf("got %v with %d fds", &got, len(fds))
	}
	if f, _ := os.Open("/dev/null"); IsNetns(f) {
		t.Error("/dev/null is a netns?")
	}
}

func TestRecvRejectsTruncated(t *testing.T) {
	c, peer := pair(t)
	if _, err := peer.Write(make([]byte, 2000)); err != nil {
		t.Fatal(err)
	}
	var m zdspb.WorkloadRequest
	if _, err := c.Recv(&m, time.Now().Add(time.Second)); !errors.Is(err, ErrProtocol) {
		t.Errorf("Recv of 2000 bytes = %v, want ErrProtocol", err)
	}
}

// FuzzRecv: arbitrary datagrams never panic; a failure is a protocol error.
func FuzzRecv(f *testing.F) {
	b, _ := proto.Marshal(&zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: &zdspb.Ack{Error: "x"}}})
	f.Add(b)
	f.Add([]byte{0x0a, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		c, peer := pair(t)
		if _, err := peer.Write(data); err != nil {
			t.Skip(err)
		}
		var m zdspb.WorkloadResponse
		if _, err := c.Recv(&m, time.Now().Add(time.Second)); err != nil && !errors.Is(err, ErrProtocol) {
			t.Fatalf("Recv(%x) = %v, not a protocol error", data, err)
		}
	})
}
