package kubelet

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestDeletedPodsKeepTheirLogs: a deleted pod's container logs outlive its
// directory, and a node keeps only the newest keptLogs of them.
func TestDeletedPodsKeepTheirLogs(t *testing.T) {
	state := t.TempDir()
	p := &Provider{cfg: Config{StateDir: state}}
	end := func(i int) {
		t.Helper()
		uid := types.UID(fmt.Sprintf("uid-%03d", i))
		r := &podRuntime{
			p: p, log: slog.New(slog.DiscardHandler),
			dir: filepath.Join(state, "pods", string(uid)),
			pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: fmt.Sprintf("agent-%d", i), UID: uid}},
		}
		if err := os.MkdirAll(filepath.Join(r.dir, "logs"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.dir, "logs", "agent.log"), []byte(fmt.Sprintf("last words %d\n", i)), 0o644); err != nil {
			t.Fatal(err)
		}
		r.teardown()
		if _, err := os.Stat(r.dir); !os.IsNotExist(err) {
			t.Fatalf("pod directory left: %v", err)
		}
	}
	for i := range keptLogs + 3 {
		end(i)
	}
	kept, err := filepath.Glob(filepath.Join(state, "terminated", "*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != keptLogs {
		t.Errorf("%d pods' logs kept, want %d", len(kept), keptLogs)
	}
	last := keptLogs + 2
	b, err := os.ReadFile(filepath.Join(state, "terminated", fmt.Sprintf("istio-system_agent-%d_uid-%03d", last, last), "agent.log"))
	if err != nil || string(b) != fmt.Sprintf("last words %d\n", last) {
		t.Errorf("newest pod's log = %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(state, "terminated", "istio-system_agent-0_uid-000")); !os.IsNotExist(err) {
		t.Errorf("oldest pod's log kept beyond the bound: %v", err)
	}
}
