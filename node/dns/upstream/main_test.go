package upstream

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	runHelper()
	base := runtime.NumGoroutine()
	code := m.Run()
	// Every test stops what it started: servers, forwards, child
	// processes. Goroutines left over are a leak (fuzzing workers are
	// not counted: the fuzzing engine keeps its own).
	if f := flag.Lookup("test.fuzz"); code == 0 && (f == nil || f.Value.String() == "") {
		if !goroutinesBackTo(base, 5*time.Second) {
			buf := make([]byte, 1<<20)
			fmt.Fprintf(os.Stderr, "goroutines: %d before the tests, %d after:\n%s\n", base, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
			code = 1
		}
	}
	os.Exit(code)
}

// goroutinesBackTo waits up to timeout for the goroutine count to fall to
// base, the count before some work; goroutines end a little after what
// ended them (a closed connection's reader), hence the polling.
func goroutinesBackTo(base int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
