package agent_test

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/pluginevent"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
)

// TestNamespaceRecord: the agent keeps the record of the namespaces whose
// pods the plugin may let start without it: those outside the mesh, as
// the cluster changes, and none once uninstalled.
func TestNamespaceRecord(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	nodeName := fmt.Sprintf("record-node-%d", time.Now().UnixNano()%100000)
	mesh := env.Namespace(t, "rec-mesh", map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
	plain := env.Namespace(t, "rec-plain", nil)
	optIn := env.Namespace(t, "rec-optin", nil)
	// A pod of the node enrolled by its own label: pods of its namespace
	// may be in the mesh.
	createPod(t, optIn, "opted-in", nodeName, netip.MustParseAddr("10.217.9.10"), map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
	node, err := netns.Create("cnp-record-" + randomID())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.DeletePath(node) })
	n := startNode(t, nodeName, filepath.Join(t.TempDir(), "ztunnel.sock"), node, t.TempDir())

	outside := func(ns string) bool {
		rec, err := pluginevent.ReadNamespaceRecord(n.record)
		return err == nil && rec.Outside(ns)
	}
	eventually.Within(t, settle, "the plain namespace recorded outside the mesh", func() bool { return outside(plain) })
	var rec pluginevent.NamespaceRecord
	rec, err = pluginevent.ReadNamespaceRecord(n.record)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{mesh, optIn} {
		if slices.Contains(rec.OutsideMesh, ns) {
			t.Errorf("namespace %s recorded outside the mesh: %v", ns, rec.OutsideMesh)
		}
	}

	patch := []byte(`{"metadata":{"labels":{"` + enroll.LabelDataplaneMode + `":"ambient"}}}`)
	if _, err := env.Client.CoreV1().Namespaces().Patch(t.Context(), plain, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, settle, "the namespace joining the mesh leaves the record", func() bool { return !outside(plain) })

	n.stop()
	if err := n.agent.Uninstall(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(n.record); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("namespace record after uninstall: %v", err)
	}
}
