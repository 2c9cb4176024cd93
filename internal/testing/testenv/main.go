package testenv

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"testing"

	"github.com/canopy-mesh/canopy/internal/testing/ci"
)

// EnvKeep, when set to a true value, keeps the state directory and logs
// even when every test passes.
const EnvKeep = "CANOPY_TESTENV_KEEP"

// Main starts an environment for a test package, stores it in *env, runs the
// package's tests and stops it; TestMain passes the result to os.Exit. Logs
// are kept, and their directory printed, when a test fails.
//
// When a prerequisite is missing, *env stays nil and tests that call Need
// skip; under CI, Main fails instead.
func Main(m *testing.M, env **Environment) int {
	// testing.Verbose needs the flags, which m.Run would parse later.
	if !flag.Parsed() {
		flag.Parse()
	}
	if testing.Short() {
		return m.Run() // Need skips every test
	}
	opts := Options{}
	if testing.Verbose() {
		opts.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	e, err := startWithRetry(opts)
	switch {
	case errors.Is(err, ErrUnavailable) && !ci.Enabled():
		fmt.Fprintf(os.Stderr, "testenv: kube-level tests will skip (they fail under CI): %v\n", err)
		return m.Run()
	case err != nil:
		fmt.Fprintf(os.Stderr, "testenv: start: %v\n", err)
		return 1
	}
	*env = e

	code := m.Run()
	keep := code != 0 || envBool(EnvKeep)
	if keep {
		fmt.Fprintf(os.Stderr, "testenv: component logs kept in %s\n", e.Dir())
	}
	if err := e.Stop(keep); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stop: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// startWithRetry starts an environment, trying again when a component fails
// to start: free ports are found, not reserved, so test packages starting in
// parallel can rarely race for one.
func startWithRetry(opts Options) (*Environment, error) {
	const attempts = 3
	var err error
	for i := 1; i <= attempts; i++ {
		var e *Environment
		if e, err = Start(context.Background(), opts); err == nil || errors.Is(err, ErrUnavailable) {
			return e, err
		}
		if i < attempts {
			fmt.Fprintf(os.Stderr, "testenv: start attempt %d of %d failed, trying again: %v\n", i, attempts, err)
		}
	}
	return nil, err
}

// Need skips (or, under CI, fails) a test when Main could not start the
// environment. In -short mode it always skips.
func Need(t testing.TB, env *Environment) {
	t.Helper()
	if testing.Short() {
		t.Skip("kube-level test: skipped in -short mode")
	}
	if env == nil {
		ci.Unavailable(t, "no Kubernetes test environment (see the testenv line at the top of the test output)")
	}
}

func envBool(name string) bool {
	v, err := strconv.ParseBool(os.Getenv(name))
	return err == nil && v
}
