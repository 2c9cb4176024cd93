package hbone

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/testcerts"
)

// silentStream is a client stream to a server that answers 200 and then
// neither reads nor writes until the test ends.
func silentStream(t *testing.T) *Stream {
	t.Helper()
	scfg, ccfg := testcerts.MutualTLS(t, "hbone")
	addr, _ := serveTLS(t, scfg, block(t))
	cc := dial(t, addr, ccfg)
	s, err := cc.Connect(t.Context(), "10.244.1.5:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// within runs op and returns its error, failing the test if op does not
// return.
func within(t *testing.T, op func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- op() }()
	select {
	case err := <-errc:
		return err
	case <-time.After(eventually.DefaultTimeout):
		t.Fatal("blocked past its deadline")
		return nil
	}
}

func isDeadline(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) && errors.As(err, &ne) && ne.Timeout()
}

func TestStreamDeadlines(t *testing.T) {
	ops := []struct {
		name string
		set  func(s *Stream, t time.Time) error
		op   func(s *Stream) error
	}{
		{"Read", (*Stream).SetReadDeadline, func(s *Stream) error {
			_, err := s.Read(make([]byte, 10))
			return err
		}},
		{"WriteTo", (*Stream).SetReadDeadline, func(s *Stream) error {
			_, err := s.WriteTo(io.Discard)
			return err
		}},
		{"Write past the window", (*Stream).SetWriteDeadline, func(s *Stream) error {
			_, err := s.Write(make([]byte, 2*StreamWindow))
			return err
		}},
		{"ReadFrom past the window", (*Stream).SetWriteDeadline, func(s *Stream) error {
			_, err := s.ReadFrom(bytes.NewReader(make([]byte, 2*StreamWindow)))
			return err
		}},
		{"Read, SetDeadline", (*Stream).SetDeadline, func(s *Stream) error {
			_, err := s.Read(make([]byte, 10))
			return err
		}},
	}
	for _, o := range ops {
		t.Run(o.name+", deadline ahead", func(t *testing.T) {
			s := silentStream(t)
			_ = o.set(s, time.Now().Add(short))
			if err := within(t, func() error { return o.op(s) }); !isDeadline(err) {
				t.Errorf("error %v, want a timeout matching os.ErrDeadlineExceeded", err)
			}
			// An expired deadline fails at once, every time.
			if err := within(t, func() error { return o.op(s) }); !isDeadline(err) {
				t.Errorf("again: error %v, want a timeout", err)
			}
		})
		t.Run(o.name+", deadline set while blocked", func(t *testing.T) {
			s := silentStream(t)
			errc := make(chan error, 1)
			go func() { errc <- o.op(s) }()
			_ = o.set(s, time.Now().Add(-time.Second))
			if err := within(t, func() error { return <-errc }); !isDeadline(err) {
				t.Errorf("error %v, want a timeout", err)
			}
		})
	}
}

// TestStreamDeadlineCleared: clearing an expired deadline lets I/O
// through again.
func TestStreamDeadlineCleared(t *testing.T) {
	cc := pair(t) // echo
	s, err := cc.Connect(t.Context(), "10.244.1.5:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(-time.Second))
	if _, err := s.Write([]byte("x")); !isDeadline(err) {
		t.Fatalf("Write past the deadline = %v", err)
	}
	_ = s.SetDeadline(time.Now().Add(time.Hour)) // a deadline not reached
	if _, err := s.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	_ = s.SetDeadline(time.Time{})
	got := make([]byte, 4)
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "ping" {
		t.Errorf("echo %q, %v", got, err)
	}
}
