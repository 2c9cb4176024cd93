package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/canopy-mesh/canopy/internal/golden"
)

// runMainEnv makes the test binary run canopyctl's main instead of the
// tests: TestBinary re-executes it so that main's real stderr, klog
// included, is what the golden files hold.
const runMainEnv = "CANOPYCTL_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// transcript is how golden files show a run: the command line, the exit
// code, stdout and stderr.
func transcript(args []string, code int, stdout, stderr string) []byte {
	return fmt.Appendf(nil, "$ canopyctl %s\nexit code: %d\n--- stdout\n%s--- stderr\n%s", strings.Join(args, " "), code, stdout, stderr)
}

// TestBinary runs canopyctl as a process (this test binary, re-executed
// into main) against API servers that fail, so that everything on its
// real stderr shows: its own error, naming the fix, and no log line of
// client-go's.
func TestBinary(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// brokenDiscovery answers /version but fails discovery, which makes
	// client-go's discovery cache log through klog.
	brokenDiscovery := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/version" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"major":"1","minor":"37","gitVersion":"v1.37.2"}`)
			return
		}
		http.Error(w, "discovery is down", http.StatusServiceUnavailable)
	}))
	t.Cleanup(brokenDiscovery.Close)
	brokenKubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: %q}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: x}\n", brokenDiscovery.URL)
	if err := os.WriteFile(brokenKubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		name       string
		kubeconfig string
		args       []string
	}{
		{"binary-unreachable-uninstall", "testdata/kubeconfig", []string{"uninstall"}},
		{"binary-unreachable-workloads", "testdata/kubeconfig", []string{"workloads"}},
		{"binary-broken-discovery-uninstall", brokenKubeconfig, []string{"uninstall", "--wait=0"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), exe, tt.args...)
			cmd.Env = append(os.Environ(), runMainEnv+"=1", "KUBECONFIG="+tt.kubeconfig, "HOME="+t.TempDir())
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if err != nil && !errors.As(err, &exit) {
				t.Fatal(err)
			}
			got := transcript(tt.args, cmd.ProcessState.ExitCode(), stdout.String(), stderr.String())
			// The test server's address changes from run to run.
			got = bytes.ReplaceAll(got, []byte(brokenDiscovery.URL), []byte("http://SERVER"))
			golden.Check(t, tt.name+".golden", got)
		})
	}
}
