package zdsconn

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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

// TestAckError: whatever a handler's error says, the Ack carrying it is
// valid (proto3 strings must be UTF-8) and fits one datagram; a short
// text is kept as it is, a long one cut at a rune boundary with a marker.
func TestAckError(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 100_000) // 2 bytes a rune: a cut may fall inside one
	for _, tt := range []struct {
		name, in string
		want     string // "" when the text is cut
	}{
		{"empty", "", ""},
		{"short", "cannot enter netns", "cannot enter netns"},
		{"at the limit", strings.Repeat("x", MaxAckError), strings.Repeat("x", MaxAckError)},
		{"one byte over", strings.Repeat("x", MaxAckError+1), ""},
		{"runes across the cut", "x" + long, ""},
		{"four-byte runes", strings.Repeat("🙂", 10_000), ""},
		{"invalid UTF-8", "bad \xff\xfe byte", "bad \uFFFD byte"},
		{"invalid and long", strings.Repeat("a\xff", 5000), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := AckError(tt.in)
			if !utf8.ValidString(got) {
				t.Errorf("AckError() is not valid UTF-8: %q", got[max(0, len(got)-20):])
			}
			if len(got) > MaxAckError {
				t.Errorf("AckError() is %d bytes, limit %d", len(got), MaxAckError)
			}
			b, err := proto.Marshal(&zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: &zdspb.Ack{Error: got}}})
			if err != nil {
				t.Fatalf("marshal the Ack: %v", err)
			}
			if len(b) >= MaxMessage {
				t.Errorf("the Ack is %d bytes, limit %d", len(b), MaxMessage-1)
			}
			if tt.want != "" || tt.in == "" {
				if got != tt.want {
					t.Errorf("AckError() = %q, want %q", got, tt.want)
				}
				return
			}
			if !strings.HasSuffix(got, truncated) {
				t.Errorf("a cut text does not end with %q: %q", truncated, got[max(0, len(got)-20):])
			}
			head := strings.TrimSuffix(got, truncated)
			if clean := strings.ToValidUTF8(tt.in, "\uFFFD"); !strings.HasPrefix(clean, head) {
				t.Errorf("a cut text is not a prefix of the error")
			}
			if len(got) < MaxAckError-utf8.UTFMax {
				t.Errorf("AckError() kept %d bytes, want about %d", len(got), MaxAckError)
			}
		})
	}
}

// TestSetReadLimit: a connection with a larger read limit takes a datagram
// the default one would find truncated.
func TestSetReadLimit(t *testing.T) {
	c, peer := pair(t)
	c.SetReadLimit(64 << 10)
	b, err := proto.Marshal(&zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: &zdspb.Ack{Error: strings.Repeat("x", 10_000)}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Write(b); err != nil {
		t.Fatal(err)
	}
	var m zdspb.WorkloadResponse
	if _, err := c.Recv(&m, time.Now().Add(time.Second)); err != nil {
		t.Fatalf("Recv of %d bytes with a 64 KiB limit: %v", len(b), err)
	}
	if got := len(m.GetAck().GetError()); got != 10_000 {
		t.Errorf("error text of %d bytes, want 10000", got)
	}
}
