// Package ci lets tests tell a missing prerequisite (root, etcd, protoc, the
// Kubernetes binaries) from a failure. Outside CI such a test skips with the
// reason; under CI (the CI environment variable is set, as .ci/run runs) it
// fails, so that a green CI run means every test level really ran.
//
// Only tests import this package.
package ci

import (
	"fmt"
	"os"
	"strconv"
)

// Enabled reports whether tests run under CI: the CI environment variable is
// set to a true value ("true", "1", ...).
func Enabled() bool {
	v, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && v
}

// TB is the part of testing.TB that Unavailable needs.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
}

// Unavailable ends the test because a prerequisite is missing: it fails under
// CI and skips otherwise. The message should say what to install or run.
func Unavailable(t TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Enabled() {
		t.Fatalf("prerequisite missing under CI: %s", msg)
	}
	t.Skipf("prerequisite missing (this fails under CI): %s", msg)
}
