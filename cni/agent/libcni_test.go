package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/canopy-mesh/canopy/cni/enroll"
	"github.com/canopy-mesh/canopy/cni/install"
	"github.com/canopy-mesh/canopy/cni/pluginevent"
	"github.com/canopy-mesh/canopy/cni/redirect"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/testing/eventually"
	"github.com/canopy-mesh/canopy/internal/testing/nettest"
	"github.com/canopy-mesh/canopy/internal/testing/testenv"
	"github.com/canopy-mesh/canopy/internal/tools"
)

// TestPluginThroughLibcni runs the node's CNI chain the way the local
// cluster's kubelet (and a CRI runtime) does: libcni, the first file of
// the configuration directory, ptp and host-local, then canopy-cni as the
// installer chained it, reaching the agent over its socket.
func TestPluginThroughLibcni(t *testing.T) {
	testenv.Need(t, env)
	nettest.NeedRoot(t)
	cniDir, err := tools.Dir("cni")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	binDir, confDir := filepath.Join(tmp, "bin"), filepath.Join(tmp, "net.d")
	for _, d := range []string{binDir, confDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"ptp", "host-local", "loopback"} {
		if err := os.Symlink(filepath.Join(cniDir, p), filepath.Join(binDir, p)); err != nil {
			t.Fatal(err)
		}
	}
	plugin := filepath.Join(tmp, "canopy-cni")
	if out, err := exec.Command("go", "build", "-o", plugin, "../../cmd/canopy-cni").CombinedOutput(); err != nil {
		t.Fatalf("build plugin: %v\n%s", err, out)
	}
	primary := `{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"ptp","ipMasq":false,` +
		`"ipam":{"type":"host-local","subnet":"10.218.0.0/24","dataDir":"` + filepath.Join(tmp, "ipam") + `","routes":[{"dst":"0.0.0.0/0"}]}}]}`
	if err := os.WriteFile(filepath.Join(confDir, "10-pods.conflist"), []byte(primary), 0o644); err != nil {
		t.Fatal(err)
	}

	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	node, err := netns.Create("cnp-cni-" + id + "-node")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.DeletePath(node) })
	podNetns, err := netns.Create("cnp-cni-" + id + "-pod")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.DeletePath(podNetns) })

	nodeName := "libcni-node-" + id
	zdsPath := filepath.Join(tmp, "ztunnel.sock")
	proxy := &nodeProxy{}
	pctx, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	go proxy.run(pctx, zdsPath)
	n := startNode(t, nodeName, zdsPath, node, t.TempDir())

	installer := install.Installer{ConfDir: confDir, BinDir: binDir, PluginBinary: plugin,
		Entry: map[string]any{"agentSocket": n.plugin.Socket, "namespaceRecord": n.record, "timeoutSeconds": 2}, Log: slog.New(slog.DiscardHandler)}
	if err := installer.Install(); err != nil {
		t.Fatal(err)
	}

	ns := env.Namespace(t, "cni", map[string]string{enroll.LabelDataplaneMode: enroll.ModeAmbient})
	pod, err := env.Client.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "web", Image: "canopy/echo"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(tmp, "cache"), nil)
	files, err := libcni.ConfFiles(confDir, []string{".conflist", ".conf", ".json"})
	if err != nil || len(files) != 1 {
		t.Fatalf("conf files %v, %v", files, err)
	}
	list, err := libcni.NetworkConfFromFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	rt := &libcni.RuntimeConf{ContainerID: string(pod.UID), NetNS: podNetns, IfName: "eth0", Args: [][2]string{
		{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", ns}, {"K8S_POD_NAME", "web"}, {"K8S_POD_UID", string(pod.UID)},
	}}
	// Plugins run in the node's netns, where ptp puts the host side.
	var res *current.Result
	if err := netns.Do(node, func() error {
		r, err := cni.AddNetworkList(context.Background(), list, rt)
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(r)
		return err
	}); err != nil {
		t.Fatalf("CNI ADD: %v", err)
	}
	if len(res.IPs) != 1 {
		t.Fatalf("result IPs = %v", res.IPs)
	}
	if err := (redirect.Nftables{}).Verify(podNetns, redirect.DefaultPodConfig()); err != nil {
		t.Fatalf("after ADD: %v", err)
	}
	if !proxy.saw("add " + string(pod.UID)) {
		t.Error("node proxy did not get the pod before ADD returned")
	}
	eventually.Within(t, settle, "annotation", func() bool {
		return getPod(t, ns, "web").Annotations[enroll.AnnotationRedirection] != ""
	})
	if err := netns.Do(node, func() error { return cni.CheckNetworkList(context.Background(), list, rt) }); err != nil {
		t.Errorf("CNI CHECK: %v", err)
	}
	for range 2 {
		if err := netns.Do(node, func() error { return cni.DelNetworkList(context.Background(), list, rt) }); err != nil {
			t.Fatalf("CNI DEL: %v", err)
		}
	}
	if err := (redirect.Nftables{}).Verify(podNetns, redirect.DefaultPodConfig()); err == nil {
		t.Error("rules left after DEL")
	}
	eventually.Within(t, settle, "node proxy told of the DEL", func() bool { return proxy.saw("del " + string(pod.UID)) })

	// With the agent down, a pod of a namespace outside the mesh starts
	// (the agent recorded it so); a pod of the ambient namespace waits for
	// the agent up to the plugin's timeout, then does not.
	plain := env.Namespace(t, "cni-plain", nil)
	eventually.Within(t, settle, "the plain namespace recorded outside the mesh", func() bool {
		rec, err := pluginevent.ReadNamespaceRecord(n.record)
		return err == nil && rec.Outside(plain)
	})
	n.stop()
	for _, tt := range []struct {
		namespace string
		wantOK    bool
	}{{plain, true}, {ns, false}} {
		p, err := netns.Create("cnp-cni-" + id + "-" + tt.namespace)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netns.DeletePath(p) })
		rt := &libcni.RuntimeConf{ContainerID: "down-" + tt.namespace, NetNS: p, IfName: "eth0", Args: [][2]string{
			{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", tt.namespace}, {"K8S_POD_NAME", "late"},
		}}
		err = netns.Do(node, func() error {
			_, err := cni.AddNetworkList(context.Background(), list, rt)
			return err
		})
		if ok := err == nil; ok != tt.wantOK {
			t.Errorf("CNI ADD in namespace %s with the agent down: error %v, want success = %v", tt.namespace, err, tt.wantOK)
		}
		if err == nil {
			if err := netns.Do(node, func() error { return cni.DelNetworkList(context.Background(), list, rt) }); err != nil {
				t.Errorf("CNI DEL: %v", err)
			}
		}
	}
}
