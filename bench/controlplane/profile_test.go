package controlplane_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// profileDir is where CPU profiles of canopy-controller are written when
// CANOPY_BENCH_PROFILE_DIR names a directory; "" turns profiling off.
func profileDir() string { return os.Getenv("CANOPY_BENCH_PROFILE_DIR") }

// profileSeconds is how long a profile runs: CANOPY_BENCH_PROFILE_SECONDS,
// default 20, enough for one side's rounds of a sub-benchmark.
func profileSeconds() int {
	if n, err := strconv.Atoi(os.Getenv("CANOPY_BENCH_PROFILE_SECONDS")); err == nil && n > 0 {
		return n
	}
	return 20
}

// freeLoopbackAddr is a loopback address with a port free a moment ago.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startProfile starts a CPU profile of s (canopy-controller through its
// debug views) for profileSeconds and returns a func that waits for it
// and writes it to <profileDir>/<what>.pprof. Without a profile
// directory, or for istiod, it does nothing.
func startProfile(b *testing.B, s *side, what string) (wait func()) {
	b.Helper()
	if profileDir() == "" || s.debugAddr == "" {
		return func() {}
	}
	secs := profileSeconds()
	done := make(chan error, 1)
	path := filepath.Join(profileDir(), what+".pprof")
	go func() {
		done <- fetchTo(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", s.debugAddr, secs), path, time.Duration(secs+30)*time.Second)
	}()
	return func() {
		if err := <-done; err != nil {
			b.Errorf("CPU profile of %s: %v", what, err)
			return
		}
		b.Logf("CPU profile of canopy-controller during %s: %s", what, path)
	}
}

// heapProfile writes a heap profile of s (canopy-controller, after a
// collection) to <profileDir>/<what>-heap.pprof: what is live, as against
// the resident memory the figures report. Without a profile directory, or
// for istiod, it does nothing.
func heapProfile(b *testing.B, s *side, what string) {
	b.Helper()
	if profileDir() == "" || s.debugAddr == "" {
		return
	}
	path := filepath.Join(profileDir(), what+"-heap.pprof")
	if err := fetchTo(fmt.Sprintf("http://%s/debug/pprof/heap?gc=1", s.debugAddr), path, 30*time.Second); err != nil {
		b.Errorf("heap profile of %s: %v", what, err)
		return
	}
	b.Logf("heap profile of canopy-controller with %s: %s", what, path)
}

// fetchTo writes what url answers to the file at path.
func fetchTo(url, path string, timeout time.Duration) error {
	client := http.Client{Timeout: timeout}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
