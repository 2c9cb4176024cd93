package echo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestLoadAgainstAServerThatStays(t *testing.T) {
	s := startServer(t)
	rep, err := RunLoad(t.Context(), &net.Dialer{}, LoadConfig{Addr: s.TCPAddr().String(), Duration: 300 * time.Millisecond,
		Interval: 5 * time.Millisecond, Held: 2, HeldEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failures != 0 || rep.HeldFailures != 0 || rep.Connections < 10 || rep.Held != 2 || rep.HeldEchoes < 4 {
		t.Errorf("report %+v: want no failures, at least 10 connections, 2 held with echoes", rep)
	}
	if rep.LongestStall > 200*time.Millisecond {
		t.Errorf("longest stall %s against a server on loopback", rep.LongestStall)
	}
}

// TestLoadSeesAServerGo: a server that stops mid-run shows as refused new
// connections, failed held ones, and a stall until the end.
func TestLoadSeesAServerGo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	conns := make(chan net.Conn, 100)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
			go func() { _, _ = io.Copy(c, c) }()
		}
	}()
	go func() {
		<-ctx.Done()
		ln.Close()
		for {
			select {
			case c := <-conns:
				c.Close()
			default:
				return
			}
		}
	}()
	time.AfterFunc(150*time.Millisecond, stop)
	rep, err := RunLoad(t.Context(), &net.Dialer{}, LoadConfig{Addr: ln.Addr().String(), Duration: 400 * time.Millisecond,
		Interval: 5 * time.Millisecond, Held: 1, HeldEvery: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The held connection is cut, and each one dialled to replace it is
	// refused.
	if rep.ByKind["refused"] == 0 || rep.HeldFailures < 2 || rep.Held != rep.HeldFailures || rep.LongestStall < 200*time.Millisecond {
		t.Errorf("report %+v: want refused connections, the held one and its replacements failed, a stall of the run's rest", rep)
	}
	// Each failure is dated: none before the server went (150 ms in).
	sum := func(at map[int]int) (n int) {
		for _, v := range at {
			n += v
		}
		return n
	}
	if sum(rep.FailuresAt) != rep.Failures || sum(rep.HeldFailuresAt) != rep.HeldFailures {
		t.Errorf("failures dated %v and %v, want %d and %d", rep.FailuresAt, rep.HeldFailuresAt, rep.Failures, rep.HeldFailures)
	}
}

func TestFailureKind(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), "refused"},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), "reset"},
		{fmt.Errorf("write: %w", syscall.EPIPE), "reset"},
		{fmt.Errorf("read: %w", os.ErrDeadlineExceeded), "timeout"},
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), "eof"},
		{fmt.Errorf("read: %w", io.EOF), "eof"},
		{fmt.Errorf("dial: no route"), "other"},
	} {
		if got := failureKind(tt.err); got != tt.want {
			t.Errorf("failureKind(%v) = %s, want %s", tt.err, got, tt.want)
		}
	}
}

func TestLoadEndpoints(t *testing.T) {
	s := startServer(t)
	base := "http://" + s.HTTPAddr().String()
	target := url.QueryEscape(s.TCPAddr().String())
	for _, q := range []string{"", "addr=" + target, "addr=" + target + "&duration=11m", "addr=" + target + "&duration=1s&interval=0s",
		"addr=" + target + "&duration=1s&held=101", "addr=" + target + "&duration=x"} {
		if code, body := get(t, http.MethodGet, base+"/load/start?"+q); code != http.StatusBadRequest {
			t.Errorf("start ?%s: %d %q, want 400", q, code, body)
		}
	}
	if code, _ := get(t, http.MethodGet, base+"/load/result"); code != http.StatusNotFound {
		t.Errorf("result before a run: %d, want 404", code)
	}
	if code, body := get(t, http.MethodGet, base+"/load/start?addr="+target+"&duration=300ms&held=1"); code != http.StatusOK {
		t.Fatalf("start: %d %q", code, body)
	}
	if code, _ := get(t, http.MethodGet, base+"/load/start?addr="+target+"&duration=300ms"); code != http.StatusConflict {
		t.Errorf("a second start while running: %d, want 409", code)
	}
	if code, _ := get(t, http.MethodGet, base+"/load/result"); code != http.StatusConflict {
		t.Errorf("result while running: %d, want 409", code)
	}
	var rep LoadReport
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, body := get(t, http.MethodGet, base+"/load/result")
		if code == http.StatusOK {
			if err := json.Unmarshal([]byte(body), &rep); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no result: %d %q", code, body)
		}
	}
	if rep.Connections == 0 || rep.Failures != 0 || rep.Held != 1 {
		t.Errorf("report %+v", rep)
	}

	// A long run stopped early reports at once.
	if code, body := get(t, http.MethodGet, base+"/load/start?addr="+target+"&duration=10m"); code != http.StatusOK {
		t.Fatalf("start: %d %q", code, body)
	}
	time.Sleep(100 * time.Millisecond)
	if code, body := get(t, http.MethodGet, base+"/load/stop"); code != http.StatusOK {
		t.Fatalf("stop: %d %q", code, body)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, body := get(t, http.MethodGet, base+"/load/result")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no result within 5s of a stop: %d %q", code, body)
		}
	}
}
