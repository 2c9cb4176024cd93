package hbone

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// echoApp is an app that echoes each connection's bytes, reading slowly
// when slow is set (so that the tunnel's sink queues and drains).
func echoApp(t *testing.T, slow bool) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					if slow {
						time.Sleep(time.Millisecond)
					}
					n, err := c.Read(buf)
					if _, werr := c.Write(buf[:n]); werr != nil || err != nil {
						_ = c.(*net.TCPConn).CloseWrite()
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

// TestSpliceCarriesBothWays: bytes through both ends' Splice arrive
// whole and in order, with the app reading fast or slowly, and the
// half-closes pass through.
func TestSpliceCarriesBothWays(t *testing.T) {
	for _, slow := range []bool{false, true} {
		via := tunnel(t, echoApp(t, slow))
		c, err := net.Dial("tcp", via)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, 8<<20+123)
		_, _ = rand.Read(want)
		go func() {
			_, _ = c.Write(want)
			_ = c.(*net.TCPConn).CloseWrite()
		}()
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("slow=%v: got %d bytes (%v), want the %d sent", slow, len(got), err, len(want))
		}
	}
}

// TestSpliceEndsWhenTheStreamIsReset: a stream reset while its app
// connection is idle ends Splice: the app reads EOF, and Splice returns
// once the app closes.
func TestSpliceEndsWhenTheStreamIsReset(t *testing.T) {
	cc := pair(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	s, err := cc.Connect(t.Context(), "10.0.0.1:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := Splice(<-accepted, s)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond) // Splice is waiting, idle
	cc.c.removeStream(s.id, ErrReset)
	// The app sees the end of the stream's direction...
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("app read %v, want EOF", err)
	}
	// ...and Splice returns once the app closes.
	client.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrReset) {
			t.Errorf("Splice: %v, want ErrReset", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Splice did not return")
	}
}
