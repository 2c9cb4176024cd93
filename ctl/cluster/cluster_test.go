package cluster_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/canopy-mesh/canopy/ctl/cluster"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// TestErrorsSayWhatToDo: the first thing a user without Canopy meets.
func TestErrorsSayWhatToDo(t *testing.T) {
	testenv.Need(t, env)
	c, err := cluster.Connect(t.Context(), env.KubeconfigPath, "")
	if err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t, "ctl", nil)
	_, err = c.Pods(t.Context(), ns, cluster.ControllerApp)
	if err == nil || !strings.Contains(err.Error(), "no canopy-controller pod in namespace "+ns+": run canopyctl install, or pass -i/--istio-namespace") {
		t.Errorf("no controller: %v", err)
	}
}

// writeKubeconfig writes a kubeconfig with contexts "dead" (current) and
// "other", whose API servers listen nowhere.
func writeKubeconfig(t *testing.T, current string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := `apiVersion: v1
kind: Config
clusters:
- name: dead
  cluster: {server: "https://127.0.0.1:1"}
contexts:
- name: dead
  context: {cluster: dead, user: u}
- name: other
  context: {cluster: dead, user: u}
current-context: ` + current + `
users:
- name: u
  user: {token: x}
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConnectUnknownContext(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, current, context string
		want                   cluster.ContextNotFoundError
	}{
		{"--context", "dead", "nosuch", cluster.ContextNotFoundError{Name: "nosuch", Contexts: []string{"dead", "other"}}},
		{"current-context", "gone", "", cluster.ContextNotFoundError{Name: "gone", Current: true, Contexts: []string{"dead", "other"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := writeKubeconfig(t, tt.current)
			_, err := cluster.Connect(t.Context(), path, tt.context)
			var got *cluster.ContextNotFoundError
			if !errors.As(err, &got) {
				t.Fatalf("Connect: %v, want a ContextNotFoundError", err)
			}
			tt.want.Kubeconfig = path
			if diff := cmp.Diff(&tt.want, got); diff != "" {
				t.Errorf("ContextNotFoundError (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConnectUnreachable(t *testing.T) {
	t.Parallel()
	_, err := cluster.Connect(t.Context(), writeKubeconfig(t, "dead"), "")
	if err == nil || !strings.HasPrefix(err.Error(), "cannot reach the API server at https://127.0.0.1:1: ") ||
		!strings.HasSuffix(err.Error(), "; is the cluster running? check --kubeconfig/--context") {
		t.Errorf("Connect to a server that does not listen: %v", err)
	}
}
