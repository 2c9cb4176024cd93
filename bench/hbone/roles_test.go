package hbone_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The load generator and the servers run in processes of their own: this
// test binary started again with roleEnv set. The benchmark's process then
// holds only the proxies of the path under test, so they get their share
// of the cores, and its CPU profile and memory figures are theirs alone.
const (
	roleEnv = "CANOPY_HBONE_BENCH_ROLE"
	loadEnv = "CANOPY_HBONE_BENCH_LOAD"
)

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "":
		os.Exit(m.Run())
	case "servers":
		serveRole()
	case "load":
		if err := loadRole(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "unknown %s\n", roleEnv)
		os.Exit(2)
	}
	os.Exit(0)
}

// serveRole runs the servers, a sink (discards, answers the byte count at
// the client's half-close) and an echo, prints their addresses and runs
// until its standard input closes.
func serveRole() {
	sinkAddr := serve(sink)
	echoAddr := serve(func(c net.Conn) { _, _ = io.Copy(c, c); c.Close() })
	fmt.Printf("%s %s\n", sinkAddr, echoAddr)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

func serve(handle func(net.Conn)) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return l.Addr().String()
}

// servers starts the servers' process for the benchmark and returns the
// sink's and the echo's addresses.
func servers(b *testing.B) (sinkAddr, echoAddr string) {
	b.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), roleEnv+"=servers")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("servers: %v", err)
	}
	if _, err := fmt.Sscan(line, &sinkAddr, &echoAddr); err != nil {
		b.Fatalf("servers said %q: %v", line, err)
	}
	return sinkAddr, echoAddr
}

// load is what the load generator does, in one of its modes:
//
//   - "stream": Streams connections to Addr (the sink) at once, each
//     writing Bytes/Streams in 1 MiB writes, then half-closing and reading
//     the sink's count;
//   - "rr": one connection to Addr (the echo), N round trips of Size
//     bytes;
//   - "connect": N connections to Addr (the echo) one after another, one
//     byte there and back each;
//   - "hold": N connections to Addr (the echo), one round trip each, held
//     open until the generator's standard input closes.
type load struct {
	Mode    string
	Addr    string
	Streams int
	Bytes   int64
	Size    int
	N       int
}

// result is what the load generator measured.
type result struct {
	Seconds float64
	// StreamBytes are the bytes each stream moved and StreamSeconds how
	// long it took, from the first write to the sink's count ("stream").
	StreamBytes   []int64
	StreamSeconds []float64
	// P50, P99 are round-trip latencies ("rr").
	P50, P99 time.Duration
}

// run runs the load generator to its end and returns what it measured.
func (l load) run(b *testing.B) result {
	b.Helper()
	spec, _ := json.Marshal(l)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), roleEnv+"=load", loadEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("load %s: %v", spec, err)
	}
	var r result
	if err := json.Unmarshal(out, &r); err != nil {
		b.Fatalf("load %s said %q: %v", spec, out, err)
	}
	return r
}

// hold opens the connections of a "hold" load and returns once they are
// established end to end; release closes them.
func (l load) hold(b *testing.B) (release func()) {
	b.Helper()
	spec, _ := json.Marshal(l)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), roleEnv+"=load", loadEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || strings.TrimSpace(line) != "held" {
		b.Fatalf("hold %s: %q, %v", spec, line, err)
	}
	return func() { stdin.Close(); _ = cmd.Wait() }
}

func loadRole() error {
	var l load
	if err := json.Unmarshal([]byte(os.Getenv(loadEnv)), &l); err != nil {
		return fmt.Errorf("%s: %w", loadEnv, err)
	}
	var r result
	var err error
	switch l.Mode {
	case "stream":
		r, err = l.stream()
	case "rr":
		r, err = l.roundTrips()
	case "connect":
		r, err = l.connect()
	case "hold":
		return l.holdConns()
	default:
		return fmt.Errorf("unknown load mode %q", l.Mode)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

func (l load) stream() (result, error) {
	conns := make([]net.Conn, l.Streams)
	for i := range conns {
		c, err := net.Dial("tcp", l.Addr)
		if err != nil {
			return result{}, err
		}
		conns[i] = c
	}
	buf := make([]byte, 1<<20)
	r := result{StreamBytes: make([]int64, l.Streams), StreamSeconds: make([]float64, l.Streams)}
	errs := make([]error, l.Streams)
	per := l.Bytes / int64(l.Streams)
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			defer c.Close()
			for sent := int64(0); sent < per; {
				n, err := c.Write(buf[:min(int64(len(buf)), per-sent)])
				sent += int64(n)
				if err != nil {
					errs[i] = err
					return
				}
			}
			_ = c.(*net.TCPConn).CloseWrite()
			// The sink's count: every byte arrived.
			count, err := io.ReadAll(c)
			if err != nil {
				errs[i] = err
				return
			}
			r.StreamSeconds[i] = time.Since(start).Seconds()
			_, errs[i] = fmt.Sscan(string(count), &r.StreamBytes[i])
		})
	}
	wg.Wait()
	r.Seconds = time.Since(start).Seconds()
	for _, err := range errs {
		if err != nil {
			return result{}, err
		}
	}
	return r, nil
}

func (l load) roundTrips() (result, error) {
	c, err := net.Dial("tcp", l.Addr)
	if err != nil {
		return result{}, err
	}
	defer c.Close()
	msg := make([]byte, l.Size)
	took := make([]time.Duration, 0, l.N)
	start := time.Now()
	for range l.N {
		t := time.Now()
		if _, err := c.Write(msg); err != nil {
			return result{}, err
		}
		if _, err := io.ReadFull(c, msg); err != nil {
			return result{}, err
		}
		took = append(took, time.Since(t))
	}
	r := result{Seconds: time.Since(start).Seconds()}
	slices.Sort(took)
	r.P50, r.P99 = took[len(took)/2], took[len(took)*99/100]
	return r, nil
}

func (l load) connect() (result, error) {
	one := []byte{1}
	start := time.Now()
	for range l.N {
		c, err := net.Dial("tcp", l.Addr)
		if err != nil {
			return result{}, err
		}
		if _, err := c.Write(one); err != nil {
			return result{}, err
		}
		if _, err := io.ReadFull(c, one); err != nil {
			return result{}, err
		}
		c.Close()
	}
	return result{Seconds: time.Since(start).Seconds()}, nil
}

func (l load) holdConns() error {
	one := []byte{1}
	conns := make([]net.Conn, l.N)
	for i := range conns {
		c, err := net.Dial("tcp", l.Addr)
		if err != nil {
			return err
		}
		if _, err := c.Write(one); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, one); err != nil {
			return err
		}
		conns[i] = c
	}
	fmt.Println("held")
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
	return nil
}
